"""An agent for `turnfsm run --agent tests.cli.stalling_store_agent:agent`.

Its store is one of your own whose reads never return (a server that hangs):
each command that reads a session from it gives up after the agent's
`store_timeout`.
"""

from __future__ import annotations

from collections.abc import Sequence

import anyio

from turnfsm import Agent
from turnfsm.persistence import Entry, MemoryStore
from turnfsm.testing import ScriptedModel


class StallingStore:
    """A store whose `load` never returns."""

    def __init__(self) -> None:
        self.inner = MemoryStore()

    async def append(
        self, session_id: str, entries: Sequence[Entry], *, expected_version: int
    ) -> int:
        return await self.inner.append(
            session_id, entries, expected_version=expected_version
        )

    async def load(self, session_id: str) -> tuple[Entry, ...]:
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    async def list_sessions(self) -> object:
        return await self.inner.list_sessions()


agent = Agent(
    model=ScriptedModel.of("done"),
    store=StallingStore(),  # type: ignore[arg-type]  # a store of yours
    store_timeout=0.2,
)
