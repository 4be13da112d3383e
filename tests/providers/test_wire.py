"""The Anthropic and OpenAI clients on the wire, against a real local HTTP server.

The server keeps each request's JSON and writes its answer in the pieces a
test gives (each its own TCP write, with pauses where asked), then holds
the connection open or closes it: a stream whose reply is whole but whose
server never ends it, an event split inside a UTF-8 character, CRLF line
endings, a data line over a megabyte, an error event mid-reply.
"""

from __future__ import annotations

import email.utils
import http.server
import json
import logging
import select
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import anyio
import pytest

from tests.helpers import http_server
from turnfsm import Agent, ContextManager, RetryPolicy
from turnfsm.context import keep_parts
from turnfsm.core import Usage
from turnfsm.errors import ProviderError
from turnfsm.messages import Message
from turnfsm.persistence import Session
from turnfsm.persistence.sqlite import SQLiteStore
from turnfsm.providers import ModelRequest, ToolSchema, _sdk
from turnfsm.providers._anthropic import AnthropicModel
from turnfsm.providers._openai import OpenAIModel
from turnfsm.providers._stream import StreamDone, StreamEvent, TextDelta

pytestmark = pytest.mark.anyio

# The OpenAI SDK leaves an inner async generator unfinished after "[DONE]",
# which trio warns about: its streams run on asyncio only.
asyncio_only = pytest.mark.parametrize("anyio_backend", ["asyncio"])

HOLD_AT_MOST = 20.0
"""Seconds the server holds a connection open after its pieces."""


class _Wire(http.server.BaseHTTPRequestHandler):
    """Answers each POST with `pieces`, written apart; then holds or closes.

    A piece is bytes to write, or a float: seconds to pause. With `hold`
    not None the connection stays open after the pieces, `hold` written
    every 50 ms (b"" writes nothing), until the client leaves.
    """

    pieces: ClassVar[list[bytes | float]] = []
    hold: ClassVar[bytes | None] = None
    status: ClassVar[int] = 200
    kind: ClassVar[str] = "text/event-stream"
    sent: ClassVar[dict[str, str]] = {}
    length: ClassVar[int | None] = None  # a Content-Length to promise
    bodies: ClassVar[list[Any]] = []
    posts = 0

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        type(self).bodies = [*self.bodies, json.loads(body)]
        type(self).posts += 1
        self.send_response(self.status)
        self.send_header("Content-Type", self.kind)
        for name, value in self.sent.items():
            self.send_header(name, value)
        if self.length is not None:  # more than it sends: the body breaks off
            self.send_header("Content-Length", str(self.length))
        self.end_headers()  # else no length: the body ends with the connection
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            for piece in self.pieces:
                if isinstance(piece, float):
                    time.sleep(piece)
                else:
                    self.wfile.write(piece)
            if self.hold is not None:
                self._hold(self.hold)
        except OSError:
            return  # the client left

    def _hold(self, ping: bytes) -> None:
        end = time.monotonic() + HOLD_AT_MOST
        while time.monotonic() < end:
            time.sleep(0.05)
            if ping:
                self.wfile.write(ping)
            ready, _, _ = select.select([self.connection], [], [], 0)
            if ready and not self.connection.recv(1, socket.MSG_PEEK):
                return  # the client closed its end

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture
def wire() -> Iterator[tuple[str, type[_Wire]]]:
    with http_server(_Wire) as (url, served):
        yield url, served


@pytest.fixture
def short_wait(monkeypatch: pytest.MonkeyPatch) -> float:
    """A short `AFTER_STOP_WAIT`, so a held stream is left quickly."""
    monkeypatch.setattr(_sdk, "AFTER_STOP_WAIT", 0.5, raising=False)
    return 0.5


def _ask() -> ModelRequest:
    return ModelRequest(messages=[Message.user("hi")], max_tokens=50)


def _anthropic(url: str) -> AnthropicModel:
    return AnthropicModel("claude-x", base_url=url, api_key="k", timeout=30)


def _openai(url: str) -> OpenAIModel:
    return OpenAIModel("m", base_url=f"{url}/v1", api_key="k", timeout=30)


async def _streamed(model: AnthropicModel | OpenAIModel) -> list[StreamEvent]:
    return [event async for event in model.stream(_ask())]


async def _answer(model: AnthropicModel | OpenAIModel, stream: bool) -> object:
    if stream:
        return await _streamed(model)
    return await model.complete(_ask())


