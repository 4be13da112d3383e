"""Crash test: durable runs survive workers killed with SIGKILL (the issue's demand).

The test process is the Temporal client: it starts the scripted tasks of
`tests/persistence/crash_worker.py` as durable runs, one after another on
one session (task k starts once task k-1 has its result). Meanwhile a loop
hands the task queue to one worker process at a time (`crash_worker.py`),
lets it work for a seeded random while (counted from its first activity, so
the kills land mid-run: mid-model, mid-tool, mid-compaction, mid-append or
between effects), kills it with SIGKILL and hands over to the next, until
``TURNFSM_TEMPORAL_CRASH_KILLS`` kills (default 30, 3 under the ``dev``
hypothesis profile) are spent; a last worker then runs unkilled until the
last task completes. The same again with the steps as local activities
(``TURNFSM_TEMPORAL_CRASH_LOCAL_KILLS``, default 15). Tasks are started
while kills remain (at least `MIN_TASKS`), so the kills never run out of
work.

Then:

- every workflow completed, with outcome ``done`` and the reference's answer,
  and its history replays on a fresh `Replayer` without a workflow task
  ever having failed (no non-determinism, no crash in the workflow);
- EFFECTS holds every call id of the reference run exactly once, and nothing
  else: each side effect happened exactly once per call id, however often
  the tool ran (ATTEMPTS, at least once per id);
- the session reopened from the SQLite file with a fresh store has, by
  content (ids aside), the history of an uninterrupted in-process run of
  the same script; every run in the log replays and ended done.

Run with ``-s`` to see the tally: kills by what they interrupted, tool
re-runs (how often the idempotency key mattered), Temporal's timeouts and
retries, wall time. ``TURNFSM_TEMPORAL_CRASH_SEED`` seeds the delays.
"""

from __future__ import annotations

import gc
import os
import random
import signal
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import attrs
import pytest

pytest.importorskip("temporalio")

from anyio.abc import Process
from anyio.streams.buffered import BufferedByteReceiveStream
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHistory
from temporalio.worker import Replayer

from tests.helpers import REPO_ROOT
from tests.persistence import crash_worker as script
from tests.persistence.test_crash import content
from tests.profiles import sized
from tests.temporal import crash_worker as worker
from turnfsm import default_machine
from turnfsm.driver import RunResult, replay
from turnfsm.messages import check_history
from turnfsm.persistence import MemoryStore, Session, SQLiteStore
from turnfsm.temporal import (
    DurableOptions,
    DurableRun,
    TurnWorkflow,
    register,
    start_durable,
    workflow_runner,
)

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(900)]

SEED = int(os.environ.get("TURNFSM_TEMPORAL_CRASH_SEED", "20240611"))
KILLS = int(os.environ.get("TURNFSM_TEMPORAL_CRASH_KILLS", sized(30, dev=3)))
MIN_TASKS = 6
MAX_DELAY = 1.2  # seconds a worker may work, from its first activity
# Short heartbeat and workflow-task timeouts: a run whose worker died goes
# on within seconds (every activity heartbeats, the log's too: `log_timeout`
# keeps its default of 60 s, which a kill must never wait out).
OPTIONS = DurableOptions(
    heartbeat_timeout=2, retry_initial=0.2, retry_max=1, task_timeout=2
)
# The same runs with their steps as local activities: a kill loses the
# steps of the worker's unfinished workflow task, which the next one runs
# again (the log is written only from finished tasks).
LOCAL = attrs.evolve(OPTIONS, local_activities=True)
# A workflow task of local activities is kept only once it ends, or at its
# heartbeat (80 % of task_timeout): a worker killed sooner each time would
# leave every run where it was, so the kills come later.
LOCAL_MAX_DELAY = 4.0
LOCAL_KILLS = int(
    os.environ.get("TURNFSM_TEMPORAL_CRASH_LOCAL_KILLS", sized(15, dev=3))
)
START_TIMEOUT = 60.0  # seconds a worker may take to import and connect
STUCK_TIMEOUT = 30.0  # seconds a worker may wait for its first activity
TASK_TIMEOUT = 180.0  # seconds a task may take, kills included


