"""SQLiteStore: the conformance suite, files that survive reopening, two writers
on one file (objects and processes), files it must refuse untouched, messages
stored once; open_store and Agent(store=...); a log read pauses the garbage
collector."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import sqlite3
import sys
import textwrap
import time
import uuid
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import attrs
import pytest

from tests.helpers import REPO_ROOT
from turnfsm import Agent
from turnfsm.core import CompactionResult, Event, ModelReplied, RunStarted
from turnfsm.errors import (
    ConfigError,
    CorruptRecord,
    DuplicateRecord,
    SessionConflict,
    StoreDirectoryUnusable,
    StoreError,
    StoreUnusable,
)
from turnfsm.hooks import Hook, ModelCallEnd
from turnfsm.messages import Message
from turnfsm.persistence import (
    EventRecorded,
    MemoryStore,
    Session,
    SessionStore,
    SQLiteStore,
    _sqlite_ops,
    default_store_path,
    env_store,
    open_store,
)
from turnfsm.persistence._sqlite_open import WAL_SIZE_LIMIT
from turnfsm.persistence.sqlite import SCHEMA_VERSION
from turnfsm.testing import ScriptedModel, check_store, reply, sample_entries, tool_call

pytestmark = pytest.mark.anyio


def _rows(path: Path, sql: str) -> list[Any]:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return conn.execute(sql).fetchall()


async def test_sqlite_store_passes_the_conformance_suite(tmp_path: Path) -> None:
    async def damage(store: SQLiteStore, session_id: str) -> None:
        with contextlib.closing(sqlite3.connect(store.path)) as conn, conn:
            conn.execute(
                "UPDATE turnfsm_entries SET body = 'not json'"
                " WHERE session_id = ? AND seq = 1",
                (session_id,),
            )

    await check_store(
        lambda: SQLiteStore(tmp_path / f"{uuid.uuid4().hex}.db"), damage=damage
    )


async def test_a_reopened_file_loads_what_was_written(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    entries = sample_entries()
    async with SQLiteStore(path) as store:
        await store.append("s", entries[:4], expected_version=0)
        await store.append("s", entries[4:], expected_version=4)
    async with SQLiteStore(path) as store:
        assert await store.load("s") == entries
        assert [(s.id, s.version) for s in await store.list_sessions()] == [
            ("s", len(entries))
        ]
    assert _rows(path, "PRAGMA journal_mode") == [("wal",)]
    meta = dict(_rows(path, "SELECT key, value FROM turnfsm_meta"))
    assert meta == {"application": "turnfsm", "schema_version": str(SCHEMA_VERSION)}


async def test_synchronous_full_is_an_option_and_bad_options_are_config_errors(
    tmp_path: Path,
) -> None:
    async with SQLiteStore(tmp_path / "full.db", synchronous="FULL") as store:
        assert store._handle.conn.execute("PRAGMA synchronous").fetchone() == (2,)
        assert store._handle.conn.execute("PRAGMA foreign_keys").fetchone() == (1,)
    with pytest.raises(ConfigError, match="synchronous"):
        SQLiteStore(tmp_path / "x.db", synchronous="OFF")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="busy_timeout"):
        SQLiteStore(tmp_path / "x.db", busy_timeout=-1)


async def test_a_busy_timeout_sqlite_cannot_wait_is_refused_not_waited_out_at_once(
    tmp_path: Path,
) -> None:
    # SQLite takes the wait in milliseconds as a 32-bit number: past about 24
    # days it overflowed, the store waited not at all, and said it had waited
    # busy_timeout=3000000.0 s.
    with pytest.raises(ConfigError, match=r"busy_timeout.*3000000") as refused:
        SQLiteStore(tmp_path / "x.db", busy_timeout=3e6)
    assert "2147483" in str(refused.value)
    path = tmp_path / "busy.db"
    async with SQLiteStore(path, busy_timeout=2_147_483) as store:
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")

        async def let_go() -> None:
            await anyio.sleep(0.3)
            other.execute("ROLLBACK")

        async with anyio.create_task_group() as group:
            group.start_soon(let_go)
            await store.append("s", sample_entries()[:1], expected_version=0)
        other.close()
        assert len(await store.load("s")) == 1


async def test_two_stores_on_one_file_racing_at_one_version_one_wins(
    tmp_path: Path,
) -> None:
    path = tmp_path / "shared.db"
    stores = [SQLiteStore(path) for _ in range(4)]
    entries = sample_entries()
    wins: list[int] = []

    async def writer(n: int) -> None:
        with contextlib.suppress(SessionConflict):
            await stores[n].append("s", entries[n : n + 2], expected_version=0)
            wins.append(n)

    async with anyio.create_task_group() as group:
        for n in range(4):
            group.start_soon(writer, n)
    assert len(wins) == 1
    for store in stores:
        assert await store.load("s") == entries[wins[0] : wins[0] + 2]
        await store.aclose()


_RACER = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    import anyio
    from turnfsm.errors import SessionConflict
    from turnfsm.persistence import SQLiteStore
    from turnfsm.testing import sample_entries

    path, name, blocks = sys.argv[1], sys.argv[2], int(sys.argv[3])

    async def main():
        store = SQLiteStore(path, busy_timeout=10)
        Path(path + "." + name).touch()
        while len(list(Path(path).parent.glob("*.db.p*"))) < 2:
            time.sleep(0.01)
        won, lost, attempt = [], 0, 0
        while True:
            version = {s.id: s.version for s in await store.list_sessions()}.get("s", 0)
            if version >= 3 * blocks:
                break
            attempt += 1
            run_id = f"{name}_{attempt}"
            try:
                await store.append(
                    "s", sample_entries(run_id)[:3], expected_version=version
                )
                won.append(run_id)
            except SessionConflict:
                lost += 1
        await store.aclose()
        print(json.dumps({"won": won, "lost": lost}))

    anyio.run(main)
    """
)


async def test_two_processes_racing_on_one_session_never_interleave(
    tmp_path: Path,
) -> None:
    path, blocks = tmp_path / "race.db", 60
    SQLiteStore(path)  # the schema exists before the race
    script = tmp_path / "racer.py"
    script.write_text(_RACER)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    results: dict[str, dict[str, object]] = {}

    async def racer(name: str) -> None:
        done = await anyio.run_process(
            [sys.executable, str(script), str(path), name, str(blocks)], env=env
        )
        results[name] = json.loads(done.stdout)

    with anyio.fail_after(50):
        async with anyio.create_task_group() as group:
            group.start_soon(racer, "p1")
            group.start_soon(racer, "p2")
    async with SQLiteStore(path) as store:
        log = await store.load("s")
    # Every append that won is there whole, in order; nothing else is.
    runs = [log[i].run_id for i in range(0, len(log), 3)]
    assert len(log) == 3 * blocks
    for i, run_id in enumerate(runs):
        assert log[3 * i : 3 * i + 3] == sample_entries(run_id)[:3]
    won = [run for result in results.values() for run in result["won"]]  # type: ignore[attr-defined]
    assert sorted(won) == sorted(runs)
    assert len(set(runs)) == blocks


