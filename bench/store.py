"""Per-turn store cost of a long session: Memory, SQLite, PostgreSQL, LangGraph.

Everything runs in this process, against the same instant scripted model
(`turnfsm.testing.FakeModelClient`: one tool call per reply until the last
turn) and the same instant async tool, with a context window so large that
nothing ever compacts. A "turn" is one tool turn of the real `Driver`: the
model call, the tool call and the entries the driver appends for them (a
`TurnRecord` and the `Measured` / `ModelReplied` / `ToolsFinished` events, in
two appends: the measurement rides the reply's; a lone tool call needs no
separate `ToolResultRecorded`).

    python bench/store.py                    # 10,000 turns
    python bench/store.py --turns 2000       # a shorter run
    python bench/store.py --no-postgres --no-langgraph --no-profile

It reports, in one run:

- the driver on each store: µs per turn (the mean over the run), the mean of
  the first 100 vs the last 100 turns (flatness), and the store's share:
  (driver on store X) - (driver on `MemoryStore`). The baseline rows are a
  hand-written agent loop (model, tool, list append) and the driver on
  `MemoryStore` (= 1.0x);
- the raw store cost: the entries a real turn produces (taken from a
  `MemoryStore` session's log, in the driver's own batches) appended straight
  to each store with ``store.append(...)``, against a plain ``list.extend``
  of the same batches (the floor);
- bytes stored per turn: the growth of the SQLite file (database + WAL after
  a checkpoint) and of PostgreSQL's ``pg_total_relation_size`` of the
  ``turnfsm_`` tables, next to the encoded payload (row bodies + message
  texts) per turn;
- a 1-turn run by a new driver (a server's agent made per request) on a
  10,000-message SQLite session against the same run on new sessions: µs
  and bytes per run (a run should not pay for its session's length);
- LangGraph's `SqliteSaver` (when ``langgraph-checkpoint-sqlite`` is
  installed; it is never a turnfsm dependency): a minimal `StateGraph` whose
  state is a growing message list, one node per step adding an AI message
  with a tool call and its tool message (our turn's conversation growth),
  checkpointed on a temporary file with ``durability="sync"`` (each step on
  disk before the next starts, as our appends are). Its checkpoints copy the
  whole state, so a step costs O(history): by default it runs
  ``min(turns, 2000)`` steps (``--langgraph-steps``), and the turnfsm
  figures it is compared with are taken at the same step numbers;
- what each statement of an SQLite append costs (``--no-statements`` to
  leave it out): a tool turn of the idempotent tool in one append, its
  statements timed one by one, and its entries' encoding;
- a cProfile hint for the SQLite (and PostgreSQL) driver runs: where a turn's
  store time goes.

PostgreSQL: ``TURNFSM_TEST_POSTGRES_URL`` when set, else a private cluster
started with ``scripts/pg-test-cluster`` (stopped at the end); skipped with a
note when neither works. The store's tables go to a schema of their own,
dropped at the end. Each figure is the best of ``--repeats`` runs (the
machine may be shared); PostgreSQL's of ``--pg-repeats`` (default 1: they
are the slow ones). The raw table also shows what the same entries would
cost in one append per turn (one transaction instead of the driver's two).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import gc
import io
import itertools
import operator
import os
import pstats
import secrets
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path
from typing import Annotated, Any, TypedDict

import anyio

from turnfsm import Driver
from turnfsm.context import ContextManager
from turnfsm.driver import function_tool
from turnfsm.messages import Message, MessageLog
from turnfsm.persistence import Entry, MemoryStore, Session, SessionStore, SQLiteStore
from turnfsm.persistence._rows import encode
from turnfsm.persistence._sqlite_open import CHECKPOINT_PAGES
from turnfsm.persistence._store import SessionInfo
from turnfsm.providers import ModelRequest
from turnfsm.testing import FakeModelClient, reply, tool_call

ROOT = Path(__file__).resolve().parent.parent
GOAL_SQLITE_US = 300.0
GOAL_FLAT = 1.2
WINDOW = 100  # turns at each end for the flatness ratio
LANGGRAPH_DEFAULT_CAP = 2_000
PROFILE_TURNS = 2_000
STATEMENT_TURNS = 10_000


# -- the agent: an instant model, an instant tool --------------------------


class Clock:
    """The model's handler: a tool call per reply until `turns`, then an answer.

    Stamps each call: the gap between two calls is one whole tool turn.
    """

    def __init__(self, turns: int) -> None:
        self.turns = turns
        self.stamps: list[float] = []

    def __call__(self, _request: object) -> Message:
        self.stamps.append(time.perf_counter())
        if len(self.stamps) < self.turns:
            return reply("", tool_call("noop"))
        return reply("done")


async def noop() -> str:
    """Do nothing, at once."""
    return "ok"


def make_driver(clock: Clock, *, idempotent: bool = False) -> Driver:
    """The bench's driver; `idempotent`: its tool is marked safe to run twice."""
    return Driver(
        model=FakeModelClient(clock),
        tools=[function_tool(noop, idempotent=idempotent)],
        # never compacts: no window line, no message-count line
        context=ContextManager(context_window=100_000_000, max_messages=0),
        max_turns=clock.turns + 1,
    )


