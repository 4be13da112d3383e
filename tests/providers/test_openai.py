from __future__ import annotations

import concurrent.futures
import email.utils
import gc
import http.server
import json
import os
import socket
import ssl
import time
from typing import Any

import anyio
import httpx2
import openai
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.helpers import http_server
from tests.providers._mock import (
    UNPARSABLE_BODIES,
    Server,
    json_cut_short,
    json_reply,
    openai_call,
    openai_chunk,
    openai_reply,
    openai_sse,
    raw_json_reply,
    refused,
    timeout,
)
from turnfsm import Agent
from turnfsm.core import Usage
from turnfsm.errors import CONTENT_FILTER, CONTEXT_OVERFLOW, ConfigError, ProviderError
from turnfsm.messages import ImagePart, Message, Role, TextPart, ToolCallPart
from turnfsm.persistence import Session
from turnfsm.providers import ModelRequest, ToolSchema
from turnfsm.providers._openai import OpenAIModel, _Chunks
from turnfsm.providers._stream import StreamDone, StreamEvent, TextDelta

pytestmark = pytest.mark.anyio

BASE_URL = "http://llama.test/v1"
ECHO = ToolSchema(
    name="echo",
    description="Echo the text back.",
    parameters={"type": "object", "properties": {"text": {"type": "string"}}},
)
# The body llama-cpp-python's server sends for a request over n_ctx
# (RECIPES.md, "A real small model behind a real OpenAI-compatible server").
LLAMA_CPP_OVERFLOW = {
    "error": {
        "message": "This model's maximum context length is 1024 tokens. However, "
        "you requested 1630 tokens (1610 in the messages, 20 in the completion). "
        "Please reduce the length of the messages or completion.",
        "type": "invalid_request_error",
        "param": "messages",
        "code": "context_length_exceeded",
    }
}


def model_for(server: Server, **kwargs: Any) -> OpenAIModel:
    client = openai.AsyncOpenAI(
        api_key="sk-test", base_url=BASE_URL, http_client=server.http_client()
    )
    return OpenAIModel("gpt-test", client=client, **kwargs)


def ask(text: str = "hi", **kwargs: Any) -> ModelRequest:
    return ModelRequest(messages=[Message.user(text)], **kwargs)


async def test_a_plain_reply_carries_text_and_usage() -> None:
    server = Server(openai_reply("Hello!", usage=(12, 3)))
    response = await model_for(server).complete(ask())
    assert response.message.role is Role.ASSISTANT
    assert response.message.parts == (TextPart(text="Hello!"),)
    assert response.usage == Usage(input_tokens=12, output_tokens=3)


@pytest.mark.parametrize(
    ("details", "read"),
    [
        ({"cached_tokens": 1024}, 1024),
        ({"cached_tokens": None}, 0),
        ({}, 0),
        (None, 0),
    ],
)
async def test_the_prompt_tokens_the_cache_served_are_kept_apart(
    details: dict[str, Any] | None, read: int
) -> None:
    body = openai_reply("ok", usage=(1500, 3)).json()
    body["usage"]["prompt_tokens_details"] = details
    server = Server(httpx2.Response(200, json=body))
    response = await model_for(server).complete(ask())
    assert response.usage == Usage(
        input_tokens=1500, output_tokens=3, cache_read_tokens=read
    )


@pytest.mark.parametrize("cached", [-1, 1501, "many"])
async def test_a_cached_token_count_the_prompt_cannot_hold_is_refused_by_name(
    cached: object,
) -> None:
    body = openai_reply("ok", usage=(1500, 3)).json()
    body["usage"]["prompt_tokens_details"] = {"cached_tokens": cached}
    server = Server(httpx2.Response(200, json=body))
    with pytest.raises(ProviderError) as info:
        await model_for(server).complete(ask())
    assert "usage.prompt_tokens_details.cached_tokens" in str(info.value)
    assert repr(cached) in str(info.value)
    assert info.value.retryable is False


async def test_a_reply_without_usage_has_none() -> None:
    server = Server(openai_reply("ok", usage=None))
    assert (await model_for(server).complete(ask())).usage is None


async def test_the_request_body_has_system_tools_calls_and_results() -> None:
    server = Server(openai_reply("ok"))
    history = [
        Message.user("look", id="u"),
        Message(
            role=Role.USER,
            parts=[TextPart(text="this"), ImagePart(url="https://x.test/a.png")],
        ),
        Message.assistant(
            "calling",
            tool_calls=[ToolCallPart(id="c1", name="echo", arguments={"text": "é"})],
        ),
        Message.tool_result("c1", "é"),
        Message.assistant(
            tool_calls=[
                ToolCallPart(id="c2", name="echo", arguments={}),
                ToolCallPart(id="c3", name="nope", arguments={}),
            ]
        ),
        Message.tool_result("c2", ""),
        Message.tool_result("c3", "tool 'nope' is not available", is_error=True),
    ]
    request = ModelRequest(
        messages=history,
        system="be brief",
        tools=[ECHO],
        max_tokens=50,
        temperature=0.2,
    )
    await model_for(server, parallel_tool_calls=True).complete(request)
    [body] = server.bodies
    assert body["model"] == "gpt-test"
    assert body["max_tokens"] == 50  # not api.openai.com: the classic field
    assert body["temperature"] == 0.2
    assert body["parallel_tool_calls"] is True
    assert "stream" not in body
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "echo",
                "description": "Echo the text back.",
                "parameters": {
                    "type": "object",
                    "properties": {"text": {"type": "string"}},
                },
            },
        }
    ]
    assert body["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "look"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "this"},
                {"type": "image_url", "image_url": {"url": "https://x.test/a.png"}},
            ],
        },
        {
            "role": "assistant",
            "content": "calling",
            "tool_calls": [openai_call("c1", "echo", '{"text":"é"}')],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "é"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                openai_call("c2", "echo", "{}"),
                openai_call("c3", "nope", "{}"),
            ],
        },
        {"role": "tool", "tool_call_id": "c2", "content": ""},
        {
            "role": "tool",
            "tool_call_id": "c3",
            "content": "[error] tool 'nope' is not available",
        },
    ]


