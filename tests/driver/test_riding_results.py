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

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.hand_written_machines import DONE_AFTER_TOOLS
from tests.profiles import sized
from turnfsm import Agent, approval_machine, review_machine
from turnfsm.context import ContextManager
from turnfsm.core import (
    Event,
    MachineSpec,
    Perform,
    Signal,
    ToolCallsReviewed,
    ToolsFinished,
)
from turnfsm.driver import (
    CompactionRecord,
    Driver,
    EffectContext,
    RunControl,
    Tool,
    function_tool,
    replay,
)
from turnfsm.errors import SessionConflict, StoreUnusable
from turnfsm.hooks import Hook, ToolCallEnd, TransitionInfo
from turnfsm.messages import Message, check_history
from turnfsm.persistence import (
    Entry,
    EventRecorded,
    MemoryStore,
    Session,
    ToolResultRecorded,
    child_sessions,
)
from turnfsm.providers import ModelRequest, ModelResponse
from turnfsm.testing import FakeModelClient, reply, tool_call
from turnfsm.values import Usage

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


class Crash:
    """Where a run's process dies: the image of `store` then, and the run stopped."""

    def __init__(self, store: MemoryStore) -> None:
        self.store = store
        self.image: MemoryStore | None = None
        self.came = anyio.Event()

    async def here(self) -> None:
        """Take the image and stop the run here (`stopped` cancels it)."""
        self.image = await crash_image(self.store)
        self.came.set()
        await anyio.sleep_forever()


async def stopped(run: Callable[[], Awaitable[object]], at: anyio.Event) -> None:
    """Run `run` until `at` is set, then cancel it (or until it ends)."""
    with anyio.fail_after(5):
        async with anyio.create_task_group() as group:

            async def go() -> None:
                await run()
                group.cancel_scope.cancel()

            group.start_soon(go)
            await at.wait()
            group.cancel_scope.cancel()


def kinds(entries: Sequence[Entry]) -> list[str]:
    """Each entry's kind, an event's by its class (``ToolsFinished``)."""
    return [
        type(e.event).__name__ if isinstance(e, EventRecorded) else type(e).__name__
        for e in entries
    ]


WITH_THE_REPLY_AND_THE_END = [
    "ToolsFinished",
    "Measured",
    "TurnRecord",
    "ModelReplied",
    "RunEnded",
]
"""An append that ends a run on the reply to a batch (that rode to it)."""


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
    crash = Crash(store)
    driver = Driver(model=batch_then_answer(calls, then=crash.here), tools=tools)
    session = Session(store=store)
    await stopped(lambda: driver.run("look them up", session=session), crash.came)
    assert crash.image is not None
    return crash.image, session.id


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


async def test_a_run_cancelled_as_the_model_reads_a_batch_writes_it_with_its_end() -> (
    None
):
    store = Appends()
    ran: list[str] = []
    control = RunControl()

    async def cancel() -> None:
        control.cancel("stop")
        await anyio.sleep_forever()

    driver = Driver(
        model=batch_then_answer([("look", "a")], then=cancel),
        tools=tools_of(ran, safe=["look"]),
    )
    session = Session(store=store)
    with anyio.fail_after(5):
        result = await driver.run("look a up", session=session, control=control)

    assert result.outcome == "cancelled"
    assert kinds(store.appends[-1]) == [
        "ToolsFinished",
        "Measured",
        "RunCancelled",
        "RunEnded",
    ]
    assert_whole(session, await Session.load(store, session.id))


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


