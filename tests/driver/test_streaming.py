from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from turnfsm import Agent
from turnfsm.driver import Driver, RetryPolicy
from turnfsm.errors import ConfigError, OutputInvalid, ProviderError
from turnfsm.hooks import (
    Hook,
    ModelCallEnd,
    ModelCallInfo,
    TextDeltaInfo,
    TextDiscardedInfo,
)
from turnfsm.messages import Message
from turnfsm.providers import (
    ModelRequest,
    ModelResponse,
    StreamDone,
    StreamEvent,
    TextDelta,
)
from turnfsm.testing import reply, tool_call

pytestmark = pytest.mark.anyio


class StreamingModel:
    """Streams each scripted reply's text word by word, then the whole reply."""

    def __init__(self, *replies: Message) -> None:
        self.replies = list(replies)
        self.streamed = 0
        self.completed = 0

    async def complete(self, request: ModelRequest) -> ModelResponse:
        self.completed += 1
        return ModelResponse(message=self.replies.pop(0))

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        self.streamed += 1
        message = self.replies.pop(0)
        for word in message.text.split(" "):
            yield TextDelta(text=word + " ")
        yield StreamDone(response=ModelResponse(message=message))


def note(text: str) -> str:
    """Take a note.

    Args:
        text: the note.
    """
    return "noted"


async def test_run_stream_yields_text_as_it_arrives_and_the_brain_sees_one_reply() -> (
    None
):
    model = StreamingModel(
        reply("let me note", tool_call("note", "c1", text="x")),
        Message.assistant("all done now"),
    )
    agent = Agent(model=model, tools=[note])
    pieces: list[str] = []
    async with agent.run_stream("go") as stream:
        async for piece in stream:
            pieces.append(piece)
    assert pieces == ["let ", "me ", "note ", "all ", "done ", "now "]
    assert stream.result.text == "all done now"
    assert (model.streamed, model.completed) == (2, 0)
    events = [type(e).__name__ for e in agent.session.runs[0].events]
    assert events.count("ModelReplied") == 2


async def test_run_stream_without_a_streaming_model_yields_whole_replies() -> None:
    from turnfsm.testing import ScriptedModel

    agent = Agent(model=ScriptedModel.of("hello there"))
    async with agent.run_stream("hi") as stream:
        pieces = [piece async for piece in stream]
    assert pieces == ["hello there"]
    assert stream.result.ok


async def test_result_is_unavailable_until_the_run_ends() -> None:
    from turnfsm.testing import ScriptedModel

    agent = Agent(model=ScriptedModel.of("x"))
    async with agent.run_stream("hi") as stream:
        with pytest.raises(RuntimeError, match="not ended"):
            _ = stream.result
        _ = [p async for p in stream]
    assert stream.result.text == "x"


async def test_text_delta_hooks_trigger_streaming_and_plain_runs_do_not() -> None:
    class Collect(Hook):
        def __init__(self) -> None:
            self.infos: list[TextDeltaInfo] = []

        def on_text_delta(self, info: TextDeltaInfo) -> None:
            self.infos.append(info)

    hook = Collect()
    model = StreamingModel(Message.assistant("a b"))
    result = await Driver(model=model, hooks=[hook]).run("x")
    assert result.text == "a b"
    assert [(i.turn, i.text) for i in hook.infos] == [(1, "a "), (1, "b ")]
    model = StreamingModel(Message.assistant("a b"))
    await Driver(model=model).run("x")
    assert (model.streamed, model.completed) == (0, 1)


async def test_a_stream_without_a_final_reply_fails_the_run() -> None:
    from turnfsm.errors import ProviderError

    class Broken(StreamingModel):
        async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
            yield TextDelta(text="partial")

    agent = Agent(model=Broken(Message.assistant("unused")))
    async with agent.run_stream("x") as stream:
        _ = [p async for p in stream]
    assert isinstance(stream.result.error, ProviderError)
    assert stream.result.error.kind == "bad_stream"


class TwoAnswers(StreamingModel):
    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        yield TextDelta(text="first")
        yield StreamDone(response=ModelResponse(message=Message.assistant("first")))
        yield StreamDone(response=ModelResponse(message=Message.assistant("second")))


class Words(StreamingModel):
    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        yield "hello"  # type: ignore[misc]  # a str, not a TextDelta


class NumberText(StreamingModel):
    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        yield TextDelta(text=5)  # type: ignore[arg-type]  # not a str
        yield StreamDone(response=ModelResponse(message=Message.assistant("5")))


class Listed(StreamingModel):
    async def stream(self, request: ModelRequest) -> list[StreamEvent]:  # type: ignore[override]
        return [StreamDone(response=ModelResponse(message=Message.assistant("x")))]


