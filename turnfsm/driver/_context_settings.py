"""The context settings a run opens with, as its log keeps them (`ContextSettings`)."""

from __future__ import annotations

import importlib
import math
import sys
import weakref
from collections.abc import Mapping
from enum import Enum
from typing import Final

import attrs

from turnfsm.context import STRATEGIES, ContextManager, PinRules
from turnfsm.errors import ConfigError
from turnfsm.messages import JSONValue
from turnfsm.persistence import ContextSettings, StrategyKind

__all__ = ["context_settings", "object_settings", "pin_rules"]


_MEMO_SIZE: Final = 64
_memo: dict[
    int, tuple[weakref.ref[ContextManager], tuple[object, ...], ContextSettings]
] = {}
"""A manager's id -> the manager, what its settings were made of, the settings.

A driver opens every run on one manager: the settings are made again only
when what they are made of (its strategy's and counter's settings, which a
mutable strategy may change) differs from the last time."""


def context_settings(manager: ContextManager) -> ContextSettings:
    """Return what the log keeps of `manager`'s settings."""
    known = _memo.get(id(manager))
    if (
        known is not None
        and known[0]() is manager
        and _frozen(manager.compactor)
        and _frozen(manager.counter)
        and _frozen(manager.pins)
    ):
        return known[2]  # made of values that cannot change (a frozen manager)
    strategy, kind, settings = _strategy(manager.compactor)
    counter = object_settings(manager.counter) or {}
    pins = object_settings(manager.pins) or {}
    key = (strategy, kind, settings, counter, pins)
    if known is not None and known[0]() is manager and known[1] == key:
        return known[2]
    made = _made(manager, strategy, kind, settings, counter, pins)
    if len(_memo) >= _MEMO_SIZE:
        _memo.clear()
    _memo[id(manager)] = (weakref.ref(manager), key, made)
    return made


@attrs.frozen
class _Frozen:
    """Its `__setattr__` is the one every frozen attrs class has."""


_FROZEN_SETATTR: Final = _Frozen.__setattr__


def _frozen(value: object) -> bool:
    """Whether `value` is of a frozen attrs class: its settings never change."""
    return type(value).__setattr__ is _FROZEN_SETATTR


def _made(
    manager: ContextManager,
    strategy: str,
    kind: StrategyKind,
    settings: Mapping[str, JSONValue],
    counter: Mapping[str, JSONValue],
    pins: Mapping[str, JSONValue],
) -> ContextSettings:
    return ContextSettings(
        strategy=strategy,
        strategy_kind=kind,
        strategy_settings=settings,
        window=manager.window,
        threshold=manager.threshold,
        threshold_tokens=manager.threshold_tokens,
        auto_compact=manager.auto_compact,
        target=str(manager.compact_target.value),
        target_pct=manager.compact_target_pct,
        counter=type(manager.counter).__name__,
        counter_settings=counter,
        max_messages=manager.max_messages,
        max_failures=manager.max_failures,
        use_reported_usage=manager.use_reported_usage,
        calibrate=manager.calibrate,
        pins=pins,
    )


def pin_rules(settings: ContextSettings | None) -> PinRules:
    """Return the pin rules a run's log keeps, made again (None: the defaults).

    Raises:
        ConfigError: The log names a rule this version does not know, or a
            rule's value is not a bool (field ``pins``).
    """
    if settings is None:
        return PinRules()
    rules = dict(settings.pins)
    known = {field.name for field in attrs.fields(PinRules)}
    unknown = sorted(set(rules) - known)
    if unknown:
        raise ConfigError("pins", rules, f"pin rules among {', '.join(sorted(known))}")
    try:
        return PinRules(**rules)  # type: ignore[arg-type]
    except ConfigError as exc:
        raise ConfigError("pins", rules, f"pin rules that are bools ({exc})") from None


def _strategy(
    compactor: object,
) -> tuple[str, StrategyKind, Mapping[str, JSONValue]]:
    cls = type(compactor)
    for name, shipped in STRATEGIES.items():
        if cls is shipped:
            return name, "shipped", object_settings(compactor) or {}
    module = sys.modules.get(cls.__module__)
    if module is not None and cls.__module__ != "__main__":
        # The module-level compactor itself: imported again, it is the same.
        for attr, value in sorted(vars(module).items()):
            if value is compactor and not attr.startswith("_"):
                return f"{cls.__module__}:{attr}", "import", {}
        settings = object_settings(compactor)
        if settings is not None and _importable(cls):
            return f"{cls.__module__}:{cls.__qualname__}", "import", settings
    return cls.__name__, "class", {}


def _importable(cls: type) -> bool:
    try:
        module = importlib.import_module(cls.__module__)
    except ImportError:  # pragma: no cover - the class came from it
        return False
    return getattr(module, cls.__qualname__, None) is cls


def object_settings(value: object) -> dict[str, JSONValue] | None:
    """Return the JSON settings an attrs object is made with, or None.

    Every field set on construction whose value is a JSON value (an enum:
    its value) is kept; a field holding something else (a model, a counter)
    is left out. None: `value` is not an attrs object.
    """
    cls = type(value)
    if not attrs.has(cls):
        return None
    out: dict[str, JSONValue] = {}
    for field in attrs.fields(cls):
        if not field.init or field.name.startswith("_"):
            continue
        item = getattr(value, field.name)
        if isinstance(item, Enum):
            item = item.value
        if isinstance(item, float) and not math.isfinite(item):
            continue
        if item is None or isinstance(item, bool | int | float | str):
            out[field.alias or field.name] = item
    return out
