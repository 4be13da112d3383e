"""Replies of the wrong shape, from a real local HTTP server.

The SDKs build their reply objects without checking them, so a server (a
proxy, a half-compatible local server) can put anything where a list, an
object or a count belongs. Each such reply is a `ProviderError` of kind
``bad_response`` naming the field and the value, never a bare
`AttributeError` or `TypeError`, and a run that meets one fails typed, its
session still loadable.
"""

from __future__ import annotations

import http.server
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from tests.helpers import http_server
from turnfsm import Agent, ContextManager, RetryPolicy
from turnfsm.errors import ProviderError
from turnfsm.messages import Message
from turnfsm.persistence import Session
from turnfsm.persistence.sqlite import SQLiteStore
from turnfsm.providers import ModelRequest
from turnfsm.providers._anthropic import AnthropicModel
from turnfsm.providers._openai import OpenAIModel
from turnfsm.providers._stream import StreamDone

pytestmark = pytest.mark.anyio

# The OpenAI SDK leaves an inner async generator unfinished after "[DONE]",
# which trio warns about: its streams run on asyncio only.
asyncio_only = pytest.mark.parametrize("anyio_backend", ["asyncio"])


class _Scripted(http.server.BaseHTTPRequestHandler):
    """Answers every POST with `events` as server-sent events, else `body`."""

    body: Any = None
    events: list[Any] | None = None
    page: tuple[int, str] | None = None  # a status and an HTML page instead
    status = 200  # of `body`
    sent: ClassVar[dict[str, str]] = {}  # more headers with `body`
    posts = 0

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        type(self).posts += 1
        if self.page is not None:
            status, text = self.page
            data = text.encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        if self.events is not None:
            # Anthropic names each event by its type; OpenAI sends bare data
            # lines and ends with [DONE].
            named = all(isinstance(e, dict) and "type" in e for e in self.events)
            events = [
                (f"event: {e['type']}\n" if named else "")
                + f"data: {json.dumps(e)}\n\n"
                for e in self.events
            ]
            data = "".join(events if named else [*events, "data: [DONE]\n\n"]).encode()
            kind = "text/event-stream"
        else:
            data, kind = json.dumps(self.body).encode(), "application/json"
        self.send_response(self.status)
        for name, value in self.sent.items():
            self.send_header(name, value)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # no /props: not a llama.cpp server
        self.send_error(404)

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[tuple[str, type[_Scripted]]]:
    with http_server(_Scripted) as (url, served):
        yield url, served


def _ask() -> ModelRequest:
    return ModelRequest(messages=[Message.user("hi")], max_tokens=50)


async def _answer(model: OpenAIModel | AnthropicModel, stream: bool) -> Any:
    if stream:
        return [event async for event in model.stream(_ask())][-1]
    return await model.complete(_ask())


def _completion(**fields: Any) -> dict[str, Any]:
    message = {"role": "assistant", "content": "hi"}
    body: dict[str, Any] = {
        "id": "x",
        "object": "chat.completion",
        "model": "m",
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1},
    }
    body.update(fields)
    return body


def _chunk(delta: Any = None, **fields: Any) -> dict[str, Any]:
    body = {"id": "x", "object": "chat.completion.chunk", "model": "m"}
    body["choices"] = [{"index": 0, "delta": delta}] if delta is not None else []
    body.update(fields)
    return body


def _call(**function: Any) -> dict[str, Any]:
    return {"index": 0, "id": "c1", "type": "function", "function": function}


OPENAI_COMPLETIONS = {
    "a list": ([1, 2], "the reply=[1, 2]"),
    "a string": ("hello", "the reply='hello'"),
    "a null message": (
        _completion(choices=[{"index": 0, "message": None}]),
        "choices[0].message=None",
    ),
    "calls not a list": (
        _completion(
            choices=[{"index": 0, "message": {"role": "assistant", "tool_calls": {}}}]
        ),
        "tool_calls={}",
    ),
    "a negative count": (
        _completion(usage={"prompt_tokens": -5, "completion_tokens": 1}),
        "usage.prompt_tokens=-5",
    ),
    "a fractional count": (
        _completion(usage={"prompt_tokens": 5, "completion_tokens": 1.5}),
        "usage.completion_tokens=1.5",
    ),
}