@pytest.mark.parametrize(
    ("model", "value", "expected"),
    [
        (TwoAnswers(), "a second StreamDone", "and nothing after it"),
        (Words(), "'hello'", "TextDelta items, then one StreamDone"),
        (NumberText(), "TextDelta(text=5)", "TextDelta items whose text is a string"),
        (Listed(), "<coroutine object", "write stream() as an async generator"),
    ],
    ids=["two-replies", "not-a-text-delta", "text-not-a-string", "not-an-iterator"],
)
async def test_a_stream_that_breaks_its_contract_fails_the_run_naming_it(
    model: StreamingModel, value: str, expected: str
) -> None:
    from turnfsm.errors import InvalidReturn

    agent = Agent(model=model)
    async with agent.run_stream("x") as stream:
        _ = [p async for p in stream]

    error = stream.result.error
    assert isinstance(error, InvalidReturn)
    assert error.source == f"model {type(model).__name__}.stream()"
    assert error.value.startswith(value)
    assert expected in error.expected


class BreaksOnce:
    """Streams "one two three", but breaks off after "one " the first time."""

    def __init__(self) -> None:
        self.streamed = 0

    async def complete(self, request: ModelRequest) -> ModelResponse:
        raise AssertionError("the run streams")

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        self.streamed += 1
        yield TextDelta(text="one ")
        if self.streamed == 1:
            raise ProviderError("the stream broke", retryable=True, kind="server")
        yield TextDelta(text="two three")
        message = Message.assistant("one two three")
        yield StreamDone(response=ModelResponse(message=message))


FAST = RetryPolicy(initial_wait=0.01, jitter=False)


async def test_observers_hear_that_a_retried_streams_first_pieces_are_void() -> None:
    heard: list[object] = []

    class Collect(Hook):
        def on_text_delta(self, info: TextDeltaInfo) -> None:
            heard.append(info.text)

        def on_text_discarded(self, info: TextDiscardedInfo) -> None:
            heard.append(info)

    result = await Driver(model=BreaksOnce(), hooks=[Collect()], retry=FAST).run("x")
    assert result.text == "one two three"
    assert heard[0] == "one "
    assert heard[2:] == ["one ", "two three"]
    void = heard[1]
    assert isinstance(void, TextDiscardedInfo)
    assert (void.turn, void.attempt, void.text) == (1, 1, "one ")
    assert str(void.error) == "model provider error [server]: the stream broke"


async def test_the_void_text_is_heard_between_the_attempt_s_end_and_the_retry() -> None:
    heard: list[str] = []

    class Order(Hook):
        def on_model_call_start(self, info: ModelCallInfo) -> None:
            heard.append(f"start {info.attempt}")

        def on_model_call_end(self, info: ModelCallEnd) -> None:
            heard.append(f"end {info.call.attempt}")

        def on_text_discarded(self, info: TextDiscardedInfo) -> None:
            heard.append(f"discarded {info.attempt}")

    hooks = [Order(), Streams()]
    await Driver(model=BreaksOnce(), hooks=hooks, retry=FAST).run("x")
    assert heard == ["start 1", "end 1", "discarded 1", "start 2", "end 2"]


class Streams(Hook):
    """Turns streaming on, and no more."""

    def on_text_delta(self, info: TextDeltaInfo) -> None:
        pass


async def test_a_hook_without_on_text_discarded_still_streams_every_piece() -> None:
    heard: list[str] = []

    class Text(Hook):
        def on_text_delta(self, info: TextDeltaInfo) -> None:
            heard.append(info.text)

    result = await Driver(model=BreaksOnce(), hooks=[Text()], retry=FAST).run("x")
    assert (result.text, heard) == ("one two three", ["one ", "one ", "two three"])


@dataclasses.dataclass
class Count:
    """A count.

    Attributes:
        n: How many.
    """

    n: int


async def test_run_stream_pieces_say_a_rejected_structured_answer_was_void() -> None:
    # The answer that did not fit was streamed, then the one asked for again,
    # with nothing between: a reader building up the JSON got invalid text.
    model = StreamingModel(reply('{"n": "x"}'), reply('{"n": 1}'))
    agent = Agent(model=model, output_type=Count)
    async with agent.run_stream("count") as stream:
        pieces = [p async for p in stream.pieces()]
    assert [p if isinstance(p, str) else p.text for p in pieces] == [
        '{"n": ',
        '"x"} ',
        '{"n": "x"} ',  # the rejected answer, as TextDiscardedInfo
        '{"n": ',
        "1} ",
    ]
    void = pieces[2]
    assert isinstance(void, TextDiscardedInfo)
    assert (void.turn, void.attempt) == (1, 1)
    assert isinstance(void.error, OutputInvalid)
    assert void.error.errors == ('n: expected integer, got "x" (string)',)
    assert stream.result.output == Count(n=1)


