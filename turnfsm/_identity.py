"""What is known of a live object, by its identity rather than its value.

A cache keyed by value (a `dict`, a `weakref.WeakKeyDictionary`) makes equal
objects share one entry: the entry belongs to the first of them and goes
when that one is reclaimed, though an equal one still lives. An
`IdentityMap` keeps one entry per object, for as long as that object lives.
"""

from __future__ import annotations

import weakref
from typing import Generic, TypeVar, final

__all__ = ["IdentityMap"]

K = TypeVar("K")
V = TypeVar("V")


@final
class IdentityMap(Generic[K, V]):
    """A value per live object, dropped when the object is reclaimed."""

    __slots__ = ("_entries",)

    def __init__(self) -> None:
        self._entries: dict[int, tuple[weakref.ref[K], V]] = {}

    def get(self, key: K) -> V | None:
        """Return the value kept for `key` itself, or None."""
        entry = self._entries.get(id(key))
        if entry is None or entry[0]() is not key:
            return None
        return entry[1]

    def put(self, key: K, value: V) -> V:
        """Keep `value` for `key` while `key` lives; return it."""
        ident = id(key)
        entries = self._entries

        def drop(ref: weakref.ref[K]) -> None:
            entry = entries.get(ident)
            if entry is not None and entry[0] is ref:
                del entries[ident]

        entries[ident] = (weakref.ref(key, drop), value)
        return value

    def __len__(self) -> int:
        return len(self._entries)
