"""OpenAI-compatible streams of every shape a server sends, on the wire.

Framing the spec allows (``data:`` with no space, comments, ``event:``,
``id:`` and ``retry:`` lines, an event's data over several lines, CRLF, a
second ``[DONE]``, each byte its own write), tool calls in many pieces,
and replies that never say why they ended or that refuse: each is read as
the OpenAI SDK and the server-sent events spec read it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.providers.test_wire import (
    _anthropic,
    _choice,
    _chunk,
    _Listening,
    _openai,
    _serve,
    _streamed,
    _Wire,
    asyncio_only,
    wire,
)
from turnfsm import Agent, ContextManager, RetryPolicy
from turnfsm.errors import CONTENT_FILTER, ProviderError
from turnfsm.messages import Message, Role
from turnfsm.persistence import Session
from turnfsm.persistence.sqlite import SQLiteStore
from turnfsm.providers import ModelRequest, ToolSchema
from turnfsm.providers._anthropic import AnthropicModel
from turnfsm.providers._openai import OpenAIModel
from turnfsm.providers._stream import StreamDone, TextDelta

__all__ = ["wire"]  # the fixture, served here too

pytestmark = [pytest.mark.anyio, asyncio_only]

USAGE = {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9}
TEXT = "naïve café ✓ 日本"


def _body(*chunks: bytes) -> bytes:
    return b"".join(chunks)


def _whole(text: str = TEXT) -> bytes:
    return _body(
        _chunk(choices=_choice({"role": "assistant", "content": text})),
        _chunk(choices=_choice({}, "stop")),
        _chunk(choices=[], usage=USAGE),
        b"data: [DONE]\n\n",
    )


def _data_over_lines() -> bytes:
    """The first chunk's JSON over several ``data:`` lines (joined by LF)."""
    first = {
        "id": "x",
        "object": "chat.completion.chunk",
        "model": "m",
        "choices": _choice({"role": "assistant", "content": TEXT}),
    }
    lines = json.dumps(first, indent=1, ensure_ascii=False).replace("\n", "\ndata: ")
    return f"data: {lines}\n\n".encode() + _whole().split(b"\n\n", 1)[1]


FRAMINGS = {
    "each byte its own write": [bytes([b]) for b in _whole()],
    "data: with no space": [_whole().replace(b"data: ", b"data:")],
    "comments": [b": ping\n\n" + _whole().replace(b"\n\n", b"\n: ping\n\n")],
    "event: message lines": [_whole().replace(b"data: ", b"event: message\ndata: ")],
    "id: and retry: lines": [_whole().replace(b"data: ", b"id: 7\nretry: 10\ndata: ")],
    "data over several lines": [_data_over_lines()],
    "CRLF, split inside a character": [
        _whole().replace(b"\n", b"\r\n")[:40],
        0.05,
        _whole().replace(b"\n", b"\r\n")[40:],
    ],
    "[DONE] twice": [_whole() + b"data: [DONE]\n\n"],
    "no [DONE]": [_whole().removesuffix(b"data: [DONE]\n\n")],
}


@pytest.mark.parametrize("pieces", FRAMINGS.values(), ids=FRAMINGS.keys())
async def test_an_openai_stream_reads_whole_however_it_is_framed(
    wire: tuple[str, type[_Wire]], pieces: list[bytes | float]
) -> None:
    url, handler = wire
    handler.pieces = pieces
    with anyio.fail_after(20):
        events = await _streamed(_openai(url))
    done = events[-1]
    assert isinstance(done, StreamDone)
    assert done.response.message.text == TEXT
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == TEXT
    assert (done.response.finish_reason, done.response.usage) != ("stop", None)
    assert handler.posts == 1


LOOK = ToolSchema(
    name="look", description="Look.", parameters={"type": "object", "properties": {}}
)


def _ask_with_tools() -> ModelRequest:
    return ModelRequest(messages=[Message.user("hi")], tools=[LOOK], max_tokens=50)


def _called(*fragments: dict[str, Any]) -> bytes:
    return _body(
        *(_chunk(choices=_choice({"tool_calls": [f]})) for f in fragments),
        _chunk(choices=_choice({}, "tool_calls")),
        _chunk(choices=[], usage=USAGE),
        b"data: [DONE]\n\n",
    )


