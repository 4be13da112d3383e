"""A process killed (SIGKILL) in the middle of a tool call, for the resume tests.

    python -m tests.driver.cut_short_worker DB EFFECTS SESSION_FILE [WHERE]

It fills a session with a few notes, then asks for a delivery: the
``deliver`` tool writes its side effect (a line in EFFECTS) and the process
kills itself before the call's result reaches the log. The session id is
written to SESSION_FILE first. `tests/driver/test_cut_short.py` resumes the
run in another process with `driver` (the same model and tool, no kill).

WHERE ``model`` or ``model-idempotent``: the tool finishes (marked safe to
run twice or not) and the process kills itself in the model call that
follows, when the model is asked about the tool's result.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable

import anyio

from turnfsm import ContextManager, Driver, SummarizingCompactor, function_tool
from turnfsm.driver import Tool
from turnfsm.messages import Message, Role
from turnfsm.persistence import Session, SQLiteStore
from turnfsm.providers import ModelRequest
from turnfsm.testing import ExtractiveSummaryModel, FakeModelClient, reply, tool_call
from turnfsm.tokens import HeuristicTokenCounter

NOTES = 6
"""Runs before the delivery: something for a compaction pass to fold."""


def answer(request: ModelRequest) -> Message:
    """The scripted model: notes are acknowledged, a delivery calls the tool."""
    last = request.messages[-1]
    if last.role is Role.TOOL and os.environ.get(_DIE_IN_MODEL):
        _die()
    if last.role is Role.TOOL:
        (result,) = last.tool_results
        return reply(f"delivery: {result.content}")
    if last.text.startswith("deliver"):
        return reply("", tool_call("deliver", "d1", parcel="p1"))
    return reply(f"noted: {last.text[:20]}")


def deliver_tool(effects: str, *, idempotent: bool, then: Callable[[], None]) -> Tool:
    def deliver(parcel: str) -> str:
        """Deliver a parcel (a side effect: a line in the effects file).

        Args:
            parcel: which parcel.
        """
        with open(effects, "a") as f:
            f.write(f"{parcel}\n")
        then()
        return f"{parcel} delivered"

    return function_tool(deliver, idempotent=idempotent)


def driver(effects: str, *, idempotent: bool, then: Callable[[], None]) -> Driver:
    """The driver of the session (the worker's kills itself in the tool)."""
    return Driver(
        model=FakeModelClient(answer),
        tools=[deliver_tool(effects, idempotent=idempotent, then=then)],
        context=ContextManager(
            SummarizingCompactor(model=ExtractiveSummaryModel(), keep_recent_turns=1),
            context_window=50_000,
            counter=HeuristicTokenCounter(),
        ),
    )


_DIE_IN_MODEL = "TURNFSM_TEST_DIE_IN_MODEL"
"""Set (by `main`): the model kills the process when asked about a result."""


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _live() -> None:
    pass


async def main(path: str, effects: str, session_file: str, where: str = "tool") -> None:
    store = SQLiteStore(path)
    session = Session(store=store)
    await anyio.Path(session_file).write_text(session.id)
    in_model = where.startswith("model")
    dying = driver(
        effects,
        idempotent=where == "model-idempotent",
        then=_live if in_model else _die,
    )
    for i in range(NOTES):
        note = f"note {i}: the code of box {i} is {1000 + i}. " + "filler " * 120
        assert (await dying.run(note, session=session)).ok
    if in_model:
        os.environ[_DIE_IN_MODEL] = "1"
    await dying.run("deliver parcel p1", session=session)
    raise AssertionError("not reached: the process kills itself")


if __name__ == "__main__":
    anyio.run(main, *sys.argv[1:])
