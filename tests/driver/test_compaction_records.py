"""What a compaction pass leaves in the log: its outcome as the brain settled
it, the breaker's state, and the usage of summary calls however the pass ended."""

from __future__ import annotations

import html
import time
from collections.abc import Sequence
from typing import Any

import anyio
import pytest

from tests.helpers import RefusingStore
from turnfsm.agent import Agent
from turnfsm.context import (
    CompactionContext,
    CompactionProposal,
    ContextManager,
    SummarizingCompactor,
    TruncatingCompactor,
)
from turnfsm.driver import Driver, RunControl, Session, function_tool
from turnfsm.errors import (
    CompactionFailed,
    CompactionStalled,
    ProviderError,
    StoreUnusable,
)
from turnfsm.hooks import CircuitInfo, Hook
from turnfsm.messages import Message
from turnfsm.persistence import (
    BreakerChanged,
    Committed,
    CompactionRecord,
    Entry,
    EventRecorded,
    MemoryStore,
    event_messages,
)
from turnfsm.providers import ModelRequest, ModelResponse
from turnfsm.testing import FakeModelClient, reply, tool_call
from turnfsm.tokens import HeuristicTokenCounter
from turnfsm.values import Usage
from turnfsm.view._html import pass_diff, turn_detail

pytestmark = pytest.mark.anyio

COUNTER = HeuristicTokenCounter()


def history(turns: int, size: int = 900) -> list[Message]:
    out: list[Message] = []
    for i in range(turns):
        out.append(Message.user(f"q{i} " + "q" * size))
        out.append(Message.assistant(f"a{i} " + "a" * size))
    return out


def manager(model: object, **options: object) -> ContextManager:
    return ContextManager(
        SummarizingCompactor(model=model, keep_recent_turns=2, **options),  # type: ignore[arg-type]
        context_window=4_000,
        threshold=60,
        counter=COUNTER,
    )


class Done(Hook):
    def __init__(self) -> None:
        self.seen: list[CompactionRecord] = []

    def on_compaction_pass(self, record: CompactionRecord) -> None:
        if record.compacted:
            self.seen.append(record)


def _stalling(hook: Hook, **options: Any) -> Driver:
    """A driver whose summaries are bigger than what they replace: passes stall."""
    big = "## Critical Context\n" + "fact 1234 " * 600
    return Driver(
        model=FakeModelClient(lambda _r: "x"),
        context=manager(
            FakeModelClient(lambda _r: big),
            max_summary_tokens=3_000,
            summary_window=100_000,
        ),
        hooks=[hook],
        **options,
    )


async def test_a_result_the_brain_refuses_is_logged_stalled_not_compacted() -> None:
    # Summaries bigger than what they replace: the no-progress guard refuses.
    hook = Done()
    driver = _stalling(hook)
    session = Session()
    result = await driver.run(
        history(6, size=300) + history(2, size=1_700), session=session
    )
    assert isinstance(result.error, CompactionStalled), result.error
    (record,) = session.runs[0].compactions
    assert record.verdict == "stalled"
    assert not record.compacted
    assert hook.seen == []
    assert session.summaries == ()
    assert list(session.history) == []


async def test_an_open_breaker_stays_open_until_the_operator_resets_it() -> None:
    broken = FakeModelClient(lambda _r: "")  # an empty summary: a failed pass
    session = Session()
    driver = Driver(model=FakeModelClient(lambda _r: "x"), context=manager(broken))
    for _ in range(3):
        await driver.run(history(6), session=session)
    assert session.compaction_failures == 3

    first = True

    def agent(_r: ModelRequest) -> str:
        nonlocal first
        if first:
            first = False
            raise ProviderError(
                "prompt is too long", kind="context_overflow", status=400
            )
        return "done"

    big = [
        Message.user("read it"),
        Message.assistant(tool_calls=[tool_call("read_file", "c1", path="a")]),
        Message.tool_result("c1", "z" * 5_000),
        Message.assistant("read"),
        Message.user("next"),
    ]
    overflow = Driver(
        model=FakeModelClient(agent),
        context=ContextManager(
            SummarizingCompactor(model=broken, keep_recent_turns=1),
            context_window=200_000,
            counter=COUNTER,
        ),
    )
    result = await overflow.run(big, session=session)
    assert result.ok, result.error
    assert session.runs[-1].compactions[-1].compacted  # deterministic work only
    assert session.compaction_failures == 3  # still open
    opened = [
        (e.open, e.failures) for e in session.entries if isinstance(e, BreakerChanged)
    ]
    assert opened == [(True, 3)]
    await session.reset_breaker()
    assert session.compaction_failures == 0