async def test_client_defaults_apply_when_the_request_sets_none() -> None:
    server = Server(openai_reply("ok"))
    await model_for(server, max_tokens=64, temperature=0.0).complete(ask())
    [body] = server.bodies
    assert (body["max_tokens"], body["temperature"]) == (64, 0.0)
    assert "tools" not in body
    assert "parallel_tool_calls" not in body


async def test_api_openai_com_gets_max_completion_tokens() -> None:
    server = Server(openai_reply("ok"))
    client = openai.AsyncOpenAI(api_key="sk-test", http_client=server.http_client())
    await OpenAIModel("gpt-test", client=client).complete(ask(max_tokens=9))
    [body] = server.bodies
    assert body["max_completion_tokens"] == 9
    assert "max_tokens" not in body
    assert server.requests[0].url.host == "api.openai.com"


async def test_a_tool_call_reply_is_parsed() -> None:
    server = Server(openai_reply(None, openai_call("call_1", "echo", '{"text": "hi"}')))
    response = await model_for(server).complete(ask(tools=[ECHO]))
    assert response.message.parts == (
        ToolCallPart(id="call_1", name="echo", arguments={"text": "hi"}),
    )


async def test_parallel_tool_calls_keep_their_ids_and_order() -> None:
    server = Server(
        openai_reply(
            "",  # some servers send "" rather than null beside tool calls
            openai_call("call_b", "echo", '{"text": "1"}'),
            openai_call("call_a", "echo", '{"text": "2"}'),
        )
    )
    response = await model_for(server).complete(ask(tools=[ECHO]))
    assert response.message.parts == (
        ToolCallPart(id="call_b", name="echo", arguments={"text": "1"}),
        ToolCallPart(id="call_a", name="echo", arguments={"text": "2"}),
    )


async def test_malformed_arguments_become_raw_and_missing_ids_are_filled() -> None:
    server = Server(
        openai_reply(
            None,
            {"type": "function", "function": {"name": "echo", "arguments": '{"te'}},
        )
    )
    [call] = (await model_for(server).complete(ask())).message.tool_calls
    assert (call.name, call.arguments) == ("echo", {"_raw": '{"te'})
    assert call.id.startswith("call_")


@pytest.mark.parametrize("name", ["", None])
async def test_a_call_with_no_name_gets_one_no_tool_has(name: str | None) -> None:
    server = Server(openai_reply(None, openai_call("c1", name, "{}")))  # type: ignore[arg-type]
    [call] = (await model_for(server).complete(ask(tools=[ECHO]))).message.tool_calls
    assert call.name == "missing_tool_name"


OVERFLOWS = {
    "openai": {
        "error": {
            "message": "This model's maximum context length is 128000 tokens. "
            "However, your messages resulted in 130000 tokens.",
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        }
    },
    "llama-cpp-python": LLAMA_CPP_OVERFLOW,
    "vllm": {  # vLLM: not wrapped in "error", code is the status
        "object": "error",
        "message": "This model's maximum context length is 4096 tokens. However, "
        "you requested 5000 tokens (4900 in the messages, 100 in the completion).",
        "type": "BadRequestError",
        "param": None,
        "code": 400,
    },
    "llama.cpp": {
        "error": {
            "code": 400,
            "message": "the request exceeds the available context size, "
            "try increasing it",
            "type": "exceed_context_size_error",
            "n_prompt_tokens": 1630,
            "n_ctx": 1024,
        }
    },
}


@pytest.mark.parametrize("body", OVERFLOWS.values(), ids=OVERFLOWS.keys())
async def test_context_overflow_is_classified(body: dict[str, Any]) -> None:
    server = Server(json_reply(body, 400))
    with pytest.raises(ProviderError) as info:
        await model_for(server).complete(ask())
    error = info.value
    assert (error.kind, error.retryable, error.status) == (CONTEXT_OVERFLOW, False, 400)
    assert error.is_context_overflow
    assert "context" in error.message


def in_30_seconds() -> str:
    return email.utils.formatdate(time.time() + 30, usegmt=True)


ERRORS = {
    "429 seconds": (429, {"retry-after": "2"}, "rate_limit", True, 2.0),
    "429 ms": (429, {"retry-after-ms": "1500"}, "rate_limit", True, 1.5),
    "429 none": (429, {}, "rate_limit", True, None),
    "500": (500, {}, "server", True, None),
    "503 retry-after": (503, {"retry-after": "7"}, "server", True, 7.0),
    "401": (401, {}, "auth", False, None),
    "403": (403, {}, "auth", False, None),
    "400": (400, {}, "bad_request", False, None),
    "404": (404, {}, "bad_request", False, None),
    "408": (408, {}, "timeout", True, None),
    "409": (409, {}, "conflict", True, None),
}


@pytest.mark.parametrize(
    ("status", "headers", "kind", "retryable", "retry_after"),
    ERRORS.values(),
    ids=ERRORS.keys(),
)
async def test_http_errors_are_classified_without_sdk_retries(
    status: int,
    headers: dict[str, str],
    kind: str,
    retryable: bool,
    retry_after: float | None,
) -> None:
    body = {"error": {"message": "the provider says no", "type": "x", "code": None}}
    server = Server(json_reply(body, status, headers))
    with pytest.raises(ProviderError) as info:
        await model_for(server).complete(ask())
    error = info.value
    assert (error.kind, error.retryable, error.status) == (kind, retryable, status)
    assert error.retry_after == retry_after
    assert "the provider says no" in error.message
    assert len(server.requests) == 1  # the SDK did not retry on its own


# A 404 that is no API's error: the path is not served (a base URL without
# its /v1, or with one too many), in each kind of server's words.
NOT_SERVED = {
    "html page": httpx2.Response(
        404,
        text="<html><body>Not Found</body></html>",
        headers={"content-type": "text/html"},
    ),
    "fastapi": httpx2.Response(404, json={"detail": "Not Found"}),
    "plain text": httpx2.Response(404, text="404 page not found"),
}


