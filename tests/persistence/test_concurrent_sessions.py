"""Many sessions at once in one process, on one driver and one store object.

The bench's session script (`bench.concurrency`) at test scale: every
session's messages carry its tag, the scripted model refuses a request that
holds another session's message, and afterwards every session, reopened
from the store by a fresh store object, must be exactly its own script and
replay.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import anyio
import pytest

from bench.concurrency import (
    CrossTalk,
    Workload,
    answer,
    build_driver,
    check_session,
    first_input,
)
from turnfsm.persistence import MemoryStore, Session, SessionStore, SQLiteStore

pytestmark = pytest.mark.anyio

WORKLOAD = Workload(sessions=100, turns=6, model_latency=0.001)


async def run_all(store: SessionStore, workload: Workload) -> list[str]:
    """Start every session at once in one task group; return their ids."""
    driver = build_driver(workload)

    async def one(tag: str) -> None:
        session = Session(f"ses-{tag}", store=store)
        result = await driver.run(first_input(tag, workload.turns), session=session)
        assert result.outcome == "done", result.error

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            for tag in workload.tags():
                tg.start_soon(one, tag)
    return [f"ses-{tag}" for tag in workload.tags()]


async def check_all(store: SessionStore, workload: Workload) -> None:
    """Reopen every session from `store` and check it against its script."""
    spec = build_driver(workload).machine
    listed = {info.id: info.version for info in await store.list_sessions()}
    assert sorted(listed) == sorted(f"ses-{tag}" for tag in workload.tags())
    for tag in workload.tags():
        session = await Session.load(store, f"ses-{tag}")
        assert session.version == listed[session.id]
        check_session(session, tag, workload.turns, spec)


async def test_concurrent_sessions_on_one_sqlite_file_keep_to_their_own(
    tmp_path: Path,
) -> None:
    path = tmp_path / "sessions.db"
    async with SQLiteStore(path) as store:
        await run_all(store, WORKLOAD)
    async with SQLiteStore(path) as fresh:
        await check_all(fresh, WORKLOAD)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # psycopg: asyncio only
async def test_concurrent_sessions_on_one_postgres_store_keep_to_their_own(
    postgres_url: Callable[[], str],
) -> None:
    from turnfsm.persistence.postgres import PostgresStore

    url = postgres_url()
    # A pool smaller than the sessions: they queue for its connections.
    async with PostgresStore(url, max_size=4) as store:
        await run_all(store, WORKLOAD)
    async with PostgresStore(url) as fresh:
        await check_all(fresh, WORKLOAD)


async def test_the_check_catches_a_session_that_is_not_its_own() -> None:
    workload = Workload(sessions=2, turns=3)
    store = MemoryStore()
    await run_all(store, workload)
    spec = build_driver(workload).machine
    first, second = workload.tags()
    stranger = await Session.load(store, f"ses-{second}")
    with pytest.raises(CrossTalk, match="history differs at message 0"):
        check_session(stranger, first, workload.turns, spec)
    # The scripted model refuses a request holding another session's message.
    own = await Session.load(store, f"ses-{first}")
    mixed = [own.history[0], *stranger.history[1:3]]
    with pytest.raises(CrossTalk, match="not its own"):
        answer(mixed, workload.turns)
