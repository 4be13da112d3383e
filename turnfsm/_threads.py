"""`to_the_end`: a call in a worker thread that its caller waits out, cancelled or not.

anyio's shield (``CancelScope(shield=True)``) holds off a cancel scope's
cancellation, on every event loop. It does not hold off asyncio's own
``task.cancel()``, which is how an asyncio web server ends a request whose
client went away: the ``await`` raises at once, while the thread goes on
and, for a store's append, commits. The caller then never learns that its
write landed, and its view of the log is behind the log.

So on asyncio the call runs in a task of its own that the caller waits for
through `asyncio.shield`; a cancellation that arrives meanwhile is held
until the call has returned, then handed back to the caller, at its next
``await``. Elsewhere (trio) anyio's shield is enough.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio
import anyio.to_thread

__all__ = ["to_the_end"]

T = TypeVar("T")


async def to_the_end(fn: Callable[..., T], *args: object) -> T:
    """Run ``fn(*args)`` in a worker thread and wait until it returns.

    Nothing that cancels the caller cuts the wait short: a cancellation
    that arrives meanwhile is delivered once `fn` has returned (or raised),
    at the caller's next ``await``.
    """
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no asyncio loop in this thread (trio)
        task = None
    # The shield holds off anyio's cancel scopes (which would otherwise ask
    # again and again, on asyncio); asyncio's own cancel is held below.
    with anyio.CancelScope(shield=True):
        if task is None:
            result = await anyio.to_thread.run_sync(fn, *args)
        else:
            result = await _held(task, anyio.to_thread.run_sync(fn, *args))
    return result


async def _held(task: asyncio.Task[object], call: Awaitable[T]) -> T:
    """Await `call` in a task of its own; hand `task` a cancel it got meanwhile."""
    running = asyncio.ensure_future(call)
    held: asyncio.CancelledError | None = None
    try:
        while True:
            try:
                return await asyncio.shield(running)
            except asyncio.CancelledError as cancelled:
                if running.cancelled():  # the call itself was (the loop closes)
                    raise
                held = cancelled
    finally:
        if held is not None:
            # Handed back as it came: the task's count of cancellations
            # asked for stays what it was (asyncio.timeout reads it).
            task.uncancel()
            task.cancel(*held.args)