async def test_a_store_down_at_the_final_reply_writes_the_batch_and_the_reply() -> None:
    # The final reply's append is the run's end: refused, the interruption's
    # append writes all of it but the commit; the resumed run commits the
    # answer without asking the model or running the tool again.
    store = Appends()
    ran: list[str] = []
    models: list[int] = []

    async def refuse() -> None:
        models.append(1)
        store.refuse = StoreUnusable(path="memory", reason="down for this append")

    def driver() -> Driver:
        return Driver(
            model=batch_then_answer([("look", "a")], then=refuse),
            tools=tools_of(ran, safe=["look"]),
        )

    session = Session(store=store)
    with pytest.raises(StoreUnusable):
        await driver().run("look a up", session=session)
    assert kinds(store.appends[-1]) == WITH_THE_REPLY_AND_THE_END
    (run,) = (await Session.load(store, session.id)).runs

    result = await driver().resume(session, run.run_id)

    assert (result.outcome, result.text) == ("done", "a found")
    assert (ran, models) == (["look a"], [1])
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


# -- sub-agents ---------------------------------------------------------------
CHILD_USAGE = Usage(input_tokens=40, output_tokens=3)


def counted_child(asked: list[str]) -> Agent:
    """A sub-agent that answers its task in one turn (each task in `asked`)."""

    def answer(request: ModelRequest) -> ModelResponse:
        task = request.messages[-1].text
        asked.append(task)
        return ModelResponse(message=reply(f"read: {task}"), usage=CHILD_USAGE)

    return Agent(model=FakeModelClient(answer))


def delegating(then: Callable[[], Any] | None = None) -> FakeModelClient:
    """Delegates one read, then answers with what the sub-agent said.

    `then` is awaited when the model is first asked about the answer.
    """
    asked = {"answers": 0}

    async def answer(request: ModelRequest) -> Message:
        last = request.messages[-1]
        if not last.tool_results:
            return reply("", tool_call("reader", "r1", task="the ledger"))
        asked["answers"] += 1
        if then is not None and asked["answers"] == 1:
            await then()
        return reply(f"ok: {last.tool_results[0].content}")

    return FakeModelClient(answer)


@pytest.mark.parametrize("stop", ["crash", "interrupt"])
async def test_a_parent_stopped_after_its_child_answered_takes_the_answer_again(
    stop: str,
) -> None:
    # The child ran to its end inside the parent's call; the parent stopped
    # while its model read the answer. Crashed, the call (safe to run twice)
    # runs again and takes the ended child's answer from its log;
    # interrupted, the answer was written with the parent's end. Either way
    # no second child runs, and what the child used counts once.
    store = MemoryStore()
    asked: list[str] = []
    crash = Crash(store)
    reader = counted_child(asked).as_tool(name="reader", description="Reads.")
    parent = Agent(model=delegating(crash.here), tools=[reader], store=store)
    await stopped(lambda: parent.run("what does the ledger say?"), crash.came)
    assert asked == ["the ledger"]
    left = crash.image if stop == "crash" else store
    assert left is not None
    session = await Session.load(left, parent.session.id)
    (run,) = session.open_runs()
    finished = ToolsFinished in [type(e) for e in events(session, run.run_id)]
    assert finished is (stop == "interrupt")
    again = Agent(model=delegating(), tools=[reader], store=left)

    result = await again.resume(session.id, run.run_id)

    assert (result.outcome, result.text) == ("done", "ok: read: the ledger")
    assert asked == ["the ledger"]  # no second child run
    (kid,) = await child_sessions(left, session.id)
    assert [r.outcome for r in kid.runs] == ["done"]
    assert result.children_usage == CHILD_USAGE
    reopened = await Session.load(left, session.id)
    assert_whole(reopened, reopened)
    assert all(replay(None, kid, r.run_id).ok for r in kid.runs)


# -- approval -------------------------------------------------------------------
def looking_twice(then: Callable[[], Any] | None = None) -> FakeModelClient:
    """Looks ``a`` up and notes ``b`` down; then looks ``c`` up; then answers.

    `then` is awaited when the model is first asked about a result.
    """
    asked = {"results": 0}

    async def answer(request: ModelRequest) -> Message:
        results = [p for m in request.messages for p in m.tool_results]
        if not results:
            return reply(
                "", tool_call("look", "c0", key="a"), tool_call("note", "c1", key="b")
            )
        asked["results"] += 1
        if then is not None and asked["results"] == 1:
            await then()
        if len(results) == 2:
            return reply("", tool_call("look", "c2", key="c"))
        return reply("; ".join(p.content for p in results))

    return FakeModelClient(answer)


