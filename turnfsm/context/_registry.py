"""The shipped compaction strategies by name (`STRATEGIES`, `strategy_named`)."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final

import attrs

from turnfsm.context._digest import ToolResultDigest
from turnfsm.context._layered import LayeredCompactor
from turnfsm.context._masking import MaskingCompactor
from turnfsm.context._protocol import ContextCompactor
from turnfsm.context._summarizing import SummarizingCompactor
from turnfsm.context._truncating import TruncatingCompactor
from turnfsm.errors import ConfigError
from turnfsm.providers import ModelClient

__all__ = ["STRATEGIES", "strategy_named"]

STRATEGIES: Final[Mapping[str, type[ContextCompactor]]] = MappingProxyType(
    {
        "masking": MaskingCompactor,
        "truncating": TruncatingCompactor,
        "summarizing": SummarizingCompactor,
        "layered": LayeredCompactor,
        "digest": ToolResultDigest,
    }
)
"""The shipped compactors by the short name a run's log, the CLI and eval use.

In this order: the context manager's default first, then the others by what
a pass costs (no model call, then a summary, then several layers), then
``digest``, which only shortens old tool results (on its own it cannot
bring a long run back under its window).
"""


def strategy_named(
    name: str,
    *,
    summary_model: ModelClient | None = None,
    field: str = "strategy",
    **settings: Any,
) -> ContextCompactor:
    """Return the shipped compactor `name` (one of `STRATEGIES`).

    Args:
        name: The strategy's short name (``"layered"``).
        summary_model: The model the summarising strategies (``summarizing``,
            ``layered``) summarise with; None: their default (the agent's
            own model). The others make no model call and leave it unused.
        field: The setting `name` came from, named by the error
            (``"--strategy"`` on the command line).
        **settings: The compactor's own settings (``preserve_recent=2``);
            the rest keep their defaults.

    Returns:
        The compactor, made with `settings`.

    Raises:
        ConfigError: `name` is not one of `STRATEGIES` (`field` is named,
            with the known names), or a setting is not one of the
            compactor's (the setting is named, with the ones it has), or
            out of range.
    """
    cls = STRATEGIES.get(name) if isinstance(name, str) else None
    if cls is None:
        raise ConfigError(field, name, " | ".join(STRATEGIES))
    fields = attrs.fields(cls) if attrs.has(cls) else ()
    known = [f.alias or f.name for f in fields if f.init]
    for key, value in settings.items():
        if key not in known:
            raise ConfigError(
                key, value, f"a setting of {cls.__name__}: one of {', '.join(known)}"
            )
    if summary_model is not None and "model" in known:
        settings = {"model": summary_model, **settings}
    return cls(**settings)