@pytest.mark.parametrize("reply", NOT_SERVED.values(), ids=NOT_SERVED.keys())
async def test_a_path_not_served_says_to_check_the_base_url(
    reply: httpx2.Response,
) -> None:
    # It said "HTTP 404: Error code: 404 - Not Found", and not where or why.
    with pytest.raises(ProviderError) as info:
        await model_for(Server(reply)).complete(ask())
    assert (info.value.kind, info.value.status) == ("bad_request", 404)
    said = str(info.value)
    assert "nothing is served at http://llama.test/v1/chat/completions" in said
    assert "check the base URL" in said


async def test_a_model_not_found_is_not_blamed_on_the_base_url() -> None:
    body = {"error": {"message": "The model `gpt-tset` does not exist", "code": None}}
    with pytest.raises(ProviderError) as info:
        await model_for(Server(json_reply(body, 404))).complete(ask())
    assert "The model `gpt-tset` does not exist" in str(info.value)
    assert "base URL" not in str(info.value)


async def test_retry_after_as_an_http_date() -> None:
    body = {"error": {"message": "slow down", "type": "requests", "code": None}}
    server = Server(json_reply(body, 429, {"retry-after": in_30_seconds()}))
    with pytest.raises(ProviderError) as info:
        await model_for(server).complete(ask())
    assert info.value.retry_after is not None
    assert 25 <= info.value.retry_after <= 31


async def test_an_auth_error_names_the_key_to_fix() -> None:
    body = {
        "error": {"message": "Incorrect API key provided", "code": "invalid_api_key"}
    }
    server = Server(json_reply(body, 401))
    with pytest.raises(ProviderError, match="OPENAI_API_KEY") as info:
        await model_for(server).complete(ask())
    assert "Incorrect API key provided" in info.value.message


async def test_an_exhausted_quota_is_not_retried() -> None:
    body = {
        "error": {"message": "You exceeded your quota", "code": "insufficient_quota"}
    }
    server = Server(json_reply(body, 429))
    with pytest.raises(ProviderError) as info:
        await model_for(server).complete(ask())
    assert (info.value.kind, info.value.retryable) == ("quota", False)


async def test_a_timeout_names_the_setting_that_bounds_it() -> None:
    with socket.create_server(("127.0.0.1", 0)) as silent:  # never answers
        port = silent.getsockname()[1]
        model = OpenAIModel(
            "m", base_url=f"http://127.0.0.1:{port}/v1", api_key="k", timeout=0.2
        )
        with pytest.raises(ProviderError) as info:
            await model.complete(ask())
        await model.close()
    assert info.value.kind == "timeout"
    assert "OpenAIModel.timeout=0.2 s" in str(info.value)
    with pytest.raises(ProviderError) as info:
        await model_for(Server(timeout)).complete(ask())
    assert "the timeout of the client passed in" in str(info.value)


@pytest.mark.parametrize(
    ("failure", "kind"), [(timeout, "timeout"), (refused, "connection")]
)
async def test_transport_failures_are_retriable(failure: Any, kind: str) -> None:
    server = Server(failure)
    with pytest.raises(ProviderError) as info:
        await model_for(server).complete(ask())
    assert (info.value.kind, info.value.retryable, info.value.status) == (
        kind,
        True,
        None,
    )
    assert len(server.requests) == 1


@pytest.mark.parametrize(
    ("body", "says"), UNPARSABLE_BODIES.values(), ids=UNPARSABLE_BODIES.keys()
)
async def test_a_body_that_is_not_json_is_a_bad_response(
    body: bytes, says: str
) -> None:
    server = Server(raw_json_reply(body))
    with pytest.raises(ProviderError) as info:
        await model_for(server).complete(ask())
    assert (info.value.kind, info.value.retryable) == ("bad_response", False)
    assert says in str(info.value)


async def test_cancellation_is_never_swallowed() -> None:
    async def hang(request: httpx2.Request) -> httpx2.Response:
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    model = model_for(Server(hang))  # type: ignore[arg-type]  # an async handler
    with anyio.move_on_after(0.05) as scope:
        await model.complete(ask())
    assert scope.cancelled_caught


async def test_a_bug_in_the_transport_propagates_unchanged() -> None:
    def broken(request: httpx2.Request) -> httpx2.Response:
        raise KeyError("bug")

    with pytest.raises(KeyError):
        await model_for(Server(broken)).complete(ask())


async def test_an_injected_client_has_its_retries_switched_off() -> None:
    server = Server(json_reply({"error": {"message": "boom"}}, 500))
    client = openai.AsyncOpenAI(
        api_key="sk", base_url=BASE_URL, max_retries=5, http_client=server.http_client()
    )
    with pytest.raises(ProviderError):
        await OpenAIModel("m", client=client).complete(ask())
    assert len(server.requests) == 1


BAD_KEYS = {
    "line break": ("sk-abc123\n", "='\\n': ", "at character 10"),
    "carriage return": ("sk-abc123\r", "='\\r': ", "at character 10"),
    "ellipsis": ("sk-ab\u2026123", "='\u2026': ", "at character 6"),
    "end space": ("sk-abc123 ", "=' ': ", "at character 10"),
}


@pytest.mark.parametrize(("key", "char", "at"), BAD_KEYS.values(), ids=BAD_KEYS.keys())
@pytest.mark.parametrize("given", ["argument", "environment"])
def test_a_key_no_header_can_carry_fails_at_construction_unquoted(
    monkeypatch: pytest.MonkeyPatch, key: str, char: str, at: str, given: str
) -> None:
    # A key copied with a line break (a file, a CRLF .env) was sent and
    # refused by the HTTP library: "could not reach the server", tried 3
    # times. One with a character past ASCII crashed the run with a bare
    # UnicodeEncodeError.
    monkeypatch.setenv("OPENAI_API_KEY", key)
    with pytest.raises(ConfigError) as info:
        OpenAIModel("gpt-4o-mini", api_key=key if given == "argument" else None)
    field = "api_key" if given == "argument" else "OPENAI_API_KEY"
    assert info.value.field == field
    assert char in str(info.value)
    assert at in str(info.value)
    assert key not in str(info.value)
    assert "sk-ab" not in str(info.value)


