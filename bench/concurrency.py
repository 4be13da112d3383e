"""Many sessions served at once by one process, sharing one store.

N sessions (default 1,000) start together in one anyio task group and run
on ONE `Driver` and ONE store object. Each session is one run of T model
calls (default 20): T-1 tool-calling turns, then a final answer. The model
is a scripted `FakeModelClient` (deterministic; instant, or after
``--model-latency-ms``), the tool an async function tool that hashes its
arguments. Every message of a session carries the session's tag
(``[s00042]`` in its text, ``s00042-c7`` as its tool call id), so cross-talk
cannot hide: the model checks that each request holds only its session's
messages, and after the run every session is reopened from the store with a
fresh store object (`Session.load`), its history compared part by part with
its script, and its run replayed (`turnfsm.driver.replay`).

    python -m bench.concurrency                       # memory, sqlite, postgres
    python -m bench.concurrency --store sqlite --sessions 200 --turns 6
    python -m bench.concurrency --model-latency-ms 5
    python -m bench.concurrency --store postgres --postgres-url URL
    python -m bench.concurrency --store sqlite --store temporal --sessions 100

Run it from the repository root: it benches the checkout it is in.

What it measures, per store:

- throughput: model calls (turns) of all sessions / the wall time from the
  spawning of the first session until the last run returned (opening the
  store and the check afterwards are not in it);
- turn latency, p50 / p99 (nearest rank): in each session, the time from
  the start of one model call (the `on_model_call_start` hook) to the start
  of the next, and for the last turn to the return of `Driver.run`. It holds
  the model call, the tool call, the driver's appends to the store and the
  waits for the event loop while the other sessions' turns run: with every
  session runnable, it is mostly that queue (about N / throughput);
- peak RSS: ``ru_maxrss``, the process's peak. Each store runs in a fresh
  subprocess of this script, so it is that store's run; the RSS after the
  imports and a warm-up (before the run) is shown beside it;
- the ratios: each subprocess runs the same sessions on a `MemoryStore`
  right after its own store (same process, same minute); the "x memory"
  columns are against that baseline (the project reports speed as ratios
  against a baseline in the same process, never as timed unit tests).

PostgreSQL: ``--postgres-url``, else ``TURNFSM_TEST_POSTGRES_URL``, else a
private cluster (``scripts/pg-test-cluster``, stopped at the end); the
store's tables go to a schema of their own, dropped at the end.

Every backend's sessions are also timed by their log: `log_latencies`, from
the ``at`` of the entry deciding one model call to the next (the "by the
log" column). ``--store temporal``, the same sessions as durable runs on
Temporal worker processes, is `bench.concurrency_temporal`: its workers
stamp the turns by the wall clock (its docstring says what it measures).

Another backend is one more `Backend`, an async function of (`Workload`,
the parsed options) returning `Measurements`, added to `BACKENDS`; the
session script (`first_input`, `answer`, `work`, `expected_history`,
`content`), the agent (`build_agent`) and the check (`check_session`) are
importable from this module.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import gc
import hashlib
import io
import itertools
import json
import math
import os
import pstats
import resource
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import attrs

from turnfsm import Agent, Driver
from turnfsm.context import ContextManager
from turnfsm.core import MachineSpec
from turnfsm.driver import replay
from turnfsm.hooks import Hook, ModelCallInfo
from turnfsm.messages import Message, Role, TextPart, ToolCallPart, ToolResultPart
from turnfsm.persistence import (
    EventRecorded,
    MemoryStore,
    RunEnded,
    Session,
    SessionStore,
    SQLiteStore,
    new_id,
)
from turnfsm.providers import ModelRequest, OpenAIModel
from turnfsm.testing import FakeModelClient, reply, tool_call

ROOT = Path(__file__).resolve().parent.parent
STORES = ("memory", "sqlite", "postgres")


# -- the session script --------------------------------------------------------


@attrs.frozen(kw_only=True)
class Workload:
    """What every backend runs: `sessions` sessions of `turns` model calls."""

    sessions: int = 1_000
    turns: int = 20
    model_latency: float = 0.0  # seconds the model waits before each reply
    model_url: str | None = None  # an OpenAI-compatible server (bench.fake_openai)

    def tags(self) -> list[str]:
        width = max(5, len(str(self.sessions - 1)))
        return [f"s{i:0{width}d}" for i in range(self.sessions)]


def first_input(tag: str, turns: int) -> str:
    """The session's task: its only user message."""
    return f"[{tag}] take {turns - 1} steps, then answer"