async def test_run_stream_pieces_say_a_reply_refused_once_it_came_was_void() -> None:
    # A reply over the window is not committed; its streamed text went on
    # to the reader as though it were the answer.
    from turnfsm import ContextManager
    from turnfsm.core import ContextOverflowed

    long = " ".join(["word"] * 3_000)
    model = StreamingModel(reply(long), reply("short"))
    agent = Agent(model=model, context=ContextManager(context_window=2_000))
    async with agent.run_stream("talk") as stream:
        pieces = [p async for p in stream.pieces()]
    (void,) = [p for p in pieces if isinstance(p, TextDiscardedInfo)]
    assert void.text == long + " "
    (refused,) = [
        e for e in agent.session.runs[0].events if isinstance(e, ContextOverflowed)
    ]
    assert isinstance(void.error, ProviderError)
    assert (void.error.kind, str(void.error)) == (
        refused.error.type,
        str(ProviderError(refused.error.message, kind=refused.error.type)),
    )
    assert "it is not committed" in refused.error.message
    assert long not in stream.result.text


async def test_run_stream_pieces_say_where_a_retried_streams_text_was_void() -> None:
    agent = Agent(model=BreaksOnce(), retry=FAST)
    async with agent.run_stream("x") as stream:
        pieces = [p async for p in stream.pieces()]
    assert [p if isinstance(p, str) else p.text for p in pieces] == [
        "one ",
        "one ",  # the void text, as TextDiscardedInfo
        "one ",
        "two three",
    ]
    assert isinstance(pieces[1], TextDiscardedInfo)
    assert stream.result.text == "one two three"
    agent = Agent(model=BreaksOnce(), retry=FAST)
    async with agent.run_stream("x") as stream:
        text = [p async for p in stream]
    assert text == ["one ", "one ", "two three"]  # iterating yields text only


# How a newcomer first reaches for a stream, before reading that it is an
# async context manager: each is refused, typed and showing the use, and
# nothing runs (the model is never called, the session stays empty).
async def _async_for(agent: Agent) -> None:
    async for _ in agent.run_stream("hi"):  # type: ignore[attr-defined]
        pass


async def _await(agent: Agent) -> None:
    await agent.run_stream("hi")  # type: ignore[misc]


async def _with(agent: Agent) -> None:
    with agent.run_stream("hi"):  # type: ignore[attr-defined]
        pass


@pytest.mark.parametrize(
    ("misuse", "how", "fix"),
    [
        (_async_for, "async for ... in agent.run_stream(...)", "async with first"),
        (_await, "await agent.run_stream(...)", "async with, not await"),
        (_with, "with agent.run_stream(...)", "async with, not with"),
    ],
)
async def test_run_stream_used_without_async_with_says_how_it_is_used(
    misuse: Callable[[Agent], Awaitable[None]], how: str, fix: str
) -> None:
    model = StreamingModel(Message.assistant("hello"))
    agent = Agent(model=model)
    with pytest.raises(ConfigError) as caught:
        await misuse(agent)
    assert (caught.value.field, caught.value.value) == ("run_stream", how)
    assert str(caught.value) == (
        f"invalid run_stream={how!r}: expected {fix}: async with "
        "agent.run_stream(...) as stream: async for text in stream: ... "
        "(then stream.result)"
    )
    assert (model.streamed, model.completed, agent.session.runs) == (0, 0, [])
    async with agent.run_stream("hi") as stream:  # the right use still works
        assert [text async for text in stream] == ["hello "]
    assert stream.result.text == "hello"


async def test_a_stream_read_after_its_block_is_refused_its_result_kept() -> None:
    agent = Agent(model=StreamingModel(Message.assistant("hello there")))
    async with agent.run_stream("hi") as stream:
        pass  # the block waits for the run's end, unread
    assert stream.result.text == "hello there"
    for read in (stream.__aiter__(), stream.pieces()):
        with pytest.raises(ConfigError) as caught:
            await read.__anext__()
        assert str(caught.value).startswith(
            "invalid run_stream='reading the stream after its async with block': "
            "expected a read inside the block: async with agent.run_stream(...)"
        )


