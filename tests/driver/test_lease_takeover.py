"""Two processes, one session: a live owner refuses; a dead one is taken over."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest

from tests.driver.lease_worker import TTL, build
from tests.helpers import REPO_ROOT
from turnfsm import Agent, approval_machine
from turnfsm.core import ToolCallsReviewed
from turnfsm.driver import Driver
from turnfsm.driver import _lease as driver_lease
from turnfsm.errors import LeaseLost, SessionBusy, StoreUnusable
from turnfsm.persistence import Lease, Session, SQLiteStore
from turnfsm.testing import FakeModelClient, ScriptedModel, reply, tool_call

pytestmark = pytest.mark.timeout(120)


def _load(path: Path, session_id: str) -> Session:
    async def go() -> Session:
        async with SQLiteStore(path) as store:
            return await Session.load(store, session_id)

    return anyio.run(go)


def test_a_live_owner_refuses_then_a_dead_one_is_taken_over(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    owner = subprocess.Popen(
        [sys.executable, "-m", "tests.driver.lease_worker", str(path), "ses_shared"],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert owner.stdout is not None
        assert owner.stdout.readline().decode().strip() == "holding"
        session = _load(path, "ses_shared")
        (run,) = session.open_runs()

        async def resume(*, force: bool = False) -> object:
            async with SQLiteStore(path) as store:
                again = await Session.load(store, "ses_shared")
                return await build(hang=False).resume(again, run.run_id, force=force)

        # The owner is alive (it keeps renewing): refused, and told so.
        time.sleep(TTL * 1.5)  # longer than a lease: only renewals keep it
        with pytest.raises(SessionBusy) as refused:
            anyio.run(resume)
        assert refused.value.alive is True
        assert refused.value.owner is not None
        assert f":{owner.pid}:" in refused.value.owner
        assert refused.value.since is not None
        assert "whose lease is live until" in str(refused.value)
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.communicate()
    # Dead: its lease expires, and the run is taken over where it stopped.
    time.sleep(TTL * 1.5)
    result = anyio.run(resume)
    assert result.ok, result  # type: ignore[attr-defined]
    finished = _load(path, "ses_shared")
    assert [r.outcome for r in finished.runs] == ["done"]
    assert finished.history[-1].text == "all done"


def test_a_new_run_on_a_dead_owners_session_says_it_is_dead(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    owner = subprocess.Popen(
        [sys.executable, "-m", "tests.driver.lease_worker", str(path), "ses_dead"],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        stdout=subprocess.PIPE,
    )
    assert owner.stdout is not None
    assert owner.stdout.readline().decode().strip() == "holding"
    owner.send_signal(signal.SIGKILL)
    owner.communicate()
    time.sleep(TTL * 1.5)

    async def run() -> object:
        async with SQLiteStore(path) as store:
            session = await Session.load(store, "ses_dead")
            return await build(hang=False).run("something else", session=session)

    with pytest.raises(SessionBusy) as refused:
        anyio.run(run)
    assert refused.value.alive is False
    assert refused.value.run_id is not None
    assert "resume or abandon" in str(refused.value)


@pytest.mark.anyio
async def test_a_run_whose_lease_is_taken_over_stops_and_writes_nothing(
    tmp_path: Path,
) -> None:
    ran: list[str] = []
    steal = anyio.Event()

    async def work(step: str) -> str:
        """Do one step.

        Args:
            step: which.
        """
        steal.set()
        await anyio.sleep(1.0)  # the next renewal lands in here
        ran.append(step)
        return f"{step} done"

    model = ScriptedModel.of(
        reply("", tool_call("work", "c1", step="one")),
        reply("", tool_call("work", "c2", step="two")),
        "all done",
    )
    async with SQLiteStore(tmp_path / "s.db") as store:
        session = Session(store=store)
        driver = Driver(model=model, tools=[work], lease_ttl=0.3)
        version = 0

        async def take_over() -> None:
            nonlocal version
            await steal.wait()
            await store.acquire_lease(session.id, "elsewhere:1:x", ttl=30, force=True)
            version = len(await store.load(session.id))

        with anyio.fail_after(10):
            async with anyio.create_task_group() as group:
                group.start_soon(take_over)
                with pytest.raises(LeaseLost) as lost:
                    await driver.run("do two steps", session=session)
        # The run stopped at its next renewal, in its tool, and wrote
        # nothing after the take-over: the other owner carries it on.
        assert ran == []
        assert lost.value.holder == "elsewhere:1:x"
        assert "took the session over" in str(lost.value)
        assert len(await store.load(session.id)) == version
        lease = await store.lease_of(session.id)
        assert lease is not None
        assert lease.owner == "elsewhere:1:x"


@pytest.mark.anyio
async def test_a_run_whose_taker_appended_first_raises_lease_lost(
    tmp_path: Path,
) -> None:
    # The run's process stalled past its lease (paused, swapped out): another
    # took the session over and appended before this run's next renewal. The
    # run's next append is refused; it says the session was taken over, not
    # "run it again".
    async with SQLiteStore(tmp_path / "s.db") as store:
        session = Session(store=store)

        async def work(step: str) -> str:
            """Do one step.

            Args:
                step: which.
            """
            await store.acquire_lease(session.id, "elsewhere:1:x", ttl=30, force=True)
            entries = await store.load(session.id)
            await store.append(session.id, [entries[-1]], expected_version=len(entries))
            return f"{step} done"

        model = ScriptedModel.of(
            reply("", tool_call("work", "c1", step="one")), "all done"
        )
        driver = Driver(model=model, tools=[work], lease_ttl=30)
        with anyio.fail_after(10):
            with pytest.raises(LeaseLost) as lost:
                await driver.run("do one step", session=session)
        assert lost.value.holder == "elsewhere:1:x"
        assert "took the session over" in str(lost.value)
        lease = await store.lease_of(session.id)
        assert lease is not None
        assert lease.owner == "elsewhere:1:x"


@pytest.mark.anyio
async def test_a_run_abandoned_by_force_before_its_next_renewal_raises_lease_lost(
    tmp_path: Path,
) -> None:
    # Another process abandoned the run with force while a tool ran: it took
    # the lease, ended the run and released the lease. The run's next append
    # was refused as a conflict ("run it again"), though the run was over.
    async with SQLiteStore(tmp_path / "s.db") as store:
        session = Session(store=store)

        async def work(step: str) -> str:
            """Do one step.

            Args:
                step: which.
            """
            taker = "elsewhere:1:x"
            await store.acquire_lease(session.id, taker, ttl=30, force=True)
            entries = await store.load(session.id)
            await store.append(session.id, [entries[-1]], expected_version=len(entries))
            await store.release_lease(session.id, taker)
            return f"{step} done"

        model = ScriptedModel.of(
            reply("", tool_call("work", "c1", step="one")), "all done"
        )
        driver = Driver(model=model, tools=[work], lease_ttl=30)
        with anyio.fail_after(10):
            with pytest.raises(LeaseLost) as lost:
                await driver.run("do one step", session=session)
        assert lost.value.holder is None
        assert "nobody holds it now" in str(lost.value)
        assert await store.lease_of(session.id) is None


@pytest.mark.anyio
async def test_a_run_that_stalled_past_its_lease_writes_nothing_after_a_take_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The run's process stalls (paused, swapped out) past its lease; another
    # takes the session over but has not written yet. When the run wakes up,
    # its next write checks the lease first: it raises LeaseLost and writes
    # nothing into the session that is no longer its own.
    now = [1000.0]
    monkeypatch.setattr(driver_lease, "_clock", lambda: now[0])
    async with SQLiteStore(tmp_path / "s.db") as store:
        session = Session(store=store)
        taken_at: list[int] = []

        async def work(step: str) -> str:
            """Do one step.

            Args:
                step: which.
            """
            await store.acquire_lease(session.id, "elsewhere:1:x", ttl=30, force=True)
            taken_at.append(len(await store.load(session.id)))
            now[0] += 31  # the stall: no renewal ran for longer than the lease
            return f"{step} done"

        model = ScriptedModel.of(
            reply("", tool_call("work", "c1", step="one")), "all done"
        )
        driver = Driver(model=model, tools=[work], lease_ttl=30)
        with anyio.fail_after(10):
            with pytest.raises(LeaseLost) as lost:
                await driver.run("do one step", session=session)
        assert lost.value.holder == "elsewhere:1:x"
        assert len(await store.load(session.id)) == taken_at[0]
        lease = await store.lease_of(session.id)
        assert lease is not None
        assert lease.owner == "elsewhere:1:x"


@pytest.mark.anyio
async def test_a_renewal_told_the_run_itself_holds_the_lease_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A store of the user's reads who holds the lease after its renewal found
    # none, and another call of this process took the lease back in between
    # (a database that lets one statement see what another committed since):
    # its `LeaseLost` names the run's own owner. That owner holds the
    # session: the run goes on, and ends with the lease let go.
    now = [1000.0]
    monkeypatch.setattr(driver_lease, "_clock", lambda: now[0])
    told: list[str] = []

    class ReadCommitted(SQLiteStore):
        async def renew_lease(
            self, session_id: str, owner: str, *, ttl: float
        ) -> Lease:
            if not told:
                told.append(owner)
                await super().acquire_lease(session_id, owner, ttl=ttl)
                raise LeaseLost(session_id, owner, owner)
            return await super().renew_lease(session_id, owner, ttl=ttl)

    async with ReadCommitted(tmp_path / "s.db") as store:
        session = Session(store=store)

        async def work() -> str:
            """Do the work."""
            now[0] += 31  # a stall: the next write renews the lease first
            return "worked"

        model = ScriptedModel.of(reply("", tool_call("work", "c1")), "all done")
        driver = Driver(model=model, tools=[work], lease_ttl=30)
        with anyio.fail_after(10):
            result = await driver.run("work", session=session)
        assert result.ok, result.error
        assert told  # the renewal was told so
        assert await store.lease_of(session.id) is None


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_an_agent_takes_a_run_over_from_a_gone_owner_with_force(
    tmp_path: Path,
) -> None:
    async with SQLiteStore(tmp_path / "s.db") as store:
        first = Agent(model=ScriptedModel.of("paused?"), store=store)
        session = first.session
        await store.acquire_lease(session.id, "gone:1:x", ttl=60)
        with pytest.raises(SessionBusy):
            await first.run("hello")
        await store.release_lease(session.id, "gone:1:x")
        asking = Agent(
            model=ScriptedModel.of(
                reply("", tool_call("work", "c1", step="one")),
                reply("", tool_call("work", "c2", step="two")),
            ),
            tools=[work],
            machine=approval_machine(),
            store=store,
        )
        paused = await asking.run("do it")
        await store.acquire_lease(paused.session_id, "gone:1:x", ttl=60)
        with pytest.raises(SessionBusy):
            await asking.abandon(paused.session_id, paused.run_id)
        ended = await asking.abandon(paused.session_id, paused.run_id, force=True)
        assert ended.outcome == "failed"

        again = await asking.run("do it again")
        await store.acquire_lease(again.session_id, "gone:1:x", ttl=60)
        with pytest.raises(SessionBusy):
            await asking.resume(again.session_id, again.run_id, _approve())
        done = Agent(
            model=ScriptedModel.of("done"),
            tools=[work],
            machine=approval_machine(),
            store=store,
        )
        result = await done.resume(
            again.session_id, again.run_id, _approve(), force=True
        )
        assert (result.outcome, result.text) == ("done", "done")


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_a_lease_left_by_a_store_failure_says_whose_it_is_and_until_when(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # It said "could not release the lease on ses_...": the next process's
    # resume, refused as busy, named an owner nobody had been told of.
    async with SQLiteStore(tmp_path / "s.db") as store:

        async def down(self: SQLiteStore, session_id: str, owner: str) -> None:
            raise StoreUnusable(str(self.path), "the server went away")

        monkeypatch.setattr(SQLiteStore, "release_lease", down)
        agent = Agent(model=ScriptedModel.of("done"), store=store, lease_ttl=12.0)
        with caplog.at_level("WARNING", logger="turnfsm.driver"):
            result = await agent.run("hello")
        held = await store.lease_of(result.session_id)
    assert held is not None
    (said,) = [r.getMessage() for r in caplog.records if "release" in r.getMessage()]
    assert f"could not release the lease on session {result.session_id!r}" in said
    assert "(its store failed)" in said
    assert f"held by {held.owner!r} until the lease runs out, 12 s after" in said


def _approve() -> ToolCallsReviewed:
    return ToolCallsReviewed.approve_all()


def work(step: str) -> str:
    """Do one step.

    Args:
        step: which.
    """
    return f"{step} done"


@pytest.mark.anyio
async def test_two_requests_on_one_session_at_once_leave_the_first_its_lease(
    tmp_path: Path,
) -> None:
    # Two requests of one conversation, each reading the session itself, start
    # at the same moment: both found its lease free. The second was refused
    # as changed by another writer ("reload the session and retry"), and let
    # go of the lease the first run still worked under.
    async with SQLiteStore(tmp_path / "s.db") as store:
        answered = anyio.Event()

        async def slow(request: object) -> str:
            answered.set()
            await anyio.sleep(0.3)
            return "done"

        agent = Agent(model=FakeModelClient(slow), store=store)
        first = Session(store=store)
        await agent.run("hello", session=first)
        views = [await Session.open(store, first.id) for _ in range(2)]
        refused: list[BaseException] = []
        held: list[bool] = []

        async def request(view: Session) -> None:
            try:
                await agent.run("again", session=view)
            except SessionBusy as busy:
                refused.append(busy)
                await answered.wait()
                held.append(await store.lease_of(first.id) is not None)

        async with anyio.create_task_group() as group:
            for view in views:
                group.start_soon(request, view)
        assert len(refused) == 1
        assert "wait for it" in str(refused[0])
        assert held == [True]  # the other run still held the session
        assert await store.lease_of(first.id) is None  # let go at its end
        stored = await Session.load(store, first.id)
        assert [r.outcome for r in stored.runs] == ["done", "done"]


@pytest.mark.anyio
async def test_a_loss_found_by_the_renewal_and_the_run_at_once_is_one_lease_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The run's own check and the background renewal both found the lease
    # gone: the caller got ExceptionGroup([LeaseLost, LeaseLost]), which an
    # `except LeaseLost:` does not catch.
    lost = LeaseLost("ses_x", "me:1:a", holder="elsewhere:1:x")

    async def renewal_finds_it(session: Session, hold: object) -> None:
        raise lost

    monkeypatch.setattr(driver_lease, "_renew", renewal_finds_it)

    async def held(session: Session) -> None:
        async with driver_lease.holding(session, ttl=30, store_timeout=None):
            await anyio.lowlevel.checkpoint()  # the renewal fails, then the run
            raise LeaseLost(session.id, "me:1:a", holder="elsewhere:1:x")

    async with SQLiteStore(tmp_path / "s.db") as store:
        with pytest.raises(LeaseLost) as raised:
            await held(Session(store=store))
    assert raised.value.holder == "elsewhere:1:x"
