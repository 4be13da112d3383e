"""Durable runs whose steps run as Temporal local activities.

`DurableOptions(local_activities=True)`: the model calls, compaction
passes, custom effects and tool calls run in the worker that runs the
workflow, with no activity the server schedules. The same run, the same
log; the log is written only from finished workflow tasks. Real dev
server, real SQLite files.
"""

from __future__ import annotations

import io
import uuid
from pathlib import Path
from typing import Any

import anyio
import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHistory

from turnfsm import Agent
from turnfsm.cli._demo import TASK, build_demo_agent
from turnfsm.driver import replay
from turnfsm.errors import ConfigError, SessionBusy
from turnfsm.messages import Message
from turnfsm.persistence import MemoryStore, Session, SQLiteStore
from turnfsm.providers import ModelRequest
from turnfsm.temporal import (
    DurableOptions,
    DurableRun,
    create_worker,
    start_durable,
)
from turnfsm.testing import FakeModelClient, reply, tool_call

from .test_durable import _history, _replays, content, kinds
from .test_subagents import agents, child_sessions

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

LOCAL = DurableOptions(
    local_activities=True, retry_initial=0.1, retry_max=1, task_timeout=2
)


def _queue() -> str:
    return f"test-{uuid.uuid4().hex[:10]}"


def _scheduled(history: WorkflowHistory) -> list[str]:
    """The activities the server scheduled, by type."""
    return [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    ]


async def _begun(
    client: Client, agent: Agent, queue: str, started: anyio.Event
) -> DurableRun:
    """Start `agent` on local activities; return once its model is called."""
    run = await start_durable(
        agent, "hi", client=client, task_queue=queue, options=LOCAL
    )
    with anyio.fail_after(30):
        await started.wait()
    return run


def _markers(history: WorkflowHistory) -> int:
    return sum(
        e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED for e in history.events
    )


async def test_the_demo_on_local_activities_is_the_in_process_demo(
    temporal_client: Client, tmp_path: Path
) -> None:
    local = build_demo_agent(io.StringIO(), store=MemoryStore())
    expected = await local.run(TASK)
    agent = build_demo_agent(io.StringIO(), store=SQLiteStore(tmp_path / "l.db"))
    queue = _queue()
    async with create_worker(temporal_client, queue, agent):
        run = await start_durable(
            agent, TASK, client=temporal_client, task_queue=queue, options=LOCAL
        )
        result = await run.result()
        history = await _history(temporal_client, run.workflow_id)
    assert (result.outcome, result.text, result.turns, result.usage) == (
        expected.outcome,
        expected.text,
        expected.turns,
        expected.usage,
    )
    session = await Session.load(SQLiteStore(tmp_path / "l.db"), run.session_id)
    assert kinds(session) == kinds(local.session)
    assert content(session.history) == content(local.session.history)
    assert replay(agent.driver.machine, session, result.run_id).ok
    # No step was scheduled by the server: each is a marker of its task.
    assert set(_scheduled(history)) <= {"turnfsm.append", "turnfsm.load"}
    assert _markers(history) >= result.turns
    await _replays(history)


async def test_the_first_step_waits_for_the_session(
    temporal_client: Client, tmp_path: Path
) -> None:
    # The run's opening (and its lease) is written before its first step:
    # a session a live process holds is refused before the model is called.
    calls: list[int] = []

    async def answer(request: ModelRequest) -> Message:
        calls.append(1)
        return reply("hi")

    store = SQLiteStore(tmp_path / "b.db")
    agent = Agent(model=FakeModelClient(answer), store=store, name="busy")
    await store.acquire_lease(agent.session.id, "elsewhere:1:x", ttl=60)
    queue = _queue()
    async with create_worker(temporal_client, queue, agent):
        run = await start_durable(
            agent, "hi", client=temporal_client, task_queue=queue, options=LOCAL
        )
        with pytest.raises(SessionBusy):
            await run.result()
    assert calls == []


