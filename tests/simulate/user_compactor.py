"""A user's compactor for ``turnfsm simulate --compactor``: the tests load it."""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from turnfsm.context import (
    CompactionContext,
    CompactionProposal,
    ContextManager,
    TruncatingCompactor,
)
from turnfsm.messages import Message

compactor = TruncatingCompactor(
    preserve_recent=2, min_messages=3, compact_newest_exchange=True
)
"""The demo's own truncating compactor, as a user would write theirs."""


def make_context() -> ContextManager:
    """A whole context manager: the demo's window and line, the compactor."""
    return ContextManager(compactor, context_window=8_000, threshold=80)


not_a_compactor = 42
"""What ``--compactor`` refuses."""


class KeepRecent:
    """A user's own compactor, a plain class: the demo's truncation inside."""

    def __init__(self) -> None:
        self.inner = TruncatingCompactor(
            preserve_recent=2, min_messages=3, compact_newest_exchange=True
        )

    async def compact(
        self, messages: Sequence[Message], target: int, ctx: CompactionContext
    ) -> CompactionProposal:
        """Shrink as the demo's truncating compactor does."""
        return await self.inner.compact(messages, target, ctx)


mine = KeepRecent()
"""A module-level instance: the log names it ``tests.simulate.user_compactor:mine``."""


@attrs.frozen(kw_only=True)
class Keep:
    """A user's attrs compactor: its settings go in the log beside its name."""

    recent: int = 4

    async def compact(
        self, messages: Sequence[Message], target: int, ctx: CompactionContext
    ) -> CompactionProposal:
        """Truncate, keeping `recent` messages of the newest exchange."""
        inner = TruncatingCompactor(
            preserve_recent=self.recent, min_messages=3, compact_newest_exchange=True
        )
        return await inner.compact(messages, target, ctx)


@attrs.define
class Tunable:
    """A user's mutable attrs compactor: its setting may change between runs."""

    keep: int = 2

    async def compact(
        self, messages: Sequence[Message], target: int, ctx: CompactionContext
    ) -> CompactionProposal:
        """Keep the last `keep` messages after the first."""
        inner = TruncatingCompactor(preserve_recent=self.keep, min_messages=3)
        return await inner.compact(messages, target, ctx)
