"""Bad stores, bad rows, odd text: one table, every shipped store.

Each row sets up a store holding a sound session (``s_ok``) and a session the
row may damage (``s_bad``), then does one thing. The row says which typed
error it must raise and what that error must name; the table checks that
nothing was written (the store's raw contents, and its directory, are as they
were), and that the sound session still loads, appends and is listed.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import attrs
import pytest

from turnfsm import Agent
from turnfsm.errors import (
    ConfigError,
    CorruptRecord,
    DuplicateRecord,
    SessionConflict,
    StoreUnusable,
)
from turnfsm.persistence import (
    Entry,
    MemoryStore,
    Session,
    SessionStore,
    SQLiteStore,
    open_store,
)
from turnfsm.testing import ScriptedModel, reply, sample_entries, tool_call

pytestmark = pytest.mark.anyio

SOUND = sample_entries()
N = len(SOUND)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # psycopg runs on asyncio only


@attrs.define
class Bench:
    """A store of one kind, with raw access to what it holds."""

    kind: str
    store: SessionStore
    tmp: Path
    sql: Callable[[str, tuple[Any, ...]], list[tuple[Any, ...]]] | None = None
    tables: tuple[str, ...] = ()

    def raw(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        assert self.sql is not None, f"no raw access to a {self.kind} store"
        return self.sql(sql, params)

    async def snapshot(self) -> object:
        """Everything the store holds, as its own rows (and the directory's files)."""
        files = sorted(p.name for p in self.tmp.iterdir())
        if self.sql is None:
            store = self.store
            listed = await store.list_sessions()
            logs = [(i.id, i.version, await store.load(i.id)) for i in listed]
            return files, logs
        tables = {
            t: sorted(map(repr, self.raw(f"SELECT * FROM {t}"))) for t in self.tables
        }
        return files, tables


_TABLES = (
    "turnfsm_sessions",
    "turnfsm_entries",
    "turnfsm_messages",
    "turnfsm_compactions",
    "turnfsm_leases",
)


def _sqlite_sql(path: Path) -> Callable[[str, tuple[Any, ...]], list[tuple[Any, ...]]]:
    def run(sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
            return conn.execute(sql, params).fetchall()

    return run


def _postgres_sql(url: str) -> Callable[[str, tuple[Any, ...]], list[tuple[Any, ...]]]:
    import psycopg

    def run(sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        with psycopg.connect(url, autocommit=True) as conn:
            cur = conn.execute(sql.replace("?", "%s"), params or None)  # type: ignore[arg-type]
            return cur.fetchall() if cur.description else []

    return run


@pytest.fixture
async def make_bench(
    tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[Callable[[str], Awaitable[Bench]]]:
    made: list[Bench] = []

    async def make(kind: str) -> Bench:
        home = tmp_path / f"{kind}-{uuid.uuid4().hex[:8]}"
        home.mkdir()
        if kind == "memory":
            bench = Bench(kind, MemoryStore(), home)
        elif kind == "sqlite":
            path = home / "s.db"
            bench = Bench(kind, SQLiteStore(path), home, _sqlite_sql(path), _TABLES)
        else:
            fresh = request.getfixturevalue("postgres_url")
            from turnfsm.persistence.postgres import PostgresStore

            url = fresh()
            store = PostgresStore(url)
            await store.open()
            bench = Bench(kind, store, home, _postgres_sql(url), _TABLES)
        await bench.store.append("s_ok", SOUND, expected_version=0)
        await bench.store.append("s_bad", sample_entries("run_b"), expected_version=0)
        made.append(bench)
        return bench

    yield make
    for bench in made:
        close = getattr(bench.store, "aclose", None)
        if close is not None:
            await close()


# -- what each row does ----------------------------------------------------


def _make_fifo(bench: Bench) -> None:
    os.mkfifo(bench.tmp / "store.fifo")


def _make_dir(bench: Bench) -> None:
    (bench.tmp / "a-dir").mkdir()


async def _fifo(bench: Bench) -> object:
    return SQLiteStore(bench.tmp / "store.fifo")


async def _directory(bench: Bench) -> object:
    return open_store(str(bench.tmp / "a-dir"))


async def _nul_path(bench: Bench) -> object:
    return open_store(str(bench.tmp / "s\x00.db"))


async def _nul_agent_store(bench: Bench) -> object:
    return Agent(model=ScriptedModel.of("hi"), store=bench.tmp / "s\x00.db")


async def _load_bad(bench: Bench) -> object:
    return await Session.load(bench.store, "s_bad")


async def _listing(bench: Bench) -> object:
    return await bench.store.list_sessions()


def _listing_names_the_damaged_one(result: Any) -> None:
    problems = {info.id: info.problem for info in result}
    assert set(problems) == {"s_ok", "s_bad"}
    assert problems["s_ok"] is None
    assert problems["s_bad"] == (
        f"its version counter says {N + 3} entries, the log holds {N}"
    )


async def _ghost(bench: Bench) -> object:
    return await bench.store.append("s_new", SOUND[:2], expected_version=2)


async def _ghost_key(bench: Bench) -> object:
    twice = (*sample_entries("run_x"), *sample_entries("run_x")[7:8])
    return await bench.store.append("s_new", twice, expected_version=0)


async def _split_pair(bench: Bench) -> object:
    return await bench.store.append("\ud83d\ude00", SOUND[:1], expected_version=0)


ODD = "caf\udce9.txt \udcff \ud800 \x00"


async def _surrogates(bench: Bench) -> object:
    async def ls(path: str) -> str:
        """List a directory (names with undecodable bytes stay as surrogates)."""
        return f"{path}: " + os.fsdecode(b"caf\xe9.txt")

    model = ScriptedModel.of(reply("", tool_call("ls", "c1", path=ODD)), f"found {ODD}")
    agent = Agent(model=model, tools=[ls], store=bench.store)
    session = Session(f"ses_{ODD}", store=bench.store)
    result = await agent.run(f"list {ODD}", session=session)
    assert result.outcome == "done"
    return session


async def _read_back_identically(bench: Bench, session: Any) -> None:
    again = await Session.load(bench.store, session.id)
    assert again.id == f"ses_{ODD}"
    _assert_same(again.entries, session.entries)
    texts = [m.text for m in again.history]
    assert texts == [f"list {ODD}", "", "", f"found {ODD}"]
    results = [p.content for m in again.history for p in m.tool_results]
    assert results == [f"{ODD}: caf\udce9.txt"]
    assert f"ses_{ODD}" in [i.id for i in await bench.store.list_sessions()]


def _assert_same(got: tuple[Entry, ...], want: tuple[Entry, ...]) -> None:
    from turnfsm import serde

    assert [serde.envelope(e) for e in got] == [serde.envelope(e) for e in want]


# -- the table -------------------------------------------------------------


@attrs.frozen
class Row:
    """One bad case: what it does, on which stores, and what it must raise."""

    name: str
    stores: tuple[str, ...]
    act: Callable[[Bench], Awaitable[object]]
    error: type[Exception] | None
    # What the error must name: (attribute, expected value) pairs, an
    # expected value may be a callable test.
    names: tuple[tuple[str, object], ...] = ()
    damage: tuple[str, tuple[Any, ...]] | None = None  # raw SQL run first
    setup: Callable[[Bench], None] | None = None  # run first, too
    writes: bool = False  # the row writes on purpose (checked by `then`)
    then: Callable[..., object] | None = None


ALL = ("memory", "sqlite", "postgres")
DB = ("sqlite", "postgres")
_ENTRY = "UPDATE turnfsm_entries SET body = ? WHERE session_id = 's_bad' AND seq = 2"
_MESSAGE = (
    "UPDATE turnfsm_messages SET body = 'not json' WHERE session_id = 's_bad'"
    " AND digest = (SELECT min(digest) FROM turnfsm_messages"
    " WHERE session_id = 's_bad')"
)


_INFLATE = "UPDATE turnfsm_sessions SET version = version + 3 WHERE id = 's_bad'"


def _has(*parts: str) -> Callable[[object], bool]:
    return lambda value: all(part in str(value) for part in parts)


ROWS = [
    Row(
        "FIFO as the SQLite file",
        ("sqlite",),
        _fifo,
        StoreUnusable,
        (("path", _has("store.fifo")), ("reason", _has("FIFO", "not a regular file"))),
        setup=_make_fifo,
    ),
    Row(
        "directory as the SQLite file",
        ("sqlite",),
        _directory,
        StoreUnusable,
        (("path", _has("a-dir")), ("reason", _has("a directory"))),
        setup=_make_dir,
    ),
    Row(
        "NUL in the store path",
        ("sqlite",),
        _nul_path,
        ConfigError,
        (("field", "path"), ("value", _has("s\x00.db"))),
    ),
    Row(
        "NUL in an agent's store path",
        ("sqlite",),
        _nul_agent_store,
        ConfigError,
        (("field", "path"), ("value", _has("s\x00.db"))),
    ),
    Row(
        "entry row that is not JSON",
        DB,
        _load_bad,
        CorruptRecord,
        (("path", "sessions['s_bad'].entries[2]"), ("reason", _has("not JSON"))),
        damage=(_ENTRY, ("{not json",)),
    ),
    Row(
        "entry row that is not text",
        ("sqlite",),
        _load_bad,
        CorruptRecord,
        (("path", "sessions['s_bad'].entries[2]"), ("reason", _has("a bytes"))),
        damage=(_ENTRY, (b"\x00\xff",)),
    ),
    Row(
        "message row that is not JSON",
        DB,
        _load_bad,
        CorruptRecord,
        (("path", _has("sessions['s_bad'].entries[", "$msg")),),
        damage=(_MESSAGE, ()),
    ),
    Row(
        "version counter above the entry count",
        DB,
        _load_bad,
        CorruptRecord,
        (
            ("path", "sessions['s_bad'].version"),
            ("reason", _has(f"says {N + 3} entries", f"holds {N}")),
        ),
        damage=(_INFLATE, ()),
    ),
    Row(
        "a row missing from the log",
        DB,
        _load_bad,
        CorruptRecord,
        (("path", "sessions['s_bad'].entries[4]"), ("reason", _has("numbered 5"))),
        damage=(
            "DELETE FROM turnfsm_entries WHERE session_id = 's_bad' AND seq = 4",
            (),
        ),
    ),
    Row(
        "damaged session in a listing",
        DB,
        _listing,
        None,
        damage=(_INFLATE, ()),
        then=_listing_names_the_damaged_one,
    ),
    Row(
        "ghost: a refused first append",
        ALL,
        _ghost,
        SessionConflict,
        (("session_id", "s_new"), ("expected", 2), ("actual", 0)),
    ),
    Row(
        "ghost: a repeated compaction key in a first append",
        ALL,
        _ghost_key,
        DuplicateRecord,
        (("session_id", "s_new"), ("key", "run_x:3")),
    ),
    Row(
        "a session id with a surrogate pair split in two",
        ALL,
        _split_pair,
        ConfigError,
        (("field", "session_id"), ("value", "\ud83d\ude00")),
    ),
    Row(
        "lone surrogates in a session id, input, tool output and reply",
        ALL,
        _surrogates,
        None,
        writes=True,
        then=_read_back_identically,
    ),
]


def _cases() -> list[Any]:
    return [
        pytest.param(row, kind, id=f"{kind}: {row.name}")
        for row in ROWS
        for kind in row.stores
    ]


@pytest.mark.parametrize(("row", "kind"), _cases())
async def test_a_bad_store_row_or_id_is_refused_typed_and_nothing_is_written(
    row: Row, kind: str, make_bench: Callable[[str], Awaitable[Bench]]
) -> None:
    bench = await make_bench(kind)
    if row.damage is not None:
        bench.raw(row.damage[0], *row.damage[1])
    if row.setup is not None:
        row.setup(bench)
    before = await bench.snapshot()
    outcome: object = None
    with anyio.fail_after(10):  # a FIFO must not hang the store
        if row.error is None:
            outcome = await row.act(bench)
        else:
            with pytest.raises(row.error) as caught:
                await row.act(bench)
            for attribute, expected in row.names:
                value = getattr(caught.value, attribute)
                if callable(expected):
                    assert expected(value), f"{attribute}={value!r} in {caught.value}"
                else:
                    assert value == expected, f"{attribute} in {caught.value}"
            assert str(caught.value)  # an explicit message
    if row.then is not None:
        if row.writes:
            await row.then(bench, outcome)  # type: ignore[misc]
        else:
            row.then(outcome)
    if not row.writes:
        assert await bench.snapshot() == before  # nothing was written
    # The sound session is untouched and goes on.
    _assert_same(await bench.store.load("s_ok"), SOUND)
    assert "s_ok" in [info.id for info in await bench.store.list_sessions()]
    more = sample_entries("run_more")
    assert await bench.store.append("s_ok", more[:1], expected_version=N) == N + 1
