"""Layers 4 and 5 of `LayeredCompactor`: all but the newest exchanges, summarised."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Final

from turnfsm.context._pins import keep_pinned
from turnfsm.context._summarizing import split_turns, summarise
from turnfsm.context._transcript import (
    SUMMARY_KEY,
    summary_body,
    summary_id,
    turn_starts,
)
from turnfsm.context._values import CompactionContext
from turnfsm.messages import SUMMARY_COVERS, Message

if TYPE_CHECKING:
    from turnfsm.context._layered import LayeredCompactor

__all__ = ["collapse"]


async def collapse(
    compactor: LayeredCompactor,
    messages: tuple[Message, ...],
    keep: int,
    label: str | None,
    ctx: CompactionContext,
    window: int,
) -> tuple[Message, ...]:
    """Layers 4 and 5: summarise all but the newest `keep` exchanges."""
    plan = split_turns(
        messages,
        keep,
        into_newest=label is not None and compactor.compact_newest_exchange,
    ).without(ctx.pinned)
    if not plan.summarised:
        return messages
    key = plan.key(ctx.session_id) + (":full" if label else ":collapse")
    message_id = summary_id(key)
    text = ctx.summaries.get(message_id)
    if text is None:
        body = await summarise(
            plan.summarised,
            previous="\n\n".join(summary_body(m) for m in plan.previous),
            ctx=ctx,
            model=compactor.model,
            max_tokens=compactor.max_summary_tokens,
            window=window,
        )
        turns = len(turn_starts(plan.summarised)) + sum(
            _summarised_turns(m) for m in plan.previous
        )
        header = label or f"[Conversation summary of {max(turns, 1)} earlier turns]"
        text = f"{header}\n{body}"
    summary = Message.user(
        text,
        id=message_id,
        metadata={SUMMARY_COVERS: plan.summarised[-1].id, SUMMARY_KEY: key},
    )
    return keep_pinned(
        messages, (*plan.head, *plan.opening, summary, *plan.kept), ctx.pinned
    )


_COLLAPSED: Final = re.compile(r"^\[Conversation summary of (\d+) earlier turns\]")


def _summarised_turns(summary: Message) -> int:
    """The turns an earlier collapse summary says it covers (0 if none)."""
    found = _COLLAPSED.match(summary.text)
    return int(found.group(1)) if found else 0
