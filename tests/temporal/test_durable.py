"""Durable runs on a real Temporal dev server (DESIGN §3, issue 10).

Each test serves its agent with `create_worker` on a task queue of its own,
in this process, against the session's dev server (`temporal_client`); the
stores are real SQLite files. The reference for "the same run" is always
the in-process run of the same agent and script.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import time
import tomllib
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import attrs
import pytest
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.workflowservice.v1 import DescribeWorkflowExecutionRequest
from temporalio.client import Client, WorkflowHistory, WorkflowUpdateFailedError
from temporalio.worker import Replayer
from temporalio.worker.workflow_sandbox import (
    SandboxedWorkflowRunner,
    SandboxRestrictions,
)

from tests.helpers import approval_toml
from turnfsm import (
    Agent,
    ContextManager,
    TruncatingCompactor,
    approval_machine,
    serde,
)
from turnfsm._resources import machines_dir
from turnfsm.cli._demo import TASK, build_demo_agent
from turnfsm.core import MachineSpec, Pause, Signal, ToolCallsReviewed
from turnfsm.driver import RetryPolicy, RunControl, current_tool_call, replay
from turnfsm.errors import (
    Cancelled,
    ConfigError,
    EffectFailed,
    InvalidMessage,
    ProviderError,
    RunCrashed,
    SessionBusy,
    SessionConflict,
    SessionNotFound,
    StoreUnusable,
    TemporalUnreachable,
    WaitTimedOut,
)
from turnfsm.hooks import Hook, ModelCallInfo, RunEndInfo, TransitionInfo
from turnfsm.messages import Message
from turnfsm.persistence import (
    CompactionRecord,
    EventRecorded,
    MemoryStore,
    Session,
    SessionStore,
    SQLiteStore,
    ToolResultRecorded,
)
from turnfsm.providers import ModelRequest
from turnfsm.temporal import (
    PASSTHROUGH,
    DurableOptions,
    DurableRun,
    TurnWorkflow,
    _activities,
    _workflow,
    create_worker,
    start_durable,
    workflow_runner,
)
from turnfsm.testing import FakeModelClient, ScriptedModel, reply, tool_call

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

FAST = DurableOptions(heartbeat_timeout=5, retry_initial=0.1, retry_max=1)


def _queue() -> str:
    return f"test-{uuid.uuid4().hex[:10]}"


def content(messages: Sequence[Message]) -> list[Any]:
    """What a conversation says, without its message ids."""
    return [
        (
            m.role.value,
            m.text,
            [(c.id, c.name, c.arguments) for c in m.tool_calls],
            [(r.call_id, r.content, r.is_error) for r in m.tool_results],
        )
        for m in messages
    ]


def kinds(session: Session) -> list[str]:
    """The log's entries by kind (events by their class and decision)."""
    out = []
    for entry in session.entries:
        if isinstance(entry, EventRecorded):
            out.append(f"{type(entry.event).__name__}->{entry.decision}")
        else:
            out.append(type(entry).__name__)
    return out


@contextlib.asynccontextmanager
async def _served(client: Client, agent: Agent) -> AsyncIterator[str]:
    queue = _queue()
    async with create_worker(client, queue, agent):
        yield queue


async def _history(client: Client, workflow_id: str) -> WorkflowHistory:
    return await client.get_workflow_handle(workflow_id).fetch_history()


async def _replays(history: WorkflowHistory) -> None:
    replayer = Replayer(workflows=[TurnWorkflow], workflow_runner=workflow_runner())
    await replayer.replay_workflow(history)


# -- the demo: the same run, durable ----------------------------------------


async def test_the_demo_as_a_workflow_is_the_in_process_demo(
    temporal_client: Client, tmp_path: Path
) -> None:
    store = SQLiteStore(tmp_path / "durable.db")
    durable = build_demo_agent(io.StringIO(), store=store)
    local = build_demo_agent(io.StringIO(), store=MemoryStore())
    expected = await local.run(TASK)
    async with _served(temporal_client, durable) as queue:
        run = await start_durable(
            durable, TASK, client=temporal_client, task_queue=queue
        )
        result = await run.result()
        status = await run.status()
    assert (result.outcome, result.text, result.turns) == (
        expected.outcome,
        expected.text,
        expected.turns,
    )
    assert result.usage == expected.usage
    assert result.run_id != expected.run_id
    # The workers' store holds the same log an in-process run writes.
    session = await Session.load(SQLiteStore(tmp_path / "durable.db"), run.session_id)
    assert kinds(session) == kinds(local.session)
    assert content(session.history) == content(local.session.history)
    assert replay(durable.driver.machine, session, result.run_id).ok
    assert sum(r.compactions[0].compacted for r in session.runs if r.compactions) == 1
    assert (status.phase, status.outcome, status.turn) == ("done", "done", 6)
    assert status.decision.startswith("call_llm")


class Heard(Hook):
    """Every observing hook call, as (method, detail)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def on_transition(self, info: TransitionInfo) -> None:
        self.calls.append(("on_transition", f"{info.step.source}->{info.step.dest}"))

    def on_run_end(self, info: RunEndInfo) -> None:
        self.calls.append(("on_run_end", info.outcome))

    def on_compaction_pass(self, record: CompactionRecord) -> None:
        if record.compacted:
            self.calls.append(("on_compaction_pass", record.reason.value))


async def test_hooks_hear_each_step_once_when_every_task_replays(
    temporal_client: Client, tmp_path: Path
) -> None:
    # No workflow cache: every workflow task rebuilds the workflow by
    # replaying its whole history, so any non-determinism would show, and an
    # observing hook must still hear each step once.
    local_hook, durable_hook = Heard(), Heard()
    local = build_demo_agent(io.StringIO(), store=MemoryStore())
    local.driver = attrs.evolve(local.driver, hooks=[*local.driver.hooks, local_hook])
    await local.run(TASK)
    agent = build_demo_agent(io.StringIO(), store=SQLiteStore(tmp_path / "h.db"))
    agent.driver = attrs.evolve(agent.driver, hooks=[*agent.driver.hooks, durable_hook])
    queue = _queue()
    async with create_worker(temporal_client, queue, agent, max_cached_workflows=0):
        run = await start_durable(agent, TASK, client=temporal_client, task_queue=queue)
        result = await run.result()
    assert result.ok
    assert durable_hook.calls == local_hook.calls
    assert [c for c in durable_hook.calls if c[0] == "on_compaction_pass"]


class Audit(Hook):
    """Appends each run's outcome to a file, as an audit trail would."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def on_run_end(self, info: RunEndInfo) -> None:
        with open(self.path, "a", encoding="utf-8") as trail:
            trail.write(f"{info.run_id} {info.outcome}\n")


async def test_a_hook_in_the_workflow_may_write_a_file(
    temporal_client: Client, tmp_path: Path
) -> None:
    # Observing hooks run in the workflow, once per step (never on replay):
    # Temporal's sandbox forbade them open(), and the run crashed.
    trail = tmp_path / "audit.txt"
    agent = build_demo_agent(io.StringIO(), store=SQLiteStore(tmp_path / "a.db"))
    agent.driver = attrs.evolve(agent.driver, hooks=[*agent.driver.hooks, Audit(trail)])
    async with _served(temporal_client, agent) as queue:
        run = await start_durable(agent, TASK, client=temporal_client, task_queue=queue)
        result = await run.result()
        history = await _history(temporal_client, run.workflow_id)
    assert result.ok
    assert trail.read_text(encoding="utf-8") == f"{result.run_id} done\n"
    await _replays(history)
    assert trail.read_text(encoding="utf-8") == f"{result.run_id} done\n"


async def test_a_worker_in_temporals_sandbox_runs_durable_runs_too(
    temporal_client: Client, tmp_path: Path
) -> None:
    sandbox = SandboxedWorkflowRunner(
        restrictions=SandboxRestrictions.default.with_passthrough_modules(*PASSTHROUGH)
    )
    local = build_demo_agent(io.StringIO(), store=MemoryStore())
    expected = await local.run(TASK)
    agent = build_demo_agent(io.StringIO(), store=SQLiteStore(tmp_path / "s.db"))
    queue = _queue()
    async with create_worker(temporal_client, queue, agent, workflow_runner=sandbox):
        run = await start_durable(agent, TASK, client=temporal_client, task_queue=queue)
        result = await run.result()
        history = await _history(temporal_client, run.workflow_id)
    assert (result.outcome, result.text) == (expected.outcome, expected.text)
    replayer = Replayer(workflows=[TurnWorkflow], workflow_runner=sandbox)
    await replayer.replay_workflow(history)