def step_text(tag: str, step: int) -> str:
    return f"[{tag}] step {step}"


def final_text(tag: str, turns: int) -> str:
    return f"[{tag}] done after {turns - 1} steps"


def call_id(tag: str, step: int) -> str:
    return f"{tag}-c{step}"


def work_result(tag: str, step: int) -> str:
    """What the tool returns for `step` of session `tag`."""
    digest = hashlib.sha256(f"{tag}:{step}".encode()).hexdigest()[:16]
    return f"[{tag}] {step} {digest}"


async def work(tag: str, step: int) -> str:
    """Hash a step of a session (the tool's tiny amount of real work).

    Args:
        tag: The session's tag.
        step: The step.
    """
    return work_result(tag, step)


class CrossTalk(AssertionError):
    """A session saw, or stored, something that is not its own script."""


def _belongs(message: Message, tag: str) -> bool:
    for part in message.parts:
        if isinstance(part, TextPart) and not part.text.startswith(f"[{tag}]"):
            return False
        if isinstance(part, ToolCallPart) and not part.id.startswith(f"{tag}-"):
            return False
        if isinstance(part, ToolResultPart) and not part.call_id.startswith(f"{tag}-"):
            return False
    return True


def answer(messages: Sequence[Message], turns: int) -> Message:
    """The scripted reply to a request: from its last message, checked first.

    The last message names the session (its tag) and the step; every message
    of the request must be that session's, and there must be exactly as many
    as its script has said by then.
    """
    last = messages[-1]
    if last.role is Role.USER:
        tag, step = last.text[1:].partition("]")[0], 0
    else:
        tag, _, n = last.tool_results[-1].call_id.rpartition("-c")
        step = int(n) + 1
    strangers = [m for m in messages if not _belongs(m, tag)]
    if strangers or len(messages) != 1 + 2 * step:
        raise CrossTalk(
            f"session {tag} step {step}: a request of {len(messages)} messages"
            f" (expected {1 + 2 * step}), not its own: {strangers[:2]!r}"
        )
    if step == turns - 1:
        return reply(final_text(tag, turns))
    call = tool_call("work", call_id(tag, step), tag=tag, step=step)
    return reply(step_text(tag, step), call)


Content = tuple[str, tuple[tuple[object, ...], ...]]


def content(message: Message) -> Content:
    """A message without its id: its role and parts, comparable across stores."""
    parts: list[tuple[object, ...]] = []
    for part in message.parts:
        match part:
            case TextPart():
                parts.append(("text", part.text))
            case ToolCallPart():
                parts.append(("call", part.id, part.name, part.arguments_json()))
            case ToolResultPart():
                parts.append(("result", part.call_id, part.content, part.is_error))
            case _:
                parts.append(("other", repr(part)))
    return message.role.value, tuple(parts)


def expected_history(tag: str, turns: int) -> list[Content]:
    """The committed history a finished session `tag` must have, exactly."""
    out: list[Content] = [("user", (("text", first_input(tag, turns)),))]
    for step in range(turns - 1):
        cid = call_id(tag, step)
        args = json.dumps({"step": step, "tag": tag}, separators=(",", ":"))
        out.append(
            ("assistant", (("text", step_text(tag, step)), ("call", cid, "work", args)))
        )
        out.append(("tool", (("result", cid, work_result(tag, step), False),)))
    out.append(("assistant", (("text", final_text(tag, turns)),)))
    return out


