"""Faults at the provider boundary, against a real local HTTP server.

An Anthropic-compatible stream whose events have no ``event:`` line (only
``data:`` lines, as some proxies send), an OpenAI-compatible server that
answers a streamed request with one body, a connection lost mid-body, and
what a run makes of them.
"""

from __future__ import annotations

import json
import socket
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.helpers import http_server
from tests.providers.test_wire import (
    _agent,
    _anthropic,
    _anthropic_text,
    _ask,
    _openai,
    _stopped,
    _streamed,
    _Wire,
    asyncio_only,
    wire,
)
from turnfsm.errors import ProviderError
from turnfsm.persistence import Session
from turnfsm.providers._stream import StreamDone, TextDelta

__all__ = ["wire"]  # the fixture, served here too

pytestmark = [pytest.mark.anyio, asyncio_only]


def _unnamed(data: dict[str, Any]) -> bytes:
    """One Anthropic event with no ``event:`` line: its data alone."""
    return f"data: {json.dumps(data)}\n\n".encode()


def _call(index: int, call_id: str, arguments: str) -> list[dict[str, Any]]:
    block = {"type": "tool_use", "id": call_id, "name": "look", "input": {}}
    delta = {"type": "input_json_delta", "partial_json": arguments}
    return [
        {"type": "content_block_start", "index": index, "content_block": block},
        {"type": "content_block_delta", "index": index, "delta": delta},
        {"type": "content_block_stop", "index": index},
    ]


UNNAMED_REPLY = [
    *_anthropic_text("Hi ", "there"),
    {"type": "ping"},
    *_call(1, "toolu_1", '{"q": 1}'),
    _stopped(4, "tool_use"),
    {"type": "message_stop"},
]


async def test_an_anthropic_stream_with_no_event_lines_is_read_by_each_datas_type(
    wire: tuple[str, type[_Wire]],
) -> None:
    # The SDK skips an event with no name: the whole reply was skipped, read
    # as a stream that broke off before its message_start, and asked again.
    url, handler = wire
    handler.pieces = [_unnamed(e) for e in UNNAMED_REPLY]
    with anyio.fail_after(20):
        events = await _streamed(_anthropic(url))
    assert [e for e in events if isinstance(e, TextDelta)] == [
        TextDelta(text="Hi "),
        TextDelta(text="there"),
    ]
    done = events[-1]
    assert isinstance(done, StreamDone)
    message = done.response.message
    assert message.text == "Hi there"
    assert [(c.id, c.name, c.arguments) for c in message.tool_calls] == [
        ("toolu_1", "look", {"q": 1})
    ]
    assert done.response.finish_reason == "tool_calls"
    assert handler.posts == 1


async def test_an_unnamed_error_event_is_the_error_it_says(
    wire: tuple[str, type[_Wire]],
) -> None:
    url, handler = wire
    busy = {"type": "error", "error": {"type": "overloaded_error", "message": "Busy"}}
    handler.pieces = [_unnamed(e) for e in (*_anthropic_text("Hal"), busy)]
    with pytest.raises(ProviderError) as raised:
        await _streamed(_anthropic(url))
    error = raised.value
    assert (error.kind, error.retryable, error.status) == ("server", True, 529)
    assert "Busy" in str(error)


OPENAI_CHUNK = {
    "id": "x",
    "object": "chat.completion.chunk",
    "choices": [{"index": 0, "delta": {"content": "Hi"}, "finish_reason": None}],
}


@pytest.mark.parametrize(
    ("body", "said"),
    [
        pytest.param(
            _unnamed(OPENAI_CHUNK),
            'an Anthropic event, a JSON object with a "type"',
            id="an OpenAI chunk",
        ),
        pytest.param(b"data: <html>\n\n", "not JSON", id="not JSON"),
    ],
)
async def test_a_run_given_unnamed_events_that_are_no_anthropic_events_fails_once(
    wire: tuple[str, type[_Wire]], tmp_path: Path, body: bytes, said: str
) -> None:
    # Skipped by the SDK, they made a stream that "broke off before its
    # message_start event": a connection error, asked for three times.
    url, handler = wire
    handler.pieces = [body]
    agent = _agent(url, tmp_path)
    with anyio.fail_after(20):
        result = await agent.run("hi")
    assert result.outcome == "failed"
    assert isinstance(result.error, ProviderError)
    assert (result.error.kind, result.error.retryable) == ("bad_response", False)
    assert said in str(result.error)
    assert handler.posts == 1
    session = await Session.load(agent.store, agent.session.id)
    assert [m.role.value for m in session.history] == []


