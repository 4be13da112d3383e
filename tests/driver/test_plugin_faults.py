"""Faults of the code a user plugs in, with the exceptions it rarely raises.

A validator whose message cannot be read or runs to a megabyte, a
`CancelledError` that nothing asked for, a compaction effect of the user's
that says it saved what it did not: each is the plug-in's failure, told as
such, and the session stays usable.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import attrs
import pytest

from turnfsm import Agent, ContextManager
from turnfsm._resources import machines_dir
from turnfsm.core import (
    CallLLM,
    Compact,
    CompactionNoop,
    CompactionResult,
    Event,
    MachineSpec,
    ModelReplied,
    RunStarted,
    ToolCallsReviewed,
)
from turnfsm.driver import EffectContext, RetryPolicy, Session, call_model
from turnfsm.errors import (
    CompactionFailed,
    EffectFailed,
    InvalidReturn,
    ProviderError,
    RunCrashed,
    StoreUnusable,
)
from turnfsm.hooks import Hook, OutcomeInfo, RunEndInfo
from turnfsm.messages import Message, Role, TextPart
from turnfsm.persistence import SQLiteStore
from turnfsm.providers import ModelRequest, ModelResponse
from turnfsm.testing import FakeModelClient, ScriptedModel, reply, tool_call

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    """asyncio's: a `CancelledError` nothing asked for is asyncio's own."""
    return "asyncio"


class Unreadable(Exception):
    """An exception whose message cannot be read."""

    def __str__(self) -> str:
        raise RuntimeError("str boom")


def refuse_bad(_inst: object, _attr: object, value: str) -> None:
    if value == "unreadable":
        raise Unreadable
    if value == "long":
        raise ValueError("S" * 1_000_000)


@attrs.define
class Named:
    name: str = attrs.field(validator=refuse_bad)


@pytest.mark.parametrize("bad", ["unreadable", "long"])
async def test_a_validators_refusal_is_told_to_the_model_and_asked_again(
    bad: str,
) -> None:
    # An unreadable message crashed the run (RuntimeError from the re-ask's
    # text); a megabyte one was pinned whole and failed it, ContextExceeded.
    model = ScriptedModel.of(f'{{"name": "{bad}"}}', '{"name": "fine"}')
    result = await Agent(model=model).run("go", output_type=Named)
    assert result.outcome == "done", result.error
    assert result.output == Named("fine")
    asked = model.requests[1].messages[-1].text
    if bad == "unreadable":
        assert "Unreadable: (its message could not be read" in asked
    else:
        assert "[... 999000 characters cut]" in asked
        assert len(asked) < 2_000


async def cancelled_elsewhere() -> None:
    """Await a future something else cancelled: a CancelledError, asked by no one."""
    future = asyncio.get_running_loop().create_future()
    future.cancel()
    await future


async def test_a_model_client_that_raises_cancelled_error_crashes_the_run() -> None:
    # It was logged interrupted, as if the run had been cancelled: the
    # session stayed held (SessionBusy) until the run was resumed or abandoned.
    calls = [0]

    async def handler(_request: ModelRequest) -> ModelResponse:
        calls[0] += 1
        if calls[0] == 1:
            await cancelled_elsewhere()
        return ModelResponse(message=Message.assistant("fine"))

    agent = Agent(model=FakeModelClient(handler))
    with pytest.raises(RunCrashed) as crashed:  # not a cancel: nothing asked for one
        await agent.run("go")
    assert isinstance(crashed.value.__cause__, asyncio.CancelledError)
    run = agent.session.runs[-1]
    assert run.outcome == "failed"
    assert isinstance(run.error, RunCrashed)
    assert run.error.type == "CancelledError"
    assert not agent.session.open_runs()
    assert (await agent.run("again")).text == "fine"  # the session is free


class CancelsAtTheEnd(Hook):
    """A hook that raises CancelledError, which no cancel of the run can reach."""

    def __init__(self) -> None:
        self.ends = 0

    def on_run_end(self, info: RunEndInfo) -> None:
        self.ends += 1
        raise asyncio.CancelledError

    def on_outcome(self, info: OutcomeInfo) -> None:
        raise asyncio.CancelledError


async def test_a_hook_that_raises_cancelled_error_is_detached() -> None:
    # The caller got CancelledError in place of a run logged done.
    hook = CancelsAtTheEnd()
    agent = Agent(model=ScriptedModel.of("one", "two"), hooks=[hook])
    assert (await agent.run("go")).text == "one"
    assert (await agent.run("again")).text == "two"
    assert hook.ends == 0  # detached at its first raise, before the run's end


async def test_a_pass_of_the_users_that_saved_nothing_but_says_it_did_fails() -> None:
    # A machine whose passes are bounded by the no-progress guard alone made
    # them for ever: the guard reads the sizes the pass says.
    async def says_it_saved(ctx: EffectContext, decision: Compact) -> Event:
        messages: Sequence[Message] = decision.messages
        return CompactionResult(messages, before=1_000, after=10)

    session = Session()
    agent = Agent(
        model=ScriptedModel.of("one"),
        effects={"compact": says_it_saved},
        session=session,
    )
    await agent.run("go " * 50)
    result = await agent.driver.compact(session)  # a manual pass: the effect's
    assert result.outcome == "failed"
    assert isinstance(result.error, InvalidReturn)
    assert "CompactionResult(before=1000, after=10)" in str(result.error)
    assert "so it saved nothing" in str(result.error)


async def test_an_effect_of_yours_that_raises_cancelled_error_fails_the_run() -> None:
    # It was logged interrupted, and the session held, as for a cancel.
    async def call(ctx: EffectContext, decision: object) -> Event:
        await cancelled_elsewhere()
        raise AssertionError("not reached")

    agent = Agent(model=ScriptedModel.of("one"), effects={"call_llm": call})
    result = await agent.run("go")
    assert result.outcome == "failed"
    assert isinstance(result.error, EffectFailed)
    assert (result.error.effect, result.error.type) == ("call_llm", "CancelledError")
    assert not agent.session.open_runs()


async def test_a_no_op_of_the_users_that_says_it_saved_fails_the_run() -> None:
    # A no-op changed nothing: one that said it saved passed the no-progress
    # guard every time, on a machine that relies on the guard.
    async def says_it_saved(ctx: EffectContext, decision: Compact) -> Event:
        return CompactionNoop(before=100, after=50)

    session = Session()
    agent = Agent(
        model=ScriptedModel.of("one"),
        effects={"compact": says_it_saved},
        session=session,
    )
    await agent.run("go")
    result = await agent.driver.compact(session)
    assert result.outcome == "failed"
    assert isinstance(result.error, InvalidReturn)
    assert str(result.error) == (
        "effect 'compact' returned CompactionNoop(before=100, after=50): expected a "
        "no-op whose after is at least its before: it changed nothing, so it saved "
        "nothing (return a CompactionResult for a pass that did)"
    )


async def test_a_store_that_raises_cancelled_error_is_unusable_for_now(
    tmp_path: Path,
) -> None:
    # A store's own CancelledError was taken for the run's cancel: a lease
    # renewal's cancelled the run and `run` returned None.
    failing = [False]

    class Flaky(SQLiteStore):
        async def append(self, *args: Any, **kwargs: Any) -> Any:
            if failing[0]:
                failing[0] = False
                await cancelled_elsewhere()
            return await super().append(*args, **kwargs)

    store = Flaky(tmp_path / "s.db")
    agent = Agent(model=ScriptedModel.of("one", "two", "three"), store=store)
    assert (await agent.run("go")).text == "one"
    failing[0] = True
    with pytest.raises(StoreUnusable) as caught:
        await agent.run("again")
    assert "its append raised CancelledError though nothing cancelled it" in str(
        caught.value
    )
    await store.aclose()
    reread = await Session.load(SQLiteStore(tmp_path / "s.db"), agent.session.id)
    assert reread.runs[0].outcome == "done"  # nothing committed lost


async def caught_earlier() -> BaseException:
    """The backend's cancellation error, caught in a scope cancelled and left since.

    Raised again, it is a cancel nothing asks for, on asyncio and trio alike.
    """
    with anyio.CancelScope() as scope:
        scope.cancel()
        try:
            await anyio.sleep(1)
        except anyio.get_cancelled_exc_class() as exc:
            return exc
    raise AssertionError("not cancelled")


def test_on_trio_a_cancel_raised_outside_a_cancelled_scope_crashes_the_run() -> None:
    # A model client re-raising a trio.Cancelled it caught earlier: the run
    # was logged interrupted, and `run` returned None from the lease's task
    # group (or raised the bare Cancelled to a caller nobody cancelled).
    async def main() -> None:
        calls = [0]

        async def handler(_request: ModelRequest) -> ModelResponse:
            calls[0] += 1
            if calls[0] == 1:
                raise await caught_earlier()
            return ModelResponse(message=Message.assistant("fine"))

        agent = Agent(model=FakeModelClient(handler))
        with pytest.raises(RunCrashed):
            await agent.run("go")
        assert agent.session.runs[-1].outcome == "failed"
        assert (await agent.run("again")).text == "fine"

        async def slow(_request: ModelRequest) -> ModelResponse:
            await anyio.sleep(5)
            return ModelResponse(message=Message.assistant("late"))

        waiting = Agent(model=FakeModelClient(slow))
        with anyio.move_on_after(0.05):  # a real cancel: an interruption still
            await waiting.run("go")
        assert waiting.session.runs[-1].outcome == "interrupted"

    anyio.run(main, backend="trio")


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_tool_an_effect_or_a_compactor_raising_a_cancel_fails_alike_on_both(
    backend: str,
) -> None:
    # On trio, a tool's fault crashed the run, and so did a compactor's
    # (its breaker not counting it), where asyncio failed the call or the pass.
    async def cancelled_tool() -> str:
        """A tool whose cancellation error nobody asked for."""
        raise await caught_earlier()

    class CancelledCompactor:
        """A compactor whose cancellation error nobody asked for."""

        async def compact(self, messages, target, ctx):  # type: ignore[no-untyped-def]
            raise await caught_earlier()

    async def effect(ctx: EffectContext, decision: object) -> Event:
        raise await caught_earlier()

    name = "CancelledError" if backend == "asyncio" else "Cancelled"

    async def main() -> None:
        tooled = Agent(
            model=ScriptedModel.of(
                reply("", tool_call("cancelled_tool", "c1")), "went on"
            ),
            tools=[cancelled_tool],
        )
        result = await tooled.run("go")
        assert result.text == "went on"
        (closed,) = [r for m in tooled.session.history for r in m.tool_results]
        assert closed.is_error
        assert f"tool 'cancelled_tool' failed: {name}" in closed.content

        effected = Agent(model=ScriptedModel.of("one"), effects={"call_llm": effect})
        result = await effected.run("go")
        assert isinstance(result.error, EffectFailed)
        assert (result.error.effect, result.error.type) == ("call_llm", name)

        session = Session()
        compacted = Agent(
            model=ScriptedModel.of("one"),
            context=ContextManager(CancelledCompactor(), context_window=8_000),  # type: ignore[arg-type]
            session=session,
        )
        await compacted.run("go " * 200)
        result = await compacted.driver.compact(session)
        assert result.outcome == "failed"
        assert isinstance(result.error, CompactionFailed)
        assert f"CancelledCompactor raised {name} though nothing" in str(result.error)
        assert session.compaction_failures == 1  # the breaker counts it
        assert not session.open_runs()

    anyio.run(main, backend=backend)


# -- effects of yours in place of the built-in steps ---------------------------


def _echo(x: str) -> str:
    """Echo.

    Args:
        x: the text.
    """
    return x


@pytest.mark.parametrize("key", ["call_llm", "run_tools", "measure"])
async def test_an_effect_in_place_of_a_step_that_hangs_ends_at_effect_timeout(
    key: str,
) -> None:
    # Only a compaction pass and a phase of one's own had a limit: a model
    # call, a batch of tools or a measurement of one's own ran for ever.
    async def hang(ctx: EffectContext, decision: object) -> Event:
        await anyio.sleep_forever()
        raise AssertionError("not reached")

    agent = Agent(
        model=ScriptedModel.of(reply("", tool_call("_echo", "c1", x="a")), "done"),
        tools=[_echo],
        effects={key: hang},
        effect_timeout=0.2,
        # What the built-in step may take, when longer, bounds one in its
        # place (a wrapper around it keeps its retries): here it is shorter.
        model_timeout=0.1,
        tool_timeout=0.1,
        retry=RetryPolicy(max_attempts=1),
    )
    with anyio.fail_after(10):
        result = await agent.run("hi")
    assert result.outcome == "cancelled"
    said = (
        " (effect_timeout)"
        if key == "measure"
        else " (effect_timeout, or the step's own limits when longer)"
    )
    assert str(result.error).endswith(f"effect {key!r} timed out after 0.2s{said}")


async def test_a_wrapper_around_the_model_call_keeps_its_retries() -> None:
    # Cut at effect_timeout, a wrapper around the built-in model call was
    # cancelled where the built-in would have retried and answered.
    calls: list[int] = []

    async def slow_then_fine(request: ModelRequest) -> ModelResponse:
        calls.append(1)
        await anyio.sleep(0.3)
        if len(calls) == 1:
            raise ProviderError("busy", retryable=True, kind="server_error")
        return ModelResponse(message=Message.assistant("fine"))

    async def logged(ctx: EffectContext, decision: CallLLM) -> Event:
        return await call_model(ctx, decision)

    agent = Agent(
        model=FakeModelClient(slow_then_fine),
        effects={"call_llm": logged},
        effect_timeout=0.4,
        retry=RetryPolicy(max_attempts=2, initial_wait=0.01, max_total=1.0),
    )
    with anyio.fail_after(10):
        assert (await agent.run("hi")).text == "fine"


async def test_an_effect_that_starts_the_run_again_is_refused_naming_it() -> None:
    # It crashed the run on IllegalEvent, which speaks of a bug of turnfsm's.
    async def again(ctx: EffectContext, decision: object) -> Event:
        return RunStarted(input=(Message.user("again"),))

    result = await Agent(model=ScriptedModel.of("x"), effects={"measure": again}).run(
        "hi"
    )
    assert isinstance(result.error, InvalidReturn)
    assert (result.error.source, result.error.value) == (
        "effect 'measure'",
        "RunStarted",
    )


def _first_said(session: Session) -> list[str]:
    return [m.text for m in session.history]


@pytest.mark.parametrize("fault", ["same id twice", "over the window", "empty"])
async def test_a_pass_of_your_own_is_held_to_the_managers_rules(fault: str) -> None:
    # Adopted and committed: two messages of one id, a conversation over the
    # window (every later run failed), a message with nothing in it.
    async def compact(ctx: EffectContext, decision: Compact) -> Event:
        messages = list(decision.messages)
        if fault == "same id twice":
            new = [*messages, Message.user("a", id="m1"), Message.user("b", id="m1")]
        elif fault == "over the window":
            new = [messages[0], Message.user("filler " * 3_000), *messages[1:]]
        else:
            new = [*messages, Message(role=Role.ASSISTANT, parts=())]
        before = ctx.run.measure(decision.history, decision.pending)
        return CompactionResult(new, before=before, after=ctx.run.measure(new))

    session = Session()
    agent = Agent(
        model=ScriptedModel.of("one", "two"),
        context=ContextManager(context_window=2_000, max_messages=2),
        effects={"compact": compact},
        session=session,
    )
    assert (await agent.run("first")).outcome == "done"
    kept = _first_said(session)
    result = await agent.run("second")
    assert isinstance(result.error, InvalidReturn)
    assert "nothing of it was adopted" in str(result.error)
    assert _first_said(session) == kept  # nothing committed


@pytest.mark.parametrize("role", [Role.USER, Role.SYSTEM])
async def test_a_reply_of_your_own_must_be_the_assistants(role: Role) -> None:
    async def call(ctx: EffectContext, decision: object) -> Event:
        return ModelReplied(message=Message(role=role, parts=(TextPart(text="hi"),)))

    result = await Agent(model=ScriptedModel.of("x"), effects={"call_llm": call}).run(
        "hi"
    )
    assert isinstance(result.error, InvalidReturn)
    assert f"is the {role.value}'s" in str(result.error)


async def test_a_reply_of_your_own_is_taken_as_the_models_are() -> None:
    # A call id used twice was committed twice; a reply over the window was
    # committed, and the session held more than its window.
    replies = iter(
        [
            reply("", tool_call("_echo", "c1", x="a")),
            reply("", tool_call("_echo", "c1", x="b"), tool_call("_echo", "c1", x="c")),
            reply("done"),
            reply("word " * 5_000),
        ]
    )

    async def call(ctx: EffectContext, decision: object) -> Event:
        return ModelReplied(message=next(replies))

    agent = Agent(
        model=ScriptedModel.of("x"),
        tools=[_echo],
        effects={"call_llm": call},
        context=ContextManager(context_window=2_000),
    )
    assert (await agent.run("hi")).text == "done"
    ids = [c.id for m in agent.session.history for c in m.tool_calls]
    assert len(ids) == len(set(ids)) == 3
    kept = list(agent.session.history)
    result = await agent.run("again")
    assert "the reply makes the conversation" in str(result.error)
    assert list(agent.session.history) == kept


async def test_a_review_of_your_own_that_answers_a_call_with_a_success_is_refused() -> (
    None
):
    # The call never ran, and the model read the reviewer's words as the
    # tool's own result: a pause's answer is refused so, an effect's was not.
    text = (
        (machines_dir() / "turn.toml")
        .read_text()
        .replace('name = "turn"', 'name = "allowlist"')
    )
    text = text.replace(
        "[states]\n", '[states]\ncheck_tools = { effect = "check_tools" }\n'
    )
    text = text.replace(
        'source = "call_llm"\ndest = "run_tools"',
        'source = "call_llm"\ndest = "check_tools"',
    )
    text += (
        '\n[[transitions]]\ntrigger = "tool_calls_reviewed"\nsource = "check_tools"\n'
        'dest = "run_tools"\nactions = ["record_review"]\n'
    )
    ran: list[str] = []

    def delete(path: str) -> str:
        """Delete a file.

        Args:
            path: the file.
        """
        ran.append(path)
        return f"deleted {path}"

    async def check_tools(ctx: EffectContext, decision: object) -> Event:
        return ToolCallsReviewed(results=[Message.tool_result("c1", "deleted x")])

    agent = Agent(
        model=ScriptedModel.of(reply("", tool_call("delete", "c1", path="x")), "ok"),
        tools=[delete],
        machine=MachineSpec.from_toml(text),
        effects={"check_tools": check_tools},
    )
    result = await agent.run("clean up")
    assert isinstance(result.error, InvalidReturn)
    assert "answering call 'c1' with a result that is no error" in str(result.error)
    assert ran == []


async def test_a_reply_given_twice_takes_an_id_made_of_its_place() -> None:
    # A client that caches its replies gives one twice: the second gets an id
    # of its own, made of the request (the same when a durable run replays),
    # not a random one.
    async def call(ctx: EffectContext, decision: object) -> Event:
        return ModelReplied(message=Message.assistant("same", id="r1"))

    agent = Agent(model=ScriptedModel.of("x"), effects={"call_llm": call})
    await agent.run("one")
    await agent.run("two")
    assert [m.id for m in agent.session.history if m.role is Role.ASSISTANT] == [
        "r1",
        "r1_3",
    ]
