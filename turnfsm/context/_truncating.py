"""`TruncatingCompactor`: drop the middle, keep the first message and the tail.

The default strategy: no model call, no dependency, positional (the target is
ignored). The procedure:

1. ``len <= min_messages`` → unchanged.
2. ``split = len - preserve_recent``, the provisional cut, or the newest
   exchange's user message when that comes first: the newest exchange (the
   last user message and everything after it) is kept whole, so a
   conversation that is one exchange is not cut (a deliberate difference
   from the classic truncator, which cut into it and could drop the user's request).
   With ``compact_newest_exchange`` the cut may fall inside the newest
   exchange, as the classic truncator does, but its user message is kept.
3. Move the cut earlier while a result at or after it answers a call before
   it (a fixpoint, see `adjust_split`). Calls in the first message do not move
   it: the first message is always kept, so those pairs survive anyway.
4. Nothing left to drop → unchanged.
5. Keep ``[first] + messages[split:]`` (and the newest exchange's user
   message, when the cut fell after it).
6. Pull the dropped results of the first message's calls back, right after
   the first message, so its calls keep their results. What is kept stays
   in its order.
7. Keep the pinned messages (`CompactionContext.pinned`) the cut dropped,
   in their place (`keep_pinned`).
8. Sanitise: lone results are dropped everywhere (unchanged paths included),
   lone calls outside the dropped region survive, messages emptied by the
   filtering are removed, and the result is never empty.
9. Re-count with the context's counter.
"""

from __future__ import annotations

from collections.abc import Sequence, Set
from typing import final

import attrs

from turnfsm import _checks
from turnfsm.context._pairs import (
    PartRef,
    ToolTraffic,
    adjust_split,
    keep_parts,
    pair_tool_traffic,
    sanitize,
)
from turnfsm.context._pins import keep_pinned
from turnfsm.context._recall_marks import same_messages, with_recall_marks
from turnfsm.context._transcript import turn_starts
from turnfsm.context._values import CompactionContext, CompactionProposal
from turnfsm.messages import Message

__all__ = ["TruncatingCompactor"]


@final
@_checks.keyword_checked
@attrs.frozen(kw_only=True)
class TruncatingCompactor:
    """Keep the first message and the most recent ones; drop the middle.

    Tool call/result pairs are never orphaned: the cut moves earlier until no
    pair straddles it, and results of the first message's calls are pulled
    back next to it. Pinned messages are kept as they are, in their place.
    A reply that called several tools at once is kept or dropped with all
    its results, so a newest reply whose results alone are over the target
    cannot be cut (`MaskingCompactor` digests them instead). The newest
    exchange (the last user message and everything after it) is always kept
    whole, and what is kept stays in order. A conversation that cannot be
    cut comes back unchanged (less any lone results), never empty.

    Attributes:
        preserve_recent: How many recent messages a cut keeps at least (≥ 1);
            more when the newest exchange is longer.
        min_messages: Conversations this long or shorter are never cut (≥ 2).
        compact_newest_exchange: Off (the default), the newest exchange is
            kept whole, so a conversation that is one long tool-using
            exchange (a single run) is not cut. On, the cut may fall inside
            it (`preserve_recent` messages are kept), but its user message
            is always kept.

    Raises:
        ConfigError: On construction, when a knob is out of range.
    """

    preserve_recent: int = attrs.field(default=4, validator=_checks.integer(low=1))
    min_messages: int = attrs.field(default=6, validator=_checks.integer(low=2))
    compact_newest_exchange: bool = attrs.field(
        default=False, validator=_checks.boolean()
    )

    async def compact(
        self, messages: Sequence[Message], target: int, ctx: CompactionContext
    ) -> CompactionProposal:
        """Drop the middle of `messages`; `target` is ignored (positional).

        Args:
            messages: The conversation.
            target: Ignored: this compactor cuts by position, not by size.
            ctx: The pass's context; `ctx.counter` re-counts the result.

        Returns:
            The cut conversation, or the input (sanitised) when it cannot be
            cut.

        Each replacement it makes names what it covers (a recall note).
        """
        return await with_recall_marks(self._compact, messages, target, ctx)

    async def _compact(
        self, messages: Sequence[Message], target: int, ctx: CompactionContext
    ) -> CompactionProposal:
        """The pass itself, on messages without their recall notes."""
        del target  # positional truncation, by design
        traffic = pair_tool_traffic(messages)
        n = len(messages)
        if n <= self.min_messages:
            return _unchanged(messages, traffic, ctx)
        newest = max(turn_starts(messages), default=0)
        split = n - self.preserve_recent
        if not self.compact_newest_exchange:
            split = min(split, newest)
        split = adjust_split(messages, split, keep_head=1, traffic=traffic)
        if split <= 1:  # nothing between the first message and the cut
            return _unchanged(messages, traffic, ctx)
        kept = list(
            keep_pinned(
                messages, _cut(messages, split, traffic, also=newest), ctx.pinned
            )
        )
        if not kept:  # only lone results were left: cutting saves nothing
            return _unchanged(messages, traffic, ctx)
        return CompactionProposal.compacted(
            kept, ctx.tokens_before, ctx.counter.count(kept)
        )


def _unchanged(
    messages: Sequence[Message], traffic: ToolTraffic, ctx: CompactionContext
) -> CompactionProposal:
    """Return the no-cut outcome: the input, less its lone results."""
    cleaned = sanitize(messages, traffic=traffic)
    if same_messages(cleaned, messages):
        return CompactionProposal.unchanged(cleaned, ctx.tokens_before)
    # An honest report: sanitising alone may have saved something.
    return CompactionProposal.compacted(
        cleaned, ctx.tokens_before, ctx.counter.count(cleaned)
    )


def _cut(
    messages: Sequence[Message], split: int, traffic: ToolTraffic, *, also: int
) -> list[Message]:
    """Return ``[first] + reattached results + messages[split:]``, sanitised.

    Lone results are dropped; in the dropped region ``messages[1:split]`` only
    the results answering the first message's calls survive, pulled back next
    to it, and ``messages[also]`` (the newest exchange's user message), in
    their order; messages emptied by this filtering are removed.
    """
    lone = set(traffic.lone_results)
    reattach: dict[int, list[int]] = {}
    for pair in traffic.pairs:
        if pair.call_message == 0 and pair.result_message < split:
            reattach.setdefault(pair.result_message, []).append(pair.result_part)
    if 0 < also < split:
        reattach[also] = _non_lone(messages, also, lone)
    plan: list[tuple[int, list[int]]] = [(0, _non_lone(messages, 0, lone))]
    plan.extend(sorted(reattach.items()))
    plan.extend((i, _non_lone(messages, i, lone)) for i in range(split, len(messages)))
    kept = (keep_parts(messages[i], parts) for i, parts in plan)
    return [m for m in kept if m is not None]


def _non_lone(messages: Sequence[Message], i: int, lone: Set[PartRef]) -> list[int]:
    """Return the indices of the parts of `messages[i]` that are not lone results."""
    return [j for j in range(len(messages[i].parts)) if (i, j) not in lone]
