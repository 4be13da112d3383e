"""Defects found in review, each pinned by a test."""

from __future__ import annotations

import time
from collections.abc import Sequence

import anyio
import pytest

from turnfsm import Agent
from turnfsm.context import CompactionContext, CompactionProposal, ContextManager
from turnfsm.driver import Driver, RetryPolicy, RunControl, Session
from turnfsm.errors import (
    CompactionFailed,
    ConfigError,
    InvalidMessage,
    ProviderError,
    SessionBusy,
)
from turnfsm.messages import Message, ToolCallPart, check_history
from turnfsm.testing import FakeModelClient, ScriptedModel, reply, tool_call
from turnfsm.tokens import HeuristicTokenCounter

pytestmark = pytest.mark.anyio


async def test_a_hanging_plain_function_tool_still_times_out() -> None:
    def slow() -> str:
        """Block for a while."""
        time.sleep(1.5)
        return "late"

    model = ScriptedModel.of(reply("", tool_call("slow", "c1")), "ok")
    session = Session()
    started = anyio.current_time()
    result = await Driver(model=model, tools=[slow], tool_timeout=0.1).run(
        "go", session=session
    )
    assert anyio.current_time() - started < 1.0
    assert result.ok
    assert session.history[2].tool_results[0].content == (
        "tool 'slow' timed out after 0.1s"
    )


async def test_a_tools_own_timeout_error_is_its_failure_not_ours() -> None:
    def fetch() -> str:
        """Fail upstream."""
        raise TimeoutError("upstream lock")

    model = ScriptedModel.of(reply("", tool_call("fetch", "c1")), "ok")
    session = Session()
    await Driver(model=model, tools=[fetch], tool_timeout=None).run(
        "go", session=session
    )
    content = session.history[2].tool_results[0].content
    assert content == "tool 'fetch' failed: TimeoutError: upstream lock"


def test_injected_messages_are_checked_at_the_boundary() -> None:
    control = RunControl()
    with pytest.raises(InvalidMessage) as caught:
        control.inject(Message.tool_result("ghost", "x"))
    assert caught.value.field == "message.parts"
    with pytest.raises(InvalidMessage, match="tool calls or tool results"):
        control.inject(Message.assistant(tool_calls=[ToolCallPart(id="x", name="f")]))
    with pytest.raises(InvalidMessage) as caught:
        control.inject("not a message")  # type: ignore[arg-type]
    assert caught.value.field == "message"
    assert control.drain() == []


def test_an_unanswered_tool_call_is_rejected_as_input() -> None:
    call = Message.assistant(tool_calls=[ToolCallPart(id="c1", name="f")])
    with pytest.raises(InvalidMessage) as caught:
        check_history([Message.user("hi"), call])
    assert (caught.value.field, caught.value.value) == ("tool_call.id", "c1")
    with pytest.raises(InvalidMessage):
        check_history([call, Message.user("next")])


class KeepLast:
    """A careless compactor: keeps only the last message, orphaning its call."""

    async def compact(
        self, messages: Sequence[Message], target: int, ctx: CompactionContext
    ) -> CompactionProposal:
        return CompactionProposal.compacted(list(messages[-1:]), ctx.tokens_before, 0)


async def test_a_compactor_that_orphans_a_tool_result_fails_the_pass() -> None:
    def dump() -> str:
        """Dump a lot."""
        return "z" * 4_000

    model = ScriptedModel.of(reply("", tool_call("dump", "c1")), "never")
    ctx = ContextManager(
        KeepLast(), context_window=1_200, counter=HeuristicTokenCounter()
    )
    session = Session()
    result = await Driver(model=model, tools=[dump], context=ctx).run(
        "go", session=session
    )
    assert isinstance(result.error, CompactionFailed)
    assert "breaks tool call 'c1'" in result.error.cause
    assert len(model.requests) == 1  # the orphaned result was never sent
    assert list(session.history) == []


