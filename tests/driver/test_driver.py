from __future__ import annotations

import logging
import tomllib
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.helpers import turn_toml_text
from turnfsm import Agent, replay
from turnfsm.context import (
    CompactionContext,
    CompactionProposal,
    ContextManager,
    PinRules,
    TruncatingCompactor,
)
from turnfsm.core import CompactReason, MachineSpec, ModelReplied
from turnfsm.driver import Driver, RetryPolicy, RunControl, Session
from turnfsm.driver._refusal import refused_size
from turnfsm.errors import (
    CONTEXT_CHECK,
    CONTEXT_OVERFLOW,
    CompactionStalled,
    ConfigError,
    ContextExceeded,
    DefinitionError,
    InvalidMessage,
    InvalidReturn,
    MaxTurnsExceeded,
    ProviderError,
    RunFailed,
)
from turnfsm.hooks import (
    ConsoleHook,
    Hook,
    ModelCallEnd,
    ModelCallInfo,
    PreCompact,
    PreCompactInfo,
    RunEndInfo,
    ToolCallEnd,
)
from turnfsm.messages import Message, Role
from turnfsm.persistence import CompactionRecord, Verdict
from turnfsm.providers import ModelResponse
from turnfsm.testing import FakeModelClient, ScriptedModel, reply, tool_call
from turnfsm.tokens import HeuristicTokenCounter
from turnfsm.values import ErrorInfo, Usage

pytestmark = pytest.mark.anyio

NO_WAIT = RetryPolicy(max_attempts=3, initial_wait=0, jitter=False)
HEURISTIC = HeuristicTokenCounter()


def manager(window: int, threshold: int = 80, **kw: object) -> ContextManager:
    return ContextManager(
        TruncatingCompactor(**kw),  # type: ignore[arg-type]
        context_window=window,
        threshold=threshold,
        counter=HEURISTIC,
    )


def echo(text: str) -> str:
    """Echo the text back.

    Args:
        text: what to echo.
    """
    return text


def _shout(text: str) -> str:
    """Echo the text back, loud.

    Args:
        text: what to shout.
    """
    return text.upper()


async def test_tool_loop_commits_the_run_to_history() -> None:
    model = ScriptedModel.of(reply("", tool_call("echo", "c1", text="hi")), "done: hi")
    session = Session()
    result = await Driver(model=model, tools=[echo]).run("say hi", session=session)
    assert (result.outcome, result.text, result.turns) == ("done", "done: hi", 2)
    assert [m.role for m in session.history] == [
        Role.USER,
        Role.ASSISTANT,
        Role.TOOL,
        Role.ASSISTANT,
    ]
    assert session.history[2].tool_results[0].content == "hi"
    run = session.runs[0]
    assert [t.turn for t in run.turns] == [1, 2]
    assert len(run.context(1)) == 3  # user, call, result: what turn 2 saw
    assert run.phase == "done"


async def test_request_carries_system_prompt_and_tool_schemas() -> None:
    model = ScriptedModel.of("ok")
    await Driver(model=model, tools=[echo], system_prompt="be brief").run("x")
    request = model.requests[0]
    assert request.system == "be brief"
    assert [t.name for t in request.tools] == ["echo"]
    assert request.tools[0].parameters["properties"]["text"] == {
        "type": "string",
        "description": "what to echo.",
    }


async def test_unknown_tool_gets_a_pre_resolved_error_result() -> None:
    model = ScriptedModel.of(reply("", tool_call("nope", "c1")), "sorry")
    session = Session()
    await Driver(model=model).run("x", session=session)
    result = session.history[2].tool_results[0]
    assert (result.content, result.is_error) == (
        "tool 'nope' is not available: there are no tools",
        True,
    )


async def test_an_unknown_tool_is_told_the_tools_there_are() -> None:
    # The model was told only "tool 'serch' is not available": nothing to
    # correct its call by.
    model = ScriptedModel.of(reply("", tool_call("serch", "c1", text="a")), "ok")
    session = Session()
    await Driver(model=model, tools=[echo, _shout]).run("x", session=session)
    result = session.history[2].tool_results[0]
    assert result.content == (
        "tool 'serch' is not available: the tools are _shout, echo"
    )


async def test_tool_exception_and_timeout_become_error_results() -> None:
    def boom() -> str:
        """Fail."""
        raise ValueError("disk on fire")

    async def slow() -> str:
        """Hang."""
        await anyio.sleep(10)
        return "late"

    model = ScriptedModel.of(
        reply("", tool_call("boom", "c1"), tool_call("slow", "c2")), "ok"
    )
    session = Session()
    with anyio.fail_after(5):
        result = await Driver(model=model, tools=[boom, slow], tool_timeout=0.05).run(
            "x", session=session
        )
    assert result.ok
    contents = [m.tool_results[0] for m in session.history if m.role is Role.TOOL]
    assert contents[0].content == "tool 'boom' failed: ValueError: disk on fire"
    assert contents[1].content == "tool 'slow' timed out after 0.05s"
    assert all(c.is_error for c in contents)


async def test_parallel_tool_calls_run_concurrently() -> None:
    ready = anyio.Event()

    async def wait() -> str:
        """Wait for the other tool."""
        await ready.wait()
        return "waited"

    async def release() -> str:
        """Release the other tool."""
        ready.set()
        return "released"

    model = ScriptedModel.of(
        reply("", tool_call("wait", "c1"), tool_call("release", "c2")), "ok"
    )
    with anyio.fail_after(5):
        result = await Driver(model=model, tools=[wait, release]).run("x")
    assert result.ok


def _big_history(n: int, size: int) -> list[Message]:
    out: list[Message] = []
    for i in range(n):
        out.append(Message.user(f"question {i} " + "q" * size))
        out.append(Message.assistant(f"answer {i} " + "a" * size))
    return out


async def test_a_big_tool_result_is_compacted_before_the_next_request() -> None:
    def dump() -> str:
        """Dump a big file."""
        return "x" * 6_000

    model = ScriptedModel.of(reply("", tool_call("dump", "c1")), "summary")
    session = Session()
    driver = Driver(model=model, tools=[dump], context=manager(4_000, 60))
    result = await driver.run(_big_history(4, 500), session=session)
    assert result.ok
    run = session.runs[0]
    events = [type(e).__name__ for e in run.events]
    assert events[:8] == [
        "RunStarted",
        "Measured",
        "ModelReplied",
        "ToolsFinished",
        "Measured",
        "CompactionResult",
        "Measured",
        "ModelReplied",
    ]
    assert run.events[4].estimate > 4_000 * 60 // 100  # type: ignore[union-attr]
    assert [c.reason for c in run.compactions] == [CompactReason.THRESHOLD_EXCEEDED]
    second = model.requests[1]
    assert HEURISTIC.count(list(second.messages)) <= 4_000 * 60 // 100
    assert second.messages[-1].tool_results[0].content == "x" * 6_000


