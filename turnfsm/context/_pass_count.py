"""One count of a pass's input, handed to whatever measures it again.

A pass measures the conversation it is handed (the manager, to judge it),
and its strategy measures the same messages again before changing any (does
it fit already?). Messages are immutable and a counter is pure, so the very
same message objects counted by the very same counter come to the same
figure: within `measured`, `count_of` hands the manager's figure out instead
of counting again. Nothing outlives the block, and any other list of
messages (or any other counter) is counted.
"""

from __future__ import annotations

import operator
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Final

from turnfsm.messages import Message
from turnfsm.tokens import TokenCounter

__all__ = ["count_of", "measured", "same_messages"]

_Known = tuple[TokenCounter, Sequence[Message], int]

_MEASURED: Final[ContextVar[_Known | None]] = ContextVar(
    "turnfsm_measured", default=None
)
"""The counter, the messages and their count, in the current `measured` block."""


@contextmanager
def measured(
    counter: TokenCounter, messages: Sequence[Message], size: int
) -> Iterator[None]:
    """Within the block, `count_of(counter, messages)` is `size` (no count)."""
    token = _MEASURED.set((counter, messages, size))
    try:
        yield
    finally:
        _MEASURED.reset(token)


def count_of(counter: TokenCounter, messages: Sequence[Message]) -> int:
    """`counter.count(messages)`, or the figure `measured` gave for them.

    Given only for the counter that measured them and the very same message
    objects, in the same order.
    """
    known = _MEASURED.get()
    if known is not None and known[0] is counter and same_messages(known[1], messages):
        return known[2]
    return counter.count(messages)


def same_messages(a: Sequence[Message], b: Sequence[Message]) -> bool:
    """Are `a` and `b` the same message objects, in the same order (internal)?"""
    return a is b or (len(a) == len(b) and all(map(operator.is_, a, b)))