async def test_commits_stay_visible_with_two_stores_on_one_file_in_a_process(
    tmp_path: Path,
) -> None:
    # Two agents of one worker on one file, and `turnfsm sessions list` run
    # by hand meanwhile: the other process's close must not take the
    # write-ahead log the first store's later commits go to.
    path = tmp_path / "s.db"
    count = (
        "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); "
        "print(c.execute('SELECT count(*) FROM turnfsm_entries').fetchone()[0])"
    )

    async def seen() -> int:
        done = await anyio.run_process([sys.executable, "-c", count, str(path)])
        return int(done.stdout)

    async with SQLiteStore(path) as first, SQLiteStore(path):
        version = await first.append("s", sample_entries(), expected_version=0)
        assert await seen() == version  # another process opened and closed it
        version = await first.append(
            "s", sample_entries("run_2"), expected_version=version
        )
        assert await seen() == version


def _sqlite_file(path: Path, *statements: str) -> None:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        for sql in statements:
            conn.execute(sql)
        conn.commit()


def _newer(path: Path) -> None:
    SQLiteStore(path)._handle.close()
    _sqlite_file(
        path, "UPDATE turnfsm_meta SET value = '99' WHERE key = 'schema_version'"
    )


def _truncated(path: Path) -> None:
    SQLiteStore(path)._handle.close()
    data = path.read_bytes()
    path.write_bytes(data[:1024] + b"\x07" * 2048)


BAD_FILES: dict[str, tuple[Callable[[Path], object], str]] = {
    "text": (lambda p: p.write_text("name,age\nada,36\n"), "not an SQLite database"),
    "garbage after the header": (
        lambda p: p.write_bytes(b"SQLite format 3\x00" + os.urandom(4000)),
        "not a usable SQLite database",
    ),
    "truncated": (_truncated, "not a usable SQLite database"),
    "foreign": (
        lambda p: _sqlite_file(p, "CREATE TABLE users (id INTEGER, name TEXT)"),
        r"another application's SQLite database \(tables: users\)",
    ),
    "foreign turnfsm_meta": (
        lambda p: _sqlite_file(p, "CREATE TABLE turnfsm_meta (key TEXT, value TEXT)"),
        "another application's",
    ),
    "newer schema": (_newer, "schema version 99 is newer than this turnfsm knows"),
}


@pytest.mark.parametrize("kind", list(BAD_FILES), ids=list(BAD_FILES))
async def test_an_unusable_file_is_a_typed_error_and_stays_unchanged(
    tmp_path: Path, kind: str
) -> None:
    make, reason = BAD_FILES[kind]
    path = tmp_path / "bad.db"
    make(path)
    before = path.read_bytes()
    with pytest.raises(StoreUnusable, match=reason) as caught:
        SQLiteStore(path)
    assert caught.value.path == str(path)
    assert str(path) in str(caught.value)
    assert isinstance(caught.value, StoreError)
    assert path.read_bytes() == before
    with pytest.raises(StoreUnusable):
        open_store(str(path))
    assert path.read_bytes() == before


async def test_a_missing_directory_is_a_typed_error(tmp_path: Path) -> None:
    with pytest.raises(StoreDirectoryUnusable, match="it does not exist"):
        SQLiteStore(tmp_path / "nowhere" / "s.db")
    assert not (tmp_path / "nowhere").exists()