async def _drain(model: AnthropicModel | OpenAIModel, into: list[StreamEvent]) -> None:
    async for event in model.stream(_ask()):
        into.append(event)


def _event(data: dict[str, Any], newline: str = "\n") -> bytes:
    """One named Anthropic event."""
    said = json.dumps(data, ensure_ascii=False)  # UTF-8 on the wire, as Anthropic's
    text = f"event: {data['type']}{newline}data: {said}{newline}{newline}"
    return text.encode()


def _chunk(newline: str = "\n", **data: Any) -> bytes:
    """One OpenAI chunk."""
    body = {"id": "x", "object": "chat.completion.chunk", "model": "m", **data}
    return f"data: {json.dumps(body, ensure_ascii=False)}{newline}{newline}".encode()


def _choice(delta: dict[str, Any], finish: str | None = None) -> list[dict[str, Any]]:
    return [{"index": 0, "delta": delta, "finish_reason": finish}]


def _message_start(input_tokens: int = 9) -> dict[str, Any]:
    message = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-x",
        "content": [],
        "stop_reason": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": 1},
    }
    return {"type": "message_start", "message": message}


def _anthropic_text(*pieces: str) -> list[dict[str, Any]]:
    block = {"type": "text", "text": ""}
    events = [
        _message_start(),
        {"type": "content_block_start", "index": 0, "content_block": block},
    ]
    events += [
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "text_delta", "text": p},
        }
        for p in pieces
    ]
    events.append({"type": "content_block_stop", "index": 0})
    return events


def _stopped(output_tokens: int = 4, reason: str = "end_turn") -> dict[str, Any]:
    return {
        "type": "message_delta",
        "delta": {"stop_reason": reason, "stop_sequence": None},
        "usage": {"output_tokens": output_tokens},
    }


PING = _event({"type": "ping"})


# -- a whole reply on a stream the server holds open ---------------------------


async def test_an_anthropic_stream_held_open_after_its_stop_reason_is_whole(
    wire: tuple[str, type[_Wire]], short_wait: float
) -> None:
    # message_delta carries the stop reason and the last usage; the server
    # then sent only pings: the stream waited for the model timeout, and
    # the run asked (and paid) for the same reply again.
    url, handler = wire
    handler.pieces = [_event(e) for e in (*_anthropic_text("Hi"), _stopped(4))]
    handler.hold = PING
    started = time.monotonic()
    with anyio.fail_after(10):
        events = await _streamed(_anthropic(url))
    assert time.monotonic() - started < short_wait + 5
    done = events[-1]
    assert isinstance(done, StreamDone)
    assert done.response.message.text == "Hi"
    assert done.response.usage == Usage(input_tokens=9, output_tokens=4)
    assert done.response.finish_reason == "stop"
    assert handler.posts == 1


async def test_an_anthropic_stream_that_ends_after_its_stop_reason_is_whole(
    wire: tuple[str, type[_Wire]],
) -> None:
    url, handler = wire
    handler.pieces = [_event(e) for e in (*_anthropic_text("Hi"), _stopped(4))]
    done = (await _streamed(_anthropic(url)))[-1]
    assert isinstance(done, StreamDone)
    assert done.response.usage == Usage(input_tokens=9, output_tokens=4)


@pytest.mark.parametrize("stopped", [True, False])
async def test_an_anthropic_stream_broken_off_after_its_stop_reason_is_whole(
    wire: tuple[str, type[_Wire]], stopped: bool
) -> None:
    url, handler = wire
    events = [*_anthropic_text("Hi"), _stopped(4)] if stopped else _anthropic_text("Hi")
    handler.pieces = [_event(e) for e in events]
    handler.length = 100_000
    if not stopped:
        with pytest.raises(ProviderError) as raised:
            await _streamed(_anthropic(url))
        assert (raised.value.kind, raised.value.retryable) == ("connection", True)
        assert "broke off" in str(raised.value)
        return
    done = (await _streamed(_anthropic(url)))[-1]
    assert isinstance(done, StreamDone)
    assert done.response.usage == Usage(input_tokens=9, output_tokens=4)


async def test_an_anthropic_stream_held_open_before_its_stop_reason_waits(
    wire: tuple[str, type[_Wire]], short_wait: float
) -> None:
    # Pings before the stop reason: the model may still be thinking.
    url, handler = wire
    handler.pieces = [_event(e) for e in _anthropic_text("Hi")]
    handler.hold = PING
    with anyio.move_on_after(short_wait * 4) as scope:
        await _streamed(_anthropic(url))
    assert scope.cancelled_caught


