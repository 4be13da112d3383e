"""A resumed run counts the sub-agents it started before, and what they used."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

import anyio
import pytest

from turnfsm import Agent, Driver, review_machine
from turnfsm.driver import Tool, subagent_effect
from turnfsm.driver._recall import session_scope
from turnfsm.driver._subagents import child_ids, run_scope
from turnfsm.driver._tools import run_tool_call
from turnfsm.errors import CorruptRecord, EffectFailed, ProviderError
from turnfsm.messages import Message
from turnfsm.persistence import (
    Entry,
    MemoryStore,
    Session,
    SessionStore,
    child_sessions,
    descendants,
    parent_of,
)
from turnfsm.providers import ModelRequest, ModelResponse
from turnfsm.testing import FakeModelClient, reply, tool_call
from turnfsm.values import Usage

pytestmark = pytest.mark.anyio

CHILD_USAGE = Usage(input_tokens=40, output_tokens=3)


def answering_child() -> Agent:
    """A sub-agent that answers its task in one turn."""

    def answer(request: ModelRequest) -> ModelResponse:
        return ModelResponse(
            message=reply(f"done: {request.messages[-1].text}"), usage=CHILD_USAGE
        )

    return Agent(model=FakeModelClient(answer))


def one_call_a_turn(calls: int, *, stop_at: int | None = None) -> Any:
    """Calls the reader once a turn, `calls` times, then sums up what came back.

    With `stop_at`, the turn after that many results never answers (the
    process "stops" there).
    """
    stopped = anyio.Event()

    async def answer(request: ModelRequest) -> Message:
        results = [p for m in request.messages for p in m.tool_results]
        if stop_at is not None and len(results) == stop_at:
            stopped.set()
            await anyio.sleep_forever()
        if len(results) < calls:
            n = len(results)
            return reply("", tool_call("reader", f"call_{n}", task=f"part {n}"))
        return reply(" | ".join(p.content for p in results))

    return FakeModelClient(answer), stopped


async def stopped_run(
    store: SessionStore,
    run: Callable[[], Coroutine[Any, Any, Any]],
    stopped: anyio.Event,
) -> str:
    """Run `run` until `stopped`, then cancel it; the run id it left open."""
    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            group.start_soon(run)
            await stopped.wait()
            group.cancel_scope.cancel()
    (session_id,) = [s.id for s in await _roots(store)]
    (record,) = (await Session.load(store, session_id)).open_runs()
    assert record.outcome == "interrupted"
    return record.run_id


async def _roots(store: SessionStore) -> list[Session]:
    """The sessions of `store` that are no one's sub-agent."""
    sessions = [await Session.load(store, i.id) for i in await store.list_sessions()]
    return [s for s in sessions if parent_of(s) is None]


async def stop_then_resume(
    tool: Tool, calls: int, stopped: anyio.Event | None = None
) -> tuple[Any, SessionStore, str]:
    """Run a parent that delegates `calls` times until it stops, then resume it.

    It stops at `stopped`, or else before its last call. Resumed as another
    process would: the same tool, a new parent agent, the same store.
    Returns the resumed run's result, the store and the parent's session.
    """
    store = MemoryStore()
    model, last = one_call_a_turn(
        calls, stop_at=None if stopped is not None else calls - 1
    )
    parent = Agent(model=model, tools=[tool], store=store)
    run_id = await stopped_run(store, lambda: parent.run("read it"), stopped or last)
    model, _ = one_call_a_turn(calls)
    again = Agent(model=model, tools=[tool], store=store)
    return await again.resume(parent.session.id, run_id), store, parent.session.id


async def test_a_resumed_run_counts_max_children_from_where_it_began() -> None:
    tool = answering_child().as_tool(name="reader", description="Read", max_children=2)
    result, store, session_id = await stop_then_resume(tool, 3)

    assert result.outcome == "done", result.error
    first, second, third = result.text.split(" | ")
    assert (first, second) == ("done: part 0", "done: part 1")
    assert "SubagentTooMany" in third
    assert "started 2 sub-agent(s) with 'reader'" in third
    assert len(await child_sessions(store, session_id)) == 2


async def test_a_resumed_runs_children_usage_sums_all_its_children() -> None:
    tool = answering_child().as_tool(name="reader", description="Read")
    result, store, session_id = await stop_then_resume(tool, 3)

    assert result.outcome == "done", result.error
    kids = await child_sessions(store, session_id)
    assert len(kids) == 3  # two before the resume, one after
    assert result.children_usage == sum((k.runs[0].usage for k in kids), Usage())
    assert result.children_usage == Usage(input_tokens=120, output_tokens=9)


async def test_a_child_carried_on_across_a_resume_counts_once() -> None:
    stuck = anyio.Event()
    turns = {"n": 0}

    async def slow(request: ModelRequest) -> ModelResponse:
        turns["n"] += 1
        if turns["n"] == 2:  # the child's second turn: the process "stops"
            stuck.set()
            await anyio.sleep_forever()
        if not any(m.tool_results for m in request.messages):
            message = reply("", tool_call("note", "k1", text="x"))
        else:
            message = reply("noted")
        return ModelResponse(message=message, usage=CHILD_USAGE)

    def note(text: str) -> str:
        """Note a text.

        Args:
            text: What to note.
        """
        return "ok"

    child = Agent(model=FakeModelClient(slow), tools=[note])
    tool = child.as_tool(name="reader", description="Read", max_children=1)
    result, store, session_id = await stop_then_resume(tool, 1, stuck)

    assert result.outcome == "done", result.error
    assert result.text == "noted"  # its own child carried on, not refused
    (kid,) = await child_sessions(store, session_id)
    (run,) = kid.runs
    assert run.outcome == "done"
    assert result.children_usage == run.usage == CHILD_USAGE + CHILD_USAGE