async def test_two_runs_cannot_share_a_session_at_once() -> None:
    release = anyio.Event()

    async def slow(request: object) -> str:
        await release.wait()
        return "done"

    session = Session()
    driver = Driver(model=FakeModelClient(slow))
    async with anyio.create_task_group() as group:
        group.start_soon(lambda: driver.run("first", session=session))
        await anyio.wait_all_tasks_blocked()
        with pytest.raises(SessionBusy):
            await driver.run("second", session=session)
        release.set()
    assert [m.text for m in session.history] == ["first", "done"]
    assert not session.is_running


async def test_run_stream_raises_the_error_itself_not_a_group() -> None:
    agent = Agent(model=ScriptedModel.of("x"))
    with pytest.raises(InvalidMessage):
        async with agent.run_stream([Message.tool_result("ghost", "?")]) as stream:
            _ = [p async for p in stream]

    class Mine(Exception):
        pass

    with pytest.raises(Mine):
        async with agent.run_stream("hi") as stream:
            raise Mine


# -- a message joins a conversation once ----------------------------------------


async def test_a_message_given_again_is_refused_and_nothing_is_written() -> None:
    u = Message.user("hi " + "word " * 400)
    session = Session()
    driver = Driver(
        model=FakeModelClient(lambda r: "ans " + "word " * 400),
        context=ContextManager(context_window=6_000),
    )
    assert (await driver.run([u], session=session)).ok
    version, history = session.version, session.history

    with pytest.raises(InvalidMessage) as caught:
        await driver.run([u], session=session)

    assert (caught.value.field, caught.value.value) == ("input.id", u.id)
    assert "build a new Message" in str(caught.value)
    assert (session.version, session.history) == (version, history)
    # The session goes on, and compacts when it must: every id is its own.
    for _ in range(4):
        assert (await driver.run([Message.user(u.text)], session=session)).ok
    assert len({m.id for m in session.history}) == len(session.history)
    assert any(run.compactions for run in session.runs)


async def test_the_same_message_twice_in_one_input_is_refused() -> None:
    u = Message.user("hi")
    session = Session()
    with pytest.raises(InvalidMessage) as caught:
        await Driver(model=ScriptedModel.of("ok")).run([u, u], session=session)
    assert (caught.value.field, caught.value.value) == ("input.id", u.id)
    assert session.version == 0


async def test_the_input_of_a_failed_run_can_be_given_again() -> None:
    # A failed run commits nothing: trying its input again is a retry.
    u = Message.user("hi")
    session = Session()
    boom = ProviderError("boom", kind="server")
    once = RetryPolicy(max_attempts=1, initial_wait=0, jitter=False)
    failed = await Driver(model=ScriptedModel.of(boom), retry=once).run(
        [u], session=session
    )
    assert isinstance(failed.error, ProviderError)

    result = await Driver(model=ScriptedModel.of("ok")).run([u], session=session)

    assert result.ok
    assert [m.id for m in session.history][:1] == [u.id]


async def test_an_injected_message_the_conversation_has_fails_the_run() -> None:
    u = Message.user("hi")
    session = Session()
    driver = Driver(model=ScriptedModel.of("ok", "again"))
    assert (await driver.run([u], session=session)).ok
    history = session.history
    control = RunControl()
    control.inject(u)

    result = await driver.run("go on", session=session, control=control)

    assert isinstance(result.error, InvalidMessage)
    assert (result.error.field, result.error.value) == ("message.id", u.id)
    assert session.history == history  # nothing of the run is committed