async def test_two_workers_on_one_postgres_store_serve_many_sessions(
    temporal_client: Client, postgres_url: Callable[[], str]
) -> None:
    from turnfsm.persistence.postgres import PostgresStore

    url = postgres_url()
    stores = [PostgresStore(url), PostgresStore(url)]  # as two processes would
    agents = [build_demo_agent(io.StringIO(), store=s) for s in stores]
    local = build_demo_agent(io.StringIO(), store=MemoryStore())
    expected = await local.run(TASK)
    queue = _queue()
    try:
        async with (
            create_worker(temporal_client, queue, agents[0]),
            create_worker(temporal_client, f"{queue}-2", agents[1]),
        ):
            runs = [
                await start_durable(
                    agents[0],
                    TASK,
                    client=temporal_client,
                    task_queue=queue if i % 2 else f"{queue}-2",
                    session_id=f"ses_{queue}_{i}",
                )
                for i in range(6)
            ]
            results = [await r.result() for r in runs]
        assert all(r.ok for r in results)
        reader = PostgresStore(url)
        seen: set[str] = set()
        for i, run in enumerate(runs):
            session = await Session.load(reader, run.session_id)
            assert kinds(session) == kinds(local.session)
            assert content(session.history) == content(local.session.history)
            assert replay(agents[0].driver.machine, session, results[i].run_id).ok
            ids = {m.id for m in session.history}
            assert not ids & seen  # no message of one session in another's
            seen |= ids
        assert {r.text for r in results} == {expected.text}
        await reader.aclose()
    finally:
        for store in stores:
            await store.aclose()


async def test_the_workflow_history_and_the_session_log_agree(
    temporal_client: Client, tmp_path: Path
) -> None:
    agent = build_demo_agent(io.StringIO(), store=SQLiteStore(tmp_path / "g.db"))
    async with _served(temporal_client, agent) as queue:
        run = await start_durable(agent, TASK, client=temporal_client, task_queue=queue)
        result = await run.result()
        history = await _history(temporal_client, run.workflow_id)
    convert = temporal_client.data_converter.payload_converter
    outcomes: list[Any] = []  # every effect's and tool's result, in order
    for event in history.events:
        if event.HasField("activity_task_completed_event_attributes"):
            payloads = event.activity_task_completed_event_attributes.result.payloads
            [value] = convert.from_payloads(list(payloads))
            if value is not None and "entries" not in value:
                outcomes.append(value)
    session = await Session.load(SQLiteStore(tmp_path / "g.db"), run.session_id)
    logged = [
        serde.to_json(e.event)
        for e in session.entries
        if isinstance(e, EventRecorded) and type(e.event).__name__ != "Measured"
    ]
    # Each model reply / compaction in the history is the next event the
    # log took; each tool result is inside the ToolsFinished that follows.
    effects = [o for o in outcomes if o.get("type") is not None]
    assert effects == [e for e in logged[1:] if e["type"] != "ToolsFinished"]
    tools = [o for o in outcomes if o.get("type") is None]
    finished = [e["results"] for e in logged if e["type"] == "ToolsFinished"]
    assert tools == [m for batch in finished for m in batch]
    assert result.ok


async def test_a_tool_activity_carries_its_call_not_the_conversation(
    temporal_client: Client, tmp_path: Path
) -> None:
    # The history keeps every activity's input: a batch of k calls carrying
    # the conversation each would grow it k times a turn.
    agent = build_demo_agent(io.StringIO(), store=SQLiteStore(tmp_path / "s.db"))
    async with _served(temporal_client, agent) as queue:
        run = await start_durable(agent, TASK, client=temporal_client, task_queue=queue)
        result = await run.result()
        history = await _history(temporal_client, run.workflow_id)
    assert result.ok
    convert = temporal_client.data_converter.payload_converter
    inputs: dict[str, list[Any]] = {"turnfsm.tool": [], "turnfsm.effect": []}
    for event in history.events:
        if event.HasField("activity_task_scheduled_event_attributes"):
            scheduled = event.activity_task_scheduled_event_attributes
            if scheduled.activity_type.name in inputs:
                [value] = convert.from_payloads(list(scheduled.input.payloads))
                inputs[scheduled.activity_type.name].append(value)
    assert inputs["turnfsm.tool"]
    assert inputs["turnfsm.effect"]
    for request in inputs["turnfsm.tool"]:
        assert "snapshot" not in request
        assert isinstance(request["turn"], int)
        assert request["turn"] >= 1
        assert request["call"]["name"]
    assert all("snapshot" in r for r in inputs["turnfsm.effect"])


async def test_the_demo_history_replays_and_on_a_changed_agent_does_not(
    temporal_client: Client, tmp_path: Path
) -> None:
    agent = build_demo_agent(io.StringIO(), store=SQLiteStore(tmp_path / "d.db"))
    async with _served(temporal_client, agent) as queue:
        run = await start_durable(agent, TASK, client=temporal_client, task_queue=queue)
        assert (await run.result()).ok
    history = await _history(temporal_client, run.workflow_id)
    await _replays(history)
    # The replayer is a real check: the same history on an agent that
    # decides otherwise (no compaction) is a non-determinism error.
    other = build_demo_agent(io.StringIO(), store=MemoryStore())
    other.driver = type(other.driver)(
        model=other.driver.model,
        tools=other.driver.tools,
        context=ContextManager(
            TruncatingCompactor(), context_window=100_000, threshold=80
        ),
        system_prompt=other.driver.system_prompt,
    )
    saved = dict(_activities._AGENTS)
    for key in [k for k in _activities._AGENTS if k[1] == "turnfsm"]:
        _activities._AGENTS[key] = other
    try:
        with pytest.raises(Exception, match=r"[Nn]ondetermin"):
            await _replays(history)
    finally:
        _activities._AGENTS.clear()
        _activities._AGENTS.update(saved)


# -- approval: updates answer the pause --------------------------------------

RAN: list[str] = []


def delete(path: str) -> str:
    """Delete a file.

    Args:
        path: the file.
    """
    call = current_tool_call()
    assert call is not None
    RAN.append(f"{call.id}:{path}")
    return f"deleted {path}"


def _asking(name: str, store: SessionStore) -> Agent:
    model = ScriptedModel.of(
        reply(
            "",
            tool_call("delete", "c1", path="/tmp/a"),
            tool_call("delete", "c2", path="/etc/passwd"),
        ),
        "cleaned up",
    )
    return Agent(
        model=model,
        tools=[delete],
        machine=approval_machine(),
        store=store,
        name=name,
    )


async def _paused(run: Any) -> Any:
    with anyio.fail_after(30):
        while True:
            status = await run.status()
            if status.waiting is not None:
                return status
            await anyio.sleep(0.05)


@dataclass
class _Paused:
    """A durable run paused for approval, with its agent and task queue."""

    run: DurableRun
    status: Any
    agent: Agent
    queue: str


@contextlib.asynccontextmanager
async def _paused_run(client: Client, path: Path, name: str) -> AsyncIterator[_Paused]:
    """Serve an asking agent on a SQLite file and start it until it pauses."""
    agent = _asking(name, SQLiteStore(path))
    async with _served(client, agent) as queue:
        run = await start_durable(agent, "clean up", client=client, task_queue=queue)
        yield _Paused(run, await _paused(run), agent, queue)


async def _paused_then_changed(
    client: Client, name: str, store: SessionStore
) -> tuple[DurableRun, str, Agent]:
    """A run paused on its workers (stopped since), its queue, and its agent changed.

    The changed agent has the run's name and store, on another machine.
    """
    agent = _asking(name, store)
    queue = _queue()
    async with create_worker(client, queue, agent):
        run = await start_durable(agent, "clean up", client=client, task_queue=queue)
        await _paused(run)
    return run, queue, Agent(model=ScriptedModel.of("x"), store=store, name=name)


async def test_an_approval_run_pauses_and_approve_runs_the_tools(
    temporal_client: Client, tmp_path: Path
) -> None:
    RAN.clear()
    async with _paused_run(temporal_client, tmp_path / "a.db", "approver") as paused:
        run, status = paused.run, paused.status
        assert status.phase == "await_approval"
        assert [c.id for c in status.waiting.calls] == ["c1", "c2"]
        assert RAN == []
        # The paused run is in the store already, as in-process.
        session = await Session.load(SQLiteStore(tmp_path / "a.db"), run.session_id)
        assert [r.outcome for r in session.runs] == ["paused"]
        with pytest.raises(ConfigError, match="c9"):
            await run.reject({"c9": "no such call"})
        await run.approve()
        with pytest.raises(ConfigError) as twice:  # answered already
            await run.approve()
        assert str(twice.value).startswith(
            "invalid approve=None: expected a run paused for an answer (it is in phase "
        )
        result = await run.result()
        with pytest.raises(ConfigError, match="ended"):
            await run.approve()  # a closed workflow's update is refused
    assert result.ok
    assert result.text == "cleaned up"
    assert sorted(RAN) == ["c1:/tmp/a", "c2:/etc/passwd"]
    await _replays(await _history(temporal_client, run.workflow_id))
    session = await Session.load(SQLiteStore(tmp_path / "a.db"), run.session_id)
    assert [r.outcome for r in session.runs] == ["done"]
    assert replay(approval_machine(), session, result.run_id).ok


async def test_approving_a_call_whose_tool_the_workers_lack_is_refused_paused(
    temporal_client: Client, tmp_path: Path
) -> None:
    # The workers' agent has no `delete`: approving the calls to it would
    # fail the workflow with the run left paused in its log. The approval
    # is refused where it is sent, saying how to go on; the run stays paused
    # for real, and a rejection answers it.
    store = SQLiteStore(tmp_path / "m.db")
    agent = Agent(
        model=ScriptedModel.of(
            reply("", tool_call("delete", "c1"), tool_call("delete", "c2")), "ok"
        ),
        machine=approval_machine(),
        store=store,
        name="lacking",
    )
    async with _served(temporal_client, agent) as queue:
        run = await start_durable(
            agent, "clean up", client=temporal_client, task_queue=queue
        )
        await _paused(run)
        with pytest.raises(ConfigError) as caught:
            await run.approve()
        message = str(caught.value)
        assert "lacks the tools the run calls (delete)" in message
        assert "DurableRun.reject" in message
        assert "the run stays paused" in message
        with pytest.raises(ConfigError, match="lacks the tools"):
            await run.reject({"c1": "no"})  # c2 would still run
        status = await run.status()
        assert (status.outcome, status.phase) == ("paused", "await_approval")
        await run.reject({"c1": "no tool", "c2": "no tool"})
        result = await run.result()
    assert result.ok


