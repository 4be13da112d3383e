"""Sub-agents in durable runs: a sub-agent tool's call runs as a child workflow.

The lead and its sub-agent are served by one worker (`create_worker` with
both agents); the lead's call of the sub-agent's tool starts the same
workflow type for the sub-agent, linked to the call, on the same queue.
The reference is the in-process run of the same agents.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import (
    Client,
    WorkflowExecutionDescription,
    WorkflowExecutionStatus,
    WorkflowHandle,
    WorkflowHistory,
)
from temporalio.service import RPCError

from tests.driver.test_declared_subagents import critic, reviewed, writer
from tests.driver.test_subagents import careful_child, delegating_model
from tests.temporal.test_durable import FAST, _history, _replays, content
from turnfsm import Agent, approval_machine, load_machine, machines_dir
from turnfsm.core import MachineSpec, ToolCallsReviewed
from turnfsm.driver import RunResult, child_ids, replay, subagent_effect
from turnfsm.errors import Cancelled, EffectFailed, SessionNotFound
from turnfsm.hooks import Hook, ToolCallEnd, ToolCallInfo
from turnfsm.persistence import (
    MemoryStore,
    ParentLink,
    Session,
    SessionStore,
    SQLiteStore,
    child_sessions,
    parent_of,
)
from turnfsm.providers import ModelRequest, ModelResponse
from turnfsm.temporal import (
    DurableRun,
    RunStatus,
    create_worker,
    start_durable,
)
from turnfsm.temporal._payloads import workflow_id_of
from turnfsm.testing import FakeModelClient, reply, tool_call
from turnfsm.values import Usage

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

CHILD_USAGE = Usage(input_tokens=40, output_tokens=3)
LEAD_USAGE = Usage(input_tokens=100, output_tokens=5)
TOTALS = {"north": 120, "south": 45, "east": 7}


def lookup(region: str) -> str:
    """Look up a region's total.

    Args:
        region: the region.
    """
    return f"total: {TOTALS[region]}"


def reader_model() -> FakeModelClient:
    """Looks up the region its task names, then answers with the total."""

    def answer(request: ModelRequest) -> ModelResponse:
        last = request.messages[-1]
        if last.tool_results:
            total = last.tool_results[0].content.split(": ")[1]
            message = reply(f"the total is {total}")
        else:
            region = last.text.split()[1]  # "Read REGION"
            message = reply("", tool_call("lookup", f"look_{region}", region=region))
        return ModelResponse(message=message, usage=CHILD_USAGE)

    return FakeModelClient(answer)


def lead_model(tool: str, *regions: str) -> FakeModelClient:
    """Delegates one task per region at once, then says what came back."""

    def answer(request: ModelRequest) -> ModelResponse:
        last = request.messages[-1]
        if last.tool_results:
            said = [p.content for m in request.messages for p in m.tool_results]
            message = reply("; ".join(said))
        else:
            calls = [
                tool_call(tool, f"call_{r}", task=f"Read {r} and say its total")
                for r in regions
            ]
            message = reply("", *calls)
        return ModelResponse(message=message, usage=LEAD_USAGE)

    return FakeModelClient(answer)


class Calls(Hook):
    """The tool calls a run's hooks heard: (start, id) and (end, id, result)."""

    def __init__(self) -> None:
        self.heard: list[tuple[str, ...]] = []

    def on_tool_start(self, info: ToolCallInfo) -> None:
        self.heard.append(("start", info.call.id))

    def on_tool_end(self, info: ToolCallEnd) -> None:
        text = info.result.tool_results[0].content if info.result else "-"
        self.heard.append(("end", info.call.call.id, text))


def agents(
    store: SessionStore, *regions: str, hooks: Sequence[Hook] = (), **limits: Any
) -> tuple[Agent, Agent]:
    """The lead (in `store`) and its reader sub-agent (a store of its own)."""
    reader = Agent(
        model=reader_model(), tools=[lookup], store=MemoryStore(), name="reader"
    )
    tool = reader.as_tool(name="reader", description="Say a region's total", **limits)
    lead = Agent(
        model=lead_model("reader", *regions),
        tools=[tool],
        store=store,
        name="lead",
        hooks=list(hooks),
    )
    return lead, reader


@contextlib.asynccontextmanager
async def _served(client: Client, *served: Agent, **options: Any) -> AsyncIterator[str]:
    queue = f"test-{uuid.uuid4().hex[:10]}"
    async with create_worker(client, queue, list(served), **options):
        yield queue


def _children_started(history: WorkflowHistory) -> list[str]:
    """The ids of the child workflows a workflow's history started."""
    kind = EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED
    return [
        e.start_child_workflow_execution_initiated_event_attributes.workflow_id
        for e in history.events
        if e.event_type == kind
    ]


def _activities(history: WorkflowHistory) -> list[str]:
    kind = EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    return [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.event_type == kind
    ]


