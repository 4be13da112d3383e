"""A bounded per-message cache of cost units, shared by the shipped counters.

Messages are frozen and their ids are stable, so a message's units never
change: each counter measures a message once and remembers the result by id.
An id is trusted only for the message it was measured on (or one equal to
it): code that reuses ids for different content, such as test generators
numbering messages ``m0``, ``m1``... in every example, gets a fresh
measurement instead of a stale one. Entries hold the message weakly, so the
cache never keeps a dropped conversation alive, and the least recently used
entries go beyond a fixed size.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Final, final

from turnfsm.messages import Message

__all__ = ["CACHE_SIZE", "UnitCache"]

CACHE_SIZE: Final = 100_000
"""Entries a `UnitCache` keeps before dropping the least recently used."""


@final
class UnitCache:
    """Message id -> units, bounded; the least recently used entry goes first.

    Not part of a counter's value: counters hold one in a field excluded from
    `==`, `hash` and `repr`, so two equally configured counters compare equal
    whatever they have cached.
    """

    __slots__ = ("_entries", "_size")

    def __init__(self, size: int = CACHE_SIZE) -> None:
        self._entries: OrderedDict[str, tuple[weakref.ref[Message], int]] = (
            OrderedDict()
        )
        self._size = size

    def units(self, message: Message, measure: Callable[[Message], int]) -> int:
        """Return the cached units of `message`, measuring it on a miss."""
        entries = self._entries
        key = message.id
        entry = entries.get(key)
        if entry is not None:
            known = entry[0]()
            if known is message or (known is not None and known == message):
                entries.move_to_end(key)
                return entry[1]
        value = measure(message)
        entries[key] = (weakref.ref(message), value)
        if entry is not None:  # a stale entry keeps its place: make it the newest
            entries.move_to_end(key)
        if len(entries) > self._size:
            entries.popitem(last=False)
        return value

    def total(
        self, messages: Iterable[Message], units: Callable[[Message], int]
    ) -> int:
        """Return the summed units of `messages`: cached ones looked up in one loop.

        A message not cached (or cached for other content) is priced by
        `units`, the counter's own per-message method, which caches it.
        """
        entries = self._entries
        get = entries.get
        renew = entries.move_to_end
        total = 0
        for message in messages:
            key = message.id
            entry = get(key)
            if entry is not None and entry[0]() is message:
                renew(key)
                total += entry[1]
            else:
                total += units(message)
        return total

    def __len__(self) -> int:
        return len(self._entries)
