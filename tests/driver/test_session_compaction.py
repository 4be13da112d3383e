"""Compacting a stored session outside any run: idempotent, crash-safe."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import anyio
import pytest

from tests.helpers import run_killed
from turnfsm import (
    Agent,
    ContextManager,
    Driver,
    SummarizingCompactor,
    TruncatingCompactor,
)
from turnfsm.context import CompactionContext, CompactionProposal
from turnfsm.errors import CompactionFailed, SessionBusy, SessionNotFound
from turnfsm.messages import Message
from turnfsm.persistence import Session, SQLiteStore, SummaryRecorded, Verdict
from turnfsm.testing import ExtractiveSummaryModel, ScriptedModel
from turnfsm.tokens import HeuristicTokenCounter

pytestmark = pytest.mark.anyio

COUNTER = HeuristicTokenCounter()


def driver_with(summaries: object) -> Driver:
    return Driver(
        model=ScriptedModel.of(*[f"answer {i}" for i in range(20)]),
        context=ContextManager(
            SummarizingCompactor(model=summaries, keep_recent_turns=2),  # type: ignore[arg-type]
            context_window=50_000,
            counter=COUNTER,
        ),
    )


async def _filled(session: Session, driver: Driver, n: int = 8) -> None:
    for i in range(n):
        fact = f"fact {i}: the code of box {i} is {1000 + i}. " + "filler " * 150
        assert (await driver.run(fact, session=session)).ok


def _summaries(session: Session) -> list[SummaryRecorded]:
    return [e for e in session.entries if isinstance(e, SummaryRecorded)]


async def test_compacting_twice_writes_one_summary() -> None:
    model = ExtractiveSummaryModel()
    driver = driver_with(model)
    session = Session()
    await _filled(session, driver)
    first = await driver.compact(session)
    second = await driver.compact(session)
    assert (first.outcome, second.outcome) == ("done", "done")
    ((one,), (two,)) = (r.compactions for r in session.runs[-2:])
    assert one.verdict is Verdict.COMPACTED
    assert two.verdict in (Verdict.NOOP, Verdict.STALLED)
    assert len(_summaries(session)) == 1
    assert len(model.requests) == 1  # the repeat made no model call
    assert [r.opened.machine for r in session.runs[-2:]] == ["compaction", "compaction"]
    # The next run goes on from the compacted history.
    assert (await driver.run("and the code of box 0?", session=session)).ok


async def test_a_pass_that_keeps_a_summary_records_it_no_second_time() -> None:
    model = ExtractiveSummaryModel()
    driver = driver_with(model)
    session = Session()
    await _filled(session, driver)
    assert (await driver.compact(session)).ok
    (summary,) = _summaries(session)
    # Another strategy compacts the summarised history: the summary is kept,
    # as it was, so no summary is brought in and none is recorded again.
    truncating = Driver(
        model=ScriptedModel.of(),
        context=ContextManager(
            TruncatingCompactor(preserve_recent=1, min_messages=2),
            context_window=50_000,
            counter=COUNTER,
        ),
    )
    result = await truncating.compact(session)
    assert result.ok
    (record,) = session.runs[-1].compactions
    assert record.verdict is Verdict.COMPACTED
    assert summary.message_id in record.replacement
    assert _summaries(session) == [summary]


async def test_an_agent_compacts_a_session_by_id(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "s.db")
    model = ExtractiveSummaryModel()
    agent = Agent(
        model=ScriptedModel.of(*["ok"] * 20),
        context=driver_with(model).context,
        store=store,
    )
    await _filled(agent.session, agent.driver)
    session_id = agent.session.id
    other = Agent(
        model=ScriptedModel.of(), context=driver_with(model).context, store=store
    )
    result = await other.compact(session_id)
    assert result.ok
    reopened = await Session.load(SQLiteStore(tmp_path / "s.db"), session_id)
    assert len(_summaries(reopened)) == 1
    await store.aclose()


async def test_a_session_never_run_is_not_found_and_nothing_is_written(
    tmp_path: Path,
) -> None:
    store = SQLiteStore(tmp_path / "s.db")
    agent = Agent(model=ScriptedModel.of("hi"), store=store)
    with pytest.raises(SessionNotFound, match="ses_never"):
        await agent.compact("ses_never")
    with pytest.raises(SessionNotFound, match=agent.session.id):
        await agent.compact()  # the agent's own session, before its first run
    with pytest.raises(SessionNotFound, match=agent.session.id):
        await agent.compact(agent.session.id)
    with pytest.raises(SessionNotFound):
        await agent.driver.compact(Session(store=store))
    assert not await store.list_sessions()
    # Once it has run, it compacts.
    assert (await agent.run("hello")).ok
    assert (await agent.compact()).ok
    await store.aclose()


@pytest.mark.slow
async def test_a_compaction_killed_mid_pass_then_retried_writes_one_summary(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.db"
    store = SQLiteStore(path)
    session = Session(store=store)
    await _filled(session, driver_with(ExtractiveSummaryModel()))
    await store.aclose()
    run_killed("tests.driver.compact_worker", str(path), session.id)
    store = SQLiteStore(path)
    crashed = await Session.load(store, session.id)
    (open_run,) = crashed.open_runs()
    assert open_run.opened.machine == "compaction"
    assert _summaries(crashed) == []
    # The retry carries the unfinished compaction on; the killed worker's
    # lease has not expired yet: force takes it over.
    model = ExtractiveSummaryModel()
    with pytest.raises(SessionBusy):
        await driver_with(model).compact(crashed)
    result = await driver_with(model).compact(crashed, force=True)
    assert result.ok, result.error
    assert result.run_id == open_run.run_id
    assert len(_summaries(crashed)) == 1
    assert (await driver_with(model).compact(crashed)).ok
    assert len(_summaries(crashed)) == 1
    await store.aclose()


class _Raising:
    """A strategy that fails at once."""

    async def compact(self, messages: object, target: int, ctx: object) -> object:
        raise ValueError("no")


class _Hanging:
    """A strategy that never answers."""

    async def compact(self, messages: object, target: int, ctx: object) -> object:
        await anyio.sleep_forever()


async def test_a_session_pass_that_times_out_says_the_sessions_size() -> None:
    """Outside a run nothing was measured: the failure still gives the size."""
    session = Session()
    filler = Driver(model=ScriptedModel.of("a1", "a2"))
    for i in range(2):
        assert (await filler.run(f"question {i} " + "x " * 50, session=session)).ok
    results = []
    for strategy in (_Hanging(), _Raising()):
        context = ContextManager(strategy, context_window=50_000, counter=COUNTER)
        driver = Driver(
            model=ScriptedModel.of(), context=context, compaction_timeout=0.1
        )
        results.append(await driver.compact(session))

    timed_out, raised = (r.error for r in results)
    assert isinstance(timed_out, CompactionFailed)
    assert isinstance(raised, CompactionFailed)
    assert "timed out" in timed_out.cause
    assert timed_out.used == raised.used > 0


class _Growing:
    """Replaces the conversation with something bigger than the window."""

    async def compact(
        self, messages: Sequence[Message], target: int, ctx: CompactionContext
    ) -> CompactionProposal:
        padded = [Message.system("pad " * 3_000, id="pad"), *messages]
        return CompactionProposal.compacted(padded, ctx.tokens_before, 1)


async def test_a_session_pass_that_overflows_records_the_session_s_size() -> None:
    """Outside a run nothing was measured: its record said the after size twice."""
    session = Session()
    filler = Driver(model=ScriptedModel.of("a1", "a2"))
    for i in range(2):
        assert (await filler.run(f"question {i} " + "x " * 50, session=session)).ok
    context = ContextManager(_Growing(), context_window=2_000, counter=COUNTER)
    driver = Driver(model=ScriptedModel.of(), context=context)

    result = await driver.compact(session)

    assert not result.ok
    (record,) = session.runs[-1].compactions
    assert record.verdict is Verdict.OVERFLOW
    assert record.tokens_before == context.count(list(session.history))
    assert record.tokens_after > 2_000
