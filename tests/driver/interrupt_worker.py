"""A user's program for the Ctrl-C test: three steps, Ctrl-C after the second.

``python interrupt_worker.py EFFECTS STORE first`` starts the run and sends
itself SIGINT while the model is asked for the third step (steps 0 and 1 have
run and their side effects are in EFFECTS); ``... second`` resumes the
interrupted run from the store and prints its outcome and answer. A fourth
argument ``idempotent`` marks the step tool safe to run twice: a step cut
short by the Ctrl-C runs again on resume instead of being closed as
interrupted.
"""

from __future__ import annotations

import os
import signal
import sys

import anyio

from turnfsm import Agent, function_tool
from turnfsm.messages import Message
from turnfsm.providers import ModelRequest
from turnfsm.testing import FakeModelClient, reply, tool_call

effects, store, which = sys.argv[1], sys.argv[2], sys.argv[3]
idempotent = sys.argv[4:] == ["idempotent"]
# Started from a terminal, Python turns Ctrl-C into KeyboardInterrupt; a test
# suite started in the background by a script inherits SIGINT ignored, and
# Python keeps it so. This program is the terminal's.
signal.signal(signal.SIGINT, signal.default_int_handler)


def model(request: ModelRequest) -> Message:
    done = sum(1 for m in request.messages if m.role.value == "tool")
    if done == 2 and which == "first":
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C while the model thinks
    if done == 3:
        return reply("finished")
    return reply("", tool_call("step", f"c{done}", n=done))


def step(n: int) -> str:
    """Do step n.

    Args:
        n: the step.
    """
    with open(effects, "a") as f:
        f.write(f"{n}\n")
    return f"step {n} done"


agent = Agent(
    model=FakeModelClient(model),
    tools=[function_tool(step, idempotent=idempotent)],
    store=store,
)
if which == "first":
    with open(effects + ".session", "w") as f:
        f.write(agent.session.id)
    agent.run_sync("do three steps")
else:
    with open(effects + ".session") as f:
        session_id = f.read()

    async def go() -> None:
        session = await agent.open_session(session_id)
        (run,) = [r for r in session.runs if r.is_open]
        print(run.outcome)
        result = await agent.resume(session_id, run.run_id)
        print(result.outcome, result.text)

    anyio.run(go)
