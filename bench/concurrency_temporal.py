"""The concurrency bench's sessions as Temporal workflows (``--store temporal``).

`run_temporal` is one more backend of `bench.concurrency`: the same N
sessions of T model calls, each one durable run (one `TurnWorkflow`) of
the bench's agent (`bench.concurrency.build_agent`), on a Temporal server
with ``--workers`` (default 2) worker processes. This process is only the
client: it starts every session's run at once (`Agent.start_durable`) and
waits for all their results. The workers are subprocesses of it
(``python -m bench.concurrency_temporal ...``), each serving the same
agent on one task queue and writing one store: an SQLite file (several
processes append to it: WAL, ``BEGIN IMMEDIATE``) or, with
``--temporal-store postgres``, the PostgreSQL URL.

What it measures:

- throughput: model calls of all sessions / the wall time from the first
  start until the last result arrived at the client (the workers are up
  and polling before; stopping them and the check are not in it);
- turn latency, p50 / p99, by the workers' wall clock: each worker's hook
  (`WallClock`) stamps every model call as it starts (in its activity)
  and every run's end (in its workflow), by session, and prints them when
  it stops; a turn is one model call's start to the next one's (the last:
  to the run's end), whichever worker stamped them. It holds the model
  activity, the workflow task after it, the tool activity, the workflow
  task after that, and every queue in between (server, task queues, the
  workers' slots);
- the same latency by the log (the "by the log" column): each
  `EventRecorded` entry has an ``at`` from the workflow's clock
  (`workflow.now()`: the start of the workflow task that handled it), a
  turn from the entry deciding ``call_llm:k`` to the one deciding
  ``call_llm:k+1`` (the last: to `RunEnded`). With local activities
  (``--durable-option local_activities=true``) the steps a workflow task
  chains share that clock: only the workers' clock times them;
- peak RSS (``ru_maxrss``) and CPU seconds of each worker, which prints
  them when it stops; the client's own peak is the row's "peak RSS";
- the server's CPU seconds over the run, when its pid is known
  (``--temporal-dir``);
- the check: every session reopened from the store, compared with its
  script and replayed (`bench.concurrency.check_session`), and the
  workflow histories of three sessions replayed by a `Replayer`.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from datetime import timedelta
from pathlib import Path
from typing import IO, Any

import anyio
import attrs
from temporalio.client import Client
from temporalio.worker import Replayer, UnsandboxedWorkflowRunner

from bench.concurrency import (
    ROOT,
    Measurements,
    TurnClock,
    Workload,
    build_agent,
    first_input,
    peak_rss_mib,
    verify,
)
from turnfsm.hooks import RunEndInfo
from turnfsm.persistence import MemoryStore, SQLiteStore, new_id, open_store
from turnfsm.temporal import (
    DurableOptions,
    TurnWorkflow,
    create_worker,
    register,
    workflow_runner,
)

DEV_SERVER = ROOT / "scripts" / "temporal-dev"


# -- the workers ---------------------------------------------------------------


def settings(pairs: Sequence[str], kind: type) -> dict[str, Any]:
    """``KEY=VALUE`` strings as keyword arguments (values of `kind`).

    A worker option whose name ends in ``timeout`` is in seconds.
    """
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"{pair!r}: expected KEY=VALUE")
        key = key.replace("-", "_")
        if value.lower() in ("true", "false"):
            out[key] = value.lower() == "true"
        elif kind is int and key.endswith("timeout"):
            out[key] = timedelta(seconds=float(value))
        else:
            out[key] = kind(value)
    return out


class WallClock(TurnClock):
    """`TurnClock` by the wall clock, comparable across the workers' processes.

    A model call is stamped in its activity, a run's end in its workflow
    (an observing hook: never while Temporal replays).
    """

    now = staticmethod(time.time)

    def on_run_end(self, info: RunEndInfo) -> None:
        self.end(info.session_id)


def wall_latencies(figures: Sequence[dict[str, Any]]) -> list[float]:
    """Every turn's seconds from the workers' stamps (`WallClock`), merged."""
    clock = WallClock()
    for worker in figures:
        for session_id, times in worker.get("stamps", {}).items():
            clock.stamps[session_id].extend(times)
    return clock.latencies()


async def serve_worker(args: argparse.Namespace) -> dict[str, Any]:
    """Serve the bench's agent until stdin closes; return the process's figures."""
    workload = Workload(
        sessions=args.sessions,
        turns=args.turns,
        model_latency=args.model_latency_ms / 1000,
        model_url=args.model_url,
    )
    if args.store.startswith("postgresql://"):
        from turnfsm.persistence.postgres import PostgresStore

        store: Any = PostgresStore(args.store, max_size=args.pg_pool)
    else:
        store = open_store(args.store)
    clock = WallClock()
    agent = build_agent(workload, store, hooks=[clock])
    client = await Client.connect(args.address)
    options = settings(args.worker_option, int)
    if args.unsandboxed:
        options["workflow_runner"] = UnsandboxedWorkflowRunner()
    async with create_worker(client, args.task_queue, agent, **options):
        await anyio.Path(args.report).write_text("ready\n")
        await anyio.to_thread.run_sync(sys.stdin.read)  # until the bench closes it
    await store.aclose()
    usage = os.times()
    return {
        "rss": peak_rss_mib(),
        "cpu": usage.user + usage.system,
        "stamps": dict(clock.stamps),
    }


def worker_command(
    options: argparse.Namespace, store: str, queue: str, report: Path
) -> list[str]:
    command = [sys.executable, "-m", "bench.concurrency_temporal"]
    command += ["--report", str(report)]
    command += ["--address", options.temporal_address, "--task-queue", queue]
    command += ["--store", store, "--pg-pool", str(options.pg_pool)]
    command += ["--sessions", str(options.sessions), "--turns", str(options.turns)]
    command += ["--model-latency-ms", str(options.model_latency_ms)]
    if options.model_url:
        command += ["--model-url", options.model_url]
    for pair in options.worker_option:
        command += ["--worker-option", pair]
    if options.unsandboxed:
        command.append("--unsandboxed")
    return command


@contextlib.contextmanager
def workers(
    options: argparse.Namespace, store: str, queue: str, logs: Path
) -> Iterator[list[dict[str, Any]]]:
    """Start the worker processes, wait until each serves; yield their figures.

    The list fills when they stop (the end of the block): stdin closed,
    each finishes its tasks in hand and writes its figures to its report
    file. Their output goes to files, never to a pipe read only at the end:
    Temporal's core logs its warnings to stdout, and a full pipe blocks the
    worker's workflow thread for good.
    """
    figures: list[dict[str, Any]] = []
    procs: list[tuple[subprocess.Popen[str], IO[str]]] = []
    reports = [logs / f"worker{n}.report" for n in range(options.workers)]
    try:
        for n, report in enumerate(reports):
            log: IO[str] = (logs / f"worker{n}.log").open("w")
            proc = subprocess.Popen(
                worker_command(options, store, queue, report),
                cwd=ROOT,
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=subprocess.STDOUT,
                text=True,
            )
            procs.append((proc, log))
        for (proc, _), report in zip(procs, reports, strict=True):
            while not report.exists():
                if proc.poll() is not None:
                    raise SystemExit(f"a worker did not start: see {logs}")
                time.sleep(0.1)
        yield figures
    finally:
        for proc, _ in procs:
            assert proc.stdin is not None
            proc.stdin.close()
        for (proc, log), report in zip(procs, reports, strict=True):
            proc.wait(timeout=120)
            log.close()
            lines = report.read_text().splitlines() if report.exists() else []
            if proc.returncode == 0 and len(lines) > 1:
                figures.append(json.loads(lines[-1]))
        summarise_logs(logs, len(procs))


def summarise_logs(logs: Path, count: int) -> None:
    """Print each worker's log lines, counted by their first words."""
    for n in range(count):
        text = re.sub(r"\x1b\[[0-9;]*m", "", (logs / f"worker{n}.log").read_text())
        kinds = collections.Counter(
            re.sub(r"[0-9a-f-]{36}:\d+:\d+ |\d{4}-\S+Z ", "", line)[:90]
            for line in text.splitlines()
        )
        for line, times in kinds.most_common(8):
            print(f"worker {n} log: {times} x {line}", file=sys.stderr)


