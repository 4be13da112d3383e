"""Agents for `turnfsm run --agent tests.cli.stuck_tool_agent:NAME`.

Each one's first reply calls a tool that waits far longer than a test may
take: ``agent``'s presses Ctrl-C itself (SIGINT to its own process), then
blocks in its worker thread, where nothing can stop it; ``slow_agent``'s
waits a minute, long enough for a test to stop the program meanwhile;
``slow_to_stop_agent``'s waits a minute too, and when it is interrupted takes
five seconds to clean up, long enough for a second Ctrl-C meanwhile;
``timed_out_agent``'s blocks in its thread past its one-second timeout.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable

import anyio

from turnfsm import Agent, ContextManager
from turnfsm.testing import ScriptedModel, reply, tool_call
from turnfsm.tokens import HeuristicTokenCounter


def wait_for_the_disk() -> str:
    """Wait for the disk: Ctrl-C is pressed, and it goes on waiting."""
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(120)
    return "the disk answered"


async def wait_for_the_disk_a_minute() -> str:
    """Wait for the disk, for a minute."""
    await anyio.sleep(60)
    return "the disk answered"


async def fetch_the_report() -> str:
    """Fetch the report, for a minute; interrupted, clean up for five seconds."""
    try:
        await anyio.sleep(60)
    finally:
        with anyio.CancelScope(shield=True):
            await anyio.sleep(5)
    return "the report"


def wait_for_the_disk_for_ever() -> str:
    """Wait for the disk: it does not answer for two minutes."""
    time.sleep(120)
    return "the disk answered"


def _calling(tool: Callable[[], object], **options: float) -> Agent:
    """An agent whose first reply calls `tool`."""
    return Agent(
        model=ScriptedModel.of(reply("", tool_call(tool.__name__, "c1")), "done"),
        tools=[tool],
        context=ContextManager(context_window=8_000, counter=HeuristicTokenCounter()),
        **options,
    )


def agent() -> Agent:
    """An agent whose first reply calls the stuck tool."""
    return _calling(wait_for_the_disk)


def slow_agent() -> Agent:
    """An agent whose first reply calls the tool that waits a minute."""
    return _calling(wait_for_the_disk_a_minute)


def slow_to_stop_agent() -> Agent:
    """An agent whose first reply calls the tool slow to clean up."""
    return _calling(fetch_the_report)


def timed_out_agent() -> Agent:
    """An agent whose tool blocks in its thread past its one-second timeout."""
    return _calling(wait_for_the_disk_for_ever, tool_timeout=1.0)
