"""The run as an append-only log: written as it happens, kept through cancellation."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import anyio
import pytest

from turnfsm._lines import window_to_send
from turnfsm.context import (
    CompactionContext,
    CompactionProposal,
    ContextManager,
    PinRules,
    TruncatingCompactor,
)
from turnfsm.core import (
    CompactionResult,
    ModelReplied,
    RunStarted,
    RunTools,
    ToolsFinished,
)
from turnfsm.driver import Driver, EffectContext, RunControl, Session, Tool, replay
from turnfsm.errors import (
    CONTEXT_OVERFLOW,
    Cancelled,
    CompactionFailed,
    CompactionStalled,
    InvalidMessage,
    ProviderError,
    SessionBusy,
)
from turnfsm.hooks import DecisionInfo, Hook
from turnfsm.messages import Message
from turnfsm.persistence import (
    Committed,
    CompactionRecord,
    EventRecorded,
    MemoryStore,
    RunEnded,
    SQLiteStore,
)
from turnfsm.testing import FakeModelClient, ScriptedModel, reply, tool_call
from turnfsm.tokens import HeuristicTokenCounter

pytestmark = pytest.mark.anyio


def _big_history(pairs: int, size: int) -> list[Message]:
    out: list[Message] = []
    for i in range(pairs):
        out.append(Message.user(f"q{i} " + "x" * size))
        out.append(Message.assistant(f"a{i} " + "y" * size))
    out.append(Message.user("now"))
    return out


def _compacting_driver(model: object, **options: object) -> Driver:
    ctx = ContextManager(
        TruncatingCompactor(preserve_recent=2, min_messages=2),
        context_window=4_000,
        threshold=60,
        counter=HeuristicTokenCounter(),
    )
    return Driver(model=model, context=ctx, **options)  # type: ignore[arg-type]


async def test_the_log_is_written_as_the_run_goes() -> None:
    seen: list[list[str]] = []
    session = Session()

    def peek() -> str:
        """Look at the log mid-run."""
        seen.append([type(e).__name__ for e in session.entries])
        return "ok"

    model = ScriptedModel.of(reply("", tool_call("peek", "c1")), "done")
    result = await Driver(model=model, tools=[peek]).run("go", session=session)
    assert result.ok
    # While the tool ran, the machine the run began on, the run's opening,
    # its events so far and the turn that asked for the tool were already in
    # the store.
    assert seen == [
        [
            "MachineStored",
            "RunOpened",
            "EventRecorded",
            "EventRecorded",
            "TurnRecord",
            "EventRecorded",
        ]
    ]
    stored = await session.store.load(session.id)
    assert list(stored) == list(session.entries)
    assert isinstance(stored[-1], RunEnded)
    assert stored[-1].outcome == "done"


async def test_history_and_runs_are_projections_of_the_log() -> None:
    store = MemoryStore()
    session = Session(store=store)
    driver = _compacting_driver(ScriptedModel.of("one", "two"))
    await driver.run(_big_history(10, 500), session=session)
    await driver.run("again", session=session)
    reopened = await Session.load(store, session.id)
    assert [m.id for m in reopened.history] == [m.id for m in session.history]
    assert [r.outcome for r in reopened.runs] == ["done", "done"]
    assert reopened.runs[0].compactions == session.runs[0].compactions
    assert reopened.version == session.version == len(await store.load(session.id))


async def test_a_failed_run_stays_in_the_audit_trail_never_in_the_history() -> None:
    session = Session()
    model = ScriptedModel.of(reply("", tool_call("nope", "c1")), "unused")
    result = await Driver(model=model, max_turns=1).run("go", session=session)
    assert result.outcome == "failed"
    assert list(session.history) == []
    run = session.runs[0]
    assert run.outcome == "failed"
    assert [type(e).__name__ for e in run.events][:3] == [
        "RunStarted",
        "Measured",
        "ModelReplied",
    ]
    assert run.input[0].text == "go"


class _Blocker:
    """Blocks forever at one await of the run and says when it got there."""

    def __init__(self) -> None:
        self.reached = anyio.Event()

    async def block(self) -> None:
        self.reached.set()
        await anyio.sleep_forever()


class _HangingCompactor:
    def __init__(self, blocker: _Blocker) -> None:
        self.blocker = blocker

    async def compact(
        self, messages: Sequence[Message], target: int, ctx: CompactionContext
    ) -> CompactionProposal:
        await self.blocker.block()
        raise AssertionError("unreachable")


def _scenario(where: str, blocker: _Blocker) -> tuple[Driver, list[Message]]:
    """A run that first compacts (a commit point), then blocks at `where`."""

    async def slow(text: str) -> str:
        """Block.

        Args:
            text: ignored.
        """
        await blocker.block()
        return text

    calls = {"n": 0}

    async def answer(request: object) -> Message:
        calls["n"] += 1
        if where == "model":
            await blocker.block()
        if where == "tool" and calls["n"] == 1:
            return reply("", tool_call("slow", "c1", text="x"))
        return reply("done")

    if where == "compaction":
        ctx = ContextManager(
            _HangingCompactor(blocker),
            context_window=4_000,
            threshold=60,
            counter=HeuristicTokenCounter(),
        )
        driver = Driver(model=FakeModelClient(answer), context=ctx)
        return driver, _big_history(10, 500)
    driver = _compacting_driver(FakeModelClient(answer), tools=[slow])
    return driver, _big_history(10, 500)


@pytest.mark.parametrize("where", ["model", "tool", "compaction", "hook"])
async def test_a_cancel_from_outside_at_any_await_is_logged_and_propagates(
    where: str,
) -> None:
    blocker = _Blocker()
    session = Session()

    class CancelInHook(Hook):
        def __init__(self) -> None:
            self.scope: anyio.CancelScope | None = None

        def on_decision(self, info: DecisionInfo) -> None:
            if isinstance(info.decision, RunTools) and self.scope is not None:
                self.scope.cancel()

    hook = CancelInHook()
    driver, messages = _scenario("tool" if where == "hook" else where, blocker)
    history_before = list(session.history)
    with anyio.fail_after(5):
        with anyio.CancelScope() as scope:
            hook.scope = scope
            async with anyio.create_task_group() as group:

                async def run() -> None:
                    await driver.run(
                        messages,
                        session=session,
                        hooks=[hook] if where == "hook" else [],
                    )

                group.start_soon(run)
                if where != "hook":
                    await blocker.reached.wait()
                    scope.cancel()
    assert scope.cancelled_caught  # the cancellation propagated
    run = session.runs[-1]
    assert run.outcome == "interrupted"
    assert run.is_open  # resumable, like a crashed run
    assert isinstance(run.error, Cancelled)
    if where in ("model", "tool", "hook"):
        # The compaction committed before the cancel is still the history.
        assert any(isinstance(e, CompactionResult) for e in run.events)
        assert 0 < len(session.history) < len(messages)
    else:
        assert list(session.history) == history_before
    assert not session.is_running
    # The interrupted run holds the session until it is resumed or abandoned...
    with pytest.raises(SessionBusy):
        await Driver(model=ScriptedModel.of("fine")).run("next", session=session)
    abandoned = await driver.abandon(session, run.run_id)
    assert (abandoned.outcome, session.runs[-1].outcome) == ("failed", "failed")
    # ...and then the session takes its next run.
    nxt = await Driver(model=ScriptedModel.of("fine")).run("next", session=session)
    assert nxt.ok
    assert session.history[-1].text == "fine"


async def test_control_cancel_interrupts_a_hanging_compactor_within_a_second() -> None:
    blocker = _Blocker()
    driver, messages = _scenario("compaction", blocker)
    control = RunControl()
    session = Session()
    with anyio.fail_after(1):
        async with anyio.create_task_group() as group:

            async def stop() -> None:
                await blocker.reached.wait()
                control.cancel("user pressed stop")

            group.start_soon(stop)
            result = await driver.run(messages, session=session, control=control)
    assert result.outcome == "cancelled"
    assert isinstance(result.error, Cancelled)
    assert result.error.reason == "user pressed stop"
    assert session.runs[-1].outcome == "cancelled"


async def test_the_compaction_timeout_stops_a_hanging_compactor() -> None:
    blocker = _Blocker()
    ctx = ContextManager(
        _HangingCompactor(blocker),
        context_window=4_000,
        threshold=60,
        counter=HeuristicTokenCounter(),
    )
    driver = Driver(model=ScriptedModel.of("x"), context=ctx, compaction_timeout=0.2)
    with anyio.fail_after(2):
        result = await driver.run(_big_history(10, 500))
    assert isinstance(result.error, CompactionFailed)
    assert "timed out after 0.2s" in result.error.cause


class _ShieldedCompactor:
    """A compactor that ignores its cancellation for `seconds`."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    async def compact(
        self, messages: Sequence[Message], target: int, ctx: CompactionContext
    ) -> CompactionProposal:
        with anyio.CancelScope(shield=True):
            await anyio.sleep(self.seconds)
        raise RuntimeError("late, and failed anyway")


