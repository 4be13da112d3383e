"""Failures in the trace: a failed compaction pass, a crashed run, a run
whose end never reached the hook (it is ended when the run is resumed), and
a run whose end could not be logged, and a timed-out attempt."""

from __future__ import annotations

from collections.abc import Sequence

import anyio
import pytest

from tests.tracing._spans import (
    STARTED,
    STATUS,
    Named,
    Traced,
    agent,
    chat,
    echo,
    history,
    masks,
    said,
    traced_driver,
    turn,
)
from turnfsm.context import CompactionContext, CompactionProposal, ContextManager
from turnfsm.driver import Driver, RetryPolicy, Session
from turnfsm.errors import CompactionFailed
from turnfsm.messages import Message
from turnfsm.persistence import Entry, MemoryStore, RunEnded
from turnfsm.providers import ModelRequest, ModelResponse
from turnfsm.testing import FakeModelClient, ScriptedModel
from turnfsm.tokens import HeuristicTokenCounter
from turnfsm.tracing import attributes as A

pytestmark = pytest.mark.anyio

USAGE = (A.USAGE_INPUT_TOKENS, A.USAGE_OUTPUT_TOKENS)


class Broken:
    """A compactor whose summary model is down."""

    async def compact(
        self, messages: Sequence[Message], target: int, ctx: CompactionContext
    ) -> CompactionProposal:
        raise RuntimeError("summary model down")


async def test_a_failed_compaction_pass_is_an_error_span() -> None:
    traced = Traced.create()
    context = ContextManager(
        Broken(), context_window=4_000, threshold=60, counter=HeuristicTokenCounter()
    )
    driver = traced_driver(traced, ScriptedModel.of(), context=context)
    result = await driver.run(history(10, 500))
    assert isinstance(result.error, CompactionFailed)
    failed = agent(
        outcome="failed", turns=0, phase="failed", window=4_000, lines=(2_400, 3_800)
    ) | {A.ERROR_TYPE: "CompactionFailed", STATUS: f"ERROR: {result.error}"}
    assert traced.tree(masks(result)) == [
        ("invoke_agent assistant", "INTERNAL", failed, [
            STARTED,
            f"exception CompactionFailed: {result.error}",
            ("turnfsm.turn 1", "INTERNAL", turn(1, "failed", 2_650), [
                "measured: start -> compact #4 [is_over_threshold_line, "
                "not is_compaction_limit_reached, not is_threshold_line_spent] "
                "reason=threshold_exceeded "
                "estimate=2650",
                "compactor_failed: compact -> failed #26 error=compaction_failed "
                "estimate=2650",
                ("turnfsm.compaction", "INTERNAL", {
                    A.COMPACTION_REASON: "threshold_exceeded",
                    A.COMPACTION_STRATEGY: "Broken",
                    A.COMPACTION_OUTCOME: "failed",
                    A.TOKENS_BEFORE: 2_650,
                    A.TOKENS_AFTER: 2_650,
                    A.TOKENS_SAVED: 0,
                    A.TOKENS_SOURCE: "estimated",
                    A.ERROR_TYPE: "compaction_failed",
                    # It said "the pass failed", and recorded no exception.
                    STATUS: "ERROR: the pass failed: RuntimeError: summary model down",
                }, ["exception CompactorError: RuntimeError: summary model down"]),
            ]),
        ]),
    ]  # fmt: skip


