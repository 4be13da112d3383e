"""`ContextSettings`: the context settings a run used, as its log keeps them."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final, Literal, TypeAlias, final

import attrs

from turnfsm import _checks
from turnfsm.messages import JSONValue

__all__ = ["STRATEGY_KINDS", "ContextSettings", "StrategyKind"]

StrategyKind: TypeAlias = Literal["shipped", "import", "class"]
"""How a recorded compactor can be rebuilt (see `ContextSettings.strategy`)."""

STRATEGY_KINDS: Final[tuple[StrategyKind, ...]] = ("shipped", "import", "class")
"""Every `StrategyKind`."""


def _frozen(value: Mapping[str, JSONValue]) -> Mapping[str, JSONValue]:
    return MappingProxyType(dict(value))


@final
@attrs.frozen(kw_only=True)
class ContextSettings:
    """The context settings a run measured and compacted with.

    A run's `RunOpened` carries them, so that ``turnfsm simulate`` can run
    the session again under the same settings without being told them.

    Attributes:
        strategy: The compactor, as it can be made again: a shipped
            strategy's name (``truncating``) when `strategy_kind` is
            ``"shipped"``; ``module:attr`` (the module-level compactor, or
            its class) when ``"import"``; its class name only, when it
            cannot be made again, when ``"class"``.
        strategy_kind: ``"shipped"``, ``"import"`` or ``"class"``.
        strategy_settings: The keyword settings that make it (a shipped
            strategy's or an importable class's), as JSON values. What is
            not a JSON value (a summary model) is not kept.
        window: The window the lines were drawn on, in tokens.
        threshold: The threshold line, in percent of the window.
        threshold_tokens: The threshold line in tokens, in place of the
            percentage, or None.
        auto_compact: Whether the threshold line compacted.
        target: What `target_pct` is a percentage of (``threshold``: the
            threshold line; ``context``: the whole window).
        target_pct: The size a pass aimed for, in percent.
        counter: The token counter's class name.
        counter_settings: Its settings, as JSON values.
        max_messages: The message-count line (0: none).
        max_failures: Failed passes in a row that open the breaker.
        use_reported_usage: Whether measurements used the provider's counts.
        calibrate: Whether measurements were calibrated against them.
        pins: The pin rules (`turnfsm.context.PinRules`) as JSON values, by
            rule name; a rule not named is on (empty: every rule on, as in
            a log written before pin rules were kept).

    Raises:
        ConfigError: A field is of the wrong type or out of its range.
    """

    strategy: str = attrs.field(validator=_checks.string(non_empty=True))
    strategy_kind: StrategyKind = attrs.field(validator=_checks.one_of(STRATEGY_KINDS))
    strategy_settings: Mapping[str, JSONValue] = attrs.field(
        factory=dict, converter=_frozen, hash=False, validator=_checks.json_object()
    )
    window: int = attrs.field(validator=_checks.integer(low=0, high=_checks.MAX_TOKENS))
    threshold: int = attrs.field(validator=_checks.integer(low=0, high=100))
    threshold_tokens: int | None = attrs.field(
        default=None,
        validator=_checks.integer(low=1, high=_checks.MAX_TOKENS, optional=True),
    )
    auto_compact: bool = attrs.field(default=True, validator=_checks.boolean())
    target: str = attrs.field(
        default="threshold", validator=_checks.one_of(("threshold", "context"))
    )
    target_pct: int = attrs.field(
        default=70, validator=_checks.integer(low=1, high=100)
    )
    counter: str = attrs.field(validator=_checks.string(non_empty=True))
    counter_settings: Mapping[str, JSONValue] = attrs.field(
        factory=dict, converter=_frozen, hash=False, validator=_checks.json_object()
    )
    max_messages: int = attrs.field(
        default=0, validator=_checks.integer(low=0, high=_checks.MAX_COUNT)
    )
    max_failures: int = attrs.field(
        default=3, validator=_checks.integer(low=1, high=_checks.MAX_COUNT)
    )
    use_reported_usage: bool = attrs.field(default=False, validator=_checks.boolean())
    calibrate: bool = attrs.field(default=False, validator=_checks.boolean())
    pins: Mapping[str, JSONValue] = attrs.field(
        factory=dict, converter=_frozen, hash=False, validator=_checks.json_object()
    )