async def test_a_cancel_reaches_a_step_on_a_local_activity(
    temporal_client: Client, tmp_path: Path
) -> None:
    # A signal waits for the workflow task: at most 80 % of task_timeout.
    started = anyio.Event()

    async def never(request: ModelRequest) -> Message:
        started.set()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    agent = Agent(
        model=FakeModelClient(never), store=SQLiteStore(tmp_path / "c.db"), name="c"
    )
    queue = _queue()
    async with create_worker(temporal_client, queue, agent):
        run = await _begun(temporal_client, agent, queue, started)
        await run.cancel("enough")
        with anyio.fail_after(30):
            result = await run.result()
    assert result.outcome == "cancelled"
    session = await Session.load(SQLiteStore(tmp_path / "c.db"), run.session_id)
    assert [r.outcome for r in session.runs] == ["cancelled"]


async def test_a_worker_stopped_mid_step_hands_the_step_on_and_keeps_the_rest(
    temporal_client: Client, tmp_path: Path
) -> None:
    # In one workflow task: a model call, a tool that must not run twice,
    # and a second model call that hangs while its worker stops. The hung
    # step goes to the next worker as an activity; the two finished steps
    # stay done (their results are in the history): the tool ran once.
    started, stopped = anyio.Event(), anyio.Event()
    calls: list[int] = []
    charged: list[int] = []

    async def answer(request: ModelRequest) -> Message:
        calls.append(1)
        if not any(m.tool_results for m in request.messages):
            return reply("", tool_call("charge", "c1", n=1))
        if not stopped.is_set():
            started.set()
            await anyio.sleep_forever()
        return reply("charged")

    def charge(n: int) -> str:
        """Charge a card (not safe to run twice).

        Args:
            n: the charge.
        """
        charged.append(n)
        return f"charged {n}"

    path = tmp_path / "r.db"
    agent = Agent(
        model=FakeModelClient(answer), tools=[charge], store=SQLiteStore(path), name="r"
    )
    queue = _queue()
    async with create_worker(temporal_client, queue, agent):
        run = await _begun(temporal_client, agent, queue, started)
    stopped.set()
    async with create_worker(temporal_client, queue, agent, max_cached_workflows=0):
        with anyio.fail_after(60):
            result = await run.result()
        history = await _history(temporal_client, run.workflow_id)
    assert (result.outcome, result.text) == ("done", "charged")
    assert charged == [1]
    assert len(calls) == 3  # the hung call once more, by the next worker
    assert _scheduled(history).count("turnfsm.effect") == 1  # the one handed on
    assert "turnfsm.tool" not in _scheduled(history)
    session = await Session.load(SQLiteStore(path), run.session_id)
    assert [r.outcome for r in session.runs] == ["done"]
    assert [r.content for m in session.history for r in m.tool_results] == ["charged 1"]
    await _replays(history)


async def test_a_sub_agent_on_local_activities_answers_as_in_process(
    temporal_client: Client, tmp_path: Path
) -> None:
    store = SQLiteStore(tmp_path / "lead.db")
    lead, reader = agents(store, "north")
    local, _ = agents(MemoryStore(), "north")
    expected = await local.run("What is the north total?")
    queue = _queue()
    async with create_worker(temporal_client, queue, [lead, reader]):
        run = await start_durable(
            lead,
            "What is the north total?",
            client=temporal_client,
            task_queue=queue,
            options=LOCAL,
        )
        result = await run.result()
        history = await _history(temporal_client, run.workflow_id)
    assert (result.outcome, result.text) == ("done", expected.text)
    assert result.children_usage == expected.children_usage
    (kid,) = await child_sessions(store, run.session_id)
    assert [(r.outcome, r.text) for r in kid.runs] == [("done", expected.text)]
    session = await Session.load(store, run.session_id)
    assert content(session.history) == content(local.session.history)
    await _replays(history)


def test_local_activities_is_checked_where_it_is_given() -> None:
    bad: Any
    for bad in (1, "yes", None):
        with pytest.raises(ConfigError, match="local_activities"):
            DurableOptions(local_activities=bad)
    assert DurableOptions().local_activities is False