async def test_an_opening_of_run_stream_is_entered_once() -> None:
    agent = Agent(model=StreamingModel(Message.assistant("a"), Message.assistant("b")))
    opening = agent.run_stream("hi")
    async with opening as stream:
        assert [text async for text in stream] == ["a "]
    with pytest.raises(ConfigError, match="'entered twice': expected call run_stream"):
        async with opening:
            pass


async def test_a_stream_whose_client_left_names_the_calls_that_free_the_session() -> (
    None
):
    # A web handler streams a run as server-sent events; the browser tab
    # closes and the server closes the generator. The run is interrupted,
    # and the session's next run was refused saying the run was "paused,
    # or its process died", neither of which was so, naming no call.
    import anyio

    from turnfsm.errors import SessionBusy

    class Slow(StreamingModel):
        async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
            yield TextDelta(text="one ")
            await anyio.sleep(60)  # the rest is still on its way
            yield StreamDone(response=ModelResponse(message=reply("one")))

    agent = Agent(model=Slow(reply("again")))

    async def events() -> AsyncIterator[str]:
        async with agent.run_stream("hi") as stream:
            async for piece in stream:
                yield f"data: {piece}\n\n"

    body = events()
    assert await body.__anext__() == "data: one \n\n"
    await body.aclose()  # the client is gone
    (run,) = agent.session.runs
    assert run.outcome == "interrupted"

    with pytest.raises(SessionBusy) as caught:
        await agent.run("next")
    ids = f"{agent.session.id!r}, {run.run_id!r}"
    assert str(caught.value) == (
        f"session {agent.session.id!r} has an open run {run.run_id!r} (paused, "
        "interrupted, or its process died); resume or abandon it first (await "
        f"agent.resume({ids}, ...) or await agent.abandon({ids}))"
    )
    ended = await agent.abandon(agent.session.id, run.run_id)
    assert ended.outcome == "failed"
    assert (await agent.run("next")).text == "again"


async def test_run_stream_takes_an_output_type_as_run_does() -> None:
    # run(..., output_type=City) worked; run_stream(..., output_type=City)
    # was a TypeError, so a streamed run could not ask for a structured answer.
    import dataclasses

    @dataclasses.dataclass
    class City:
        name: str

    agent = Agent(model=StreamingModel(reply('{"name": "Lisbon"}')))
    async with agent.run_stream("A city?", output_type=City) as stream:
        pieces = [piece async for piece in stream]
    assert "".join(pieces).strip() == '{"name": "Lisbon"}'
    assert stream.result.output == City(name="Lisbon")


class HoldsAConnection:
    """Yields a piece, then `then`; says when its stream was closed."""

    def __init__(self, then: object) -> None:
        self.then = then
        self.closed = False

    async def complete(self, request: ModelRequest) -> ModelResponse:
        raise AssertionError("the run streams")

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        try:  # as the shipped clients hold their HTTP response
            yield TextDelta(text="one ")
            yield self.then  # type: ignore[misc]
            yield StreamDone(response=ModelResponse(message=Message.assistant("x")))
        finally:
            self.closed = True


class Raises(Hook):
    def on_text_delta(self, info: TextDeltaInfo) -> None:
        raise RuntimeError("a hook's bug")


async def test_a_stream_the_run_stops_reading_is_closed_at_once() -> None:
    """A stream left mid-way (an item it should not yield, a strict hook that
    raises) is closed then, not when it is garbage-collected: a client's
    HTTP response goes back with it."""
    model = HoldsAConnection("not a stream event")
    agent = Agent(model=model)
    async with agent.run_stream("x") as stream:
        _ = [p async for p in stream]
    assert stream.result.outcome == "failed"
    assert model.closed

    model = HoldsAConnection(TextDelta(text="two"))
    agent = Agent(model=model, hooks=[Raises()], strict_hooks=True)
    with pytest.raises(RuntimeError, match="a hook's bug"):
        await agent.run("x")
    assert model.closed


class Unreachable(Hook):
    def on_text_delta(self, info: TextDeltaInfo) -> None:
        raise ConnectionError("the hook's metrics server is down")


async def test_a_strict_text_hook_s_connection_error_is_never_retried() -> None:
    # It was taken for the model's: streamed again up to the retry
    # policy's attempts, and the run ended failed blaming the model.
    model = StreamingModel(*[Message.assistant("the answer")] * 3)
    agent = Agent(
        model=model,
        hooks=[Unreachable()],
        strict_hooks=True,
        retry=RetryPolicy(max_attempts=3, initial_wait=0, jitter=False),
    )
    with pytest.raises(ConnectionError, match="metrics server"):
        await agent.run("x")
    assert model.streamed == 1
    assert str(agent.session.runs[0].error).startswith("run crashed on ConnectionError")
