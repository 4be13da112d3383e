"""A bounded per-message cache of cost units, shared by the shipped counters.

Messages are frozen and their ids are stable, so a message's units never
change: each counter measures a message once and remembers the result by id.
An id is trusted only for the message it was measured on (or one equal to
it, metadata included): code that reuses ids for different content, such as
test generators numbering messages ``m0``, ``m1``... in every example, gets a
fresh measurement instead of a stale one. Entries hold the message weakly, so the
cache never keeps a dropped conversation alive; the entries of messages gone
are swept out as new ones come in (a long-lived server that serves many
short conversations keeps about what its live ones need), and the least
recently used entries go beyond a fixed size.

Equal counters share one cache (`shared_cache`): a driver, an agent or a
context manager made per request, with the default counter, finds the
messages of a long session already priced by the previous request's.
"""

from __future__ import annotations

import contextlib
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Final, final

import attrs
from attrs import AttrsInstance

from turnfsm.messages import Message

__all__ = ["CACHE_SIZE", "UnitCache", "shared_cache"]

CACHE_SIZE: Final = 100_000
"""Entries a `UnitCache` keeps before dropping the least recently used."""


class _Entry(weakref.ref[Message]):
    """A weak reference to a priced message that carries its units.

    One object per entry, not a tuple of a reference and a number: half the
    objects a first count of a long conversation leaves for the garbage
    collector to trace, and a smaller cache.
    """

    __slots__ = ("units",)

    units: int


@final
class UnitCache:
    """Message id -> units, bounded; the least recently used entry goes first.

    Recency is kept once the cache is past half full (before that, nothing
    is dropped, so a hit does not pay for moving its entry): an entry last
    used before then goes in the order it was priced.

    Not part of a counter's value: counters hold one in a field excluded from
    `==`, `hash` and `repr`, so two equally configured counters compare equal
    whatever they have cached.
    """

    __slots__ = ("__weakref__", "_added", "_entries", "_size")

    def __init__(self, size: int = CACHE_SIZE) -> None:
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._size = size
        self._added = 0  # entries made since the last sweep of dead ones

    def units(self, message: Message, measure: Callable[[Message], int]) -> int:
        """Return the cached units of `message`, measuring it on a miss."""
        return self.total((message,), measure)

    def total(
        self, messages: Iterable[Message], measure: Callable[[Message], int]
    ) -> int:
        """Return the summed units of `messages`, each priced once.

        Cached ones are looked up; one not cached (or cached for other
        content) is priced by `measure`, the counter's uncached per-message
        pricing, and cached. All in one loop: a first count of a long
        conversation is one pass over messages no counter has priced.
        """
        entries = self._entries
        get = entries.get
        # Order matters only once entries may be dropped: under half full,
        # a hit is not moved (half the cost of a warm count), and every
        # message in use is moved on its first hit past the half.
        renew = entries.move_to_end if len(entries) > self._size // 2 else None
        total = added = 0
        try:  # trimmed however the loop ends: a measure may raise midway
            for message in messages:
                key = message.id
                entry = get(key)
                if entry is not None:
                    known = entry()
                    if known is message or (
                        # Metadata is not compared by `==`; what a model
                        # client sends of it is priced.
                        known is not None
                        and known == message
                        and known.metadata == message.metadata
                    ):
                        if renew is not None:
                            # Inline, not `suppress`: a context manager per
                            # message costs more than the rest of the loop.
                            try:  # noqa: SIM105
                                renew(key)
                            except KeyError:  # dropped meanwhile by another thread
                                pass
                        total += entry.units
                        continue
                value = measure(message)
                new = _Entry(message)
                new.units = value
                entries[key] = new
                added += 1
                if entry is not None:  # a stale entry keeps its place: the newest
                    _renew(entries, key)
                total += value
        finally:
            self._added += added
            self._trim()
        return total

    def _trim(self) -> None:
        entries = self._entries
        if self._added > max(_SWEEP_AFTER, len(entries) // 2):
            self._sweep()
        while len(entries) > self._size:
            try:
                entries.popitem(last=False)
            except KeyError:  # emptied meanwhile by another thread
                return

    def _sweep(self) -> None:
        """Drop the entries of messages no longer alive (they never hit again).

        Run once as many entries were made as half the cache holds, so its
        cost is spread over them: the cache stays within about twice what
        the live messages need, whatever the process served before.
        """
        self._added = 0
        entries = self._entries
        # Keys and entries copied apart (no pair made per entry); another
        # thread may change the cache in between, so each key found dead is
        # looked up again before it goes.
        try:
            keys, refs = list(entries), list(entries.values())
        except RuntimeError:  # changed meanwhile by another thread: next time
            return
        dead = [key for key, known in zip(keys, refs, strict=False) if known() is None]
        for key in dead:
            entry = entries.get(key)
            if entry is not None and entry() is None:
                entries.pop(key, None)

    def __len__(self) -> int:
        return len(self._entries)

    def __reduce__(self) -> tuple[type[UnitCache], tuple[int]]:
        # A copy (`copy.deepcopy`, pickle) is an empty cache of the same size:
        # entries hold their messages weakly, which neither can copy, and a
        # copied counter prices its messages again as it meets them.
        return (UnitCache, (self._size,))


_SWEEP_AFTER: Final = 1024
"""New entries between two sweeps of dead ones, at the least."""


def _renew(entries: OrderedDict[str, _Entry], key: str) -> None:
    # Equal counters share a cache, and so may threads: an entry another
    # thread dropped since it was read is simply not renewed.
    with contextlib.suppress(KeyError):
        entries.move_to_end(key)


_SHARED: Final[weakref.WeakValueDictionary[tuple[object, ...], UnitCache]] = (
    weakref.WeakValueDictionary()
)
"""Counter value -> its cache, for as long as a counter of that value lives."""


def shared_cache(counter: AttrsInstance) -> UnitCache:
    """Return the cache of the counters equal to `counter`, an attrs instance.

    Keyed by the counter's class and the values of its compared fields (read
    while it is built: the cache is its last field), so the key holds no
    counter, and the cache goes with the last counter of its value. A
    counter with an unhashable field gets a cache of its own.
    """
    cls = type(counter)
    key = (cls, *(getattr(counter, f.name) for f in attrs.fields(cls) if f.eq))
    try:
        cache = _SHARED.get(key)
        if cache is None:
            cache = _SHARED[key] = UnitCache()
    except TypeError:  # an unhashable field value
        return UnitCache()
    return cache