class _Gated:
    """A model whose first call waits for `open`: a test acts while it is in flight."""

    def __init__(self, inner: ScriptedModel) -> None:
        self.inner = inner
        self.called = anyio.Event()
        self.open = anyio.Event()

    async def complete(self, request: ModelRequest) -> Any:
        self.called.set()
        await self.open.wait()
        return await self.inner.complete(request)


def lookup_city(city: str) -> str:
    """Look a city up."""
    return f"{city}: sunny"


async def _not_served_attempts(client: Client, run: DurableRun) -> int:
    """The attempts of the run's pending tool activity refused as not served."""
    description = await client.workflow_service.describe_workflow_execution(
        DescribeWorkflowExecutionRequest(
            namespace=client.namespace,
            execution=WorkflowExecution(workflow_id=run.workflow_id),
        )
    )
    for pending in description.pending_activities:
        if pending.activity_type.name == "turnfsm.tool" and (
            "does not" in pending.last_failure.message
        ):
            return pending.attempt
    return 0


def _lacking_build_of(agent: Agent, store: SessionStore, queue: str) -> None:
    """Serve `queue` the agent of the same name without its tools instead."""
    lacking = Agent(model=agent.driver.model, store=store, name=agent.driver.name)
    _activities.register([lacking], task_queue=queue)


@pytest.mark.parametrize("comes_back", [True, False], ids=["deployed", "never"])
async def test_a_worker_lacking_a_tool_the_run_has_leaves_the_call_to_another(
    temporal_client: Client, tmp_path: Path, comes_back: bool
) -> None:
    # Workers of one queue serving two builds of an agent (a rolling deploy):
    # the run's workflow has `lookup_city`, the worker its call lands on does not.
    # That worker does not answer "not available" (the model would be told
    # a tool it has does not exist): Temporal tries the call again, and a
    # worker with the tool runs it. With none for a while, it is answered.
    gate = _Gated(
        ScriptedModel.of(reply("", tool_call("lookup_city", "c1", city="Oslo")), "ok")
    )
    store = SQLiteStore(tmp_path / "t.db")
    agent = Agent(model=gate, tools=[lookup_city], store=store, name="deploy")
    options = DurableOptions(heartbeat_timeout=5, retry_initial=0.1, retry_max=0.25)
    async with _served(temporal_client, agent) as queue:
        run = await start_durable(
            agent, "weather?", client=temporal_client, task_queue=queue, options=options
        )
        with anyio.fail_after(30):
            await gate.called.wait()
        _lacking_build_of(agent, store, queue)  # this worker now serves another
        gate.open.set()
        if comes_back:
            with anyio.fail_after(30):
                while await _not_served_attempts(temporal_client, run) < 2:  # noqa: ASYNC110
                    await anyio.sleep(0.1)
            _activities.register([agent], task_queue=queue)
        with anyio.fail_after(60):
            result = await run.result()
    assert result.ok
    session = await Session.load(store, run.session_id)
    [answer] = [r for m in session.history for r in m.tool_results]
    if comes_back:
        assert (answer.content, answer.is_error) == ("Oslo: sunny", False)
    else:
        assert answer.is_error
        assert "tool 'lookup_city' is not available" in answer.content


async def test_status_on_workers_serving_a_changed_agent_says_so(
    temporal_client: Client, tmp_path: Path
) -> None:
    # Paused on the approval machine; the workers are then served the agent
    # on another machine: its workflow cannot go on there. The status says
    # so, typed, with the way on (it answered the replayed run on the other
    # machine as running, or the SDK's query failure).
    store = SQLiteStore(tmp_path / "c.db")
    run, queue, changed = await _paused_then_changed(temporal_client, "changed", store)
    async with create_worker(temporal_client, queue, changed):
        with pytest.raises(ConfigError) as caught:
            with anyio.fail_after(30):
                await run.status()
    await run.handle.terminate("test over")
    message = str(caught.value)
    assert caught.value.field == "agent"
    assert "takes other steps than the run's history" in message
    assert "the run goes on where it was" in message
    assert f"turnfsm resume {run.session_id} --force" in message
    # Started by a caller whose agent is on another machine than the
    # workers': refused before the run begins, typed.
    async with create_worker(temporal_client, queue, changed):
        run = await start_durable(
            _asking("changed", store), "hi", client=temporal_client, task_queue=queue
        )
        with pytest.raises(ConfigError, match="the same build of the agent"):
            await run.result()


async def test_workers_on_another_store_fail_the_run_instead_of_writing_a_gap(
    temporal_client: Client, tmp_path: Path
) -> None:
    # Paused on workers whose store holds its log; the workers that take the
    # approval keep sessions in another file (another host's SQLite file, a
    # MemoryStore after a restart). Their write of what the run made since
    # would land at the start of an empty log, a log with no opening; the
    # run fails instead, typed, naming the store, and writes nothing there.
    first, other = tmp_path / "first.db", tmp_path / "other.db"
    agent = _asking("moved", SQLiteStore(first))
    queue = _queue()
    async with create_worker(temporal_client, queue, agent):
        run = await start_durable(
            agent, "clean up", client=temporal_client, task_queue=queue
        )
        await _paused(run)
    async with create_worker(
        temporal_client, queue, _asking("moved", SQLiteStore(other))
    ):
        await run.approve()
        with pytest.raises(StoreUnusable) as caught:
            with anyio.fail_after(30):
                await run.result()
    assert caught.value.path == str(other)
    assert "must share one store" in str(caught.value)
    assert [s.id for s in await SQLiteStore(other).list_sessions()] == []
    kept = await Session.load(SQLiteStore(first), run.session_id)
    assert [r.outcome for r in kept.runs] == ["paused"]


async def test_status_with_no_worker_on_its_queue_names_the_queue(
    temporal_client: Client,
) -> None:
    # It raised Temporal's RPCError after 30 seconds, in words that changed
    # from one try to the next ("Timeout expired", "h2 protocol error").
    queue = _queue()  # no worker ever serves it
    agent = Agent(model=ScriptedModel.of("x"), name="unserved")
    run = await start_durable(agent, "hi", client=temporal_client, task_queue=queue)
    try:
        with pytest.raises(ConfigError) as caught:
            with anyio.fail_after(90):
                await run.status()
    finally:
        await run.handle.terminate("test over")
    assert (caught.value.field, caught.value.value) == ("task_queue", queue)
    assert f"turnfsm worker --task-queue {queue}" in str(caught.value)


async def test_status_just_after_its_worker_stopped_names_the_queue(
    temporal_client: Client, tmp_path: Path
) -> None:
    # The queue's pollers still listed the worker stopped moments before, so
    # Temporal's own "no poller seen" was raised as it came, an RPCError.
    async with _paused_run(temporal_client, tmp_path / "s.db", "stopped") as paused:
        run, queue = paused.run, paused.queue
    try:
        with pytest.raises(ConfigError) as caught:
            with anyio.fail_after(90):
                await run.status()
    finally:
        await run.handle.terminate("test over")
    assert (caught.value.field, caught.value.value) == ("task_queue", queue)


@pytest.mark.parametrize("answer", ["approve", 42, None])
async def test_an_answer_that_is_no_event_is_refused_naming_it(
    temporal_client: Client, tmp_path: Path, answer: object
) -> None:
    # Sent, it failed to decode in the workflow: "expected Failed decoding
    # arguments", or a corrupt record "written by another turnfsm version".
    async with _paused_run(temporal_client, tmp_path / "s.db", "answered") as paused:
        run = paused.run
        with pytest.raises(ConfigError) as caught:
            await run.answer(answer)  # type: ignore[arg-type]
        assert (caught.value.field, caught.value.value) == ("event", answer)
        assert "ToolCallsReviewed.approve_all()" in str(caught.value)
        assert (await run.status()).waiting is not None  # it still waits
        await run.handle.terminate("test over")


async def _task_failed(client: Client, workflow_id: str) -> None:
    """Wait until the workflow's history records a workflow task that failed."""
    with anyio.fail_after(30):
        while True:
            history = await _history(client, workflow_id)
            if any(
                e.HasField("workflow_task_failed_event_attributes")
                for e in history.events
            ):
                return
            await anyio.sleep(0.1)


