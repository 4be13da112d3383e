"""A process killed (SIGKILL) inside a sub-agent's tool call, for the resume test.

    python -m tests.driver.subagent_worker DB EFFECTS SESSION_FILE [WHERE]

The parent delegates one task to a child agent; the child runs two tool
calls, one after the other. Each writes its side effect (a line in EFFECTS)
first; the second then kills the process, before its result reaches the
log. The parent's session id is written to SESSION_FILE first.
`tests/driver/test_subagent_kill.py` resumes the parent in another process
with `parent` (the same models and tools, no kill).

WHERE ``parent-model``: the child runs to its end, and the process kills
itself when the parent's model is asked about the child's answer (the
parent's call, safe to run twice, has no result in the log yet).
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable

import anyio

from turnfsm import Agent
from turnfsm.messages import Message
from turnfsm.persistence import Session, SQLiteStore
from turnfsm.providers import ModelRequest
from turnfsm.testing import FakeModelClient, reply, tool_call


def child_answer(request: ModelRequest) -> Message:
    """Two steps, one tool call each, then the answer naming what came back."""
    results = [p for m in request.messages for p in m.tool_results]
    if not results:
        return reply("", tool_call("step", "s1", label="first"))
    if len(results) == 1:
        return reply("", tool_call("step", "s2", label="second"))
    return reply("steps: " + "; ".join(p.content for p in results))


_DIE_IN_PARENT = "TURNFSM_TEST_DIE_IN_PARENT"
"""Set (by `main`): the parent's model kills the process when given the answer."""


def parent_answer(request: ModelRequest) -> Message:
    """Delegates once, then answers with what the sub-agent said."""
    last = request.messages[-1]
    if last.tool_results:
        if os.environ.get(_DIE_IN_PARENT):
            os.kill(os.getpid(), signal.SIGKILL)
        return reply(f"the worker said: {last.tool_results[0].content}")
    return reply("", tool_call("worker", "w1", task="do both steps"))


def parent(store: SQLiteStore, effects: str, then: Callable[[str], None]) -> Agent:
    """The parent agent, its child given as the ``worker`` tool."""

    def step(label: str) -> str:
        """Do one step (a side effect: a line in the effects file).

        Args:
            label: which step.
        """
        with open(effects, "a") as f:
            f.write(f"{label}\n")
        then(label)
        return f"{label} done"

    child = Agent(model=FakeModelClient(child_answer), tools=[step])
    return Agent(
        model=FakeModelClient(parent_answer),
        tools=[child.as_tool(name="worker", description="Does the steps.")],
        store=store,
    )


def _die_on_second(label: str) -> None:
    if label == "second":
        os.kill(os.getpid(), signal.SIGKILL)


def _live(_label: str) -> None:
    pass


async def main(path: str, effects: str, session_file: str, where: str = "") -> None:
    store = SQLiteStore(path)
    in_parent = where == "parent-model"
    if in_parent:
        os.environ[_DIE_IN_PARENT] = "1"
    agent = parent(store, effects, _live if in_parent else _die_on_second)
    session = Session(store=store)
    await anyio.Path(session_file).write_text(session.id)
    await agent.run("do the work", session=session)
    raise AssertionError("not reached: the process kills itself")


if __name__ == "__main__":
    anyio.run(main, *sys.argv[1:])
