"""The one way an old public name keeps working for a release, with a warning.

A module lists its renamed or retired names in a table, name -> (where the
value lives now, what to use instead), and sets ``__getattr__ =
moved(__name__, TABLE)``. Reading an old name warns once per read with a
`DeprecationWarning` that says what to use instead, then returns the value.
Old names never appear in ``__all__`` or in the docs' reference.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["RELEASE", "moved", "warn"]

RELEASE = "0.3"
"""The release that removes the names deprecated now."""


def warn(old: str, new: str, *, stacklevel: int = 3) -> None:
    """Warn that `old` is deprecated in favour of `new`."""
    warnings.warn(
        f"{old} is deprecated and will be removed in turnfsm {RELEASE}; use {new}",
        DeprecationWarning,
        stacklevel=stacklevel,
    )


def moved(module: str, table: Mapping[str, tuple[str, str]]) -> Callable[[str], Any]:
    """Return a module ``__getattr__`` serving the deprecated names of `table`.

    Args:
        module: The module's ``__name__`` (for the error on an unknown name).
        table: Old name -> (``"package.module:attribute"`` where its value
            lives, what to use instead).
    """

    def __getattr__(name: str) -> Any:
        entry = table.get(name)
        if entry is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        where, instead = entry
        path, _, attribute = where.partition(":")
        warn(f"{module}.{name}", instead)
        return getattr(importlib.import_module(path), attribute)

    return __getattr__