async def test_messages_are_stored_once_per_session(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    said = [Message.user(f"message {n}", id=f"m{n}") for n in range(5)]
    answer = Message.assistant("done", id="m_answer")
    events: list[Event] = [
        RunStarted(input=tuple(said)),
        # A compaction that keeps everything carries the conversation again.
        CompactionResult(messages=tuple(said), before=900, after=800),
        CompactionResult(messages=(*said[2:], answer), before=800, after=300),
        ModelReplied(message=answer, usage=None),
    ]
    entries = [
        EventRecorded(run_id="r", index=i, event=e, phase="x", decision="y", at=1.0)
        for i, e in enumerate(events)
    ]
    async with SQLiteStore(path) as store:
        version = 0
        for entry in entries:
            version = await store.append("s", [entry], expected_version=version)
        await store.append("t", entries[:1], expected_version=0)
        assert await store.load("s") == tuple(entries)
    counts = _rows(
        path,
        "SELECT session_id, count(*) FROM turnfsm_messages GROUP BY session_id",
    )
    assert counts == [("s", 6), ("t", 5)]


async def test_a_compaction_key_already_stored_fails_the_whole_append(
    tmp_path: Path,
) -> None:
    entries = sample_entries()
    async with SQLiteStore(tmp_path / "k.db") as store:
        await store.append("s", entries, expected_version=0)
        again = (entries[0], *(e for e in entries if hasattr(e, "key")))
        with pytest.raises(DuplicateRecord) as caught:
            await store.append("s", again, expected_version=len(entries))
        assert (caught.value.session_id, caught.value.key) == ("s", "run_1:3")
        assert await store.load("s") == entries
        assert [s.version for s in await store.list_sessions()] == [len(entries)]
        # The same key in another session is another record.
        await store.append("t", again, expected_version=0)


async def test_a_writer_that_waits_for_another_process_lock(tmp_path: Path) -> None:
    path = tmp_path / "busy.db"
    entries = sample_entries()
    async with SQLiteStore(path, busy_timeout=5) as store:
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")  # another process holds the write lock
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as group:

                async def append() -> None:
                    await store.append("s", entries, expected_version=0)

                group.start_soon(append)
                await anyio.sleep(0.1)
                scope.cancel()  # the caller gives up while it waits...
                other.execute("ROLLBACK")  # ...and the lock is released
        other.close()
        # The append was shielded: it committed whole, never half.
        assert await store.load("s") == entries


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # its own task.cancel()
async def test_a_writer_cancelled_by_asyncio_learns_that_its_append_committed(
    tmp_path: Path,
) -> None:
    # An asyncio web server cancels a request's task when its client goes:
    # anyio's shield does not hold that off. The append still commits, and
    # its caller is told so before the cancellation reaches it.
    path = tmp_path / "busy.db"
    entries = sample_entries()
    appended: list[int] = []
    async with SQLiteStore(path, busy_timeout=5) as store:
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")  # another process holds the write lock

        async def append() -> None:
            appended.append(await store.append("s", entries, expected_version=0))
            await anyio.sleep(10)  # the cancellation arrives here

        task = asyncio.create_task(append())
        await anyio.sleep(0.1)
        task.cancel()  # the client went away while the append waits...
        await anyio.sleep(0.1)
        other.execute("ROLLBACK")  # ...and the lock is released
        with pytest.raises(asyncio.CancelledError):
            await task
        other.close()
        assert appended == [len(entries)]
        assert await store.load("s") == entries


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # its own task.cancel()
async def test_a_run_cancelled_by_asyncio_leaves_its_session_usable(
    tmp_path: Path,
) -> None:
    # The run's last write waits for another writer's lock when its task is
    # cancelled: it commits, and the agent's session knows it did, so the
    # next request of the conversation is not refused as a conflict.
    path = tmp_path / "busy.db"
    async with SQLiteStore(path, busy_timeout=5) as store:
        other = sqlite3.connect(path, isolation_level=None)

        class Lock(Hook):  # another process takes the lock as the model replies
            def on_model_call_end(self, info: ModelCallEnd) -> None:
                if not other.in_transaction:
                    other.execute("BEGIN IMMEDIATE")

        model = ScriptedModel.of("first", "second")
        agent = Agent(model=model, store=store, hooks=[Lock()])
        task = asyncio.create_task(agent.run("hi"))
        await anyio.sleep(0.2)
        task.cancel()
        await anyio.sleep(0.1)
        other.execute("ROLLBACK")
        with pytest.raises(asyncio.CancelledError):
            await task
        other.close()
        stored = await Session.load(store, agent.session.id)
        assert agent.session.version == stored.version
        result = await agent.run("again")
        assert result.text == "second"
        assert [r.outcome for r in (await Session.load(store, stored.id)).runs] == [
            "done",
            "done",
        ]


async def test_an_agent_per_request_lets_go_of_its_store_when_dropped(
    tmp_path: Path,
) -> None:
    # A web server that builds an Agent per request on a store path: each
    # run's loop and lease renewal sat in reference cycles (on asyncio), so
    # every request's connection (its open files) stayed until the garbage
    # collector's next full pass.
    path = tmp_path / "per-request.db"

    def lookup() -> str:
        return "found"

    async def serve(text: str) -> weakref.ref[SessionStore]:
        model = ScriptedModel.of(reply("", tool_call("lookup", "c1")), "done")
        agent = Agent(model=model, tools=[lookup], store=path)
        assert (await agent.run(text)).outcome == "done"
        return weakref.ref(agent.store)

    gc.collect()
    gc.disable()
    try:
        stores = [await serve("first"), await serve("second")]
        # A worker thread that read the session lets go of its call (the
        # store's bound method) just after handing the result back: under
        # load, a moment after the run ends. No garbage collection meanwhile.
        for _ in range(500):
            if all(store() is None for store in stores):
                break
            await anyio.sleep(0.01)
        assert [store() for store in stores] == [None, None]
    finally:
        gc.enable()


async def test_a_lock_held_past_busy_timeout_is_a_typed_error(tmp_path: Path) -> None:
    path = tmp_path / "busy.db"
    async with SQLiteStore(path, busy_timeout=0.2) as store:
        with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as other:
            other.execute("BEGIN IMMEDIATE")
            with pytest.raises(StoreUnusable, match=r"busy_timeout=0\.2") as caught:
                await store.append("s", sample_entries()[:1], expected_version=0)
            assert str(caught.value).startswith(f"cannot use {path} ")
            assert "try again once that writer is done" in str(caught.value)
            other.execute("ROLLBACK")
        assert await store.load("s") == ()
        await store.append("s", sample_entries()[:1], expected_version=0)


async def test_calls_queued_behind_a_lock_wait_busy_timeout_not_one_each(
    tmp_path: Path,
) -> None:
    # A server's concurrent requests on one store, while another process
    # holds the file locked: the store's calls go one at a time, and each
    # waited its own busy_timeout after those before it; the last of 8 was
    # told of the lock after 8 x busy_timeout.
    path = tmp_path / "busy.db"
    waited: list[float] = []
    async with SQLiteStore(path, busy_timeout=0.2) as store:
        with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as other:
            other.execute("BEGIN IMMEDIATE")

            async def append(n: int) -> None:
                start = time.monotonic()
                with pytest.raises(StoreUnusable, match=r"busy_timeout=0\.2"):
                    await store.append(
                        f"s{n}", sample_entries()[:1], expected_version=0
                    )
                waited.append(time.monotonic() - start)

            async with anyio.create_task_group() as group:
                for n in range(8):
                    group.start_soon(append, n)
            other.execute("ROLLBACK")
        assert len(waited) == 8
        assert max(waited) < 0.8, waited
        await store.append("s", sample_entries()[:1], expected_version=0)


async def test_a_call_queued_behind_slow_reads_still_waits_out_a_short_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The store's own calls ahead of it (a long log decoding) are no other
    # writer's lock: a write queued past its busy_timeout behind them still
    # waits for a lock another process holds a moment.
    path = tmp_path / "busy.db"
    load = _sqlite_ops.load

    def slow_load(conn: sqlite3.Connection, session_id: str) -> object:
        time.sleep(0.5)
        return load(conn, session_id)

    monkeypatch.setattr(_sqlite_ops, "load", slow_load)
    async with SQLiteStore(path, busy_timeout=0.3) as store:
        with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as other:
            other.execute("BEGIN IMMEDIATE")

            async def let_go() -> None:
                await anyio.sleep(0.6)
                other.execute("ROLLBACK")

            async with anyio.create_task_group() as group:
                group.start_soon(store.load, "s")
                group.start_soon(let_go)
                await anyio.sleep(0.05)
                await store.append("s", sample_entries()[:1], expected_version=0)
        monkeypatch.undo()
        assert len(await store.load("s")) == 1


async def test_delete_session_removes_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "d.db"
    async with SQLiteStore(path) as store:
        await store.append("s", sample_entries(), expected_version=0)
        await store.append("t", sample_entries(), expected_version=0)
        assert await store.delete_session("s") is True
        assert await store.delete_session("s") is False
        assert [s.id for s in await store.list_sessions()] == ["t"]
        assert await store.load("s") == ()
    for table in ("entries", "messages", "compactions"):
        sessions = _rows(path, f"SELECT DISTINCT session_id FROM turnfsm_{table}")
        assert sessions == [("t",)]


async def test_an_agent_run_on_sqlite_reopens_from_a_fresh_store(
    tmp_path: Path,
) -> None:
    path = tmp_path / "agent.db"

    def lookup(word: str) -> str:
        """Look a word up.

        Args:
            word: the word.
        """
        return f"{word}: a small word"

    model = ScriptedModel.of(
        reply("", tool_call("lookup", "c1", word="fsm")), "FSM means...", "again"
    )
    agent = Agent(model=model, tools=[lookup], store=path)
    assert isinstance(agent.store, SQLiteStore)
    first = await agent.run("what is fsm?")
    second = await agent.run("and again?")
    assert (first.ok, second.ok) == (True, True)
    await agent.store.aclose()

    async with SQLiteStore(path) as store:
        session = await Session.load(store, first.session_id)
        assert session.entries == agent.session.entries
        assert list(session.history) == list(agent.session.history)
        assert [(r.run_id, r.outcome) for r in session.runs] == [
            (first.run_id, "done"),
            (second.run_id, "done"),
        ]
        # ... and the conversation goes on from the reopened session.
        more = Agent(model=ScriptedModel.of("third"), session=session)
        third = await more.run("once more")
        assert third.ok
        assert [m.text for m in session.history][-2:] == ["once more", "third"]
    async with SQLiteStore(path) as store:
        reopened = await Session.load(store, first.session_id)
        assert len(reopened.runs) == 3


# -- open_store, default_store_path, Agent(store=...) ---------------------
async def test_open_store_takes_every_form(tmp_path: Path) -> None:
    memory = MemoryStore()
    assert open_store(memory) is memory
    assert isinstance(open_store("memory:"), MemoryStore)
    specs: list[tuple[str | Path, str]] = [
        (str(tmp_path / "a.db"), "a.db"),
        (tmp_path / "b.db", "b.db"),
        (f"sqlite:///{tmp_path}/c.db", "c.db"),
    ]
    for spec, file in specs:
        store = open_store(spec)
        assert isinstance(store, SQLiteStore)
        assert store.path == tmp_path / file
        await store.aclose()


@pytest.mark.parametrize(
    "spec",
    ["", "   ", "mysql://db/x", "memroy:", "sqlite://x.db", "sqlite:///", 5, None],
    ids=repr,
)
def test_open_store_refuses_what_names_no_store(spec: object) -> None:
    with pytest.raises(ConfigError, match="store"):
        open_store(spec)  # type: ignore[arg-type]  # wrong on purpose


@pytest.mark.parametrize(
    ("spec", "meant"),
    [
        ("memory", "did you mean 'memory:'"),
        ("Memory", "did you mean 'memory:'"),
        (":memory:", "did you mean 'memory:'"),
        ("postgres:/db", "did you mean postgresql://db?"),
        ("postgresql:db", "did you mean postgresql://db?"),
        # A web URL's two slashes, or none: the file from the working directory
        # (they were refused naming the forms only).
        ("sqlite://x.db", "did you mean sqlite:///x.db?"),
        ("sqlite:x.db", "did you mean sqlite:///x.db?"),
        ("sqlite:/var/s.db", "did you mean sqlite:////var/s.db?"),
    ],
)
def test_a_slip_of_a_store_name_is_refused_with_what_it_meant(
    spec: str, meant: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each was a file path: "memory" made a SQLite file of that name.
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as caught:
        open_store(spec)
    assert str(caught.value).startswith(f"invalid store={spec!r}: expected ")
    assert meant in str(caught.value)
    assert list(tmp_path.iterdir()) == []


def test_three_slashes_before_an_absolute_path_say_four(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # sqlite:///tmp/x/s.db names tmp/x/s.db from the working directory: it
    # said "cannot keep sessions in the directory .../tmp/x: it does not
    # exist; create it", when /tmp/x was there all along.
    monkeypatch.chdir(tmp_path)
    spec = f"sqlite://{tmp_path}/s.db"
    with pytest.raises(ConfigError) as caught:
        open_store(spec)
    assert str(caught.value) == (
        f"invalid store={spec!r}: expected 'memory:', a file path, "
        "'sqlite:///PATH' or a postgresql:// URL (did you mean "
        f"sqlite:///{tmp_path}/s.db? three slashes take a path from the "
        "working directory, four an absolute one)"
    )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "spec",
    [
        "host=db.example user=app password=s3cret dbname=app",
        "dbname=app",
        " user = app password=s3cret",
    ],
)
def test_a_postgres_conninfo_string_is_refused_without_showing_it(
    spec: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each was a file path: an SQLite file named after it, password and all.
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as caught:
        open_store(spec)
    assert "postgresql://" in str(caught.value)
    assert "s3cret" not in str(caught.value)
    monkeypatch.setenv("TURNFSM_STORE", spec)
    with pytest.raises(ConfigError) as caught:
        env_store()
    assert caught.value.field == "TURNFSM_STORE"
    assert "s3cret" not in str(caught.value)
    assert list(tmp_path.iterdir()) == []


def test_a_postgres_url_without_the_extra_names_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "turnfsm.persistence.postgres", None)
    with pytest.raises(ImportError, match=r"turnfsm\[postgres\]"):
        open_store("postgresql://user@localhost/db")


def test_default_store_path_is_in_the_user_data_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    path = default_store_path()
    if sys.platform.startswith("linux"):
        assert path == tmp_path / "data" / "turnfsm" / "sessions.db"
    assert path.name == "sessions.db"
    assert path.parent.is_dir()


async def test_an_agent_keeps_sessions_in_memory_unless_turnfsm_store_names_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TURNFSM_STORE", raising=False)
    assert isinstance(Agent(model=ScriptedModel.of()).store, MemoryStore)
    monkeypatch.setenv("TURNFSM_STORE", str(tmp_path / "env.db"))
    agent = Agent(model=ScriptedModel.of("hi"))
    assert isinstance(agent.store, SQLiteStore)
    assert agent.store.path == tmp_path / "env.db"
    result = await agent.run("hello")
    await agent.store.aclose()
    async with SQLiteStore(tmp_path / "env.db") as store:
        assert [s.id for s in await store.list_sessions()] == [result.session_id]
    memory = MemoryStore()
    assert Agent(model=ScriptedModel.of(), store=memory).store is memory
    monkeypatch.setenv("TURNFSM_STORE", "nonsense://x")
    with pytest.raises(ConfigError, match="TURNFSM_STORE"):
        Agent(model=ScriptedModel.of())
    with pytest.raises(ConfigError, match="store"):
        Agent(model=ScriptedModel.of(), store=42)  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", ["missing directory", "a directory"])
def test_a_turnfsm_store_that_cannot_be_used_names_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """The user gave no path: the message names the variable that chose it."""
    spec = tmp_path / "nope" / "s.db" if kind == "missing directory" else tmp_path
    monkeypatch.setenv("TURNFSM_STORE", str(spec))

    with pytest.raises((StoreDirectoryUnusable, StoreUnusable)) as caught:
        Agent(model=ScriptedModel.of())

    assert "change TURNFSM_STORE" in str(caught.value)
    assert caught.value.setting == "TURNFSM_STORE"


def test_only_a_path_that_names_no_store_is_said_to_need_another_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store that is there but failing is no reason to point elsewhere."""
    notes = tmp_path / "notes.txt"
    notes.write_text("not a database, " * 100)
    monkeypatch.setenv("TURNFSM_STORE", str(notes))
    with pytest.raises(StoreUnusable) as caught:
        Agent(model=ScriptedModel.of())
    assert caught.value.names_no_store
    assert str(caught.value).endswith("; change TURNFSM_STORE (nothing was changed)")
    # The store's own trouble, whatever its words: no setting to change.
    busy = StoreUnusable(
        str(notes), "it is locked by another writer", setting="TURNFSM_STORE"
    )
    assert "change TURNFSM_STORE" not in str(busy)
    written = attrs.evolve(caught.value, in_doubt=True)  # a write, not the path
    assert "change TURNFSM_STORE" not in str(written)


# -- the stored row format (pinned: files written before must still load) ----


def _pinned_entries() -> list[Any]:
    from turnfsm.core import ToolsFinished
    from turnfsm.messages import ToolCallPart
    from turnfsm.persistence import ToolResultRecorded

    # A message-shaped value inside a message is part of that message's text.
    nested: dict[str, Any] = {"id": "x", "role": "user", "parts": [], "metadata": {}}
    call = Message.assistant(
        "héllo \x00",
        tool_calls=[
            ToolCallPart(
                id="c1", name="look", arguments={"as_message": nested, "n": 1.5}
            )
        ],
        id="msg_a",
        metadata={"k": [1, True]},
    )
    result = Message.tool_result("c1", "ok", id="msg_b")
    return [
        EventRecorded(
            run_id="run_1",
            index=3,
            event=ModelReplied(message=call),
            phase="run_tools",
            decision="run_tools:c1",
            at=1.25,
        ),
        ToolResultRecorded(run_id="run_1", index=4, result=result),
        EventRecorded(
            run_id="run_1",
            index=5,
            event=ToolsFinished(results=(result,)),
            phase="start",
            decision="measure",
            at=2.5,
        ),
    ]


_CALL = "b4c938e1173ab016138cc78179c5173c"
_RESULT = "f0c0377e8fb7486dd40e98d91896280c"
_PINNED_MESSAGES = {
    _CALL: '{"id":"msg_a","metadata":{"k":[1,true]},"parts":[{"text":"héllo'
    ' \\u0000","type":"text"},{"arguments":{"as_message":{"id":"x","metadata":{},'
    '"parts":[],"role":"user"},"n":1.5},"id":"c1","name":"look","type":"tool_call"}'
    '],"role":"assistant"}',
    _RESULT: '{"id":"msg_b","metadata":{},"parts":[{"call_id":"c1","content":"ok",'
    '"is_error":false,"type":"tool_result"}],"role":"tool"}',
}
_PINNED_BODIES = [
    '{"data":{"at":1.25,"decision":"run_tools:c1","event":{"message":{"$msg":"'
    + _CALL
    + '"},"type":"ModelReplied","usage":null},"index":3,"phase":"run_tools",'
    '"run_id":"run_1"},"type":"EventRecorded","v":1}',
    '{"data":{"index":4,"result":{"$msg":"'
    + _RESULT
    + '"},"run_id":"run_1"},"type":"ToolResultRecorded","v":1}',
    '{"data":{"at":2.5,"decision":"measure","event":{"results":[{"$msg":"'
    + _RESULT
    + '"}],"type":"ToolsFinished"},"index":5,"phase":"start","run_id":"run_1"},'
    '"type":"EventRecorded","v":1}',
]


def test_an_encoded_row_is_byte_for_byte_the_stored_format() -> None:
    from turnfsm.persistence._rows import encode

    rows = [encode(entry) for entry in _pinned_entries()]
    assert [row.body for row in rows] == _PINNED_BODIES
    assert [dict(row.messages) for row in rows] == [
        {_CALL: _PINNED_MESSAGES[_CALL]},
        {_RESULT: _PINNED_MESSAGES[_RESULT]},
        {_RESULT: _PINNED_MESSAGES[_RESULT]},
    ]
    assert [(row.kind, row.run_id, row.key) for row in rows] == [
        ("EventRecorded", "run_1", None),
        ("ToolResultRecorded", "run_1", None),
        ("EventRecorded", "run_1", None),
    ]


def _strip_reference(value: Any, out: dict[str, str]) -> Any:
    """The walk the rows were first written with (the oracle for `encode`)."""
    import hashlib

    if isinstance(value, dict):
        if value.keys() == {"id", "role", "parts", "metadata"} and isinstance(
            value.get("parts"), list
        ):
            text = json.dumps(
                value, separators=(",", ":"), sort_keys=True, ensure_ascii=False
            )
            digest = hashlib.sha256(text.encode()).hexdigest()[:32]
            out[digest] = text
            return {"$msg": digest}
        return {k: _strip_reference(v, out) for k, v in value.items()}
    if isinstance(value, list):
        return [_strip_reference(v, out) for v in value]
    return value


def test_encode_writes_what_the_first_encoder_wrote_for_every_sample() -> None:
    from turnfsm import serde
    from turnfsm.persistence._rows import encode

    for entry in [*sample_entries(), *_pinned_entries()]:
        messages: dict[str, str] = {}
        body = json.dumps(
            _strip_reference(serde.envelope(entry), messages),
            separators=(",", ":"),
            sort_keys=True,
            ensure_ascii=False,
        )
        row = encode(entry)
        assert (row.body, dict(row.messages)) == (body, messages), entry


async def test_a_file_with_rows_in_the_pinned_format_loads(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    async with SQLiteStore(path):
        pass  # the schema
    with contextlib.closing(sqlite3.connect(path)) as conn, conn:
        conn.execute("INSERT INTO turnfsm_sessions VALUES ('s', 3, 0, 0)")
        conn.executemany(
            "INSERT INTO turnfsm_entries VALUES ('s', ?, 'run_1', ?, ?)",
            [
                (n, kind, body)
                for n, (kind, body) in enumerate(
                    zip(
                        ["EventRecorded", "ToolResultRecorded", "EventRecorded"],
                        _PINNED_BODIES,
                        strict=True,
                    )
                )
            ],
        )
        conn.executemany(
            "INSERT INTO turnfsm_messages VALUES ('s', ?, ?)",
            list(_PINNED_MESSAGES.items()),
        )
    async with SQLiteStore(path) as store:
        assert await store.load("s") == tuple(_pinned_entries())
        # and goes on from there
        more = sample_entries()[:2]
        assert await store.append("s", more, expected_version=3) == 5
        assert (await store.load("s"))[3:] == tuple(more)


async def test_the_version_check_is_exact_for_new_and_empty_sessions(
    tmp_path: Path,
) -> None:
    entries = sample_entries()
    async with SQLiteStore(tmp_path / "v.db") as store:
        # An unknown session is at version 0.
        with pytest.raises(SessionConflict) as caught:
            await store.append("s", entries[:1], expected_version=2)
        assert (caught.value.expected, caught.value.actual) == (2, 0)
        # An empty first append creates the session at version 0 ...
        assert await store.append("s", [], expected_version=0) == 0
        # ... and a first append finds it there.
        assert await store.append("s", entries[:2], expected_version=0) == 2
        with pytest.raises(SessionConflict) as caught:
            await store.append("s", entries[2:3], expected_version=0)
        assert (caught.value.expected, caught.value.actual) == (0, 2)
        with pytest.raises(SessionConflict) as caught:
            await store.append("s", entries[2:3], expected_version=1)
        assert (caught.value.expected, caught.value.actual) == (1, 2)
        assert await store.load("s") == tuple(entries[:2])
        assert _rows(tmp_path / "v.db", "SELECT version FROM turnfsm_sessions") == [
            (2,)
        ]


def _read_file(path: str) -> str:
    """Read a file.

    Args:
        path: the file.
    """
    return f"contents of {path}: " + "lorem ipsum " * 40


async def test_a_long_log_reads_back_row_for_row_as_it_was_written(
    tmp_path: Path,
) -> None:
    """The one-pass parse (references filled as a body is parsed) loses nothing.

    Every row of a compacting run decodes to the entry the store's `load`
    returns, to what decoding the parsed body gives, and encodes back to the
    very text stored.
    """
    from turnfsm.context import ContextManager, TruncatingCompactor
    from turnfsm.persistence._rows import decode, encode
    from turnfsm.testing import FakeModelClient

    def plan(request: Any) -> Message:
        calls.append(request)
        if len(calls) >= 30:
            return reply("done")
        return reply("", tool_call("read", path=f"f{len(calls)}.py"))

    calls: list[Any] = []
    path = tmp_path / "s.db"
    async with SQLiteStore(path) as store:
        agent = Agent(
            model=FakeModelClient(plan),
            tools=[_read_file],
            store=store,
            context=ContextManager(
                TruncatingCompactor(
                    preserve_recent=2, min_messages=3, compact_newest_exchange=True
                ),
                context_window=8_000,
            ),
            max_turns=40,
        )
        session_id = (await agent.run("read every file")).session_id
        loaded = await store.load(session_id)
        session = await Session.load(store, session_id)
    assert session.runs[0].compactions  # the run compacted
    bodies = _rows(path, "SELECT body FROM turnfsm_entries ORDER BY seq")
    messages = dict(_rows(path, "SELECT digest, body FROM turnfsm_messages"))
    assert len(bodies) == len(loaded) == session.version
    for (body,), entry in zip(bodies, loaded, strict=True):
        assert decode(body, messages) == entry
        assert decode(json.loads(body), messages) == entry
        assert encode(entry).body == body
        # A reference spelt with a JSON escape is still one.
        escaped = body.replace('"$msg"', '"\\u0024msg"')
        assert decode(escaped, messages) == entry
    assert any('"$msg"' in body for (body,) in bodies)
    assert any('"$msg"' not in body for (body,) in bodies)


class _Watched(dict[str, str]):
    """Message contents that note whether the collector runs as each is read."""

    def __init__(self, items: dict[str, str]) -> None:
        super().__init__(items)
        self.collecting: list[bool] = []

    def __getitem__(self, digest: str) -> str:
        self.collecting.append(gc.isenabled())
        return super().__getitem__(digest)


@pytest.mark.parametrize("was_running", [True, False], ids=["running", "paused"])
@pytest.mark.parametrize("corrupt", [False, True], ids=["whole", "corrupt"])
def test_a_log_read_pauses_the_garbage_collector_and_leaves_it_as_it_was(
    was_running: bool, corrupt: bool
) -> None:
    """Decoding a log pauses the collector (a long log reads faster that way).

    After the read, whether it ended in an entry list or a `CorruptRecord`,
    the collector runs again, unless it was paused before.
    """
    from turnfsm.persistence._records import ToolResultRecorded
    from turnfsm.persistence._rows import decode_log, encode

    entry = ToolResultRecorded(
        run_id="r1", index=0, result=Message.tool_result("c1", "the file")
    )
    row = encode(entry)
    messages = _Watched(dict(row.messages))
    bodies = [row.body, "not JSON"] if corrupt else [row.body]
    if not was_running:
        gc.disable()
    try:
        if corrupt:
            with pytest.raises(CorruptRecord, match=r"entries\[1\]"):
                decode_log("s1", bodies, messages, version=2)
        else:
            assert decode_log("s1", bodies, messages, version=1) == (entry,)
        after = gc.isenabled()
    finally:
        gc.enable()
    assert messages.collecting == [False]
    assert after == was_running


def test_a_path_from_home_is_read_as_a_shell_reads_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # TURNFSM_STORE=~/sessions.db from an environment file reached the store
    # unexpanded: "the directory ~ does not exist".
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("TURNFSM_STORE", "~/sessions.db")
    store = env_store()
    assert isinstance(store, SQLiteStore)
    assert store.path == tmp_path / "sessions.db"
    assert SQLiteStore("~/other.db").path == tmp_path / "other.db"


def _remove_database(path: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f"{path}{suffix}")


async def test_a_path_sqlite_would_read_as_a_uri_is_the_file_it_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # SQLite reads a name beginning with "file:" as a URI (this build takes
    # URIs everywhere): SQLiteStore("file:s.db") kept its sessions in s.db,
    # out of sight of a reading command given the same path.
    monkeypatch.chdir(tmp_path)
    names = ["file:s.db", "file:t.db?mode=rwc"]
    for name in names:
        async with SQLiteStore(name) as store:
            await store.append("s", sample_entries()[:1], expected_version=0)
        async with SQLiteStore(name) as store:
            assert len(await store.load("s")) == 1, name
    made = set(os.listdir(tmp_path))
    assert not made & {"s.db", "t.db"}
    assert made >= set(names)


@pytest.mark.parametrize(
    "name",
    [
        ":memory:",
        Path(":memory:"),
        "file::memory:",
        "file::memory:?cache=shared",
        "file:%3Amemory%3A",
        "file:x?mode=memory",
        "file:x.db?cache=shared&mode=memory",
    ],
    ids=repr,
)
def test_a_name_sqlite_reads_as_a_database_in_memory_is_refused(
    name: str | Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each made a file of that name in the working directory, where a
    # caller who meant a database in memory never looks.
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as caught:
        SQLiteStore(name)
    assert caught.value.field == "path"
    assert caught.value.value == name
    assert "use MemoryStore" in str(caught.value)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "spec", ["file::memory:", "file:x?mode=memory", "sqlite:///:memory:"]
)
def test_open_store_refuses_a_database_in_memory_saying_memory(
    spec: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as caught:
        open_store(spec)
    assert caught.value.field == "store"
    assert caught.value.value == spec
    assert "did you mean 'memory:'" in str(caught.value)
    assert list(tmp_path.iterdir()) == []


async def test_a_store_reopened_after_aclose_opens_at_once(tmp_path: Path) -> None:
    # Reopening, by the same object or a new one in this process, never
    # waits on something the first opening left behind (a connection, a
    # lock): far less than busy_timeout.
    path = tmp_path / "s.db"
    entries = sample_entries()
    store = SQLiteStore(path, busy_timeout=30)
    await store.append("s", entries[:2], expected_version=0)
    await store.aclose()
    start = time.monotonic()
    assert len(await store.load("s")) == 2
    await store.append("s", entries[2:3], expected_version=2)
    await store.aclose()
    async with SQLiteStore(path, busy_timeout=30) as again:
        await again.append("s", entries[3:4], expected_version=3)
    async with SQLiteStore(path, busy_timeout=30) as again:
        assert len(await again.load("s")) == 4
    assert time.monotonic() - start < 5


async def test_a_closed_store_reopens_its_file_wherever_the_process_has_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A relative path was read again from the working directory of the day:
    # after a chdir, the store reopened an empty file there, its sessions
    # gone from sight and its next appends in the other file.
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    store = SQLiteStore("s.db")
    await store.append("s", sample_entries()[:2], expected_version=0)
    await store.aclose()
    monkeypatch.chdir(tmp_path / "b")
    assert len(await store.load("s")) == 2
    await store.append("s", sample_entries()[2:3], expected_version=2)
    await store.aclose()
    assert list((tmp_path / "b").iterdir()) == []
    async with SQLiteStore(tmp_path / "a" / "s.db") as again:
        assert len(await again.load("s")) == 3


async def test_a_file_deleted_under_an_open_store_is_refused_not_written_to(
    tmp_path: Path,
) -> None:
    # SQLite in WAL mode goes on writing to a deleted file: each commit
    # would succeed, into a file no one can open again.
    path = tmp_path / "s.db"
    entries = sample_entries()
    async with SQLiteStore(path) as store:
        await store.append("s", entries[:1], expected_version=0)
        _remove_database(path)
        with pytest.raises(StoreUnusable, match="deleted or replaced") as raised:
            await store.append("s", entries[1:2], expected_version=1)
        assert str(path) in str(raised.value)
        # The store let go of the deleted file: its next call opens the path.
        assert await store.load("s") == ()
        assert path.exists()


async def test_a_symlinked_file_deleted_under_an_open_store_keeps_its_log(
    tmp_path: Path,
) -> None:
    # SQLite names the write-ahead log after the file a symlink points to;
    # the check for a log left without its file looked beside the link, so
    # the store made a new empty file and its close deleted the log, and the
    # last commits with it.
    (tmp_path / "real").mkdir()
    real, link = tmp_path / "real" / "s.db", tmp_path / "link.db"
    entries = sample_entries()
    async with SQLiteStore(real) as store:
        await store.append("s", entries[:2], expected_version=0)
    link.symlink_to(real)
    async with SQLiteStore(link) as store:
        await store.append("s", entries[2:4], expected_version=2)
        real.unlink()
        with pytest.raises(StoreUnusable, match="deleted or replaced"):
            await store.load("s")
        with pytest.raises(StoreUnusable, match="write-ahead log") as raised:
            await store.load("s")
        assert f"{real}-wal" in str(raised.value)
        assert f"the file {real} it links to" in str(raised.value)
    assert not real.exists()
    real.with_name("s.db-wal").rename(tmp_path / "kept-wal")
    async with SQLiteStore(link) as store:  # the log moved away: a new file
        assert await store.load("s") == ()


async def test_a_file_replaced_under_an_open_store_is_refused_then_read_anew(
    tmp_path: Path,
) -> None:
    path, backup = tmp_path / "s.db", tmp_path / "backup.db"
    entries = sample_entries()
    async with SQLiteStore(backup) as other:
        await other.append("b", entries[:1], expected_version=0)
    async with SQLiteStore(path) as store:
        await store.append("s", entries[:1], expected_version=0)
        _remove_database(path)  # a backup restored in its place
        os.replace(backup, path)
        with pytest.raises(StoreUnusable, match="deleted or replaced"):
            await store.load("s")
        assert [s.id for s in await store.list_sessions()] == ["b"]
        await store.append("b", entries[1:2], expected_version=1)
    async with SQLiteStore(path) as again:
        assert len(await again.load("b")) == 2


async def test_the_write_ahead_log_shrinks_once_an_outside_reader_lets_go(
    tmp_path: Path,
) -> None:
    # While another connection holds a read, SQLite cannot checkpoint and the
    # log grows; checkpointed at last, it was written again from its start
    # but kept its peak size (39 MB in one case) while the store had it open.
    path, wal = tmp_path / "s.db", tmp_path / "s.db-wal"
    text = "x" * 200_000

    def entry(n: int) -> EventRecorded:
        said = Message.user(f"{n} {text}", id=f"m{n}")
        event = RunStarted(input=(said,))
        return EventRecorded(
            run_id="r", index=n, event=event, phase="x", decision="y", at=1.0
        )

    async with SQLiteStore(path) as store:
        version = await store.append("s", [entry(0)], expected_version=0)
        with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as reader:
            reader.execute("BEGIN")
            reader.execute("SELECT count(*) FROM turnfsm_entries").fetchall()
            grown = WAL_SIZE_LIMIT // len(text) + 20  # past the limit
            for n in range(1, grown):
                version = await store.append("s", [entry(n)], expected_version=version)
            assert wal.stat().st_size > WAL_SIZE_LIMIT
            reader.execute("COMMIT")
        for n in range(grown, grown + 3):
            version = await store.append("s", [entry(n)], expected_version=version)
        assert wal.stat().st_size <= WAL_SIZE_LIMIT
        assert len(await store.load("s")) == grown + 3


async def test_the_write_ahead_log_is_checkpointed_every_16_megabytes(
    tmp_path: Path,
) -> None:
    # SQLite's default checkpoints it at 4 MB, inside the append that gets
    # there: four times fewer of those make an append cheaper on average.
    path, wal = tmp_path / "s.db", tmp_path / "s.db-wal"
    text = "x" * 200_000
    sizes = []
    async with SQLiteStore(path) as store:
        version = 0
        for n in range(120):  # about 24 MB
            said = Message.user(f"{n} {text}", id=f"m{n}")
            entry = EventRecorded(
                run_id="r",
                index=n,
                event=RunStarted(input=(said,)),
                phase="x",
                decision="y",
                at=1.0,
            )
            version = await store.append("s", [entry], expected_version=version)
            sizes.append(wal.stat().st_size)
        assert len(await store.load("s")) == 120
    # It grew past 4 MB without a checkpoint, to about 16 MB, then was
    # written again from its start (its size kept, under the cut-back limit).
    assert max(sizes[:60]) > 10 * 1024 * 1024
    assert 15 * 1024 * 1024 < max(sizes) <= WAL_SIZE_LIMIT


async def test_a_run_whose_store_file_is_deleted_ends_with_one_line_said(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The run ended 'done', its later commits in the deleted file; then,
    # refused, its interruption's record met the file made anew (a
    # conflict), logged with a traceback.
    path = tmp_path / "agent.db"

    def step(n: int) -> str:
        """Take a step.

        Args:
            n: the step.
        """
        if n == 1:
            _remove_database(path)
        return f"step {n} taken"

    model = ScriptedModel.of(
        *(reply("", tool_call("step", f"c{n}", n=n)) for n in range(3)), "done"
    )
    agent = Agent(model=model, tools=[step], store=path)
    with pytest.raises(StoreUnusable, match="deleted or replaced"):
        await agent.run("take three steps")
    said = [
        record
        for record in caplog.records
        if "could not record its interruption" in record.getMessage()
    ]
    assert said, caplog.records
    assert all(record.exc_info is None for record in said)
    assert "SessionConflict" not in caplog.text
    await agent.store.aclose()


async def test_a_file_moved_under_an_open_store_leaves_its_last_commits_alone(
    tmp_path: Path,
) -> None:
    # The last commits are in the write-ahead log, named after the path:
    # a store opened on the path again made a new file there, and closing it
    # deleted that log, and the moved file's commits with it.
    path, moved = tmp_path / "s.db", tmp_path / "moved.db"
    entries = sample_entries()
    async with SQLiteStore(path) as store:
        await store.append("s", entries[:2], expected_version=0)
        os.rename(path, moved)
        with pytest.raises(StoreUnusable, match="deleted or replaced"):
            await store.append("s", entries[2:3], expected_version=2)
        with pytest.raises(StoreUnusable, match="write-ahead log") as raised:
            await store.load("s")
        assert f"{path}-wal" in str(raised.value)
        with pytest.raises(StoreUnusable, match="write-ahead log"):
            SQLiteStore(path)  # another process, as well
    assert not path.exists()
    for suffix in ("-wal", "-shm"):  # the log put back beside its file
        os.rename(f"{path}{suffix}", f"{moved}{suffix}")
    async with SQLiteStore(moved) as back:
        assert len(await back.load("s")) == 2


_OPEN_ON_A_FULL_DISK = textwrap.dedent(
    """
    import resource, sys
    from turnfsm.errors import StoreUnusable
    from turnfsm.persistence import SQLiteStore

    # Writes past 1 KiB fail (EFBIG; Python ignores SIGXFSZ): a full disk.
    resource.setrlimit(resource.RLIMIT_FSIZE, (1024, 1024))
    try:
        SQLiteStore(sys.argv[1])
    except StoreUnusable as refused:
        print(refused)
    """
)


@pytest.mark.skipif(sys.platform == "win32", reason="no RLIMIT_FSIZE")
async def test_a_new_store_on_a_full_disk_is_refused_as_unwritable(
    tmp_path: Path,
) -> None:
    # It said "it is not a usable SQLite database (database or disk is full)".
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    done = await anyio.run_process(
        [sys.executable, "-c", _OPEN_ON_A_FULL_DISK, str(tmp_path / "s.db")], env=env
    )
    said = done.stdout.decode()
    assert "it cannot be written" in said, said
    assert "not a usable SQLite database" not in said


_APPEND_ON_A_FULL_DISK = textwrap.dedent(
    """
    import asyncio, resource, sys
    from turnfsm.errors import StoreUnusable
    from turnfsm.persistence import SQLiteStore
    from turnfsm.testing import sample_entries

    async def main():
        store = SQLiteStore(sys.argv[1])
        await store.append("s", sample_entries()[:1], expected_version=0)
        # Writes past 64 KiB fail (EFBIG; Python ignores SIGXFSZ): the disk
        # fills while the store is open.
        resource.setrlimit(resource.RLIMIT_FSIZE, (65536, 65536))
        try:
            for n in range(100):
                await store.append(f"t{n}", sample_entries(), expected_version=0)
        except StoreUnusable as refused:
            print(refused)
        print(len(await store.load("s")))

    asyncio.run(main())
    """
)


@pytest.mark.skipif(sys.platform == "win32", reason="no RLIMIT_FSIZE")
async def test_an_append_on_a_full_disk_says_so_and_what_to_do(tmp_path: Path) -> None:
    # It said "database or disk is full (nothing was changed)", SQLite's words.
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    done = await anyio.run_process(
        [sys.executable, "-c", _APPEND_ON_A_FULL_DISK, str(tmp_path / "s.db")],
        env=env,
    )
    said = done.stdout.decode().splitlines()
    assert len(said) == 2, said
    assert "it cannot be written (" in said[0]
    assert "free some space on it" in said[0]
    assert said[1] == "1"  # what was committed before is there


async def test_a_message_edited_in_its_table_is_refused_naming_the_entry(
    tmp_path: Path,
) -> None:
    # A message's row is keyed by the digest of its content: a row whose
    # content no longer has that digest was changed after it was written, and
    # the log is refused, not read (and replayed) with the changed content.
    path = tmp_path / "edited.db"
    model = ScriptedModel.of(reply("adding", tool_call("add", "c1", a=2, b=3)), "5")

    def add(a: int, b: int) -> int:
        """Add two numbers.

        Args:
            a: the first.
            b: the second.
        """
        return a + b

    agent = Agent(model=model, tools=[add], store=path)
    result = await agent.run("2 + 3?")
    await agent.store.aclose()
    with contextlib.closing(sqlite3.connect(path)) as conn, conn:
        changed = conn.execute(
            "UPDATE turnfsm_messages SET body ="
            ' replace(body, \'"content":"5"\', \'"content":"7"\')'
            " WHERE body LIKE '%tool_result%'"
        ).rowcount
    assert changed == 1
    (digest,) = _rows(
        path, "SELECT digest FROM turnfsm_messages WHERE body LIKE '%tool_result%'"
    )[0]
    async with SQLiteStore(path) as store:
        with pytest.raises(CorruptRecord) as raised:
            await store.load(result.session_id)
    assert raised.value.path.startswith(f"sessions[{result.session_id!r}].entries[")
    assert digest in str(raised.value)
    assert "content" in raised.value.reason


# Another process holds the file locked until it reads a line (or for 30 s):
# in EXCLUSIVE locking mode, so that even a file already in WAL mode cannot
# be read, as while another turnfsm migrates it.
_HOLD_THE_LOCK = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("PRAGMA locking_mode = EXCLUSIVE")
conn.execute("BEGIN EXCLUSIVE")
print("held", flush=True)
sys.stdin.readline()
conn.execute("ROLLBACK")
"""


@contextlib.contextmanager
def _held_by_another_process(path: Path) -> Iterator[Callable[[], None]]:
    """Hold `path` locked in another process; yield the call that lets go."""
    import subprocess

    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD_THE_LOCK, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdin is not None
    assert holder.stdout is not None
    stdin = holder.stdin

    def let_go() -> None:
        if not stdin.closed:
            stdin.close()

    try:
        assert holder.stdout.readline() == "held\n"
        yield let_go
    finally:
        let_go()
        holder.wait(timeout=30)
        holder.stdout.close()


@pytest.mark.parametrize("when", ["made", "reopened"])
async def test_opening_a_file_another_process_holds_does_not_stall_the_loop(
    tmp_path: Path, when: str
) -> None:
    # The store's file opened on the event loop thread, waiting busy_timeout
    # for another process's lock: every other task of the loop (lease
    # renewals, timeouts, a server's other sessions) stood still meanwhile.
    path = tmp_path / "held.db"
    if when == "reopened":  # a store closed, its next call opens the file again
        store = SQLiteStore(path, busy_timeout=10)
        await store.aclose()
    gaps: list[float] = []
    with _held_by_another_process(path) as let_go:

        async def tick() -> None:
            last = time.monotonic()
            while True:
                await anyio.sleep(0.01)
                now = time.monotonic()
                gaps.append(now - last)
                last = now

        async with anyio.create_task_group() as group:
            group.start_soon(tick)
            await anyio.sleep(0.05)
            if when == "made":
                store = SQLiteStore(path, busy_timeout=10)
            with anyio.CancelScope() as scope:
                group.start_soon(_call_later, 2.0, let_go)
                start = time.monotonic()
                await store.append("s", sample_entries()[:1], expected_version=0)
                waited = time.monotonic() - start
            group.cancel_scope.cancel()
        assert not scope.cancelled_caught
    assert waited > 1.5  # the store did wait for the lock...
    assert max(gaps) < 1.0, max(gaps)  # ...while the loop went on
    async with store:
        assert await store.load("s") == sample_entries()[:1]


async def _call_later(delay: float, fn: Callable[[], None]) -> None:
    await anyio.sleep(delay)
    fn()


async def test_a_call_cancelled_while_the_file_opens_leaves_the_store_usable(
    tmp_path: Path,
) -> None:
    # The opening is not cut short: the cancelled caller waits it out (no
    # connection is left half set up), and the store's next call works.
    path = tmp_path / "held.db"
    with _held_by_another_process(path) as let_go:
        store = SQLiteStore(path, busy_timeout=10)
        async with anyio.create_task_group() as group:
            group.start_soon(_call_later, 1.0, let_go)
            with anyio.move_on_after(0.2) as scope:
                await store.append("s", sample_entries()[:1], expected_version=0)
                await anyio.sleep(10)  # the cancellation arrives here
    assert scope.cancelled_caught
    async with store:
        assert await store.load("s") == sample_entries()[:1]
        await store.append("s", sample_entries()[1:2], expected_version=1)
    assert _rows(path, "SELECT value FROM turnfsm_meta WHERE key = 'schema_version'")


async def test_the_log_of_a_file_replaced_under_an_open_store_is_moved_aside(
    tmp_path: Path,
) -> None:
    # The replaced file's write-ahead log stayed at the path: the store's
    # next call read it as the new file's and folded it in, and the sessions
    # of the file put there were lost; so would any other process's opening.
    path, backup = tmp_path / "s.db", tmp_path / "backup.db"
    entries = sample_entries()
    async with SQLiteStore(backup) as other:
        await other.append("b", entries[:3], expected_version=0)
    async with SQLiteStore(path) as store:
        await store.append("s", entries[:2], expected_version=0)
        assert (tmp_path / "s.db-wal").stat().st_size
        os.replace(backup, path)  # its log left beside it
        with pytest.raises(StoreUnusable, match="moved aside to") as raised:
            await store.load("s")
        (name,) = [n for n in os.listdir(tmp_path) if ".of-a-replaced-file-" in n]
        aside = tmp_path / name
        assert str(aside) in str(raised.value)
        assert [s.id for s in await store.list_sessions()] == ["b"]
    async with SQLiteStore(path) as again:
        assert len(await again.load("b")) == 3
        assert await again.load("s") == ()
    assert aside.stat().st_size  # the old file's commits, kept