@pytest.mark.parametrize(
    ("client", "expected"),
    [
        (object(), "an openai.AsyncOpenAI (the async client), or None"),
        (
            openai.OpenAI(api_key="k"),
            "OpenAI is the sync one (pass openai.AsyncOpenAI(...) instead)",
        ),
        (
            openai.AzureOpenAI(
                api_key="k", api_version="2024-06-01", azure_endpoint="https://a.b"
            ),
            "(pass openai.AsyncAzureOpenAI(...) instead)",
        ),
    ],
    ids=["object", "sync client", "sync azure client"],
)
def test_a_client_that_is_not_the_async_one_is_refused(
    client: object, expected: str
) -> None:
    # Was taken, then failed inside with an AttributeError.
    with pytest.raises(ConfigError) as info:
        OpenAIModel("m", api_key="k", client=client)  # type: ignore[arg-type]
    assert info.value.field == "client"
    assert expected in str(info.value)


def test_an_async_azure_client_is_taken() -> None:
    client = openai.AsyncAzureOpenAI(
        api_key="k", api_version="2024-06-01", azure_endpoint="https://a.b"
    )
    assert OpenAIModel("m", client=client).client is client


@pytest.mark.parametrize(
    ("settings", "field", "said"),
    [
        ({"default_headers": {"X-Title": "Caf\u00e9"}}, "client", "its X-Title header"),
        ({"api_key": "sk-ab\u2026c"}, "client.api_key", "at character 6"),
    ],
    ids=["header", "key"],
)
def test_a_client_whose_headers_http_cannot_carry_fails_at_construction(
    settings: dict[str, Any], field: str, said: str
) -> None:
    # The SDK encodes its headers as ASCII: each call crashed the run with a
    # bare UnicodeEncodeError.
    given: dict[str, Any] = {"api_key": "sk", "base_url": BASE_URL, **settings}
    client = openai.AsyncOpenAI(**given)
    with pytest.raises(ConfigError) as info:
        OpenAIModel("m", client=client)
    assert info.value.field == field
    assert said in str(info.value)
    assert "sk-ab" not in str(info.value)


