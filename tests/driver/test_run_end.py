"""A run ends in one append, with exactly one `RunEnded`, whatever a hook does."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import anyio
import pytest

from tests.helpers import RefusingStore
from turnfsm.core import Measured, ModelReplied
from turnfsm.driver import Driver, RunControl, replay
from turnfsm.errors import (
    InvalidReturn,
    StoreUnusable,
    SubagentWaiting,
    TurnFSMError,
)
from turnfsm.hooks import Hook, RunEndInfo, RunStartInfo
from turnfsm.persistence import (
    Committed,
    Entry,
    EventRecorded,
    MemoryStore,
    RunEnded,
    Session,
    SessionInfo,
)
from turnfsm.providers import ModelRequest, ModelResponse
from turnfsm.testing import FakeModelClient, ScriptedModel, reply, tool_call

pytestmark = pytest.mark.anyio


class Recording:
    """A store that keeps each append as one batch (it delegates to memory)."""

    def __init__(self) -> None:
        self.inner = MemoryStore()
        self.batches: list[tuple[Entry, ...]] = []

    async def append(
        self, session_id: str, entries: Sequence[Entry], *, expected_version: int
    ) -> int:
        version = await self.inner.append(
            session_id, entries, expected_version=expected_version
        )
        self.batches.append(tuple(entries))
        return version

    async def load(self, session_id: str) -> tuple[Entry, ...]:
        return await self.inner.load(session_id)

    async def list_sessions(self) -> tuple[SessionInfo, ...]:
        return await self.inner.list_sessions()


def _tools() -> list[object]:
    def look(q: str) -> str:
        """Look up.

        Args:
            q: the query.
        """
        return f"found {q}"

    return [look]


@pytest.mark.parametrize(
    "script",
    [
        ["the answer"],
        [reply("", tool_call("look", "c1", q="x")), "the answer"],
    ],
    ids=["one turn", "a tool turn"],
)
async def test_a_finished_run_commits_and_ends_in_one_append(
    script: list[object],
) -> None:
    store = Recording()
    session = Session(store=store)  # type: ignore[arg-type]
    driver = Driver(model=ScriptedModel.of(*script), tools=_tools())  # type: ignore[arg-type]
    result = await driver.run("go", session=session)
    assert result.ok
    last = store.batches[-1]
    assert isinstance(last[-1], RunEnded)
    assert any(isinstance(e, Committed) for e in last)
    # Nothing before the last batch commits the run's messages or ends it.
    for batch in store.batches[:-1]:
        assert not any(isinstance(e, RunEnded | Committed) for e in batch)
    assert [m.text for m in session.history][-1] == "the answer"


def _events(batch: tuple[Entry, ...]) -> list[object]:
    return [type(e.event) for e in batch if isinstance(e, EventRecorded)]


async def test_a_measurement_rides_the_reply_so_a_tool_turn_is_two_appends() -> None:
    store = Recording()
    session = Session(store=store)  # type: ignore[arg-type]
    calls = [reply("", tool_call("look", f"c{i}", q=str(i))) for i in range(3)]
    driver = Driver(model=ScriptedModel.of(*calls, "the answer"), tools=_tools())  # type: ignore[arg-type]
    assert (await driver.run("go", session=session)).ok
    # The opening with its first event; per tool turn the measurement with
    # the reply, then the tool's result; the last measurement with the end.
    assert len(store.batches) == 1 + 2 * 3 + 1
    for batch in store.batches[1:]:
        events = _events(batch)
        assert events.count(Measured) == events.count(ModelReplied)
    assert replay(None, session, session.runs[0].run_id).ok


async def test_a_run_cancelled_in_its_model_call_logs_its_measurement() -> None:
    control = RunControl()

    async def stuck(_request: ModelRequest) -> ModelResponse:
        control.cancel("operator")
        await anyio.sleep(30)
        raise AssertionError("not reached")

    store = Recording()
    session = Session(store=store)  # type: ignore[arg-type]
    driver = Driver(model=FakeModelClient(stuck))
    result = await driver.run("go", session=session, control=control)
    assert result.outcome == "cancelled"
    assert _events(store.batches[-1])[0] is Measured
    assert isinstance(store.batches[-1][-1], RunEnded)
    assert replay(None, session, session.runs[0].run_id).ok


class Raising(Hook):
    def on_run_end(self, info: RunEndInfo) -> None:
        raise RuntimeError("the hook broke")


async def test_a_strict_end_hook_that_raises_leaves_one_run_ended() -> None:
    session = Session()
    driver = Driver(
        model=ScriptedModel.of("the answer"), hooks=[Raising()], strict_hooks=True
    )
    with pytest.raises(RuntimeError, match="the hook broke"):
        await driver.run("go", session=session)
    ends = [e for e in session.entries if isinstance(e, RunEnded)]
    assert [e.outcome for e in ends] == ["done"]
    assert session.runs[0].outcome == "done"
    assert [m.text for m in session.history] == ["go", "the answer"]
    # The session is free: the next run starts.
    driver = Driver(model=ScriptedModel.of("again"))
    assert (await driver.run("more", session=session)).ok


async def _later() -> None:
    """Work a hook meant to do, never awaited."""


class ReturnsAwaitable(Hook):
    def on_run_end(self, info: RunEndInfo) -> None:
        return _later()  # type: ignore[return-value]


class RaisingTyped(Hook):
    def __init__(self, error: Exception) -> None:
        self.error = error

    def on_run_end(self, info: RunEndInfo) -> None:
        raise self.error


@pytest.mark.parametrize(
    "hook",
    [
        ReturnsAwaitable(),
        RaisingTyped(InvalidReturn("a check of mine", "x", "y")),
        RaisingTyped(StoreUnusable("my audit database", "it is down")),
        RaisingTyped(SubagentWaiting("helper", "ses_x", "run_x", "await_approval")),
    ],
    ids=["returns an awaitable", "InvalidReturn", "StoreUnusable", "SubagentWaiting"],
)
async def test_a_strict_end_hook_that_fails_typed_leaves_the_run_as_it_ended(
    hook: Hook,
) -> None:
    # A turnfsm error out of a strict `on_run_end` was taken for the run's
    # own: a done run got a second RunEnded (failed), or was told
    # interrupted, though its log said done.
    session = Session()
    driver = Driver(
        model=ScriptedModel.of("the answer"), hooks=[hook], strict_hooks=True
    )
    with pytest.raises(TurnFSMError):
        await driver.run("go", session=session)
    ends = [e for e in session.entries if isinstance(e, RunEnded)]
    assert [e.outcome for e in ends] == ["done"]
    assert session.runs[0].outcome == "done"
    assert [m.text for m in session.history] == ["go", "the answer"]
    again = Driver(model=ScriptedModel.of("again"))
    assert (await again.run("more", session=session)).ok


class Heard(Hook):
    def __init__(self) -> None:
        self.heard: list[str] = []

    def on_run_start(self, info: RunStartInfo) -> None:
        self.heard.append("start")

    def on_run_end(self, info: RunEndInfo) -> None:
        self.heard.append(f"end {info.outcome}")


class RaisingAtStart(Hook):
    def on_run_start(self, info: RunStartInfo) -> None:
        raise RuntimeError("the start hook broke")


async def test_a_strict_start_hook_that_raises_crashes_the_run_and_ends_it() -> None:
    # The error left the run unlogged, and the hooks before it never heard
    # its end (a tracing hook's run span was left open).
    session = Session()
    heard = Heard()
    driver = Driver(
        model=ScriptedModel.of("the answer"),
        hooks=[heard, RaisingAtStart()],
        strict_hooks=True,
    )
    with pytest.raises(RuntimeError, match="the start hook broke"):
        await driver.run("go", session=session)
    assert heard.heard == ["start", "end failed"]
    (run,) = session.runs
    assert run.outcome == "failed"
    assert str(run.error) == "run crashed on RuntimeError: the start hook broke"
    assert replay(None, session, run.run_id).ok
    again = Driver(model=ScriptedModel.of("again"))
    assert (await again.run("more", session=session)).ok


class RaisingAtBoth(RaisingAtStart):
    def on_run_end(self, info: RunEndInfo) -> None:
        raise RuntimeError("the end hook broke")


async def test_a_crash_recorded_is_not_said_unrecorded_when_its_end_hook_raises(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The end hook's error was logged as "could not record its crash", of a
    # crash the log holds.
    session = Session()
    driver = Driver(
        model=ScriptedModel.of("the answer"),
        hooks=[RaisingAtBoth()],
        strict_hooks=True,
    )
    with pytest.raises(RuntimeError, match="the start hook broke"):
        await driver.run("go", session=session)
    (run,) = session.runs
    assert run.outcome == "failed"
    said = [r.getMessage() for r in caplog.records if r.name.startswith("turnfsm")]
    recorded = f"run {run.run_id}: its crash is recorded; a hook told of it raised"
    assert said == [recorded]
    assert caplog.records[-1].exc_info is not None
    assert "the end hook broke" in str(caplog.records[-1].exc_info[1])


async def test_a_non_strict_end_hook_that_raises_is_detached() -> None:
    session = Session()
    driver = Driver(model=ScriptedModel.of("the answer"), hooks=[Raising()])
    result = await driver.run("go", session=session)
    assert result.ok
    assert len([e for e in session.entries if isinstance(e, RunEnded)]) == 1


async def test_a_run_that_lost_a_write_race_raises_the_conflict_and_logs_no_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from turnfsm import Agent
    from turnfsm.errors import SessionConflict

    ends: list[RunEndInfo] = []

    class Ends(Hook):
        def on_run_end(self, info: RunEndInfo) -> None:
            ends.append(info)

    store = MemoryStore()
    agent = Agent(
        model=ScriptedModel.of("Hello.", "Again."), store=store, hooks=[Ends()]
    )
    driver = agent.driver
    await driver.run("Say hello.", session=Session("s", store=store))
    here = await Session.load(store, "s")
    there = await Session.load(store, "s")
    await driver.run("Say it again.", session=here)
    version = len(await store.load("s"))

    with pytest.raises(SessionConflict):
        await driver.run("And once more.", session=there)

    assert len(await store.load("s")) == version  # nothing written
    assert [r.levelname for r in caplog.records if r.levelno >= 30] == []
    assert [e.outcome for e in ends] == ["done", "done", "failed"]


async def test_an_agent_that_lost_a_write_race_goes_on_once_it_reopens_the_session(
    tmp_path: Path,
) -> None:
    from turnfsm import Agent
    from turnfsm.errors import SessionConflict

    first = Agent(model=ScriptedModel.of("one", "two"), store=tmp_path / "s.db")
    started = await first.run("first")
    second = Agent(model=ScriptedModel.of("three"), store=tmp_path / "s.db")
    await second.open_session(started.session_id)
    await first.run("second")  # the session moves on under the second's view
    with pytest.raises(SessionConflict, match="reload the session"):
        await second.run("from the second")

    # Reopening is the reload the error asks for: the run goes on from the
    # log as the other agent left it.
    session = await second.open_session(started.session_id)
    result = await second.run("from the second")
    assert (result.outcome, result.text) == ("done", "three")
    assert [m.text for m in session.history] == [
        "first",
        "one",
        "second",
        "two",
        "from the second",
        "three",
    ]


async def test_a_view_read_while_another_run_went_on_is_stale_not_busy(
    tmp_path: Path,
) -> None:
    # Two `turnfsm run --session` at once: the second read the session while
    # the first's run was open, and took the lease once it had ended. It was
    # told the session "has an open run (paused, or its process died);
    # resume or abandon it first", though that run was done.
    from turnfsm import Agent
    from turnfsm.errors import SessionConflict

    stale: list[Session] = []

    async def answer(request: ModelRequest) -> ModelResponse:
        stale.append(await Session.load(store, started.session_id))
        return reply("two")

    first = Agent(model=ScriptedModel.of("one"), store=tmp_path / "s.db")
    started = await first.run("first")
    store = first.store
    other = Driver(model=FakeModelClient(answer))
    current = await Session.load(store, started.session_id)
    done = await other.run("second", session=current)
    assert done.outcome == "done"
    (view,) = stale
    assert view.open_runs()  # the view saw the other run open
    version = len(await store.load(started.session_id))

    late = Driver(model=ScriptedModel.of("three"))
    with pytest.raises(SessionConflict, match="reload the session"):
        await late.run("third", session=view)

    assert len(await store.load(started.session_id)) == version  # nothing written
    fresh = await Session.load(store, started.session_id)
    result = await late.run("third", session=fresh)
    assert (result.outcome, result.text) == ("done", "three")


async def test_a_strict_tool_hook_that_raises_in_a_batch_surfaces_as_itself() -> None:
    from turnfsm.hooks import ToolCallEnd

    class RaisingOnToolEnd(Hook):
        def on_tool_end(self, info: ToolCallEnd) -> None:
            raise RuntimeError("the tool hook broke")

    async def nap(seconds: float) -> str:
        """Nap.

        Args:
            seconds: How long.
        """
        await anyio.sleep(seconds)
        return "rested"

    session = Session()
    driver = Driver(
        model=ScriptedModel.of(
            reply(
                "", tool_call("nap", "c1", seconds=0), tool_call("nap", "c2", seconds=5)
            )
        ),
        tools=[nap],
        hooks=[RaisingOnToolEnd()],
        strict_hooks=True,
    )
    # As from a lone call: the hook's error, not a group of it and of the
    # same error again from the call it stopped.
    with anyio.fail_after(10), pytest.raises(RuntimeError, match="the tool hook broke"):
        await driver.run("go", session=session)
    assert session.runs[0].outcome == "failed"
    assert list(session.history) == []


async def test_an_end_the_store_refused_keeps_the_last_step_for_the_resume() -> None:
    # The end's append failed and took the last step with it: the
    # interruption logged the run without its final reply, and the resume
    # asked the model again (a second, paid answer in place of the first).
    def noop() -> str:
        """Do nothing."""
        return "ok"

    store = RefusingStore(RunEnded)  # down for the run's first end
    model = ScriptedModel.of(
        reply("", tool_call("noop", "c1")), "the answer", "asked again"
    )
    driver = Driver(model=model, tools=[noop])
    session = Session(store=store)
    with pytest.raises(StoreUnusable):
        await driver.run("go", session=session)

    reopened = await Session.load(store, session.id)
    (stopped,) = reopened.open_runs()
    assert stopped.outcome == "interrupted"
    result = await driver.resume(reopened, stopped.run_id)

    assert (result.outcome, result.text) == ("done", "the answer")
    assert len(model.requests) == 2  # the final reply was not asked for again
    final = await Session.load(store, session.id)
    assert [m.text for m in final.history][-1] == "the answer"
    assert replay(None, final, stopped.run_id).ok