# -- the uninterrupted reference ---------------------------------------


@dataclass(frozen=True)
class Reference:
    history: Any
    answers: tuple[str, ...]
    keys: Counter[str]  # tool call id -> side effects


async def _reference(tmp: Path, tasks: int) -> Reference:
    effects, attempts = tmp / "reference.effects", tmp / "reference.attempts"
    agent = worker.build_agent(
        MemoryStore(), str(effects), str(attempts), script.Trace(None), pace=0
    )
    answers = []
    for task in range(tasks):
        result = await agent.run(script.task_input(task))
        assert result.outcome == "done", result
        answers.append(result.text)
    keys = Counter(effects.read_text().split())
    assert keys == Counter(attempts.read_text().split())  # nothing ran twice
    compactions = sum(c.compacted for r in agent.session.runs for c in r.compactions)
    assert compactions >= tasks // 2  # it compacts every few turns
    return Reference(content(agent.session.history), tuple(answers), keys)


# -- what a kill interrupted -------------------------------------------


def in_flight(trace: Sequence[str]) -> str:
    """What the kill interrupted, from the killed worker's trace."""
    open_: Counter[str] = Counter()
    activities: Counter[str] = Counter()
    for line in trace:
        word, _, rest = line.partition(" ")
        sign, what = word[:1], word[1:]
        if sign not in ("+", "-", "!") or not what:
            continue
        step = 1 if sign == "+" else -1  # "!append": it raised SessionConflict
        if what == "activity":
            activities[rest.split()[0]] += step
        else:
            open_[what] += step
    running = sorted(a for a, n in activities.items() if n > 0)
    for what, name in [
        ("append", "mid-append"),
        ("load", "mid-load"),
        ("compact", "mid-compaction"),
        ("tool", "mid-tool"),
        ("model", "mid-model-call"),
    ]:
        if open_[what] > 0:
            return (
                f"{name} ({', '.join(running)})" if what in ("append", "load") else name
            )
    if running:  # set-up, heartbeat, result: no effect or store call open
        return f"in an activity, between its steps ({', '.join(running)})"
    return "between activities (a workflow task, or waiting for one)"


def _read(path: Path) -> str:
    return path.read_text()


def _marks(tmp: Path, mark: str) -> int:
    """Lines starting with `mark` in every worker's trace."""
    return sum(
        line.startswith(mark)
        for t in tmp.glob("trace*")
        for line in _read(t).split("\n")
    )


# -- the workers -------------------------------------------------------


@dataclass
class Tally:
    kills: int = 0
    workers: int = 0
    tasks: int = 0
    phases: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0

    def report(
        self, attempts: Counter[str], effects: Counter[str], skipped: int, temporal: str
    ) -> str:
        reruns = sum(attempts.values()) - len(effects)
        return "\n".join(
            [
                f"Temporal crash test: {self.kills} kills, {self.workers} worker "
                f"processes, {self.tasks} durable runs, {self.seconds:.1f} s",
                "  in flight at the kill: "
                + ", ".join(f"{k} {v}" for k, v in self.phases.most_common()),
                f"  tool calls: {len(effects)}, invocations {sum(attempts.values())}"
                f" ({reruns} re-runs; {skipped} found their effect applied: the "
                "idempotency key kept it once)",
                f"  Temporal: {temporal}",
            ]
        )


