"""A pass's input counted once, whoever measures it first.

A pass measures the conversation it is handed (the manager, to judge it and
to price it), and its strategy measures the same messages again before
changing any (does it fit already?). Messages are immutable and a counter is
pure, so the very same message objects counted by the very same counter come
to the same figure: within `measured`, the first `count_of` of the pass's
input (or the manager's figure, when it has one) is the one every later
`count_of` of those messages gets. Nothing outlives the block, and any other
list of messages (or any other counter) is counted.
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


class _Input:
    """The pass's counter, its input, and their count once known."""

    __slots__ = ("counter", "messages", "size")

    def __init__(
        self, counter: TokenCounter, messages: Sequence[Message], size: int | None
    ) -> None:
        self.counter = counter
        self.messages = messages
        self.size = size


_INPUT: Final[ContextVar[_Input | None]] = ContextVar("turnfsm_input", default=None)
"""The input of the pass running in the current `measured` block."""


@contextmanager
def measured(
    counter: TokenCounter, messages: Sequence[Message], size: int | None = None
) -> Iterator[None]:
    """Within the block, `messages` are counted by `counter` at most once.

    `size`: their count, when the caller measured them with `counter`
    already (None: the first `count_of` counts them).
    """
    token = _INPUT.set(_Input(counter, messages, size))
    try:
        yield
    finally:
        _INPUT.reset(token)


def count_of(counter: TokenCounter, messages: Sequence[Message]) -> int:
    """`counter.count(messages)`, counted once per pass for the pass's input.

    The very same message objects in the same order, and the counter that
    the pass measures with; anything else is counted every time.
    """
    known = _INPUT.get()
    if (
        known is None
        or known.counter is not counter
        or not same_messages(known.messages, messages)
    ):
        return counter.count(messages)
    if known.size is None:
        known.size = counter.count(messages)
    return known.size


def same_messages(a: Sequence[Message], b: Sequence[Message]) -> bool:
    """Are `a` and `b` the same message objects, in the same order (internal)?"""
    return a is b or (len(a) == len(b) and all(map(operator.is_, a, b)))
