"""`TokenSplitter`: a pair-safe old/recent boundary for custom compactors.

A summarising compactor summarises `Split.to_compact` and keeps
`Split.preserved` raw. The boundary sits at a real turn transition (an
assistant message followed by a user message) and never separates a tool call
from its result.
"""

from __future__ import annotations

from collections.abc import Sequence, Set
from typing import final

import attrs

from turnfsm import _checks
from turnfsm.context._pairs import pair_tool_traffic
from turnfsm.messages import Message, Role

__all__ = ["Split", "TokenSplitter"]


def _to_messages(value: Sequence[Message]) -> tuple[Message, ...]:
    return tuple(value)


@final
@attrs.frozen(kw_only=True)
class Split:
    """A conversation cut in two at `index`.

    Attributes:
        index: The first preserved message; 0 means keep everything.
        to_compact: ``messages[:index]``, the old part, less its pinned
            messages.
        preserved: ``messages[index:]``, the recent part.
        pinned: The old part's pinned messages, in order: keep them as they
            are (`keep_pinned` puts them back in place).
    """

    index: int
    to_compact: tuple[Message, ...] = attrs.field(converter=_to_messages)
    preserved: tuple[Message, ...] = attrs.field(converter=_to_messages)
    pinned: tuple[Message, ...] = attrs.field(default=(), converter=_to_messages)


@final
@_checks.keyword_checked
@attrs.frozen(kw_only=True)
class TokenSplitter:
    """Find where to split a conversation into old and recent parts.

    Attributes:
        preserve_recent: At least this many recent messages are preserved (≥ 1).
        min_messages: Conversations this long or shorter are not split (≥ 2).

    Raises:
        ConfigError: On construction, when a knob is out of range.
    """

    preserve_recent: int = attrs.field(default=4, validator=_checks.integer(low=1))
    min_messages: int = attrs.field(default=6, validator=_checks.integer(low=2))

    def split(
        self, messages: Sequence[Message], pinned: Set[str] = frozenset()
    ) -> Split:
        """Split `messages` at the latest safe turn boundary.

        Scanning from ``len - preserve_recent`` down to 1, the first `i` where
        `messages[i - 1]` is an assistant message, `messages[i]` a user message
        and no result at or after `i` answers a call before `i`.

        Args:
            messages: The conversation.
            pinned: The ids of the pinned messages (`CompactionContext.pinned`):
                those of the old part go to `Split.pinned`, not `to_compact`.

        Returns:
            The split; index 0 (everything preserved) when the conversation has
            at most `min_messages` messages or no index qualifies.
        """
        index = self._index(messages)
        old = messages[:index]
        return Split(
            index=index,
            to_compact=[m for m in old if m.id not in pinned],
            preserved=messages[index:],
            pinned=[m for m in old if m.id in pinned],
        )

    def _index(self, messages: Sequence[Message]) -> int:
        n = len(messages)
        if n <= self.min_messages:
            return 0
        traffic = pair_tool_traffic(messages)
        for i in range(n - self.preserve_recent, 0, -1):
            if (
                messages[i - 1].role is Role.ASSISTANT
                and messages[i].role is Role.USER
                and not traffic.crosses(i)
            ):
                return i
        return 0
