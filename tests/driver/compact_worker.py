"""A process that compacts a stored session and dies mid-pass (SIGKILL).

    python compact_worker.py DB SESSION_ID

The summary model kills the process while it writes the summary: the log
then holds an unfinished compaction, which `Driver.compact` carries on.
"""

from __future__ import annotations

import os
import signal
import sys

import anyio

from tests.driver.test_session_compaction import driver_with
from turnfsm.persistence import Session, SQLiteStore
from turnfsm.providers import ModelRequest, ModelResponse


class Dying:
    """A summary model that kills its process on the first call."""

    async def complete(self, request: ModelRequest) -> ModelResponse:
        os.kill(os.getpid(), signal.SIGKILL)
        raise AssertionError("not reached")


async def main(path: str, session_id: str) -> None:
    store = SQLiteStore(path)
    session = await Session.load(store, session_id)
    await driver_with(Dying()).compact(session)


if __name__ == "__main__":
    anyio.run(main, *sys.argv[1:])