def test_a_missing_key_fails_at_construction(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(ConfigError, match="OPENAI_API_KEY") as info:
        OpenAIModel("gpt-4o-mini")
    assert (info.value.field, info.value.value) == ("api_key", None)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"model": ""}, "model"), ({"model": "m", "max_tokens": 0}, "max_tokens")],
    ids=["empty model", "zero max_tokens"],
)
def test_bad_settings_fail_at_construction(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        OpenAIModel(base_url=BASE_URL, **kwargs)
    assert info.value.field == field


def test_the_command_lines_spelling_of_a_model_is_refused_for_openai_itself(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # It was sent as the model's name, and OpenAI found no such model.
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    with pytest.raises(ConfigError) as info:
        OpenAIModel("openai:gpt-4o-mini")
    assert str(info.value) == (
        "invalid model='openai:gpt-4o-mini': expected the model's own name, "
        "without the command line's openai: prefix: OpenAIModel('gpt-4o-mini')"
    )
    # A compatible server's names are its own.
    assert OpenAIModel("openai:x", base_url=BASE_URL).model == "openai:x"


@pytest.mark.parametrize(
    ("env", "expected"),
    [(None, "Bearer sk-no-key-required"), ("sk-env", "Bearer sk-env")],
    ids=["placeholder", "env"],
)
def test_a_base_url_server_gets_the_env_key_or_a_placeholder(
    monkeypatch: pytest.MonkeyPatch, env: str | None, expected: str
) -> None:
    if env is None:
        monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    else:
        monkeypatch.setenv("OPENAI_API_KEY", env)
    model = OpenAIModel("local", base_url=BASE_URL, timeout=5)
    sdk = model._sdk.client
    assert (sdk.api_key, sdk.max_retries, str(sdk.base_url)) == (
        expected.removeprefix("Bearer "),
        0,
        BASE_URL + "/",
    )


# -- streaming ------------------------------------------------------------------
# The OpenAI SDK leaves an inner async generator unfinished after "[DONE]";
# trio warns when it is garbage-collected (asyncio finalises it silently), and
# the test suite turns warnings into errors. So streams run on asyncio only.
asyncio_only = pytest.mark.parametrize("anyio_backend", ["asyncio"])


def call_piece(
    index: int, call_id: str | None = None, name: str | None = None, args: str = ""
) -> dict[str, Any]:
    piece: dict[str, Any] = {"index": index, "function": {"arguments": args}}
    if call_id:
        piece.update(id=call_id, type="function")
        piece["function"]["name"] = name
    return piece


async def collect(model: OpenAIModel, request: ModelRequest) -> list[StreamEvent]:
    return [event async for event in model.stream(request)]


async def drain(
    model: OpenAIModel, request: ModelRequest, into: list[StreamEvent]
) -> None:
    async for event in model.stream(request):
        into.append(event)


@asyncio_only
async def test_a_stream_yields_text_then_the_assembled_reply() -> None:
    server = Server(
        openai_sse(
            [
                openai_chunk({"role": "assistant", "content": ""}),
                openai_chunk({"content": "Let me "}),
                openai_chunk({"content": "check."}),
                openai_chunk({"tool_calls": [call_piece(0, "call_a", "echo")]}),
                openai_chunk({"tool_calls": [call_piece(0, args='{"text"')]}),
                openai_chunk({"tool_calls": [call_piece(1, "call_b", "echo", "{")]}),
                openai_chunk({"tool_calls": [call_piece(0, args=': "a"}')]}),
                openai_chunk({"tool_calls": [call_piece(1, args='"text": "b"}')]}),
                openai_chunk(usage=(40, 17)),
            ]
        )
    )
    events = await collect(model_for(server), ask(tools=[ECHO]))
    assert events[:2] == [TextDelta(text="Let me "), TextDelta(text="check.")]
    [done] = events[2:]
    assert isinstance(done, StreamDone)
    assert done.response.message.parts == (
        TextPart(text="Let me check."),
        ToolCallPart(id="call_a", name="echo", arguments={"text": "a"}),
        ToolCallPart(id="call_b", name="echo", arguments={"text": "b"}),
    )
    assert done.response.usage == Usage(input_tokens=40, output_tokens=17)
    [body] = server.bodies
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}


@asyncio_only
async def test_a_streamed_reply_keeps_its_cached_tokens_apart() -> None:
    last = openai_chunk(usage=(1500, 2))
    last["usage"]["prompt_tokens_details"] = {"cached_tokens": 1280}
    server = Server(openai_sse([openai_chunk({"content": "ok"}), last]))
    done = (await collect(model_for(server), ask()))[-1]
    assert isinstance(done, StreamDone)
    assert done.response.usage == Usage(
        input_tokens=1500, output_tokens=2, cache_read_tokens=1280
    )


@asyncio_only
async def test_a_stream_error_is_classified_like_a_completion() -> None:
    server = Server(json_reply(LLAMA_CPP_OVERFLOW, 400))
    with pytest.raises(ProviderError) as info:
        await collect(model_for(server), ask())
    assert info.value.is_context_overflow


@asyncio_only
async def test_a_stream_that_ends_without_a_reply_asks_again_unstreamed() -> None:
    """llama.cpp's server ends a stream over its context size with no reply:
    asked again without streaming, it says so, and the overflow is seen."""
    empty = httpx2.Response(
        200, content=b"", headers={"content-type": "text/event-stream"}
    )
    # It closes the connection too: the next request there fails to connect.
    server = Server(empty, refused, json_reply(LLAMA_CPP_OVERFLOW, 400))
    with pytest.raises(ProviderError) as info:
        await collect(model_for(server), ask())
    assert info.value.is_context_overflow
    assert [body.get("stream") for body in server.bodies] == [True, None, None]

    # A server that answers the second time: that answer is the reply.
    server = Server(openai_sse([openai_chunk(usage=(5, 0))]), openai_reply("hello"))
    events = await collect(model_for(server), ask())
    assert events[0] == TextDelta(text="hello")
    assert isinstance(events[1], StreamDone)
    assert events[1].response.message.text == "hello"


@asyncio_only
async def test_an_error_event_mid_stream_is_a_retriable_server_error() -> None:
    server = Server(
        openai_sse(
            [
                openai_chunk({"content": "partial"}),
                {"error": {"message": "The server had an error", "type": "server"}},
            ]
        )
    )
    events: list[StreamEvent] = []
    with pytest.raises(ProviderError) as info:
        await drain(model_for(server), ask(), events)
    assert events == [TextDelta(text="partial")]
    assert (info.value.kind, info.value.retryable) == ("server", True)


@asyncio_only
async def test_a_stream_that_breaks_off_is_a_retryable_connection_error() -> None:
    """A gateway that loses its upstream ends the body cleanly, mid-reply:
    with no finish_reason, no usage and no [DONE], the text so far is not
    the reply."""
    cut = "".join(
        f"data: {json.dumps(openai_chunk({'content': text}))}\n\n"
        for text in ("Hel", "lo wor")
    )
    server = Server(
        httpx2.Response(
            200, content=cut.encode(), headers={"content-type": "text/event-stream"}
        )
    )
    events: list[StreamEvent] = []
    with pytest.raises(ProviderError) as info:
        await drain(model_for(server), ask(), events)
    assert events == [TextDelta(text="Hel"), TextDelta(text="lo wor")]
    assert (info.value.kind, info.value.retryable) == ("connection", True)
    assert "finish_reason" in str(info.value)
    assert BASE_URL.removesuffix("/v1") in str(info.value)


@asyncio_only
async def test_streamed_calls_without_an_index_stay_apart_by_their_ids() -> None:
    """Some OpenAI-compatible servers send each parallel call whole, with
    its own id and no index: two calls, not one with both argument texts."""
    first = {"id": "call_a", "type": "function", "function": {"name": "echo"}}
    server = Server(
        openai_sse(
            [
                openai_chunk({"tool_calls": [first]}),
                openai_chunk({"tool_calls": [{"function": {"arguments": '{"te'}}]}),
                # An id that changes without a name: still call_a's arguments.
                openai_chunk({"tool_calls": [{"id": "x9", "function": {}}]}),
                openai_chunk({"tool_calls": [{"function": {"arguments": 'xt":"a"}'}}]}),
                openai_chunk(
                    {
                        "tool_calls": [
                            {
                                "id": "call_b",
                                "type": "function",
                                "function": {"name": "echo", "arguments": "{}"},
                            }
                        ]
                    }
                ),
                openai_chunk(usage=(4, 2)),
            ]
        )
    )
    *_, done = await collect(model_for(server), ask(tools=[ECHO]))
    assert isinstance(done, StreamDone)
    assert done.response.message.parts == (
        ToolCallPart(id="call_a", name="echo", arguments={"text": "a"}),
        ToolCallPart(id="call_b", name="echo", arguments={}),
    )


UNREADABLE = {
    "no choices": {"id": "c", "object": "chat.completion", "created": 0, "choices": []},
    "audio part": {
        "id": "c",
        "object": "chat.completion",
        "created": 0,
        "choices": [
            {
                "index": 0,
                "finish_reason": "stop",
                "message": {"role": "assistant", "content": [{"type": "input_audio"}]},
            }
        ],
    },
}


@pytest.mark.parametrize("body", UNREADABLE.values(), ids=UNREADABLE.keys())
async def test_an_unreadable_reply_is_a_provider_error_not_a_crash(
    body: dict[str, Any],
) -> None:
    server = Server(json_reply(body))
    with pytest.raises(ProviderError) as info:
        await model_for(server).complete(ask())
    assert (info.value.kind, info.value.retryable) == ("bad_response", False)


async def test_close_closes_the_http_client() -> None:
    server = Server(openai_reply("ok"))
    http = server.http_client()
    client = openai.AsyncOpenAI(api_key="k", base_url=BASE_URL, http_client=http)
    await OpenAIModel("m", client=client).close()
    assert http.is_closed


@pytest.mark.parametrize("choice", ["auto", "required", "none"])
async def test_tool_choice_is_sent_with_the_tools(choice: str) -> None:
    server = Server(openai_reply("ok"), openai_reply("ok"))
    model = model_for(server, tool_choice=choice)
    await model.complete(ask(tools=[ECHO]))
    await model.complete(ask())  # no tools: no tool_choice either
    with_tools, without = server.bodies
    assert with_tools["tool_choice"] == choice
    assert "tool_choice" not in without


async def test_no_tool_choice_by_default() -> None:
    server = Server(openai_reply("ok"))
    await model_for(server).complete(ask(tools=[ECHO]))
    [body] = server.bodies
    assert "tool_choice" not in body


@pytest.mark.parametrize("bad", ["any", "", 1, True])
def test_an_unknown_tool_choice_is_refused_naming_the_field(bad: object) -> None:
    with pytest.raises(ConfigError) as raised:
        OpenAIModel("gpt-test", base_url=BASE_URL, tool_choice=bad)  # type: ignore[arg-type]
    assert raised.value.field == "tool_choice"
    assert raised.value.value == bad
    assert "tool_choice" in str(raised.value)


@pytest.mark.parametrize(
    "url", ["localhost:8080", "127.0.0.1:8080/v1", "http://", "ftp://host/v1"]
)
def test_a_base_url_that_is_no_http_url_is_refused_when_made(url: str) -> None:
    # "localhost:8080" was taken as a URL whose scheme is "localhost": every
    # call failed to connect, to "localhost://".
    with pytest.raises(ConfigError) as info:
        OpenAIModel("m", base_url=url)
    assert str(info.value) == (
        f"invalid base_url={url!r}: expected an http:// or https:// URL, such as "
        "http://127.0.0.1:8080/v1"
    )
    assert str(OpenAIModel("m", base_url="https://example.com/v1").base_url)


async def test_the_finish_reason_is_kept() -> None:
    cut = json.loads(openai_reply("The answer is").content)
    cut["choices"][0]["finish_reason"] = "length"
    server = Server(
        json_reply(cut), openai_reply(None, openai_call("c1", "echo", "{}"))
    )
    model = model_for(server)
    assert (await model.complete(ask())).finish_reason == "length"
    assert (await model.complete(ask())).finish_reason == "tool_calls"


@asyncio_only
async def test_a_stream_keeps_the_finish_reason() -> None:
    last = openai_chunk({"content": " is"})
    last["choices"][0]["finish_reason"] = "length"
    server = Server(
        openai_sse(
            [openai_chunk({"content": "The answer"}), last, openai_chunk(usage=(9, 2))]
        )
    )
    events = await collect(model_for(server), ask())
    done = events[-1]
    assert isinstance(done, StreamDone)
    assert done.response.finish_reason == "length"
    assert done.response.message.text == "The answer is"


async def test_a_refusal_is_a_content_filter_error_quoting_it() -> None:
    """OpenAI's refusal comes with finish reason ``stop``: no answer, but a
    failure not worth asking again, as Anthropic's ``refusal`` is."""
    body = json.loads(openai_reply(None).content)
    body["choices"][0]["message"]["refusal"] = "I can't help with that."
    server = Server(json_reply(body))
    with pytest.raises(ProviderError) as raised:
        await model_for(server).complete(ask())
    assert (raised.value.kind, raised.value.retryable) == (CONTENT_FILTER, False)
    assert "I can't help with that." in str(raised.value)
    assert raised.value.usage == Usage(input_tokens=12, output_tokens=3)  # billed


@asyncio_only
async def test_a_streamed_refusal_is_a_content_filter_error_quoting_it() -> None:
    pieces = [openai_chunk({"refusal": "I can't"}), openai_chunk({"refusal": " help."})]
    pieces[-1]["choices"][0]["finish_reason"] = "stop"
    server = Server(openai_sse([*pieces, openai_chunk(usage=(9, 2))]))
    events: list[StreamEvent] = []
    with pytest.raises(ProviderError) as raised:
        await drain(model_for(server), ask(), events)
    assert events == []  # a refusal's words are no text of a reply
    assert (raised.value.kind, raised.value.retryable) == (CONTENT_FILTER, False)
    assert "I can't help." in str(raised.value)
    assert raised.value.usage == Usage(input_tokens=9, output_tokens=2)
    assert len(server.requests) == 1


@asyncio_only
async def test_streamed_arguments_sent_as_an_object_are_read() -> None:
    """Some servers send a call's arguments as an object, streamed or not."""
    piece = call_piece(0, "call_a", "echo")
    piece["function"]["arguments"] = {"text": "é"}
    chunks = [openai_chunk({"tool_calls": [piece]}), openai_chunk(usage=(5, 2))]
    done = (await collect(model_for(Server(openai_sse(chunks))), ask(tools=[ECHO])))[-1]
    assert isinstance(done, StreamDone)
    [call] = done.response.message.tool_calls
    assert call.arguments == {"text": "é"}


def named_piece(index: int, name: str | None, args: str = "", **more: str) -> Any:
    function: dict[str, Any] = {"arguments": args}
    if name is not None:
        function["name"] = name
    return openai_chunk(
        {"tool_calls": [{"index": index, "function": function, **more}]}
    )


NAME_SHAPES = {
    # OpenAI: the id and the name once, in the call's first fragment.
    "first only": [
        named_piece(0, "read_file", id="call_a", type="function"),
        named_piece(0, None, '{"path"'),
        named_piece(0, None, ': "a"}'),
    ],
    # Gemini's OpenAI-compatible API: the name in pieces.
    "split": [
        named_piece(0, "read_", id="call_a", type="function"),
        named_piece(0, "fi", '{"path"'),
        named_piece(0, "le", ': "a"}'),
    ],
    # Fireworks, MiniMax on NVIDIA NIM: the id and the whole name in every
    # fragment.
    "repeated": [
        named_piece(0, "read_file", id="call_a", type="function"),
        named_piece(0, "read_file", '{"path"', id="call_a", type="function"),
        named_piece(0, "read_file", ': "a"}', id="call_a", type="function"),
    ],
}


@asyncio_only
@pytest.mark.parametrize("chunks", NAME_SHAPES.values(), ids=NAME_SHAPES.keys())
async def test_a_streamed_call_name_is_whole_however_the_server_sends_it(
    chunks: list[dict[str, Any]],
) -> None:
    server = Server(openai_sse([*chunks, openai_chunk(usage=(5, 2))]))
    read_file = ToolSchema(name="read_file", description="", parameters={})
    done = (await collect(model_for(server), ask(tools=[ECHO, read_file])))[-1]
    assert isinstance(done, StreamDone)
    assert done.response.message.tool_calls == (
        ToolCallPart(id="call_a", name="read_file", arguments={"path": "a"}),
    )


@asyncio_only
async def test_a_streamed_name_in_two_equal_pieces_names_the_offered_tool() -> None:
    """A piece equal to the name so far is a repeat, unless the two together
    name an offered tool and the first alone does not."""
    chunks = [
        named_piece(0, "pa", id="call_a", type="function"),
        named_piece(0, "pa", "{}"),
        named_piece(1, "echo", "{}", id="call_b", type="function"),
        named_piece(1, "echo", id="call_b", type="function"),
    ]
    server = Server(openai_sse([*chunks, openai_chunk(usage=(5, 2))]))
    papa = ToolSchema(name="papa", description="", parameters={})
    done = (await collect(model_for(server), ask(tools=[ECHO, papa])))[-1]
    assert isinstance(done, StreamDone)
    assert [call.name for call in done.response.message.tool_calls] == [
        "papa",
        "echo",
    ]


@asyncio_only
async def test_a_streamed_event_that_is_not_json_fails_naming_the_event() -> None:
    """As an unstreamed body that is not JSON: an unreadable reply, not retried."""
    first = json.dumps(openai_chunk({"content": "Hel"}))
    body = f"data: {first}\n\ndata: {{bad json\n\ndata: [DONE]\n\n"
    server = Server(
        httpx2.Response(
            200, content=body.encode(), headers={"content-type": "text/event-stream"}
        )
    )
    events: list[StreamEvent] = []
    with pytest.raises(ProviderError) as info:
        await drain(model_for(server), ask(), events)
    assert events == [TextDelta(text="Hel")]
    assert (info.value.kind, info.value.retryable) == ("bad_response", False)
    assert "a streamed event is not JSON" in str(info.value)
    assert "'{bad json'" in str(info.value)


SHARED_INDEX_SHAPES = {
    # LiteLLM's bridge from the Responses API: every call at index 0, no ids.
    "whole calls": (
        [
            named_piece(0, "echo", '{"text": "a"}'),
            named_piece(0, "read_file", '{"path": "b"}'),
        ],
        [("echo", {"text": "a"}), ("read_file", {"path": "b"})],
    ),
    "one tool twice, in pieces": (
        [
            named_piece(0, "echo"),
            named_piece(0, None, '{"text"'),
            named_piece(0, None, ': "a"}'),
            named_piece(0, "echo"),
            named_piece(0, None, '{"text": "b"}'),
        ],
        [("echo", {"text": "a"}), ("echo", {"text": "b"})],
    ),
    # Arguments a small model ran on past their end, with no name again: one
    # call, as the same reply unstreamed has it.
    "arguments run on": (
        [
            named_piece(0, "echo", '{"text": "a"}'),
            named_piece(0, None, "}"),
        ],
        [("echo", {"_raw": '{"text": "a"}}'})],
    ),
    # The whole name in every fragment, once more after the arguments: one call.
    "name repeated after the arguments": (
        [
            named_piece(0, "echo", '{"text"'),
            named_piece(0, "echo", ': "a"}'),
            named_piece(0, "echo"),
        ],
        [("echo", {"text": "a"})],
    ),
}


@asyncio_only
@pytest.mark.parametrize(
    ("chunks", "calls"), SHARED_INDEX_SHAPES.values(), ids=SHARED_INDEX_SHAPES.keys()
)
async def test_calls_sharing_an_index_without_ids_part_where_the_arguments_end(
    chunks: list[dict[str, Any]], calls: list[tuple[str, dict[str, Any]]]
) -> None:
    """A fragment that brings a name or arguments after its index's call's
    arguments are a whole JSON object starts the next call: nothing can
    follow a whole object in the same call's arguments."""
    server = Server(openai_sse([*chunks, openai_chunk(usage=(5, 2))]))
    read_file = ToolSchema(name="read_file", description="", parameters={})
    done = (await collect(model_for(server), ask(tools=[ECHO, read_file])))[-1]
    assert isinstance(done, StreamDone)
    got = done.response.message.tool_calls
    assert [(call.name, call.arguments) for call in got] == calls
    assert len({call.id for call in got}) == len(got)


def dropped_after(*chunks: dict[str, Any]) -> httpx2.Response:
    """An event stream whose connection drops after `chunks`."""

    async def body() -> Any:
        for chunk in chunks:
            yield f"data: {json.dumps(chunk)}\n\n".encode()
        raise httpx2.RemoteProtocolError("peer closed connection mid-body")

    return httpx2.Response(
        200, content=body(), headers={"content-type": "text/event-stream"}
    )


@asyncio_only
async def test_a_connection_dropped_mid_stream_says_the_stream_broke_off() -> None:
    """Not that the server could not be reached: it was, and it answered."""
    server = Server(dropped_after(openai_chunk({"content": "Hel"})))
    events: list[StreamEvent] = []
    with pytest.raises(ProviderError) as info:
        await drain(model_for(server), ask(), events)
    assert events == [TextDelta(text="Hel")]
    assert (info.value.kind, info.value.retryable) == ("connection", True)
    assert "could not reach" not in str(info.value)
    where = BASE_URL.removesuffix("/v1")
    assert str(info.value).endswith(
        f"the stream from the server at {where} broke off: "
        "peer closed connection mid-body"
    )


@pytest.mark.parametrize(
    ("error", "kind", "said"),
    [
        (
            httpx2.RemoteProtocolError("peer closed connection mid-body"),
            "connection",
            "broke off: peer closed connection mid-body",
        ),
        (httpx2.ReadTimeout("the read timed out"), "timeout", "timed out"),
        (httpx2.DecodingError("bad gzip data"), "connection", "bad gzip data"),
        (ssl.SSLError("bad record mac"), "connection", "bad record mac"),
        (anyio.EndOfStream(), "connection", "broke off"),
    ],
)
@asyncio_only
async def test_one_json_body_cut_short_in_place_of_a_stream_is_a_provider_error(
    error: Exception, kind: str, said: str
) -> None:
    """A server that ignores `stream` and then breaks off (or stalls) mid-body
    fails as such a body read unstreamed does: not with the HTTP library's
    own error, which no retry policy knows."""
    server = Server(json_cut_short(error))
    with pytest.raises(ProviderError) as info:
        await collect(model_for(server), ask())
    assert (info.value.kind, info.value.retryable) == (kind, True)
    assert said in str(info.value)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=6,
)


