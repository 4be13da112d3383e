"""`MessageLog` and `Joined`: immutable message sequences that do not copy."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any, final, overload

from turnfsm.messages._values import Message

__all__ = ["Joined", "MessageLog", "as_sequence"]


def as_sequence(value: Iterable[Message]) -> Sequence[Message]:
    """Return `value` as an immutable sequence, without copying our own views."""
    if isinstance(value, tuple | MessageLog | Joined):
        return value
    return tuple(value)


class _Store:
    """The shared, append-only backing list of one or more `MessageLog`s."""

    __slots__ = ("items", "memo")

    def __init__(self, items: list[Message]) -> None:
        self.items = items
        # Per-store memo for incremental consumers (token prefix sums).
        self.memo: dict[object, Any] = {}


@final
class MessageLog(Sequence[Message]):
    """An immutable sequence of messages that appends in O(1).

    Logs share one append-only backing list: `log.append(m)` returns a new
    log viewing one more item, and extends the shared list in place only when
    `log` is its longest view, so no reader ever sees its items change.
    """

    __slots__ = ("_len", "_store")

    def __init__(self, messages: Iterable[Message] = ()) -> None:
        items = list(messages)
        self._store = _Store(items)
        self._len = len(items)

    def append(self, *messages: Message) -> MessageLog:
        """Return a log with `messages` appended; `self` is unchanged."""
        return self.extend(messages)

    def extend(self, messages: Iterable[Message]) -> MessageLog:
        """Return a log with `messages` appended; `self` is unchanged."""
        new = messages if type(messages) is tuple else list(messages)
        if not new:
            return self
        store = self._store
        items = store.items
        if len(items) != self._len:  # a longer view exists: branch off
            store = _Store(items[: self._len])
            items = store.items
        items.extend(new)
        log = MessageLog.__new__(MessageLog)
        log._store = store
        log._len = len(items)
        return log

    @property
    def store_key(self) -> tuple[object, int]:
        """Identity of the backing list and this view's length (for memos)."""
        return (self._store, self._len)

    @property
    def memo(self) -> dict[object, Any]:
        """A scratch dict shared by every view of the same backing list."""
        return self._store.memo

    def items_from(self, start: int) -> Iterator[Message]:
        """Iterate over the items from index `start` on, copying none before it.

        The incremental readers ask for the few items a log grew by: a slice
        of those is cheaper than a generator over them.
        """
        return iter(self._store.items[start : self._len])

    def __len__(self) -> int:
        return self._len

    @overload
    def __getitem__(self, index: int) -> Message: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[Message, ...]: ...
    def __getitem__(self, index: int | slice) -> Message | tuple[Message, ...]:
        if isinstance(index, slice):
            return tuple(self._store.items[: self._len][index])
        if index < 0:
            index += self._len
        if not 0 <= index < self._len:
            raise IndexError("MessageLog index out of range")
        return self._store.items[index]

    def __iter__(self) -> Iterator[Message]:
        items = self._store.items
        for i in range(self._len):
            yield items[i]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, MessageLog):
            return self._len == other._len and (
                self._store is other._store or list(self) == list(other)
            )
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(m.id for m in self))

    def __repr__(self) -> str:
        return f"MessageLog({list(self)!r})"


@final
class Joined(Sequence[Message]):
    """A read-only view of several message sequences as one, without copying."""

    __slots__ = ("_len", "_parts")

    def __init__(self, *parts: Sequence[Message]) -> None:
        self._parts = tuple(p for p in parts if len(p))
        self._len = sum(len(p) for p in self._parts)

    def __len__(self) -> int:
        return self._len

    @overload
    def __getitem__(self, index: int) -> Message: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[Message, ...]: ...
    def __getitem__(self, index: int | slice) -> Message | tuple[Message, ...]:
        if isinstance(index, slice):
            return tuple(self)[index]
        if index < 0:
            index += self._len
        if not 0 <= index < self._len:
            raise IndexError("Joined index out of range")
        for part in self._parts:
            if index < len(part):
                return part[index]
            index -= len(part)
        raise AssertionError("unreachable")  # pragma: no cover

    def __iter__(self) -> Iterator[Message]:
        for part in self._parts:
            yield from part

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence) and not isinstance(other, str):
            return len(self) == len(other) and all(
                a == b for a, b in zip(self, other, strict=True)
            )
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Joined({list(self)!r})"