def oversized_then(control: RunControl | None) -> FakeModelClient:
    """An oversized first summary (with usage), then a re-ask that never returns."""
    calls = 0

    async def handle(_r: ModelRequest) -> ModelResponse:
        nonlocal calls
        calls += 1
        if calls == 1:
            return ModelResponse(
                message=Message.assistant("word " * 3_000),
                usage=Usage(input_tokens=500, output_tokens=600),
            )
        if control is not None:
            control.cancel("operator")
        await anyio.sleep(30)
        raise AssertionError("not reached")

    return FakeModelClient(handle)


async def test_a_pass_that_times_out_keeps_its_summary_calls_usage() -> None:
    session = Session()
    driver = Driver(
        model=FakeModelClient(lambda _r: "x"),
        context=manager(oversized_then(None), max_summary_tokens=100),
        compaction_timeout=0.3,
    )
    result = await driver.run(history(6), session=session)
    assert result.outcome == "failed"
    (record,) = session.runs[0].compactions
    assert record.verdict == "failed"
    assert record.usage == Usage(input_tokens=500, output_tokens=600)
    assert result.compaction_usage == record.usage
    assert session.runs[0].outcome == "failed"


class Late:
    """A compactor that answers after its deadline: it swallows the timeout's
    cancellation, or blocks without a checkpoint."""

    def __init__(self, how: str) -> None:
        self.how = how

    async def compact(
        self, messages: Sequence[Message], target: int, ctx: CompactionContext
    ) -> CompactionProposal:
        if self.how == "swallows":
            try:
                await anyio.sleep(5)
            except anyio.get_cancelled_exc_class():
                pass  # a bug of its own: cancellation is never swallowed
        else:
            time.sleep(0.5)  # noqa: ASYNC251  # a blocking call: the bug under test
        kept = [messages[0], *messages[-2:]]
        return CompactionProposal.compacted(kept, ctx.tokens_before, 0)


@pytest.mark.parametrize("how", ["swallows", "blocks"])
async def test_a_pass_that_answers_after_its_deadline_timed_out(how: str) -> None:
    session = Session()
    driver = Driver(
        model=FakeModelClient(lambda _r: "x"),
        context=ContextManager(
            Late(how), context_window=4_000, threshold=60, counter=COUNTER
        ),
        compaction_timeout=0.2,
    )
    result = await driver.run(history(6), session=session)
    assert isinstance(result.error, CompactionFailed)
    assert "timed out after 0.2s" in str(result.error)
    (record,) = session.runs[0].compactions
    assert record.verdict == "failed"
    assert list(session.history) == []


async def test_a_cancelled_pass_keeps_its_summary_calls_usage() -> None:
    control = RunControl()
    session = Session()
    driver = Driver(
        model=FakeModelClient(lambda _r: "x"),
        context=manager(oversized_then(control), max_summary_tokens=100),
    )
    result = await driver.run(history(6), session=session, control=control)
    assert result.outcome == "cancelled"
    assert result.compaction_usage == Usage(input_tokens=500, output_tokens=600)
    assert list(session.history) == []


async def test_auto_compact_off_turns_the_message_line_off() -> None:
    tiny = [
        m
        for i in range(30)
        for m in (Message.user(f"q{i}"), Message.assistant(f"a{i}"))
    ]
    driver = Driver(
        model=FakeModelClient(lambda _r: "done"),
        context=ContextManager(max_messages=50, auto_compact=False, counter=COUNTER),
    )
    session = Session()
    result = await driver.run([*tiny, Message.user("and?")], session=session)
    assert result.ok
    assert session.runs[0].compactions == ()
    assert len(session.history) == 62