@given(
    calls=st.lists(
        st.tuples(
            st.sampled_from(["echo", "read_file", "get"]),
            st.dictionaries(st.text(max_size=3), JSON_VALUES, max_size=3),
        ),
        min_size=1,
        max_size=3,
    ),
    shape=st.sampled_from(["first only", "split", "repeated", "one index, no ids"]),
    data=st.data(),
)
def test_streamed_calls_are_assembled_whole_however_they_are_cut(
    calls: list[tuple[str, dict[str, Any]]], shape: str, data: st.DataObject
) -> None:
    """The reply a stream assembles has the calls the server sent, however
    it cuts their arguments and sends their names."""
    chunks: list[dict[str, Any]] = []
    for i, (name, arguments) in enumerate(calls):
        text = json.dumps(arguments)
        cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(text) - 1)))))
        pieces = [
            text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)
        ]
        ids = {} if shape == "one index, no ids" else {"id": f"call_{i}"}
        index = 0 if shape == "one index, no ids" else i
        if shape == "split":
            chunks += [
                named_piece(index, name[:2], **ids),
                named_piece(index, name[2:]),
            ]
        else:
            chunks.append(named_piece(index, name, **ids))
        again = name if shape == "repeated" else None
        chunks += [named_piece(index, again, p, **ids if again else {}) for p in pieces]
    reply = _Chunks(["echo", "read_file", "get"])
    for chunk in chunks:
        reply.add(openai.types.chat.ChatCompletionChunk.model_construct(**chunk))
    got = reply.response().message.tool_calls
    assert [(call.name, call.arguments) for call in got] == calls