@dataclass
class Workers:
    """Worker processes on one task queue, the next one always on standby."""

    address: str
    queue: str
    tmp: Path
    tally: Tally
    live: list[Process] = field(default_factory=list)

    def paths(self, n: int) -> tuple[Path, Path]:
        return self.tmp / f"trace{n:03d}", self.tmp / f"stderr{n:03d}"

    async def spawn(self) -> tuple[Process, BufferedByteReceiveStream, int]:
        n = self.tally.workers
        self.tally.workers += 1
        trace, err = self.paths(n)
        stderr = os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            proc = await anyio.open_process(
                [
                    sys.executable,
                    "-m",
                    "tests.temporal.crash_worker",
                    "--standby",
                    self.address,
                    self.queue,
                    str(self.tmp / "session.db"),
                    str(self.tmp / "effects"),
                    str(self.tmp / "attempts"),
                    str(trace),
                ],
                env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
                stderr=stderr,
                start_new_session=True,
            )
        finally:
            os.close(stderr)
        self.live.append(proc)
        assert proc.stdout is not None
        return proc, BufferedByteReceiveStream(proc.stdout), n

    async def expect(self, lines: BufferedByteReceiveStream, n: int, word: str) -> None:
        with anyio.fail_after(START_TIMEOUT):
            line = await lines.receive_until(b"\n", 1000)
        assert line.decode() == word, (line, self.paths(n)[1].read_text())

    async def go(self, proc: Process, lines: BufferedByteReceiveStream, n: int) -> None:
        await self.expect(lines, n, "standby")
        assert proc.stdin is not None
        await proc.stdin.send(b"go\n")
        await self.expect(lines, n, "ready")

    async def first_activity(self, n: int) -> None:
        trace = self.paths(n)[0]
        with anyio.fail_after(STUCK_TIMEOUT):
            # The worker's trace file is the only sign: poll it.
            while "+activity" not in _read(trace):  # noqa: ASYNC110
                await anyio.sleep(0.01)

    async def kill(self, proc: Process) -> None:
        os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()
        self.live.remove(proc)

    async def stop_all(self) -> None:
        for proc in list(self.live):
            await self.kill(proc)


async def kill_loop(
    workers: Workers,
    rng: random.Random,
    finished: anyio.Event,
    kills: int,
    max_delay: float,
) -> None:
    """Kill `kills` workers mid-run, then let the last one finish the tasks."""
    tally = workers.tally
    current = await workers.spawn()
    while True:
        proc, lines, n = current
        if tally.kills >= kills:
            await workers.go(proc, lines, n)
            await finished.wait()
            return
        standby = await workers.spawn()  # imports while `current` works
        await workers.go(proc, lines, n)
        await workers.first_activity(n)
        await anyio.sleep(rng.uniform(0.0, max_delay))
        await workers.kill(proc)
        tally.kills += 1
        tally.phases[in_flight(workers.paths(n)[0].read_text().splitlines())] += 1
        current = standby


async def run_tasks(
    client: Client,
    queue: str,
    session_id: str,
    tally: Tally,
    finished: anyio.Event,
    options: DurableOptions,
    kills: int,
) -> list[tuple[DurableRun, RunResult[Any]]]:
    """Start the tasks one after another while kills remain (at least MIN_TASKS)."""
    # The client's agent: the workers' own, by name; it only starts runs here
    # (and lets the test's `Replayer` find it).
    agent = worker.build_agent(
        MemoryStore(), os.devnull, os.devnull, script.Trace(None)
    )
    register([agent], task_queue=f"{queue}-replay")
    runs = []
    while tally.tasks < MIN_TASKS or tally.kills < kills:
        run = await start_durable(
            agent,
            script.task_input(tally.tasks),
            client=client,
            task_queue=queue,
            session_id=session_id,
            options=options,
        )
        with anyio.move_on_after(TASK_TIMEOUT) as waiting:
            result = await run.result()
        if waiting.cancelled_caught:
            pytest.fail(await stuck(client, run, tally.tasks))
        runs.append((run, result))
        tally.tasks += 1
    finished.set()
    return runs


async def history_of(client: Client, run: DurableRun) -> WorkflowHistory:
    """The Temporal history of `run`'s workflow run (not the id's latest run)."""
    run_id = run.handle.result_run_id
    return await client.get_workflow_handle(
        run.workflow_id, run_id=run_id
    ).fetch_history()


def task_failures(history: WorkflowHistory) -> list[str]:
    """The messages of the workflow tasks that failed (non-determinism, a crash)."""
    return [
        e.workflow_task_failed_event_attributes.failure.message
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED
    ]