class Veto(Hook):
    def pre_compact(self, info: PreCompactInfo) -> PreCompact:
        self.seen = info.tokens_before
        return PreCompact(veto=True)


async def test_a_vetoing_hook_over_the_line_stalls_with_the_measured_numbers() -> None:
    hook = Veto()
    session = Session()
    driver = Driver(
        model=ScriptedModel.of("never"), context=manager(1_000), hooks=[hook]
    )
    result = await driver.run(_big_history(2, 1_000), session=session)
    assert isinstance(result.error, CompactionStalled)
    assert (result.error.used, result.error.limit) == (hook.seen, hook.seen)
    assert hook.seen > 1_000 * 80 // 100
    assert session.history == Session().history  # the failed run left no trace
    with pytest.raises(RunFailed) as caught:
        result.raise_for_failure()
    assert caught.value.error is result.error


async def test_a_vetoed_threshold_pass_under_the_emergency_line_calls_the_model() -> (
    None
):
    # Over the threshold line alone the request still fits: a veto there
    # is a pass that changed nothing, and the run goes on to the model.
    hook = Veto()
    session = Session()
    model = ScriptedModel.of("answer")
    driver = Driver(model=model, context=manager(1_000), hooks=[hook])
    result = await driver.run([Message.user("x" * 3_380)], session=session)
    assert 1_000 * 80 // 100 < hook.seen < 1_000 * 95 // 100
    assert result.ok
    assert result.text == "answer"
    assert [c.verdict for c in session.runs[0].compactions] == [Verdict.VETOED]
    assert len(model.requests) == 1


class Recording:
    """A compactor that records its context and keeps the last two messages."""

    def __init__(self) -> None:
        self.contexts: list[CompactionContext] = []

    async def compact(
        self, messages: Sequence[Message], target: int, ctx: CompactionContext
    ) -> CompactionProposal:
        self.contexts.append(ctx)
        kept = list(messages[-1:])
        return CompactionProposal.compacted(kept, ctx.tokens_before, 0)


class Steer(Hook):
    def __init__(self) -> None:
        self.compactions: list[CompactionRecord] = []
        self.posts: list[CompactionRecord] = []

    def pre_compact(self, info: PreCompactInfo) -> PreCompact:
        return PreCompact(instructions="keep the numbers", additional_context="ctx!")

    def on_compaction_pass(self, record: CompactionRecord) -> None:
        self.posts.append(record)
        if record.compacted:
            self.compactions.append(record)


async def test_pre_compact_guidance_reaches_the_compactor() -> None:
    compactor = Recording()
    hook = Steer()
    ctx = ContextManager(
        compactor,
        context_window=1_000,
        counter=HEURISTIC,
        # It keeps the last message only: no user message is pinned.
        pins=PinRules(first_user=False, latest_user=False),
    )
    driver = Driver(model=ScriptedModel.of("ok"), context=ctx, hooks=[hook])
    result = await driver.run(_big_history(2, 1_000))
    assert result.ok
    assert compactor.contexts[0].instructions == ("keep the numbers",)
    assert compactor.contexts[0].additional_context == ("ctx!",)
    assert len(hook.compactions) == len(hook.posts) == 1
    assert hook.compactions[0].tokens_after < hook.compactions[0].tokens_before


@pytest.mark.parametrize(
    ("field", "value"),
    [("veto", "no"), ("instructions", 5), ("additional_context", ["a", "b"])],
)
async def test_a_pre_compact_answer_with_a_wrong_value_is_a_hook_error(
    field: str, value: object
) -> None:
    with pytest.raises(ConfigError) as caught:
        PreCompact(**{field: value})  # type: ignore[arg-type]  # bad on purpose
    assert (caught.value.field, caught.value.value) == (field, value)

    class Careless(Hook):
        def pre_compact(self, info: PreCompactInfo) -> PreCompact:
            return PreCompact(**{field: value})  # type: ignore[arg-type]  # bad on purpose

    ctx = ContextManager(
        Recording(),
        context_window=1_000,
        counter=HEURISTIC,
        pins=PinRules(first_user=False, latest_user=False),
    )
    driver = Driver(model=ScriptedModel.of("ok"), context=ctx, hooks=[Careless()])
    result = await driver.run(_big_history(2, 1_000))  # the hook is detached
    assert result.ok
    strict = Driver(
        model=ScriptedModel.of("ok"), context=ctx, hooks=[Careless()], strict_hooks=True
    )
    with pytest.raises(ConfigError):
        await strict.run(_big_history(2, 1_000))


async def test_on_compaction_is_silent_for_a_noop_but_post_compact_fires() -> None:
    hook = Steer()
    driver = Driver(
        model=ScriptedModel.of("never"),
        context=manager(1_000),  # the truncator cannot cut two messages
        hooks=[hook],
    )
    result = await driver.run([Message.user("u" * 3_400), Message.assistant("a")])
    # Over the threshold line, under the emergency line: the request fits.
    assert (result.outcome, result.text) == ("done", "never")
    assert hook.compactions == []
    assert [p.compacted for p in hook.posts] == [False]


async def test_without_a_context_manager_a_pass_is_a_noop_and_the_run_stalls() -> None:
    driver = Driver(model=ScriptedModel.of("never"), context=None, context_window=100)
    result = await driver.run("x" * 1_000)
    assert isinstance(result.error, CompactionStalled)


async def test_the_drivers_window_is_the_default_managers() -> None:
    model = ScriptedModel.of("short answer")
    driver = Driver(model=model, context_window=2_000)
    result = await driver.run(_big_history(30, 200))

    assert driver.context is not None
    assert driver.context.context_window == 2_000
    assert result.ok
    # The pass ran on the driver's window: what was sent fits in it.
    sent = model.requests[0].messages
    assert driver.context.count(sent) <= driver.context.emergency_line


def test_a_manager_with_another_window_is_refused() -> None:
    with pytest.raises(ConfigError) as caught:
        Driver(
            model=ScriptedModel.of("x"),
            context_window=2_000,
            context=ContextManager(context_window=4_000),
        )
    assert (caught.value.field, caught.value.value) == ("context_window", 2_000)
    same = ContextManager(context_window=4_000)
    driver = Driver(model=ScriptedModel.of("x"), context_window=4_000, context=same)
    assert driver.context is same


