"""Owner leases on every shipped store: processes racing for one lease, a live
owner refused with its liveness, a dead owner's lease taken over, force,
renewal after a loss, the server's clock on PostgreSQL, in-place upgrades,
and what `SessionBusy` and `LeaseLost` say."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.helpers import REPO_ROOT
from tests.persistence.lease_worker import store_of
from turnfsm import Agent
from turnfsm.errors import ConfigError, LeaseLost, SessionBusy
from turnfsm.persistence import (
    Lease,
    LeasingStore,
    MemoryStore,
    SessionStore,
    SQLiteStore,
)
from turnfsm.persistence.sqlite import SCHEMA_VERSION as SQLITE_SCHEMA
from turnfsm.testing import ScriptedModel, reply, sample_entries, tool_call

pytestmark = pytest.mark.anyio

WORKER = Path(__file__).with_name("lease_worker.py")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # psycopg runs on asyncio only


@pytest.fixture(params=["sqlite", "postgres"])
def spec(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A store spec a worker process opens: a file, or ``postgres:CONNINFO``."""
    if request.param == "sqlite":
        return str(tmp_path / "leases.db")
    fresh: Callable[[], str] = request.getfixturevalue("postgres_url")
    return "postgres:" + fresh()


@contextlib.asynccontextmanager
async def _open(spec: str) -> AsyncIterator[Any]:
    async with store_of(spec) as store:
        yield store


def _worker(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(WORKER), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )


@contextlib.contextmanager
def _killed_at_exit(proc: subprocess.Popen[str]) -> Iterator[subprocess.Popen[str]]:
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=30)


async def test_of_processes_racing_for_one_lease_exactly_one_wins(
    spec: str, tmp_path: Path
) -> None:
    async with _open(spec):
        pass  # the schema exists before the workers race
    gate = tmp_path / "gate"
    gate.mkdir()
    count = 3
    procs = [
        _worker("race", spec, "s1", f"owner-{n}", str(gate), str(count))
        for n in range(count)
    ]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        results.append(json.loads(out))
    winners = [n for n, r in enumerate(results) if r["won"]]
    assert len(winners) == 1, results
    winner = f"owner-{winners[0]}"
    losers = [r for r in results if not r["won"]]
    assert losers == [{"won": False, "owner": winner, "alive": True}] * (count - 1)
    async with _open(spec) as store:
        lease = await store.lease_of("s1")
        assert lease is not None
        assert lease.owner == winner


async def test_a_live_owner_refuses_a_second_and_a_killed_one_is_taken_over(
    spec: str,
) -> None:
    ttl = 1.0
    async with _open(spec):
        pass
    with _killed_at_exit(_worker("hold", spec, "s1", "owner-a", str(ttl))) as owner:
        assert owner.stdout is not None
        assert owner.stdout.readline().strip() == "held"
        async with _open(spec) as store:
            # Alive: it renews, so a second is refused however long it waits.
            for _ in range(3):
                with pytest.raises(SessionBusy) as caught:
                    await store.acquire_lease("s1", "owner-b", ttl=ttl)
                assert (caught.value.owner, caught.value.alive) == ("owner-a", True)
                await anyio.sleep(ttl / 2)
            # When the holder's lease runs out unless renewed: a process that
            # is gone can be waited out, without force.
            until = caught.value.until
            assert until is not None
            assert caught.value.since is not None
            assert caught.value.since < until <= time.time() + ttl + 1
            assert "whose lease is live until " in str(caught.value)
            since = caught.value.since
            os.kill(owner.pid, signal.SIGKILL)
            owner.wait(timeout=30)
            # Dead: its lease expires within ttl, then the second takes over.
            with anyio.fail_after(ttl * 10):
                while True:
                    try:
                        taken = await store.acquire_lease("s1", "owner-b", ttl=ttl)
                        break
                    except SessionBusy:
                        await anyio.sleep(0.05)
            assert taken.owner == "owner-b"
            assert since is not None
            assert taken.since > since
            # The dead owner's renewal would now be refused.
            with pytest.raises(LeaseLost) as lost:
                await store.renew_lease("s1", "owner-a", ttl=ttl)
            assert lost.value.holder == "owner-b"


async def test_a_stalled_run_goes_on_when_another_process_was_only_refused(
    spec: str,
) -> None:
    """A run's process stalls (paused, swapped out) past its lease; another
    process asks to run the session and is refused, since the run is open.
    Refused, it took nothing over: the stalled run goes on when it wakes,
    not stopped by `LeaseLost` with its run left open."""
    ttl = 0.5
    refusals: list[str] = []
    async with _open(spec) as store:

        async def look() -> str:
            """Look around."""
            time.sleep(ttl * 2)  # noqa: ASYNC251 - the process stalls: no renewal
            other = _worker("run", spec, agent.session.id)
            out, err = other.communicate(timeout=60)
            assert other.returncode == 0, err
            refusals.append(out.strip())
            return "nothing here"

        agent = Agent(
            model=ScriptedModel.of(reply("", tool_call("look", "c1")), "done"),
            tools=[look],
            store=store,
            lease_ttl=ttl,
        )
        result = await agent.run("look")
        assert refusals == ["SessionBusy"]
        assert result.outcome == "done"
        assert await store.lease_of(agent.session.id) is None  # released


