"""The one check of hooks, for the driver and for `HookDispatcher` alike."""

from __future__ import annotations

import difflib
import inspect
import weakref
from collections.abc import Iterable
from typing import Final

from turnfsm import _checks
from turnfsm.errors import ConfigError
from turnfsm.hooks._hook import HOOK_METHODS, Hook

__all__ = ["check_hooks"]


def check_hooks(hooks: Iterable[Hook]) -> tuple[Hook, ...]:
    """Return `hooks` as a tuple, each checked: a hook that can be called.

    What the driver checks where hooks are given (`Driver(hooks=...)`,
    `run(hooks=...)`), and `HookDispatcher` where it is made.

    Raises:
        ConfigError: `hooks` is not a sequence; or, naming ``hooks[i]`` (or
            the method, ``hooks[i].on_run_end``), an item is not a `Hook`
            instance (a class given for one too), is given twice, has a
            public ``on_*`` method that is no hook method (a misspelt
            ``on_tool_started``), or a hook method that is async, a
            generator, not callable, or cannot be called with one record.
    """
    value = _checks.as_tuple(hooks, "hooks", "Hook")
    _check_hooks(None, None, value)
    return value


def _is_hook(hook: object) -> bool:
    """A `Hook`, or an object with one of its methods (hooks may be duck-typed)."""
    return isinstance(hook, Hook) or any(
        callable(getattr(hook, m, None)) for m in HOOK_METHODS
    )


def _check_hooks(_inst: object, _attr: object, hooks: tuple[Hook, ...]) -> None:
    """Each a `Hook` whose methods are plain functions (hooks are never awaited).

    A public ``on_*`` method that is not a hook method (a misspelt
    ``on_tool_started``) is refused too: it would never be called.
    """
    for i, hook in enumerate(hooks):
        first = next(j for j, h in enumerate(hooks) if h is hook)
        if first != i:
            raise ConfigError(
                f"hooks[{i}]",
                hook,
                f"a hook not given already: it is hooks[{first}] too, and would "
                "be called twice for everything",
            )
        if isinstance(hook, type) and _is_hook(hook):  # its methods never called
            raise ConfigError(
                f"hooks[{i}]",
                hook,
                f"a Hook: an instance, {hook.__name__}(), not the class",
            )
        if not _is_hook(hook):
            raise ConfigError(f"hooks[{i}]", hook, "a Hook")
        for name in _unknown_methods(hook):
            close = difflib.get_close_matches(name, HOOK_METHODS, n=1)
            hint = (
                f"did you mean {close[0]!r}?"
                if close
                else "the hook methods are " + ", ".join(HOOK_METHODS)
            )
            raise ConfigError(
                f"hooks[{i}].{name}",
                hook,
                f"a hook method: {type(hook).__name__}.{name} is not one, so "
                f"it would never be called ({hint})",
            )
        for name in HOOK_METHODS:
            method = getattr(hook, name, _ABSENT)
            if method is _ABSENT:  # a duck-typed hook without it
                continue
            if not callable(method):
                raise ConfigError(
                    f"hooks[{i}].{name}",
                    hook,
                    f"a method: {type(hook).__name__}.{name} is "
                    f"{type(method).__name__}, not callable (delete it, or "
                    f"write it as `def {name}(self, info)`)",
                )
            if inspect.iscoroutinefunction(method) or inspect.isasyncgenfunction(
                method
            ):
                raise ConfigError(
                    f"hooks[{i}].{name}",
                    hook,
                    "a plain method, not async def: hooks are called "
                    "synchronously and never awaited (start async work from "
                    "an effect or a tool instead)",
                )
            if inspect.isgeneratorfunction(method):
                raise ConfigError(
                    f"hooks[{i}].{name}",
                    hook,
                    "a plain method, not a generator (a method with yield): "
                    "hooks are called, never iterated, so none of its body "
                    "would run",
                )
            if _takes_no_record(method):
                raise ConfigError(
                    f"hooks[{i}].{name}",
                    hook,
                    f"a method that takes one record: {type(hook).__name__}."
                    f"{name}() cannot be called with it (write it as "
                    f"`def {name}(self, info)`)",
                )


_ABSENT: Final = object()
"""What a duck-typed hook has for a hook method it does not define."""


def _takes_no_record(method: object) -> bool:
    """Whether `method` is a Python function that cannot be called with one record.

    Only functions and methods are judged: a callable object or a builtin
    is left to its call.
    """
    return _checks.cannot_take(method, _ONE_RECORD) is not None


_ONE_RECORD: Final = _checks.Shape(("info",))
"""How a hook's method is called: with the record of what happened."""


def _unknown_methods(hook: object) -> list[str]:
    """The public ``on_*`` methods of `hook` that are not hook methods."""
    names = list(_unknown_in_class(type(hook)))
    own = getattr(hook, "__dict__", None)
    if own:  # methods set on the instance itself (a duck-typed hook)
        names += [n for n, v in own.items() if _is_unknown(n) and callable(v)]
    return names


def _unknown_in_class(cls: type) -> tuple[str, ...]:
    # Once per class, not per run: a hook given to every run costs a lookup.
    names = _UNKNOWN.get(cls)
    if names is None:
        names = _UNKNOWN[cls] = tuple(
            n for n in dir(cls) if _is_unknown(n) and callable(getattr(cls, n, None))
        )
    return names


_UNKNOWN: Final[weakref.WeakKeyDictionary[type, tuple[str, ...]]] = (
    weakref.WeakKeyDictionary()
)


def _is_unknown(name: str) -> bool:
    return name.startswith("on_") and name not in _HOOK_METHODS


_HOOK_METHODS: Final = frozenset(HOOK_METHODS)
