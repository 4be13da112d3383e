"""A careless compactor for the gate test: it keeps the newest turn and the pins."""

from __future__ import annotations

from collections.abc import Sequence

from turnfsm.context import CompactionContext, CompactionProposal, keep_pinned
from turnfsm.messages import Message, Role


class DropAll:
    """Drops everything before the newest user message (a planted regression).

    Only the pinned messages stay (the manager refuses a pass that drops one).
    """

    async def compact(
        self, messages: Sequence[Message], target: int, ctx: CompactionContext
    ) -> CompactionProposal:
        last = max(i for i, m in enumerate(messages) if m.role is Role.USER)
        kept = keep_pinned(messages, messages[last:], ctx.pinned)
        return CompactionProposal.compacted(kept, ctx.tokens_before, 0)


drop_all = DropAll()


class PlainDef:
    """A compactor written with a plain ``def compact``: it cannot be awaited."""

    def compact(
        self, messages: Sequence[Message], target: int, ctx: CompactionContext
    ) -> CompactionProposal:
        return CompactionProposal.compacted(list(messages), ctx.tokens_before, 0)


plain_def = PlainDef()


class Raising:
    """A compactor whose every pass raises: each run that needs one fails."""

    async def compact(
        self, messages: Sequence[Message], target: int, ctx: CompactionContext
    ) -> CompactionProposal:
        raise ValueError("the summary service is down")


raising = Raising()