class Flaky(MemoryStore):  # type: ignore[misc]
    """A store that fails the first `failures` writes of a run's end."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    async def append(
        self, session_id: str, entries: Sequence[Entry], *, expected_version: int
    ) -> int:
        if self.failures and any(isinstance(e, RunEnded) for e in entries):
            self.failures -= 1
            raise OSError("disk full")
        return await super().append(
            session_id, entries, expected_version=expected_version
        )


async def test_a_run_whose_end_could_not_be_logged_ends_crashed() -> None:
    traced = Traced.create()
    session = Session(store=Flaky(failures=1))
    driver = traced_driver(traced, ScriptedModel.of(said("hi", usage=(6, 1))))
    with pytest.raises(OSError, match="disk full"):
        await driver.run("hello", session=session)
    [(_, _, attributes, _)] = traced.tree()
    assert attributes[A.RUN_OUTCOME] == "failed"
    assert attributes[A.ERROR_TYPE] == "RunCrashed"
    assert attributes[STATUS] == "ERROR: run crashed on OSError: disk full"


async def test_a_run_whose_end_cannot_be_logged_is_ended_then_resumed() -> None:
    """The run's end could not be logged (its store failed twice): its spans
    end at once, failed as crashed; the same process then resumes the run.

    The end is one append with the last step's event, so the reply that
    ended the run was not logged either, nor the measurement riding with
    it: the resumed run measures and asks again."""
    traced = Traced.create()
    session = Session(store=Flaky(failures=2))
    model = ScriptedModel.of(said("hi", usage=(6, 1)), said("hi", usage=(6, 1)))
    driver = traced_driver(traced, model)
    with pytest.raises(OSError, match="disk full"):
        await driver.run("hello", session=session)
    assert traced.unended() == []
    [run] = session.runs
    result = await driver.resume(session, run.run_id)
    assert result.outcome == "done"
    crashed = agent(outcome="failed", usage=(6, 1)) | {
        A.ERROR_TYPE: "RunCrashed",
        STATUS: "ERROR: run crashed on OSError: disk full",
    }
    assert traced.tree(masks(result)) == [
        ("invoke_agent assistant", "INTERNAL", crashed, [
            STARTED,
            "exception RunCrashed: run crashed on OSError: disk full",
            ("turnfsm.turn 1", "INTERNAL", turn(1, "done", 6, usage=(6, 1)), [
                "measured: start -> call_llm #6 estimate=6",
                "model_replied: call_llm -> done #9 estimate=6",
                ("chat gpt-test", "CLIENT", chat(usage=(6, 1)), []),
            ]),
        ]),
        ("invoke_agent assistant", "INTERNAL", agent(usage=(6, 1)) | {
            A.RUN_RESUMED: True,
            A.RUN_RESUMED_FROM: "running",  # its end never reached the log
        }, [
            ("turnfsm.turn 1", "INTERNAL", turn(1, "done", 6, usage=(6, 1)), [
                "measured: start -> call_llm #6 estimate=6",
                "model_replied: call_llm -> done #9 estimate=6",
                ("chat gpt-test", "CLIENT", chat(usage=(6, 1)), []),
            ]),
        ]),
    ]  # fmt: skip
    assert len(model.requests) == 2


async def test_a_run_whose_end_cannot_be_logged_still_ends_its_spans() -> None:
    traced = Traced.create()
    session = Session(store=Flaky(failures=2))
    driver = traced_driver(traced, ScriptedModel.of(said("hi")))
    with pytest.raises(OSError, match="disk full"):
        await driver.run("hello", session=session)
    assert traced.unended() == []


async def test_a_timed_out_attempt_is_an_error_not_a_cancel() -> None:
    traced = Traced.create()
    calls = 0

    async def answer(request: ModelRequest) -> ModelResponse:
        nonlocal calls
        calls += 1
        if calls == 1:
            await anyio.sleep(10)  # past the model timeout
        return said("ok")

    policy = RetryPolicy(max_attempts=2, initial_wait=0, jitter=False)
    driver = traced_driver(
        traced, FakeModelClient(answer), model_timeout=0.05, retry=policy
    )
    with anyio.fail_after(5):
        assert (await driver.run("hello")).ok
    first = next(s for s in traced.spans if (s.attributes or {}).get(A.ATTEMPT) == 1)
    assert A.CANCELLED not in (first.attributes or {})
    assert (first.attributes or {})[A.ERROR_TYPE] == "TimeoutError"


class TooLittle:
    """A compactor that drops one message of a conversation far over the window."""

    async def compact(
        self, messages: Sequence[Message], target: int, ctx: CompactionContext
    ) -> CompactionProposal:
        return CompactionProposal.compacted([messages[0], *messages[3:]], 0, 0)


async def test_a_pass_still_over_the_window_says_how_far_over() -> None:
    traced = Traced.create()
    context = ContextManager(
        TooLittle(), context_window=4_000, threshold=60, counter=HeuristicTokenCounter()
    )
    driver = traced_driver(traced, ScriptedModel.of(), context=context)
    result = await driver.run(history(20, 500))
    assert result.outcome == "failed"
    [(_, _, _, [_, _, (_, _, _, [*_, (name, _, attributes, events)])])] = traced.tree(
        masks(result)
    )
    assert (name, events) == ("turnfsm.compaction", [])
    assert attributes[A.COMPACTION_OUTCOME] == "overflow"
    assert attributes[A.ERROR_TYPE] == "compaction_overflow"
    # It said "the pass overflow".
    assert attributes[STATUS] == (
        f"ERROR: the pass left {attributes[A.TOKENS_AFTER]} tokens, "
        "still over the window"
    )


async def test_a_reply_cut_off_by_its_budget_says_so_on_its_chat_span() -> None:
    traced = Traced.create()
    cut = ModelResponse(
        message=Message.assistant("The answer is"), finish_reason="length"
    )
    result = await traced_driver(traced, ScriptedModel.of(cut)).run("go")
    assert result.ok, result.error
    [span] = [s for s in traced.spans if s.name.startswith("chat ")]
    assert span.attributes is not None
    assert span.attributes[A.RESPONSE_FINISH_REASONS] == ("length",)


async def test_an_effect_that_raised_is_an_error_span_with_its_traceback() -> None:
    # Its span ended as if the effect had gone well: only the run's span
    # said a phase of yours failed, and the traceback was in the log alone.
    from opentelemetry.trace import StatusCode

    from tests.helpers import approval_toml
    from turnfsm.core import MachineSpec, Perform, Signal
    from turnfsm.driver import EffectContext
    from turnfsm.errors import EffectFailed
    from turnfsm.testing import tool_call

    traced = Traced.create()

    async def await_approval(ctx: EffectContext, decision: Perform) -> Signal:
        raise RuntimeError("approval service down")

    model = ScriptedModel.of(said("", tool_call("echo", "c1", text="x")), said("ok"))
    driver = traced_driver(
        traced,
        model,
        machine=MachineSpec.from_toml(approval_toml()),
        effects={"await_approval": await_approval},
    )
    result = await driver.run("go")
    assert isinstance(result.error, EffectFailed)
    assert traced.unended() == []
    (effect,) = [s for s in traced.spans if s.name == "turnfsm.effect"]
    attributes = effect.attributes or {}
    assert attributes[A.ERROR_TYPE] == "RuntimeError"
    assert A.CANCELLED not in attributes
    assert effect.status.status_code is StatusCode.ERROR
    assert effect.status.description == "RuntimeError: approval service down"
    (raised,) = [e for e in effect.events if e.name == "exception"]
    raised_attributes = raised.attributes or {}
    assert raised_attributes["exception.type"] == "RuntimeError"
    stack = str(raised_attributes["exception.stacktrace"])
    assert "in await_approval" in stack, stack


@pytest.mark.parametrize("how", ["cancel", "timeout"])
async def test_an_effect_cut_short_is_marked_cancelled_not_ended_as_done(
    how: str,
) -> None:
    from tests.helpers import approval_toml
    from turnfsm.core import MachineSpec, Perform, Signal
    from turnfsm.driver import EffectContext, RunControl
    from turnfsm.testing import tool_call

    traced = Traced.create()
    control = RunControl()

    async def await_approval(ctx: EffectContext, decision: Perform) -> Signal:
        if how == "cancel":
            control.cancel("the user pressed stop")
        await anyio.sleep(30)
        raise AssertionError("not cut short")

    model = ScriptedModel.of(said("", tool_call("echo", "c1", text="x")))
    driver = traced_driver(
        traced,
        model,
        machine=MachineSpec.from_toml(approval_toml()),
        effects={"await_approval": await_approval},
        effect_timeout=0.05 if how == "timeout" else 300,
    )
    result = await driver.run("go", control=control)
    assert result.outcome == "cancelled"
    assert traced.unended() == []
    (effect,) = [s for s in traced.spans if s.name == "turnfsm.effect"]
    assert (effect.attributes or {}).get(A.CANCELLED) is True


@pytest.mark.parametrize("where", ["on_model_call_start", "on_tool_start"])
async def test_a_strict_hook_raising_as_a_call_starts_leaves_no_span_current(
    where: str,
) -> None:
    # The call's span was made current and never let go: the run crashed,
    # and every span the caller made afterwards nested under a call of a
    # trace that had ended.
    from opentelemetry import trace

    from turnfsm.hooks import Hook
    from turnfsm.testing import tool_call

    def broken(self: Hook, info: object) -> None:
        raise RuntimeError("a broken hook")

    Broken = type("Broken", (Hook,), {where: broken})
    traced = Traced.create()
    model = ScriptedModel.of(said("", tool_call("echo", "c1", text="x")), said("ok"))
    driver = Driver(
        model=Named(model),
        tools=[echo],
        hooks=[traced.hook, Broken()],
        strict_hooks=True,
    )
    with pytest.raises(RuntimeError, match="a broken hook"):
        await driver.run("go")
    assert trace.get_current_span() is trace.INVALID_SPAN, trace.get_current_span()
    assert traced.unended() == []
    *_, call = [s for s in traced.spans if s.name.startswith(("chat", "execute_"))]
    assert (call.attributes or {})[A.ERROR_TYPE] == "RuntimeError"