def check_session(session: Session, tag: str, turns: int, spec: MachineSpec) -> None:
    """Raise `CrossTalk` unless `session` is exactly its script, and replays.

    Its history must equal `expected_history` part by part, its log must
    hold one run only (done, `turns` turns), and that run must replay.
    """
    got = [content(m) for m in session.history]
    want = expected_history(tag, turns)
    if got != want:
        at = next(
            (i for i, (g, w) in enumerate(zip(got, want, strict=False)) if g != w),
            min(len(got), len(want)),
        )
        raise CrossTalk(
            f"{session.id}: history differs at message {at} of {len(want)}"
            f" (got {len(got)}): {got[at : at + 1]!r} != {want[at : at + 1]!r}"
        )
    runs = session.runs
    if len(runs) != 1 or runs[0].outcome != "done" or len(runs[0].turns) != turns:
        raise CrossTalk(
            f"{session.id}: runs {[(r.outcome, len(r.turns)) for r in runs]}"
        )
    # Session-wide entries (the stored machine) belong to no run: "".
    if {e.run_id for e in session.entries} - {""} != {runs[0].run_id}:
        raise CrossTalk(f"{session.id}: entries of another run in its log")
    report = replay(spec, session, runs[0].run_id)
    if not report.ok:
        raise CrossTalk(f"{session.id}: replay {report.divergence or 'history'}")


# -- the driver and its clock --------------------------------------------------


class TurnClock(Hook):
    """Stamps each session's model calls (and its run's end), by session id."""

    now = staticmethod(time.perf_counter)

    def __init__(self) -> None:
        self.stamps: defaultdict[str, list[float]] = defaultdict(list)

    def on_model_call_start(self, info: ModelCallInfo) -> None:
        if info.purpose == "turn":
            self.end(info.session_id)

    def end(self, session_id: str) -> None:
        self.stamps[session_id].append(self.now())

    def latencies(self) -> list[float]:
        """Every turn's seconds: model call start to the next (or the run's end)."""
        pairs = (itertools.pairwise(sorted(s)) for s in self.stamps.values())
        return [b - a for each in pairs for a, b in each]


def driver_options(workload: Workload, hooks: Sequence[Hook] = ()) -> dict[str, Any]:
    """The settings of the one driver every session of a run shares."""

    async def handle(request: ModelRequest) -> Message:
        model.requests.clear()  # it serves every session: keep no requests
        if workload.model_latency:
            await anyio.sleep(workload.model_latency)
        return answer(request.messages, workload.turns)

    model: Any = FakeModelClient(handle)
    if workload.model_url is not None:  # the same script, over HTTP
        model = OpenAIModel("fake", base_url=workload.model_url, api_key="none")
    return {
        "model": model,
        "tools": [work],
        # never compacts: no window line, no message-count line
        "context": ContextManager(context_window=100_000_000, max_messages=0),
        "max_turns": workload.turns,
        "hooks": hooks,
        "name": "bench-concurrency",  # how durable runs find it on the workers
    }


def build_driver(workload: Workload, hooks: Sequence[Hook] = ()) -> Driver:
    """The one driver every session of a run shares (one model, one tool)."""
    return Driver(**driver_options(workload, hooks))


def build_agent(
    workload: Workload, store: SessionStore, hooks: Sequence[Hook] = ()
) -> Agent:
    """The same driver as an `Agent` on `store` (what a Temporal worker serves)."""
    return Agent(store=store, **driver_options(workload, hooks))


def log_latencies(session: Session) -> list[float]:
    """Each turn's seconds by the log's clock: a ``call_llm`` decision to the next.

    From the ``at`` of the entry that decided the turn's model call to that
    of the next one (the last turn: to the run's end). In-process the clock
    is `time.time`; in a workflow, the start of the workflow task.
    """
    stamps = [
        e.at
        for e in session.entries
        if isinstance(e, EventRecorded) and e.decision.startswith("call_llm")
    ]
    stamps += [e.at for e in session.entries if isinstance(e, RunEnded)]
    return [b - a for a, b in itertools.pairwise(stamps)]


# -- the measurements ----------------------------------------------------------


