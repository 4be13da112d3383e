"""A durable run whose workflow history grows long continues as new.

Temporal ends a workflow whose history outgrows the server's limits, and a
durable run's activities carry its conversation, so a long run must move
to a fresh history before that: past `DurableOptions.history_limit` events
(or when the server suggests it) the run stops between two steps, logged
``interrupted`` with `ContinuedAsNew`, and its workflow continues as new,
resuming it from the log. These tests run on the real dev server, on real
SQLite files, against the in-process run of the same agent.
"""

from __future__ import annotations

import io
import uuid
from collections.abc import Sequence
from pathlib import Path

import anyio
import pytest
from temporalio.client import Client
from temporalio.worker import Replayer

from tests.temporal.test_durable import _paused
from turnfsm import Agent, approval_machine
from turnfsm.cli._demo import TASK, build_demo_agent
from turnfsm.core import MessageInjected
from turnfsm.driver import replay
from turnfsm.errors import Cancelled, ConfigError, ContinuedAsNew
from turnfsm.persistence import (
    Entry,
    EventRecorded,
    MemoryStore,
    RunEnded,
    Session,
    SessionStore,
    SQLiteStore,
)
from turnfsm.temporal import (
    DurableOptions,
    TurnWorkflow,
    create_worker,
    start_durable,
    workflow_runner,
)
from turnfsm.testing import ScriptedModel, reply, tool_call

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(180)]


def _said(session: Session) -> list[tuple[str, str, list[str]]]:
    """What a conversation says, without its message ids."""
    return [
        (m.role.value, m.text, [r.content for r in m.tool_results])
        for m in session.history
    ]


async def test_a_long_run_continues_as_new_and_ends_as_in_process(
    temporal_client: Client, tmp_path: Path
) -> None:
    local = build_demo_agent(io.StringIO(), store=MemoryStore())
    expected = await local.run(TASK)
    store = SQLiteStore(tmp_path / "long.db")
    agent = build_demo_agent(io.StringIO(), store=store)
    queue = f"test-{uuid.uuid4().hex[:10]}"
    # 30 events: the workflow's start, the log's first read and a step or two.
    options = DurableOptions(
        heartbeat_timeout=5, retry_initial=0.1, retry_max=1, history_limit=30
    )
    async with create_worker(temporal_client, queue, agent):
        run = await start_durable(
            agent, TASK, client=temporal_client, task_queue=queue, options=options
        )
        result = await run.result()
        status = await run.status()
    assert (result.outcome, result.text, result.turns) == (
        expected.outcome,
        expected.text,
        expected.turns,
    )
    assert (status.outcome, status.turn) == ("done", expected.turns)
    assert result.usage == expected.usage  # the whole run's, not the last part's

    session = await Session.load(SQLiteStore(tmp_path / "long.db"), run.session_id)
    assert _said(session) == _said(local.session)
    [record] = session.runs  # one run, however many workflow runs carried it
    assert record.outcome == "done"
    assert replay(agent.driver.machine, session, result.run_id).ok
    stops = [
        e
        for e in session.entries
        if isinstance(e, RunEnded) and isinstance(e.error, ContinuedAsNew)
    ]
    assert len(stops) >= 2
    assert all(e.outcome == "interrupted" for e in stops)
    for stop in stops:
        assert isinstance(stop.error, ContinuedAsNew)
        assert stop.error.workflow_id == run.workflow_id
        assert stop.error.history_events >= 30
        assert stop.error.history_bytes > 0

    # Temporal: a chain of workflow runs, one per stop and the last, each
    # history short, and each replaying.
    handle = temporal_client.get_workflow_handle(run.workflow_id)
    replayer = Replayer(workflows=[TurnWorkflow], workflow_runner=workflow_runner())
    chain, run_id = 0, (await handle.describe()).run_id
    while run_id:
        history = await temporal_client.get_workflow_handle(
            run.workflow_id, run_id=run_id
        ).fetch_history()
        await replayer.replay_workflow(history)
        chain += 1
        started = history.events[0].workflow_execution_started_event_attributes
        run_id = started.continued_execution_run_id
        # A stop comes at the first step past the limit: a step's events over.
        assert len(history.events) < 30 + 25
    assert chain == len(stops) + 1

    # The run let its session go only at its end: another process takes it.
    await store.acquire_lease(run.session_id, "another process", ttl=5)


