"""A careless compactor for the gate test: it keeps the newest turn alone."""

from __future__ import annotations

from collections.abc import Sequence

from turnfsm.context import CompactionContext, CompactionProposal
from turnfsm.messages import Message, Role


class DropAll:
    """Drops everything before the newest user message (a planted regression)."""

    async def compact(
        self, messages: Sequence[Message], target: int, ctx: CompactionContext
    ) -> CompactionProposal:
        last = max(i for i, m in enumerate(messages) if m.role is Role.USER)
        return CompactionProposal.compacted(messages[last:], ctx.tokens_before, 0)


drop_all = DropAll()