async def _paused(run: DurableRun) -> RunStatus:
    """Wait until `run` pauses (its workflow may not have started yet)."""
    with anyio.fail_after(30):
        while True:
            with contextlib.suppress(RPCError, SessionNotFound):
                status = await run.status()
                if status.waiting is not None:
                    return status
            await anyio.sleep(0.05)


# -- a call of the sub-agent's tool is a child workflow ------------------------


async def test_a_sub_agent_runs_as_a_child_workflow_linked_to_the_call(
    temporal_client: Client, tmp_path: Path
) -> None:
    store = SQLiteStore(tmp_path / "lead.db")
    heard, local_heard = Calls(), Calls()
    lead, reader = agents(store, "north", hooks=[heard])
    local, _ = agents(MemoryStore(), "north", hooks=[local_heard])
    expected = await local.run("What is the north total?")
    async with _served(temporal_client, lead, reader) as queue:
        run = await start_durable(
            lead, "What is the north total?", client=temporal_client, task_queue=queue
        )
        result = await run.result()
        (kid,) = await child_sessions(store, run.session_id)
        described = await temporal_client.get_workflow_handle(
            workflow_id_of(kid.id)
        ).describe()
        history = await _history(temporal_client, run.workflow_id)
        kid_history = await _history(temporal_client, workflow_id_of(kid.id))

    assert result.ok, result.error
    assert result.text == expected.text == "the total is 120"
    # The lead's hooks hear the call as in-process (in the workflow, once).
    assert (
        heard.heard
        == local_heard.heard
        == [
            ("start", "call_north"),
            ("end", "call_north", "the total is 120"),
        ]
    )
    assert result.usage == LEAD_USAGE + LEAD_USAGE
    assert result.children_usage == expected.children_usage == CHILD_USAGE + CHILD_USAGE
    # The child's session is in the caller's store, linked to its call, as
    # in-process; the child agent's own store holds nothing.
    assert parent_of(kid) == ParentLink(
        session_id=run.session_id, run_id=result.run_id, call_id="call_north", depth=1
    )
    assert (kid.id, kid.runs[0].run_id) == child_ids(
        run.session_id, result.run_id, "call_north"
    )
    assert [(r.outcome, r.text) for r in kid.runs] == [("done", "the total is 120")]
    assert await reader.store.list_sessions() == ()
    lead_session = await Session.load(store, run.session_id)
    assert content(lead_session.history) == content(local.session.history)
    assert replay(None, lead_session, result.run_id).ok
    assert replay(None, kid, kid.runs[0].run_id).ok
    # Temporal's view: one child workflow, of the lead's workflow; the call
    # ran no tool activity there, the child's own tool call did in its own.
    assert described.status == WorkflowExecutionStatus.COMPLETED
    assert described.parent_id == run.workflow_id
    assert _children_started(history) == [workflow_id_of(kid.id)]
    assert "turnfsm.tool" not in _activities(history)
    assert "turnfsm.tool" in _activities(kid_history)
    await _replays(history)
    await _replays(kid_history)


async def test_a_sub_agent_the_worker_does_not_serve_runs_in_the_tool_activity(
    temporal_client: Client, tmp_path: Path
) -> None:
    store = SQLiteStore(tmp_path / "lead.db")
    lead, reader = agents(store, "north")
    async with _served(temporal_client, lead) as queue:  # not the reader
        run = await start_durable(
            lead, "What is the north total?", client=temporal_client, task_queue=queue
        )
        result = await run.result()
        history = await _history(temporal_client, run.workflow_id)
    assert result.text == "the total is 120"
    assert _children_started(history) == []
    assert "turnfsm.tool" in _activities(history)
    # Unlinked, in the sub-agent's own store, as before.
    assert await child_sessions(store, run.session_id) == []
    assert len(await reader.store.list_sessions()) == 1


async def test_a_sub_agent_pausing_for_approval_is_answered_on_its_own_run(
    temporal_client: Client, tmp_path: Path
) -> None:
    cleaner, deleted = careful_child()  # asks before deleting a.tmp and b.tmp
    store = SQLiteStore(tmp_path / "lead.db")
    tool = cleaner.as_tool(name="cleaner", description="Deletes, asking first")
    lead = Agent(
        model=lead_model("cleaner", "tmp"), tools=[tool], store=store, name="lead"
    )
    async with _served(temporal_client, lead, cleaner) as queue:
        run = await start_durable(
            lead,
            "clean up",
            client=temporal_client,
            task_queue=queue,
            run_id="run_lead",
        )
        kid_id, _ = child_ids(run.session_id, "run_lead", "call_tmp")
        kid = DurableRun(temporal_client, kid_id, agent=cleaner)
        status = await _paused(kid)
        assert status.phase == "await_approval"
        assert [c.id for c in status.waiting.calls] == ["c1", "c2"]  # type: ignore[union-attr]
        # The lead waits on its call; the paused child is in the lead's store.
        lead_status = await run.status()
        assert (lead_status.phase, lead_status.outcome) == ("run_tools", "running")
        assert lead_status.children == lead_status.children_waiting == (kid_id,)
        (paused,) = await child_sessions(store, run.session_id)
        assert paused.id == kid_id
        assert [r.outcome for r in paused.runs] == ["paused"]
        assert deleted == []
        await kid.approve()
        result = await run.result()
        assert (await kid.result()).text == "Report: deleted a.tmp; deleted b.tmp"

    assert result.ok, result.error
    assert result.text == "Report: deleted a.tmp; deleted b.tmp"
    assert sorted(deleted) == ["a.tmp", "b.tmp"]
    (done,) = await child_sessions(store, run.session_id)
    assert [r.outcome for r in done.runs] == ["done"]


