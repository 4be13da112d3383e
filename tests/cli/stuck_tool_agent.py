"""An agent for `turnfsm run --agent tests.cli.stuck_tool_agent:agent`.

Its one tool presses Ctrl-C (SIGINT to its own process), then blocks in its
worker thread far longer than a test may take: nothing can stop it.
"""

from __future__ import annotations

import os
import signal
import time

from turnfsm import Agent, ContextManager
from turnfsm.testing import ScriptedModel, reply, tool_call
from turnfsm.tokens import HeuristicTokenCounter


def wait_for_the_disk() -> str:
    """Wait for the disk: Ctrl-C is pressed, and it goes on waiting."""
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(120)
    return "the disk answered"


def agent() -> Agent:
    """An agent whose first reply calls the stuck tool."""
    return Agent(
        model=ScriptedModel.of(reply("", tool_call("wait_for_the_disk", "c1")), "done"),
        tools=[wait_for_the_disk],
        context=ContextManager(context_window=8_000, counter=HeuristicTokenCounter()),
    )