async def test_a_run_given_an_unnamed_stream_is_done_with_one_request(
    wire: tuple[str, type[_Wire]], tmp_path: Path
) -> None:
    url, handler = wire
    events = [*_anthropic_text("Hi"), _stopped(4), {"type": "message_stop"}]
    handler.pieces = [_unnamed(e) for e in events]
    agent = _agent(url, tmp_path)
    with anyio.fail_after(20):
        result = await agent.run("hi")
    assert (result.outcome, result.text, handler.posts) == ("done", "Hi", 1)


COMPLETION = {
    "id": "x",
    "object": "chat.completion",
    "model": "m",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Hi"},
            "finish_reason": "stop",
        }
    ],
    "usage": {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9},
}


async def test_an_openai_stream_answered_with_one_body_is_that_reply_asked_once(
    wire: tuple[str, type[_Wire]],
) -> None:
    # Read as a stream with no events, it was asked again unstreamed: the
    # same reply, two requests, billed twice.
    url, handler = wire
    handler.kind = "application/json"
    handler.pieces = [json.dumps(COMPLETION).encode()]
    with anyio.fail_after(20):
        events = await _streamed(_openai(url))
    assert events[:-1] == [TextDelta(text="Hi")]
    done = events[-1]
    assert isinstance(done, StreamDone)
    assert (done.response.message.text, done.response.finish_reason) == ("Hi", "stop")
    assert handler.posts == 1


async def test_an_openai_stream_answered_with_a_web_page_fails_once(
    wire: tuple[str, type[_Wire]],
) -> None:
    url, handler = wire
    handler.kind = "text/html"
    handler.pieces = [b"<html><body><h1>502 Bad Gateway</h1></body></html>"]
    with pytest.raises(ProviderError) as raised:
        await _streamed(_openai(url))
    assert (raised.value.kind, raised.value.retryable) == ("bad_response", False)
    assert "502 Bad Gateway" in str(raised.value)
    assert handler.posts == 1


class _Cut(_Wire):
    """Answers 200 and half a JSON body, then resets the connection (RST)."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        type(self).posts += 1
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", "5000")
        self.end_headers()
        self.wfile.write(b'{"id": "x", "cho')
        self.wfile.flush()
        linger = struct.pack("ii", 1, 0)  # close at once, with a reset
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)


@pytest.fixture
def cut() -> Iterator[tuple[str, type[_Cut]]]:
    with http_server(_Cut) as (url, served):
        yield url, served


@pytest.mark.parametrize("client", [_openai, _anthropic], ids=["openai", "anthropic"])
async def test_a_connection_lost_mid_body_broke_off_and_is_not_unreachable(
    cut: tuple[str, type[_Cut]], client: Any
) -> None:
    # It said "could not reach the server": the server had answered.
    url, _handler = cut
    with pytest.raises(ProviderError) as raised:
        await client(url).complete(_ask())
    error = raised.value
    assert (error.kind, error.retryable) == ("connection", True)
    assert f"the connection to the server at {url} broke off: " in str(error)
    assert "could not reach" not in str(error)


@pytest.mark.parametrize("client", [_openai, _anthropic], ids=["openai", "anthropic"])
async def test_a_server_not_listening_could_not_be_reached(client: Any) -> None:
    with socket.create_server(("127.0.0.1", 0)) as closed:
        url = f"http://127.0.0.1:{closed.getsockname()[1]}"
    with pytest.raises(ProviderError) as raised:
        await client(url).complete(_ask())
    assert f"could not reach the server at {url}: " in str(raised.value)
    assert "Connection error." not in str(raised.value)  # the OpenAI SDK's words


async def test_a_stream_the_sdk_reads_otherwise_is_left_as_it_is() -> None:
    # The hook wraps the SDK's own event reader; an SDK version without one
    # reads its events as it does (no AttributeError on every stream).
    from turnfsm.providers._sdk import each_event

    class Stream:
        pass

    stream = Stream()
    each_event(stream, lambda event: event)
    assert vars(stream) == {}