async def test_a_sub_agent_paused_past_its_callers_limit_still_waits_for_its_answer(
    temporal_client: Client, tmp_path: Path
) -> None:
    # Bounding the child's workflow by the call's tool_timeout cancelled a
    # child paused for approval once the limit passed: a person's time to
    # answer counted as the child's work.
    cleaner, deleted = careful_child()
    store = SQLiteStore(tmp_path / "lead.db")
    tool = cleaner.as_tool(name="cleaner", description="Deletes, asking first")
    lead = Agent(
        model=lead_model("cleaner", "tmp"),
        tools=[tool],
        store=store,
        name="lead",
        tool_timeout=1,
    )
    async with _served(temporal_client, lead, cleaner) as queue:
        run = await start_durable(
            lead,
            "clean up",
            client=temporal_client,
            task_queue=queue,
            run_id="run_lead",
        )
        kid_id, _ = child_ids(run.session_id, "run_lead", "call_tmp")
        kid = DurableRun(temporal_client, kid_id, agent=cleaner)
        await _paused(kid)
        await anyio.sleep(2.5)  # past the limit, twice
        assert (await kid.status()).outcome == "paused"
        await kid.approve()
        with anyio.fail_after(30):
            result = await run.result()
    assert result.ok, result.error
    assert result.text == "Report: deleted a.tmp; deleted b.tmp"
    assert sorted(deleted) == ["a.tmp", "b.tmp"]


async def test_calls_past_the_limits_get_the_in_process_error_results(
    temporal_client: Client, tmp_path: Path
) -> None:
    store = SQLiteStore(tmp_path / "lead.db")
    lead, reader = agents(store, "north", "south", "east", max_children=2)
    local, _ = agents(MemoryStore(), "north", "south", "east", max_children=2)
    expected = await local.run("add them up")
    async with _served(temporal_client, lead, reader) as queue:
        run = await start_durable(
            lead, "add them up", client=temporal_client, task_queue=queue
        )
        result = await run.result()
        history = await _history(temporal_client, run.workflow_id)

    assert result.ok, result.error
    # Counted in call order: the third call is refused, nothing runs for it.
    said = result.text.split("; ")
    assert said[:2] == ["the total is 120", "the total is 45"]
    assert said[2].startswith("tool 'reader' failed: SubagentTooMany: ")
    assert "its max_children" in said[2]
    assert len(await child_sessions(store, run.session_id)) == 2
    assert len(_children_started(history)) == 2
    assert (
        result.children_usage == CHILD_USAGE + CHILD_USAGE + CHILD_USAGE + CHILD_USAGE
    )
    # The in-process run refuses one call too (which one is its scheduler's).
    assert sum("SubagentTooMany" in s for s in expected.text.split("; ")) == 1


async def test_a_sub_agent_past_max_depth_is_refused_in_its_child_workflow(
    temporal_client: Client, tmp_path: Path
) -> None:
    store = SQLiteStore(tmp_path / "lead.db")
    leaf = Agent(model=delegating_model("none"), name="leaf")
    mid = Agent(
        model=delegating_model("leaf"),
        tools=[leaf.as_tool(name="leaf", description="Go deeper", max_depth=1)],
        name="mid",
    )
    lead = Agent(
        model=delegating_model("mid"),
        tools=[mid.as_tool(name="mid", description="Go deeper")],
        store=store,
        name="lead",
    )
    async with _served(temporal_client, lead, mid, leaf) as queue:
        run = await start_durable(
            lead, "go deeper", client=temporal_client, task_queue=queue
        )
        result = await run.result()

    assert result.ok, result.error
    assert result.text.startswith("ok: error: tool 'leaf' failed: SubagentTooDeep: ")
    assert leaf.driver.model.requests == []  # type: ignore[attr-defined]
    (kid,) = await child_sessions(store, run.session_id)
    assert parent_of(kid).depth == 1  # type: ignore[union-attr]
    assert await child_sessions(store, kid.id) == []


