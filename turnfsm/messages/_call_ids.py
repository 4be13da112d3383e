"""`unique_call_ids`: each tool call of a reply under an id never used before.

A tool call is known by its id: its result answers it, a reviewer approves
it, a sub-agent's session is derived from it. Some model servers give the
calls of every reply the same ids (``call_0``, ``call_1``), or repeat one
id in a batch; such a reply is taken with those calls renamed (``call_0``
becomes ``call_0_2``), so every id names one call. The reply is logged as
renamed, so a replay and a resumed run see the same ids.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import attrs

from turnfsm.messages._log import MessageLog
from turnfsm.messages._values import Message, Part, ToolCallPart

__all__ = ["unique_call_ids"]

_MEMO: Final = "call_ids"


def unique_call_ids(message: Message, *before: Sequence[Message]) -> Message:
    """Return `message` with each tool call under an id that `before` never used.

    Args:
        message: A model's reply.
        before: The conversation it answers (history, then pending). A
            `MessageLog`'s ids are kept on it, so each reply costs only the
            messages added since the last.

    Returns:
        `message` itself when its call ids are new and distinct; else a copy
        with each repeated id renamed: ``ID_2``, or, when that is taken too,
        ``ID_N`` with N from the reply's place in the conversation.
    """
    calls = message.tool_calls
    if not calls:
        return message
    ids = [c.id for c in calls]
    earlier = [_ids(messages) for messages in before]
    if len(set(ids)) == len(ids):
        for known in earlier:
            if not known.isdisjoint(ids):
                break
        else:
            return message  # the usual reply: its ids are new and distinct

    def used_before(call_id: str) -> bool:
        return any(call_id in known for known in earlier)

    renamed: set[str] = set()
    kept: set[str] = set()
    parts: list[Part] = []
    # Past `_2`, a suffix from the reply's place in the conversation: a server
    # that repeats one id every turn costs one try per call, not one per turn.
    place = sum(len(messages) for messages in before) + 2

    def taken(call_id: str) -> bool:
        return call_id in renamed or call_id in ids or used_before(call_id)

    for part in message.parts:
        if isinstance(part, ToolCallPart):
            if used_before(part.id) or part.id in kept:
                n = 2
                if taken(f"{part.id}_{n}"):
                    n = place
                while taken(f"{part.id}_{n}"):
                    n += 1
                part = attrs.evolve(part, id=f"{part.id}_{n}")
                renamed.add(part.id)
            kept.add(part.id)
        parts.append(part)
    return attrs.evolve(message, parts=tuple(parts))


def _ids(messages: Sequence[Message]) -> set[str]:
    """Every tool call id of `messages` (kept on a `MessageLog`, extended)."""
    if not isinstance(messages, MessageLog):
        return {c.id for m in messages for c in m.tool_calls}
    memo = messages.memo
    length = len(messages)
    known: tuple[int, set[str]] | None = memo.get(_MEMO)
    if known is not None and known[0] <= length:
        count, ids = known
    else:  # none yet, or a shorter view than the last asked about
        count, ids = 0, set()
    for m in messages.items_from(count):
        for part in m.parts:
            if type(part) is ToolCallPart:  # a final class: `tool_calls`, unbuilt
                ids.add(part.id)
    if known is None or known[0] <= length:
        memo[_MEMO] = (length, ids)
    return ids