# -- the client ----------------------------------------------------------------


def server_cpu(directory: str | None) -> float | None:
    """CPU seconds the dev server in `directory` (``temporal-dev``) has used."""
    if directory is None or not (Path(directory) / "pid").exists():
        return None
    pid = (Path(directory) / "pid").read_text().strip()
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def start_all(
    client: Client,
    workload: Workload,
    queue: str,
    durable: DurableOptions,
    ids: Sequence[str],
) -> float:
    """Start every session's durable run at once, wait for all; return the wall."""
    agent = build_agent(workload, MemoryStore())  # the client only names it

    async def one(session_id: str, tag: str) -> None:
        run = await agent.start_durable(
            first_input(tag, workload.turns),
            client=client,
            task_queue=queue,
            session_id=session_id,
            options=durable,
        )
        result = await run.result()
        if not result.ok:
            raise RuntimeError(f"{session_id}: {result.outcome}: {result.error!r}")

    t0 = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for session_id, tag in zip(ids, workload.tags(), strict=True):
            tg.start_soon(one, session_id, tag)
    return time.perf_counter() - t0


async def replay_histories(
    client: Client, workload: Workload, queue: str, ids: Sequence[str]
) -> int:
    """Replay the workflow histories of the first, middle and last session."""
    register([build_agent(workload, MemoryStore())], task_queue=queue)
    replayer = Replayer(workflows=[TurnWorkflow], workflow_runner=workflow_runner())
    sample = sorted({ids[0], ids[len(ids) // 2], ids[-1]})
    for session_id in sample:
        handle = client.get_workflow_handle(f"turnfsm-{session_id}")
        await replayer.replay_workflow(await handle.fetch_history())
    return len(sample)


@contextlib.asynccontextmanager
async def reopened(options: argparse.Namespace, store: str) -> AsyncIterator[Any]:
    """A fresh store object on the workers' store (for the check)."""
    if options.temporal_store == "postgres":
        from turnfsm.persistence.postgres import PostgresStore

        async with PostgresStore(store, max_size=options.pg_pool) as fresh:
            yield fresh
    else:
        async with SQLiteStore(store.removeprefix("sqlite:///")) as fresh:
            yield fresh


async def run_temporal(workload: Workload, options: argparse.Namespace) -> Measurements:
    """The sessions as durable runs on ``--workers`` worker processes."""
    durable = DurableOptions(**settings(options.durable_option, float))
    queue = new_id("bench")
    ids = [f"{queue}-{tag}" for tag in workload.tags()]
    with tempfile.TemporaryDirectory(prefix="turnfsm-bench-temporal-") as tmp:
        if options.temporal_store == "postgres":
            store, pg = options.postgres_url, options.pg_pool
            what = f"PostgreSQL, pool max_size={pg} per worker"
        else:
            path = Path(tmp) / "sessions.db"
            await SQLiteStore(path).aclose()  # the schema, before the workers race
            store, what = f"sqlite:///{path}", "one SQLite file"
        client = await Client.connect(options.temporal_address)
        before = peak_rss_mib()
        with workers(options, store, queue, Path(tmp)) as figures:
            cpu0 = server_cpu(options.temporal_dir)
            wall = await start_all(client, workload, queue, durable, ids)
            cpu1 = server_cpu(options.temporal_dir)
        replayed = await replay_histories(client, workload, queue, ids)
        done = Measurements(
            backend="temporal",
            sessions=workload.sessions,
            turns=workload.turns,
            wall=wall,
            latencies=(),
            rss_before=before,
            rss_peak=peak_rss_mib(),
            session_ids=tuple(ids),
            worker_rss=tuple(f["rss"] for f in figures),
            worker_cpu=tuple(f["cpu"] for f in figures),
        )
        async with reopened(options, store) as fresh:
            checked = await verify(fresh, workload, done)
    server = ""
    if cpu0 is not None and cpu1 is not None:
        server = f"; server CPU {cpu1 - cpu0:.0f} s"
    note = (
        f"{options.workers} workers, {what}; {replayed} histories replayed;"
        f" worker options {settings(options.worker_option, int) or 'default'}"
        f"{', unsandboxed' if options.unsandboxed else ''};"
        f" {durable}{server}"
    )
    latencies = wall_latencies(figures)
    if len(latencies) != workload.sessions * workload.turns:  # a worker lost
        note += f"; {len(latencies)} turns stamped: latencies by the log"
        latencies = list(checked.log_latencies)
    return attrs.evolve(checked, latencies=tuple(latencies), note=note)


# -- the worker's command line -------------------------------------------------


def add_options(parser: argparse.ArgumentParser) -> None:
    """The options of ``--store temporal`` (the bench's and the workers')."""
    group = parser.add_argument_group("--store temporal")
    group.add_argument("--workers", type=int, default=2, help="worker processes")
    group.add_argument(
        "--temporal-address", default=None, help="a server (else a private one)"
    )
    group.add_argument(
        "--temporal-dir",
        default=None,
        help="a scripts/temporal-dev directory: its server, or one started there",
    )
    group.add_argument(
        "--temporal-store", choices=("sqlite", "postgres"), default="sqlite"
    )
    group.add_argument(
        "--worker-option",
        action="append",
        default=[],
        metavar="KEY=INT",
        help="a temporalio Worker option, e.g. max_concurrent_activities=200"
        " (a *timeout in seconds)",
    )
    group.add_argument(
        "--durable-option",
        action="append",
        default=[],
        metavar="KEY=SECONDS",
        help="a DurableOptions field, e.g. heartbeat_timeout=30",
    )
    group.add_argument("--unsandboxed", action="store_true", help="no sandbox")


def main(argv: Sequence[str]) -> None:
    """A worker process: serve the bench's agent until stdin closes."""
    parser = argparse.ArgumentParser(description="a worker of --store temporal")
    parser.add_argument("--address", required=True)
    parser.add_argument("--report", required=True, help="ready, then the figures")
    parser.add_argument("--task-queue", required=True)
    parser.add_argument("--store", required=True, help="sqlite:///PATH or a PG URL")
    parser.add_argument("--pg-pool", type=int, default=10)
    parser.add_argument("--sessions", type=int, required=True)
    parser.add_argument("--turns", type=int, required=True)
    parser.add_argument("--model-latency-ms", type=float, default=0.0)
    parser.add_argument("--model-url", default=None)
    parser.add_argument("--worker-option", action="append", default=[])
    parser.add_argument("--unsandboxed", action="store_true")
    args = parser.parse_args(argv)
    figures = anyio.run(serve_worker, args, backend="asyncio")
    with Path(args.report).open("a") as report:
        report.write(json.dumps(figures) + "\n")


@contextlib.contextmanager
def temporal_server(args: argparse.Namespace) -> Iterator[None]:
    """Set ``args.temporal_address`` (and ``temporal_dir``): a server to use.

    ``--temporal-address`` as it is; else the server of ``--temporal-dir``
    (started there if none is); else a private one, stopped at the end.
    """
    if args.temporal_address:
        yield
        return
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env["PATH"]])
    directory = args.temporal_dir
    if directory and (Path(directory) / "address").exists():
        args.temporal_address = (Path(directory) / "address").read_text().strip()
        print(f"note: Temporal server {args.temporal_address} ({directory})")
        yield
        return
    own = directory is None
    directory = directory or tempfile.mkdtemp(prefix="turnfsm-bench-temporal-")
    started = subprocess.run(
        ["bash", str(DEV_SERVER), "start", directory],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if started.returncode != 0:
        raise SystemExit(f"temporal-dev: {started.stderr.strip()}")
    args.temporal_address, args.temporal_dir = started.stdout.strip(), directory
    print(f"note: a private Temporal dev server, {args.temporal_address}")
    try:
        yield
    finally:
        if own:
            subprocess.run(["bash", str(DEV_SERVER), "stop", directory], check=False)


if __name__ == "__main__":
    main(sys.argv[1:])