# -- replays, restarts and cancellation ---------------------------------------


def blocking(
    store: SessionStore, started: anyio.Event, release: anyio.Event
) -> tuple[Agent, Agent]:
    """The lead and a reader whose model call waits for `release` (sets `started`)."""

    async def answer(request: ModelRequest) -> ModelResponse:
        started.set()
        await release.wait()
        return ModelResponse(message=reply("the total is 120"), usage=CHILD_USAGE)

    reader = Agent(model=FakeModelClient(answer), name="reader")
    tool = reader.as_tool(name="reader", description="Say a region's total")
    lead = Agent(
        model=lead_model("reader", "north"), tools=[tool], store=store, name="lead"
    )
    return lead, reader


async def _across_a_restart(
    client: Client,
    lead: Agent,
    kid: Agent,
    text: str,
    started: anyio.Event,
    release: anyio.Event,
) -> tuple[DurableRun, RunResult[Any], WorkflowHistory]:
    """Run `lead` on `text`, its worker stopped mid-child (once `started`).

    The first worker is gone mid-child (the child's model call is cut
    short). A new one, with no workflow cache, replays both workflows on
    every task: the lead finds its child in its history and waits on it.
    """
    queue = f"test-{uuid.uuid4().hex[:10]}"
    async with create_worker(client, queue, [lead, kid]):
        run = await start_durable(
            lead, text, client=client, task_queue=queue, options=FAST
        )
        with anyio.fail_after(30):
            await started.wait()
    release.set()
    async with create_worker(client, queue, [lead, kid], max_cached_workflows=0):
        with anyio.fail_after(60):
            result = await run.result()
        history = await _history(client, run.workflow_id)
    return run, result, history


async def test_a_worker_restarted_mid_child_does_not_start_a_second_child(
    temporal_client: Client, tmp_path: Path
) -> None:
    store = SQLiteStore(tmp_path / "lead.db")
    started, release = anyio.Event(), anyio.Event()
    lead, reader = blocking(store, started, release)
    run, result, history = await _across_a_restart(
        temporal_client, lead, reader, "the north total?", started, release
    )

    assert result.ok, result.error
    assert result.text == "the total is 120"
    assert len(reader.driver.model.requests) == 2  # type: ignore[attr-defined]
    (kid,) = await child_sessions(store, run.session_id)
    assert [r.outcome for r in kid.runs] == ["done"]
    assert _children_started(history) == [workflow_id_of(kid.id)]
    kid_history = await _history(temporal_client, workflow_id_of(kid.id))
    await _replays(history)
    await _replays(kid_history)


async def _until_ended(
    handle: WorkflowHandle[Any, Any],
) -> WorkflowExecutionDescription:
    """Wait until the workflow of `handle` ends; how it ended."""
    with anyio.fail_after(30):
        while True:
            described = await handle.describe()
            if described.status != WorkflowExecutionStatus.RUNNING:
                return described
            await anyio.sleep(0.05)


@pytest.mark.parametrize("how", ["workflow", "signal", "child"])
async def test_cancelling_the_lead_cancels_its_child_and_not_the_other_way(
    temporal_client: Client, tmp_path: Path, how: str
) -> None:
    store = SQLiteStore(tmp_path / "lead.db")
    started, release = anyio.Event(), anyio.Event()
    lead, reader = blocking(store, started, release)
    async with _served(temporal_client, lead, reader) as queue:
        run = await start_durable(
            lead,
            "the north total?",
            client=temporal_client,
            task_queue=queue,
            run_id="run_lead",
            options=FAST,
        )
        with anyio.fail_after(30):
            await started.wait()
        kid_id, _ = child_ids(run.session_id, "run_lead", "call_north")
        kid = temporal_client.get_workflow_handle(workflow_id_of(kid_id))
        if how == "workflow":
            await run.handle.cancel()
            with pytest.raises(Cancelled):
                await run.result()
        elif how == "signal":
            await run.cancel("enough")
            assert (await run.result()).outcome == "cancelled"
        else:
            # The child cancelled on its own: the lead has no answer, and
            # goes on, as with a sub-agent that failed.
            await kid.cancel()
            with anyio.fail_after(60):
                result = await run.result()
            assert result.ok, result.error
            assert result.text.startswith("tool 'reader' failed: SubagentFailed: ")
            assert "its workflow was cancelled" in result.text
        described = await _until_ended(kid)
    assert described.status == WorkflowExecutionStatus.CANCELED
    session = await Session.load(store, kid_id)
    assert [r.outcome for r in session.runs] == ["interrupted"]