def peak_rss_mib() -> float:
    """The process's peak resident set (``ru_maxrss`` is in KiB on Linux)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank `q` quantile (0 < q <= 1)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


@attrs.frozen(kw_only=True)
class Measurements:
    """One backend's run of a `Workload`; `verified` once the sessions are checked."""

    backend: str
    sessions: int
    turns: int  # model calls per session
    wall: float  # seconds, spawning to the last run's return
    latencies: tuple[float, ...] = attrs.field(repr=False)
    rss_before: float  # MiB, peak before the run
    rss_peak: float  # MiB, peak after it
    session_ids: tuple[str, ...] = attrs.field(repr=False, default=())
    verified: int = 0  # sessions reopened and checked
    log_latencies: tuple[float, ...] = attrs.field(repr=False, default=())
    worker_rss: tuple[float, ...] = ()  # MiB, each worker process's peak
    worker_cpu: tuple[float, ...] = ()  # CPU seconds of each worker process
    note: str = ""

    @property
    def throughput(self) -> float:
        return self.sessions * self.turns / self.wall

    def summary(self) -> dict[str, Any]:
        """The figures, JSON-ready (what a subprocess reports)."""
        return {
            "backend": self.backend,
            "sessions": self.sessions,
            "turns": self.turns,
            "wall": self.wall,
            "throughput": self.throughput,
            "p50": percentile(self.latencies, 0.50),
            "p99": percentile(self.latencies, 0.99),
            "rss_before": self.rss_before,
            "rss_peak": self.rss_peak,
            "verified": self.verified,
            "log_p50": percentile(self.log_latencies, 0.50),
            "log_p99": percentile(self.log_latencies, 0.99),
            "worker_rss": self.worker_rss,
            "worker_cpu": self.worker_cpu,
            "note": self.note,
        }


# -- serving the sessions ------------------------------------------------------


async def serve(
    name: str, workload: Workload, store: SessionStore, *, profile: bool = False
) -> Measurements:
    """Run every session of `workload` at once on `store`, on one driver."""
    clock = TurnClock()
    driver = build_driver(workload, hooks=[clock])
    prefix = new_id("bench")  # a shared database may hold earlier runs
    tags = workload.tags()
    ids = [f"{prefix}-{tag}" for tag in tags]

    async def one(session_id: str, tag: str) -> None:
        session = Session(session_id, store=store)
        result = await driver.run(first_input(tag, workload.turns), session=session)
        clock.end(session_id)
        if not result.ok:
            raise RuntimeError(f"{session_id}: {result.outcome}: {result.error!r}")

    gc.collect()
    before = peak_rss_mib()
    profiler = cProfile.Profile() if profile else None
    with profiled(profiler):
        t0 = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for session_id, tag in zip(ids, tags, strict=True):
                tg.start_soon(one, session_id, tag)
        wall = time.perf_counter() - t0
    latencies = clock.latencies()
    assert len(latencies) == workload.sessions * workload.turns, len(latencies)
    return Measurements(
        backend=name,
        sessions=workload.sessions,
        turns=workload.turns,
        wall=wall,
        latencies=tuple(latencies),
        rss_before=before,
        rss_peak=peak_rss_mib(),
        session_ids=tuple(ids),
    )


async def verify(
    store: SessionStore, workload: Workload, done: Measurements, *, note: str = ""
) -> Measurements:
    """Reopen every session of `done` from `store` and check it (`check_session`)."""
    spec = build_driver(workload).machine
    limiter = anyio.CapacityLimiter(16)
    latencies: list[float] = []

    async def check(session_id: str, tag: str) -> None:
        async with limiter:
            session = await Session.load(store, session_id)
        check_session(session, tag, workload.turns, spec)
        latencies.extend(log_latencies(session))

    async with anyio.create_task_group() as tg:
        for session_id, tag in zip(done.session_ids, workload.tags(), strict=True):
            tg.start_soon(check, session_id, tag)
    assert len(latencies) == workload.sessions * workload.turns, len(latencies)
    return attrs.evolve(
        done,
        verified=len(done.session_ids),
        log_latencies=tuple(latencies),
        note=note or done.note,
    )


@contextlib.contextmanager
def profiled(profiler: cProfile.Profile | None) -> Any:
    if profiler is None:
        yield
        return
    profiler.enable()
    try:
        yield
    finally:
        profiler.disable()
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(18)
        print(out.getvalue(), file=sys.stderr)


# -- the backends --------------------------------------------------------------

Backend = Callable[[Workload, argparse.Namespace], Awaitable[Measurements]]


async def run_memory(workload: Workload, options: argparse.Namespace) -> Measurements:
    store = MemoryStore()
    done = await serve("memory", workload, store, profile=options.profile)
    # A MemoryStore lives only in its object: reloaded from the same one.
    return await verify(store, workload, done, note="reloaded from the same object")


