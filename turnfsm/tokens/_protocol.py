"""The `TokenCounter` protocol."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from turnfsm.messages import Message

__all__ = ["IncrementalCounter", "TokenCounter"]


@runtime_checkable
class TokenCounter(Protocol):
    """Estimates how many tokens a conversation costs (sync, pure).

    Every method returns an int >= 0: turnfsm checks each number where it
    reads it and raises `ConfigError`, naming the counter, the method and
    the value, for anything else (a float, a bool, None, a negative number).
    """

    def count(self, messages: Sequence[Message]) -> int:
        """Return the estimated token count of `messages` as one request.

        A message costs its parts and what a model client sends of its
        metadata (`Message.sent_texts`, such as a reply's thinking).
        """
        ...

    def count_text(self, text: str) -> int:
        """Return the estimated token count of `text` riding a request."""
        ...


@runtime_checkable
class IncrementalCounter(TokenCounter, Protocol):
    """A counter whose cost is a sum of per-message units.

    `count(messages) == tokens(sum(units(m) for m in messages))`. The split
    lets a caller cache each message's units once and re-measure a grown
    conversation in O(new messages), while counters such as the heuristic
    round only once over the whole payload.
    """

    def units(self, message: Message) -> int:
        """Return the additive cost units of one message."""
        ...

    def text_units(self, text: str) -> int:
        """Return the additive cost units of `text` riding a request."""
        ...

    def tokens(self, units: int) -> int:
        """Convert a sum of units into a token estimate."""
        ...