async def test_a_child_that_ran_before_answers_from_its_log_not_again(
    temporal_client: Client, tmp_path: Path
) -> None:
    # As when the lead's workflow is reset past its call: a workflow of the
    # call's child ran already. Its id is not used twice; its log answers.
    store = SQLiteStore(tmp_path / "both.db")
    reader = Agent(model=reader_model(), tools=[lookup], store=store, name="reader")
    tool = reader.as_tool(name="reader", description="Say a region's total")
    lead = Agent(
        model=lead_model("reader", "north"), tools=[tool], store=store, name="lead"
    )
    session_id = f"ses_{uuid.uuid4().hex[:20]}"
    kid_id, kid_run = child_ids(session_id, "run_lead", "call_north")
    async with _served(temporal_client, lead, reader) as queue:
        earlier = await start_durable(
            reader,
            "Read north and say its total",
            client=temporal_client,
            task_queue=queue,
            session_id=kid_id,
            run_id=kid_run,
        )
        assert (await earlier.result()).text == "the total is 120"
        run = await start_durable(
            lead,
            "the north total?",
            client=temporal_client,
            task_queue=queue,
            session_id=session_id,
            run_id="run_lead",
        )
        result = await run.result()
        history = await _history(temporal_client, run.workflow_id)
    assert result.ok, result.error
    assert result.text == "the total is 120"
    assert result.children_usage == CHILD_USAGE + CHILD_USAGE
    assert len(reader.driver.model.requests) == 2  # type: ignore[attr-defined]
    failed = EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_FAILED
    assert [e.event_type for e in history.events].count(failed) == 1
    await _replays(history)


async def test_a_lead_resumed_after_an_approval_counts_its_earlier_child(
    temporal_client: Client, tmp_path: Path
) -> None:
    # The lead pauses twice: before its call of the reader, then before a
    # second batch; resumed the second time, it reads its earlier child's
    # log to count it, and goes on writing its own log where it was.
    store = SQLiteStore(tmp_path / "lead.db")
    reader = Agent(
        model=reader_model(), tools=[lookup], store=MemoryStore(), name="reader"
    )
    tool = reader.as_tool(name="reader", description="Say a region's total")

    def lead_turns(request: ModelRequest) -> ModelResponse:
        results = [p.content for m in request.messages for p in m.tool_results]
        if not results:
            message = reply("", tool_call("reader", "call_1", task="Read north"))
        elif len(results) == 1:
            message = reply("", tool_call("lookup", "call_2", region="south"))
        else:
            message = reply("; ".join(results))
        return ModelResponse(message=message, usage=LEAD_USAGE)

    lead = Agent(
        model=FakeModelClient(lead_turns),
        tools=[tool, lookup],
        machine=approval_machine(),
        store=store,
        name="lead",
    )
    async with _served(temporal_client, lead, reader) as queue:
        run = await start_durable(
            lead, "north, then south", client=temporal_client, task_queue=queue
        )
        for _ in range(2):
            await _paused(run)
            await run.approve()
        result = await run.result()
        history = await _history(temporal_client, run.workflow_id)
    assert result.ok, result.error
    assert result.text == "the total is 120; total: 45"
    assert result.children_usage == CHILD_USAGE + CHILD_USAGE
    session = await Session.load(store, run.session_id)
    assert replay(None, session, result.run_id).ok
    await _replays(history)


async def test_a_sub_agent_phase_the_machine_declares_runs_in_its_activity(
    temporal_client: Client, tmp_path: Path
) -> None:
    tasks: list[str] = []
    agent = Agent(
        model=writer("Italy.", "France."),
        machine=reviewed(tmp_path),
        subagents={"critic": critic(tasks)},
        store=SQLiteStore(tmp_path / "w.db"),
        name="writer",
    )
    async with _served(temporal_client, agent) as queue:
        run = await start_durable(
            agent, "Where is Paris?", client=temporal_client, task_queue=queue
        )
        result = await run.result()
    assert result.outcome == "done", result.error
    assert result.text == "France."
    assert tasks == [
        "Check Italy. (asked: Where is Paris?)",
        "Check France. (asked: No: France.)",
    ]


# -- a sub-agent phase is a child workflow too ---------------------------------


def review_agent(
    store: SessionStore, kid: Agent, tmp_path: Path, *drafts: str, **settings: Any
) -> Agent:
    """The writer whose review phase (the machine file's) runs the critic `kid`."""
    return Agent(
        model=writer(*drafts),
        machine=reviewed(tmp_path, **settings),
        subagents={"critic": kid},
        store=store,
        name="writer",
    )