def stopping_writer() -> tuple[Any, anyio.Event]:
    """Drafts, then revises; its revision never comes back the first time."""
    stopped = anyio.Event()
    drafts = {"n": 0}

    async def write(request: ModelRequest) -> Message:
        drafts["n"] += 1
        if drafts["n"] == 2:
            stopped.set()
            await anyio.sleep_forever()
        if drafts["n"] == 1:
            return reply("a draft with no source")
        return reply("a draft, source: the ledger")

    return FakeModelClient(write), stopped


def reviewer() -> Driver:
    def review(request: ModelRequest) -> ModelResponse:
        task = request.messages[-1].text
        verdict = "approved" if "source:" in task else "cite your source"
        return ModelResponse(message=reply(verdict), usage=CHILD_USAGE)

    return Agent(model=FakeModelClient(review)).driver


def review_phase(child: Driver, max_children: int) -> Any:
    return subagent_effect(
        child,
        signal=lambda answer: "approved" if answer == "approved" else "revise",
        task=lambda conversation: f"Review this: {conversation[-1].text}",
        key="feedback",
        max_children=max_children,
    )


@pytest.mark.parametrize("max_children", [1, 2])
async def test_a_resumed_run_counts_the_sub_agent_phases_it_ran(
    max_children: int,
) -> None:
    store = MemoryStore()
    child = reviewer()
    model, stopped = stopping_writer()
    effects = {"review": review_phase(child, max_children)}
    driver = Driver(model=model, machine=review_machine(), effects=effects)
    session = Session(store=store)
    run_id = await stopped_run(
        store, lambda: driver.run("write it", session=session), stopped
    )
    assert len(await child_sessions(store, session.id)) == 1

    again = Driver(model=model, machine=review_machine(), effects=effects)
    result = await again.resume(await Session.load(store, session.id), run_id)

    kids = await child_sessions(store, session.id)
    if max_children == 1:  # the second review is one too many
        assert result.outcome == "failed"
        assert isinstance(result.error, EffectFailed)
        assert result.error.type == "SubagentTooMany"
        assert len(kids) == 1
    else:
        assert result.outcome == "done", result.error
        assert result.text == "a draft, source: the ledger"
        assert [k.runs[0].text for k in kids] == ["cite your source", "approved"]
    assert result.children_usage == sum((k.runs[0].usage for k in kids), Usage())


async def test_a_resumed_run_counts_its_childrens_own_sub_agents() -> None:
    leaf = answering_child().as_tool(name="reader", description="Read")
    middle = Agent(model=one_call_a_turn(1)[0], tools=[leaf])
    tool = middle.as_tool(name="reader", description="Read")
    result, store, session_id = await stop_then_resume(tool, 2)

    assert result.outcome == "done", result.error
    below = await descendants(store, session_id)
    assert len(below) == 4  # two children, each with a child of its own
    spent = sum((s.runs[0].usage for s in below), Usage())
    assert result.children_usage == spent
    assert result.children_usage == Usage(input_tokens=80, output_tokens=6)


async def test_a_child_that_failed_before_its_result_was_logged_counts_once() -> None:
    def broken(request: ModelRequest) -> ModelResponse:
        usage = Usage(input_tokens=7)
        if request.messages[-1].tool_results:
            raise ProviderError("down", retryable=False)
        return ModelResponse(
            message=reply("", tool_call("note", text="x")), usage=usage
        )

    def note(text: str) -> str:
        """Note a text.

        Args:
            text: What to note.
        """
        return "ok"

    store = MemoryStore()
    child = Agent(model=FakeModelClient(broken), tools=[note])
    tool = child.as_tool(name="reader", description="Read")
    parent = Agent(model=one_call_a_turn(1)[0], tools=[tool], store=store)
    first = await parent.run("read it")
    assert "SubagentFailed" in first.text
    # The same call runs again (as a resumed parent runs a call whose result
    # was not logged): the failure again, and what the child used, once.
    session = await Session.load(store, parent.session.id)
    (call,) = [c for m in session.history for c in m.tool_calls]
    with (
        session_scope(session),
        run_scope(first.run_id, None, parent.driver.machine) as (_, tally),
    ):
        again = await run_tool_call(call, {"reader": tool}, limit=None)
    assert "SubagentFailed" in again.tool_results[0].content
    assert tally.usage == first.children_usage == Usage(input_tokens=7)
    (kid,) = await child_sessions(store, parent.session.id)
    assert len(kid.runs) == 1


class DamagedChildren(MemoryStore):  # type: ignore[misc]
    """A store whose sessions named in `damaged` do not read back."""

    def __init__(self) -> None:
        super().__init__()
        self.damaged: set[str] = set()

    async def load(self, session_id: str) -> tuple[Entry, ...]:
        if session_id in self.damaged:
            raise CorruptRecord("Event", "", "damaged on purpose")
        return await super().load(session_id)


async def test_a_damaged_childs_log_does_not_stop_its_callers_resume() -> None:
    store = DamagedChildren()
    tool = answering_child().as_tool(name="reader", description="Read")
    model, stopped = one_call_a_turn(2, stop_at=1)
    parent = Agent(model=model, tools=[tool], store=store)
    run_id = await stopped_run(store, lambda: parent.run("read it"), stopped)
    kid = child_ids(parent.session.id, run_id, "call_0")[0]
    store.damaged.add(kid)

    model, _ = one_call_a_turn(2)
    again = Agent(model=model, tools=[tool], store=store)
    result = await again.resume(parent.session.id, run_id)

    assert result.outcome == "done", result.error
    assert result.text == "done: part 0 | done: part 1"
    assert result.children_usage == CHILD_USAGE  # the damaged one's is not known