async def test_a_call_s_arguments_over_fifty_deltas_are_one_call(
    wire: tuple[str, type[_Wire]],
) -> None:
    url, handler = wire
    arguments = json.dumps({"query": "x" * 90 + "é✓", "n": 12345}, ensure_ascii=False)
    size = len(arguments)
    pieces = [arguments[i * size // 50 : (i + 1) * size // 50] for i in range(50)]
    assert all(pieces)
    first = {"index": 0, "id": "call_1", "type": "function"}
    fragments = [dict(first, function={"name": "look", "arguments": pieces[0]})]
    fragments += [{"index": 0, "function": {"arguments": p}} for p in pieces[1:]]
    handler.pieces = [bytes([b]) for b in _called(*fragments)]  # cut anywhere
    with anyio.fail_after(30):
        events = [e async for e in _openai(url).stream(_ask_with_tools())]
    done = events[-1]
    assert isinstance(done, StreamDone)
    [call] = done.response.message.tool_calls
    assert (call.id, call.name, call.arguments) == (
        "call_1",
        "look",
        json.loads(arguments),
    )
    assert done.response.finish_reason == "tool_calls"


async def test_calls_whose_index_jumps_are_the_calls_sent(
    wire: tuple[str, type[_Wire]],
) -> None:
    url, handler = wire

    def opened(index: int, call_id: str) -> dict[str, Any]:
        function = {"name": "look", "arguments": '{"q": '}
        return {"index": index, "id": call_id, "type": "function", "function": function}

    handler.pieces = [
        _called(
            opened(0, "a"),
            opened(2, "b"),  # index 1 never comes
            {"index": 2, "function": {"arguments": "2}"}},
            {"index": 0, "function": {"arguments": "1}"}},
        )
    ]
    with anyio.fail_after(20):
        events = [e async for e in _openai(url).stream(_ask_with_tools())]
    done = events[-1]
    assert isinstance(done, StreamDone)
    calls = [(c.id, c.arguments) for c in done.response.message.tool_calls]
    assert calls == [("a", {"q": 1}), ("b", {"q": 2})]


# -- replies that never say why they ended ----------------------------------------

EMPTY_UNENDED = {
    "a role, then the usage": [
        _chunk(choices=_choice({"role": "assistant"})),
        _chunk(choices=[], usage=USAGE),
    ],
    "a choice with no delta, then the usage": [
        _chunk(choices=[{"index": 0, "finish_reason": None}]),
        _chunk(choices=[], usage=USAGE),
    ],
}

CALL = {
    "index": 0,
    "id": "c",
    "type": "function",
    "function": {"name": "look", "arguments": "{}"},
}
TEXT_HI = {"role": "assistant", "content": "Hi"}
A_CALL = {"role": "assistant", "tool_calls": [CALL]}
SAID_UNENDED = {  # a stream's chunks, and the message the body holds instead
    "text, then the usage": (
        [_chunk(choices=_choice(TEXT_HI)), _chunk(choices=[], usage=USAGE)],
        TEXT_HI,
    ),
    "text, then [DONE] alone": ([_chunk(choices=_choice(TEXT_HI))], TEXT_HI),
    "a whole call, then the usage": (
        [_chunk(choices=_choice(A_CALL)), _chunk(choices=[], usage=USAGE)],
        A_CALL,
    ),
}


@pytest.mark.parametrize("chunks", EMPTY_UNENDED.values(), ids=EMPTY_UNENDED.keys())
async def test_a_whole_stream_with_nothing_in_it_and_no_finish_reason_is_no_reply(
    wire: tuple[str, type[_Wire]], chunks: list[bytes]
) -> None:
    # It passed as a reply with finish reason None: an empty one ("") when
    # nothing came, as if the model had said nothing.
    url, handler = wire
    handler.pieces = [_body(*chunks, b"data: [DONE]\n\n")]
    with anyio.fail_after(20), pytest.raises(ProviderError) as raised:
        await _streamed(_openai(url))
    assert (raised.value.kind, raised.value.retryable) == ("bad_response", False)
    assert "no content, no tool call and no finish_reason" in str(raised.value)
    assert handler.posts == 1


@pytest.mark.parametrize(
    ("chunks", "message"), SAID_UNENDED.values(), ids=SAID_UNENDED.keys()
)
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_a_whole_reply_with_no_finish_reason_stands_streamed_or_not(
    wire: tuple[str, type[_Wire]],
    chunks: list[bytes],
    message: dict[str, Any],
    stream: bool,
) -> None:
    # Unstreamed, it stood; streamed to its end, it failed as bad_response:
    # the same reply, two verdicts.
    url, handler = wire
    model = _openai(url)
    if stream:
        handler.pieces = [_body(*chunks, b"data: [DONE]\n\n")]
        done = (await _streamed(model))[-1]
        assert isinstance(done, StreamDone)
        response = done.response
    else:
        handler.kind = "application/json"
        handler.pieces = [_completion(message, None)]
        response = await model.complete(ModelRequest(messages=[Message.user("hi")]))
    assert response.finish_reason is None
    said = (response.message.text, [c.name for c in response.message.tool_calls])
    assert said == (
        message.get("content", ""),
        ["look"] if "tool_calls" in message else [],
    )
    assert handler.posts == 1


async def test_a_stream_cut_before_its_end_is_no_reply_though_it_said_something(
    wire: tuple[str, type[_Wire]],
) -> None:
    # No finish_reason, no usage, no [DONE]: the body just ended, as one a
    # gateway cut short does; its text is not the whole reply.
    url, handler = wire
    handler.pieces = [_chunk(choices=_choice({"role": "assistant", "content": "Hi"}))]
    with anyio.fail_after(20), pytest.raises(ProviderError) as raised:
        await _streamed(_openai(url))
    assert (raised.value.kind, raised.value.retryable) == ("connection", True)
    assert "broke off" in str(raised.value)


def _completion(message: dict[str, Any], finish: str | None) -> bytes:
    choice = {"index": 0, "message": message, "finish_reason": finish}
    body = {"id": "x", "object": "chat.completion", "model": "m", "choices": [choice]}
    return json.dumps(dict(body, usage=USAGE)).encode()


@pytest.mark.parametrize(
    "message",
    [{"role": "assistant"}, {"role": "assistant", "content": ""}],
    ids=["no content", "empty content"],
)
async def test_a_reply_with_nothing_in_it_and_no_finish_reason_is_no_reply(
    wire: tuple[str, type[_Wire]], message: dict[str, Any]
) -> None:
    url, handler = wire
    handler.kind = "application/json"
    handler.pieces = [_completion(message, None)]
    with pytest.raises(ProviderError) as raised:
        await _openai(url).complete(ModelRequest(messages=[Message.user("hi")]))
    assert raised.value.kind == "bad_response"
    assert "no finish_reason" in str(raised.value)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_an_empty_reply_that_says_stop_stands(
    wire: tuple[str, type[_Wire]], stream: bool
) -> None:
    url, handler = wire
    if stream:
        handler.pieces = [_whole("")]
    else:
        handler.kind = "application/json"
        handler.pieces = [_completion({"role": "assistant", "content": ""}, "stop")]
    model = _openai(url)
    request = ModelRequest(messages=[Message.user("hi")])
    if stream:
        done = (await _streamed(model))[-1]
        assert isinstance(done, StreamDone)
        response = done.response
    else:
        response = await model.complete(request)
    assert (response.message.text, response.finish_reason) == ("", "stop")


# -- a refusal ends a run the same way from either provider -------------------------


def _refusing(handler: type[_Wire], stream: bool) -> None:
    """Have `handler` answer as OpenAI does when its model refuses."""
    if not stream:
        handler.kind = "application/json"
        message = {"role": "assistant", "content": None, "refusal": "I can't help."}
        handler.pieces = [_completion(message, "stop")]
        return
    handler.pieces = [
        _body(
            _chunk(choices=_choice({"role": "assistant", "refusal": ""})),
            _chunk(choices=_choice({"refusal": "I can't"})),
            _chunk(choices=_choice({"refusal": " help."})),
            _chunk(choices=_choice({}, "stop")),
            _chunk(choices=[], usage=USAGE),
            b"data: [DONE]\n\n",
        )
    ]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_a_refusal_fails_a_run_once_quoting_it_whichever_the_provider(
    wire: tuple[str, type[_Wire]], tmp_path: Path, provider: str, stream: bool
) -> None:
    # OpenAI's refusal (finish reason "stop") stood as the run's answer,
    # done, where Anthropic's failed the run.
    url, handler = wire
    model: OpenAIModel | AnthropicModel
    if provider == "openai":
        _refusing(handler, stream)
        model, said = _openai(url), "I can't help."
    else:
        why = {"type": "refusal", "explanation": "I can't help."}
        _serve(handler, stream, "refusal", stop_details=why)
        model, said = _anthropic(url), "I can't help."
    agent = Agent(
        model=model,
        context=ContextManager(context_window=8_000),
        retry=RetryPolicy(max_attempts=3, initial_wait=0.01, max_wait=0.01),
        store=SQLiteStore(tmp_path / "s.db"),
        hooks=[_Listening()] if stream else [],  # a listener: the run streams
    )
    with anyio.fail_after(20):
        result = await agent.run("hi")
    assert result.outcome == "failed"
    assert isinstance(result.error, ProviderError)
    assert (result.error.kind, result.error.retryable) == (CONTENT_FILTER, False)
    assert said in str(result.error)
    assert handler.posts == 1
    session = await Session.load(agent.store, agent.session.id)
    assert not any(m.role is Role.ASSISTANT for m in session.history)
