"""A user's compactor for ``turnfsm simulate --compactor``: the tests load it."""

from __future__ import annotations

from turnfsm.context import ContextManager, TruncatingCompactor

compactor = TruncatingCompactor(
    preserve_recent=2, min_messages=3, compact_newest_exchange=True
)
"""The demo's own truncating compactor, as a user would write theirs."""


def make_context() -> ContextManager:
    """A whole context manager: the demo's window and line, the compactor."""
    return ContextManager(compactor, context_window=8_000, threshold=80)


not_a_compactor = 42
"""What ``--compactor`` refuses."""
