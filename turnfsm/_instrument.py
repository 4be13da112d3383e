"""The process's instrumentation: the hooks every run gets without being given them.

The package's root (``turnfsm/__init__.py``) wires OpenTelemetry tracing here;
the driver asks `hooks_for` for each run's hooks. So the driver never imports
what is wired, and tracing attaches to a run as one more hook.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeAlias

__all__ = ["Instrumentation", "hooks_for", "wire"]

Instrumentation: TypeAlias = Callable[[Sequence[Any], "bool | None"], Any]
"""``(hooks, setting) -> hook or None``: the hook to add to a run's `hooks`.

`setting` is the driver's ``tracing`` (None: when set up, True: always,
False: never).
"""

_wired: list[Instrumentation] = []


def wire(instrumentation: Instrumentation) -> None:
    """Make `instrumentation` the process's (the package's root does this once)."""
    _wired[:] = [instrumentation]


def hooks_for(hooks: Sequence[Any], setting: bool | None) -> list[Any]:
    """Return `hooks` with the instrumentation's hook first, when it adds one."""
    listed = list(hooks)
    for instrumentation in _wired:
        hook = instrumentation(listed, setting)
        if hook is not None:
            listed.insert(0, hook)
    return listed