async def run_sqlite(workload: Workload, options: argparse.Namespace) -> Measurements:
    with tempfile.TemporaryDirectory(prefix="turnfsm-bench-conc-") as tmp:
        path = Path(tmp) / "sessions.db"
        async with SQLiteStore(path) as store:
            done = await serve("sqlite", workload, store, profile=options.profile)
        size = file_mib(Path(tmp))
        async with SQLiteStore(path) as fresh:
            return await verify(fresh, workload, done, note=f"file {size:.0f} MiB")


async def run_postgres(workload: Workload, options: argparse.Namespace) -> Measurements:
    from turnfsm.persistence.postgres import PostgresStore

    url, pool = options.postgres_url, options.pg_pool
    async with PostgresStore(url, max_size=pool) as store:
        done = await serve("postgres", workload, store, profile=options.profile)
    async with PostgresStore(url, max_size=pool) as fresh:
        return await verify(fresh, workload, done, note=f"pool max_size={pool}")


def file_mib(directory: Path) -> float:
    """The size of the files in `directory` (the database and its WAL)."""
    return sum(p.stat().st_size for p in directory.iterdir()) / 2**20


async def run_temporal(workload: Workload, options: argparse.Namespace) -> Measurements:
    from bench.concurrency_temporal import run_temporal

    return await run_temporal(workload, options)


BACKENDS: dict[str, Backend] = {
    "memory": run_memory,
    "sqlite": run_sqlite,
    "postgres": run_postgres,
    "temporal": run_temporal,  # bench.concurrency_temporal
}


# -- the subprocess: one backend, then the baseline ----------------------------


def child(args: argparse.Namespace) -> None:
    """Run one backend, then the memory baseline; print both as one JSON line."""
    workload = workload_of(args)
    name = args.store[0]

    async def go() -> dict[str, Any]:
        warm = Workload(sessions=20, turns=3)
        await run_memory(warm, argparse.Namespace(profile=False))
        own = await BACKENDS[name](workload, args)
        args.profile = False
        base = own if name == "memory" else await run_memory(workload, args)
        return {"run": own.summary(), "baseline": base.summary()}

    print(json.dumps(anyio.run(go, backend="asyncio")))


# -- the report ----------------------------------------------------------------


def workload_of(args: argparse.Namespace) -> Workload:
    return Workload(
        sessions=args.sessions,
        turns=args.turns,
        model_latency=args.model_latency_ms / 1000,
        model_url=args.model_url,
    )


@contextlib.contextmanager
def postgres_url(args: argparse.Namespace) -> Any:
    """Yield a conninfo to a fresh schema (or None, with the reason printed)."""
    from bench.store import Postgres

    if args.postgres_url:
        os.environ["TURNFSM_TEST_POSTGRES_URL"] = args.postgres_url
    pg = Postgres()
    if not pg.start():
        print(f"note: PostgreSQL skipped: {pg.note}")
        yield None
        return
    print(f"note: {pg.note}")
    try:
        yield pg.scoped
    finally:
        pg.stop()


def run_child(args: argparse.Namespace, name: str, url: str | None) -> dict[str, Any]:
    command = [sys.executable, "-m", "bench.concurrency", "--child", "--store", name]
    command += ["--sessions", str(args.sessions), "--turns", str(args.turns)]
    command += ["--model-latency-ms", str(args.model_latency_ms)]
    command += ["--pg-pool", str(args.pg_pool)]
    if args.model_url:
        command += ["--model-url", args.model_url]
    if url is not None:
        command += ["--postgres-url", url]
    if name == "temporal":
        command += temporal_arguments(args)
    if args.profile:
        command.append("--profile")
    t0 = time.perf_counter()
    done = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, check=False
    )
    elapsed = time.perf_counter() - t0
    if done.stderr.strip():
        print(done.stderr.rstrip(), file=sys.stderr)
    if done.returncode != 0:
        raise SystemExit(f"{name}: the subprocess failed ({done.returncode})")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    result["elapsed"] = elapsed
    return result


def temporal_arguments(args: argparse.Namespace) -> list[str]:
    """The ``--store temporal`` options, for the subprocess."""
    command = ["--workers", str(args.workers)]
    command += ["--temporal-address", args.temporal_address]
    command += ["--temporal-store", args.temporal_store]
    if args.temporal_dir:
        command += ["--temporal-dir", args.temporal_dir]
    for pair in args.worker_option:
        command += ["--worker-option", pair]
    for pair in args.durable_option:
        command += ["--durable-option", pair]
    if args.unsandboxed:
        command.append("--unsandboxed")
    return command


