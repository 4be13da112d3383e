"""A batch of tools safe to run twice is written with the next append, not alone.

Its `ToolsFinished` rides the next reply's append (or a pass's, the run's
end, an interruption's): one write a tool turn less. A process that dies
before that append loses nothing replay needs: the run resumes on the batch
again, runs again the calls of it that have no logged result (a batch of
several journals each result as it finishes), and no call is left open. A
batch with any other tool in it is written before the model is asked.

A crash is taken here as its image: the store's entries at the moment the
process would die (a copy of every session), which is what a process
killed there leaves; the run is resumed from the copy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import anyio
import pytest

from turnfsm.core import Event, ToolsFinished
from turnfsm.driver import Driver, Tool, function_tool, replay
from turnfsm.errors import SessionConflict, StoreUnusable
from turnfsm.hooks import Hook, ToolCallEnd, TransitionInfo
from turnfsm.messages import Message, check_history
from turnfsm.persistence import (
    Entry,
    EventRecorded,
    MemoryStore,
    Session,
    ToolResultRecorded,
)
from turnfsm.providers import ModelRequest
from turnfsm.testing import FakeModelClient, reply, tool_call

pytestmark = pytest.mark.anyio


class Appends(MemoryStore):
    """A memory store that keeps what each append held, and can refuse one.

    `refuse` (set by a test) is raised by the next append, once, and
    nothing of it is written.
    """

    def __init__(self) -> None:
        super().__init__()
        self.appends: list[list[Entry]] = []
        self.refuse: Exception | None = None

    async def append(
        self, session_id: str, entries: Sequence[Entry], *, expected_version: int
    ) -> int:
        refused, self.refuse = self.refuse, None
        if refused is not None:
            raise refused
        self.appends.append(list(entries))
        return await super().append(
            session_id, entries, expected_version=expected_version
        )


async def crash_image(store: MemoryStore) -> MemoryStore:
    """What a process killed now leaves in `store`: every append made so far."""
    image = MemoryStore()
    for info in await store.list_sessions():
        await image.append(info.id, await store.load(info.id), expected_version=0)
    return image


def kinds(entries: Sequence[Entry]) -> list[str]:
    """Each entry's kind, an event's by its class (``ToolsFinished``)."""
    return [
        type(e.event).__name__ if isinstance(e, EventRecorded) else type(e).__name__
        for e in entries
    ]


def events(session: Session, run_id: str) -> list[Event]:
    return [
        e.event
        for e in session.entries
        if isinstance(e, EventRecorded) and e.run_id == run_id
    ]


def assert_whole(session: Session, reopened: Session) -> None:
    """No call open, the log loads as it was held, and every run replays."""
    check_history(session.history)
    assert not session.open_runs()
    assert list(reopened.history) == list(session.history)
    assert all(replay(None, reopened, r.run_id).ok for r in reopened.runs)


def tools_of(ran: list[str], *, safe: Sequence[str]) -> list[Tool]:
    """Tools ``look`` and ``note``; those named in `safe` are idempotent."""

    def look(key: str) -> str:
        """Look a key up.

        Args:
            key: which key.
        """
        ran.append(f"look {key}")
        return f"{key} found"

    def note(key: str) -> str:
        """Note a key down.

        Args:
            key: which key.
        """
        ran.append(f"note {key}")
        return f"{key} noted"

    return [function_tool(f, idempotent=f.__name__ in safe) for f in (look, note)]


def batch_then_answer(
    calls: Sequence[tuple[str, str]], *, then: Callable[[], Any] | None = None
) -> FakeModelClient:
    """Calls `calls` (tool, key) at once, then answers with what came back.

    `then` is awaited when the model is first asked about the results.
    """
    asked = {"results": 0}

    async def answer(request: ModelRequest) -> Message:
        results = [p for m in request.messages for p in m.tool_results]
        if not results:
            parts = [tool_call(t, f"c{i}", key=k) for i, (t, k) in enumerate(calls)]
            return reply("", *parts)
        asked["results"] += 1
        if then is not None and asked["results"] == 1:
            await then()
        return reply("; ".join(p.content for p in results))

    return FakeModelClient(answer)


async def crashed_in_the_reply(
    calls: Sequence[tuple[str, str]], tools: list[Tool]
) -> tuple[MemoryStore, str]:
    """Run `calls` as one batch; the image of a crash when the model reads them."""
    store = MemoryStore()
    taken: list[MemoryStore] = []
    asked = anyio.Event()

    async def die() -> None:
        taken.append(await crash_image(store))
        asked.set()
        await anyio.sleep_forever()

    driver = Driver(model=batch_then_answer(calls, then=die), tools=tools)
    session = Session(store=store)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as group:

            async def run() -> None:
                await driver.run("look them up", session=session)

            group.start_soon(run)
            await asked.wait()
            group.cancel_scope.cancel()
    (image,) = taken
    return image, session.id


# -- which batches ride ---------------------------------------------------------
@pytest.mark.parametrize(
    ("calls", "safe", "logged", "again"),
    [
        # One call: its result rides; lost with the process, it runs again.
        ([("look", "a")], ["look"], 0, ["look a"]),
        # Several: each result is journaled as it finishes; none runs again.
        ([("look", "a"), ("look", "b")], ["look"], 0, []),
        # One tool not safe to run twice: the batch is written before the
        # model is asked; nothing runs again.
        ([("look", "a"), ("note", "b")], ["look"], 1, []),
        ([("note", "a")], [], 1, []),
    ],
)
async def test_a_crash_while_the_model_reads_a_batch_loses_nothing_it_cannot_redo(
    calls: list[tuple[str, str]], safe: list[str], logged: int, again: list[str]
) -> None:
    ran: list[str] = []
    image, session_id = await crashed_in_the_reply(calls, tools_of(ran, safe=safe))
    first = sorted(ran)
    session = await Session.load(image, session_id)
    (run,) = session.open_runs()
    logged_events = events(session, run.run_id)
    assert [type(e) is ToolsFinished for e in logged_events].count(True) == logged
    journaled = [e for e in session.entries if isinstance(e, ToolResultRecorded)]
    assert len(journaled) == (len(calls) if len(calls) > 1 else 0)
    ran.clear()
    driver = Driver(model=batch_then_answer(calls), tools=tools_of(ran, safe=safe))

    result = await driver.resume(session, run.run_id)

    assert result.outcome == "done", result.error
    assert ran == again
    expected = "; ".join(f"{k} {'found' if t == 'look' else 'noted'}" for t, k in calls)
    assert result.text == expected
    assert first == sorted(f"{t} {k}" for t, k in calls)
    assert_whole(session, await Session.load(image, session_id))


async def test_a_batch_safe_to_run_twice_is_written_with_the_reply_that_reads_it() -> (
    None
):
    store = Appends()
    ran: list[str] = []
    driver = Driver(
        model=batch_then_answer([("look", "a"), ("look", "b")]),
        tools=tools_of(ran, safe=["look"]),
    )
    result = await driver.run("look them up", session=Session(store=store))

    assert result.outcome == "done", result.error
    assert [kinds(a) for a in store.appends] == [
        ["MachineStored", "RunOpened", "RunStarted"],
        ["Measured", "TurnRecord", "ModelReplied"],
        ["ToolResultRecorded"],
        ["ToolResultRecorded"],
        # The batch rides the run's end (the final reply's append).
        [
            "ToolsFinished",
            "Measured",
            "TurnRecord",
            "ModelReplied",
            "Committed",
            "RunEnded",
        ],
    ]


class Ear(Hook):
    """Hears each tool call's end (by call id) and each transition (by trigger)."""

    def __init__(self) -> None:
        self.tool_ends: list[str] = []
        self.triggers: list[str] = []

    def on_tool_end(self, info: ToolCallEnd) -> None:
        self.tool_ends.append(info.call.call.id)

    def on_transition(self, info: TransitionInfo) -> None:
        self.triggers.append(info.step.trigger)