def charging(store: SessionStore, ran: list[int], turns: int) -> Agent:
    """An agent charging `turns` cards one turn at a time; `ran` gets each charge."""

    def charge(n: int) -> str:
        """Charge a card (not safe to run twice).

        Args:
            n: the charge.
        """
        ran.append(n)
        return f"charged {n}"

    script = [reply("", tool_call("charge", f"c{n}", n=n)) for n in range(turns)]
    return Agent(
        model=ScriptedModel.of(*script, "all charged"),
        tools=[charge],
        store=store,
        name="charger",
    )


def stops(session: Session) -> list[RunEnded]:
    """The run's stops to continue as new, in its log."""
    return [
        e
        for e in session.entries
        if isinstance(e, RunEnded) and isinstance(e.error, ContinuedAsNew)
    ]


@pytest.mark.parametrize(
    ("options", "least_stops"),
    [
        (DurableOptions(history_limit=25), 2),
        # Steps as local activities: a smaller history, a lower limit.
        (DurableOptions(local_activities=True, history_limit=12), 1),
    ],
    ids=["activities", "local activities"],
)
async def test_a_tool_that_is_not_safe_to_repeat_runs_once_per_call(
    temporal_client: Client, tmp_path: Path, options: DurableOptions, least_stops: int
) -> None:
    # A stop never falls before a tool batch: resumed, a batch with no
    # results would be closed as interrupted, as after a crash.
    ran: list[int] = []
    turns = 8
    agent = charging(SQLiteStore(tmp_path / "tools.db"), ran, turns)
    queue = f"test-{uuid.uuid4().hex[:10]}"
    # No workflow cache: every task replays its history, stops included.
    async with create_worker(temporal_client, queue, agent, max_cached_workflows=0):
        run = await start_durable(
            agent,
            "charge them",
            client=temporal_client,
            task_queue=queue,
            options=options,
        )
        result = await run.result()
    assert (result.outcome, result.text) == ("done", "all charged")
    assert ran == list(range(turns))
    session = await Session.load(SQLiteStore(tmp_path / "tools.db"), run.session_id)
    results = [r.content for m in session.history for r in m.tool_results]
    assert results == [f"charged {n}" for n in range(turns)]
    assert len(stops(session)) >= least_stops


async def test_a_run_paused_for_approvals_continues_and_is_answered_through_it(
    temporal_client: Client, tmp_path: Path
) -> None:
    ran: list[str] = []

    def delete(path: str) -> str:
        """Delete a file.

        Args:
            path: the file.
        """
        ran.append(path)
        return f"deleted {path}"

    paths = [f"/tmp/{n}" for n in range(4)]
    script = [
        reply("", tool_call("delete", f"c{n}", path=p)) for n, p in enumerate(paths)
    ]
    agent = Agent(
        model=ScriptedModel.of(*script, "cleaned up"),
        tools=[delete],
        machine=approval_machine(),
        store=SQLiteStore(tmp_path / "approve.db"),
        name="approver",
    )
    queue = f"test-{uuid.uuid4().hex[:10]}"
    async with create_worker(temporal_client, queue, agent):
        run = await start_durable(
            agent,
            "clean up",
            client=temporal_client,
            task_queue=queue,
            options=DurableOptions(history_limit=25),
        )
        for n in range(len(paths)):
            status = await _paused(run)
            assert [c.id for c in status.waiting.calls] == [f"c{n}"]
            await run.approve()
        result = await run.result()
    assert (result.outcome, result.text) == ("done", "cleaned up")
    assert ran == paths
    session = await Session.load(SQLiteStore(tmp_path / "approve.db"), run.session_id)
    assert replay(approval_machine(), session, result.run_id).ok
    assert any(
        isinstance(e, RunEnded) and isinstance(e.error, ContinuedAsNew)
        for e in session.entries
    )