OPENAI_STREAMS = {
    "a chunk that is a list": ([[1, 2]], "a streamed chunk=[1, 2]"),
    "a null delta of a choice": (
        [_chunk(choices=[{"index": 0, "delta": "x"}])],
        "choices[0].delta='x'",
    ),
    "content that is a number": ([_chunk({"content": 5})], "delta.content=5"),
    "calls not a list": ([_chunk({"tool_calls": {"index": 0}})], "tool_calls={"),
    "arguments that are a number": (
        [_chunk({"tool_calls": [_call(name="add", arguments=5)]})],
        "tool_calls.function.arguments=5",
    ),
    "a negative count": (
        [
            _chunk({"content": "hi"}),
            _chunk(usage={"prompt_tokens": -1, "completion_tokens": 1}),
        ],
        "usage.prompt_tokens=-1",
    ),
    "usage that is a list": (
        [_chunk({"content": "hi"}), _chunk(usage=[1])],
        "usage=[1]",
    ),
}


def _openai(url: str) -> OpenAIModel:
    return OpenAIModel("m", base_url=f"{url}/v1", api_key="k", timeout=10)


@pytest.mark.parametrize("case", list(OPENAI_COMPLETIONS))
async def test_an_openai_reply_of_the_wrong_shape_is_a_bad_response(
    case: str, server: tuple[str, type[_Scripted]]
) -> None:
    url, handler = server
    handler.body, named = OPENAI_COMPLETIONS[case]
    with pytest.raises(ProviderError) as raised:
        await _answer(_openai(url), stream=False)
    assert raised.value.kind == "bad_response"
    assert not raised.value.retryable
    assert named in str(raised.value)


@pytest.mark.parametrize(
    ("error", "kind", "said"),
    [
        (
            {"message": "model 'm' is still loading", "type": "server_error"},
            "bad_response",
            "the reply has no choices; the server said: model 'm' is still loading",
        ),
        ("overloaded", "bad_response", "the server said: overloaded"),
        (
            {"message": "This model's maximum context length is 1024 tokens."},
            "context_overflow",
            "maximum context length is 1024 tokens",
        ),
        (None, "bad_response", "the reply has no choices"),
        # A router whose upstream failed after it answered 200 (OpenRouter).
        ({"code": 502, "message": "upstream down"}, "server", "HTTP 502: upstream"),
        ({"code": 429, "message": "slow down"}, "rate_limit", "HTTP 429: slow down"),
        ({"code": 400, "message": "no"}, "bad_response", "the server said: no"),
    ],
)
async def test_an_openai_reply_of_an_error_instead_of_choices_quotes_it(
    error: object, kind: str, said: str, server: tuple[str, type[_Scripted]]
) -> None:
    # Some servers answer a refusal with status 200 and an error object: it
    # said only "the reply has no choices", and an overflow so reported was
    # not compacted for.
    url, handler = server
    handler.body = {"error": error, "choices": []}
    with pytest.raises(ProviderError) as raised:
        await _answer(_openai(url), stream=False)
    assert raised.value.kind == kind
    assert said in str(raised.value)


@asyncio_only
@pytest.mark.parametrize("case", list(OPENAI_STREAMS))
async def test_an_openai_chunk_of_the_wrong_shape_is_a_bad_response(
    case: str, server: tuple[str, type[_Scripted]]
) -> None:
    url, handler = server
    chunks, named = OPENAI_STREAMS[case]
    handler.events = chunks
    with pytest.raises(ProviderError) as raised:
        await _answer(_openai(url), stream=True)
    assert raised.value.kind == "bad_response"
    assert named in str(raised.value)