def table(results: Sequence[dict[str, Any]]) -> str:
    head = (
        "| store | sessions x turns | run wall (s) | turns/s | turns/s x memory"
        " | p50 turn (ms) | p99 turn (ms) | p99 x memory | peak RSS (MiB)"
        " | RSS before run (MiB) | p50 / p99 by the log (ms) | workers' peak RSS"
        " (MiB) | workers' CPU (s) | reopened + checked | subprocess wall (s)"
        " | note |"
    )
    lines = [head, "|" + "---|" * head.count(" | ") + "---|"]
    for r in results:
        run, base = r["run"], r["baseline"]
        lines.append(
            f"| {run['backend']} | {run['sessions']:,} x {run['turns']}"
            f" | {run['wall']:.2f} | {run['throughput']:,.0f}"
            f" | {run['throughput'] / base['throughput']:.2f}"
            f" | {run['p50'] * 1e3:.1f} | {run['p99'] * 1e3:.1f}"
            f" | {run['p99'] / base['p99']:.2f} | {run['rss_peak']:.0f}"
            f" | {run['rss_before']:.0f}"
            f" | {run['log_p50'] * 1e3:.1f} / {run['log_p99'] * 1e3:.1f}"
            f" | {' / '.join(f'{x:.0f}' for x in run['worker_rss']) or '-'}"
            f" | {' / '.join(f'{x:.0f}' for x in run['worker_cpu']) or '-'}"
            f" | {run['verified']:,}"
            f" | {r['elapsed']:.1f} | {run['note']} |"
        )
    by = {r["run"]["backend"]: r["run"] for r in results}
    if "temporal" in by and "sqlite" in by:
        t, s = by["temporal"], by["sqlite"]
        lines.append("")
        lines.append(
            f"temporal / sqlite: turns/s x{t['throughput'] / s['throughput']:.3f},"
            f" p50 x{t['p50'] / s['log_p50']:.1f}, p99 x{t['p99'] / s['log_p99']:.1f}"
            " (latencies by the log on both)"
        )
    return "\n".join(lines)


def parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", action="append", choices=sorted(BACKENDS))
    parser.add_argument("--sessions", type=int, default=1_000)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--model-latency-ms", type=float, default=0.0)
    parser.add_argument("--postgres-url", default=None)
    parser.add_argument(
        "--model-url",
        default=None,
        help="an OpenAI-compatible server playing the"
        " script (python -m bench.fake_openai); default: the model in-process",
    )
    parser.add_argument("--pg-pool", type=int, default=10, help="pool max_size")
    parser.add_argument("--profile", action="store_true", help="cProfile each run")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    with contextlib.suppress(ImportError):  # temporalio: turnfsm[temporal]
        from bench.concurrency_temporal import add_options

        add_options(parser)
    args = parser.parse_args(argv)
    if args.turns < 2 or args.sessions < 1:
        parser.error("--turns must be >= 2 and --sessions >= 1")
    return args


def main(argv: Sequence[str]) -> None:
    args = parse(argv)
    if args.child:
        child(args)
        return
    stores = list(args.store or STORES)
    print(
        f"turnfsm concurrency bench: {args.sessions:,} sessions x {args.turns}"
        f" turns at once, one process, one driver, one store object;"
        f" model latency {args.model_latency_ms:g} ms"
    )
    results = []
    with contextlib.ExitStack() as stack:
        url = None
        if "postgres" in stores or (
            "temporal" in stores and args.temporal_store == "postgres"
        ):
            url = stack.enter_context(postgres_url(args))
            if url is None:
                stores = [s for s in stores if s != "postgres"]
        if "temporal" in stores:
            from bench.concurrency_temporal import temporal_server

            stack.enter_context(temporal_server(args))
        for name in stores:
            results.append(run_child(args, name, url))
            print(f"  {name}: done in {results[-1]['elapsed']:.1f} s", flush=True)
    print()
    print(table(results))


if __name__ == "__main__":
    if not __package__:  # `python bench/concurrency.py`: `bench` must import
        sys.path.insert(1, str(ROOT))
    main(sys.argv[1:])