async def test_a_pass_that_changes_a_message_under_its_id_reloads_as_committed() -> (
    None
):
    # The default strategy digests old tool results and keeps their ids (the
    # log still holds each original under it): a reopened session must
    # project the digest that was committed, not the original.
    def read(path: str) -> str:
        """Read a file.

        Args:
            path: the file.
        """
        return f"{path}: " + "line of output " * 600

    def handler(request: ModelRequest) -> ModelResponse:
        if request.messages[-1].tool_results:
            return ModelResponse(message=Message.assistant("read it"))
        turn = len(request.messages)
        return ModelResponse(
            message=Message.assistant(
                "", tool_calls=[tool_call("read", f"c{turn}", path="a")]
            )
        )

    store = MemoryStore()
    agent = Agent(
        model=FakeModelClient(handler),
        tools=[read],
        store=store,
        context=ContextManager(context_window=8_000, threshold=60),
    )
    for n in range(4):
        assert (await agent.run(f"question {n}")).ok
    live = agent.session
    changed = [m for m in live.history if live.message(m.id) != m]
    assert changed  # a pass changed a message and kept its id

    reopened = await Session.load(store, live.id)
    assert list(reopened.history) == list(live.history)
    assert reopened.history_after(live.runs[-1].run_id) == live.history
    assert reopened.message(changed[0].id) == live.message(changed[0].id)

    # The audit trail shows each turn what it saw: the rewrite, not the original.
    last = reopened.runs[-1]
    seen = reopened.seen(last.run_id, 0)
    assert [m.id for m in seen] == list(last.context(0))
    assert list(seen[: len(last.history)]) == list(last.history)
    rewrite = next(m for m in seen if m != reopened.message(m.id))
    page = "".join(turn_detail(reopened, last, 0))
    assert html.escape(rewrite.tool_results[0].content) in page
    original = reopened.message(rewrite.id).tool_results[0].content
    assert html.escape(original) not in page

    # A pass's diff shows each side as it was: a digested result is changed,
    # the original before, the digest after (not the original twice).
    run, record = next(
        (r, c)
        for r in reopened.runs
        for c in r.compactions
        if changed[0].id in c.covers and c.verdict == "compacted"
    )
    given, made = reopened.passed(record)
    assert [m.id for m in given] == list(record.covers)
    assert [m.id for m in made] == list(record.replacement)
    was = {m.id: m for m in given}[changed[0].id]
    became = {m.id: m for m in made}[changed[0].id]
    assert was == reopened.message(changed[0].id)
    assert became != was
    k = run.compactions.index(record)
    diff = "".join(pass_diff(reopened, run, reopened.runs.index(run), k))
    assert " changed, " in diff
    assert " 0 changed, " not in diff
    before_side, after_side = diff.split('<div class="after">')
    assert html.escape(was.tool_results[0].content) in before_side
    assert html.escape(became.tool_results[0].content) in after_side
    assert html.escape(was.tool_results[0].content) not in after_side
    assert 'class="msg tool changed' in before_side

    # Every turn of every run reads as a walk of the log up to its reply says
    # (`seen` answers from an index built once, not from a walk per turn).
    for run in reopened.runs:
        for index, turn in enumerate(run.turns):
            expected = _walk_seen(reopened.entries, run.run_id, turn.output)
            ids = run.context(index)
            assert reopened.seen(run.run_id, index) == tuple(expected[i] for i in ids)


def _walk_seen(
    entries: Sequence[Entry], run_id: str, reply_id: str
) -> dict[str, Message]:
    """Each id as last committed before `reply_id` was said, else as last brought."""
    brought: dict[str, Message] = {}
    committed: dict[str, Message] = {}
    for entry in entries:
        if isinstance(entry, EventRecorded):
            said = event_messages(entry.event)
            if entry.run_id == run_id and any(m.id == reply_id for m in said):
                break
            brought.update((m.id, m) for m in said)
        elif isinstance(entry, Committed):
            committed.update((i, brought[i]) for i in entry.messages)
    return {**brought, **committed}