@asyncio_only
@pytest.mark.parametrize("hold", [b"", b": keep-alive\n\n"])
async def test_an_openai_stream_held_open_after_its_finish_reason_ends(
    wire: tuple[str, type[_Wire]], short_wait: float, hold: bytes
) -> None:
    # The OpenAI SDK reads until [DONE] or the read timeout: the usage
    # comes after the finish_reason, so the stream waits for it, a while.
    url, handler = wire
    handler.pieces = [
        _chunk(choices=_choice({"role": "assistant", "content": "Hi"})),
        _chunk(choices=_choice({}, "stop")),
    ]
    handler.hold = hold
    started = time.monotonic()
    with anyio.fail_after(10):
        events = await _streamed(_openai(url))
    assert time.monotonic() - started >= short_wait  # the usage had its chance
    done = events[-1]
    assert isinstance(done, StreamDone)
    assert (done.response.message.text, done.response.usage) == ("Hi", None)
    assert done.response.finish_reason == "stop"
    assert handler.posts == 1


@asyncio_only
async def test_an_openai_streams_usage_that_comes_promptly_is_kept(
    wire: tuple[str, type[_Wire]], short_wait: float
) -> None:
    url, handler = wire
    usage = {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9}
    handler.pieces = [
        _chunk(choices=_choice({"role": "assistant", "content": "Hi"})),
        _chunk(choices=_choice({}, "stop")),
        short_wait / 5,
        _chunk(choices=[], usage=usage),
    ]
    handler.hold = b""
    with anyio.fail_after(10):
        done = (await _streamed(_openai(url)))[-1]
    assert isinstance(done, StreamDone)
    assert done.response.usage == Usage(input_tokens=7, output_tokens=2)


# -- thinking kept with a reply whose parts were filtered ------------------------

THOUGHT_A = {"type": "thinking", "thinking": "First echo a.", "signature": "c2ln"}
THOUGHT_B = {"type": "redacted_thinking", "data": "b3BhcXVl"}


def _call(call_id: str, text: str) -> dict[str, Any]:
    return {"type": "tool_use", "id": call_id, "name": "echo", "input": {"text": text}}


def _reply(*blocks: dict[str, Any], stop: str = "tool_use") -> bytes:
    body = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-x",
        "content": list(blocks),
        "stop_reason": stop,
        "usage": {"input_tokens": 9, "output_tokens": 4},
    }
    return json.dumps(body).encode()


ECHO = ToolSchema(
    name="echo",
    description="Echo the text back.",
    parameters={"type": "object", "properties": {"text": {"type": "string"}}},
)


@pytest.mark.parametrize(
    ("keep", "sent"),
    [
        # Call a dropped: both thoughts go before call b, in their order (the
        # second one was sent after call b, where Anthropic refuses it).
        ([1], [THOUGHT_A, THOUGHT_B, _call("toolu_b", "b")]),
        # Call b dropped: the thought that led to it goes with it (it was
        # sent past the message's end).
        ([0], [THOUGHT_A, _call("toolu_a", "a")]),
        ([0, 1], [THOUGHT_A, _call("toolu_a", "a"), THOUGHT_B, _call("toolu_b", "b")]),
    ],
)
async def test_filtered_parts_keep_their_thinking_before_the_calls_it_preceded(
    wire: tuple[str, type[_Wire]], keep: list[int], sent: list[dict[str, Any]]
) -> None:
    url, handler = wire
    handler.kind = "application/json"
    handler.pieces = [
        _reply(THOUGHT_A, _call("toolu_a", "a"), THOUGHT_B, _call("toolu_b", "b"))
    ]
    model = _anthropic(url)
    reply = (await model.complete(ModelRequest(messages=[Message.user("hi")]))).message
    kept = keep_parts(reply, keep)
    assert kept is not None
    results = [
        Message.tool_result(call.id, call.arguments["text"]) for call in kept.tool_calls
    ]
    handler.pieces = [_reply({"type": "text", "text": "done"}, stop="end_turn")]
    request = ModelRequest(messages=[Message.user("hi"), kept, *results], tools=[ECHO])
    await model.complete(request)
    assert handler.bodies[1]["messages"][1] == {"role": "assistant", "content": sent}


# -- the newer stop reasons ------------------------------------------------------