async def test_a_renewal_racing_its_owners_take_back_keeps_the_lease(
    spec: str,
) -> None:
    """The lease was let go while its owner stalled; two calls of the owner
    meet: one takes it back while the other renews. The renewal finds the
    owner holding it, and holds it: never `LeaseLost` naming the owner as
    the one that took the session over."""
    outcomes: list[tuple[str, str | None]] = []
    async with _open(spec) as store:

        async def renew(session_id: str) -> None:
            try:
                renewed = await store.renew_lease(session_id, "owner-a", ttl=30)
            except LeaseLost as lost:
                outcomes.append(("lost", lost.holder))
            else:
                outcomes.append(("renewed", renewed.owner))

        for n in range(30):
            session_id = f"s{n}"
            await store.acquire_lease(session_id, "owner-a", ttl=30)
            await store.release_lease(session_id, "owner-a")  # another let it go
            async with anyio.create_task_group() as group:
                group.start_soon(
                    functools.partial(
                        store.acquire_lease, session_id, "owner-a", ttl=30
                    )
                )
                await renew(session_id)
            held = await store.lease_of(session_id)
            assert held is not None
            assert held.owner == "owner-a"
    # Renewed, or refused before the take-back, when nobody held it.
    assert set(outcomes) <= {("renewed", "owner-a"), ("lost", None)}
    assert len(outcomes) == 30


async def test_force_takes_a_live_lease_from_another_process(spec: str) -> None:
    async with _open(spec):
        pass
    with _killed_at_exit(_worker("hold", spec, "s1", "owner-a", "5")) as owner:
        assert owner.stdout is not None
        assert owner.stdout.readline().strip() == "held"
        async with _open(spec) as store:
            forced = await store.acquire_lease("s1", "owner-b", ttl=60, force=True)
            assert forced.owner == "owner-b"
            # The owner learns at its next renewal: it exits on LeaseLost.
            assert owner.wait(timeout=30) != 0
            assert owner.stderr is not None
            assert "LeaseLost" in owner.stderr.read()


async def test_postgres_leases_run_on_the_servers_clock(
    postgres_url: Callable[[], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from turnfsm.persistence.postgres import PostgresStore

    url = postgres_url()
    # This host's clock is a day off: the lease does not care.
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 86_400)
    async with PostgresStore(url) as store:
        lease = await store.acquire_lease("s1", "owner-a", ttl=30)
    assert abs(lease.since - real()) < 60
    assert abs(lease.expires_at - lease.since - 30) < 1


def test_sqlite_and_memory_leases_run_on_this_hosts_clock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = 1_000_000.0
    monkeypatch.setattr(time, "time", lambda: now)

    async def take(store: Any) -> Lease:
        lease: Lease = await store.acquire_lease("s1", "owner-a", ttl=30)
        return lease

    for store in (MemoryStore(), SQLiteStore(tmp_path / "s.db")):
        lease = anyio.run(take, store)
        assert (lease.since, lease.expires_at) == (now, now + 30)


async def test_an_old_sqlite_file_gains_the_lease_table_in_place(
    tmp_path: Path,
) -> None:
    path = tmp_path / "old.db"
    async with SQLiteStore(path) as store:
        await store.append("s1", sample_entries(), expected_version=0)
    # What a file of the schema before leases looks like.
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute("DROP TABLE turnfsm_leases")
        conn.execute("UPDATE turnfsm_meta SET value = '1' WHERE key = 'schema_version'")
    async with SQLiteStore(path) as store:
        assert await store.load("s1") == sample_entries()
        lease = await store.acquire_lease("s1", "owner-a", ttl=5)
        assert await store.lease_of("s1") == lease
    with contextlib.closing(sqlite3.connect(path)) as conn:
        meta = dict(conn.execute("SELECT key, value FROM turnfsm_meta").fetchall())
    assert meta["schema_version"] == str(SQLITE_SCHEMA) == "2"


async def test_an_old_postgres_schema_gains_the_lease_table_in_place(
    postgres_url: Callable[[], str],
) -> None:
    import psycopg

    from turnfsm.persistence.postgres import SCHEMA_VERSION, PostgresStore

    url = postgres_url()
    async with PostgresStore(url) as store:
        await store.append("s1", sample_entries(), expected_version=0)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP TABLE turnfsm_leases")
        conn.execute("UPDATE turnfsm_meta SET value = '1' WHERE key = 'schema_version'")
    async with PostgresStore(url) as store:
        assert await store.load("s1") == sample_entries()
        lease = await store.acquire_lease("s1", "owner-a", ttl=5)
        assert await store.lease_of("s1") == lease
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT value FROM turnfsm_meta WHERE key = 'schema_version'"
        ).fetchone()
    assert row == (str(SCHEMA_VERSION),)
    assert SCHEMA_VERSION == 3