@pytest.mark.parametrize(
    ("given", "message"),
    [
        (
            None,
            "invalid message input=None: expected a string, a Message or a list "
            "of Messages",
        ),
        ([], "invalid message input=[]: expected at least one message"),
        (
            ["hi"],
            "invalid message input[0]='hi': expected a Message: a list holds "
            "Messages (Message.user(text)), and one string is a message as it is",
        ),
        ([Message.user("a"), 5], "invalid message input[1]=5: expected a Message"),
        # A chat API's message dicts, as OpenAI's SDK takes them: the
        # Message each would be is named.
        (
            [{"role": "user", "content": "hi"}],
            "invalid message input[0]={'role': 'user', 'content': 'hi'}: expected "
            "a Message, not a chat API's dict: Message.user('hi') (from "
            "turnfsm.messages)",
        ),
        (
            {"role": "assistant", "content": "ok"},
            "invalid message input={'role': 'assistant', 'content': 'ok'}: expected "
            "a string, a Message or a list of Messages, not a chat API's dict: "
            "Message.assistant('ok') (from turnfsm.messages)",
        ),
        (
            [("user", "hi")],  # LangChain's message pair
            "invalid message input[0]=('user', 'hi'): expected a Message, not a "
            "chat API's (role, text) pair: Message.user('hi') (from "
            "turnfsm.messages)",
        ),
        (
            [{"role": "tool", "content": "42"}],
            "invalid message input[0]={'role': 'tool', 'content': '42'}: expected "
            "a Message",
        ),
    ],
    ids=[
        "None",
        "empty",
        "list of strings",
        "list with a number",
        "list of chat dicts",
        "chat dict",
        "role and text pair",
        "tool dict",
    ],
)
async def test_a_run_input_that_is_no_message_says_what_was_expected(
    given: object, message: str
) -> None:
    # Each said what it wanted without "expected" ("input=None: a string, ...").
    with pytest.raises(InvalidMessage) as caught:
        await Agent(model=ScriptedModel.of("x")).run(given)  # type: ignore[arg-type]
    assert str(caught.value) == message


async def test_a_setting_changed_on_a_built_driver_is_the_one_runs_use() -> None:
    # It was checked, accepted, and ignored: a run made 3 model calls under
    # max_turns=1, and a tool taken away ran twice.
    ran: list[str] = []

    def lookup() -> str:
        """Look something up."""
        ran.append("lookup")
        return "found"

    model = ScriptedModel.of(
        reply("", tool_call("lookup", "c1")), reply("", tool_call("lookup", "c2")), "ok"
    )
    driver = Driver(model=model, tools=[lookup])

    driver.max_turns = 1
    driver.tools = []
    result = await driver.run("go")

    assert (driver.budget.max_turns, result.outcome, result.turns) == (1, "failed", 1)
    assert ran == []
    assert not model.requests[0].tools


def test_a_window_changed_on_a_built_driver_is_its_manager_s() -> None:
    driver = Driver(model=ScriptedModel.of("ok"), context_window=8_000)

    driver.context_window = 4_000

    assert driver.context is not None
    assert (driver.context.window, driver.budget.context_window) == (4_000, 4_000)


def test_a_setting_the_constructor_would_refuse_changes_nothing() -> None:
    driver = Driver(
        model=ScriptedModel.of("ok"), context_window=8_000, max_output_tokens=1_000
    )

    with pytest.raises(ConfigError, match="max_output_tokens=1000"):
        driver.context_window = 500
    with pytest.raises(ConfigError, match="max_turns=-5"):
        driver.max_turns = -5

    assert driver.context is not None
    assert (driver.context_window, driver.context.window) == (8_000, 8_000)
    assert driver.max_turns == driver.budget.max_turns == 50


def test_a_window_or_a_model_changed_on_a_built_driver_is_worked_out_again() -> None:
    # The window the driver had taken from the model (or its own fallback)
    # was carried into the rebuild as if given: a new window was refused, a
    # smaller model's too, and a bigger model's left the old window.
    class Sized:
        def __init__(self, window: int) -> None:
            self.context_window, self.model = window, f"m{window}"

        async def complete(self, request: object) -> str:
            return "ok"

    driver = Driver(model=ScriptedModel.of("ok"))
    driver.context_window = 8_000
    assert driver.context is not None
    assert driver.context.window == driver.budget.context_window == 8_000

    driver = Driver(model=ScriptedModel.of("ok"))
    windows = []
    for window in (16_000, 128_000, 16_000):
        driver.model = Sized(window)  # type: ignore[assignment]
        assert driver.context is not None
        windows.append(driver.context.window)
    assert windows == [16_000, 128_000, 16_000]