async def test_a_declared_sub_agent_phase_runs_as_a_child_workflow_linked_to_it(
    temporal_client: Client, tmp_path: Path
) -> None:
    local = review_agent(MemoryStore(), critic([]), tmp_path, "Italy.", "France.")
    expected = await local.run("Where is Paris?")
    local_kids = await child_sessions(local.store, local.session.id)
    tasks: list[str] = []
    store = SQLiteStore(tmp_path / "w.db")
    kid_agent = critic(tasks)
    agent = review_agent(store, kid_agent, tmp_path, "Italy.", "France.")
    async with _served(temporal_client, agent, kid_agent) as queue:
        run = await start_durable(
            agent, "Where is Paris?", client=temporal_client, task_queue=queue
        )
        result = await run.result()
        kids = await child_sessions(store, run.session_id)
        described = [
            await temporal_client.get_workflow_handle(workflow_id_of(k.id)).describe()
            for k in kids
        ]
        history = await _history(temporal_client, run.workflow_id)
        kid_histories = [
            await _history(temporal_client, workflow_id_of(k.id)) for k in kids
        ]

    assert result.outcome == "done", result.error
    # Routed on the critic's answers as in-process: revise, then approved.
    assert result.text == expected.text == "France."
    assert tasks == [
        "Check Italy. (asked: Where is Paris?)",
        "Check France. (asked: No: France.)",
    ]
    assert result.children_usage == expected.children_usage
    session = await Session.load(store, run.session_id)
    assert content(session.history) == content(local.session.history)
    # Each review is a child session in the writer's store, linked to its
    # phase with the in-process call ids, and ids derived from them.
    assert [k.runs[0].text for k in kids] == ["No: France.", "approved."]
    links = [parent_of(k) for k in kids]
    assert [link.call_id for link in links if link] == [
        parent_of(k).call_id  # type: ignore[union-attr]
        for k in local_kids
    ]
    for kid, link in zip(kids, links, strict=True):
        assert link == ParentLink(
            session_id=run.session_id,
            run_id=result.run_id,
            call_id=link.call_id if link else "",
            depth=1,
        )
        assert (kid.id, kid.runs[0].run_id) == child_ids(
            run.session_id, result.run_id, link.call_id if link else ""
        )
    assert await kid_agent.store.list_sessions() == ()
    # Temporal's view: one child workflow per review, of the writer's.
    assert _children_started(history) == [workflow_id_of(k.id) for k in kids]
    assert all(d.parent_id == run.workflow_id for d in described)
    assert all(d.status == WorkflowExecutionStatus.COMPLETED for d in described)
    assert replay(None, session, result.run_id).ok
    await _replays(history)
    for kid_history in kid_histories:
        await _replays(kid_history)


async def test_a_sub_agent_effect_given_by_name_runs_as_a_child_workflow(
    temporal_client: Client, tmp_path: Path
) -> None:
    tasks: list[str] = []
    kid_agent = critic(tasks)
    store = SQLiteStore(tmp_path / "w.db")
    review = subagent_effect(
        kid_agent.driver,
        signal=lambda answer: "approved" if answer == "approved." else "revise",
        task=lambda messages: f"Check {messages[-1].text}",
        key="feedback",
    )
    agent = Agent(
        model=writer("Italy.", "France."),
        machine=load_machine(machines_dir() / "review.toml"),
        effects={"review": review},
        store=store,
        name="writer",
    )
    async with _served(temporal_client, agent, kid_agent) as queue:
        run = await start_durable(
            agent, "Where is Paris?", client=temporal_client, task_queue=queue
        )
        result = await run.result()
        history = await _history(temporal_client, run.workflow_id)
    assert result.outcome == "done", result.error
    assert result.text == "France."
    assert tasks == ["Check Italy.", "Check France."]
    kids = await child_sessions(store, run.session_id)
    assert [k.runs[0].text for k in kids] == ["No: France.", "approved."]
    assert _children_started(history) == [workflow_id_of(k.id) for k in kids]
    await _replays(history)


@pytest.mark.parametrize("on_failure", [None, '"approved"'])
async def test_max_children_from_the_file_bounds_the_durable_reviews(
    temporal_client: Client, tmp_path: Path, on_failure: str | None
) -> None:
    tasks: list[str] = []
    never = critic(tasks)  # never approves: no draft names France
    store = SQLiteStore(tmp_path / "w.db")
    settings: dict[str, Any] = {"max_children": 2}
    if on_failure is not None:
        settings["on_failure"] = on_failure
    agent = review_agent(store, never, tmp_path, "a", "b", "c", "d", **settings)
    async with _served(temporal_client, agent, never) as queue:
        run = await start_durable(
            agent, "Where is Paris?", client=temporal_client, task_queue=queue
        )
        result = await run.result()
        history = await _history(temporal_client, run.workflow_id)

    assert len(tasks) == 2
    assert len(_children_started(history)) == 2
    if on_failure is None:
        assert result.outcome == "failed"
        assert isinstance(result.error, EffectFailed)
        assert (result.error.effect, result.error.type) == ("critic", "SubagentTooMany")
    else:  # routed: the third review, refused, approves
        assert result.outcome == "done", result.error
        assert result.text == "c"
    await _replays(history)


