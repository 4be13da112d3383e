"""A session compacted while a run waits for approval: the calls survive.

A run of the approval machine pauses with tool calls awaiting a person. The
operator compacts the session meanwhile (`Agent.compact`, as ``turnfsm
sessions compact`` does): the pass folds only the committed history, never
the paused run's own messages, the calls awaiting approval among them. When
the calls are approved (in a fresh agent, as another process would), they
run, each once, with no orphan; the run goes on from the compacted history;
every run of the session replays exactly from the log.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import anyio
import pytest

from turnfsm import Agent, ContextManager, SummarizingCompactor, approval_machine
from turnfsm.core import ToolCallsReviewed
from turnfsm.driver import replay
from turnfsm.errors import SessionBusy
from turnfsm.messages import Message, Role, check_history
from turnfsm.persistence import Session, SQLiteStore, Verdict
from turnfsm.providers import ModelRequest
from turnfsm.testing import ExtractiveSummaryModel, FakeModelClient, reply, tool_call
from turnfsm.tokens import HeuristicTokenCounter

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("anyio_backend", ["asyncio"])]

NOTES = 6


class World:
    """The scripted model and the tool, with what each saw and did."""

    def __init__(self) -> None:
        self.deleted: Counter[str] = Counter()
        self.requests: list[ModelRequest] = []
        self.started: anyio.Event | None = None  # set as a delete starts

    def answer(self, request: ModelRequest) -> Message:
        self.requests.append(request)
        last = request.messages[-1]
        if last.role is Role.TOOL:
            done = [p.content for m in request.messages for p in m.tool_results]
            return reply("cleaned: " + "; ".join(done[-2:]))
        if last.text.startswith("clean"):
            return reply(
                "",
                tool_call("delete", "c1", path="/tmp/a"),
                tool_call("delete", "c2", path="/tmp/b"),
            )
        return reply(f"noted: {last.text[:20]}")

    def agent(self, store: SQLiteStore) -> Agent:
        def delete(path: str) -> str:
            """Delete a file.

            Args:
                path: the file.
            """
            if self.started is not None:
                anyio.from_thread.run_sync(self.started.set)
            self.deleted[path] += 1
            return f"deleted {path}"

        return Agent(
            model=FakeModelClient(self.answer),
            tools=[delete],
            machine=approval_machine(),
            context=ContextManager(
                SummarizingCompactor(
                    model=ExtractiveSummaryModel(), keep_recent_turns=1
                ),
                context_window=50_000,
                counter=HeuristicTokenCounter(),
            ),
            store=store,
        )


def _calls(messages: list[Message]) -> set[str]:
    return {c.id for m in messages for c in m.tool_calls}


async def test_a_pass_while_a_run_waits_for_approval_keeps_its_calls(
    tmp_path: Path,
) -> None:
    store = SQLiteStore(tmp_path / "s.db")
    world = World()
    agent = world.agent(store)
    for i in range(NOTES):
        note = f"note {i}: the code of box {i} is {1000 + i}. " + "filler " * 150
        assert (await agent.run(note)).ok
    paused = await agent.run("clean up the temp files")
    assert paused.outcome == "paused"
    assert paused.waiting is not None
    assert [c.id for c in paused.waiting.calls] == ["c1", "c2"]
    session_id = agent.session.id
    before = list(agent.session.history)

    # The operator compacts the session while the run waits.
    operator = world.agent(store)
    compacted = await operator.compact(session_id)

    assert compacted.ok, compacted.error
    session = operator.session
    (record,) = session.runs[-1].compactions
    assert record.verdict is Verdict.COMPACTED
    assert record.tokens_after < record.tokens_before
    after = list(session.history)
    assert len(after) < len(before)
    # Only the committed history was folded: the waiting calls are nowhere
    # in it, and the paused run still waits for them.
    assert not _calls(after)
    (waiting,) = session.open_runs()
    assert (waiting.run_id, waiting.outcome) == (paused.run_id, "paused")
    assert waiting.waiting is not None
    assert [c.id for c in waiting.waiting.calls] == ["c1", "c2"]
    # Still paused: a new run is refused until the person answers.
    with pytest.raises(SessionBusy):
        await operator.run("something else")

    # The person approves, in a fresh agent (another process would do the same).
    approver = world.agent(store)
    done = await approver.resume(
        session_id, paused.run_id, ToolCallsReviewed.approve_all()
    )

    assert done.outcome == "done", done.error
    assert done.text == "cleaned: deleted /tmp/a; deleted /tmp/b"
    assert world.deleted == Counter({"/tmp/a": 1, "/tmp/b": 1})
    final = list(approver.session.history)
    check_history(final)  # no orphan: every call has its result
    assert final[: len(after)] == after  # it went on from the compacted history
    assert _calls(final) == {"c1", "c2"}
    # The model, after the approval, saw the compacted history, not the notes.
    (last_request,) = world.requests[-1:]
    sent = [m.id for m in last_request.messages]
    assert sent[: len(after)] == [m.id for m in after]
    assert after[0].role is Role.SYSTEM  # the summary

    # The log replays: every run, in a process that reads it afresh.
    reopened = await Session.load(SQLiteStore(tmp_path / "s.db"), session_id)
    assert [m.id for m in reopened.history] == [m.id for m in final]
    for run in reopened.runs:
        report = replay(None, reopened, run.run_id)
        assert report.ok, (run.run_id, report)
    await store.aclose()


async def test_a_run_whose_process_died_still_stops_a_pass(tmp_path: Path) -> None:
    """Only a paused run lets the session compact: an unfinished one (its
    process died, or it was interrupted) is resumed or abandoned first."""
    store = SQLiteStore(tmp_path / "s.db")
    world = World()
    agent = world.agent(store)
    for i in range(NOTES):
        assert (await agent.run(f"note {i}: " + "filler " * 150)).ok
    paused = await agent.run("clean up the temp files")
    # Approved, then interrupted from outside while the calls run: the run
    # is unfinished (not paused) when the operator comes.
    session = agent.session
    world.started = started = anyio.Event()
    async with anyio.create_task_group() as group:

        async def approve() -> None:
            await agent.resume(
                session.id, paused.run_id, ToolCallsReviewed.approve_all()
            )

        group.start_soon(approve)
        await started.wait()
        group.cancel_scope.cancel()
    assert session.runs[-1].outcome == "interrupted"

    with pytest.raises(SessionBusy):
        await world.agent(store).compact(session.id)

    reopened = await Session.load(store, session.id)
    assert reopened.compaction_failures == 0
    assert [r.opened.machine for r in reopened.runs].count("compaction") == 0

    # Resumed, the calls left without a result are closed as interrupted:
    # none is open, and the pass goes through.
    later = world.agent(store)
    world.started = None
    done = await later.resume(session.id, paused.run_id)
    assert done.outcome == "done", done.error
    check_history(later.session.history)
    assert _calls(list(later.session.history)) == {"c1", "c2"}
    assert all(n == 1 for n in world.deleted.values())  # none ran twice
    compacted = await world.agent(store).compact(session.id)
    assert compacted.ok, compacted.error
    final = await Session.load(store, session.id)
    (record,) = final.runs[-1].compactions
    assert record.verdict is Verdict.COMPACTED
    assert all(replay(None, final, r.run_id).ok for r in final.runs)
    await store.aclose()