@asyncio_only
async def test_streamed_content_as_a_list_of_parts_is_read_as_unstreamed() -> None:
    """Mistral sends content as a list of typed parts, streamed or not: text
    parts are the reply's text; a part of another type is refused as the
    same reply unstreamed is."""
    chunks = [
        openai_chunk({"content": [{"type": "text", "text": "Hel"}]}),
        openai_chunk({"content": [{"type": "text", "text": "lo"}]}),
        openai_chunk(usage=(5, 2)),
    ]
    events = await collect(model_for(Server(openai_sse(chunks))), ask())
    assert events[:2] == [TextDelta(text="Hel"), TextDelta(text="lo")]
    done = events[-1]
    assert isinstance(done, StreamDone)
    assert done.response.message.text == "Hello"

    thinking = {"type": "thinking", "thinking": [{"type": "text", "text": "hm"}]}
    whole = json.loads(openai_reply("x").content)
    whole["choices"][0]["message"]["content"] = [thinking]
    with pytest.raises(ProviderError) as unstreamed:
        await model_for(Server(json_reply(whole))).complete(ask())
    chunks = [openai_chunk({"content": [thinking]}), openai_chunk(usage=(5, 2))]
    with pytest.raises(ProviderError) as streamed:
        await collect(model_for(Server(openai_sse(chunks))), ask())
    assert (streamed.value.kind, str(streamed.value)) == (
        unstreamed.value.kind,
        str(unstreamed.value),
    )