async def test_provider_overflow_compacts_and_retries() -> None:
    overflow = ProviderError("prompt is too long", kind=CONTEXT_OVERFLOW)
    model = ScriptedModel.of(overflow, "ok after compaction")
    session = Session()
    driver = Driver(model=model, context=manager(100_000), retry=NO_WAIT)
    result = await driver.run(_big_history(6, 200), session=session)
    assert (result.outcome, result.text) == ("done", "ok after compaction")
    assert len(model.requests) == 2
    assert len(model.requests[1].messages) < len(model.requests[0].messages)
    events = [type(e).__name__ for e in session.runs[0].events]
    assert events[:5] == [
        "RunStarted",
        "Measured",
        "ContextOverflowed",
        "CompactionResult",
        "ModelReplied",
    ]


class DropOldest:
    """A compactor that always makes progress: it drops the first message."""

    async def compact(
        self, messages: Sequence[Message], target: int, ctx: CompactionContext
    ) -> CompactionProposal:
        kept = list(messages[1:])
        return CompactionProposal.compacted(kept, ctx.tokens_before, 0)


async def test_repeated_overflow_fails_after_the_bounded_retries() -> None:
    overflow = ProviderError("too long", kind=CONTEXT_OVERFLOW)
    model = ScriptedModel.of(overflow, overflow, overflow, "never")
    ctx = ContextManager(
        DropOldest(),
        context_window=100_000,
        counter=HEURISTIC,
        pins=PinRules(first_user=False),  # it drops the first message
    )
    session = Session()
    driver = Driver(model=model, context=ctx, max_overflow_retries=2, retry=NO_WAIT)
    result = await driver.run(_big_history(10, 10), session=session)
    assert isinstance(result.error, ContextExceeded)
    assert type(result.error) is ContextExceeded
    assert len(model.requests) == 3  # the first call and two retries
    assert [len(r.messages) for r in model.requests] == [20, 19, 18]
    assert len(session.history) == 18  # compaction is a commit point


async def test_transient_errors_are_retried_and_permanent_ones_fail() -> None:
    rate = ProviderError("slow down", retryable=True, kind="rate_limit", retry_after=0)
    model = ScriptedModel.of(rate, rate, "fine")
    result = await Driver(model=model, retry=NO_WAIT).run("x")
    assert (result.text, len(model.requests)) == ("fine", 3)
    auth = ProviderError("bad key", kind="auth", status=401)
    model = ScriptedModel.of(auth)
    result = await Driver(model=model, retry=NO_WAIT).run("x")
    assert isinstance(result.error, ProviderError)
    assert (result.error.kind, len(model.requests)) == ("auth", 1)
    assert result.error.status == 401


async def test_retries_give_up_after_max_attempts() -> None:
    rate = ProviderError("slow down", retryable=True, kind="rate_limit")
    model = ScriptedModel.of(rate, rate, rate, "never")
    result = await Driver(model=model, retry=NO_WAIT).run("x")
    assert isinstance(result.error, ProviderError)
    assert result.error.retryable
    assert len(model.requests) == 3


async def test_max_turns_ends_the_run() -> None:
    model = FakeModelClient(lambda r: reply("", tool_call("echo", text="again")))
    result = await Driver(model=model, tools=[echo], max_turns=3).run("loop")
    assert isinstance(result.error, MaxTurnsExceeded)
    assert len(model.requests) == 3


async def test_a_compaction_survives_a_later_failure() -> None:
    rate = ProviderError("boom", kind="server")
    session = Session()
    driver = Driver(model=ScriptedModel.of(rate), context=manager(1_000), retry=NO_WAIT)
    result = await driver.run(_big_history(4, 400), session=session)
    assert isinstance(result.error, ProviderError)
    assert 0 < len(session.history) < 8  # the compacted input was committed


