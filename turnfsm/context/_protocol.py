"""The `ContextCompactor` protocol: how a conversation is shrunk."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from turnfsm.context._values import CompactionContext, CompactionProposal
from turnfsm.messages import Message

__all__ = ["ContextCompactor"]


@runtime_checkable
class ContextCompactor(Protocol):
    """A strategy that shrinks a conversation (truncating, summarising, ...).

    The manager decides when a pass runs and whether it worked; a compactor
    only decides how to shrink. `turnfsm.testing.check_compactor` checks an
    implementation against the contract.
    """

    async def compact(
        self, messages: Sequence[Message], target: int, ctx: CompactionContext
    ) -> CompactionProposal:
        """Return a shorter conversation for `messages`, or a failed proposal.

        Args:
            messages: The conversation to shrink; never empty.
            target: The size in tokens the manager would like to reach
                (a hint: positional compactors may ignore it).
            ctx: The pass's context, including the manager's counter.

        Returns:
            A proposal whose messages never orphan a tool call/result pair and
            are never empty, or `CompactionProposal.failed(...)`.
        """
        ...