async def test_a_worker_restarted_mid_review_does_not_start_a_second_child(
    temporal_client: Client, tmp_path: Path
) -> None:
    started, release = anyio.Event(), anyio.Event()

    async def approve(request: ModelRequest) -> ModelResponse:
        started.set()
        await release.wait()
        return ModelResponse(message=reply("approved."), usage=CHILD_USAGE)

    kid_agent = Agent(model=FakeModelClient(approve), name="critic")
    store = SQLiteStore(tmp_path / "w.db")
    agent = review_agent(store, kid_agent, tmp_path, "France.")
    run, result, history = await _across_a_restart(
        temporal_client, agent, kid_agent, "Where is Paris?", started, release
    )

    assert result.outcome == "done", result.error
    assert result.text == "France."
    assert len(kid_agent.driver.model.requests) == 2  # type: ignore[attr-defined]
    (kid,) = await child_sessions(store, run.session_id)
    assert [r.outcome for r in kid.runs] == ["done"]
    assert _children_started(history) == [workflow_id_of(kid.id)]
    await _replays(history)
    await _replays(await _history(temporal_client, workflow_id_of(kid.id)))


async def test_a_sub_agent_phase_paused_for_approval_is_answered_on_its_own_run(
    temporal_client: Client, tmp_path: Path
) -> None:
    cleaner, deleted = careful_child()  # asks before deleting a.tmp and b.tmp
    store = SQLiteStore(tmp_path / "w.db")
    agent = Agent(
        model=writer("Clean up done?"),
        machine=load_machine(machines_dir() / "review.toml"),
        effects={"review": subagent_effect(cleaner.driver, signal="approved")},
        store=store,
        name="writer",
    )
    async with _served(temporal_client, agent, cleaner) as queue:
        run = await start_durable(
            agent, "clean up", client=temporal_client, task_queue=queue
        )
        (kid_id,) = (await _waiting_children(run)).children_waiting
        status = await DurableRun(temporal_client, kid_id).status()
        assert status.phase == "await_approval"
        lead_status = await run.status()
        assert (lead_status.phase, lead_status.waiting) == ("await_review", None)
        assert lead_status.children == (kid_id,)
        assert deleted == []
        await DurableRun(temporal_client, kid_id).approve()
        result = await run.result()
        history = await _history(temporal_client, run.workflow_id)
        ended = await run.status()

    assert result.outcome == "done", result.error
    assert ended.children == ended.children_waiting == ()
    assert sorted(deleted) == ["a.tmp", "b.tmp"]
    (kid,) = await child_sessions(store, run.session_id)
    assert kid.id == kid_id
    assert [r.outcome for r in kid.runs] == ["done"]
    await _replays(history)


async def _waiting_children(run: DurableRun) -> RunStatus:
    """Wait until a sub-agent of `run` pauses."""
    with anyio.fail_after(30):
        while True:
            with contextlib.suppress(RPCError, SessionNotFound):
                status = await run.status()
                if status.children_waiting:
                    return status
            await anyio.sleep(0.05)


async def test_cancelling_the_writer_mid_review_cancels_the_critic(
    temporal_client: Client, tmp_path: Path
) -> None:
    started, release = anyio.Event(), anyio.Event()

    async def approve(request: ModelRequest) -> ModelResponse:
        started.set()
        await release.wait()
        return ModelResponse(message=reply("approved."), usage=CHILD_USAGE)

    kid_agent = Agent(model=FakeModelClient(approve), name="critic")
    store = SQLiteStore(tmp_path / "w.db")
    agent = review_agent(store, kid_agent, tmp_path, "France.")
    async with _served(temporal_client, agent, kid_agent) as queue:
        run = await start_durable(
            agent,
            "Where is Paris?",
            client=temporal_client,
            task_queue=queue,
            options=FAST,
        )
        with anyio.fail_after(30):
            await started.wait()
        (kid_id,) = (await run.status()).children
        await run.cancel("enough")
        result = await run.result()
        kid = temporal_client.get_workflow_handle(workflow_id_of(kid_id))
        described = await _until_ended(kid)
        release.set()

    assert result.outcome == "cancelled"
    assert described.status == WorkflowExecutionStatus.CANCELED
    session = await Session.load(store, kid_id)
    assert [r.outcome for r in session.runs] == ["interrupted"]