def test_history_limit_is_checked_where_it_is_given() -> None:
    for bad in (0, -3, 2.5, "100", True):
        with pytest.raises(ConfigError, match="history_limit"):
            DurableOptions(history_limit=bad)  # type: ignore[arg-type]
    assert DurableOptions(history_limit=1).history_limit == 1
    assert DurableOptions().history_limit is None


def test_what_the_steering_queued_crosses_into_the_next_workflow_run() -> None:
    # The continued run's start carries the queue (RunSpec.queued), through
    # Temporal's JSON, to the next workflow run's control.
    from turnfsm import serde
    from turnfsm.core import MessageInjected, RunCancelled
    from turnfsm.driver import RunControl
    from turnfsm.messages import Message
    from turnfsm.temporal._payloads import RunSpec

    before = RunControl()
    before.inject(Message.user("also the logs", id="m1"))
    before.cancel("stop")
    spec = RunSpec(
        agent="a",
        session_id="ses_1",
        run_id="r",
        input=(),
        resume=True,
        queued=before.queued(),
    )
    after = RunControl()
    after.requeue(serde.from_json(RunSpec, serde.to_json(spec)).queued)
    assert after.queued() == (
        MessageInjected(message=Message.user("also the logs", id="m1")),
        RunCancelled(reason="stop"),
    )


def test_a_run_stopped_to_continue_as_new_is_still_running_for_its_queries() -> None:
    # Between its stop and the new workflow run, an injected message is
    # queued and carried, not refused as sent to an ended run.
    from turnfsm.hooks import RunEndInfo
    from turnfsm.temporal._workflow import _Status

    status = _Status()
    stop = ContinuedAsNew(workflow_id="turnfsm-s", history_events=40, history_bytes=9)
    status.on_run_end(
        RunEndInfo(
            run_id="r", phase="call_llm", text="", error=stop, outcome="interrupted"
        )
    )
    assert status.outcome == "running"
    status.on_run_end(RunEndInfo(run_id="r", phase="done", text="ok", error=None))
    assert status.outcome == "done"


async def test_messages_injected_across_continuations_each_arrive_once_in_order(
    temporal_client: Client, tmp_path: Path
) -> None:
    def step(n: int) -> str:
        """Do a step.

        Args:
            n: the step.
        """
        return f"step {n}"

    turns = 12
    script = [reply("", tool_call("step", f"s{n}", n=n)) for n in range(turns)]
    agent = Agent(
        model=ScriptedModel.of(*script, *["noted"] * 400),
        tools=[step],
        store=SQLiteStore(tmp_path / "inject.db"),
        name="injected",
        max_turns=500,
    )
    queue = f"test-{uuid.uuid4().hex[:10]}"
    sent: list[str] = []
    refused: list[str] = []
    async with create_worker(temporal_client, queue, agent):
        run = await start_durable(
            agent,
            "go",
            client=temporal_client,
            task_queue=queue,
            options=DurableOptions(history_limit=20),
        )

        async def inject() -> None:
            for n in range(1_000):
                note = f"note {n}"
                try:
                    await run.inject(note)
                except ConfigError as exc:
                    if "interrupted" in str(exc):
                        refused.append(note)
                    return  # ended
                sent.append(note)

        async with anyio.create_task_group() as group:
            group.start_soon(inject)
            with anyio.fail_after(120):
                result = await run.result()
    assert result.outcome == "done"
    assert refused == []
    session = await Session.load(SQLiteStore(tmp_path / "inject.db"), run.session_id)
    notes = [
        e.event.message.text
        for e in session.entries
        if isinstance(e, EventRecorded) and isinstance(e.event, MessageInjected)
    ]
    assert notes == sent
    stops = [
        e
        for e in session.entries
        if isinstance(e, RunEnded) and isinstance(e.error, ContinuedAsNew)
    ]
    assert len(stops) >= 2