def approving(model: FakeModelClient, ran: list[str], store: MemoryStore) -> Agent:
    return Agent(
        model=model,
        tools=tools_of(ran, safe=["look"]),
        machine=approval_machine(),
        store=store,
    )


REJECT_NOTE = ToolCallsReviewed.reject({"c1": "no notes"})
"""Runs ``look a`` (safe to run twice) alone: the batch rides."""


async def test_a_pause_after_a_batch_writes_the_batch_with_the_pause() -> None:
    store = Appends()
    ran: list[str] = []
    agent = approving(looking_twice(), ran, store)
    first = await agent.run("look things up")
    assert first.outcome == "paused"

    second = await agent.resume(first.session_id, first.run_id, REJECT_NOTE)

    assert second.outcome == "paused"  # on the call that looks c up
    assert second.waiting is not None
    assert [c.id for c in second.waiting.calls] == ["c2"]
    assert ran == ["look a"]
    # The batch rode to the pause: one append, in the order it happened.
    assert kinds(store.appends[-1]) == WITH_THE_REPLY_AND_THE_END
    done = await agent.resume(
        first.session_id, first.run_id, ToolCallsReviewed.approve_all()
    )
    assert (done.outcome, done.text) == (
        "done",
        "rejected by the reviewer: no notes; a found; c found",
    )
    assert ran == ["look a", "look c"]
    assert_whole(agent.session, await Session.load(store, agent.session.id))


async def test_a_crash_after_an_approved_batch_runs_only_the_approved_call_again() -> (
    None
):
    # The rejected call's tool is not safe to run twice, but it never runs:
    # the batch is the approved call alone, and rides. Crashed while the
    # model reads it, the run resumes on that batch: the approved call runs
    # again, the rejected one stays rejected.
    store = MemoryStore()
    ran: list[str] = []
    crash = Crash(store)
    agent = approving(looking_twice(crash.here), ran, store)
    first = await agent.run("look things up")
    await stopped(
        lambda: agent.resume(first.session_id, first.run_id, REJECT_NOTE), crash.came
    )
    image = crash.image
    assert image is not None
    session = await Session.load(image, first.session_id)
    assert [r.outcome for r in session.runs] == ["running"]
    again = approving(looking_twice(), ran, image)

    second = await again.resume(first.session_id, first.run_id)

    assert second.outcome == "paused"
    assert second.waiting is not None
    assert [c.id for c in second.waiting.calls] == ["c2"]
    assert ran == ["look a", "look a"]  # never "note b"
    done = await again.resume(
        first.session_id, first.run_id, ToolCallsReviewed.approve_all()
    )
    assert done.text == "rejected by the reviewer: no notes; a found; c found"
    assert_whole(again.session, await Session.load(image, first.session_id))


# -- review, and a machine that ends after its tools -----------------------------
async def test_a_crash_in_the_review_after_a_batch_does_not_run_it_again() -> None:
    # The reply after the batch goes to the reviewer (a step of its own):
    # the batch is written with it, before the review runs.
    store = MemoryStore()
    ran: list[str] = []
    crash = Crash(store)
    reviews: list[str] = []

    async def review(ctx: EffectContext, decision: Perform) -> Event:
        reviews.append(decision.phase)
        if len(reviews) == 1:
            await crash.here()
        if len(reviews) == 2:
            return Signal("revise", {"feedback": "say it again"})
        return Signal("approved")

    def agent(on: MemoryStore) -> Agent:
        return Agent(
            model=batch_then_answer([("look", "a")]),
            tools=tools_of(ran, safe=["look"]),
            machine=review_machine(),
            effects={"review": review},
            store=on,
        )

    first = agent(store)
    await stopped(lambda: first.run("look a up"), crash.came)
    image = crash.image
    assert image is not None
    session = await Session.load(image, first.session.id)
    (run,) = session.open_runs()
    assert ToolsFinished in [type(e) for e in events(session, run.run_id)]
    again = agent(image)

    result = await again.resume(session.id, run.run_id)

    assert (result.outcome, result.text) == ("done", "a found")
    assert ran == ["look a"]
    assert reviews == ["await_review"] * 3  # the crashed one, revise, approved
    assert_whole(again.session, await Session.load(image, session.id))


