"""An agent for `turnfsm run --agent tests.cli.slow_tool_agent:agent`.

Its first reply calls a tool that takes a minute: long enough for a test to
stop the program while the tool runs.
"""

from __future__ import annotations

import anyio

from turnfsm import Agent, ContextManager
from turnfsm.testing import ScriptedModel, reply, tool_call
from turnfsm.tokens import HeuristicTokenCounter


async def wait_for_the_disk() -> str:
    """Wait for the disk, for a minute."""
    await anyio.sleep(60)
    return "the disk answered"


def agent() -> Agent:
    """An agent whose first reply calls the slow tool."""
    return Agent(
        model=ScriptedModel.of(reply("", tool_call("wait_for_the_disk", "c1")), "done"),
        tools=[wait_for_the_disk],
        context=ContextManager(context_window=8_000, counter=HeuristicTokenCounter()),
    )