def _serve(handler: type[_Wire], stream: bool, stop: str, **details: Any) -> None:
    """Have `handler` answer "The answer is" stopped by `stop`, streamed or not."""
    if not stream:
        body = json.loads(_reply({"type": "text", "text": "The answer is"}, stop=stop))
        body.update(details)
        handler.kind = "application/json"
        handler.pieces = [json.dumps(body).encode()]
        return
    last = _stopped(4, stop)
    last["delta"].update(details)
    handler.pieces = [_event(e) for e in (*_anthropic_text("The answer is"), last)]
    handler.pieces.append(_event({"type": "message_stop"}))


@pytest.mark.parametrize("stream", [False, True])
async def test_a_reply_cut_at_the_models_window_is_a_context_overflow(
    wire: tuple[str, type[_Wire]], stream: bool
) -> None:
    # It read as a reply cut by its budget (finish reason "length"): with
    # text, the run took the cut text as its answer.
    url, handler = wire
    _serve(handler, stream, "model_context_window_exceeded")
    model = _anthropic(url)
    with pytest.raises(ProviderError) as raised:
        await _answer(model, stream)
    assert raised.value.is_context_overflow
    assert "model_context_window_exceeded" in str(raised.value)
    assert "after 4 output tokens on 9 input tokens" in str(raised.value)
    # Billed all the same: the run counts it.
    assert raised.value.usage == Usage(input_tokens=9, output_tokens=4)


@pytest.mark.parametrize("stream", [False, True])
async def test_a_refused_reply_is_no_answer_and_not_retried(
    wire: tuple[str, type[_Wire]], stream: bool
) -> None:
    # The classifier cut the reply mid-way ("The answer is"): read as a
    # content_filter reply with text, the run took it as its answer, and
    # the session kept it (Anthropic refuses such a conversation again).
    url, handler = wire
    why = {"type": "refusal", "explanation": "Stopped by policy."}
    _serve(handler, stream, "refusal", stop_details=why)
    model = _anthropic(url)
    with pytest.raises(ProviderError) as raised:
        await _answer(model, stream)
    assert (raised.value.kind, raised.value.retryable) == ("content_filter", False)
    assert "Stopped by policy." in str(raised.value)
    assert "'The answer is'" in str(raised.value)
    assert raised.value.usage == Usage(input_tokens=9, output_tokens=4)


@pytest.mark.parametrize("stream", [False, True])
async def test_a_paused_turn_is_not_taken_for_a_whole_reply(
    wire: tuple[str, type[_Wire]], stream: bool
) -> None:
    url, handler = wire
    _serve(handler, stream, "pause_turn")
    model = _anthropic(url)
    with pytest.raises(ProviderError) as raised:
        await _answer(model, stream)
    assert (raised.value.kind, raised.value.retryable) == ("bad_response", False)
    assert "pause_turn" in str(raised.value)
    assert raised.value.usage == Usage(input_tokens=9, output_tokens=4)


# -- more faults, on both clients ---------------------------------------------------

BIG = "é" * 600_000  # a data line of 1.2 MB (as UTF-8), in one text delta


def _anthropic_body(text: str, newline: str = "\n") -> bytes:
    events = (*_anthropic_text(text), _stopped(4), {"type": "message_stop"})
    return b"".join(_event(e, newline) for e in events)


def _openai_body(text: str, newline: str = "\n") -> bytes:
    usage = {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9}
    return b"".join(
        [
            _chunk(newline, choices=_choice({"role": "assistant", "content": text})),
            _chunk(newline, choices=_choice({}, "stop")),
            _chunk(newline, choices=[], usage=usage),
            f"data: [DONE]{newline}{newline}".encode(),
        ]
    )


def _split_in(body: bytes, char: str) -> list[bytes | float]:
    """`body` in two writes, apart, the cut inside the first `char`."""
    cut = body.index(char.encode()) + 1
    return [body[:cut], 0.05, body[cut:]]


# Each client on each backend it runs on (OpenAI's streams on asyncio only).
PROVIDERS = pytest.mark.parametrize(
    ("anyio_backend", "client", "body"),
    [
        pytest.param("asyncio", _anthropic, _anthropic_body, id="anthropic-asyncio"),
        pytest.param("trio", _anthropic, _anthropic_body, id="anthropic-trio"),
        pytest.param("asyncio", _openai, _openai_body, id="openai-asyncio"),
    ],
)