async def drive(
    store: SessionStore, turns: int, *, idempotent: bool = False
) -> tuple[Session, list[float]]:
    """Run one `turns`-turn session on `store`; return it and the turn gaps.

    `idempotent`: the tool is marked safe to run twice, so its results ride
    the next reply's append (one append per tool turn instead of two).
    """
    clock = Clock(turns)
    session = Session(store=store)
    result = await make_driver(clock, idempotent=idempotent).run("go", session=session)
    assert result.ok, result.error
    (run,) = session.runs
    assert len(run.turns) == turns, len(run.turns)
    assert not run.compactions, "the session compacted: the window is too small"
    return session, gaps(clock.stamps)


IDEMPOTENT = ", idempotent tool"
"""The driver rows whose tool is safe to run twice: one append per tool turn."""

LONG_SESSION_MESSAGES = 10_000
LONG_SESSION_RUNS = 10


async def long_session_runs(tmp: Path) -> tuple[float, float, float, float]:
    """1-turn runs, each by a new driver (a server's agent per request), on SQLite.

    On a session of `LONG_SESSION_MESSAGES` messages and on new sessions:
    the median µs and the bytes the file grows by per run, for each.
    """

    async def one(session: Session) -> float:
        clock = Clock(1)
        start = time.perf_counter()
        result = await make_driver(clock).run("again", session=session)
        elapsed = time.perf_counter() - start
        assert result.ok, result.error
        return elapsed

    path = tmp / "long-session.db"
    async with SQLiteStore(path) as store:
        long = Session(store=store)
        await make_driver(Clock(LONG_SESSION_MESSAGES // 2)).run("go", session=long)
        before = sqlite_bytes(path)
        times = [await one(long) for _ in range(LONG_SESSION_RUNS)]
        long_bytes = (sqlite_bytes(path) - before) / LONG_SESSION_RUNS
    path.unlink()
    path = tmp / "new-sessions.db"
    async with SQLiteStore(path) as store:
        await one(Session(store=store))  # the file's own first pages
        before = sqlite_bytes(path)
        fresh = [await one(Session(store=store)) for _ in range(LONG_SESSION_RUNS)]
        fresh_bytes = (sqlite_bytes(path) - before) / LONG_SESSION_RUNS
    path.unlink()
    return (
        statistics.median(times) * 1e6,
        long_bytes,
        statistics.median(fresh) * 1e6,
        fresh_bytes,
    )


def gaps(stamps: Sequence[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise(stamps)]


async def hand_loop(turns: int) -> list[float]:
    """The baseline agent loop anyone would write: model, tool, list append."""
    clock = Clock(turns)
    model = FakeModelClient(clock)
    tools = {"noop": noop}
    # A MessageLog appends in O(1) and goes into the request without a copy
    # (a plain list would be copied per request): the baseline stays flat.
    messages = MessageLog([Message.user("go")])
    while True:
        answer = (await model.complete(ModelRequest(messages=messages))).message
        messages = messages.append(answer)
        if not answer.tool_calls:
            return gaps(clock.stamps)
        for call in answer.tool_calls:
            output = await tools[call.name]()
            messages = messages.append(Message.tool_result(call.id, output))


# -- the figures -------------------------------------------------------------


class Figures:
    """Per-turn seconds of one run: its mean, and its first and last window."""

    def __init__(self, per_turn: Sequence[float], window: int = WINDOW) -> None:
        assert len(per_turn) >= 2 * window, "too few turns for the flatness window"
        self.per_turn = list(per_turn)
        self.mean = statistics.fmean(per_turn)
        self.head = statistics.fmean(per_turn[:window])
        self.tail = statistics.fmean(per_turn[-window:])

    @property
    def flat(self) -> float:
        return self.tail / self.head

    def at(self, stop: int, window: int = WINDOW) -> tuple[float, float]:
        """Mean of the first window and of the window ending at turn `stop`."""
        return self.head, statistics.fmean(self.per_turn[stop - window : stop])


def best(runs: Sequence[Figures]) -> Figures:
    """Best of several runs, figure by figure (per turn: the least of each)."""
    per_turn = [min(values) for values in zip(*(r.per_turn for r in runs), strict=True)]
    out = Figures(per_turn)
    out.mean = min(r.mean for r in runs)
    out.head = min(r.head for r in runs)
    out.tail = min(r.tail for r in runs)
    return out


# -- the stores under test ---------------------------------------------------


class Recorder:
    """A `SessionStore` that remembers every append, and in which turn it came."""

    def __init__(self, clock: Clock) -> None:
        self.inner = MemoryStore()
        self.clock = clock
        self.batches: list[tuple[int, tuple[Entry, ...]]] = []

    async def append(
        self, session_id: str, entries: Sequence[Entry], *, expected_version: int
    ) -> int:
        self.batches.append((len(self.clock.stamps), tuple(entries)))
        return await self.inner.append(
            session_id, entries, expected_version=expected_version
        )

    async def load(self, session_id: str) -> tuple[Entry, ...]:
        return await self.inner.load(session_id)

    async def list_sessions(self) -> tuple[SessionInfo, ...]:
        return await self.inner.list_sessions()


async def capture(turns: int) -> list[tuple[int, tuple[Entry, ...]]]:
    """The driver's appends of a `turns`-turn session, tagged with their turn."""
    clock = Clock(turns)
    recorder = Recorder(clock)
    result = await make_driver(clock).run("go", session=Session(store=recorder))
    assert result.ok, result.error
    return recorder.batches


def tool_turns(
    batches: Sequence[tuple[int, tuple[Entry, ...]]], turns: int
) -> list[list[tuple[Entry, ...]]]:
    """The batches of tool turns 1 .. turns-1 (the run's opening and end apart).

    Turn k's batches are those appended after the k-th model call and before
    the next: the turn's record, its reply, its tool result, its end and the
    next request's measure (one gap between two model calls, as `drive` times).
    """
    out: list[list[tuple[Entry, ...]]] = [[] for _ in range(turns - 1)]
    for turn, entries in batches:
        if 1 <= turn < turns:
            out[turn - 1].append(entries)
    return out


async def replay(
    store: SessionStore, batches: Sequence[tuple[int, tuple[Entry, ...]]], turns: int
) -> Figures:
    """Append the recorded batches to a fresh session of `store`, timed by turn."""
    session_id = f"raw_{secrets.token_hex(6)}"
    version = 0
    per_turn = [0.0] * (turns - 1)
    clock = time.perf_counter
    for turn, entries in batches:
        t0 = clock()
        version = await store.append(session_id, entries, expected_version=version)
        if 1 <= turn < turns:
            per_turn[turn - 1] += clock() - t0
    return Figures(per_turn)


def one_append_per_turn(
    batches: Sequence[tuple[int, tuple[Entry, ...]]],
) -> list[tuple[int, tuple[Entry, ...]]]:
    """The same entries, each turn's batches joined into one append."""
    out: list[tuple[int, tuple[Entry, ...]]] = []
    for turn, entries in batches:
        if out and out[-1][0] == turn:
            out[-1] = (turn, out[-1][1] + entries)
        else:
            out.append((turn, entries))
    return out


def list_loop(batches: Sequence[tuple[int, tuple[Entry, ...]]], turns: int) -> Figures:
    """The floor: the same batches extended onto a plain list."""
    log: list[Entry] = []
    per_turn = [0.0] * (turns - 1)
    clock = time.perf_counter
    for turn, entries in batches:
        t0 = clock()
        log.extend(entries)
        if 1 <= turn < turns:
            per_turn[turn - 1] += clock() - t0
    return Figures(per_turn)


def payload(batches: Sequence[tuple[int, tuple[Entry, ...]]]) -> int:
    """Bytes of the encoded rows: bodies, plus each distinct message once."""
    seen: set[str] = set()
    total = 0
    for _turn, entries in batches:
        for entry in entries:
            row = encode(entry)
            total += len(row.body.encode())
            for digest, text in row.messages.items():
                if digest not in seen:
                    seen.add(digest)
                    total += len(text.encode())
    return total


def sqlite_bytes(path: Path) -> int:
    """The file's size with its WAL, after folding the WAL back in."""
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    wal = Path(f"{path}-wal")
    return path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)


# -- PostgreSQL --------------------------------------------------------------


class Postgres:
    """A database for the bench: the URL given, or a private cluster."""

    def __init__(self) -> None:
        self.url: str | None = None
        self.note = ""
        self._cluster: Path | None = None
        self._schema = f"turnfsm_bench_{secrets.token_hex(4)}"
        self.scoped: str | None = None

    def start(self) -> bool:
        try:
            import psycopg
            from psycopg.conninfo import make_conninfo

            import turnfsm.persistence.postgres  # noqa: F401
        except ImportError as exc:
            self.note = f"psycopg is not installed ({exc})"
            return False
        url = os.environ.get("TURNFSM_TEST_POSTGRES_URL")
        where = "TURNFSM_TEST_POSTGRES_URL"
        if not url:
            url, where = self._start_cluster(), "a private cluster (pg-test-cluster)"
            if url is None:
                return False
        try:
            with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
                conn.execute(f"CREATE SCHEMA {self._schema}")
                version = conn.execute("SHOW server_version").fetchone()
        except psycopg.Error as exc:
            self.note = f"cannot use {where}: {str(exc).strip().splitlines()[0]}"
            self.stop()
            return False
        self.url = url
        self.scoped = make_conninfo(url, options=f"-csearch_path={self._schema}")
        self.note = f"PostgreSQL {version[0] if version else '?'} via {where}"
        return True

    def _start_cluster(self) -> str | None:
        script = ROOT / "scripts" / "pg-test-cluster"
        parent = Path(tempfile.mkdtemp(prefix="turnfsm-bench-pg-"))
        parent.chmod(0o755)  # the server may run as `postgres`
        cluster = parent / "cluster"
        try:
            done = subprocess.run(
                [str(script), "start", str(cluster)],
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            self.note = f"pg-test-cluster could not start a cluster ({exc})"
            shutil.rmtree(parent, ignore_errors=True)
            return None
        self._cluster = cluster
        if done.returncode != 0:
            detail = (done.stderr.strip().splitlines() or ["no detail"])[-1]
            self.note = f"pg-test-cluster failed ({detail})"
            self.stop()
            return None
        return done.stdout.strip().splitlines()[-1]

    def size(self) -> int:
        """``pg_total_relation_size`` of the bench schema's turnfsm_ tables."""
        import psycopg

        assert self.url is not None
        with psycopg.connect(self.url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)"
                " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE c.relkind = 'r' AND n.nspname = %s"
                " AND c.relname LIKE 'turnfsm\\_%%'",
                (self._schema,),
            ).fetchone()
        return int(row[0]) if row else 0

    def stop(self) -> None:
        if self.url is not None and self._cluster is None:
            import psycopg

            with (
                contextlib.suppress(psycopg.Error),
                psycopg.connect(self.url, autocommit=True) as conn,
            ):
                conn.execute(f"DROP SCHEMA IF EXISTS {self._schema} CASCADE")
        if self._cluster is not None:
            subprocess.run(
                [str(ROOT / "scripts" / "pg-test-cluster"), "stop", str(self._cluster)],
                capture_output=True,
                check=False,
                timeout=120,
            )
            shutil.rmtree(self._cluster.parent, ignore_errors=True)
            self._cluster = None


@contextlib.asynccontextmanager
async def postgres_store(pg: Postgres) -> AsyncIterator[SessionStore]:
    from turnfsm.persistence.postgres import PostgresStore

    assert pg.scoped is not None
    async with PostgresStore(pg.scoped) as store:
        yield store


# -- LangGraph ---------------------------------------------------------------


def langgraph_available() -> str | None:
    """None if LangGraph's SqliteSaver imports, else why not."""
    try:
        import langgraph.checkpoint.sqlite  # noqa: F401
        from langgraph.graph import StateGraph  # noqa: F401
    except ImportError as exc:
        return (
            f"{exc} (python3 -m uv pip install -p {sys.executable} "
            "langgraph langgraph-checkpoint-sqlite)"
        )
    return None


class State(TypedDict):
    """The LangGraph state: the message list.

    Its reducer is ``operator.add``, the cheapest (``add_messages`` also
    merges by id, which costs more per step).
    """

    messages: Annotated[list[Any], operator.add]


def langgraph_run(steps: int, *, checkpoint: bool) -> tuple[Figures, int, list[int]]:
    """`steps` steps of a message-list StateGraph; figures, bytes, sizes per step.

    With `checkpoint`, a SqliteSaver on a temporary file (durability "sync");
    the sizes are each checkpoint's blob plus its pending writes, in order.
    """
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
    from langgraph.checkpoint.sqlite import SqliteSaver
    from langgraph.graph import END, START, StateGraph

    stamps: list[float] = []

    def step(_state: State) -> dict[str, list[Any]]:
        stamps.append(time.perf_counter())
        call_id = f"call_{secrets.token_hex(10)}"
        return {
            "messages": [
                AIMessage("", tool_calls=[{"id": call_id, "name": "noop", "args": {}}]),
                ToolMessage("ok", tool_call_id=call_id),
            ]
        }

    def route(_state: State) -> str:
        return END if len(stamps) >= steps + 1 else "step"

    graph = StateGraph(State)
    graph.add_node("step", step)
    graph.add_edge(START, "step")
    graph.add_conditional_edges("step", route)
    config: Any = {"configurable": {"thread_id": "t"}, "recursion_limit": steps + 10}
    with tempfile.TemporaryDirectory(prefix="turnfsm-bench-lg-") as tmp:
        path = Path(tmp) / "langgraph.db"
        conn = sqlite3.connect(path, check_same_thread=False)
        try:
            if checkpoint:
                saver = SqliteSaver(conn)
                saver.setup()
                before = sqlite_bytes(path)
                app = graph.compile(checkpointer=saver)
                app.invoke(
                    {"messages": [HumanMessage("go")]}, config, durability="sync"
                )
                size = sqlite_bytes(path) - before
                sizes = [
                    int(n)
                    for (n,) in conn.execute(
                        "SELECT length(c.checkpoint) + length(c.metadata)"
                        " + coalesce((SELECT sum(length(w.value)) FROM writes w"
                        "  WHERE w.checkpoint_id = c.checkpoint_id), 0)"
                        " FROM checkpoints c ORDER BY c.checkpoint_id"
                    )
                ]
            else:
                graph.compile().invoke({"messages": [HumanMessage("go")]}, config)
                size, sizes = 0, []
        finally:
            conn.close()
    return Figures(gaps(stamps)), size, sizes


# -- profiling ---------------------------------------------------------------


def profile_hint(run: Callable[[cProfile.Profile], None], turns: int) -> str:
    """The functions with the most own time, in µs per turn."""
    profiler = cProfile.Profile()
    run(profiler)
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    rows = []
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    total = sum(v[2] for v in raw.values())
    for (path, line, name), (_cc, calls, tottime, cumtime, _callers) in sorted(
        raw.items(), key=lambda kv: -kv[1][2]
    )[:14]:
        where = f"{_short(path)}:{line}({name})" if line else name
        rows.append(
            f"      {tottime / turns * 1e6:7.1f} µs own {cumtime / turns * 1e6:8.1f} "
            f"cum {calls / turns:5.1f}/turn  {where}"
        )
    head = (
        f"      (profiled total {total / turns * 1e6:.0f} µs per turn; "
        "cProfile inflates many small calls)"
    )
    return "\n".join([head, *rows])


def _short(path: str) -> str:
    path = path.replace("\\", "/")
    for marker in ("/turnfsm/", "/site-packages/", "/lib/python"):
        if marker in path:
            return path[path.index(marker) + 1 :]
    return path


def profile(turns: int, pg: Postgres | None) -> None:
    """Print where a turn's time goes on SQLite (and PostgreSQL)."""
    targets: list[tuple[str, Callable[[], Any]]] = []
    tmp = Path(tempfile.mkdtemp(prefix="turnfsm-bench-prof-"))

    def sqlite() -> Any:
        return SQLiteStore(tmp / "profile.db")

    targets.append(("SQLiteStore", sqlite))
    if pg is not None and pg.url is not None:
        targets.append(("PostgresStore", lambda: postgres_store(pg)))
    try:
        for name, opener in targets:

            def run(
                profiler: cProfile.Profile, opener: Callable[[], Any] = opener
            ) -> None:
                async def go() -> None:
                    async with opener() as store:
                        await drive(store, 200)
                        profiler.enable()
                        await drive(store, turns)
                        profiler.disable()

                anyio.run(go)

            print()
            print(
                f"cProfile hint: the Driver on {name}, {turns:,} turns (top own time)"
            )
            print(profile_hint(run, turns))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _verb(sql: str) -> str:
    """A statement's first words, up to the table it names."""
    words: list[str] = []
    for word in sql.split():
        words.append(word)
        if word.startswith("turnfsm_"):
            break
    return " ".join(words)


class Timed:
    """An SQLite connection that times each statement it runs, by its first words."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.times: dict[str, list[float]] = {}

    def _timed(self, run: Callable[..., Any], sql: str, *args: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return run(sql, *args)
        finally:
            self.times.setdefault(_verb(sql), []).append(time.perf_counter() - t0)

    def execute(self, sql: str, *args: Any) -> Any:
        return self._timed(self.conn.execute, sql, *args)

    def executemany(self, sql: str, *args: Any) -> Any:
        return self._timed(self.conn.executemany, sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.conn, name)


async def statements(turns: int) -> None:
    """Print what each statement of an append costs: a tool turn in one append.

    The idempotent tool's turns (one append each), appended straight to a
    new SQLite file by `SQLiteStore.append`, its connection's statements
    timed one by one; the encoding of the turn's entries beside them.
    """
    clock = Clock(turns)
    recorder = Recorder(clock)
    session = Session(store=recorder)
    result = await make_driver(clock, idempotent=True).run("go", session=session)
    assert result.ok, result.error
    encoding: list[float] = []
    appends: list[float] = []
    tmp = Path(tempfile.mkdtemp(prefix="turnfsm-bench-stmt-"))
    try:
        async with SQLiteStore(tmp / "statements.db") as store:
            conn = store._handle.conn
            assert conn is not None
            timed = Timed(conn)
            store._handle.conn = timed  # type: ignore[assignment]
            version = 0
            with quiet_gc():
                for turn, entries in recorder.batches:
                    t0 = time.perf_counter()
                    for entry in entries:
                        encode(entry)
                    t1 = time.perf_counter()
                    version = await store.append("s", entries, expected_version=version)
                    if 1 <= turn < turns:
                        encoding.append(t1 - t0)
                        appends.append(time.perf_counter() - t1)
            store._handle.conn = conn
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    n = len(appends)
    print()
    print(
        f"one append per tool turn on SQLite, {n:,} turns: what each statement "
        "costs (µs; >1ms: how many took over a millisecond)"
    )
    print(
        f"  {'':38} {'count':>6} {'median':>8} {'mean':>8} {'p99':>8} "
        f"{'>1ms':>5} {'per turn':>8}"
    )

    def line(name: str, values: Sequence[float]) -> None:
        ordered = sorted(values)
        print(
            f"  {name:38} {len(values):6} {us(ordered[len(values) // 2])} "
            f"{us(statistics.fmean(values))} {us(ordered[int(len(values) * 0.99)])} "
            f"{sum(1 for v in values if v > 1e-3):5} {us(sum(values) / n)}"
        )

    line("store.append (encoding included)", appends)
    for name, values in timed.times.items():
        if len(values) > 1:
            line(name, values)
    line("encode (the turn's entries)", encoding)
    print(
        "  (a COMMIT over a millisecond is mostly SQLite's checkpoint of its "
        f"write-ahead log, every {CHECKPOINT_PAGES:,} pages, or the machine's "
        "other load)"
    )


# -- the report --------------------------------------------------------------


def us(seconds: float) -> str:
    return f"{seconds * 1e6:8.1f}"


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


@contextlib.contextmanager
def quiet_gc() -> Iterator[None]:
    gc.collect()
    yield
    gc.collect()


async def measure(args: argparse.Namespace, pg: Postgres | None) -> None:
    turns = args.turns
    repeats = args.repeats
    tmp = Path(tempfile.mkdtemp(prefix="turnfsm-bench-"))
    print(
        f"turnfsm store bench: {turns:,}-turn sessions, best of {repeats} runs "
        f"({args.pg_repeats} on PostgreSQL), "
        f"first {WINDOW} vs last {WINDOW} turns"
    )
    print(
        f"python {sys.version.split()[0]}, sqlite {sqlite3.sqlite_version}"
        + (f", {pg.note}" if pg and pg.url else "")
    )
    if pg is not None and pg.url is None:
        print(f"note: PostgreSQL skipped: {pg.note}")
    try:
        # Warm every path once.
        await hand_loop(300)
        await drive(MemoryStore(), 300)
        async with SQLiteStore(tmp / "warm.db") as store:
            await drive(store, 300)

        drivers: dict[str, Figures] = {}
        sizes: dict[str, float] = {}
        with quiet_gc():
            drivers["hand-written loop (list append)"] = best(
                [Figures(await hand_loop(turns)) for _ in range(repeats)]
            )
        for idempotent in (False, True):
            runs = []
            for _ in range(repeats):
                with quiet_gc():
                    _, gaps = await drive(MemoryStore(), turns, idempotent=idempotent)
                    runs.append(Figures(gaps))
            drivers["MemoryStore" + (IDEMPOTENT if idempotent else "")] = best(runs)

        for idempotent in (False, True):
            name = "SQLiteStore" + (IDEMPOTENT if idempotent else "")
            runs = []
            for n in range(repeats):
                path = tmp / f"driver-{n}.db"
                async with SQLiteStore(path) as store:
                    before = sqlite_bytes(path)
                    with quiet_gc():
                        _, gaps = await drive(store, turns, idempotent=idempotent)
                        runs.append(Figures(gaps))
                    if not idempotent:
                        sizes[name] = (sqlite_bytes(path) - before) / turns
                path.unlink()
            drivers[name] = best(runs)

        if pg is not None and pg.url is not None:
            async with postgres_store(pg) as store:
                await drive(store, 300)  # warm: pool, schema, plans
                for idempotent in (False, True):
                    name = "PostgresStore" + (IDEMPOTENT if idempotent else "")
                    runs = []
                    for _ in range(args.pg_repeats):
                        before = pg.size()
                        with quiet_gc():
                            _, gaps = await drive(store, turns, idempotent=idempotent)
                            runs.append(Figures(gaps))
                        if not idempotent:
                            sizes[name] = (pg.size() - before) / turns
                    drivers[name] = best(runs)

        # The raw stores: the same entries, appended directly.
        batches = await capture(turns)
        raws: dict[str, Figures] = {}
        raws["list.extend (hand-written)"] = best(
            [list_loop(batches, turns) for _ in range(repeats)]
        )
        runs = []
        for _ in range(repeats):
            with quiet_gc():
                runs.append(await replay(MemoryStore(), batches, turns))
        raws["MemoryStore"] = best(runs)
        # The driver's own appends, then what one transaction per turn costs.
        merged = one_append_per_turn(batches)
        for name, which in (
            ("SQLiteStore", batches),
            ("SQLiteStore, 1 append per turn", merged),
        ):
            runs = []
            for n in range(repeats):
                path = tmp / f"raw-{n}.db"
                async with SQLiteStore(path) as store:
                    with quiet_gc():
                        runs.append(await replay(store, which, turns))
                path.unlink()
            raws[name] = best(runs)
        if pg is not None and pg.url is not None:
            async with postgres_store(pg) as store:
                for name, which in (
                    ("PostgresStore", batches),
                    ("PostgresStore, 1 append per turn", merged),
                ):
                    runs = []
                    for _ in range(args.pg_repeats):
                        with quiet_gc():
                            runs.append(await replay(store, which, turns))
                    raws[name] = best(runs)
        encoded = payload(batches) / turns

        # -- the tables ------------------------------------------------------
        mem = drivers["MemoryStore"]
        print()
        print("the Driver, one session per store (µs per tool turn)")
        print(
            f"  {'store':32} {'mean':>8} {'first100':>8} {'last100':>8} "
            f"{'flat':>6} {'x Memory':>8} {'store cost':>10}"
        )
        for name, f in drivers.items():
            # Against the memory store's run of the same tool.
            base = drivers["MemoryStore" + IDEMPOTENT] if IDEMPOTENT in name else mem
            cost = "" if name.startswith("hand") else us(f.mean - base.mean)
            print(
                f"  {name:32} {us(f.mean)} {us(f.head)} {us(f.tail)} "
                f"{f.flat:5.2f}x {f.mean / mem.mean:7.2f}x {cost:>10}"
            )
        print(
            "  store cost = (driver on the store) - (driver on MemoryStore), "
            f"mean per turn; first/last {WINDOW}: "
            + ", ".join(
                f"{n} {(f.head - mem.head) * 1e6:.0f}"
                f" -> {(f.tail - mem.tail) * 1e6:.0f}"
                for n, f in drivers.items()
                if n in ("SQLiteStore", "PostgresStore")
            )
        )
        print(
            f"  {IDEMPOTENT.strip(', ')}: the tool is marked safe to run twice "
            "(`idempotent`), so its results ride the next reply's append"
        )

        floor = raws["list.extend (hand-written)"]
        print()
        print(
            "raw store.append of a real turn's entries "
            "(the entries of the driver's appends; µs per tool turn)"
        )
        print(
            f"  {'store':32} {'mean':>8} {'first100':>8} {'last100':>8} "
            f"{'flat':>6} {'x Memory':>8} {'x list':>8}"
        )
        for name, f in raws.items():
            print(
                f"  {name:32} {us(f.mean)} {us(f.head)} {us(f.tail)} "
                f"{f.flat:5.2f}x {f.mean / raws['MemoryStore'].mean:7.2f}x "
                f"{f.mean / floor.mean:7.0f}x"
            )

        print()
        print("bytes stored per turn (whole session / turns)")
        print(f"  {'encoded rows (bodies + messages once)':40} {encoded:9.0f} B")
        for name, size in sizes.items():
            what = (
                "file + WAL after checkpoint"
                if name == "SQLiteStore"
                else "pg_total_relation_size"
            )
            print(
                f"  {name + ' (' + what + ')':40} {size:9.0f} B  "
                f"({size / encoded:4.2f}x the rows)"
            )

        long_us, long_bytes, fresh_us, fresh_bytes = await long_session_runs(tmp)
        print()
        print(
            f"a 1-turn run by a new driver on SQLite, on a "
            f"{LONG_SESSION_MESSAGES:,}-message session vs on a new session"
        )
        print(
            f"  µs per run    {long_us:9.0f} vs {fresh_us:7.0f}  "
            f"({long_us / fresh_us:5.2f}x)"
        )
        print(
            f"  bytes per run {long_bytes:9.0f} vs {fresh_bytes:7.0f}  "
            f"({long_bytes / fresh_bytes:5.2f}x)"
        )

        # -- LangGraph -------------------------------------------------------
        lg_steps = min(args.langgraph_steps or LANGGRAPH_DEFAULT_CAP, turns - 1)
        lg_note = None if args.langgraph else "turned off (--no-langgraph)"
        if lg_note is None:
            lg_note = langgraph_available()
        print()
        if lg_note is not None:
            print(f"LangGraph SqliteSaver: skipped: {lg_note}")
        else:
            import langgraph.version

            print(
                f"LangGraph {langgraph.version.__version__} SqliteSaver, "
                f"{lg_steps:,} steps (1 AI message with a tool call + 1 tool "
                "message each), µs per step"
            )
            if lg_steps < turns:
                print(
                    f"  (capped at {lg_steps:,} of {turns:,}: its cost per step "
                    "grows with the history; --langgraph-steps N to change; the "
                    "turnfsm rows below are taken at the same step numbers)"
                )
            with quiet_gc():
                bare = best([langgraph_run(lg_steps, checkpoint=False)[0]])
            with quiet_gc():
                saved, lg_size, lg_sizes = langgraph_run(lg_steps, checkpoint=True)
            print(
                f"  {'':32} {'first100':>8} {'last100':>8} {'flat':>6} "
                f"{'B/step':>9} {'B/step last100':>14}"
            )
            for name, f, size, tail_size in (
                ("LangGraph, no checkpointer", bare, None, None),
                (
                    "LangGraph + SqliteSaver",
                    saved,
                    lg_size / lg_steps,
                    statistics.fmean(lg_sizes[-WINDOW:]) if lg_sizes else None,
                ),
            ):
                print(
                    f"  {name:32} {us(f.head)} {us(f.tail)} {f.flat:5.2f}x "
                    f"{'' if size is None else f'{size:9.0f}':>9} "
                    f"{'' if tail_size is None else f'{tail_size:14.0f}':>14}"
                )
            for name in ("MemoryStore", "SQLiteStore", "PostgresStore"):
                if name in drivers:
                    head, tail = drivers[name].at(lg_steps)
                    size = sizes.get(name)
                    print(
                        f"  {'turnfsm Driver + ' + name:32} {us(head)} {us(tail)} "
                        f"{tail / head:5.2f}x "
                        f"{'' if size is None else f'{size:9.0f}':>9}"
                    )
            head, tail = drivers["SQLiteStore"].at(lg_steps)
            print(
                f"  at step {lg_steps:,}: LangGraph+SqliteSaver is "
                f"{saved.tail / tail:.1f}x the turnfsm Driver on SQLite per step, "
                f"and writes {lg_size / lg_steps / sizes['SQLiteStore']:.0f}x the "
                "bytes per step (its checkpoint copies the whole list)"
            )

        # -- goals -----------------------------------------------------------
        sq = drivers["SQLiteStore"]
        print()
        print("goals")
        print(
            f"  SQLite <= {GOAL_SQLITE_US:.0f} µs per turn (driver on SQLite, mean): "
            f"{sq.mean * 1e6:.1f} µs -> {verdict(sq.mean * 1e6 <= GOAL_SQLITE_US)}"
        )
        print(
            f"  SQLite flat, last {WINDOW} within {GOAL_FLAT}x of first {WINDOW}: "
            f"{sq.flat:.2f}x -> {verdict(sq.flat <= GOAL_FLAT)}"
        )
        raw_sq = raws["SQLiteStore"]
        raw_ok = raw_sq.mean * 1e6 <= GOAL_SQLITE_US and raw_sq.flat <= GOAL_FLAT
        print(
            f"  (raw SQLite append {raw_sq.mean * 1e6:.1f} µs per turn, "
            f"flat {raw_sq.flat:.2f}x -> "
            f"{verdict(raw_ok)})"
        )
        # One commit per tool turn: the store's cost of a turn whose tool is
        # safe to run twice (its results ride the reply's append).
        for store, goal in (("SQLiteStore", 250.0), ("PostgresStore", 700.0)):
            one = drivers.get(store + IDEMPOTENT)
            if one is None:
                continue
            cost = (one.mean - drivers["MemoryStore" + IDEMPOTENT].mean) * 1e6
            print(
                f"  {store} store cost <= {goal:.0f} µs per tool turn, one append "
                f"(idempotent tool): {cost:.1f} µs -> {verdict(cost <= goal)}"
            )

    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--pg-repeats",
        type=int,
        default=1,
        help="runs of each PostgreSQL figure (slow: ~30-45 s per 10,000 turns)",
    )
    parser.add_argument(
        "--langgraph-steps",
        type=int,
        default=0,
        help=f"LangGraph steps (default {LANGGRAPH_DEFAULT_CAP}, at most turns - 1)",
    )
    parser.add_argument("--no-postgres", dest="postgres", action="store_false")
    parser.add_argument("--no-langgraph", dest="langgraph", action="store_false")
    parser.add_argument("--no-profile", dest="profile", action="store_false")
    parser.add_argument(
        "--no-statements",
        dest="statements",
        action="store_false",
        help="leave out the table of what each statement of an SQLite append costs",
    )
    args = parser.parse_args(argv)
    if args.turns < 2 * WINDOW + 2:
        parser.error(f"--turns must be at least {2 * WINDOW + 2}")
    pg = Postgres() if args.postgres else None
    started = time.perf_counter()
    try:
        if pg is not None:
            pg.start()
        anyio.run(measure, args, pg)
        if args.statements:
            anyio.run(statements, min(args.turns, STATEMENT_TURNS))
        if args.profile:
            profile(min(args.turns, PROFILE_TURNS), pg)
    finally:
        if pg is not None:
            pg.stop()
    print(f"\n(whole run {time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main(sys.argv[1:])