async def test_status_while_changed_workers_fail_its_workflow_task_says_so(
    temporal_client: Client, tmp_path: Path
) -> None:
    # Paused on its workers; a cancel comes while none serves the queue, so
    # its workflow has a task waiting. Workers serving the agent on another
    # machine then take that task, replay the history and fail it, again and
    # again: Temporal refuses queries of such a workflow itself (it answered
    # with its RPCError, "Workflow Task in failed state"). The status says
    # why, typed, with the way on.
    store = SQLiteStore(tmp_path / "f.db")
    run, queue, changed = await _paused_then_changed(temporal_client, "failing", store)
    await run.cancel("stop")  # a signal: its task waits for a worker
    async with create_worker(temporal_client, queue, changed):
        await _task_failed(temporal_client, run.workflow_id)
        with pytest.raises(ConfigError) as caught:
            with anyio.fail_after(30):
                await run.status()
    await run.handle.terminate("test over")
    message = str(caught.value)
    assert caught.value.field == "agent"
    assert "takes other steps than the run's history" in message
    assert "Nondeterminism" in message
    assert f"turnfsm resume {run.session_id} --force" in message


@pytest.mark.parametrize("answer", ["approve", "inject"])
async def test_answering_while_changed_workers_fail_its_workflow_task_says_so(
    temporal_client: Client, tmp_path: Path, answer: str
) -> None:
    # Temporal refuses an update of a workflow whose task fails: it raised
    # the SDK's RPCError ("Workflow Task in failed state"), untyped. It
    # says why, typed, as status() does, and the run stays paused.
    store = SQLiteStore(tmp_path / "u.db")
    run, queue, changed = await _paused_then_changed(temporal_client, "stuck", store)
    send: dict[str, Callable[[], Any]] = {
        "approve": run.approve,
        "reject": lambda: run.reject({"c1": "no"}),
        "answer": lambda: run.answer(ToolCallsReviewed.approve_all()),
        "inject": lambda: run.inject("and be careful"),
    }
    async with create_worker(temporal_client, queue, changed):
        with pytest.raises(ConfigError) as caught:
            with anyio.fail_after(30):
                await send[answer]()
    await run.handle.terminate("test over")
    assert caught.value.field == "agent"
    assert "takes other steps than the run's history" in str(caught.value)
    assert f"turnfsm resume {run.session_id} --force" in str(caught.value)
    kept = await Session.load(store, run.session_id)
    assert [r.outcome for r in kept.runs] == ["paused"]