async def stuck(client: Client, run: DurableRun, task: int) -> str:
    """Why task `task`'s workflow did not complete: its failed workflow tasks."""
    history = await history_of(client, run)
    last = [EventType.Name(e.event_type) for e in history.events[-5:]]
    return (
        f"task {task} ({history.workflow_id}, run {run.handle.result_run_id}) did "
        f"not complete in {TASK_TIMEOUT} s; workflow task failures: "
        f"{task_failures(history)[-3:]}; last events: {last} (see `temporal "
        f"workflow show -w {history.workflow_id}` and the workers' stderr files)"
    )


# -- the test ------------------------------------------------------------


async def check_workflows(
    client: Client, runs: Sequence[tuple[DurableRun, RunResult[Any]]]
) -> str:
    """Each workflow replays, no workflow task failed; Temporal's tally."""
    replayer = Replayer(workflows=[TurnWorkflow], workflow_runner=workflow_runner())
    counts: Counter[str] = Counter()
    for run, _ in runs:
        history = await history_of(client, run)
        failed = task_failures(history)
        assert not failed, (run.workflow_id, run.handle.result_run_id, failed)
        for e in history.events:
            if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT:
                counts["workflow tasks timed out"] += 1
            elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
                attempt = e.activity_task_started_event_attributes.attempt
                counts["activities retried"] += attempt > 1
        # A full garbage collection inside the replay (hundreds of thousands
        # of objects after the crash runs, on a busy machine) held it past
        # Temporal's 2-second deadlock check: collected first, then held off.
        gc.collect()
        gc.disable()
        try:
            await replayer.replay_workflow(history)
        finally:
            gc.enable()
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))


@pytest.mark.slow
@pytest.mark.parametrize("steps", ["activities", "local activities"])
async def test_durable_runs_survive_sigkill(
    temporal_address: str, tmp_path: Path, steps: str
) -> None:
    options, kills, delay = (
        (OPTIONS, KILLS, MAX_DELAY)
        if steps == "activities"
        else (LOCAL, LOCAL_KILLS, LOCAL_MAX_DELAY)
    )
    client = await Client.connect(temporal_address)
    queue = f"crash-{os.getpid()}-{time.monotonic_ns()}"
    session_id = f"ses_{queue.replace('-', '')}"
    for name in ("effects", "attempts"):
        (tmp_path / name).touch()
    tally = Tally()
    workers = Workers(temporal_address, queue, tmp_path, tally)
    finished = anyio.Event()
    started = time.perf_counter()
    try:
        async with anyio.create_task_group() as group:
            group.start_soon(
                kill_loop, workers, random.Random(SEED), finished, kills, delay
            )
            runs = await run_tasks(
                client, queue, session_id, tally, finished, options, kills
            )
    finally:
        with anyio.CancelScope(shield=True):
            await workers.stop_all()
    tally.seconds = time.perf_counter() - started
    assert tally.kills == kills

    # Every workflow completed, done, with the uninterrupted run's answer.
    reference = await _reference(tmp_path, tally.tasks)
    assert [r.outcome for _, r in runs] == ["done"] * tally.tasks
    assert tuple(r.text for _, r in runs) == reference.answers
    temporal = await check_workflows(client, runs)

    # Each side effect exactly once per call id; the tool ran at least as often.
    effects = Counter((tmp_path / "effects").read_text().split())
    attempts = Counter((tmp_path / "attempts").read_text().split())
    assert effects == reference.keys
    assert set(attempts) == set(effects)
    assert sum(attempts.values()) >= sum(effects.values())
    skipped = _marks(tmp_path, "=tool ")  # re-runs finding their effect applied
    rewritten = _marks(tmp_path, "!append")  # appends finding their entries there

    # The log: the uninterrupted run's history, every run replays and is done.
    store = SQLiteStore(tmp_path / "session.db")
    try:
        session = await Session.load(store, session_id)
    finally:
        await store.aclose()
    assert content(session.history) == reference.history
    check_history(session.history)
    assert [r.run_id for r in session.runs] == [r.run_id for _, r in runs]
    for run in session.runs:
        assert not run.is_open
        assert run.outcome == "done", run
        report = replay(default_machine(), session, run.run_id)
        assert report.ok, (run.run_id, report)
    temporal += f"; appends run again that found their entries written {rewritten}"
    print("\n" + tally.report(attempts, effects, skipped, temporal))
