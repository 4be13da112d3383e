"""An agent for `turnfsm run --agent tests.cli.stalling_store_agent:agent`.

Its store is one of your own whose reads never return (a server that hangs):
each command that reads a session from it gives up after the agent's
`store_timeout`.
"""

from __future__ import annotations

import anyio

from tests.helpers import ProtocolStore
from turnfsm import Agent
from turnfsm.persistence import Entry, MemoryStore
from turnfsm.testing import ScriptedModel


class StallingStore(ProtocolStore):
    """A store whose `load` never returns."""

    def __init__(self) -> None:
        super().__init__(MemoryStore())

    async def load(self, session_id: str) -> tuple[Entry, ...]:
        await anyio.sleep_forever()
        raise AssertionError("unreachable")


agent = Agent(
    model=ScriptedModel.of("done"),
    store=StallingStore(),
    store_timeout=0.2,
)