def approved_and_reviewed(tmp_path: Path) -> MachineSpec:
    """The approval machine whose final answer the critic reviews (one review)."""
    text = (machines_dir() / "approval.toml").read_text()
    text = text.replace('name = "approval"', 'name = "approved_reviewed"')
    text = text.replace(
        'terminal = ["done", "failed"]',
        'terminal = ["done", "failed"]\nsignals = ["approved", "revise"]',
    )
    text = text.replace(
        "[states]\n", '[states]\nawait_review = { subagent = "critic" }\n'
    )
    final = 'trigger = "model_replied"\nsource = "call_llm"\ndest = "done"'
    assert final in text
    text = text.replace(final, final.replace('"done"', '"await_review"'))
    text += (
        '\n[[transitions]]\ntrigger = "approved"\nsource = "await_review"\n'
        'dest = "start"\nconditions = ["has_injected_messages"]\n'
        '\n[[transitions]]\ntrigger = "approved"\nsource = "await_review"\n'
        'dest = "done"\n\n[[transitions]]\ntrigger = "revise"\n'
        'source = "await_review"\ndest = "start"\nmessage = "feedback"\n'
        '\n[subagents.critic]\nmachine = "turn.toml"\nsignal = "revise"\n'
        'key = "feedback"\nroutes = { approved = "APPROVED" }\n'
        'task = "Check {reply} (asked: {request})"\nmax_children = 1\n'
    )
    path = tmp_path / "approved_reviewed.toml"
    path.write_text(text)
    return load_machine(path)


async def test_a_writer_resumed_after_an_approval_counts_its_earlier_review(
    temporal_client: Client, tmp_path: Path
) -> None:
    # Reviewed once (revise), the writer asks to run a tool and pauses;
    # resumed, it counts that review: its second is past max_children.
    def writer_agent(store: SessionStore, kid: Agent) -> Agent:
        turns = iter(
            [
                reply("Italy."),
                reply("", tool_call("lookup", "call_1", region="north")),
                reply("France."),
            ]
        )
        return Agent(
            model=FakeModelClient(lambda request: next(turns)),
            tools=[lookup],
            machine=approved_and_reviewed(tmp_path),
            subagents={"critic": kid},
            store=store,
            name="writer",
        )

    local = writer_agent(MemoryStore(), critic([]))
    paused = await local.run("Where is Paris?")
    assert paused.outcome == "paused"
    expected = await local.resume(
        local.session.id, paused.run_id, ToolCallsReviewed.approve_all()
    )
    tasks: list[str] = []
    kid_agent = critic(tasks)
    store = SQLiteStore(tmp_path / "w.db")
    agent = writer_agent(store, kid_agent)
    async with _served(temporal_client, agent, kid_agent) as queue:
        run = await start_durable(
            agent, "Where is Paris?", client=temporal_client, task_queue=queue
        )
        await _paused(run)
        await run.approve()
        result = await run.result()
        history = await _history(temporal_client, run.workflow_id)

    for ended in (expected, result):
        assert ended.outcome == "failed"
        assert isinstance(ended.error, EffectFailed)
        assert (ended.error.effect, ended.error.type) == ("critic", "SubagentTooMany")
    assert tasks == ["Check Italy. (asked: Where is Paris?)"]
    assert len(_children_started(history)) == 1
    assert result.children_usage == expected.children_usage
    await _replays(history)


@pytest.mark.parametrize("kind", ["tool", "phase", "phase-on-failure"])
async def test_a_child_workflow_past_its_callers_limit_is_ended_as_in_process(
    temporal_client: Client, tmp_path: Path, kind: str
) -> None:
    # A child workflow was awaited with no bound: a stuck sub-agent, or one
    # paused for an answer, held its caller for ever.
    from turnfsm import review_machine
    from turnfsm.messages import Role

    async def stuck(request: ModelRequest) -> str:
        await anyio.sleep(60)
        return "approved"

    def desk_model(request: ModelRequest) -> Any:
        last = request.messages[-1]
        if last.role is Role.TOOL:
            return reply("got: " + last.tool_results[0].content)
        return reply("", tool_call("clerk", "call_1", task="look it up"))

    store = SQLiteStore(tmp_path / "s.db")
    child = Agent(model=FakeModelClient(stuck), name="clerk")
    if kind == "tool":
        caller = Agent(
            model=FakeModelClient(desk_model),
            name="desk",
            store=store,
            tools=[child.as_tool(name="clerk", description="Looks things up.")],
            tool_timeout=1,
        )
    else:
        on_failure = "rejected" if kind == "phase-on-failure" else None
        caller = Agent(
            model=FakeModelClient(lambda r: reply("Paris is in France.")),
            name="writer",
            machine=review_machine(),
            store=store,
            effect_timeout=1,
            effects={
                "review": subagent_effect(
                    child.driver, signal="approved", on_failure=on_failure
                )
            },
            max_turns=2,
        )
    expected = await caller.run("q")  # in-process, the same limit
    async with _served(temporal_client, caller, child) as queue:
        run = await start_durable(caller, "q", client=temporal_client, task_queue=queue)
        with anyio.fail_after(30):
            result = await run.result()
    assert (result.outcome, result.text) == (expected.outcome, expected.text)
    assert str(result.error) == str(expected.error)
    # The in-process run's child and the durable run's (one session): each
    # ended, none left open for a resume no one would make.
    kids = await child_sessions(store, run.session_id)
    assert len(kids) == 2
    assert {kid.runs[-1].outcome for kid in kids} <= {"failed", "cancelled"}