async def test_a_raising_hook_is_logged_and_detached(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Bad(Hook):
        calls = 0

        def on_decision(self, info: object) -> None:
            Bad.calls += 1
            raise RuntimeError("hook bug")

    with caplog.at_level(logging.ERROR, logger="turnfsm.hooks"):
        result = await Driver(model=ScriptedModel.of("ok"), hooks=[Bad()]).run("x")
    assert result.ok
    assert Bad.calls == 1
    assert "hook bug" in caplog.text
    with pytest.raises(RuntimeError, match="hook bug"):
        await Driver(
            model=ScriptedModel.of("ok"), hooks=[Bad()], strict_hooks=True
        ).run("x")


class Answers(Hook):
    """A hook whose `pre_compact` answers `answer` (a bad one: not a PreCompact)."""

    def __init__(self, answer: object) -> None:
        self.answer = answer
        self.calls = 0

    def pre_compact(self, info: PreCompactInfo) -> PreCompact:
        self.calls += 1
        return self.answer  # type: ignore[return-value]


def compacting(hook: Hook, *, strict: bool) -> Driver:
    ctx = ContextManager(
        Recording(),
        context_window=1_000,
        counter=HEURISTIC,
        pins=PinRules(first_user=False, latest_user=False),
    )
    return Driver(
        model=ScriptedModel.of("ok"), context=ctx, hooks=[hook], strict_hooks=strict
    )


@pytest.mark.parametrize("answer", [5, {"veto": True}, "veto"])
async def test_a_pre_compact_answer_that_is_no_pre_compact_is_a_hook_error(
    answer: object, caplog: pytest.LogCaptureFixture
) -> None:
    hook = Answers(answer)
    with caplog.at_level(logging.ERROR, logger="turnfsm.hooks"):
        result = await compacting(hook, strict=False).run(_big_history(2, 1_000))
    # Logged and detached, like a hook that raised: the pass went on unvetoed.
    assert result.ok
    assert "expected a PreCompact or None" in caplog.text
    assert "hook Answers.pre_compact" in caplog.text

    result = await compacting(Answers(answer), strict=True).run(_big_history(2, 1_000))

    assert isinstance(result.error, InvalidReturn)
    assert result.error.source == "hook Answers.pre_compact"
    assert result.error.value == repr(answer)


async def test_an_awaitable_a_hook_returns_is_a_hook_error() -> None:
    made: list[Coroutine[object, object, None]] = []

    async def later() -> None:
        """Work a hook meant to do, but never awaited."""

    class Later(Hook):
        def on_decision(self, info: object) -> None:
            made.append(later())
            return made[-1]  # type: ignore[return-value]

    result = await Driver(
        model=ScriptedModel.of("ok"), hooks=[Later()], strict_hooks=True
    ).run("x")

    assert isinstance(result.error, InvalidReturn)
    assert result.error.source == "hook Later.on_decision"
    assert "an awaitable never runs" in result.error.expected
    assert made[0].cr_frame is None  # closed: no "never awaited" warning


async def test_an_async_hook_method_is_refused_where_the_hook_is_given() -> None:
    class Async(Hook):
        async def pre_compact(self, info: PreCompactInfo) -> PreCompact:  # type: ignore[override]
            return PreCompact(veto=True)

    with pytest.raises(ConfigError) as caught:
        Driver(model=ScriptedModel.of("ok"), hooks=[Async()])
    assert caught.value.field == "hooks[0].pre_compact"
    assert "not async def" in str(caught.value)
    with pytest.raises(ConfigError, match=r"hooks\[1\]\.pre_compact"):
        await Driver(model=ScriptedModel.of("ok")).run("x", hooks=[Steer(), Async()])


class Unreachable(Hook):
    """A strict hook whose metrics server is down."""

    def __init__(self, point: str, error: Exception) -> None:
        self.point = point
        self.error = error

    def on_model_call_start(self, info: ModelCallInfo) -> None:
        if self.point == "on_model_call_start":
            raise self.error

    def on_model_call_end(self, info: ModelCallEnd) -> None:
        if self.point == "on_model_call_end":
            raise self.error


@pytest.mark.parametrize("point", ["on_model_call_start", "on_model_call_end"])
@pytest.mark.parametrize(
    "error",
    [ConnectionError("metrics server down"), TimeoutError("metrics server slow")],
    ids=["ConnectionError", "TimeoutError"],
)
async def test_a_strict_model_call_hook_s_error_is_never_taken_for_the_model_s(
    point: str, error: Exception
) -> None:
    # It was: the model was called again and again (each call billed), and
    # the run ended failed with a model provider error naming the hook's
    # words, the hook's own error never raised.
    model = ScriptedModel.of("one", "two", "three", "four")
    session = Session()
    driver = Driver(
        model=model,
        hooks=[Unreachable(point, error)],
        strict_hooks=True,
        retry=NO_WAIT,
    )
    with pytest.raises(type(error)) as caught:
        await driver.run("x", session=session)
    assert caught.value is error
    assert len(model.requests) == (0 if point == "on_model_call_start" else 1)
    (run,) = session.runs
    assert run.outcome == "failed"
    assert str(run.error).startswith(f"run crashed on {type(error).__name__}")


class AsyncGenerator(Hook):
    async def on_tool_end(self, info: ToolCallEnd):  # type: ignore[no-untyped-def]
        yield info  # an async generator: calling it runs none of this


class Generator(Hook):
    def on_run_end(self, info: RunEndInfo):  # type: ignore[no-untyped-def]
        yield info  # a generator: calling it runs none of this


class NotCallable(Hook):
    on_run_end = None  # type: ignore[assignment]


@pytest.mark.parametrize(
    ("hook", "name", "words"),
    [
        (AsyncGenerator(), "on_tool_end", "not async def"),
        (Generator(), "on_run_end", "not a generator"),
        (NotCallable(), "on_run_end", "not callable"),
    ],
    ids=["async generator", "generator", "None"],
)
async def test_a_hook_method_whose_body_would_never_run_is_refused_where_given(
    hook: Hook, name: str, words: str
) -> None:
    # Each was taken: the generators' bodies never ran (the driver called
    # them, and dropped what they returned), and None failed in the run.
    with pytest.raises(ConfigError) as caught:
        Driver(model=ScriptedModel.of("ok"), hooks=[hook])
    assert caught.value.field == f"hooks[0].{name}"
    assert caught.value.value is hook
    assert words in str(caught.value)
    session = Session()
    with pytest.raises(ConfigError, match=rf"hooks\[1\]\.{name}"):
        await Driver(model=ScriptedModel.of("ok")).run(
            "x", session=session, hooks=[Steer(), hook]
        )
    assert session.runs == []


class Misspelt(Hook):
    def on_tool_started(self, info: object) -> None:
        """Never called: no hook method has this name."""


async def test_a_misspelt_hook_method_is_refused_where_the_hook_is_given() -> None:
    with pytest.raises(ConfigError) as caught:
        Driver(model=ScriptedModel.of("ok"), hooks=[Misspelt()])
    assert caught.value.field == "hooks[0].on_tool_started"
    assert isinstance(caught.value.value, Misspelt)
    assert "Misspelt.on_tool_started is not one" in str(caught.value)
    assert "did you mean 'on_tool_start'?" in str(caught.value)
    with pytest.raises(ConfigError, match=r"hooks\[0\]\.on_tool_started"):
        Agent(model=ScriptedModel.of("ok"), hooks=[Misspelt()])
    session = Session()
    with pytest.raises(ConfigError, match=r"hooks\[1\]\.on_tool_started"):
        await Driver(model=ScriptedModel.of("ok")).run(
            "x", session=session, hooks=[Steer(), Misspelt()]
        )
    assert session.runs == []


def test_a_hook_class_given_for_a_hook_is_refused_naming_the_call_it_needs() -> None:
    # The class was taken, and none of its methods was ever called.
    with pytest.raises(ConfigError) as caught:
        Driver(model=ScriptedModel.of("ok"), hooks=[Steer(), ConsoleHook])  # type: ignore[list-item]
    assert caught.value.field == "hooks[1]"
    assert caught.value.value is ConsoleHook
    assert "an instance, ConsoleHook(), not the class" in str(caught.value)


async def test_the_hooks_a_resumed_run_is_given_are_checked_as_a_run_s_are() -> None:
    from turnfsm import approval_machine
    from turnfsm.core import ToolCallsReviewed

    def echo(text: str) -> str:
        """Echo.

        Args:
            text: what to say back.
        """
        return text

    driver = Driver(
        model=ScriptedModel.of(reply("", tool_call("echo", text="hi")), "done"),
        tools=[echo],
        machine=approval_machine(),
    )
    session = Session()
    paused = await driver.run("go", session=session)
    answer = ToolCallsReviewed.approve_all()
    with pytest.raises(ConfigError, match=r"hooks\[1\]\.on_tool_started"):
        await driver.resume(session, paused.run_id, answer, hooks=[Steer(), Misspelt()])
    with pytest.raises(ConfigError, match=r"hooks\[0\]"):
        await driver.resume(session, paused.run_id, answer, hooks=[ConsoleHook])  # type: ignore[list-item]
    with pytest.raises(ConfigError, match="hooks"):
        await driver.resume(session, paused.run_id, answer, hooks="ConsoleHook")  # type: ignore[arg-type]
    # Refused before anything was written: the run still waits, and takes it.
    assert session.run(paused.run_id).outcome == "paused"
    assert (await driver.resume(session, paused.run_id, answer)).ok


async def test_a_hook_given_twice_is_refused_it_would_hear_everything_twice() -> None:
    seen = Steer()
    with pytest.raises(ConfigError) as caught:
        Driver(model=ScriptedModel.of("ok"), hooks=[seen, Steer(), seen])
    assert caught.value.field == "hooks[2]"
    assert caught.value.value is seen
    assert "hooks[0]" in str(caught.value)
    driver = Driver(model=ScriptedModel.of("ok"), hooks=[seen])
    session = Session()
    with pytest.raises(ConfigError, match=r"hooks\[0\]") as again:
        await driver.run("x", session=session, hooks=[seen])
    assert "driver" in str(again.value)
    assert session.runs == []


class NoInfo(Hook):
    def on_run_end(self) -> None:  # type: ignore[override]
        """Takes no record: calling it would raise TypeError, and detach it."""


async def test_a_hook_method_that_takes_no_record_is_refused_where_given() -> None:
    with pytest.raises(ConfigError) as caught:
        Driver(model=ScriptedModel.of("ok"), hooks=[NoInfo()])
    assert caught.value.field == "hooks[0].on_run_end"
    assert "takes one record" in str(caught.value)
    assert "NoInfo.on_run_end()" in str(caught.value)


def test_an_unknown_hook_method_with_no_close_name_lists_the_hook_methods() -> None:
    class Duck:
        def on_run_end(self, info: object) -> None:
            pass

    duck = Duck()
    duck.on_everything = print  # type: ignore[attr-defined]

    with pytest.raises(ConfigError) as caught:
        Driver(model=ScriptedModel.of("ok"), hooks=[duck])  # type: ignore[list-item]

    assert caught.value.field == "hooks[0].on_everything"
    assert "the hook methods are on_run_start, on_transition" in str(caught.value)


async def test_private_helpers_and_other_names_of_a_hook_are_its_own() -> None:
    seen: list[str] = []

    class Helpers(Hook):
        label = "on_"  # not callable
        on_count = 0  # not callable

        def on_run_end(self, info: object) -> None:
            self._on_end(info)

        def _on_end(self, info: object) -> None:
            seen.append(self.label)

        def online(self) -> bool:
            return True

    result = await Driver(model=ScriptedModel.of("ok"), hooks=[Helpers()]).run("x")

    assert (result.outcome, seen) == ("done", ["on_"])


async def test_usage_is_summed_per_run() -> None:
    from turnfsm.core import Usage

    model = ScriptedModel(
        [reply("", tool_call("echo", text="a")), "b"],
        usage=Usage(input_tokens=10, output_tokens=2),
    )
    result = await Driver(model=model, tools=[echo]).run("x")
    assert result.usage == Usage(input_tokens=20, output_tokens=4)


def test_bad_configuration_fails_at_the_boundary() -> None:
    with pytest.raises(ConfigError, match="model"):
        Driver(model=object())  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="tool_timeout"):
        Driver(model=ScriptedModel.of(), tool_timeout=-1)
    with pytest.raises(ConfigError, match="max_turns"):
        Driver(model=ScriptedModel.of(), max_turns=0)