@PROVIDERS
@pytest.mark.parametrize(
    ("text", "newline", "split"),
    [
        pytest.param("naïve café ✓", "\n", "ï", id="a character split across writes"),
        pytest.param("naïve café ✓", "\r\n", None, id="CRLF line endings"),
        pytest.param("naïve café ✓", "\r", None, id="CR line endings"),
        pytest.param(BIG, "\n", None, id="a data line over a megabyte"),
    ],
)
async def test_a_stream_is_read_whole_whatever_its_bytes_look_like(
    wire: tuple[str, type[_Wire]],
    client: Any,
    body: Any,
    text: str,
    newline: str,
    split: str | None,
) -> None:
    url, handler = wire
    raw = body(text, newline)
    handler.pieces = _split_in(raw, split) if split else [raw]
    with anyio.fail_after(20):
        events = await _streamed(client(url))
    done = events[-1]
    assert isinstance(done, StreamDone)
    assert done.response.message.text == text
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == text
    assert done.response.usage is not None


@PROVIDERS
@pytest.mark.parametrize("stream", [False, True])
async def test_a_529_is_a_retryable_server_error(
    wire: tuple[str, type[_Wire]], client: Any, body: Any, stream: bool
) -> None:
    url, handler = wire
    handler.status, handler.kind = 529, "application/json"
    said = {"type": "error", "error": {"type": "overloaded_error", "message": "Busy"}}
    handler.pieces = [json.dumps(said).encode()]
    model = client(url)
    with pytest.raises(ProviderError) as raised:
        await _answer(model, stream)
    error = raised.value
    assert (error.kind, error.retryable, error.status) == ("server", True, 529)


@PROVIDERS
async def test_a_retry_after_http_date_is_the_wait(
    wire: tuple[str, type[_Wire]], client: Any, body: Any
) -> None:
    url, handler = wire
    handler.status, handler.kind = 429, "application/json"
    when = email.utils.formatdate(time.time() + 120, usegmt=True)
    handler.sent = {"Retry-After": when}
    said = {"type": "error", "error": {"type": "rate_limit_error", "message": "Slow"}}
    handler.pieces = [json.dumps(said).encode()]
    with pytest.raises(ProviderError) as raised:
        await _streamed(client(url))
    error = raised.value
    assert (error.kind, error.retryable) == ("rate_limit", True)
    assert error.retry_after is not None
    assert 100 < error.retry_after <= 120


async def test_an_overloaded_error_event_mid_anthropic_stream_is_retryable(
    wire: tuple[str, type[_Wire]],
) -> None:
    url, handler = wire
    said = {"type": "error", "error": {"type": "overloaded_error", "message": "Busy"}}
    handler.pieces = [_event(e) for e in (*_anthropic_text("Hal"), said)]
    events: list[StreamEvent] = []
    with pytest.raises(ProviderError) as raised:
        await _drain(_anthropic(url), events)
    assert events == [TextDelta(text="Hal")]
    error = raised.value
    assert (error.kind, error.retryable, error.status) == ("server", True, 529)
    assert "Busy" in str(error)


@asyncio_only
async def test_an_overloaded_error_mid_openai_stream_is_retryable(
    wire: tuple[str, type[_Wire]],
) -> None:
    url, handler = wire
    said = {"error": {"type": "overloaded_error", "message": "Busy", "code": 529}}
    handler.pieces = [
        _chunk(choices=_choice({"role": "assistant", "content": "Hal"})),
        f"data: {json.dumps(said)}\n\n".encode(),
    ]
    events: list[StreamEvent] = []
    with pytest.raises(ProviderError) as raised:
        await _drain(_openai(url), events)
    assert events == [TextDelta(text="Hal")]
    error = raised.value
    assert (error.kind, error.retryable) == ("server", True)
    assert "Busy" in str(error)


# -- what a run makes of them --------------------------------------------------------


class _Listening:
    """A hook that hears the text: the run streams."""

    def on_text_delta(self, info: object) -> None:
        pass


def _agent(url: str, tmp_path: Path, **kwargs: Any) -> Agent:
    return Agent(
        model=_anthropic(url),
        context=ContextManager(context_window=8_000),
        retry=RetryPolicy(max_attempts=3, initial_wait=0.01, max_wait=0.01),
        store=SQLiteStore(tmp_path / "s.db"),
        hooks=[_Listening()],
        **kwargs,
    )


@asyncio_only
async def test_a_run_takes_a_held_stream_at_its_stop_reason_once(
    wire: tuple[str, type[_Wire]], short_wait: float, tmp_path: Path
) -> None:
    # It waited for model_timeout, then asked again: three posts, three bills.
    url, handler = wire
    handler.pieces = [_event(e) for e in (*_anthropic_text("Hi"), _stopped(4))]
    handler.hold = PING
    agent = _agent(url, tmp_path, model_timeout=short_wait * 6)
    with anyio.fail_after(20):
        result = await agent.run("hi")
    assert (result.outcome, result.text) == ("done", "Hi")
    assert result.usage == Usage(input_tokens=9, output_tokens=4)
    assert handler.posts == 1