async def test_a_compactor_that_ignores_its_timeout_holds_the_run_and_is_named(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from turnfsm.driver import _tools

    monkeypatch.setattr(_tools, "_HELD_GRACE", 0.3)
    caplog.set_level("WARNING", logger="turnfsm.driver")
    ctx = ContextManager(
        _ShieldedCompactor(0.6),
        context_window=4_000,
        threshold=60,
        counter=HeuristicTokenCounter(),
    )
    driver = Driver(model=ScriptedModel.of("x"), context=ctx, compaction_timeout=0.1)
    with anyio.fail_after(5):
        result = await driver.run(_big_history(10, 500))
    assert isinstance(result.error, CompactionFailed)
    assert "timed out after 0.1s" in result.error.cause  # not the late error
    (warning,) = [r for r in caplog.records if "ignored its cancellation" in r.message]
    assert warning.getMessage().startswith(
        "the compaction pass ignored its cancellation at its timeout of 0.1s: "
        "the run waited 0."
    )


async def test_a_custom_effect_with_an_orphaned_result_fails_the_run() -> None:
    async def wrong_results(ctx: EffectContext, decision: RunTools) -> ToolsFinished:
        return ToolsFinished(results=[Message.tool_result("not-asked", "??")])

    model = ScriptedModel.of(reply("", tool_call("t", "c1")), "never sent")
    session = Session()
    driver = Driver(model=model, effects={"run_tools": wrong_results})
    result = await driver.run("go", session=session)
    assert result.outcome == "failed"
    assert isinstance(result.error, InvalidMessage)
    assert result.error.value == "not-asked"
    assert len(model.requests) == 1  # the model never saw the orphan
    assert list(session.history) == []
    assert session.runs[-1].outcome == "failed"
    assert (await Driver(model=ScriptedModel.of("ok")).run("x", session=session)).ok


async def test_a_reply_that_would_overflow_the_window_is_never_committed() -> None:
    huge = "z " * 3_000
    model = ScriptedModel.of(huge, huge, huge, huge)
    ctx = ContextManager(context_window=1_000, counter=HeuristicTokenCounter())
    session = Session()
    result = await Driver(model=model, context=ctx).run("hi", session=session)
    assert result.outcome == "failed"
    assert list(session.history) == []
    assert (
        await Driver(model=ScriptedModel.of("ok"), context=ctx).run(
            "again", session=session
        )
    ).ok


async def test_the_reply_budget_is_reserved() -> None:
    ctx = ContextManager(context_window=1_000, counter=HeuristicTokenCounter())
    model = ScriptedModel.of("ok")
    session = Session()
    driver = Driver(model=model, context=ctx, max_output_tokens=400)
    await driver.run("x " * 1_000, session=session)  # ~500 tokens + 400 reserved
    measured = [
        e.event.estimate  # type: ignore[union-attr]
        for e in session.entries
        if isinstance(e, EventRecorded) and hasattr(e.event, "estimate")
    ]
    assert measured[0] >= 400 + 500


async def test_every_run_replays_exactly_and_a_tampered_log_is_caught() -> None:
    session = Session()
    driver = _compacting_driver(
        ScriptedModel.of(reply("", tool_call("t", "c1")), "one", "two"),
    )
    await driver.run(_big_history(10, 500), session=session)
    await driver.run("more", session=session)
    for run in session.runs:
        report = replay(driver.machine, session, run.run_id)
        assert report.ok, report
    # Tamper: pretend the first measurement was tiny, so no compaction ran.
    entries = list(session.entries)
    index = next(
        i
        for i, e in enumerate(entries)
        if isinstance(e, EventRecorded) and type(e.event).__name__ == "Measured"
    )
    old = entries[index]
    assert isinstance(old, EventRecorded)
    entries[index] = EventRecorded(
        run_id=old.run_id,
        index=old.index,
        event=type(old.event)(estimate=1),  # type: ignore[call-arg]
        phase=old.phase,
        decision=old.decision,
        at=old.at,
    )
    store = MemoryStore()
    await store.append(session.id, entries, expected_version=0)
    tampered = await Session.load(store, session.id)
    report = replay(driver.machine, tampered, old.run_id)
    assert not report.ok
    assert report.divergence is not None
    assert report.divergence.index == old.index
    assert report.divergence.event == "measured"


@pytest.mark.parametrize("idempotent", [False, True])
async def test_a_run_whose_process_died_resumes_from_its_last_event(
    idempotent: bool,
) -> None:
    from turnfsm.driver import function_tool
    from turnfsm.persistence import ToolResultRecorded

    session = Session()
    model = ScriptedModel.of(reply("", tool_call("t", "c1")), "finished")
    ran: list[str] = []

    def t() -> str:
        """A tool."""
        ran.append("t")
        return "result"

    tool = function_tool(t, idempotent=idempotent)
    driver = Driver(model=model, tools=[tool])
    result = await driver.run("go", session=session)
    assert result.ok
    # The process "died" right after the model asked for the tool.
    entries = session.entries
    cut = next(
        i + 1
        for i, e in enumerate(entries)
        if isinstance(e, EventRecorded) and isinstance(e.event, ModelReplied)
    )
    store = MemoryStore()
    await store.append(session.id, entries[:cut], expected_version=0)
    reopened = await Session.load(store, session.id)
    assert [r.outcome for r in reopened.runs] == ["running"]
    again = Driver(model=ScriptedModel.of("finished"), tools=[tool])
    ran.clear()
    resumed = await again.resume(reopened, result.run_id)
    assert resumed.ok
    assert [m.text for m in reopened.history] == ["go", "", "", "finished"]
    (closing,) = reopened.history[2].tool_results
    if idempotent:  # safe to run twice: it runs again
        assert ran == ["t"]
        assert (closing.content, closing.is_error) == ("result", False)
    else:  # its effects are unknown: closed as interrupted, not run again
        assert ran == []
        assert closing.is_error
        assert closing.content.startswith("tool 't' was interrupted")
        # logged as a result of the batch in flight, before the batch ended
        (logged,) = [e for e in reopened.entries if isinstance(e, ToolResultRecorded)]
        assert logged.result.tool_results == (closing,)
    assert isinstance(reopened.runs[0].events[0], RunStarted)
    assert replay(again.machine, reopened, result.run_id).ok


async def test_abandon_ends_an_open_run_and_frees_the_session() -> None:
    session = Session()
    store_entries = await _died_mid_run(session)
    store = MemoryStore()
    await store.append(session.id, store_entries, expected_version=0)
    reopened = await Session.load(store, session.id)
    run_id = reopened.runs[0].run_id
    driver = Driver(model=ScriptedModel.of("later"))
    with pytest.raises(Exception, match="resume or abandon"):
        await driver.run("new", session=reopened)
    ended = await driver.abandon(reopened, run_id, reason="operator")
    assert ended.outcome == "failed"
    assert isinstance(ended.error, Cancelled)
    assert ended.error.reason == "operator"
    assert reopened.runs[0].outcome == "failed"
    assert list(reopened.history) == []
    assert (await driver.run("new", session=reopened)).ok


async def _died_mid_run(session: Session) -> list[object]:
    model = ScriptedModel.of(reply("", tool_call("t", "c1")), "x")
    await Driver(model=model).run("go", session=session)
    entries = list(session.entries)
    return [e for e in entries if not isinstance(e, RunEnded | Committed)][:4]


async def test_an_injecting_hook_cannot_make_a_run_compact_without_bound() -> None:
    control = RunControl()

    class InjectAfterEveryPass(Hook):
        def __init__(self) -> None:
            self.passes = 0

        def on_compaction_pass(self, record: CompactionRecord) -> None:
            self.passes += 1
            control.inject(Message.user(f"and one more thing ({self.passes})"))

    # The first message alone is over the threshold line (always kept by the
    # truncator), so every pass cuts only the injected message and saves a
    # little: without a bound the run would compact forever.
    ctx = ContextManager(
        TruncatingCompactor(preserve_recent=1, min_messages=2),
        context_window=4_000,
        threshold=50,
        counter=HeuristicTokenCounter(),
    )
    hook = InjectAfterEveryPass()
    history = [Message.user("x" * 9_000), Message.assistant("ok"), Message.user("go")]
    driver = Driver(
        model=ScriptedModel.of("answered"), context=ctx, hooks=[hook], max_compactions=5
    )
    with anyio.fail_after(5):
        result = await driver.run(history, control=control)
    assert hook.passes == 5  # the per-run bound, then the model is called
    assert result.ok
    assert result.text == "answered"


async def test_a_custom_phase_effect_gets_the_context_and_its_decision() -> None:
    from tests.helpers import approval_toml
    from turnfsm.core import MachineSpec, Perform, Signal

    seen: list[tuple[str, int, str]] = []

    async def await_approval(ctx: EffectContext, decision: Perform) -> Signal:
        calls = ctx.snapshot.last_reply.tool_calls  # type: ignore[union-attr]
        seen.append((decision.phase, len(calls), ctx.run_id))
        return Signal(name="approved")

    def t() -> str:
        """A tool."""
        return "ran"

    spec = MachineSpec.from_toml(approval_toml())
    model = ScriptedModel.of(reply("", tool_call("t", "c1")), "done")
    driver = Driver(
        model=model, tools=[t], machine=spec, effects={"await_approval": await_approval}
    )
    result = await driver.run("go")
    assert result.ok
    assert seen == [("await_approval", 1, result.run_id)]


async def test_a_custom_effect_that_hangs_is_stopped_by_its_timeout() -> None:
    from tests.helpers import approval_toml
    from turnfsm.core import MachineSpec, Perform, Signal

    async def await_approval(ctx: EffectContext, decision: Perform) -> Signal:
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    spec = MachineSpec.from_toml(approval_toml())
    model = ScriptedModel.of(reply("", tool_call("t", "c1")), "done")
    driver = Driver(
        model=model,
        machine=spec,
        effects={"await_approval": await_approval},
        effect_timeout=0.1,
    )
    with anyio.fail_after(2):
        result = await driver.run("go")
    assert result.outcome == "cancelled"
    assert isinstance(result.error, Cancelled)
    assert "timed out after 0.1s" in result.error.reason


async def test_a_custom_effect_that_ignores_its_timeout_holds_the_run_and_is_named(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Nothing can stop an effect that shields itself: the run waits for it,
    # then ends as the timeout says, and a warning names what held it.
    from tests.helpers import approval_toml
    from turnfsm.core import MachineSpec, Perform, Signal
    from turnfsm.driver import _tools

    async def await_approval(ctx: EffectContext, decision: Perform) -> Signal:
        with anyio.CancelScope(shield=True):
            await anyio.sleep(0.6)
        return Signal(name="approved")

    monkeypatch.setattr(_tools, "_HELD_GRACE", 0.3)
    caplog.set_level("WARNING", logger="turnfsm.driver")
    driver = Driver(
        model=ScriptedModel.of(reply("", tool_call("t", "c1")), "done"),
        machine=MachineSpec.from_toml(approval_toml()),
        effects={"await_approval": await_approval},
        effect_timeout=0.1,
    )
    with anyio.fail_after(5):
        result = await driver.run("go")
    assert result.outcome == "cancelled"
    assert isinstance(result.error, Cancelled)
    assert "timed out after 0.1s" in result.error.reason
    (warning,) = [r for r in caplog.records if "ignored its cancellation" in r.message]
    assert warning.getMessage().startswith(
        "effect 'await_approval' ignored its cancellation at its timeout "
        "of 0.1s: the run waited 0."
    )


@pytest.mark.parametrize("idempotent", [False, True])
async def test_tool_results_recorded_before_a_crash_are_not_run_again(
    idempotent: bool,
) -> None:
    from turnfsm.driver import function_tool
    from turnfsm.persistence import ToolResultRecorded

    ran: list[str] = []
    release = anyio.Event()

    async def fast() -> str:
        """Done at once."""
        ran.append("fast")
        return "fast result"

    async def slow() -> str:
        """Done when released."""
        ran.append("slow")
        await release.wait()
        return "slow result"

    tools = [fast, function_tool(slow, idempotent=idempotent)]

    model = ScriptedModel.of(
        reply("", tool_call("fast", "c1"), tool_call("slow", "c2"))
    )
    session = Session()
    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as group:

            async def go() -> None:
                await Driver(model=model, tools=tools).run("go", session=session)

            group.start_soon(go)
            with anyio.fail_after(5):
                # Poll the log: the point to stop at is an entry being written.
                while sorted(ran) != ["fast", "slow"] or not any(  # noqa: ASYNC110
                    isinstance(e, ToolResultRecorded) for e in session.entries
                ):
                    await anyio.sleep(0.01)
            scope.cancel()
    # The process "died" while `slow` ran: keep the log up to fast's result.
    entries = session.entries
    cut = next(
        i + 1 for i, e in enumerate(entries) if isinstance(e, ToolResultRecorded)
    )
    store = MemoryStore()
    await store.append(session.id, entries[:cut], expected_version=0)
    reopened = await Session.load(store, session.id)
    ran.clear()
    release.set()
    again = Driver(model=ScriptedModel.of("all done"), tools=tools)
    result = await again.resume(reopened, reopened.runs[0].run_id)
    assert result.ok
    results = [p.content for m in reopened.history for p in m.tool_results]
    # fast's recorded result was not run again; slow, cut short, runs again
    # only if it is safe to run twice, else it is closed as interrupted.
    if idempotent:
        assert ran == ["slow"]
        assert results == ["fast result", "slow result"]
    else:
        assert ran == []
        assert results[0] == "fast result"
        assert results[1].startswith("tool 'slow' was interrupted")
    assert replay(again.machine, reopened, result.run_id).ok


async def test_an_ephemeral_session_is_never_stored_and_never_compacts(
    tmp_path: object,
) -> None:
    from turnfsm import Agent

    store = MemoryStore()
    ctx = ContextManager(
        context_window=4_000, threshold=60, counter=HeuristicTokenCounter()
    )
    agent = Agent(model=ScriptedModel.of("fine", "never"), context=ctx, store=store)
    short = Session.ephemeral()
    assert (await agent.run("a quick job", session=short)).ok
    assert await store.list_sessions() == ()  # nothing reached the agent's store
    result = await agent.run(_big_history(10, 500), session=short)
    # No pass ran; the request fits under the emergency line, so the model answers.
    assert (result.outcome, result.text) == ("done", "never")
    assert [c.verdict for c in short.runs[-1].compactions] == ["noop"]
    assert await store.list_sessions() == ()


class _Summarising:
    """Replaces all but the last message with one marked summary (seed 004)."""

    async def compact(
        self, messages: Sequence[Message], target: int, ctx: CompactionContext
    ) -> CompactionProposal:
        from turnfsm.messages import SUMMARY_COVERS

        head, tail = messages[:-1], messages[-1:]
        summary = Message.system(
            f"summary of {len(head)} messages",
            metadata={SUMMARY_COVERS: head[-1].id},
        )
        return CompactionProposal.compacted([summary, *tail], ctx.tokens_before, 0)


async def test_a_committed_summary_is_recorded_and_survives_a_reload(
    tmp_path: object,
) -> None:
    from turnfsm.persistence.sqlite import SQLiteStore

    ctx = ContextManager(
        _Summarising(),
        context_window=4_000,
        threshold=60,
        counter=HeuristicTokenCounter(),
        pins=PinRules(first_user=False),  # it summarises all but the last
    )
    history = _big_history(10, 500)
    path = f"{tmp_path}/s.db"
    async with SQLiteStore(path) as store:
        session = Session(store=store)
        result = await Driver(model=ScriptedModel.of("ok"), context=ctx).run(
            history, session=session
        )
        assert result.ok
    summary = session.latest_summary
    assert summary is not None
    assert summary.content == f"summary of {len(history) - 1} messages"
    assert summary.covers_up_to_message_id == history[-2].id
    # The working history is the latest summary plus the messages after it.
    assert [m.id for m in session.history][:2] == [summary.message_id, history[-1].id]
    async with SQLiteStore(path) as again:
        reopened = await Session.load(again, session.id)
    assert reopened.latest_summary == summary


def _tool() -> str:
    """A tool."""
    return "ran"


@pytest.mark.parametrize("compacting", [False, True])
async def test_a_run_on_a_long_session_logs_its_first_context_as_a_change(
    tmp_path: Path, compacting: bool
) -> None:
    # A run's first turn names what it adds to the history it opened with,
    # not that whole history again; read back from the file, every turn's
    # context is what the model was sent, and every run replays.
    path = tmp_path / "s.db"
    script = [reply("", tool_call("t", "c1")), "one", reply("", tool_call("t", "c2"))]
    model = ScriptedModel.of(*script, "two", "three")

    tools = [Tool.from_function(_tool, name="t")]

    def driver() -> Driver:
        if compacting:
            return _compacting_driver(model, tools=tools)
        return Driver(model=model, tools=tools)

    async with SQLiteStore(path) as store:
        session = Session(store=store)
        await driver().run(_big_history(10, 300), session=session)
        opening = [m.id for m in session.history]
        await driver().run("more", session=session)
        await driver().run("again", session=session)
        second = session.runs[1]
        if not compacting:
            assert second.turns[0].keep == len(opening)
            assert len(second.turns[0].added) == 1  # the input only
        sent = [[m.id for m in r.messages] for r in model.requests]
    async with SQLiteStore(path) as store:
        reopened = await Session.load(store, session.id)
        seen = [
            list(run.context(i)) for run in reopened.runs for i in range(len(run.turns))
        ]
        assert seen == sent
        for run in reopened.runs:
            report = replay(driver().machine, reopened, run.run_id)
            assert report.ok, report


async def test_a_run_that_stalls_after_an_overflow_keeps_the_providers_words(
    tmp_path: Path,
) -> None:
    said = "HTTP 400: maximum context length is 4096 tokens"
    refused = ProviderError(said, kind=CONTEXT_OVERFLOW, status=400)
    driver = Driver(
        model=ScriptedModel.of(refused, "never"),
        context=None,  # no pass can shrink the request
        context_window=100_000,
    )
    path = f"{tmp_path}/s.db"
    async with SQLiteStore(path) as store:
        session = Session(store=store)
        result = await driver.run("x" * 1_000, session=session)

    assert isinstance(result.error, CompactionStalled)
    assert result.error.provider_message == said
    assert str(result.error).startswith("compaction stalled: ")
    assert f"(the provider said: {said})" in str(result.error)
    async with SQLiteStore(path) as again:
        reopened = await Session.load(again, session.id)
    (run,) = reopened.runs
    assert isinstance(run.error, CompactionStalled)
    assert run.error.provider_message == said
    assert replay(None, reopened, result.run_id).ok


async def test_a_reply_too_big_for_the_window_is_named_by_the_stall(
    tmp_path: Path,
) -> None:
    """A model that ignores its reply budget: the reply alone is over the window."""
    driver = Driver(
        model=ScriptedModel.of("word " * 200_000, "never"),
        context_window=100_000,
    )
    path = f"{tmp_path}/s.db"
    async with SQLiteStore(path) as store:
        session = Session(store=store)
        result = await driver.run("summarise the logs", session=session)

    assert isinstance(result.error, CompactionStalled)
    said = result.error.window_check
    assert said.startswith("the reply makes the conversation ")
    assert said.endswith("over the 100000 window; it is not committed")
    assert f"(the window check said: {said})" in str(result.error)
    assert "smaller reply budget (max_output_tokens)" in str(result.error)
    async with SQLiteStore(path) as again:
        reopened = await Session.load(again, session.id)
    (run,) = reopened.runs
    assert isinstance(run.error, CompactionStalled)
    assert run.error.window_check == said
    assert list(reopened.history) == []  # the failed run commits nothing
    assert replay(None, reopened, result.run_id).ok


async def test_a_reply_that_does_not_fit_beside_a_pinned_question_is_blamed() -> None:
    # The question (pinned) fills half the window, and the answer, which no
    # reply budget kept room for, the rest: the advice was that pinned
    # messages fill the window, and to give it a window over the question's
    # own size, which it had.
    prose = "The committee agreed that the new process should be adopted. "
    driver = Driver(
        model=ScriptedModel.of(prose * 130), context=ContextManager(context_window=4000)
    )
    result = await driver.run(prose * 150)

    assert isinstance(result.error, CompactionStalled)
    size = int(result.error.window_check.split()[5])
    assert size > 4000 > result.error.used
    advice = str(result.error).rpartition("; ")[2]
    assert advice == (
        "the reply did not fit beside the conversation: set a reply budget "
        "(max_output_tokens), so that room for the reply is kept before the "
        "model is called, or give the run a context window of at least "
        f"{window_to_send(size)} tokens"
    )
