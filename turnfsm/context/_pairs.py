"""Pair safety: never orphan one half of a tool call/result pair.

Providers reject a conversation that holds a tool result without its call
(and most reject a call whose result is missing once the turn moved on), so a
compactor must cut a conversation only where no pair straddles the cut.

Pairing works like a bracket matcher, per occurrence, because call ids may be
reused: a forward scan keeps, per call id, a stack of unconsumed calls, and
each tool result claims the most recent unconsumed call with its id that
precedes it. Leftovers are classified:

- a *lone call* has no result yet; it may still be in flight, so it is kept
  wherever the conversation is kept;
- a *lone result* answers no call; it is a protocol violation and is dropped.

Everything here is pure and reusable by any compactor.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple, final

import attrs

from turnfsm.messages import Message, ToolCallPart, ToolResultPart

__all__ = [
    "PartRef",
    "ToolPair",
    "ToolTraffic",
    "adjust_split",
    "keep_parts",
    "pair_tool_traffic",
    "sanitize",
]


@final
class PartRef(NamedTuple):
    """Where a part sits: `messages[message].parts[part]`."""

    message: int
    """Index of the message in the conversation."""
    part: int
    """Index of the part in that message."""


@final
class ToolPair(NamedTuple):
    """A tool call and the result that claimed it, by position."""

    call_message: int
    """Index of the message holding the call."""
    call_part: int
    """Index of the call among that message's parts."""
    result_message: int
    """Index of the message holding the result."""
    result_part: int
    """Index of the result among that message's parts."""


@final
@attrs.frozen(kw_only=True)
class ToolTraffic:
    """The tool calls and results of a conversation, paired per occurrence.

    Attributes:
        pairs: Each result with the call it claimed, in result order.
        lone_calls: Calls no result claimed (yet), in conversation order.
        lone_results: Results that answer no preceding call, in order.
    """

    pairs: tuple[ToolPair, ...]
    lone_calls: tuple[PartRef, ...]
    lone_results: tuple[PartRef, ...]

    def crosses(self, split: int, *, keep_head: int = 0) -> bool:
        """Return whether cutting before `messages[split]` splits a pair.

        Args:
            split: The first message of the kept tail.
            keep_head: Calls in the first `keep_head` messages are kept
                whatever the cut, so their pairs never count as split.
        """
        return any(
            keep_head <= p.call_message < split <= p.result_message for p in self.pairs
        )


def pair_tool_traffic(messages: Sequence[Message]) -> ToolTraffic:
    """Pair every tool result with its call, per occurrence.

    Args:
        messages: The conversation.

    Returns:
        The pairs, lone calls and lone results, by position.
    """
    open_calls: dict[str, list[PartRef]] = {}
    pairs: list[ToolPair] = []
    lone_results: list[PartRef] = []
    for i, message in enumerate(messages):
        for j, part in enumerate(message.parts):
            if isinstance(part, ToolCallPart):
                open_calls.setdefault(part.id, []).append(PartRef(i, j))
            elif isinstance(part, ToolResultPart):
                stack = open_calls.get(part.call_id)
                if stack:
                    call = stack.pop()
                    pairs.append(ToolPair(call.message, call.part, i, j))
                else:
                    lone_results.append(PartRef(i, j))
    lone_calls = sorted(ref for stack in open_calls.values() for ref in stack)
    return ToolTraffic(
        pairs=tuple(pairs),
        lone_calls=tuple(lone_calls),
        lone_results=tuple(lone_results),
    )


def adjust_split(
    messages: Sequence[Message],
    split: int,
    *,
    keep_head: int = 0,
    traffic: ToolTraffic | None = None,
) -> int:
    """Move a cut earlier until no tool pair straddles it.

    The cut keeps `messages[split:]`. While a result at or after the cut is
    paired with a call before it, the cut moves to that call's message; the
    loop runs to a fixpoint, since the new cut may strand earlier pairs. It
    never moves the cut later, so it always ends.

    Args:
        messages: The conversation.
        split: The proposed cut, clamped into ``0..len(messages)``.
        keep_head: The first `keep_head` messages are kept whatever the cut
            (e.g. 1 for a compactor that always keeps the first message), so
            calls there never move it.
        traffic: `pair_tool_traffic(messages)`, if already computed.

    Returns:
        The latest cut at or before `split` that splits no pair.
    """
    n = len(messages)
    split = max(0, min(split, n))
    if traffic is None:
        traffic = pair_tool_traffic(messages)
    # earliest[r]: the earliest movable call answered in messages[r:].
    earliest = [n] * (n + 1)
    for pair in traffic.pairs:
        if pair.call_message >= keep_head:
            r = pair.result_message
            earliest[r] = min(earliest[r], pair.call_message)
    for r in range(n - 1, -1, -1):
        earliest[r] = min(earliest[r], earliest[r + 1])
    while earliest[split] < split:
        split = earliest[split]
    return split


def keep_parts(message: Message, indices: Iterable[int]) -> Message | None:
    """Return `message` with only the parts at `indices`, or None if emptied.

    A message that keeps all its parts is returned as is. A filtered copy gets
    a new id derived from the original and the kept indices, so it never
    passes for the original (ids key token caches and the audit trail) and
    the same filtering always yields the same id.

    Args:
        message: The message to filter.
        indices: Indices of the parts to keep; order and repeats are ignored.

    Returns:
        The message, a filtered copy, or None when filtering removed every
        part of a message that had some.
    """
    kept = sorted(set(indices))
    if len(kept) == len(message.parts):
        return message
    if not kept:
        return None
    suffix = "-".join(str(i) for i in kept)
    return attrs.evolve(
        message,
        parts=tuple(message.parts[i] for i in kept),
        id=f"{message.id}#{suffix}",
    )


def sanitize(
    messages: Sequence[Message], *, traffic: ToolTraffic | None = None
) -> tuple[Message, ...]:
    """Drop lone tool results and the messages that filtering empties.

    Lone calls are kept: their results may still be in flight. When nothing
    would remain (a conversation made only of lone results), the messages are
    returned as received, since a compactor never returns an empty list.

    Args:
        messages: The conversation.
        traffic: `pair_tool_traffic(messages)`, if already computed.

    Returns:
        The sanitised conversation (the same messages when nothing was lone).
    """
    if traffic is None:
        traffic = pair_tool_traffic(messages)
    if not traffic.lone_results:
        return tuple(messages)
    lone = set(traffic.lone_results)
    out: list[Message] = []
    for i, message in enumerate(messages):
        keep = [j for j in range(len(message.parts)) if (i, j) not in lone]
        kept = keep_parts(message, keep)
        if kept is not None:
            out.append(kept)
    return tuple(out) if out else tuple(messages)