async def test_a_workflow_cancelled_while_the_run_stops_ends_it_cancelled(
    temporal_client: Client, tmp_path: Path
) -> None:
    # Temporal's cancellation lands while the stop is being written: the run
    # ends cancelled in its log and lets its session go, as anywhere else.
    stopping = anyio.Event()

    class SlowStop(SQLiteStore):
        async def append(
            self, session_id: str, entries: Sequence[Entry], *, expected_version: int
        ) -> int:
            if any(
                isinstance(e, RunEnded) and isinstance(e.error, ContinuedAsNew)
                for e in entries
            ):
                stopping.set()
                await anyio.sleep(1.5)
            return await super().append(
                session_id, entries, expected_version=expected_version
            )

    def step(n: int) -> str:
        """Do a step.

        Args:
            n: the step.
        """
        return f"step {n}"

    script = [reply("", tool_call("step", f"s{n}", n=n)) for n in range(10)]
    store = SlowStop(tmp_path / "cancel.db")
    agent = Agent(
        model=ScriptedModel.of(*script, "done"),
        tools=[step],
        store=store,
        name="cancelled-stop",
    )
    queue = f"test-{uuid.uuid4().hex[:10]}"
    async with create_worker(temporal_client, queue, agent):
        run = await start_durable(
            agent,
            "go",
            client=temporal_client,
            task_queue=queue,
            options=DurableOptions(history_limit=15),
        )
        with anyio.fail_after(60):
            await stopping.wait()
        await run.handle.cancel()
        with pytest.raises(Cancelled):
            await run.result()
    session = await Session.load(SQLiteStore(tmp_path / "cancel.db"), run.session_id)
    [record] = session.runs
    assert record.outcome == "cancelled"
    await SQLiteStore(tmp_path / "cancel.db").acquire_lease(
        run.session_id, "another process", ttl=5
    )


async def test_the_status_of_a_continued_run_starts_where_it_stopped(
    temporal_client: Client, tmp_path: Path
) -> None:
    # While the new workflow run reads the log, its status is where the run
    # stopped: not phase start, turn 0.
    reading = anyio.Event()

    class SlowRead(SQLiteStore):
        async def load(self, session_id: str) -> tuple[Entry, ...]:
            entries = await super().load(session_id)
            last = entries[-1] if entries else None
            stopped = isinstance(last, RunEnded) and isinstance(
                last.error, ContinuedAsNew
            )
            if stopped and not reading.is_set():
                reading.set()
                await anyio.sleep(1.5)
            return entries

    def step(n: int) -> str:
        """Do a step.

        Args:
            n: the step.
        """
        return f"step {n}"

    script = [reply("", tool_call("step", f"s{n}", n=n)) for n in range(6)]
    agent = Agent(
        model=ScriptedModel.of(*script, "done"),
        tools=[step],
        store=SlowRead(tmp_path / "status.db"),
        name="status-kept",
    )
    queue = f"test-{uuid.uuid4().hex[:10]}"
    async with create_worker(temporal_client, queue, agent):
        run = await start_durable(
            agent,
            "go",
            client=temporal_client,
            task_queue=queue,
            options=DurableOptions(history_limit=20),
        )
        with anyio.fail_after(60):
            await reading.wait()
        await anyio.sleep(0.5)  # the new workflow run waits on its read
        status = await run.status()
        result = await run.result()
    assert result.ok
    session = await Session.load(SQLiteStore(tmp_path / "status.db"), run.session_id)
    [stop, *_] = [
        e
        for e in session.entries
        if isinstance(e, RunEnded) and isinstance(e.error, ContinuedAsNew)
    ]
    assert (status.outcome, status.phase) == ("running", stop.phase)
    assert status.turn == stop.turns > 0