class _Completions(http.server.BaseHTTPRequestHandler):
    """A chat completions server that answers every request with one word."""

    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        time.sleep(0.01)  # the threads' runs overlap
        data = json.dumps(
            {
                "id": "x",
                "object": "chat.completion",
                "created": 0,
                "model": "m",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "hi"},
                        "finish_reason": "stop",
                    }
                ],
            }
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_args: object) -> None:
        pass


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts open files")
def test_run_sync_from_worker_threads_closes_each_threads_connections() -> None:
    # A sync server's worker threads share one agent, each run_sync on an
    # event loop of its own: each took the others' client (built for their
    # loop, or closed at their run's end), and dropped connections stayed
    # open until the garbage collector came ("Event loop is closed").
    with http_server(_Completions) as (url, _):
        agent = Agent(model=OpenAIModel("m", base_url=url + "/v1", api_key="k"))

        def request(_: int) -> str:
            return agent.run_sync("hello", session=Session()).outcome

        gc.collect()
        gc.disable()
        try:
            before = len(os.listdir("/proc/self/fd"))
            with concurrent.futures.ThreadPoolExecutor(4) as pool:
                outcomes = list(pool.map(request, range(24)))
            after = len(os.listdir("/proc/self/fd"))
        finally:
            gc.enable()
    assert outcomes == ["done"] * 24
    # A connection left open per thread would be 4 more, per request 24; an
    # earlier test's file closing meanwhile (another test's thread in this
    # worker process) moves the count by one or two either way.
    assert after <= before + 2