class _Passes(Hook):
    def __init__(self) -> None:
        self.heard: list[str] = []

    def on_compaction_pass(self, record: CompactionRecord) -> None:
        self.heard.append(record.key)


async def test_a_pass_the_log_could_not_keep_is_told_once_when_it_is_kept() -> None:
    # The hooks hear of a pass with the record the log keeps: not before the
    # append that keeps it, so a pass the store refused (and a resume runs
    # again) is heard once, not twice.
    def read_log(name: str) -> str:
        """Read a log file.

        Args:
            name: the log file.
        """
        return f"{name}: " + "ERROR disk full\n" * 60

    replies = iter(
        [
            reply("", tool_call("read_log", "c1", name="app.log")),
            reply("", tool_call("read_log", "c2", name="db.log")),
            reply("", tool_call("read_log", "c3", name="auth.log")),
            reply("All three logs say the disk is full."),
        ]
    )
    store = RefusingStore(CompactionRecord)  # down for the first pass's append
    hook = _Passes()
    driver = Driver(
        model=FakeModelClient(lambda _r: next(replies)),
        tools=[function_tool(read_log)],
        context=ContextManager(
            TruncatingCompactor(compact_newest_exchange=True), context_window=2_000
        ),
        hooks=[hook],
    )
    session = Session(store=store)
    with pytest.raises(StoreUnusable):
        await driver.run("Audit app.log, db.log and auth.log.", session=session)
    assert hook.heard == []  # the log keeps no pass
    reopened = await Session.load(store, session.id)
    (stopped,) = reopened.open_runs()
    result = await driver.resume(reopened, stopped.run_id)
    assert result.ok, result.error
    kept = [c.key for run in reopened.runs for c in run.compactions]
    assert kept
    assert hook.heard == kept


class _Raises(Hook):
    """A strict hook that fails on a pass, and counts the run's ends."""

    def __init__(self) -> None:
        self.passes: list[CompactionRecord] = []
        self.ends = 0

    def on_compaction_pass(self, record: CompactionRecord) -> None:
        self.passes.append(record)
        raise ConnectionError("metrics server down")

    def on_run_end(self, info: object) -> None:
        self.ends += 1


async def test_a_strict_hook_failing_on_the_last_pass_hears_the_kept_end() -> None:
    # The pass that ends the run is told once its record and the run's end
    # are in the log; a strict hook raising there still hears the end.
    hook = _Raises()
    driver = _stalling(hook, strict_hooks=True)
    session = Session()
    with pytest.raises(ConnectionError):
        await driver.run(history(6, size=300) + history(2, size=1_700), session=session)
    (run,) = session.runs
    assert run.outcome == "failed"
    assert [p.key for p in hook.passes] == [c.key for c in run.compactions]
    assert hook.ends == 1


class _Openings(Hook):
    def __init__(self) -> None:
        self.heard: list[int] = []

    def on_circuit_opened(self, info: CircuitInfo) -> None:
        self.heard.append(info.failures)


async def test_the_breaker_s_opening_is_told_once_the_log_keeps_it() -> None:
    broken = FakeModelClient(lambda _r: "")  # an empty summary: a failed pass
    # Down for the breaker's opening: the run's end and the interruption's.
    store = RefusingStore(BreakerChanged, times=2)
    hook = _Openings()
    driver = Driver(
        model=FakeModelClient(lambda _r: "x"), context=manager(broken), hooks=[hook]
    )
    session = Session(store=store)
    for _ in range(2):
        await driver.run(history(6), session=session)
    with pytest.raises(StoreUnusable):
        await driver.run(history(6), session=session)
    assert hook.heard == []  # the log keeps no opening
    reopened = await Session.load(store, session.id)
    (stopped,) = reopened.open_runs()
    await driver.resume(reopened, stopped.run_id)
    opened = [e.failures for e in reopened.entries if isinstance(e, BreakerChanged)]
    assert opened == [3]
    assert hook.heard == [3]
