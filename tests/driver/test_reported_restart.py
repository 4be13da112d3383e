"""The provider's count of the last call survives a restart (a new process)."""

from __future__ import annotations

import pytest

from turnfsm import ContextManager, Driver
from turnfsm.core import Measured
from turnfsm.messages import Message
from turnfsm.persistence import EventRecorded, Session, SQLiteStore
from turnfsm.providers import ModelRequest, ModelResponse
from turnfsm.testing import FakeModelClient
from turnfsm.tokens import HeuristicTokenCounter
from turnfsm.values import Usage

pytestmark = pytest.mark.anyio

COUNTER = HeuristicTokenCounter()
REPORTED = 4_321


def _driver() -> Driver:
    def handle(_request: ModelRequest) -> ModelResponse:
        return ModelResponse(
            message=Message.assistant("noted"),
            usage=Usage(input_tokens=REPORTED, output_tokens=3),
        )

    return Driver(
        model=FakeModelClient(handle),
        context=ContextManager(
            context_window=100_000, counter=COUNTER, use_reported_usage=True
        ),
    )


def _first_estimate(session: Session) -> int:
    run = session.runs[-1]
    [measured] = [
        e.event
        for e in session.entries
        if isinstance(e, EventRecorded)
        and e.run_id == run.run_id
        and isinstance(e.event, Measured)
    ][:1]
    assert isinstance(measured, Measured)
    return measured.estimate


async def test_a_new_process_measures_with_the_last_reported_count(
    tmp_path: object,
) -> None:
    path = tmp_path / "s.db"  # type: ignore[operator]
    store = SQLiteStore(path)
    session = Session(store=store)
    assert (await _driver().run("remember 42", session=session)).ok
    await store.aclose()

    # Another process: a fresh store object, a fresh driver, the same log.
    store = SQLiteStore(path)
    again = await Session.load(store, session.id)
    follow = Message.user("what was it?")
    assert (await _driver().run(follow, session=again)).ok
    reply = again.history[-3]  # the first run's answer, after its request
    assert reply.text == "noted"
    expected = REPORTED + COUNTER.count([reply]) + COUNTER.count([follow])
    assert _first_estimate(again) == expected
    await store.aclose()


async def test_after_a_compaction_the_estimate_is_used_again(tmp_path: object) -> None:
    """A history that no longer begins with what the last call saw: no count."""
    store = SQLiteStore(tmp_path / "s.db")  # type: ignore[operator]
    session = Session(store=store)
    driver = _driver()
    for i in range(5):
        assert (await driver.run(f"fact {i}: " + "x" * 200, session=session)).ok
    assert (await driver.compact(session)).ok
    assert session.runs[-1].compactions[0].compacted
    follow = Message.user("and?")
    assert (await driver.run(follow, session=session)).ok
    estimate = _first_estimate(session)
    assert estimate != REPORTED + COUNTER.count([follow])
    assert estimate < REPORTED  # the estimate of a short history, not the report
    await store.aclose()


async def test_a_run_resumed_in_a_new_process_measures_with_its_last_report(
    tmp_path: object,
) -> None:
    """A paused run's next measurement starts from its last call's count."""
    from turnfsm._resources import load_machine, machines_dir
    from turnfsm.core import ToolCallsReviewed
    from turnfsm.testing import reply, tool_call

    def _approving(*messages: Message) -> Driver:
        replies = iter(messages)

        def handle(_request: ModelRequest) -> ModelResponse:
            return ModelResponse(
                message=next(replies),
                usage=Usage(input_tokens=REPORTED, output_tokens=3),
            )

        async def echo(text: str) -> str:
            """Return `text`."""
            return text

        return Driver(
            model=FakeModelClient(handle),
            tools=[echo],
            machine=load_machine(machines_dir() / "approval.toml"),
            context=ContextManager(
                context_window=100_000, counter=COUNTER, use_reported_usage=True
            ),
        )

    path = tmp_path / "s.db"  # type: ignore[operator]
    store = SQLiteStore(path)
    session = Session(store=store)
    asking = _approving(reply("", tool_call("echo", "c1", text="hi")))
    paused = await asking.run("say hi", session=session)
    assert paused.outcome == "paused"
    await store.aclose()

    store = SQLiteStore(path)  # another process
    again = await Session.load(store, session.id)
    count = len(_measures(again, paused.run_id))
    driver = _approving(reply("done"))
    done = await driver.resume(again, paused.run_id, ToolCallsReviewed.approve_all())
    assert done.ok
    after = _measures(again, paused.run_id)[count]  # the first after the resume
    turn = again.run(paused.run_id).turns[0]
    answer = again.message(turn.output)
    [result] = [m for m in again.history if m.tool_results]
    assert after == REPORTED + COUNTER.count([answer]) + COUNTER.count([result])
    await store.aclose()


def _measures(session: Session, run_id: str) -> list[int]:
    return [
        e.event.estimate
        for e in session.entries
        if isinstance(e, EventRecorded)
        and e.run_id == run_id
        and isinstance(e.event, Measured)
    ]