@asyncio_only
async def test_a_run_given_a_refusal_fails_once_and_keeps_no_reply(
    wire: tuple[str, type[_Wire]], tmp_path: Path
) -> None:
    url, handler = wire
    _serve(handler, True, "refusal")
    agent = _agent(url, tmp_path)
    result = await agent.run("hi")
    assert result.outcome == "failed"
    assert isinstance(result.error, ProviderError)
    assert result.error.kind == "content_filter"
    assert handler.posts == 1
    # The refused reply was billed: the run counts it (it counted nothing).
    assert result.usage == Usage(input_tokens=9, output_tokens=4)
    assert result.reported_calls == 1
    session = await Session.load(agent.store, agent.session.id)
    assert [run.outcome for run in session.runs] == ["failed"]
    assert not any(m.role.value == "assistant" for m in session.history)


@asyncio_only
async def test_a_run_given_a_reply_cut_at_the_window_never_takes_it(
    wire: tuple[str, type[_Wire]], tmp_path: Path
) -> None:
    # It took the cut text ("The answer is") as its answer, done.
    url, handler = wire
    _serve(handler, True, "model_context_window_exceeded")
    result = await _agent(url, tmp_path).run("hi")
    assert result.outcome == "failed"
    assert "model_context_window_exceeded" in str(result.error)
    # The advice named only the model's real window: the reply budget, which
    # did not fit beside the conversation, went unnamed.
    assert "lower the reply budget (max_output_tokens)" in str(result.error)
    # The cut reply was billed: the run counts it (it counted nothing).
    assert result.usage == Usage(
        input_tokens=9 * handler.posts, output_tokens=4 * handler.posts
    )


# -- a byte-order mark, an error after the stop ----------------------------------------

BOM = b"\xef\xbb\xbf"


@PROVIDERS
@pytest.mark.parametrize("cut", [5, 1], ids=["whole", "split"])
async def test_a_byte_order_mark_before_a_stream_is_ignored(
    wire: tuple[str, type[_Wire]], client: Any, body: Any, cut: int
) -> None:
    # Event streams may begin with one (it is ignored): the first event was
    # lost, an OpenAI reply read as empty text, done; Anthropic's failed.
    url, handler = wire
    raw = BOM + body("hi")  # in two writes, apart: a mark split across reads
    handler.pieces = [raw[:cut], 0.05, raw[cut:]]
    with anyio.fail_after(20):
        events = await _streamed(client(url))
    done = events[-1]
    assert isinstance(done, StreamDone)
    assert done.response.message.text == "hi"
    assert [e for e in events if isinstance(e, TextDelta)] == [TextDelta(text="hi")]


BUSY = {"type": "overloaded_error", "message": "Busy", "code": 529}


@pytest.mark.parametrize(
    ("anyio_backend", "client", "pieces"),
    [
        pytest.param(
            "asyncio",
            _anthropic,
            [
                *(_event(e) for e in (*_anthropic_text("Hi"), _stopped(4))),
                _event({"type": "error", "error": BUSY}),
            ],
            id="anthropic",
        ),
        pytest.param(
            "asyncio",
            _openai,
            [
                _chunk(choices=_choice({"role": "assistant", "content": "Hi"})),
                _chunk(choices=_choice({}, "stop")),
                f"data: {json.dumps({'error': BUSY})}\n\n".encode(),
            ],
            id="openai",
        ),
    ],
)
async def test_an_error_event_after_the_stop_reason_keeps_the_whole_reply(
    wire: tuple[str, type[_Wire]],
    client: Any,
    pieces: list[bytes | float],
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The reply was whole at its stop reason: the error failed it as a
    # retryable server error, and the run asked (and paid) for it again.
    url, handler = wire
    handler.pieces = pieces
    with caplog.at_level(logging.WARNING, logger="turnfsm.providers"):
        events = await _streamed(client(url))
    done = events[-1]
    assert isinstance(done, StreamDone)
    assert (done.response.message.text, done.response.finish_reason) == ("Hi", "stop")
    assert handler.posts == 1
    [record] = caplog.records
    assert "after its reply was whole" in record.getMessage()
    assert "Busy" in record.getMessage()