async def test_result_while_changed_workers_fail_its_workflow_task_warns_and_times_out(
    temporal_client: Client, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # result() waited without a word for as long as the workers failed the
    # run's workflow task (status() said why). It warns, once, with what
    # status() says; with a timeout, it ends with that as the cause.
    store = SQLiteStore(tmp_path / "w.db")
    run, queue, changed = await _paused_then_changed(temporal_client, "waiting", store)
    await run.cancel("stop")  # a signal: its task waits for a worker
    async with create_worker(temporal_client, queue, changed):
        await _task_failed(temporal_client, run.workflow_id)
        with (
            caplog.at_level("WARNING", logger="turnfsm.temporal"),
            pytest.raises(WaitTimedOut) as caught,
        ):
            await run.result(timeout=5)
    await run.handle.terminate("test over")
    error = caught.value
    assert isinstance(error, TimeoutError)
    assert (error.session_id, error.seconds) == (run.session_id, 5)
    assert isinstance(error.__cause__, ConfigError)
    assert error.__cause__.field == "agent"
    assert str(error).startswith(
        f"the durable run of session {run.session_id!r} did not end within 5s: "
        "it does not go on: invalid agent='waiting': expected workers serving "
        "the agent this run began with"
    )
    assert f"turnfsm resume {run.session_id} --force" in str(error)
    (warned,) = [r for r in caplog.records if r.name == "turnfsm.temporal"]
    assert warned.levelname == "WARNING"
    assert warned.getMessage().startswith(
        f"the durable run of session {run.session_id!r} waits, and does not go on: "
        "its workflow task fails on its workers: invalid agent='waiting'"
    )


async def test_result_on_a_queue_no_worker_serves_warns_naming_it(
    temporal_client: Client, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # result() without a timeout waited without a word on a misspelt queue.
    agent = Agent(model=ScriptedModel.of("hi"), store=MemoryStore(), name="nobody")
    queue = f"unserved-{uuid.uuid4().hex[:8]}"
    run = await start_durable(agent, "hi", client=temporal_client, task_queue=queue)
    with (
        caplog.at_level("WARNING", logger="turnfsm.temporal"),
        pytest.raises(WaitTimedOut),
    ):
        await run.result(timeout=4)
    await run.handle.terminate("test over")
    (warned,) = [r for r in caplog.records if r.name == "turnfsm.temporal"]
    assert warned.getMessage() == (
        f"the durable run of session {run.session_id!r} waits, and does not go "
        f"on: no worker serves it: invalid task_queue={queue!r}: expected a task "
        "queue a worker serves: none has asked it for work lately, so nothing "
        f"answers the run's status; start one (turnfsm worker --task-queue {queue}, "
        "or create_worker) and the run goes on there"
    )


async def test_result_with_a_timeout_says_where_the_run_waits(
    temporal_client: Client, tmp_path: Path
) -> None:
    async with _paused_run(temporal_client, tmp_path / "t.db", "timed") as paused:
        run, agent, queue = paused.run, paused.agent, paused.queue
        with pytest.raises(WaitTimedOut) as caught:
            await run.result(timeout=0.5)
        assert str(caught.value) == (
            f"the durable run of session {run.session_id!r} did not end within "
            "0.5s: it is paused in phase await_approval, waiting for an answer on "
            "calls c1, c2 (approve(), reject() or answer() it)"
        )
        with pytest.raises(ConfigError, match="timeout"):
            await run.result(timeout=0)
        await run.reject({"c1": "no", "c2": "no"})
        result = await run.result(timeout=30)
    assert result.ok
    unserved = await start_durable(
        agent, "hi", client=temporal_client, task_queue=(queue := _queue())
    )
    try:
        with pytest.raises(WaitTimedOut) as caught:
            await unserved.result(timeout=0.5)
    finally:
        await unserved.handle.terminate("test over")
    assert f"it does not go on: invalid task_queue={queue!r}" in str(caught.value)
    assert f"turnfsm worker --task-queue {queue}" in str(caught.value)


def test_a_run_is_told_paused_only_with_what_it_waits_for() -> None:
    # Between the run's pause and its log's write, the status said paused
    # waiting for nothing, and an approval sent then was refused.
    status = _workflow._Status()
    status.on_run_end(
        RunEndInfo(
            run_id="r", phase="await_approval", text="", error=None, outcome="paused"
        )
    )
    assert (status.outcome, status.waiting) == ("running", None)
    pause = Pause(phase="await_approval", calls=(), accepts=("tool_calls_reviewed",))
    status.paused(pause)
    assert (status.outcome, status.waiting) == ("paused", pause)
    status.paused(None)  # answered: it goes on
    assert (status.outcome, status.waiting) == ("running", None)
    status.on_run_end(RunEndInfo(run_id="r", phase="done", text="ok", error=None))
    assert status.value().outcome == "done"


def test_an_answer_refused_in_the_workflow_says_it_failed_and_the_way_on() -> None:
    # Taken on a worker whose agent lacks a tool the answer runs (one worker
    # checked it, another carries it out): the workflow ends, the log keeps
    # the run paused, and the error says so, with the commands that go on.
    refused = ConfigError(
        "tools", [], "the tools the run calls (delete): ...; the run stays paused"
    )
    message = str(_workflow.left_paused(refused, "ses_1"))
    assert "the run stays paused" not in message
    assert "This answer failed the run's workflow" in message
    assert "turnfsm resume ses_1 --force" in message
    assert "turnfsm abandon ses_1 --force" in message


async def test_answer_takes_any_event_the_pause_accepts_and_queries_say_where(
    temporal_client: Client, tmp_path: Path
) -> None:
    RAN.clear()
    async with _paused_run(temporal_client, tmp_path / "q.db", "answerer") as paused:
        run, status = paused.run, paused.status
        assert await run.handle.query("phase") == status.phase == "await_approval"
        assert await run.handle.query("estimate") == status.estimate
        assert await run.handle.query("last_decision") == status.decision
        with pytest.raises(ConfigError, match="accepts"):
            await run.answer(Signal(name="approved"))
        with pytest.raises(WorkflowUpdateFailedError):  # refused by the validator
            await run.handle.execute_update("answer", {"type": "Nope"})
        # A review for a call the run does not wait on is refused, not fed.
        with pytest.raises(ConfigError, match=r"'c9'.*\(c1, c2\)"):
            await run.answer(ToolCallsReviewed.reject({"c9": "typo"}))
        await run.answer(ToolCallsReviewed.approve_all())
        result = await run.result()
        assert (await run.status()).outcome == "done"
    assert result.ok
    assert sorted(RAN) == ["c1:/tmp/a", "c2:/etc/passwd"]


async def test_an_answer_missing_the_text_the_machine_adds_is_refused_when_sent(
    temporal_client: Client, tmp_path: Path
) -> None:
    # Accepted, it failed the workflow and left the session held; in-process
    # it is refused with nothing written, and the run still waits.
    text = (machines_dir() / "review.toml").read_text()
    text = text.replace('name = "review"', 'name = "human_review"').replace(
        'await_review      = { effect = "review" }',
        'await_review      = { decision = "pause" }',
    )
    assert 'message = "feedback"' in text
    agent = Agent(
        model=ScriptedModel.of(reply("draft"), reply("draft 2")),
        store=SQLiteStore(tmp_path / "h.db"),
        name="human_review",
        machine=MachineSpec.from_toml(text),
    )
    async with _served(temporal_client, agent) as queue:
        run = await start_durable(
            agent, "write", client=temporal_client, task_queue=queue
        )
        await _paused(run)
        for data in ({}, {"feedback": "   "}):
            with pytest.raises(ConfigError, match="feedback"):
                await run.answer(Signal("revise", data))
        assert (await run.status()).outcome == "paused"
        await run.answer(Signal("revise", {"feedback": "shorter"}))
        await _paused(run)
        await run.answer(Signal("approved"))
        result = await run.result()
    assert result.ok, result.error
    assert result.text == "draft 2"


async def test_reject_answers_the_call_and_inject_joins_the_conversation(
    temporal_client: Client, tmp_path: Path
) -> None:
    RAN.clear()
    store = SQLiteStore(tmp_path / "r.db")
    agent = _asking("rejecter", store)
    async with _served(temporal_client, agent) as queue:
        run = await start_durable(
            agent, "clean up", client=temporal_client, task_queue=queue
        )
        await _paused(run)
        await run.inject("and be careful")
        twice = Message.user("and mind the backups")
        await run.inject(twice)
        with pytest.raises(InvalidMessage, match="not queued already"):
            await run.inject(twice)  # a send retried: refused, the run goes on
        with pytest.raises(InvalidMessage, match="message"):
            await run.inject(Message.assistant("x", tool_calls=[tool_call("a", "c9")]))
        with pytest.raises(ConfigError, match="at least one call"):
            await run.reject({})  # it would approve every call
        await run.reject({"c2": "never touch /etc"})
        result = await run.result()
    assert result.ok
    assert RAN == ["c1:/tmp/a"]  # the rejected call never ran
    session = await Session.load(SQLiteStore(tmp_path / "r.db"), run.session_id)
    said = [(m.role.value, m.text) for m in session.history]
    results = {r.call_id: r for m in session.history for r in m.tool_results}
    assert results["c2"].content == "rejected by the reviewer: never touch /etc"
    assert results["c2"].is_error
    assert ("user", "and be careful") in said
    assert said.count(("user", "and mind the backups")) == 1
    history = await _history(temporal_client, run.workflow_id)
    await _replays(history)


def _approval_taking_no_injection() -> MachineSpec:
    """The approval machine with no `message_injected` transition at all."""
    data = tomllib.loads((machines_dir() / "approval.toml").read_text())
    data["transitions"] = [
        t for t in data["transitions"] if t["trigger"] != "message_injected"
    ]
    return MachineSpec.from_dict(data)


async def test_inject_into_a_run_whose_machine_takes_none_is_refused_typed(
    temporal_client: Client, tmp_path: Path
) -> None:
    # The update's validator accepted it (the machine was not asked): the
    # message was queued, and the run failed on it when it next stepped.
    # Refused as RunControl.inject refuses it, before it is in the history.
    machine = _approval_taking_no_injection()
    said = Message.user("also check the logs")
    local: list[Exception] = []
    control = RunControl()

    def speak(request: ModelRequest) -> Message:
        try:
            control.inject(said)
        except InvalidMessage as exc:
            local.append(exc)
        return reply("", tool_call("delete", "c1", path="/tmp/a"))

    local_agent = Agent(
        model=FakeModelClient(speak), tools=[delete], machine=machine, name="deaf"
    )
    assert (await local_agent.run("clean up", control=control)).outcome == "paused"
    RAN.clear()
    store = SQLiteStore(tmp_path / "i.db")
    model = ScriptedModel.of(reply("", tool_call("delete", "c1", path="/tmp/a")), "ok")
    agent = Agent(
        model=model, tools=[delete], machine=machine, store=store, name="deaf"
    )
    async with _served(temporal_client, agent) as queue:
        run = await start_durable(
            agent, "clean up", client=temporal_client, task_queue=queue
        )
        await _paused(run)
        with pytest.raises(InvalidMessage) as durable:
            await run.inject(said)
        with pytest.raises(InvalidMessage, match="'approval' takes no injected"):
            await run.inject("and be careful")
        await run.approve()
        result = await run.result()
    assert [type(local[0]), str(local[0])] == [type(durable.value), str(durable.value)]
    assert str(durable.value) == (
        f"invalid message message={said.id!r}: machine 'approval' takes no injected"
        " message (none of its phases has a 'message_injected' transition)"
    )
    assert result.ok, result.error
    assert RAN == ["c1:/tmp/a"]
    history = await _history(temporal_client, run.workflow_id)
    # Rejected by the validator: no update is written to the history.
    updates = [
        e
        for e in history.events
        if e.HasField("workflow_execution_update_accepted_event_attributes")
    ]
    assert len(updates) == 1  # the approval only
    await _replays(history)


async def test_cancel_ends_a_paused_run_cancelled(
    temporal_client: Client, tmp_path: Path
) -> None:
    store = SQLiteStore(tmp_path / "c.db")
    agent = _asking("canceller", store)
    async with _served(temporal_client, agent) as queue:
        run = await start_durable(
            agent, "clean up", client=temporal_client, task_queue=queue
        )
        await _paused(run)
        await run.cancel("the operator said no")
        result = await run.result()
    assert result.outcome == "cancelled"
    assert isinstance(result.error, Cancelled)
    assert result.error.reason == "the operator said no"
    session = await Session.load(SQLiteStore(tmp_path / "c.db"), run.session_id)
    assert [r.outcome for r in session.runs] == ["cancelled"]
    assert list(session.history) == []  # nothing of a cancelled run is committed
    assert await SQLiteStore(tmp_path / "c.db").lease_of(run.session_id) is None


# -- Temporal's cancellation, retries, failures -------------------------------


def _hanging(name: str, store: SessionStore, started: anyio.Event) -> Agent:
    """An agent whose model call never returns (it sets `started`)."""

    async def hang(request: ModelRequest) -> Message:
        started.set()
        await anyio.sleep(3600)
        raise AssertionError("unreachable")

    return Agent(model=FakeModelClient(hang), store=store, name=name)


async def _started(
    agent: Agent, client: Client, queue: str, started: anyio.Event
) -> Any:
    run = await start_durable(
        agent, "wait", client=client, task_queue=queue, options=FAST
    )
    with anyio.fail_after(30):
        await started.wait()
    return run


BLOCKED: list[str] = []


async def block(seconds: float) -> str:
    """Hold the event loop (a blocking call in an async tool).

    Args:
        seconds: how long.
    """
    call = current_tool_call()
    assert call is not None
    BLOCKED.append(call.id)
    time.sleep(seconds)  # noqa: ASYNC251 - the user's mistake this test makes
    return f"blocked {seconds} s"


@pytest.mark.filterwarnings("ignore:Cannot find activity to cancel:UserWarning")
async def test_a_tool_holding_the_loop_past_the_heartbeat_runs_once(
    temporal_client: Client, tmp_path: Path
) -> None:
    # An async tool that blocks the worker's event loop past the heartbeat
    # timeout: Temporal took its worker for lost and scheduled the call
    # again, on the same worker, which ran the tool again, and again (each
    # attempt held the loop as long): a run that never ended. The retry
    # takes the result of the run that went on.
    BLOCKED.clear()
    agent = Agent(
        model=ScriptedModel.of(reply("", tool_call("block", "b1", seconds=2.5)), "ok"),
        tools=[block],
        store=SQLiteStore(tmp_path / "b.db"),
        name="blocker",
    )
    options = DurableOptions(heartbeat_timeout=1, retry_initial=0.1, retry_max=0.5)
    async with _served(temporal_client, agent) as queue:
        run = await start_durable(
            agent, "go", client=temporal_client, task_queue=queue, options=options
        )
        with anyio.fail_after(40):
            result = await run.result()
    assert result.ok
    assert BLOCKED == ["b1"]
    session = await Session.load(SQLiteStore(tmp_path / "b.db"), run.session_id)
    results = [r for m in session.history for r in m.tool_results]
    assert [(r.call_id, r.content, r.is_error) for r in results] == [
        ("b1", "blocked 2.5 s", False)
    ]


@pytest.mark.filterwarnings("ignore:Cannot find activity to cancel:UserWarning")
async def test_a_model_call_holding_the_loop_past_the_heartbeat_is_made_once(
    temporal_client: Client, tmp_path: Path
) -> None:
    # A model client making a blocking call in its async method (a slow
    # local model behind a blocking HTTP library): each attempt held the
    # loop past the heartbeat timeout, and the model was called for ever.
    calls: list[int] = []

    async def slow(request: ModelRequest) -> str:
        calls.append(1)
        time.sleep(2.5)  # noqa: ASYNC251 - the user's mistake this test makes
        return "the answer"

    agent = Agent(
        model=FakeModelClient(slow), store=SQLiteStore(tmp_path / "m.db"), name="slow"
    )
    options = DurableOptions(heartbeat_timeout=1, retry_initial=0.1, retry_max=0.5)
    async with _served(temporal_client, agent) as queue:
        run = await start_durable(
            agent, "go", client=temporal_client, task_queue=queue, options=options
        )
        with anyio.fail_after(40):
            result = await run.result()
    assert (result.ok, result.text) == (True, "the answer")
    assert len(calls) == 1


async def test_cancelling_the_workflow_records_the_run_interrupted(
    temporal_client: Client, tmp_path: Path
) -> None:
    started = anyio.Event()
    agent = _hanging("hanging", SQLiteStore(tmp_path / "k.db"), started)
    async with _served(temporal_client, agent) as queue:
        run = await _started(agent, temporal_client, queue, started)
        await run.handle.cancel()
        with pytest.raises(Cancelled):
            await run.result()
    session = await Session.load(SQLiteStore(tmp_path / "k.db"), run.session_id)
    # A cancel from outside the run: what completed is kept, resumable, and
    # the workflow let the session go (resume takes it in-process).
    assert [r.outcome for r in session.runs] == ["interrupted"]
    assert await SQLiteStore(tmp_path / "k.db").lease_of(run.session_id) is None


async def _seen_a_result(client: Client, workflow_id: str) -> bool:
    """Whether a workflow task completed after a tool call's activity did."""
    from temporalio.api.enums.v1 import EventType

    events = (await _history(client, workflow_id)).events
    tools = {
        e.event_id
        for e in events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and e.activity_task_scheduled_event_attributes.activity_type.name
        == "turnfsm.tool"
    }
    completed = [
        at
        for at, e in enumerate(events)
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED
        and e.activity_task_completed_event_attributes.scheduled_event_id in tools
    ]
    return bool(completed) and any(
        e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
        for e in events[completed[0] + 1 :]
    )


@pytest.mark.parametrize("how", ["workflow", "signal"])
async def test_a_batch_cut_short_keeps_the_results_of_the_calls_that_finished(
    temporal_client: Client, tmp_path: Path, how: str
) -> None:
    # They were lost: the resume closed the finished call as interrupted too,
    # inviting the model to run a side effect again.
    slow_started = anyio.Event()
    ran: list[int] = []

    async def work(n: int) -> str:
        """Work.

        Args:
            n: Which.
        """
        if n:
            slow_started.set()
            await anyio.sleep(60)
        ran.append(n)
        return f"work {n} done"

    def model(request: ModelRequest) -> Message:
        if request.messages[-1].tool_results:
            return reply("ok")
        return reply("", tool_call("work", "a", n=0), tool_call("work", "b", n=1))

    store = SQLiteStore(tmp_path / "b.db")
    agent = Agent(model=FakeModelClient(model), tools=[work], name="batch", store=store)
    async with _served(temporal_client, agent) as queue:
        run = await start_durable(agent, "go", client=temporal_client, task_queue=queue)
        with anyio.fail_after(30):
            await slow_started.wait()
            # The fast call's result is in the workflow: a workflow task ran
            # after its activity completed (else the cancel may come first).
            while not await _seen_a_result(temporal_client, run.workflow_id):  # noqa: ASYNC110
                await anyio.sleep(0.05)
        if how == "workflow":
            await run.handle.cancel()
            with pytest.raises(Cancelled):
                await run.result()
        else:
            await run.cancel("enough")
            assert (await run.result()).outcome == "cancelled"
    session = await Session.load(store, run.session_id)
    results = [
        e.result.tool_results[0]
        for e in session.entries
        if isinstance(e, ToolResultRecorded)
    ]
    assert [(p.call_id, p.content) for p in results] == [("a", "work 0 done")]
    if how == "workflow":  # interrupted: its resume closes only the call cut short
        resumed = await agent.resume(run.session_id, session.runs[0].run_id)
        assert resumed.ok, resumed.error
        said = {
            p.call_id: p.content for m in agent.session.history for p in m.tool_results
        }
        assert said["a"] == "work 0 done"
        assert "interrupted" in said["b"]
    assert ran == [0]


async def test_the_cancel_signal_interrupts_the_call_in_flight(
    temporal_client: Client, tmp_path: Path
) -> None:
    started = anyio.Event()
    agent = _hanging("interrupted", SQLiteStore(tmp_path / "i.db"), started)
    async with _served(temporal_client, agent) as queue:
        run = await _started(agent, temporal_client, queue, started)
        status = await run.status()
        assert (status.phase, status.decision, status.outcome) == (
            "call_llm",
            "call_llm:1",
            "running",
        )
        await run.cancel("enough")
        with anyio.fail_after(30):
            result = await run.result()
        history = await _history(temporal_client, run.workflow_id)
    assert result.outcome == "cancelled"
    assert isinstance(result.error, Cancelled)
    assert result.error.reason == "enough"
    session = await Session.load(SQLiteStore(tmp_path / "i.db"), run.session_id)
    assert [r.outcome for r in session.runs] == ["cancelled"]
    await _replays(history)


class _Attempts(Hook):
    """Hears each model call's attempt and the seconds waited before it."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, float]] = []

    def on_model_call_start(self, info: ModelCallInfo) -> None:
        self.seen.append((info.attempt, info.waited))


@pytest.mark.parametrize("local", [False, True], ids=["activities", "local"])
async def test_a_transient_model_error_is_retried_by_temporal_not_tenacity(
    temporal_client: Client, tmp_path: Path, local: bool
) -> None:
    calls: list[int] = []

    async def flaky(request: ModelRequest) -> Message:
        calls.append(len(calls))
        if len(calls) == 1:
            raise ProviderError("slow down", retryable=True, kind="rate_limit")
        if len(calls) == 2:  # the provider says how long
            raise ProviderError(
                "slow down", retryable=True, kind="rate_limit", retry_after=0.3
            )
        return reply("fine")

    heard = _Attempts()
    agent = Agent(
        model=FakeModelClient(flaky),
        store=SQLiteStore(tmp_path / "t.db"),
        name="flaky",
        retry=RetryPolicy(max_attempts=4, initial_wait=0.05, max_wait=0.1),
        hooks=[heard],
    )
    async with _served(temporal_client, agent) as queue:
        run = await start_durable(
            agent,
            "hi",
            client=temporal_client,
            task_queue=queue,
            options=DurableOptions(local_activities=local),
        )
        result = await run.result()
        history = await _history(temporal_client, run.workflow_id)
    assert result.ok
    assert result.text == "fine"
    assert calls == [0, 1, 2]  # one model call per activity attempt
    # The hooks hear each attempt's number and wait, as in-process (they
    # heard attempt 1, waited 0, three times). A local activity keeps no
    # heartbeat: its wait is the policy's, not the provider's.
    assert heard.seen == [(1, 0.0), (2, 0.05), (3, 0.1 if local else 0.3)]
    if not local:
        attempts = [
            e.activity_task_started_event_attributes.attempt
            for e in history.events
            if e.HasField("activity_task_started_event_attributes")
        ]
        assert max(attempts) == 3


async def test_a_model_failing_for_good_fails_the_run_as_in_process(
    temporal_client: Client, tmp_path: Path
) -> None:
    async def down(request: ModelRequest) -> Message:
        raise ProviderError("overloaded", retryable=True, kind="server_error")

    def make(store: SessionStore, name: str) -> Agent:
        return Agent(
            model=FakeModelClient(down),
            store=store,
            name=name,
            retry=RetryPolicy(max_attempts=2, initial_wait=0.05, max_wait=0.1),
        )

    expected = await make(MemoryStore(), "down-local").run("hi")
    agent = make(SQLiteStore(tmp_path / "f.db"), "down")
    async with _served(temporal_client, agent) as queue:
        run = await start_durable(agent, "hi", client=temporal_client, task_queue=queue)
        result = await run.result()
    assert result.outcome == expected.outcome == "failed"
    assert type(result.error) is type(expected.error)

    def timeless(error: object) -> str:  # the seconds the attempts took vary
        return re.sub(r"over \d+\.\d s", "over ... s", str(error))

    assert timeless(result.error) == timeless(expected.error)
    assert "; tried 2 times over ... s, failing each time" in timeless(result.error)


async def test_a_retry_after_past_the_budget_ends_a_durable_run_as_in_process(
    temporal_client: Client, tmp_path: Path
) -> None:
    # Temporal was handed the provider's 600 s as the next attempt's delay,
    # whatever RetryPolicy.max_total said.
    calls: list[int] = []

    async def slow(request: ModelRequest) -> Message:
        calls.append(len(calls))
        raise ProviderError(
            "slow down", retryable=True, kind="rate_limit", retry_after=600
        )

    def make(store: SessionStore, name: str) -> Agent:
        return Agent(
            model=FakeModelClient(slow),
            store=store,
            name=name,
            retry=RetryPolicy(max_attempts=4, initial_wait=0.05, max_total=30),
        )

    expected = await make(MemoryStore(), "slow-local").run("hi")
    calls.clear()
    agent = make(SQLiteStore(tmp_path / "r.db"), "slow")
    async with _served(temporal_client, agent) as queue:
        run = await start_durable(agent, "hi", client=temporal_client, task_queue=queue)
        with anyio.fail_after(30):
            result = await run.result()
    assert calls == [0]
    assert result.outcome == expected.outcome == "failed"

    def timeless(error: object) -> str:  # the seconds left vary
        return re.sub(r"\d+\.\d s", "... s", str(error))

    assert timeless(result.error) == timeless(expected.error)
    assert "the provider asked to wait 600 s before trying again" in str(result.error)


async def test_a_durable_run_begins_no_backoff_past_the_budget(
    temporal_client: Client, tmp_path: Path
) -> None:
    calls: list[int] = []

    async def busy(request: ModelRequest) -> Message:
        calls.append(len(calls))
        raise ProviderError("busy", retryable=True, kind="server")

    agent = Agent(
        model=FakeModelClient(busy),
        store=SQLiteStore(tmp_path / "b.db"),
        name="busy",
        retry=RetryPolicy(max_attempts=10, initial_wait=2, max_wait=2, max_total=3.5),
    )
    async with _served(temporal_client, agent) as queue:
        run = await start_durable(agent, "hi", client=temporal_client, task_queue=queue)
        result = await run.result()
    assert result.outcome == "failed"
    assert calls == [0, 1]  # at 0 s and 2 s; a third would start at 4 s


async def test_an_effect_that_raises_fails_the_run_as_in_process(
    temporal_client: Client, tmp_path: Path
) -> None:
    async def broken(ctx: object, decision: object) -> object:
        raise ValueError("the effect is broken")

    spec = MachineSpec.from_toml(approval_toml(), source="approval.toml")
    agent = Agent(
        model=ScriptedModel.of(reply("", tool_call("delete", "c1", path="x")), "ok"),
        tools=[delete],
        machine=spec,
        effects={"await_approval": broken},
        store=SQLiteStore(tmp_path / "b.db"),
        name="broken",
    )
    async with _served(temporal_client, agent) as queue:
        run = await start_durable(agent, "go", client=temporal_client, task_queue=queue)
        result = await run.result()
    assert result.outcome == "failed"
    error = result.error
    assert isinstance(error, EffectFailed)
    assert (error.effect, error.type, error.message) == (
        "await_approval",
        "ValueError",
        "the effect is broken",
    )
    session = await Session.load(SQLiteStore(tmp_path / "b.db"), run.session_id)
    [record] = session.runs
    assert record.outcome == "failed"
    assert isinstance(record.error, EffectFailed)
    assert await SQLiteStore(tmp_path / "b.db").lease_of(run.session_id) is None


async def test_a_custom_effect_runs_as_an_activity(
    temporal_client: Client, tmp_path: Path
) -> None:
    seen: list[str] = []

    async def approve(ctx: Any, decision: Any) -> Signal:
        seen.append(ctx.session.id if ctx.session is not None else "")
        return Signal(name="approved")

    RAN.clear()
    spec = MachineSpec.from_toml(approval_toml(), source="approval.toml")
    agent = Agent(
        model=ScriptedModel.of(reply("", tool_call("delete", "c1", path="x")), "ok"),
        tools=[delete],
        machine=spec,
        effects={"await_approval": approve},
        store=SQLiteStore(tmp_path / "e.db"),
        name="custom",
    )
    async with _served(temporal_client, agent) as queue:
        run = await start_durable(agent, "go", client=temporal_client, task_queue=queue)
        result = await run.result()
        history = await _history(temporal_client, run.workflow_id)
    assert result.ok
    assert RAN == ["c1:x"]
    assert seen == [run.session_id]  # the effect read the session's log
    scheduled = [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
    ]
    assert scheduled.count("turnfsm.effect") == 3  # two model calls + the effect
    assert scheduled.count("turnfsm.tool") == 1


# -- structured output, sessions ----------------------------------------------


@dataclass
class Verdict:
    ok: bool
    reason: str


async def test_a_durable_run_reads_the_agents_output_type(
    temporal_client: Client, tmp_path: Path
) -> None:
    agent = Agent(
        model=ScriptedModel.of(json.dumps({"ok": True, "reason": "fine"})),
        store=SQLiteStore(tmp_path / "o.db"),
        name="typed",
        output_type=Verdict,
    )
    async with _served(temporal_client, agent) as queue:
        run = await start_durable(
            agent, "judge", client=temporal_client, task_queue=queue
        )
        result = await run.result()
    assert result.output == Verdict(ok=True, reason="fine")


async def test_runs_continue_one_session_and_one_runs_at_a_time(
    temporal_client: Client, tmp_path: Path
) -> None:
    release = anyio.Event()

    async def answer(request: ModelRequest) -> Message:
        if request.messages[-1].text == "first":
            await release.wait()
        return reply(f"re: {request.messages[-1].text}")

    agent = Agent(
        model=FakeModelClient(answer), store=SQLiteStore(tmp_path / "s.db"), name="two"
    )
    async with _served(temporal_client, agent) as queue:
        first = await start_durable(
            agent, "first", client=temporal_client, task_queue=queue
        )
        with pytest.raises(SessionBusy) as busy:
            await start_durable(
                agent, "second", client=temporal_client, task_queue=queue
            )
        # It names the workflow that holds the session, where to reach it.
        assert "is held by its durable run, Temporal workflow 'turnfsm-" in str(
            busy.value
        )
        release.set()
        assert (await first.result()).text == "re: first"
        second = await start_durable(
            agent, "second", client=temporal_client, task_queue=queue
        )
        assert (await second.result()).text == "re: second"
    session = await Session.load(SQLiteStore(tmp_path / "s.db"), agent.session.id)
    assert [m.text for m in session.history] == [
        "first",
        "re: first",
        "second",
        "re: second",
    ]


@pytest.mark.parametrize("holder", [None, "elsewhere:1:x"], ids=["paused", "held"])
async def test_a_durable_run_on_a_session_with_an_open_run_is_refused(
    temporal_client: Client, tmp_path: Path, holder: str | None
) -> None:
    # Held: the run open in the log is another live process's. The refusal
    # said it was paused or its process dead ("resume or abandon it
    # first"), naming no process, while that process ran it.
    store = SQLiteStore(tmp_path / "p.db")
    agent = _asking("busy", store)
    paused = await agent.run("clean up")  # in-process, paused
    assert paused.outcome == "paused"
    if holder is not None:
        await store.acquire_lease(paused.session_id, holder, ttl=60)
    async with _served(temporal_client, agent) as queue:
        run = await start_durable(
            agent, "again", client=temporal_client, task_queue=queue
        )
        with pytest.raises(SessionBusy) as caught:
            await run.result()
    assert caught.value.run_id == paused.run_id
    assert caught.value.owner == holder
    if holder is not None:
        assert caught.value.alive is True
        assert f"is held by {holder!r}" in str(caught.value)
    else:
        # The refused workflow holds nothing: the paused run is answered here.
        assert await store.lease_of(paused.session_id) is None
    await _replays(await _history(temporal_client, run.workflow_id))


async def test_a_paused_durable_run_is_answered_through_its_workflow_only(
    temporal_client: Client, tmp_path: Path
) -> None:
    RAN.clear()
    agent = _asking("held", SQLiteStore(tmp_path / "h.db"))
    async with _served(temporal_client, agent) as queue:
        run = await start_durable(
            agent, "clean up", client=temporal_client, task_queue=queue
        )
        await _paused(run)
        # Another process on the same store, answering the pause in-process,
        # would run the tools beside the workflow: the workflow holds the
        # session, and the refusal says where to answer.
        other = _asking("held", SQLiteStore(tmp_path / "h.db"))
        (paused,) = (await other.open_session(run.session_id)).open_runs()
        with pytest.raises(SessionBusy, match="Temporal workflow") as busy:
            await other.resume(
                run.session_id, paused.run_id, ToolCallsReviewed.approve_all()
            )
        assert busy.value.owner == f"temporal:{run.workflow_id}"
        assert busy.value.alive is True
        with pytest.raises(SessionBusy):
            await other.abandon(run.session_id, paused.run_id)
        assert RAN == []
        await run.approve()
        result = await run.result()
    assert (result.outcome, result.text) == ("done", "cleaned up")
    assert sorted(RAN) == ["c1:/tmp/a", "c2:/etc/passwd"]
    # The run's end lets the session go: the next run may be in-process.
    store = SQLiteStore(tmp_path / "h.db")
    assert await store.lease_of(run.session_id) is None
    await _replays(await _history(temporal_client, run.workflow_id))


async def test_a_durable_run_taken_over_with_force_ends_in_the_conflict(
    temporal_client: Client, tmp_path: Path
) -> None:
    RAN.clear()
    agent = _asking("forced", SQLiteStore(tmp_path / "f.db"))
    async with _served(temporal_client, agent) as queue:
        run = await start_durable(
            agent, "clean up", client=temporal_client, task_queue=queue
        )
        await _paused(run)
        other = Agent(
            model=ScriptedModel.of("cleaned up"),
            tools=[delete],
            machine=approval_machine(),
            store=SQLiteStore(tmp_path / "f.db"),
            name="forced",
        )
        session = await other.open_session(run.session_id)
        (paused,) = session.open_runs()
        done = await other.driver.resume(
            session, paused.run_id, ToolCallsReviewed.approve_all(), force=True
        )
        assert done.outcome == "done"
        await run.approve()
        with pytest.raises(SessionConflict):
            await run.result()
    assert sorted(RAN) == ["c1:/tmp/a", "c2:/etc/passwd"]  # once, in-process


async def test_a_durable_run_on_a_session_a_live_process_holds_is_refused(
    temporal_client: Client, tmp_path: Path
) -> None:
    store = SQLiteStore(tmp_path / "l.db")
    agent = Agent(model=ScriptedModel.of("hi"), store=store, name="live")
    await store.acquire_lease(agent.session.id, "elsewhere:1:x", ttl=60)
    async with _served(temporal_client, agent) as queue:
        run = await start_durable(agent, "hi", client=temporal_client, task_queue=queue)
        with pytest.raises(SessionBusy) as caught:
            await run.result()
    assert caught.value.owner == "elsewhere:1:x"
    assert caught.value.alive is True


async def test_a_run_of_an_agent_no_worker_serves_fails_naming_it(
    temporal_client: Client, tmp_path: Path
) -> None:
    served = Agent(model=ScriptedModel.of("x"), store=MemoryStore(), name="served")
    stranger = Agent(model=ScriptedModel.of("x"), store=MemoryStore(), name="stranger")
    async with _served(temporal_client, served) as queue:
        run = await start_durable(
            stranger, "hi", client=temporal_client, task_queue=queue
        )
        with pytest.raises(ConfigError, match="stranger") as refused:
            await run.result()
        assert (refused.value.field, refused.value.value) == ("agent", "stranger")
        # Ended, not running: its workflow failed before its run began.
        assert (await run.status()).outcome == "failed"


async def test_a_session_temporal_never_ran_is_not_found(
    temporal_client: Client,
) -> None:
    run = DurableRun(temporal_client, "ses_never_started")
    steps: list[Callable[[], Any]] = [run.result, run.status, run.approve, run.cancel]
    for step in steps:
        with pytest.raises(SessionNotFound) as caught:
            await step()
        assert str(caught.value).startswith(
            "no session 'ses_never_started' in the durable runs of Temporal "
            "namespace 'default'"
        )


async def test_a_deadline_on_a_run_no_worker_serves_is_a_timeout(
    temporal_client: Client,
) -> None:
    agent = Agent(model=ScriptedModel.of("x"), store=MemoryStore())
    run = await start_durable(agent, "hi", client=temporal_client, task_queue=_queue())
    steps: list[Callable[[], Any]] = [run.status, run.approve, run.result]
    for step in steps:
        with pytest.raises(TimeoutError):
            with anyio.fail_after(0.5):
                await step()
    await run.handle.terminate()
    with pytest.raises(ConfigError, match=r"a run still going \(it has ended\)"):
        await run.approve()
    with pytest.raises(ConfigError) as caught:
        await run.cancel("too late")
    assert (caught.value.field, caught.value.value) == ("cancel", "too late")


async def test_start_durable_refuses_bad_settings(temporal_client: Client) -> None:
    agent = Agent(model=ScriptedModel.of("x"), store=MemoryStore())
    with pytest.raises(ConfigError, match="task_queue"):
        await start_durable(agent, "hi", client=temporal_client, task_queue="")
    with pytest.raises(ConfigError, match="client"):
        await start_durable(agent, "hi", client="localhost", task_queue="q")
    with pytest.raises(ConfigError, match="options"):
        await start_durable(
            agent, "hi", client=temporal_client, task_queue="q", options={"x": 1}
        )
    with pytest.raises(ConfigError, match="heartbeat_timeout"):
        DurableOptions(heartbeat_timeout=0)


@pytest.mark.parametrize("agents", ["notanagent", b"x", {"a": 1}, []])
def test_create_worker_names_the_agents_given_when_they_are_not_agents(
    agents: Any,
) -> None:
    # A string was read as its characters: "invalid agents='n'".
    with pytest.raises(ConfigError) as refused:
        create_worker(None, "q", agents)  # type: ignore[arg-type]
    assert (refused.value.field, refused.value.value) == ("agents", agents)


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"retry_initial": 50, "retry_max": 1}, "retry_max=1"),
        ({"heartbeat_timeout": 1e14}, "heartbeat_timeout="),
        ({"task_timeout": 1e14}, "task_timeout="),
        ({"log_timeout": 1e10}, "log_timeout="),
    ],
)
def test_durable_options_no_worker_can_schedule_are_refused_when_given(
    options: dict[str, float], field: str
) -> None:
    # Accepted, each left a run whose workflow task failed on every attempt,
    # or raised OverflowError when the run started.
    with pytest.raises(ConfigError, match=field):
        DurableOptions(**options)


async def test_a_task_timeout_temporal_would_cut_is_refused_at_the_start() -> None:
    # Accepted, Temporal cut it to its longest without a word. Options read
    # back from a workflow started before stay readable: refused at the start.
    assert DurableOptions(task_timeout=300).task_timeout == 300
    client = await Client.connect("127.0.0.1:9", lazy=True)
    agent = Agent(model=ScriptedModel.of("x"), name="cut")
    with pytest.raises(ConfigError) as refused:
        await start_durable(
            agent,
            "hi",
            client=client,
            task_queue="q",
            options=DurableOptions(task_timeout=300),
        )
    assert (refused.value.field, refused.value.value) == ("task_timeout", 300)
    assert "seconds <= 120" in str(refused.value)


@pytest.mark.parametrize(
    "retry",
    [RetryPolicy(initial_wait=5, max_wait=1), RetryPolicy(initial_wait=0, max_wait=0)],
    ids=["first-wait-over-the-longest", "no-wait"],
)
async def test_a_retry_policy_temporal_would_refuse_as_given_runs_durably(
    temporal_client: Client, tmp_path: Path, retry: RetryPolicy
) -> None:
    # In-process every wait is at most max_wait; Temporal refused a first
    # wait over its longest, and the run never went on.
    agent = Agent(
        model=ScriptedModel.of("fine"),
        store=SQLiteStore(tmp_path / "r.db"),
        name="retrying",
        retry=retry,
    )
    async with _served(temporal_client, agent) as queue:
        run = await start_durable(agent, "hi", client=temporal_client, task_queue=queue)
        result = await run.result(timeout=30)
    assert (result.outcome, result.text) == ("done", "fine")


@pytest.mark.parametrize("local", [False, True], ids=["activities", "local"])
async def test_a_model_that_raises_crashes_the_run_on_its_own_exception(
    temporal_client: Client, tmp_path: Path, local: bool
) -> None:
    # The log and the error said EffectCrashed, a name of turnfsm's own, where
    # an in-process run says KeyError.
    store = SQLiteStore(tmp_path / "c.db")
    agent = Agent(model=ScriptedModel.of(KeyError("oops")), store=store, name="bug")
    async with _served(temporal_client, agent) as queue:
        run = await start_durable(
            agent,
            "hi",
            client=temporal_client,
            task_queue=queue,
            options=DurableOptions(local_activities=local),
        )
        with pytest.raises(RunCrashed) as caught:
            await run.result(timeout=30)
    assert (caught.value.type, caught.value.message) == ("KeyError", "'oops'")
    (crashed,) = (await Session.load(store, run.session_id)).runs
    assert crashed.outcome == "failed"
    assert isinstance(crashed.error, RunCrashed)
    assert (crashed.error.type, crashed.error.message) == ("KeyError", "'oops'")


async def test_a_terminated_workflows_result_says_so_and_how_to_take_it_over(
    temporal_client: Client, tmp_path: Path
) -> None:
    # Terminated from outside, the run did not crash: its log stops paused,
    # its session stays held, and the result says how to take it over.
    store = SQLiteStore(tmp_path / "t.db")
    agent = _asking("terminated", store)
    async with _served(temporal_client, agent) as queue:
        run = await start_durable(
            agent, "clean up", client=temporal_client, task_queue=queue
        )
        await _paused(run)
        await run.handle.terminate("by hand")
        with pytest.raises(RunCrashed) as caught:
            await run.result()
        # Not paused any more: nothing will answer it.
        status = await run.status()
        assert (status.outcome, status.waiting) == ("terminated", None)
    assert "its workflow was terminated from outside" in str(caught.value)
    assert "take the run over with force=True" in str(caught.value)
    session = await Session.load(store, run.session_id)
    (paused,) = session.runs
    assert paused.outcome == "paused"
    abandoned = await agent.abandon(run.session_id, paused.run_id, force=True)
    assert abandoned.outcome == "failed"


async def test_a_lost_temporal_server_is_named_by_each_call() -> None:
    # No server answers (down, restarting): each call raises a typed error
    # naming the address at once, not the SDK's bare "Failed client connect".
    client = await Client.connect("127.0.0.1:9", lazy=True)
    run = DurableRun(client, "ses_lost")
    calls = (run.result, run.status, run.approve, lambda: run.cancel("stop"))
    for call in calls:
        with anyio.fail_after(30), pytest.raises(TemporalUnreachable) as lost:
            await call()
        assert lost.value.address == "127.0.0.1:9"
        assert str(lost.value).startswith(
            "no answer from the Temporal server at 127.0.0.1:9 ("
        ), str(lost.value)
        assert "the durable run of session 'ses_lost' is kept by the server" in str(
            lost.value
        )


async def test_starting_on_a_lost_temporal_server_is_named() -> None:
    client = await Client.connect("127.0.0.1:9", lazy=True)
    agent = Agent(model=ScriptedModel.of("x"), name="lost")
    with anyio.fail_after(30), pytest.raises(TemporalUnreachable) as lost:
        await start_durable(agent, "hi", client=client, task_queue="q")
    assert lost.value.address == "127.0.0.1:9"
    assert lost.value.session_id == agent.session.id
    assert "may or may not have started: when the server is back, ask" in str(
        lost.value
    )
