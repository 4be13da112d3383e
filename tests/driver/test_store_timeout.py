"""A store that stops answering stops the run, within `store_timeout`.

The shipped stores bound their own waits; a store of yours may wait on a
server that never answers. Each call a run makes to its store is given
`Driver.store_timeout` seconds: the run then raises `StoreUnusable` naming
the store and the call, and the session still loads and its run goes on.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import anyio
import attrs
import pytest

from turnfsm import Agent
from turnfsm.errors import ConfigError, StoreUnusable
from turnfsm.persistence import Entry, Lease, MemoryStore, Session, SQLiteStore
from turnfsm.testing import ScriptedModel, reply, tool_call

pytestmark = pytest.mark.anyio

LIMIT = 0.2


def _add(x: int) -> int:
    """Add one.

    Args:
        x: the number.
    """
    return x + 1


def _model() -> ScriptedModel:
    return ScriptedModel.of(reply("", tool_call("_add", "c1", x=1)), reply("two"))


@attrs.define
class Stalls:
    """A store of yours on a memory store, whose chosen calls never return.

    `stalling` maps a method's name to the numbers (from 1) of its calls
    that wait for ever; `calls` counts each method's calls.
    """

    stalling: dict[str, set[int]]
    inner: MemoryStore = attrs.field(factory=MemoryStore)
    calls: dict[str, int] = attrs.field(factory=dict)

    async def _call(self, method: str) -> None:
        number = self.calls[method] = self.calls.get(method, 0) + 1
        if number in self.stalling.get(method, ()):
            await anyio.sleep_forever()

    async def append(
        self, session_id: str, entries: Sequence[Entry], *, expected_version: int
    ) -> int:
        await self._call("append")
        return await self.inner.append(
            session_id, entries, expected_version=expected_version
        )

    async def load(self, session_id: str) -> tuple[Entry, ...]:
        await self._call("load")
        return await self.inner.load(session_id)

    async def list_sessions(self) -> object:
        return await self.inner.list_sessions()

    async def acquire_lease(
        self, session_id: str, owner: str, *, ttl: float, force: bool = False
    ) -> Lease:
        await self._call("acquire_lease")
        return await self.inner.acquire_lease(session_id, owner, ttl=ttl, force=force)

    async def renew_lease(self, session_id: str, owner: str, *, ttl: float) -> Lease:
        await self._call("renew_lease")
        return await self.inner.renew_lease(session_id, owner, ttl=ttl)

    async def release_lease(self, session_id: str, owner: str) -> None:
        await self._call("release_lease")
        await self.inner.release_lease(session_id, owner)

    async def lease_of(self, session_id: str) -> Lease | None:
        await self._call("lease_of")
        return await self.inner.lease_of(session_id)


def _agent(store: object, **options: object) -> Agent:
    options.setdefault("store_timeout", LIMIT)
    return Agent(
        model=_model(),
        tools=[_add],
        store=store,  # type: ignore[arg-type]  # a store of yours
        **options,
    )


# The run's appends: its opening with the first model call's request, the
# reply, the tool's result, the end.
@pytest.mark.parametrize("stalling", [1, 2, 3, 4])
async def test_an_append_that_never_returns_stops_the_run(stalling: int) -> None:
    store = Stalls({"append": {stalling}})
    agent = _agent(store)
    with anyio.fail_after(10):
        with pytest.raises(StoreUnusable) as caught:
            await agent.run("one plus one?")
    error = caught.value
    assert error.path == "Stalls"
    assert error.in_doubt
    assert str(error) == (
        "cannot use Stalls as a turnfsm session store: its append did not "
        f"return within store_timeout={LIMIT} s (it may have been written: "
        "reload the session to see)"
    )
    if stalling == 1:  # the run's opening was not written: nothing was
        assert await store.inner.list_sessions() == ()
        return
    # What was committed loads, and the run goes on from it.
    session = await Session.load(store, agent.session.id)  # type: ignore[arg-type]
    (run,) = session.runs
    assert run.outcome == "interrupted"  # ended by the next append, which answered
    resumed = await _agent(store).resume(session.id, run.run_id)
    assert (resumed.outcome, resumed.text) == ("done", "two")


async def test_a_lease_that_cannot_be_taken_stops_the_run_before_it_opens() -> None:
    store = Stalls({"acquire_lease": {1}})
    agent = _agent(store)
    with anyio.fail_after(10):
        with pytest.raises(StoreUnusable, match="its acquire_lease did not return"):
            await agent.run("one plus one?")
    assert await store.inner.list_sessions() == ()
    result = await agent.run("one plus one?")
    assert (result.outcome, result.text) == ("done", "two")


async def test_a_release_that_never_returns_leaves_the_run_done() -> None:
    store = Stalls({"release_lease": {1}})
    with anyio.fail_after(10):
        result = await _agent(store).run("one plus one?")
    assert (result.outcome, result.text) == ("done", "two")


async def test_a_renewal_that_never_returns_is_tried_again() -> None:
    @attrs.define
    class Retries(Stalls):
        """Stalls the renewal numbered `stalled`; `retried` once another is sent."""

        stalled: int = 0
        retried: anyio.Event = attrs.field(factory=anyio.Event)

        async def _call(self, method: str) -> None:
            if method == "renew_lease" and self.calls.get(method, 0) >= self.stalled:
                self.retried.set()
            await super()._call(method)

    store = Retries({}, stalled=10**6)

    async def slow(x: int) -> int:
        """Add one, once the lease's renewal after a stalled one was sent.

        Args:
            x: the number.
        """
        # The next renewal is the background's (nothing is written while a
        # tool runs): it never returns, and the one after it is tried.
        store.stalled = store.calls.get("renew_lease", 0) + 1
        store.stalling["renew_lease"] = {store.stalled}
        await store.retried.wait()
        return x + 1

    agent = Agent(
        model=ScriptedModel.of(reply("", tool_call("slow", "c1", x=1)), reply("two")),
        tools=[slow],
        store=store,  # type: ignore[arg-type]  # a store of yours
        store_timeout=LIMIT,
        # Renewed every 2 * LIMIT: the stalled renewal is given up, and the
        # next one sent, before the lease runs out.
        lease_ttl=6 * LIMIT,
    )
    with anyio.fail_after(10):
        result = await agent.run("one plus one?")
    assert (result.outcome, result.text) == ("done", "two")
    assert store.calls["renew_lease"] > store.stalled


async def test_a_write_that_shields_itself_and_answers_late_is_kept() -> None:
    # As SQLite's does: a write that cannot be stopped halfway takes a
    # shield, and its answer, late as it is, says it was written.
    @attrs.define
    class Shielded(Stalls):
        async def _call(self, method: str) -> None:
            if method == "append":
                with anyio.CancelScope(shield=True):
                    await anyio.sleep(2 * LIMIT)

    store = Shielded({})
    with anyio.fail_after(10):
        result = await _agent(store).run("one plus one?")
    assert (result.outcome, result.text) == ("done", "two")
    session = await Session.load(store, result.session_id)  # type: ignore[arg-type]
    assert [r.outcome for r in session.runs] == ["done"]


async def test_the_shipped_stores_bound_their_own_waits(tmp_path: Path) -> None:
    # No deadline of the driver's is put around their calls (it costs a
    # cancel scope a call); theirs answer or raise within their own limits.
    async with SQLiteStore(tmp_path / "s.db") as store:
        result = await _agent(store, store_timeout=1e-9).run("one plus one?")
        assert (result.outcome, result.text) == ("done", "two")
    result = await _agent(MemoryStore(), store_timeout=1e-9).run("one plus one?")
    assert (result.outcome, result.text) == ("done", "two")


async def test_no_limit_waits_for_a_slow_store() -> None:
    @attrs.define
    class Slow(Stalls):
        async def _call(self, method: str) -> None:
            await anyio.sleep(2 * LIMIT)

    result = await _agent(Slow({}), store_timeout=None).run("one plus one?")
    assert (result.outcome, result.text) == ("done", "two")


@pytest.mark.parametrize("value", [-1.0, 0, float("nan"), "60"])
def test_a_bad_store_timeout_is_refused(value: object) -> None:
    with pytest.raises(ConfigError) as caught:
        Agent(model=_model(), store_timeout=value)
    assert (caught.value.field, caught.value.value) == ("store_timeout", value)


# Outside a run, an agent reads a session to reopen it (`open_session`) and
# before it resumes, abandons or compacts a run of it: each read has the
# same `store_timeout`.
@pytest.mark.parametrize(
    "call",
    [
        lambda agent, ids: agent.open_session(ids[0]),
        lambda agent, ids: agent.resume(*ids),
        lambda agent, ids: agent.abandon(*ids),
        lambda agent, ids: agent.compact(ids[0]),
    ],
    ids=["open_session", "resume", "abandon", "compact"],
)
async def test_a_read_outside_a_run_that_never_returns_is_given_up(
    call: Callable[[Agent, tuple[str, str]], Awaitable[object]],
) -> None:
    store = Stalls({"append": {3}})  # the tool's result: the run stops there
    with pytest.raises(StoreUnusable):
        await _agent(store).run("one plus one?")
    (session_id,) = [info.id for info in await store.inner.list_sessions()]
    (run,) = (await Session.load(store.inner, session_id)).runs
    store.stalling = {"load": {store.calls.get("load", 0) + 1}}
    fresh = _agent(store)  # another process: it reads the session first
    with anyio.fail_after(10):
        with pytest.raises(StoreUnusable) as caught:
            await call(fresh, (session_id, run.run_id))
    assert str(caught.value) == (
        "cannot use Stalls as a turnfsm session store: its load did not "
        f"return within store_timeout={LIMIT} s (nothing was changed)"
    )
    assert not caught.value.in_doubt
    # The store answers again: the session is read, and the run goes on.
    resumed = await fresh.resume(session_id, run.run_id)
    assert (resumed.outcome, resumed.text) == ("done", "two")


async def test_reading_the_agents_own_session_again_is_bounded_too() -> None:
    store = Stalls({})
    agent = _agent(store)
    await agent.run("one plus one?")
    store.stalling = {"load": {store.calls.get("load", 0) + 1}}
    with anyio.fail_after(10):
        with pytest.raises(StoreUnusable, match="its load did not return"):
            await agent.open_session(agent.session.id)
    assert (await agent.open_session(agent.session.id)) is agent.session