async def test_bad_input_fails_before_anything_changes() -> None:
    session = Session()
    with pytest.raises(InvalidMessage) as caught:
        await Driver(model=ScriptedModel.of("x")).run(
            [Message.tool_result("ghost", "?")], session=session
        )
    assert caught.value.field == "tool_result.call_id"
    assert session.runs == []


def test_agent_run_sync_on_trio_continues_the_conversation() -> None:
    agent = Agent(model=ScriptedModel.of("one", "two"))
    assert agent.run_sync("a", backend="trio").text == "one"
    assert agent.run_sync("b").text == "two"
    assert len(agent.session.history) == 4
    assert len(agent.session.runs) == 2


def test_agent_run_sync_takes_run_s_output_type_and_control() -> None:
    agent = Agent(model=ScriptedModel.of('{"city": "Oslo", "people": 709000}'))

    result = agent.run_sync("where?", output_type=dict, control=RunControl())

    assert result.output == {"city": "Oslo", "people": 709000}
    control = RunControl()
    control.cancel("not now")
    cancelled = Agent(model=ScriptedModel.of("never")).run_sync("x", control=control)
    assert cancelled.outcome == "cancelled"


def test_agent_run_sync_given_a_session_id_shows_it_opened_without_await(
    tmp_path: Path,
) -> None:
    # It showed `session=await Session.open(...)`, which sync code cannot write.
    agent = Agent(model=ScriptedModel.of("one"), store=str(tmp_path / "s.db"))
    with pytest.raises(ConfigError) as caught:
        agent.run_sync("hi", session="my-thread")  # type: ignore[arg-type]
    assert caught.value.field == "session"
    hint = "session=anyio.run(Session.open, agent.store, 'my-thread')"
    assert hint in str(caught.value)
    assert "await" not in str(caught.value)
    opened = anyio.run(Session.open, agent.store, "my-thread")  # as it says
    assert agent.run_sync("hi", session=opened).text == "one"


async def test_agent_run_sync_in_a_running_event_loop_is_refused_first(
    anyio_backend: str,
) -> None:
    session = Session()
    agent = Agent(model=ScriptedModel.of("never"), session=session)

    with pytest.raises(ConfigError) as caught:
        agent.run_sync("hi")

    assert caught.value.field == "run_sync"
    assert caught.value.value == anyio_backend
    assert f"running event loop (here: {anyio_backend})" in str(caught.value)
    assert "await agent.run(...) instead" in str(caught.value)
    assert (session.runs, list(session.history)) == ([], [])


async def test_events_replay_to_the_same_history() -> None:
    from turnfsm._resources import default_machine
    from turnfsm.core import TurnMachine

    model = ScriptedModel.of(reply("", tool_call("echo", "c1", text="hi")), "bye")
    session = Session()
    driver = Driver(model=model, tools=[echo])
    await driver.run("go", session=session)
    machine = TurnMachine.start(default_machine(), budget=driver.budget)
    for event in session.runs[0].events:
        machine.handle(event)
    assert list(machine.snapshot.history) == list(session.history)
    assert isinstance(session.runs[0].events[-1], ModelReplied)


