"""Calls a run left without a result: closed as interrupted when it resumes.

A run whose process died (or was interrupted) while its tools ran resumes
from its log: a call whose result the log holds is not run again, and a call
with no result is one whose effects nobody knows (it may have done all of
its work, some, or none). Running it again could do its work twice; so,
unless its tool says it is safe to run twice (`Tool.idempotent`), the call
is closed with an error result that says so, logged like any tool result,
and the model decides whether to call it again. No call is left open: the
next request and every compaction pass see a whole conversation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from turnfsm.driver._tools import Tool
from turnfsm.messages import Message, ToolCallPart

__all__ = ["close_input", "interrupted_result", "to_close"]


def interrupted_result(call: ToolCallPart) -> Message:
    """The error result that closes `call`, cut short by a crash or an interrupt."""
    text = (
        f"tool {call.name!r} was interrupted: the run stopped before this call "
        "finished, so its effects are unknown (it may have done all, some or "
        "none of its work); call it again if it is still needed"
    )
    return Message.tool_result(call.id, text, is_error=True)


def to_close(
    calls: Sequence[ToolCallPart],
    recorded: Mapping[str, Message],
    tools: Mapping[str, Tool],
) -> list[ToolCallPart]:
    """The calls of a resumed batch to close as interrupted, in call order.

    Those with no recorded result whose tool is not `idempotent` (an unknown
    tool too: nothing says it is safe to run twice).
    """
    out = []
    for call in calls:
        if call.id in recorded:
            continue
        tool = tools.get(call.name)
        if tool is None or not tool.idempotent:
            out.append(call)
    return out


def close_input(
    messages: tuple[Message, ...], open_ids: Sequence[str]
) -> tuple[Message, ...]:
    """A run's input that ends in calls with no result, with them closed.

    A conversation given from outside may have been cut short in the middle
    of a tool call (its process died): the calls `open_ids` of its last
    assistant message get an interrupted result each, after it, so the run
    begins on a whole conversation. Only trailing calls can be open (a
    message after an open call is refused before this).
    """
    by_id = {call.id: call for message in messages for call in message.tool_calls}
    return (*messages, *(interrupted_result(by_id[i]) for i in open_ids))
