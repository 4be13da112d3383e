"""PostgresStore: the conformance suite on a real server, several pools and
processes racing on one session, schema versions, lost connections, and
whole agent runs that reopen from a new store."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import importlib
import json
import os
import socket
import sys
import textwrap
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import anyio.abc
import pytest

# Without psycopg the module skips, unless PostgreSQL is required (CI): then
# the import fails loudly.
if os.environ.get("TURNFSM_REQUIRE_POSTGRES") == "1":
    psycopg = importlib.import_module("psycopg")
else:
    psycopg = pytest.importorskip("psycopg", reason="pip install 'turnfsm[postgres]'")

from turnfsm import Agent, serde
from turnfsm.errors import (
    ConfigError,
    DuplicateRecord,
    SessionConflict,
    StoreError,
    StoreUnusable,
)
from turnfsm.messages import Message
from turnfsm.persistence import Entry, EventRecorded, Session
from turnfsm.persistence.postgres import SCHEMA_VERSION, PostgresStore
from turnfsm.testing import (
    ScriptedModel,
    check_store,
    reply,
    sample_entries,
    tool_call,
)

pytestmark = pytest.mark.anyio

MakeStore = Callable[..., PostgresStore]


@pytest.fixture
def anyio_backend() -> str:
    # psycopg's async connections run on asyncio only.
    return "asyncio"


@pytest.fixture
async def make_store(
    postgres_url: Callable[[], str],
) -> AsyncIterator[Callable[..., PostgresStore]]:
    """Yield `make(url=None, **options)`: a store (a fresh schema without `url`)."""
    made: list[PostgresStore] = []

    def make(url: str | None = None, **options: object) -> PostgresStore:
        store = PostgresStore(url or postgres_url(), **options)  # type: ignore[arg-type]
        made.append(store)
        return store

    yield make
    for store in made:
        await store.aclose()


def _same(got: tuple[Entry, ...], want: tuple[Entry, ...] | list[Entry]) -> bool:
    return [serde.envelope(e) for e in got] == [serde.envelope(e) for e in want]


async def _query(url: str, sql: str, *params: object) -> list[tuple[object, ...]]:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute(sql, params or None)
        return await cur.fetchall() if cur.description else []


# -- the protocol ------------------------------------------------------


async def test_postgres_store_passes_the_conformance_suite(
    make_store: MakeStore, postgres_url: Callable[[], str]
) -> None:
    urls: dict[int, str] = {}

    def make() -> PostgresStore:
        url = postgres_url()
        store = make_store(url)
        urls[id(store)] = url
        return store

    async def damage(store: PostgresStore, session_id: str) -> None:
        await _query(
            urls[id(store)],
            "UPDATE turnfsm_sessions SET version = version + 2 WHERE id = %s",
            session_id,
        )

    await check_store(make, damage=damage)


@pytest.mark.parametrize(
    "texts",
    [[], [""], ["a"], ["é€😀", "\u2028", "x" * 70_000, '{"q": "\\"}'], ["s"] * 300],
    ids=["none", "empty", "one", "multibyte-long-escapes", "many"],
)
async def test_the_appends_arrays_reach_the_server_as_they_were(
    postgres_url: Callable[[], str], texts: list[str]
) -> None:
    # An append's columns go as binary arrays the store writes itself:
    # lengths in bytes, not characters; no element dropped or split.
    from turnfsm.persistence._postgres_append import ADAPTERS, _Int8s, _Texts

    numbers = [0, -1, 2**62, *range(len(texts))]
    async with await psycopg.AsyncConnection.connect(
        postgres_url(), autocommit=True, context=ADAPTERS
    ) as conn:
        cur = await conn.execute(
            "SELECT %b::text[], %b::bigint[], %b::bigint[]",
            (_Texts(texts), _Int8s(numbers), _Int8s()),
        )
        assert await cur.fetchone() == (texts, numbers, [])


async def test_a_sql_ascii_database_keeps_text_as_text(
    postgres_server: str,
) -> None:
    # SQL_ASCII keeps bytes as they come: the store speaks UTF-8 to it, so
    # what it writes reads back as the text it was (it read back as bytes).
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    name = f"ascii_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(postgres_server, autocommit=True) as conn:
        conn.execute(
            f"CREATE DATABASE {name} ENCODING 'SQL_ASCII' LC_COLLATE 'C'"
            " LC_CTYPE 'C' TEMPLATE template0"
        )
    try:
        url = make_conninfo(postgres_server, dbname=name)
        assert conninfo_to_dict(url)["dbname"] == name
        entries = sample_entries()
        async with PostgresStore(url) as store:
            await store.append("s1", entries, expected_version=0)
            assert _same(await store.load("s1"), entries)
    finally:
        with psycopg.connect(postgres_server, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


async def test_a_new_store_object_reads_what_another_wrote(
    make_store: MakeStore, postgres_url: Callable[[], str]
) -> None:
    url = postgres_url()
    entries = sample_entries()
    async with PostgresStore(url) as first:
        assert await first.append("s1", entries, expected_version=0) == len(entries)
    again = make_store(url)
    assert _same(await again.load("s1"), entries)
    assert [(s.id, s.version) for s in await again.list_sessions()] == [
        ("s1", len(entries))
    ]


async def test_several_pools_racing_at_one_version_give_one_winner(
    make_store: MakeStore, postgres_url: Callable[[], str]
) -> None:
    url = postgres_url()
    stores = [make_store(url, min_size=0, max_size=2) for _ in range(5)]
    entries = sample_entries()
    log: list[Entry] = []

    async def writer(
        n: int, version: int, wins: list[int], losses: list[SessionConflict]
    ) -> None:
        try:
            await stores[n].append("s", entries[n : n + 1], expected_version=version)
            wins.append(n)
        except SessionConflict as exc:
            losses.append(exc)

    for version in range(3):
        wins: list[int] = []
        losses: list[SessionConflict] = []
        async with anyio.create_task_group() as group:
            for n in range(len(stores)):
                group.start_soon(writer, n, version, wins, losses)
        assert len(wins) == 1
        assert [(e.expected, e.actual) for e in losses] == [(version, version + 1)] * 4
        log.append(entries[wins[0]])
    assert _same(await stores[0].load("s"), log)


async def test_stores_starting_together_migrate_once(
    make_store: MakeStore, postgres_url: Callable[[], str]
) -> None:
    url = postgres_url()
    stores = [make_store(url) for _ in range(6)]
    async with anyio.create_task_group() as group:
        for store in stores:
            group.start_soon(store.open)
    rows = await _query(url, "SELECT key, value FROM turnfsm_meta ORDER BY key")
    assert rows == [("application", "turnfsm"), ("schema_version", str(SCHEMA_VERSION))]


_RACER = textwrap.dedent(
    """
    import json, sys
    import anyio
    from turnfsm.errors import SessionConflict
    from turnfsm.persistence.postgres import PostgresStore
    from turnfsm.testing import sample_entries

    async def main(url, name, slots):
        async with PostgresStore(url) as store:
            print("ready", flush=True)
            sys.stdin.readline()
            won, lost = [], []
            for slot in range(slots):
                entries = sample_entries(f"{name}_{slot}")
                try:
                    await store.append(
                        "shared", entries, expected_version=slot * len(entries)
                    )
                    won.append(slot)
                except SessionConflict as exc:
                    lost.append([slot, exc.actual])
            print(json.dumps({"won": won, "lost": lost}), flush=True)

    anyio.run(main, sys.argv[1], sys.argv[2], int(sys.argv[3]))
    """
)


async def test_two_processes_racing_on_one_session_interleave_nothing(
    postgres_url: Callable[[], str], make_store: MakeStore
) -> None:
    url, slots = postgres_url(), 40
    processes: list[anyio.abc.Process] = []
    try:
        for name in ("a", "b"):
            processes.append(
                await anyio.open_process(
                    [sys.executable, "-c", _RACER, url, name, str(slots)]
                )
            )
        for process in processes:  # both connected (and migrated) first
            assert process.stdout is not None
            assert (await process.stdout.receive()).startswith(b"ready")
        for process in processes:
            assert process.stdin is not None
            await process.stdin.send(b"go\n")
        results = {}
        for name, process in zip("ab", processes, strict=True):
            assert process.stdout is not None
            out = b""
            with anyio.fail_after(60):
                async for chunk in process.stdout:
                    out += chunk
            assert await process.wait() == 0
            results[name] = json.loads(out)
    finally:
        for process in processes:
            if process.returncode is None:
                process.kill()
                await process.wait()
    # Every slot has exactly one winner; a loser found the log past its slot.
    winners = {slot: name for name in "ab" for slot in results[name]["won"]}
    assert sorted(winners) == list(range(slots))
    assert len(results["a"]["won"]) + len(results["b"]["won"]) == slots
    size = len(sample_entries())
    for name in "ab":
        for slot, actual in results[name]["lost"]:
            assert winners[slot] != name
            assert actual > slot * size
    # The log is the winners' appends in slot order: a serial history.
    want = [
        e for slot in range(slots) for e in sample_entries(f"{winners[slot]}_{slot}")
    ]
    assert _same(await make_store(url).load("shared"), want)


# -- what the store refuses --------------------------------------------


_FOREIGN_KEYS = (
    "SELECT conrelid::regclass::text FROM pg_constraint"
    " WHERE contype = 'f' AND connamespace = current_schema()::regnamespace"
    " ORDER BY 1"
)


async def test_a_schema_with_foreign_keys_loses_them_and_keeps_its_rows(
    make_store: MakeStore, postgres_url: Callable[[], str]
) -> None:
    # The schema before: each table's rows referenced their session's row.
    url = postgres_url()
    await make_store(url).append("s1", sample_entries(), expected_version=0)
    for table in ("turnfsm_entries", "turnfsm_messages", "turnfsm_compactions"):
        await _query(
            url,
            f"ALTER TABLE {table} ADD CONSTRAINT {table}_session_id_fkey"
            " FOREIGN KEY (session_id) REFERENCES turnfsm_sessions (id)"
            " ON DELETE CASCADE",
        )
    await _query(
        url, "UPDATE turnfsm_meta SET value = '2' WHERE key = 'schema_version'"
    )
    assert len(await _query(url, _FOREIGN_KEYS)) == 3
    store = make_store(url)
    assert _same(await store.load("s1"), sample_entries())
    assert await _query(url, _FOREIGN_KEYS) == []
    meta = await _query(
        url, "SELECT value FROM turnfsm_meta WHERE key = 'schema_version'"
    )
    assert meta == [(str(SCHEMA_VERSION),)] == [("3",)]
    assert await store.delete_session("s1")
    for table in ("turnfsm_entries", "turnfsm_messages", "turnfsm_compactions"):
        assert await _query(url, f"SELECT count(*) FROM {table}") == [(0,)]


async def test_deleting_a_session_while_an_append_commits_leaves_no_row_behind(
    make_store: MakeStore, postgres_url: Callable[[], str]
) -> None:
    # An append under way holds the session's row; the deletion waits for
    # it, then must see (and delete) the rows it committed.
    url = postgres_url()
    store = make_store(url)
    first = sample_entries()
    await store.append("s1", first, expected_version=0)
    async with await psycopg.AsyncConnection.connect(url) as writer:
        await writer.execute(
            "UPDATE turnfsm_sessions SET version = version + 1 WHERE id = 's1'"
        )
        await writer.execute(
            "INSERT INTO turnfsm_entries (session_id, seq, run_id, kind, body)"
            " SELECT 's1', %s, run_id, kind, body FROM turnfsm_entries"
            " WHERE session_id = 's1' AND seq = 0",
            (len(first),),
        )
        await writer.execute(
            "INSERT INTO turnfsm_messages (session_id, digest, body)"
            " VALUES ('s1', 'late', '{}')"
        )
        async with anyio.create_task_group() as tg:
            done: list[bool] = []

            async def delete() -> None:
                done.append(await store.delete_session("s1"))

            tg.start_soon(delete)
            await anyio.sleep(0.3)
            assert done == []  # waiting for the append's transaction
            await writer.commit()
    assert done == [True]
    for table in ("turnfsm_entries", "turnfsm_messages", "turnfsm_compactions"):
        assert await _query(url, f"SELECT count(*) FROM {table}") == [(0,)]
    assert await store.load("s1") == ()
    # A stale append after the deletion writes nothing.
    with pytest.raises(SessionConflict):
        await store.append("s1", first, expected_version=len(first) + 1)
    assert await _query(url, "SELECT count(*) FROM turnfsm_entries") == [(0,)]


async def test_a_newer_schema_is_refused_and_left_unchanged(
    make_store: MakeStore, postgres_url: Callable[[], str]
) -> None:
    url = postgres_url()
    await make_store(url).append("s1", sample_entries(), expected_version=0)
    await _query(
        url, "UPDATE turnfsm_meta SET value = '99' WHERE key = 'schema_version'"
    )
    before = await _query(url, "SELECT seq, body FROM turnfsm_entries ORDER BY seq")
    with pytest.raises(StoreUnusable) as caught:
        await make_store(url).load("s1")
    assert "schema version 99 is newer" in str(caught.value)
    assert caught.value.path.startswith("postgresql://turnfsm@127.0.0.1:")
    assert (
        await _query(url, "SELECT seq, body FROM turnfsm_entries ORDER BY seq")
        == before
    )
    meta = await _query(
        url, "SELECT value FROM turnfsm_meta WHERE key = 'schema_version'"
    )
    assert meta == [("99",)]


@pytest.mark.parametrize(
    ("sql", "said"),
    [
        (
            "UPDATE turnfsm_meta SET value = 'two' WHERE key = 'schema_version'",
            "its turnfsm_meta has a schema_version that is not a number: 'two'",
        ),
        (
            "DELETE FROM turnfsm_meta WHERE key = 'schema_version'",
            "its turnfsm_meta has no schema_version",
        ),
    ],
)
async def test_a_schema_version_that_cannot_be_read_is_refused(
    make_store: MakeStore, postgres_url: Callable[[], str], sql: str, said: str
) -> None:
    # A schema_version that is no number raised ValueError; a missing one
    # was read as 0: creating the tables again failed (DuplicateTable).
    url = postgres_url()
    await make_store(url).append("s1", sample_entries(), expected_version=0)
    await _query(url, sql)
    with pytest.raises(StoreUnusable) as caught:
        await make_store(url).load("s1")
    assert said in str(caught.value)
    assert len(await _query(url, "SELECT seq FROM turnfsm_entries")) == len(
        sample_entries()
    )


async def test_tables_that_cannot_be_made_are_refused_as_such_not_as_connecting(
    make_store: MakeStore, postgres_url: Callable[[], str]
) -> None:
    # It said "connecting failed: DuplicateTable": it had connected.
    url = postgres_url()
    await _query(url, "CREATE TABLE turnfsm_sessions (id INTEGER)")
    with pytest.raises(StoreUnusable) as caught:
        await make_store(url).list_sessions()
    said = str(caught.value)
    assert "setting up its tables failed: DuplicateTable" in said
    assert "connecting" not in said
    assert await _query(url, "SELECT to_regclass('turnfsm_meta')") == [(None,)]


async def test_another_applications_tables_are_refused(
    make_store: MakeStore, postgres_url: Callable[[], str]
) -> None:
    url = postgres_url()
    await _query(url, "CREATE TABLE turnfsm_meta (key TEXT PRIMARY KEY, value TEXT)")
    await _query(url, "INSERT INTO turnfsm_meta VALUES ('application', 'other')")
    with pytest.raises(StoreUnusable, match="another application"):
        await make_store(url).open()
    assert await _query(url, "SELECT to_regclass('turnfsm_entries')") == [(None,)]


async def test_a_user_who_may_not_create_tables_uses_tables_made_for_it(
    make_store: MakeStore, postgres_url: Callable[[], str]
) -> None:
    made, empty = postgres_url(), postgres_url()
    await make_store(made).append("s1", sample_entries(), expected_version=0)
    for url in (made, empty):  # as a user without CREATE rights on the schema
        ((schema,),) = await _query(url, "SELECT current_schema()")
        await _query(url, f"REVOKE CREATE ON SCHEMA {schema} FROM CURRENT_USER")
    assert _same(await make_store(made).load("s1"), sample_entries())
    with pytest.raises(StoreUnusable) as caught:
        await make_store(empty).list_sessions()
    ((schema,),) = await _query(empty, "SELECT current_schema()")
    assert (
        f"its tables must be created or migrated in schema '{schema}', and user "
        "'turnfsm' may not (permission denied for schema"
    ) in str(caught.value)
    assert f"GRANT CREATE ON SCHEMA {schema} TO turnfsm" in str(caught.value)
    assert await _query(empty, "SELECT to_regclass('turnfsm_meta')") == [(None,)]


async def test_a_user_who_may_only_read_reads_and_is_told_the_grant_to_write(
    make_store: MakeStore, postgres_url: Callable[[], str]
) -> None:
    # A team's read-only role: it said "InsufficientPrivilege: permission
    # denied for table turnfsm_leases", and nothing of what to do.
    url = postgres_url()
    await make_store(url).append("s1", sample_entries(), expected_version=0)
    ((schema,),) = await _query(url, "SELECT current_schema()")
    await _query(
        url,
        f"REVOKE INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {schema}"
        " FROM CURRENT_USER",
    )
    reader = make_store(url)
    assert _same(await reader.load("s1"), sample_entries())
    assert [info.id for info in await reader.list_sessions()] == ["s1"]
    writes = (
        reader.acquire_lease("s1", "me", ttl=30),
        reader.append("s1", sample_entries("run_2"), expected_version=10**6),
        reader.delete_session("s1"),
    )
    for write in writes:
        with pytest.raises(StoreUnusable) as caught:
            await write
        said = str(caught.value)
        assert f"user 'turnfsm' may not use its tables in schema '{schema}'" in said
        assert "(permission denied for table turnfsm_" in said
        assert (
            f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {schema}"
            in said
        )
        assert not caught.value.in_doubt
    assert _same(await reader.load("s1"), sample_entries())


async def test_a_search_path_naming_no_schema_says_so(
    make_store: MakeStore, postgres_server: str
) -> None:
    from psycopg.conninfo import make_conninfo

    url = make_conninfo(postgres_server, options="-csearch_path=nosuch_tenant")
    with pytest.raises(StoreUnusable) as caught:
        await make_store(url).list_sessions()
    assert (
        "no schema its search_path names exists (search_path='nosuch_tenant'): "
        "create the schema (CREATE SCHEMA), or name an existing one in the URL "
        "(options=-csearch_path=SCHEMA) (nothing was changed)"
    ) in str(caught.value)


async def test_a_repeated_compaction_key_fails_the_whole_append(
    make_store: MakeStore,
) -> None:
    store = make_store()
    entries = sample_entries()
    await store.append("s1", entries, expected_version=0)
    # The same run again: its compaction record carries the same key.
    with pytest.raises(DuplicateRecord) as caught:
        await store.append("s1", entries, expected_version=len(entries))
    assert caught.value.key == "run_1:3"
    twice = (*sample_entries("run_2"), *sample_entries("run_2"))
    with pytest.raises(DuplicateRecord):
        await store.append("s1", twice, expected_version=len(entries))
    assert _same(await store.load("s1"), entries)


async def test_a_refused_server_is_a_store_error_without_the_password(
    make_store: MakeStore,
) -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    store = make_store(f"postgresql://app:s3cret@127.0.0.1:{port}/db", timeout=2)
    with pytest.raises(StoreUnusable) as caught:
        await store.list_sessions()
    assert caught.value.path == f"postgresql://app@127.0.0.1:{port}/db"
    assert "s3cret" not in str(caught.value)
    assert "s3cret" not in repr(store)


def test_stores_on_two_schemas_of_one_database_name_their_schema() -> None:
    # Tenants in one database: listings and errors tell them apart.
    base = "postgresql://app:pw@db.internal/agents"
    a = PostgresStore(f"{base}?options=-csearch_path%3Dteam_a")
    b = PostgresStore(f"{base}?options=-c%20search_path%3Dteam_b")
    assert a.server == (
        "postgresql://app@db.internal:5432/agents?options=-csearch_path%3Dteam_a"
    )
    assert b.server.endswith("?options=-csearch_path%3Dteam_b")
    assert PostgresStore(base).server == "postgresql://app@db.internal:5432/agents"
    assert "pw" not in a.server


def test_bad_settings_are_config_errors() -> None:
    for options in ({"min_size": -1}, {"max_size": 0}, {"timeout": 0}):
        with pytest.raises(ConfigError):
            PostgresStore("postgresql://x@127.0.0.1/db", **options)
    with pytest.raises(ConfigError) as caught:
        PostgresStore("postgresql://u:pw@host/db?nonsense=1")
    assert "pw" not in str(caught.value)


@pytest.mark.parametrize(
    ("url", "told"),
    [
        # libpq quotes the text it could not read: here the whole URL,
        ("postgresql://app:s3cr3t@[::1:5432/db", "IPv6"),
        # here the password itself, or one given as a parameter.
        ("postgresql://app:s3%cr3t@host/db", "percent-encoded"),
        ("postgresql://app@host/db?password=s3cr3t%zz", "percent-encoded"),
        ("host=db password='s3cr3t", "unterminated"),
    ],
)
def test_a_url_that_does_not_parse_is_refused_without_its_password(
    url: str, told: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        PostgresStore(url)
    message = str(caught.value)
    assert "s3cr3t" not in message
    assert "s3%cr3t" not in message
    assert told in message  # what libpq found wrong is still said
    assert message.endswith(")")  # on one line


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://app:s3cr/3t@db.internal:5432/agents",
        "postgresql://app:s3cr@3t@db.internal:5432/agents",
        "postgresql://app@db.internal:notaport/agents",
    ],
    ids=["slash", "at", "port"],
)
def test_a_password_read_as_the_host_or_port_is_refused_unshown(url: str) -> None:
    # A '/' or an '@' left in the password: libpq read part of it as the
    # host, the port or the database, and the repr and every error printed
    # the URL back, password and all.
    with pytest.raises(ConfigError) as caught:
        PostgresStore(url)
    message = str(caught.value)
    assert "s3cr" not in message
    assert "3t@" not in message
    assert (caught.value.field, caught.value.value) == ("url", "<not shown>")
    assert "%2F, %40 or %3A" in message


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://h1:5432,h2/db",  # an empty port: the default one
        "host=a,b,c port=5432,,5434 dbname=x",
        "host=/var/run/postgresql dbname=x",
        "postgresql:///db?host=/tmp",
        "postgresql://u@[::1]:5432/db",
        "postgresql:///db?host=@name",  # an abstract socket
        "postgresql://u@db:5432/my@db",
        "postgresql://u:p%2Fw%40x@h:5432/db",
        "postgresql://myadmin%40server:pw@h:5432/db",
    ],
)
def test_the_urls_users_write_are_taken(url: str) -> None:
    assert PostgresStore(url).server.startswith("postgresql://")


def test_the_store_refuses_trio_with_a_config_error() -> None:
    async def main() -> None:
        with pytest.raises(ConfigError, match="asyncio"):
            await PostgresStore("postgresql://x@127.0.0.1:1/db").open()

    anyio.run(main, backend="trio")


async def test_operations_share_the_connections_the_server_allows(
    postgres_server: str,
) -> None:
    # A team's database allows so many connections (max_connections, a
    # role's or a database's CONNECTION LIMIT). Past them, an operation
    # failed with "too many connections" while the store's own connections
    # were busy a moment: it now waits for one of them.
    import uuid

    from psycopg.conninfo import make_conninfo

    name = f"lim_{uuid.uuid4().hex[:8]}"
    try:
        await _query(postgres_server, f"CREATE DATABASE {name} CONNECTION LIMIT 2")
    except psycopg.errors.InsufficientPrivilege:
        pytest.skip("the test role may not create databases")
    store = PostgresStore(make_conninfo(postgres_server, dbname=name), timeout=5)
    try:
        async with anyio.create_task_group() as group:
            for n in range(20):
                group.start_soon(
                    functools.partial(
                        store.append, f"s{n}", sample_entries(), expected_version=0
                    )
                )
        assert len(await store.list_sessions()) == 20
    finally:
        await store.aclose()
        # A connection attempt cut short may hold the drop until the
        # server's authentication_timeout: the error above comes first.
        with anyio.move_on_after(20):
            await _query(postgres_server, f"DROP DATABASE {name} WITH (FORCE)")


# -- lost connections --------------------------------------------------


class _Proxy:
    """A TCP proxy in front of the server that can cut every connection,
    or stall them all (forward nothing more, close nothing: a hung server,
    a network that drops packets)."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.open = True
        self.stalled = False
        self.scopes: set[anyio.CancelScope] = set()
        self.port = 0

    async def serve(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        async with await anyio.create_tcp_listener(local_host="127.0.0.1") as listener:
            self.port = listener.extra(anyio.abc.SocketAttribute.local_port)
            task_status.started()
            await listener.serve(self._handle)

    async def _handle(self, client: anyio.abc.SocketStream) -> None:
        async with client:
            if not self.open:
                return
            with anyio.CancelScope() as scope:
                self.scopes.add(scope)
                async with (
                    await anyio.connect_tcp(*self.upstream) as server,
                    anyio.create_task_group() as group,
                ):
                    group.start_soon(self._pipe, client, server)
                    group.start_soon(self._pipe, server, client)
            self.scopes.discard(scope)

    async def _pipe(self, a: anyio.abc.SocketStream, b: anyio.abc.SocketStream) -> None:
        with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
            async for chunk in a:
                if self.stalled:
                    await anyio.sleep_forever()
                await b.send(chunk)
            await b.send_eof()

    async def cut(self) -> None:
        """Drop every connection and refuse new ones, as a dead server would."""
        self.open = False
        for scope in self.scopes:
            scope.cancel()


class _LosingProxy(_Proxy):
    """A proxy that, once armed, cuts the connection that carries the next
    statement as its answer comes back: the server has done the work, the
    client never hears of it."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        super().__init__(upstream)
        self.armed = False
        self.sent: anyio.abc.SocketStream | None = None  # the armed statement's
        self.lost = 0
        self.close_after = False  # refuse new connections once it lost one

    async def _handle(self, client: anyio.abc.SocketStream) -> None:
        async with client:
            if not self.open:
                return
            with anyio.CancelScope() as scope:
                async with (
                    await anyio.connect_tcp(*self.upstream) as server,
                    anyio.create_task_group() as group,
                ):
                    group.start_soon(self._ask, client, server, scope)
                    group.start_soon(self._answer, server, client, scope)

    async def _ask(
        self,
        client: anyio.abc.SocketStream,
        server: anyio.abc.SocketStream,
        scope: anyio.CancelScope,
    ) -> None:
        with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
            async for chunk in client:
                if self.armed and self.sent is None:
                    self.sent = client
                await server.send(chunk)
            await server.send_eof()

    async def _answer(
        self,
        server: anyio.abc.SocketStream,
        client: anyio.abc.SocketStream,
        scope: anyio.CancelScope,
    ) -> None:
        with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
            async for chunk in server:
                if self.sent is client:
                    self.armed, self.sent = False, None
                    self.lost += 1
                    self.open = not self.close_after
                    scope.cancel()  # the answer never reaches the client
                    return
                await client.send(chunk)
            await client.send_eof()


async def test_an_append_whose_answer_is_lost_is_found_written_not_written_twice(
    make_store: MakeStore, postgres_url: Callable[[], str]
) -> None:
    """One round trip an append: a lost answer leaves it in doubt, and the
    retry on another connection finds its own rows instead of failing."""
    url = postgres_url()
    entries = sample_entries()
    proxy = _LosingProxy(_upstream(url))
    async with anyio.create_task_group() as group:
        await group.start(proxy.serve)
        store = make_store(_through(url, proxy.port), timeout=5)
        first = await store.append("s1", entries[:2], expected_version=0)
        proxy.armed = True
        second = await store.append("s1", entries[2:4], expected_version=first)
        proxy.armed = True  # a session's first append, created by the lost one
        other = await store.append("s2", entries[:1], expected_version=0)
        with pytest.raises(SessionConflict):  # a stale append is still refused
            await store.append("s1", entries[4:5], expected_version=first)
        group.cancel_scope.cancel()
    assert proxy.lost == 2
    assert (first, second, other) == (2, 4, 1)
    assert _same(await make_store(url).load("s1"), entries[:4])
    assert _same(await make_store(url).load("s2"), entries[:1])


async def test_an_append_in_doubt_on_every_connection_says_so(
    make_store: MakeStore, postgres_url: Callable[[], str]
) -> None:
    url = postgres_url()
    entries = sample_entries()
    proxy = _LosingProxy(_upstream(url))
    async with anyio.create_task_group() as group:
        await group.start(proxy.serve)
        store = make_store(_through(url, proxy.port), timeout=1, min_size=1)
        await store.append("s1", entries[:1], expected_version=0)  # connected
        proxy.armed = proxy.close_after = True
        with pytest.raises(StoreUnusable) as caught:
            await store.append("s1", entries[1:3], expected_version=1)
        group.cancel_scope.cancel()
    assert caught.value.in_doubt
    assert "it may have been written: reload the session to see" in str(caught.value)
    # It was: the server did the work, only the answer was lost.
    assert _same(await make_store(url).load("s1"), entries[:3])


def _through(url: str, port: int) -> str:
    from psycopg.conninfo import make_conninfo

    return make_conninfo(url, host="127.0.0.1", port=port)


def _upstream(url: str) -> tuple[str, int]:
    from psycopg.conninfo import conninfo_to_dict

    params = conninfo_to_dict(url)
    return str(params["host"]), int(str(params["port"]))


def _look(
    during: Callable[[], Awaitable[None]] | None = None,
) -> Callable[[], Awaitable[str]]:
    calls = []

    async def look() -> str:
        """Look around."""
        calls.append(1)
        if during is not None and len(calls) == 1:
            await during()
        return "nothing here"

    return look


async def _run_with(
    store: PostgresStore,
    during: Callable[[], Awaitable[None]],
    holder: list[Agent] | None = None,
) -> tuple[Agent, BaseException | None]:
    """Run an agent whose first tool call calls `during()`; return it, its error.

    `holder` gets the agent before it runs.
    """
    model = ScriptedModel.of(
        reply("", tool_call("look", "c1")), reply("", tool_call("look", "c2")), "done"
    )
    agent = Agent(model=model, tools=[_look(during)], store=store)
    if holder is not None:
        holder.append(agent)
    try:
        await agent.run("look twice")
    except StoreError as exc:
        return agent, exc
    return agent, None


async def test_a_backend_terminated_mid_run_is_reconnected_transparently(
    make_store: MakeStore, postgres_url: Callable[[], str]
) -> None:
    url = postgres_url()
    store = make_store(f"{url} application_name=victim", min_size=2, max_size=3)

    async def terminate() -> None:
        await _query(
            url,
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE application_name = 'victim'",
        )

    agent, error = await _run_with(store, terminate)
    assert error is None
    assert agent.session.runs[-1].outcome == "done"
    reopened = await Session.load(make_store(url), agent.session.id)
    assert _same(reopened.entries, agent.session.entries)


async def test_a_connection_lost_mid_run_is_a_store_error_and_nothing_half_written(
    make_store: MakeStore, postgres_url: Callable[[], str]
) -> None:
    url = postgres_url()
    proxy = _Proxy(_upstream(url))
    async with anyio.create_task_group() as group:
        await group.start(proxy.serve)
        store = make_store(_through(url, proxy.port), timeout=1)
        agent, error = await _run_with(store, proxy.cut)
        group.cancel_scope.cancel()
    assert isinstance(error, StoreUnusable)
    assert error.path.startswith(f"postgresql://turnfsm@127.0.0.1:{proxy.port}/turnfsm")
    assert "s3cret" not in str(error)
    # Reconnected (directly): the log is what the run's view had appended;
    # the append that met the cut is not there, not even in part.
    reopened = await Session.load(make_store(url), agent.session.id)
    assert _same(reopened.entries, agent.session.entries)
    assert [r.run_id for r in reopened.open_runs()] == [agent.session.runs[-1].run_id]
    assert [m.id for m in reopened.history] == [m.id for m in agent.session.history]
    versions = await _query(url, "SELECT version FROM turnfsm_sessions")
    assert versions == [(len(reopened.entries),)]
    # The interrupted run resumes to completion from the log.
    model = ScriptedModel.of(reply("", tool_call("look", "c2")), "done")
    later = Agent(model=model, tools=[_look()], store=make_store(url))
    run_id = reopened.open_runs()[0].run_id
    assert (await later.resume(reopened.id, run_id)).outcome == "done"
    final = await Session.load(make_store(url), reopened.id)
    assert final.open_runs() == []
    assert [m.text for m in final.history][-1] == "done"


async def test_a_server_that_stops_answering_mid_run_ends_the_run_in_time(
    make_store: MakeStore, postgres_url: Callable[[], str]
) -> None:
    url = postgres_url()
    proxy = _Proxy(_upstream(url))

    async def stall() -> None:
        proxy.stalled = True

    async with anyio.create_task_group() as group:
        await group.start(proxy.serve)
        store = make_store(_through(url, proxy.port), timeout=1)
        with anyio.fail_after(30):  # it waited for ever on the server's answer
            agent, error = await _run_with(store, stall)
        group.cancel_scope.cancel()
    assert isinstance(error, StoreUnusable)
    assert "did not answer within timeout=1.0 s" in str(error)
    assert error.in_doubt  # the statement may have reached the server
    # It did not: the run is open where the log says, and resumes.
    reopened = await Session.load(make_store(url), agent.session.id)
    (stopped,) = reopened.open_runs()
    model = ScriptedModel.of(reply("", tool_call("look", "c2")), "done")
    later = Agent(model=model, tools=[_look()], store=make_store(url))
    assert (await later.resume(reopened.id, stopped.run_id)).outcome == "done"


async def test_a_session_removed_under_its_run_says_so_and_the_store_goes_on(
    make_store: MakeStore, postgres_url: Callable[[], str]
) -> None:
    url = postgres_url()
    store = make_store(url)
    other = make_store(url)
    holder: list[Agent] = []

    async def remove() -> None:
        assert await other.delete_session(holder[0].session.id)

    agent, error = await _run_with(store, remove, holder)
    assert isinstance(error, SessionConflict)
    assert (error.actual, error.session_id) == (0, agent.session.id)
    # Nobody appended: it said "another writer appended first - reload the
    # session", and reloading it finds no session.
    assert "appended first" not in str(error)
    assert "no longer in the store: it was removed" in str(error)
    assert await other.load(agent.session.id) == ()
    assert await other.lease_of(agent.session.id) is None
    later = Agent(model=ScriptedModel.of("again"), store=store)
    assert (await later.run("hi")).outcome == "done"


async def test_an_append_given_up_on_does_not_wait_on_the_server_and_commit_later(
    make_store: MakeStore, postgres_url: Callable[[], str]
) -> None:
    """An append that waits on a lock past the store's timeout is reported in
    doubt; the server gives it up too, so it neither holds a connection on
    the server nor commits once the lock is let go."""
    url = postgres_url()
    entries = sample_entries()
    store = make_store(f"{url} application_name=waiter", timeout=1)
    await store.append("s1", entries[:1], expected_version=0)
    async with await psycopg.AsyncConnection.connect(url) as locker:
        await locker.execute("SELECT * FROM turnfsm_sessions FOR UPDATE")
        with pytest.raises(StoreUnusable) as caught:
            await store.append("s1", entries[1:3], expected_version=1)
        # The server gave it up first (nothing written), or the store did.
        given_up = "canceling statement due to statement timeout" in str(caught.value)
        assert given_up != caught.value.in_doubt
        await anyio.sleep(1.5)
        waiting = await _query(
            url,
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE application_name = 'waiter' AND state = 'active'",
        )
        await locker.commit()
    assert waiting == [(0,)]  # it waited for ever, holding a server connection
    await anyio.sleep(0.2)
    assert _same(await make_store(url).load("s1"), entries[:1])  # not committed later


async def test_a_statement_timeout_of_the_urls_own_is_kept(
    make_store: MakeStore, postgres_url: Callable[[], str]
) -> None:
    url = postgres_url()
    store = make_store(url, timeout=3)
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    given = conninfo_to_dict(url).get("options") or ""
    own = make_store(make_conninfo(url, options=f"{given} -c statement_timeout=7000"))

    async def shown(conn: Any, step: object) -> object:
        cur = await conn.execute("SHOW statement_timeout")
        return (await cur.fetchone())[0]

    assert await store._run("reading a setting", shown) == "3s"
    assert await own._run("reading a setting", shown) == "7s"


# -- whole runs --------------------------------------------------------


async def test_an_agent_run_reopens_from_a_new_store_and_goes_on(
    make_store: MakeStore, postgres_url: Callable[[], str]
) -> None:
    url = postgres_url()

    async def read(path: str) -> str:
        """Read a file."""
        return f"contents of {path}: " + "lorem ipsum " * 20

    model = ScriptedModel.of(reply("", tool_call("read", "c1", path="a.md")), "done")
    agent = Agent(model=model, tools=[read], store=make_store(url))
    result = await agent.run("summarise a.md")
    assert result.outcome == "done"
    session = agent.session

    reopened = await Session.load(make_store(url), session.id)
    assert _same(reopened.entries, session.entries)
    assert [m.id for m in reopened.history] == [m.id for m in session.history]
    assert [r.run_id for r in reopened.runs] == [r.run_id for r in session.runs]
    later = Agent(model=ScriptedModel.of("again"), store=reopened.store)
    await later.open_session(session.id)
    assert (await later.run("and now?")).outcome == "done"
    assert len(later.session.runs) == 2
    again = await Session.load(make_store(url), session.id)
    assert [m.id for m in again.history] == [m.id for m in later.session.history]

    # Message content is stored once: each message has one row, and no
    # entry body carries its text.
    (count,) = (await _query(url, "SELECT count(*) FROM turnfsm_messages"))[0]
    ids = {
        m.id for e in again.entries if isinstance(e, EventRecorded) for m in _said(e)
    }
    assert count == len(ids)
    rows = await _query(
        url, "SELECT count(*) FROM turnfsm_entries WHERE body LIKE '%lorem ipsum%'"
    )
    assert rows == [(0,)]
    rows = await _query(
        url, "SELECT count(*) FROM turnfsm_messages WHERE body LIKE '%lorem ipsum%'"
    )
    assert rows == [(1,)]


def test_one_store_serves_run_sync_calls_on_new_event_loops(
    postgres_url: Callable[[], str],
) -> None:
    store = PostgresStore(postgres_url())
    agent = Agent(model=ScriptedModel.of("one", "two"), store=store)
    assert agent.run_sync("first").outcome == "done"
    assert agent.run_sync("second").outcome == "done"

    async def load() -> int:
        # A pool opened on a loop is closed before the loop ends: a pool
        # left open is cancelled by the loop's shutdown, mid-connect at worst.
        async with store:
            return len(await store.load(agent.session.id))

    assert anyio.run(load) == agent.session.version


def test_run_sync_calls_leave_no_pool_or_event_loop_behind(
    postgres_url: Callable[[], str],
) -> None:
    # A sync web framework: each request's run_sync runs on a loop of its own,
    # for as long as the process lives, on one store.
    store = PostgresStore(postgres_url())
    agent = Agent(model=ScriptedModel.of(*["hi"] * 21), store=store)
    agent.run_sync("warm up")
    gc.collect()
    before = _closed_loops()

    for _ in range(20):
        assert agent.run_sync("hello").outcome == "done"
    gc.collect()

    assert _closed_loops() - before <= 1
    assert len(store._pools) <= 1


def _closed_loops() -> int:
    return sum(
        1
        for o in gc.get_objects()
        if isinstance(o, asyncio.AbstractEventLoop) and o.is_closed()
    )


def _said(entry: EventRecorded) -> list[Message]:
    from turnfsm.persistence import event_messages

    return list(event_messages(entry.event))


async def test_text_with_nul_characters_round_trips(make_store: MakeStore) -> None:
    store = make_store()
    agent = Agent(model=ScriptedModel.of("bin\x00ary"), store=store)
    await agent.run("a\x00b")
    reopened = await Session.load(store, agent.session.id)
    assert [m.text for m in reopened.history] == ["a\x00b", "bin\x00ary"]


async def test_the_version_check_is_exact_for_new_and_empty_sessions(
    make_store: MakeStore, postgres_url: Callable[[], str]
) -> None:
    url = postgres_url()
    store = make_store(url)
    entries = sample_entries()
    # An unknown session is at version 0, and the stale append wrote nothing.
    with pytest.raises(SessionConflict) as caught:
        await store.append("s", entries[:1], expected_version=2)
    assert (caught.value.expected, caught.value.actual) == (2, 0)
    assert await _query(url, "SELECT count(*) FROM turnfsm_sessions") == [(0,)]
    # An empty first append leaves the session at version 0 (not listed) ...
    assert await store.append("s", [], expected_version=0) == 0
    assert await store.list_sessions() == ()
    # ... and a first append finds it there.
    assert await store.append("s", entries[:2], expected_version=0) == 2
    for expected in (0, 1, 3):
        with pytest.raises(SessionConflict) as caught:
            await store.append("s", entries[2:4], expected_version=expected)
        assert (caught.value.expected, caught.value.actual) == (expected, 2)
    assert await store.append("s", [], expected_version=2) == 2
    assert _same(await store.load("s"), entries[:2])
    for table, count in (("entries", 2), ("sessions", 1)):
        rows = await _query(url, f"SELECT count(*) FROM turnfsm_{table}")
        assert rows == [(count,)]


async def test_a_known_key_fails_a_first_append_to_another_session_cleanly(
    make_store: MakeStore, postgres_url: Callable[[], str]
) -> None:
    # Keys are unique per session: the same run in two sessions is fine, and a
    # repeat in one session fails with the key named and nothing written.
    url = postgres_url()
    store = make_store(url)
    entries = sample_entries()
    await store.append("a", entries, expected_version=0)
    assert await store.append("b", entries, expected_version=0) == len(entries)
    with pytest.raises(DuplicateRecord) as caught:
        await store.append(
            "b", [*sample_entries("run_2"), *entries], expected_version=len(entries)
        )
    assert caught.value.key == "run_1:3"
    assert _same(await store.load("b"), entries)
    rows = await _query(url, "SELECT version FROM turnfsm_sessions WHERE id = 'b'")
    assert rows == [(len(entries),)]


def test_the_commands_a_session_shows_hide_the_stores_password(
    postgres_server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # `sessions show` printed the store's URL as given, password and all, in
    # the commands that answer a paused run; `run` printed it as PASSWORD.
    import psycopg

    from tests.cli.approval_agent import DELETED
    from turnfsm.cli import main

    password = psycopg.conninfo.conninfo_to_dict(postgres_server).get("password")
    if not password:
        pytest.skip("the test server's role has no password to hide")
    schema = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_server, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    separator = "&" if "?" in postgres_server else "?"
    url = f"{postgres_server}{separator}options=-csearch_path%3D{schema}"
    agent = ["--agent", "tests.cli.approval_agent:careful", "--store", url]
    try:
        assert main(["run", "Free disk.", *agent]) == 3
        ran = capsys.readouterr().out
        session_id = ran.split("session ", 1)[1].split()[0]
        assert main(["sessions", "show", session_id, "--store", url]) == 0
        out = capsys.readouterr().out
    finally:
        DELETED.clear()
        with psycopg.connect(postgres_server, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")

    assert "answer it: turnfsm approve" in out
    assert ":PASSWORD@" in out
    assert str(password) not in ran + out