async def test_run_control_injects_a_message_at_the_next_safe_point() -> None:
    from turnfsm.driver import RunControl

    control = RunControl()

    def look() -> str:
        """Look around (and, meanwhile, the user says something)."""
        control.inject(Message.user("also check the logs"))
        return "nothing"

    model = ScriptedModel.of(reply("", tool_call("look", "c1")), "checked")
    session = Session()
    result = await Driver(model=model, tools=[look]).run(
        "look", session=session, control=control
    )
    assert result.ok
    second = list(model.requests[1].messages)
    assert [m.role for m in second] == [Role.USER, Role.ASSISTANT, Role.TOOL, Role.USER]
    assert second[-1].text == "also check the logs"
    assert session.history[3].text == "also check the logs"


async def test_a_message_injected_twice_is_refused_at_once_not_failing_the_run() -> (
    None
):
    # A send retried by a user interface, while the model call is in flight.
    from turnfsm.driver import RunControl

    control = RunControl()
    said = Message.user("also check the logs")
    refused: list[InvalidMessage] = []

    def look() -> str:
        """Look around (and, meanwhile, the user says something twice)."""
        control.inject(said)
        try:
            control.inject(said)
        except InvalidMessage as exc:
            refused.append(exc)
        return "nothing"

    model = ScriptedModel.of(reply("", tool_call("look", "c1")), "checked")
    session = Session()
    result = await Driver(model=model, tools=[look]).run(
        "look", session=session, control=control
    )
    assert result.ok, result.error
    (error,) = refused
    assert (error.field, error.value) == ("message.id", said.id)
    assert [m.text for m in session.history].count("also check the logs") == 1


async def test_run_control_cancel_ends_the_run_and_leaves_no_trace() -> None:
    from turnfsm.driver import RunControl
    from turnfsm.errors import Cancelled

    control = RunControl()

    def stop() -> str:
        """Ask to stop."""
        control.cancel("user pressed stop")
        return "ok"

    model = ScriptedModel.of(reply("", tool_call("stop", "c1")), "never")
    session = Session()
    result = await Driver(model=model, tools=[stop]).run(
        "go", session=session, control=control
    )
    assert isinstance(result.error, Cancelled)
    assert result.error.reason == "user pressed stop"
    assert len(model.requests) == 1
    assert list(session.history) == []


async def test_a_cancel_from_another_thread_interrupts_the_run_at_once() -> None:
    # A stop button whose callback runs in a thread of its own (many UI
    # toolkits), and a sync tool, which runs in a worker thread.
    import threading

    from turnfsm.driver import RunControl
    from turnfsm.errors import Cancelled

    raised: list[Exception] = []

    def press(control: RunControl) -> None:
        try:
            control.cancel("from a thread")
        except Exception as exc:
            raised.append(exc)

    async def hang(request: object) -> Message:
        threading.Timer(0.2, press, args=(control,)).start()
        await anyio.sleep(30)
        raise AssertionError("not interrupted")

    control = RunControl()
    with anyio.fail_after(10):
        stopped = await Driver(model=FakeModelClient(hang)).run("go", control=control)
    assert isinstance(stopped.error, Cancelled)
    assert stopped.error.reason == "from a thread"

    def stop() -> str:
        """Ask to stop, from the tool's worker thread."""
        press(tool_control)
        return "asked"

    tool_control = RunControl()
    model = ScriptedModel.of(reply("", tool_call("stop", "c1")), "never")
    result = await Driver(model=model, tools=[stop]).run("go", control=tool_control)
    assert isinstance(result.error, Cancelled)
    assert raised == []


async def test_a_run_cancelled_twice_ends_once_its_log_closed_at_the_first() -> None:
    from turnfsm.core import RunCancelled
    from turnfsm.driver import RunControl
    from turnfsm.errors import Cancelled

    control = RunControl()

    async def stop() -> str:
        """Ask to stop, twice, then wait to be interrupted."""
        control.cancel("first")
        control.cancel("second")
        await anyio.sleep(5)
        return "never"

    session = Session()
    with anyio.fail_after(5):
        result = await Driver(
            model=ScriptedModel.of(reply("", tool_call("stop", "c1")), "never"),
            tools=[stop],
        ).run("go", session=session, control=control)
    assert isinstance(result.error, Cancelled)
    assert result.error.reason == "first"
    entries = session.run_entries(result.run_id)
    cancels = [e for e in entries if type(e.event) is RunCancelled]
    # One end: nothing is fed to the run after the cancel that ended it.
    assert [e.event.reason for e in cancels] == ["first"]
    assert entries[-1] is cancels[0]
    assert replay(None, session, result.run_id).ok


async def test_a_stop_pressed_twice_does_not_cancel_the_control_s_next_run() -> None:
    # A double click on a stop button: both cancels are the one the run took.
    from turnfsm.driver import RunControl
    from turnfsm.errors import Cancelled

    control = RunControl()

    async def stop() -> str:
        """Ask to stop, twice, then wait to be interrupted."""
        control.cancel("stop")
        control.cancel("stop")
        await anyio.sleep(5)
        return "never"

    driver = Driver(
        model=ScriptedModel.of(reply("", tool_call("stop", "c1")), "answered"),
        tools=[stop],
    )
    with anyio.fail_after(5):
        stopped = await driver.run("go", session=Session(), control=control)
    assert isinstance(stopped.error, Cancelled)
    assert not control.is_cancel_requested
    assert control.queued() == ()
    following = Driver(model=ScriptedModel.of("answered"))
    again = await following.run("next", session=Session(), control=control)
    assert again.ok, again.error


async def test_a_control_in_use_by_a_running_run_is_refused_for_another() -> None:
    from turnfsm.driver import RunControl

    control = RunControl()
    started, release = anyio.Event(), anyio.Event()

    async def wait() -> str:
        """Wait to be let go."""
        started.set()
        await release.wait()
        return "ok"

    first = Driver(
        model=ScriptedModel.of(reply("", tool_call("wait", "c1")), "first done"),
        tools=[wait],
    )
    second_session = Session()
    outcome: list[Any] = []

    async def run_first() -> None:
        outcome.append(await first.run("go", session=Session(), control=control))

    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            group.start_soon(run_first)
            await started.wait()
            # A cancel through it could stop only one of two runs: refused,
            # before anything of the second is written.
            with pytest.raises(ConfigError) as refused:
                await Driver(model=ScriptedModel.of("never")).run(
                    "go", session=second_session, control=control
                )
            assert refused.value.field == "control"
            assert second_session.runs == []
            release.set()
    assert outcome[0].ok
    # Once its run has ended, the control may steer another.
    again = await Driver(model=ScriptedModel.of("second done")).run(
        "go", session=Session(), control=control
    )
    assert again.ok


