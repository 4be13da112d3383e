"""One lifecycle for every store: ``async with`` and ``aclose()``, a store that
opens again after it, and a PostgreSQL store that serves one event loop after
another with nothing to release in between; the old names warn."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from turnfsm.persistence import MemoryStore, SessionStore, SQLiteStore
from turnfsm.testing import sample_entries

ENTRIES = sample_entries()


def _postgres(postgres_url: Callable[[], str], name: str) -> Any:
    from psycopg.conninfo import make_conninfo

    from turnfsm.persistence.postgres import PostgresStore

    return PostgresStore(make_conninfo(postgres_url(), application_name=name))


def _connections(url: str, name: str) -> int:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
            (name,),
        ).fetchone()
    assert row is not None
    return int(row[0])


def _closed(url: str, name: str) -> bool:
    """Whether the store's connections are all gone (within 5 s).

    A closed connection's server process leaves `pg_stat_activity` a moment
    after the client said goodbye, later on a loaded machine; a leaked one
    never does.
    """
    deadline = time.monotonic() + 5
    while _connections(url, name):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def make(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], SessionStore]:
    if request.param == "memory":
        return MemoryStore
    if request.param == "sqlite":
        return lambda: SQLiteStore(tmp_path / f"{uuid.uuid4().hex}.db")
    fresh = request.getfixturevalue("postgres_url")
    return lambda: _postgres(fresh, f"lc_{uuid.uuid4().hex[:8]}")


def test_every_store_is_an_async_context_manager_that_reopens_after_aclose(
    make: Callable[[], Any],
) -> None:
    store = make()

    async def main() -> None:
        async with store as bound:
            assert bound is store
            await store.append("s", ENTRIES[:2], expected_version=0)
        # Closed: the next use opens it again, and what it holds is there.
        assert await store.load("s") == ENTRIES[:2]
        await store.append("s", ENTRIES[2:], expected_version=2)
        await store.aclose()
        await store.aclose()  # twice is fine
        assert await store.load("s") == ENTRIES
        await store.aclose()

    anyio.run(main)


def test_a_postgres_store_serves_event_loop_after_event_loop_and_leaks_nothing(
    postgres_server: str, postgres_url: Callable[[], str]
) -> None:
    name = f"lc_{uuid.uuid4().hex[:8]}"
    store = _postgres(postgres_url, name)

    async def use(version: int) -> None:
        async with anyio.create_task_group() as group:  # several connections
            for _ in range(3):
                group.start_soon(store.load, "s")
        await store.append(
            "s", ENTRIES[version : version + 1], expected_version=version
        )

    for version in range(4):
        # No release, no aclose: each loop's connections close as it ends.
        anyio.run(use, version)
        assert _closed(postgres_server, name)
    anyio.run(store.aclose)


@pytest.mark.parametrize("old", ["close", "release"])
def test_the_old_ways_to_close_a_postgres_store_warn_and_still_close(
    postgres_server: str, postgres_url: Callable[[], str], old: str
) -> None:
    name = f"lc_{uuid.uuid4().hex[:8]}"
    store = _postgres(postgres_url, name)

    async def main() -> int:
        await store.open()
        opened = _connections(postgres_server, name)
        with pytest.warns(DeprecationWarning, match=rf"PostgresStore.{old}\(\)"):
            await getattr(store, old)()
        assert _closed(postgres_server, name)
        return opened

    assert anyio.run(main) == 1


def test_sqlite_close_warns_and_still_closes(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "s.db")

    async def main() -> None:
        with pytest.warns(DeprecationWarning, match=r"SQLiteStore.close\(\)"):
            await store.close()
        assert store._handle.conn is None
        assert await store.load("nobody") == ()  # opened again

    anyio.run(main)
    anyio.run(store.aclose)