@asyncio_only
async def test_an_openai_stream_of_good_chunks_still_reads(
    server: tuple[str, type[_Scripted]],
) -> None:
    url, handler = server
    handler.events = [
        _chunk({"role": "assistant", "content": "he"}),
        _chunk({"content": "llo", "tool_calls": [_call(name="add", arguments='{"a"')]}),
        _chunk({"tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]}),
        _chunk(choices=[{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]),
        _chunk(usage={"prompt_tokens": 7, "completion_tokens": 2}),
    ]
    done = await _answer(_openai(url), stream=True)
    assert isinstance(done, StreamDone)
    assert done.response.message.text == "hello"
    assert [c.arguments for c in done.response.message.tool_calls] == [{"a": 1}]
    assert done.response.usage is not None
    assert done.response.usage.input_tokens == 7


def _message(**fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": "m",
        "type": "message",
        "role": "assistant",
        "model": "c",
        "content": [{"type": "text", "text": "hi"}],
        "stop_reason": "end_turn",
        "usage": {"input_tokens": 5, "output_tokens": 1},
    }
    body.update(fields)
    return body


def _start(**message: Any) -> dict[str, Any]:
    return {"type": "message_start", "message": _message(content=[], **message)}


def _text_block(index: int = 0) -> dict[str, Any]:
    block = {"type": "text", "text": ""}
    return {"type": "content_block_start", "index": index, "content_block": block}


def _delta(delta: dict[str, Any], index: int = 0) -> dict[str, Any]:
    return {"type": "content_block_delta", "index": index, "delta": delta}


ANTHROPIC_MESSAGES = {
    "a list": ([1], "the reply=[1]"),
    "a block that is a string": (_message(content=["hi"]), "content[0]='hi'"),
    "a negative count": (
        _message(usage={"input_tokens": -1, "output_tokens": 1}),
        "usage.input_tokens=-1",
    ),
    "a fractional count": (
        _message(usage={"input_tokens": 1.5, "output_tokens": 1}),
        "usage.input_tokens=1.5",
    ),
}

ANTHROPIC_STREAMS = {
    "a delta of a block never started": (
        [_start(), _delta({"type": "text_delta", "text": "hi"})],
        "text_delta's index=0",
    ),
    "input pieces for a text block": (
        [
            _start(),
            _text_block(),
            _delta({"type": "input_json_delta", "partial_json": "{"}),
        ],
        "input_json_delta's index=0",
    ),
    "a null message": (
        [{"type": "message_start", "message": None}],
        "message_start.message=None",
    ),
    "a null block": (
        [_start(), {"type": "content_block_start", "index": 0, "content_block": None}],
        "content_block_start.content_block=None",
    ),
    "a negative count": (
        [_start(usage={"input_tokens": -5, "output_tokens": 1})],
        "usage.input_tokens=-5",
    ),
}


def _anthropic(url: str) -> AnthropicModel:
    return AnthropicModel("claude-x", base_url=url, api_key="k", timeout=10)


@pytest.mark.parametrize("case", list(ANTHROPIC_MESSAGES))
async def test_an_anthropic_reply_of_the_wrong_shape_is_a_bad_response(
    case: str, server: tuple[str, type[_Scripted]]
) -> None:
    url, handler = server
    handler.body, named = ANTHROPIC_MESSAGES[case]
    with pytest.raises(ProviderError) as raised:
        await _answer(_anthropic(url), stream=False)
    assert raised.value.kind == "bad_response"
    assert named in str(raised.value)


@pytest.mark.parametrize("case", list(ANTHROPIC_STREAMS))
async def test_an_anthropic_event_of_the_wrong_shape_is_a_bad_response(
    case: str, server: tuple[str, type[_Scripted]]
) -> None:
    url, handler = server
    events, named = ANTHROPIC_STREAMS[case]
    handler.events = [*events, {"type": "message_stop"}]
    with pytest.raises(ProviderError) as raised:
        await _answer(_anthropic(url), stream=True)
    assert raised.value.kind == "bad_response"
    assert named in str(raised.value)


async def test_an_anthropic_reply_without_usage_has_none(
    server: tuple[str, type[_Scripted]],
) -> None:
    url, handler = server
    handler.body = _message(usage=None)
    response = await _answer(_anthropic(url), stream=False)
    assert response.message.text == "hi"
    assert response.usage is None


@asyncio_only
async def test_a_run_meeting_a_chunk_of_the_wrong_shape_fails_typed_and_stays_loadable(
    server: tuple[str, type[_Scripted]], tmp_path: Path
) -> None:
    url, handler = server
    handler.events = [_chunk(choices=[{"index": 0, "delta": {"content": 5}}])]
    store = SQLiteStore(tmp_path / "s.db")
    streaming = type("Streaming", (), {"on_text_delta": lambda self, info: None})
    agent = Agent(
        model=_openai(url),
        context=ContextManager(context_window=8_000),
        retry=RetryPolicy(max_attempts=1),
        store=store,
        hooks=[streaming()],
    )
    result = await agent.run("hi")
    assert result.outcome == "failed"
    assert isinstance(result.error, ProviderError)
    assert "choices[0].delta.content=5" in str(result.error)
    session = await Session.load(store, agent.session.id)
    assert [run.outcome for run in session.runs] == ["failed"]


@pytest.mark.parametrize(
    ("status", "kind", "retryable"),
    [(400, "bad_request", False), (502, "server", True)],
)
async def test_an_openai_error_page_is_quoted_by_its_words(
    status: int, kind: str, retryable: bool, server: tuple[str, type[_Scripted]]
) -> None:
    # A proxy's HTML page said only "HTTP 400: Error code: 400".
    url, handler = server
    handler.page = (
        status,
        "<html><head><title>Bad</title></head><body><h1>Request Header Or"
        " Cookie Too Large</h1>\n<hr><center>nginx</center></body></html>",
    )
    with pytest.raises(ProviderError) as raised:
        await _answer(_openai(url), stream=False)
    assert (raised.value.kind, raised.value.retryable) == (kind, retryable)
    assert str(raised.value).endswith(
        f"HTTP {status}: Error code: {status} - Bad Request Header Or Cookie Too"
        " Large nginx"
    )


# A gateway's error page: its styles and scripts are no words of it.
GATEWAY_PAGE = (
    "<!DOCTYPE html><html><head><title>502 Bad Gateway</title>"
    "<style>" + "body { color: red; } " * 300 + "</style>"
    "<script>var retry = 1 < 2 && 3 > 2;</script></head>"
    "<body><!-- cf --><h1>Bad&nbsp;Gateway</h1><p>The web server reported"
    " a bad gateway error.</p>" + "<div></div>" * 500 + "</body></html>"
)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("make", [_openai, _anthropic], ids=["openai", "anthropic"])
async def test_an_error_page_is_quoted_by_its_words_not_its_markup(
    make: Any, stream: bool, server: tuple[str, type[_Scripted]]
) -> None:
    # AnthropicModel quoted the whole page, markup and styles (some 7,000
    # characters); OpenAIModel quoted its styles as words.
    url, handler = server
    handler.page = (502, GATEWAY_PAGE)
    with pytest.raises(ProviderError) as raised:
        await _answer(make(url), stream=stream)
    assert (raised.value.kind, raised.value.retryable) == ("server", True)
    said = str(raised.value)
    assert "502 Bad Gateway Bad Gateway The web server reported a bad gateway" in said
    assert "color" not in said
    assert "retry" not in said
    assert "<" not in said
    assert len(said) < 400


async def test_a_retry_after_past_the_budget_fails_the_run_without_calling_again(
    server: tuple[str, type[_Scripted]],
) -> None:
    url, handler = server
    handler.status, handler.sent = 429, {"Retry-After": "600"}
    handler.body = {"error": {"message": "Rate limit reached", "type": "rate_limit"}}
    model = OpenAIModel("m", base_url=f"{url}/v1", api_key="k", timeout=10)
    agent = Agent(model=model, retry=RetryPolicy(max_attempts=4, max_total=30))

    result = await agent.run("hi")

    assert handler.posts == 1
    error = result.error
    assert isinstance(error, ProviderError)
    assert (error.kind, error.status, error.attempts) == ("rate_limit", 429, 1)
    assert "the provider asked to wait 600 s before trying again" in str(error)
    assert "RetryPolicy.max_total=30 s (raise it to wait)" in str(error)