async def test_what_a_control_queued_moves_to_another_and_the_run_takes_it() -> None:
    # A durable run continued as new hands its steering's queue on this way.
    from turnfsm.core import MessageInjected, RunCancelled
    from turnfsm.driver import RunControl
    from turnfsm.errors import Cancelled, InvalidMessage

    first = RunControl()
    first.inject(Message.user("also check the logs", id="m1"))
    queued = first.queued()
    assert [type(e) for e in queued] == [MessageInjected]
    second = RunControl()
    second.requeue(queued)
    assert second.queued() == queued
    model = ScriptedModel.of("checked")
    session = Session()
    result = await Driver(model=model).run("look", session=session, control=second)
    assert result.ok
    assert [m.text for m in model.requests[0].messages][-1] == "also check the logs"
    assert second.queued() == ()

    third = RunControl()
    third.requeue([RunCancelled(reason="stop")])
    assert third.is_cancel_requested
    stopped = await Driver(model=ScriptedModel.of("never")).run(
        "go", session=Session(), control=third
    )
    assert isinstance(stopped.error, Cancelled)
    assert stopped.error.reason == "stop"
    with pytest.raises(InvalidMessage, match="events"):
        RunControl().requeue([Message.user("not an event")])  # type: ignore[list-item]


def _injections_only_in(phases: tuple[str, ...]) -> MachineSpec:
    """The stock machine, taking injected messages only in `phases`."""
    data = tomllib.loads(turn_toml_text())
    data["transitions"] = [
        t for t in data["transitions"] if t["trigger"] != "message_injected"
    ]
    for phase in phases:
        actions = ["record_injection", "flush_inbox"]
        data["transitions"].append(
            {"trigger": "message_injected", "source": phase, "actions": actions[:1]}
            if phase != "start"
            else {"trigger": "message_injected", "source": phase, "actions": actions}
        )
    return MachineSpec.from_dict(data)


@pytest.mark.parametrize(
    ("phases", "joined"),
    [((), False), (("start", "call_llm"), True), (("call_llm",), True)],
    ids=["no-phase", "start-and-call-llm", "call-llm-only"],
)
async def test_an_injection_the_phase_cannot_take_waits_or_is_refused_typed(
    phases: tuple[str, ...], joined: bool
) -> None:
    # It raised IllegalEvent ("a driver bug") out of the run, for a machine
    # file that loads: one without message_injected in every phase. Then a
    # machine that takes none failed the whole run: refused at the call now.
    control = RunControl()
    refused: list[InvalidMessage] = []

    def look() -> str:
        """Look around (and, meanwhile, the user says something)."""
        try:
            control.inject(Message.user("also check the logs"))
        except InvalidMessage as exc:
            refused.append(exc)
        return "nothing"

    model = ScriptedModel.of(reply("", tool_call("look", "c1")), "checked", "again")
    session = Session()
    driver = Driver(model=model, tools=[look], machine=_injections_only_in(phases))
    result = await driver.run("look", session=session, control=control)

    texts = [m.text for m in session.history]
    assert result.ok, result.error
    assert ("also check the logs" in texts) is joined
    if joined:
        assert refused == []
    else:
        assert [str(e) for e in refused] == [
            f"invalid message message={refused[0].value!r}: machine 'turn' takes"
            " no injected message (none of its phases has a 'message_injected'"
            " transition)"
        ]
        assert texts == ["look", "", "", "checked"]  # the call, its result, the answer
        # The control steers its next run as it did: an injection is queued.
        control.inject(Message.user("later"))
        assert len(control.queued()) == 1


def test_a_machine_whose_last_call_takes_no_injection_is_refused() -> None:
    # It loaded: a message injected while the model gave its final answer
    # waited for a phase that takes it, and the run ended done without it.
    with pytest.raises(DefinitionError, match="phase 'call_llm' takes no injected"):
        _injections_only_in(("start",))


async def test_an_injection_queued_before_a_run_that_takes_none_fails_it_typed() -> (
    None
):
    control = RunControl()
    control.inject(Message.user("also check the logs"))
    model = ScriptedModel.of("checked")
    session = Session()
    driver = Driver(model=model, machine=_injections_only_in(()))
    result = await driver.run("look", session=session, control=control)

    assert isinstance(result.error, InvalidMessage)
    assert str(result.error).endswith(
        "machine 'turn' takes no injected message (none of its phases has a"
        " 'message_injected' transition)"
    )
    assert model.requests == []  # refused before the model is called
    assert [m.text for m in session.history] == []


async def test_an_injection_asks_the_machine_once_whether_its_phase_takes_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Each queued injection asked every phase whether it takes injections.
    asked: list[str] = []
    accepts = MachineSpec.accepts

    def counting(spec: MachineSpec, phase: str) -> tuple[str, ...]:
        asked.append(phase)
        return accepts(spec, phase)

    monkeypatch.setattr(MachineSpec, "accepts", counting)
    control = RunControl()

    def look() -> str:
        """Look around (and, meanwhile, the user says three things)."""
        for text in ("one", "two", "three"):
            control.inject(Message.user(text))
        return "nothing"

    model = ScriptedModel.of(reply("", tool_call("look", "c1")), "checked")
    result = await Driver(model=model, tools=[look]).run("look", control=control)

    assert result.ok
    assert asked == ["run_tools"] * 3


async def test_a_message_injected_during_the_final_call_keeps_the_run_going() -> None:
    from turnfsm.driver import RunControl
    from turnfsm.providers import ModelRequest

    control = RunControl()
    seen: list[list[str]] = []

    def handler(request: ModelRequest) -> str:
        seen.append([m.text for m in request.messages])
        if len(seen) == 1:
            control.inject(Message.user("one more thing"))
            return "first answer"
        return "second answer"

    session = Session()
    result = await Driver(model=FakeModelClient(handler)).run(
        "hello", session=session, control=control
    )
    assert result.text == "second answer"
    assert seen[1] == ["hello", "first answer", "one more thing"]
    assert [m.text for m in session.history] == [
        "hello",
        "first answer",
        "one more thing",
        "second answer",
    ]