async def test_a_store_of_ones_own_without_leases_still_works() -> None:
    class Plain:
        def __init__(self) -> None:
            self.inner = MemoryStore()

        async def append(
            self, session_id: str, entries: Any, *, expected_version: int
        ) -> int:
            return await self.inner.append(
                session_id, entries, expected_version=expected_version
            )

        async def load(self, session_id: str) -> Any:
            return await self.inner.load(session_id)

        async def list_sessions(self) -> Any:
            return await self.inner.list_sessions()

    plain = Plain()
    assert isinstance(plain, SessionStore)
    assert not isinstance(plain, LeasingStore)
    assert isinstance(MemoryStore(), LeasingStore)
    assert isinstance(SQLiteStore(Path(f"{uuid.uuid4().hex}.db")), LeasingStore)


@pytest.mark.parametrize(
    ("error", "says"),
    [
        (
            SessionBusy("s1", owner="host:42", alive=True, since=0.0),
            # Not "which is alive": its process may have ended with its lease
            # unreleased (its store failed), the lease live a while yet.
            "session 's1' is held by 'host:42' since 1970-01-01 00:00:00 UTC, whose "
            "lease is live (its process renews it while it runs); wait for its run "
            "to end, or take it over with force=True only if you know that process "
            "is gone",
        ),
        (
            SessionBusy("s1", owner="host:42", alive=True, since=0.0, until=30.0),
            "session 's1' is held by 'host:42' since 1970-01-01 00:00:00 UTC, whose "
            "lease is live until 1970-01-01 00:00:30 UTC (its process renews it "
            "while it runs); wait for its run to end, or take it over with "
            "force=True only if you know that process is gone (past 1970-01-01 "
            "00:00:30 UTC, resume and abandon take it over without it)",
        ),
        (
            SessionBusy("s1", owner="temporal:turnfsm-s1", alive=True, since=0.0),
            "session 's1' is held by its durable run, Temporal workflow "
            "'turnfsm-s1' since 1970-01-01 00:00:00 UTC; answer, steer or cancel it "
            "there (DurableRun), or take it over with force=True only once that "
            "workflow has ended without ending the run (terminated, or failed: "
            "its DurableRun.result() raises)",
        ),
        (
            SessionBusy("s1", "run_1", owner="host:42", alive=False, since=0.0),
            "session 's1' (run 'run_1') was held by 'host:42' since 1970-01-01 "
            "00:00:00 UTC, whose lease has expired (its process likely died); resume "
            "or abandon the run to take it over",
        ),
        (
            SessionBusy("s1", "run_1"),
            "session 's1' has an open run 'run_1' (paused, interrupted, or its "
            "process died); resume or abandon it first (await agent.resume('s1', "
            "'run_1', ...) or await agent.abandon('s1', 'run_1'))",
        ),
        (
            SessionBusy("s1"),
            "session 's1' is running another run; wait for it to end (a "
            "conversation takes one run at a time), or, for another conversation, "
            "give this run a Session of its own (run(..., session=...): "
            "Session(store=agent.store) starts one, await Session.open(agent.store, "
            "ID) reopens a stored one)",
        ),
        (
            LeaseLost("s1", "host:42", "host:7"),
            "'host:42' no longer holds the lease on session 's1' ('host:7' took the "
            "session over: the lease had expired, or was taken with force); stop "
            "working on the session and reload it to see what the other process did",
        ),
        (
            LeaseLost("s1", "host:42"),
            "'host:42' no longer holds the lease on session 's1' (nobody holds it "
            "now: the lease was released, or the session removed); stop working on "
            "the session and reload it to see what the other process did",
        ),
    ],
    ids=[
        "alive",
        "alive until",
        "workflow",
        "dead",
        "open run",
        "running here",
        "lost",
        "lost, free",
    ],
)
def test_lease_errors_say_who_holds_the_session_and_what_to_do(
    error: Exception, says: str
) -> None:
    assert str(error) == says


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"session_id": ""}, "session_id"),
        ({"owner": 5}, "owner"),
        ({"since": float("nan")}, "since"),
        ({"expires_at": "soon"}, "expires_at"),
    ],
)
def test_a_lease_value_checks_its_fields(fields: dict[str, Any], field: str) -> None:
    good: dict[str, Any] = {
        "session_id": "s",
        "owner": "o",
        "since": 1.0,
        "expires_at": 2.0,
    }
    with pytest.raises(ConfigError) as caught:
        Lease(**{**good, **fields})
    assert caught.value.field == field