async def test_a_machine_that_ends_after_its_tools_writes_the_batch_with_its_end() -> (
    None
):
    store = Appends()
    ran: list[str] = []
    driver = Driver(
        model=batch_then_answer([("look", "a")]),
        tools=tools_of(ran, safe=["look"]),
        machine=MachineSpec.from_toml(DONE_AFTER_TOOLS, source="mine.toml"),
    )
    session = Session(store=store)

    result = await driver.run("look a up", session=session)

    assert result.outcome == "done", result.error
    assert kinds(store.appends[-1]) == ["ToolsFinished", "Committed", "RunEnded"]
    assert [p.content for m in session.history for p in m.tool_results] == ["a found"]
    assert_whole(session, await Session.load(store, session.id))


# -- a compaction pass right after the batch -------------------------------------
def reading_pages(pages: int, then: Callable[[], Any] | None = None) -> FakeModelClient:
    """Reads `pages` long pages, one a turn, then answers.

    `then` is awaited when the model is asked after the last page.
    """
    turns = {"n": 0}

    async def answer(request: ModelRequest) -> Message:
        n = turns["n"]
        turns["n"] += 1
        if n < pages:
            return reply("", tool_call("read", f"p{n}", page=n))
        if then is not None and n == pages:
            await then()
        return reply("read them all")

    return FakeModelClient(answer)


def page_reader(ran: list[int]) -> Tool:
    def read(page: int) -> str:
        """Read a page.

        Args:
            page: which page.
        """
        ran.append(page)
        return f"page {page}: " + "word " * 400

    return function_tool(read, idempotent=True)


async def test_a_pass_right_after_a_batch_writes_the_batch_before_the_pass() -> None:
    # The last page's result crosses the threshold line: the pass's append
    # holds the batch (and the measurement) before the pass's own entries.
    # Crashed in the model call after the pass, the run resumes after it:
    # no page is read again.
    store = Appends()
    ran: list[int] = []
    crash = Crash(store)
    passes: list[object] = []

    class Passes(Hook):
        def on_compaction_pass(self, record: CompactionRecord) -> None:
            passes.append(record)

    def driver(model: FakeModelClient) -> Driver:
        return Driver(
            model=model,
            tools=[page_reader(ran)],
            context=ContextManager(context_window=2000),
            hooks=[Passes()],
        )

    session = Session(store=store)
    model = reading_pages(3, then=crash.here)
    await stopped(lambda: driver(model).run("read", session=session), crash.came)
    pass_appends = [a for a in store.appends if "CompactionResult" in kinds(a)]
    assert pass_appends
    for written in pass_appends:
        assert kinds(written)[:2] == ["ToolsFinished", "Measured"]
    assert len(passes) == len(pass_appends)  # each heard once, once written
    image = crash.image
    assert image is not None
    loaded = await Session.load(image, session.id)
    (run,) = loaded.open_runs()
    assert [r.outcome for r in loaded.runs] == ["running"]
    assert ran == [0, 1, 2]

    result = await driver(reading_pages(0)).resume(loaded, run.run_id)

    assert (result.outcome, result.text) == ("done", "read them all")
    assert ran == [0, 1, 2]  # no page read again
    assert_whole(loaded, await Session.load(image, session.id))