async def test_a_result_counts_the_calls_whose_usage_was_reported() -> None:
    reported = ModelResponse(
        message=reply("", tool_call("echo", "c1", text="a")),
        usage=Usage(input_tokens=10, output_tokens=2),
    )
    model = ScriptedModel.of(reported, "done")  # the second reports none
    result = await Driver(model=model, tools=[echo]).run("x")
    assert (result.turns, result.reported_calls) == (2, 1)
    assert result.usage == Usage(input_tokens=10, output_tokens=2)


def _read_digits() -> list[Message]:
    """A question, a call, and its result: 900 digits, which BPE tokenizers
    other than cl100k (one token a digit) read three times as long as the
    default counter does."""
    digits = "".join(str(i * 7 % 10) for i in range(900))
    return [
        Message.user("Which reading is the last?"),
        Message.assistant(tool_calls=[tool_call("read_page", "c1", name="today")]),
        Message.tool_result("c1", digits),
    ]


@pytest.mark.parametrize(
    ("said", "counted"),
    [
        (
            "HTTP 400: This model's maximum context length is 1000 tokens. However, "
            "you requested 1400 tokens (1376 in the messages, 24 in the completion).",
            1_400,
        ),
        ("HTTP 400: prompt is too long", 1_001),  # no count: over the window
    ],
)
async def test_an_overflow_the_estimate_reads_under_the_target_still_compacts(
    said: str, counted: int
) -> None:
    """The counter read the refused request under the target: the pass aims
    lower in proportion, as the provider counts, and the retry is sent."""
    refused = ProviderError(said, kind=CONTEXT_OVERFLOW, status=400)
    model = ScriptedModel.of(refused, "the last is 3")
    manager = ContextManager(context_window=1_000)  # the default counter
    session = Session()
    driver = Driver(model=model, context=manager, max_output_tokens=24)
    result = await driver.run(_read_digits(), session=session)
    assert (result.outcome, result.text) == ("done", "the last is 3"), result.error
    (sent, retried) = model.requests
    before = manager.count(sent.messages) + 24
    aim = manager.target_tokens * before // counted
    assert manager.count(retried.messages) + 24 <= aim


async def test_an_overflow_on_a_window_bigger_than_the_models_still_stalls() -> None:
    """Told 4,000 tokens for a model of 1,000: the refusal is the window's
    fault, not the counter's, and the stall says to set the real window."""
    said = (
        "HTTP 400: This model's maximum context length is 1000 tokens. However, "
        "you requested 1010 tokens (986 in the messages, 24 in the completion)."
    )
    refused = ProviderError(said, kind=CONTEXT_OVERFLOW, status=400)
    model = ScriptedModel.of(refused, "never")
    big = [
        Message.user("Which reading is the last?"),
        Message.assistant(tool_calls=[tool_call("read_page", "c1", name="today")]),
        Message.tool_result("c1", "the pump is fine " * 200),  # ~1,000 tokens
    ]
    driver = Driver(
        model=model,
        context=ContextManager(context_window=4_000),
        max_output_tokens=24,
    )
    result = await driver.run(big)
    assert isinstance(result.error, CompactionStalled)
    assert "set context_window to the model's real window" in str(result.error)
    assert len(model.requests) == 1


@pytest.mark.parametrize(
    ("said", "window", "least"),
    [
        ("maximum context length is 1000 tokens. However, you requested 1400 "
         "tokens (1376 in the messages, 24 in the completion).", 1_000, 1_400),
        ("prompt is too long: 210345 tokens > 200000 maximum", 200_000, 210_345),
        ("input length and `max_tokens` exceed context limit: 197682 + 21333 > "
         "200000", 200_000, 219_015),
        ("the request exceeds the available context size", 2_048, 2_049),
        # The model's window is smaller than the run's: at least over the model's.
        ("maximum context length is 1024 tokens. However, you requested 1030 "
         "tokens", 4_096, 1_030),
        ("prompt is too long: 900 tokens > 800 maximum", 4_096, 900),
    ],
)  # fmt: skip
def test_a_refusal_says_at_least_how_big_the_provider_found_the_request(
    said: str, window: int, least: int
) -> None:
    assert refused_size(ErrorInfo(type=CONTEXT_OVERFLOW, message=said), window) == least
    own = ErrorInfo(type=CONTEXT_CHECK, message=said)  # the run's own check
    assert refused_size(own, window) is None


async def test_a_reply_the_provider_cut_at_the_window_is_an_overflow() -> None:
    """A server that clips the reply budget to what its window leaves (llama.cpp)
    instead of refusing: its count of the request says the budget did not fit,
    so the cut reply is not the answer; the pass shrinks the request and the
    model is asked again."""
    cut = ModelResponse(
        message=Message.assistant("The last reading is 3, taken at"),
        usage=Usage(input_tokens=999, output_tokens=25),  # 999 + 25 = the window
        finish_reason="length",
    )
    model = ScriptedModel.of(cut, "The last reading is 3, taken at noon.")
    session = Session()
    driver = Driver(
        model=model, context=ContextManager(context_window=1_024), max_output_tokens=64
    )
    result = await driver.run(_read_digits(), session=session)
    assert (result.outcome, result.text) == (
        "done",
        "The last reading is 3, taken at noon.",
    )
    (sent, retried) = model.requests
    counter = driver.context.counter
    assert counter.count(list(retried.messages)) < counter.count(list(sent.messages))
    events = [type(e).__name__ for e in session.runs[0].events]
    assert events[2:5] == ["ContextOverflowed", "CompactionResult", "ModelReplied"]
    said = session.runs[0].events[2].error.message
    assert said == (
        "the provider cut the reply off at 25 of its 64 tokens: by its count the "
        "request is 999 input + 64 reply = 1063 tokens > the 1024 window; the "
        "reply is not committed"
    )


async def test_a_reply_cut_at_its_own_budget_is_no_overflow() -> None:
    cut = ModelResponse(
        message=Message.assistant("The last reading is 3, taken at"),
        usage=Usage(input_tokens=300, output_tokens=64),
        finish_reason="length",
    )
    model = ScriptedModel.of(cut, "never")
    driver = Driver(
        model=model, context=ContextManager(context_window=1_024), max_output_tokens=64
    )
    result = await driver.run(_read_digits())
    assert (result.outcome, len(model.requests)) == ("done", 1)