def look_then_note(store: Appends, refusal: Exception | None) -> FakeModelClient:
    """Looks ``a`` up, notes ``b`` down, answers.

    `refusal` refuses the append of the reply that notes ``b`` down.
    """

    def answer(request: ModelRequest) -> Message:
        results = [p for m in request.messages for p in m.tool_results]
        if not results:
            return reply("", tool_call("look", "c0", key="a"))
        if len(results) == 1:
            store.refuse = refusal
            return reply("", tool_call("note", "c1", key="b"))
        return reply("; ".join(p.content for p in results))

    return FakeModelClient(answer)


async def test_a_store_down_at_the_next_reply_writes_the_batch_with_its_end() -> None:
    # The reply's append is refused: the run stops, interrupted, and its
    # interruption's append writes the batch that rode (it is no crash), so
    # the resumed run asks the model again and runs no tool twice.
    store = Appends()
    ran: list[str] = []
    ear = Ear()
    refusal = StoreUnusable(path="memory", reason="down for this append")
    driver = Driver(
        model=look_then_note(store, refusal),
        tools=tools_of(ran, safe=["look"]),
        hooks=[ear],
    )
    session = Session(store=store)
    with pytest.raises(StoreUnusable):
        await driver.run("look a up, note b down", session=session)
    (run,) = (await Session.load(store, session.id)).runs
    assert run.outcome == "interrupted"
    assert kinds(store.appends[-1]) == ["ToolsFinished", "Measured", "RunEnded"]
    driver = Driver(
        model=look_then_note(store, None),
        tools=tools_of(ran, safe=["look"]),
        hooks=[ear],
    )

    result = await driver.resume(session, run.run_id)

    assert (result.outcome, result.text) == ("done", "a found; b noted")
    assert ran == ["look a", "note b"]  # once each
    assert ear.tool_ends == ["c0", "c1"]  # heard once each
    assert ear.triggers.count("tools_finished") == 2  # once a batch
    assert_whole(session, await Session.load(store, session.id))


async def test_another_writer_first_at_the_next_reply_runs_the_batch_again() -> None:
    # Another writer moved the log on: nothing more of this run is written
    # (its view is stale). Reloaded, the run resumes on the batch, and its
    # call, safe to run twice, runs again: nothing committed is lost.
    store = Appends()
    ran: list[str] = []
    session = Session(store=store)
    conflict = SessionConflict(session.id, 4, 5)
    driver = Driver(
        model=look_then_note(store, conflict), tools=tools_of(ran, safe=["look"])
    )
    with pytest.raises(SessionConflict):
        await driver.run("look a up, note b down", session=session)
    session = await Session.load(store, session.id)
    (run,) = session.runs
    assert run.outcome == "running"
    assert ToolsFinished not in [type(e) for e in events(session, run.run_id)]
    driver = Driver(
        model=look_then_note(store, None), tools=tools_of(ran, safe=["look"])
    )

    result = await driver.resume(session, run.run_id, force=True)

    assert (result.outcome, result.text) == ("done", "a found; b noted")
    assert ran == ["look a", "look a", "note b"]
    assert_whole(session, await Session.load(store, session.id))