# -- a crash at any append --------------------------------------------------------
class DiesAt(MemoryStore):
    """A memory store whose process "dies" at its `at`-th append (from 1).

    The crash image (`Crash`) is taken before that append is written,
    and the append never returns: the run stops there, as a killed process
    does; the test cancels it.
    """

    def __init__(self, at: int) -> None:
        super().__init__()
        self.at = at
        self.count = 0
        self.appends: list[list[Entry]] = []  # each tried, the last one too
        self.crash = Crash(self)

    async def append(
        self, session_id: str, entries: Sequence[Entry], *, expected_version: int
    ) -> int:
        self.count += 1
        self.appends.append(list(entries))
        if self.count == self.at:
            await self.crash.here()
        return await super().append(
            session_id, entries, expected_version=expected_version
        )


def batches_model(batches: Sequence[Sequence[str]]) -> FakeModelClient:
    """Calls each batch of tools in turn, then answers.

    The turn is read from the conversation, so a resumed run goes on where
    its log says.
    """

    def answer(request: ModelRequest) -> Message:
        turn = sum(1 for m in request.messages if m.tool_calls)
        if turn < len(batches):
            calls = [
                tool_call(name, f"t{turn}c{i}", **{_ARGUMENT[name]: f"{turn}{i}"})
                for i, name in enumerate(batches[turn])
            ]
            return reply("", *calls)
        results = [p for m in request.messages for p in m.tool_results]
        return reply(f"{len(results)} results")

    return FakeModelClient(answer)


_ARGUMENT = {"look": "key", "note": "key", "reader": "task"}


@settings(max_examples=sized(300), deadline=None)
@given(
    batches=st.lists(
        st.lists(st.sampled_from(["look", "note", "reader"]), min_size=1, max_size=3),
        min_size=1,
        max_size=2,
    ),
    at=st.integers(2, 12),
)
def test_a_crash_at_any_append_resumes_with_every_call_answered_once(
    batches: list[list[str]], at: int
) -> None:
    # Whatever rode or was written when the process died (a sub-agent's
    # appends go to the same store): the resumed run ends done, every call
    # has one result, a call of a tool not safe to run twice ran at most
    # once, each sub-agent call has one child run, and the log replays.
    async def go() -> None:
        ran: list[str] = []
        asked: list[str] = []
        store = DiesAt(at)
        session = Session(store=store)
        reader = counted_child(asked).as_tool(name="reader", description="Reads.")
        driver = Driver(
            model=batches_model(batches),
            tools=[*tools_of(ran, safe=["look"]), reader],
        )
        await stopped(lambda: driver.run("go", session=session), store.crash.came)
        # A batch with a call of a tool not safe to run twice is written
        # before the model is asked: no later event shares its append.
        noting = {
            f"t{t}c{i}"
            for t, b in enumerate(batches)
            for i, name in enumerate(b)
            if name == "note"
        }
        for written in store.appends:
            logged = [e.event for e in written if isinstance(e, EventRecorded)]
            for n, event in enumerate(logged):
                if type(event) is ToolsFinished and noting & {
                    p.call_id for m in event.results for p in m.tool_results
                }:
                    assert n == len(logged) - 1, kinds(written)
        image = store.crash.image
        if image is None or session.id not in {
            s.id for s in await image.list_sessions()
        }:
            return  # it ended first, or died before it opened
        loaded = await Session.load(image, session.id)
        for open_run in loaded.open_runs():
            result = await driver.resume(loaded, open_run.run_id)
            assert result.outcome == "done", result.error
        calls = [c for m in loaded.history for c in m.tool_calls]
        answered = [p.call_id for m in loaded.history for p in m.tool_results]
        assert sorted(answered) == sorted(c.id for c in calls)
        assert len(calls) == sum(len(b) for b in batches)
        noted = [r for r in ran if r.startswith("note")]
        assert len(noted) == len(set(noted))  # at most once each
        kids = await child_sessions(image, session.id)
        assert len(kids) == sum(c.name == "reader" for c in calls)
        for kid in kids:
            assert [r.outcome for r in kid.runs] == ["done"]  # one child run
            assert all(replay(None, kid, r.run_id).ok for r in kid.runs)
        assert_whole(loaded, await Session.load(image, session.id))

    anyio.run(go)
