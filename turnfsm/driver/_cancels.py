"""Whether a cancellation error is a cancel of the running task, or a plug-in's own.

A plug-in (a tool, a model client, a compactor, a store) that awaited
something cancelled elsewhere raises the cancellation error though nothing
cancels the run: its failure, not a cancel to obey.
"""

from __future__ import annotations

import asyncio
import math

import anyio

__all__ = ["cancel_errors", "cancel_requested"]


def cancel_requested() -> bool:
    """Whether the running task (a tool's, a compaction pass's) is being cancelled.

    On asyncio every cancel (a cancel scope's, a deadline's, the task's own)
    is counted by the task until it is caught; on trio a cancel is its cancel
    scope's, whose deadline is then past for good. A cancellation error
    raised where neither holds is the plug-in's own (it awaited something
    cancelled elsewhere).
    """
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no asyncio loop: trio
        return anyio.current_effective_deadline() == -math.inf
    return task is None or task.cancelling() > 0


def cancel_errors(
    *others: type[BaseException],
) -> tuple[type[BaseException], ...]:
    """The cancellation errors a plug-in may raise, its backend's and asyncio's.

    Caught with `cancel_requested` to tell the run's cancel from a plug-in's
    own. On trio, asyncio's ``CancelledError`` (raised by code written for
    asyncio) is no cancel of the run either, and is told apart the same way.
    `others` are caught with them (``cancel_errors(Exception)``).
    """
    return (*others, asyncio.CancelledError, anyio.get_cancelled_exc_class())
