from __future__ import annotations

import json
import socket
import ssl
from typing import Any

import anthropic
import anyio
import httpx2
import pytest

from tests.providers._mock import (
    UNPARSABLE_BODIES,
    Server,
    anthropic_error,
    anthropic_reply,
    anthropic_sse,
    json_cut_short,
    json_reply,
    raw_json_reply,
    refused,
    text_block,
    timeout,
    tool_use,
)
from turnfsm.core import Usage
from turnfsm.errors import CONTEXT_OVERFLOW, ConfigError, ProviderError
from turnfsm.messages import ImagePart, Message, Role, TextPart, ToolCallPart
from turnfsm.providers import ModelRequest, OutputSpec, ToolSchema
from turnfsm.providers._anthropic import AnthropicModel
from turnfsm.providers._stream import StreamDone, StreamEvent, TextDelta

pytestmark = pytest.mark.anyio

ECHO = ToolSchema(
    name="echo",
    description="Echo the text back.",
    parameters={"type": "object", "properties": {"text": {"type": "string"}}},
)
PNG = "iVBORw0KGgo="


def model_for(server: Server, **kwargs: Any) -> AnthropicModel:
    client = anthropic.AsyncAnthropic(
        api_key="sk-ant-test", http_client=server.http_client()
    )
    return AnthropicModel("claude-test", client=client, **kwargs)


def ask(text: str = "hi", **kwargs: Any) -> ModelRequest:
    return ModelRequest(messages=[Message.user(text)], **kwargs)


async def test_a_plain_reply_carries_text_and_usage() -> None:
    server = Server(anthropic_reply(text_block("Hello!"), usage=(12, 3)))
    response = await model_for(server).complete(ask())
    assert response.message.role is Role.ASSISTANT
    assert response.message.parts == (TextPart(text="Hello!"),)
    assert response.usage == Usage(input_tokens=12, output_tokens=3)
    assert server.requests[0].url.path == "/v1/messages"


async def test_usage_counts_cache_reads_and_writes_as_input_and_apart() -> None:
    reply = anthropic_reply(text_block("ok"))
    body = reply.json()
    body["usage"].update(cache_creation_input_tokens=100, cache_read_input_tokens=50)
    server = Server(httpx2.Response(200, json=body))
    response = await model_for(server).complete(ask())
    assert response.usage == Usage(
        input_tokens=162, output_tokens=3, cache_read_tokens=50, cache_write_tokens=100
    )


async def test_the_request_body_has_system_tools_calls_and_merged_results() -> None:
    server = Server(anthropic_reply(text_block("ok")))
    history = [
        Message.user("look"),
        Message(
            role=Role.USER,
            parts=[
                TextPart(text="this"),
                ImagePart(url=f"data:image/png;base64,{PNG}", media_type="image/png"),
                ImagePart(url="https://x.test/a.png"),
            ],
        ),
        Message.assistant(
            "calling two",
            tool_calls=[
                ToolCallPart(id="toolu_1", name="echo", arguments={"text": "a"}),
                ToolCallPart(id="toolu_2", name="nope", arguments={}),
            ],
        ),
        Message.tool_result("toolu_1", "a"),
        Message.tool_result("toolu_2", "tool 'nope' is not available", is_error=True),
        Message.system("summary so far: nothing"),
        Message.user("and now?"),
    ]
    request = ModelRequest(
        messages=history, system="be brief", tools=[ECHO], temperature=0.5
    )  # the current Messages API rejects sampling parameters: not sent
    await model_for(server).complete(request)
    [body] = server.bodies
    assert body["model"] == "claude-test"
    assert body["max_tokens"] == 1024  # the API requires one: the default
    assert "temperature" not in body
    assert body["system"] == [
        {"type": "text", "text": "be brief"},
        {"type": "text", "text": "summary so far: nothing"},
    ]
    assert body["tools"] == [
        {
            "name": "echo",
            "description": "Echo the text back.",
            "input_schema": {
                "type": "object",
                "properties": {"text": {"type": "string"}},
            },
        }
    ]
    assert body["messages"] == [
        {"role": "user", "content": "look"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "this"},
                {
                    "type": "image",
                    "source": {
                        "type": "base64",
                        "media_type": "image/png",
                        "data": PNG,
                    },
                },
                {
                    "type": "image",
                    "source": {"type": "url", "url": "https://x.test/a.png"},
                },
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "calling two"},
                tool_use("toolu_1", "echo", text="a"),
                tool_use("toolu_2", "nope"),
            ],
        },
        {  # both results in one user message, the error flagged
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "a"},
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_2",
                    "content": "tool 'nope' is not available",
                    "is_error": True,
                },
            ],
        },
        {"role": "user", "content": "and now?"},
    ]


async def test_a_single_system_prompt_is_sent_as_a_string() -> None:
    server = Server(anthropic_reply(text_block("ok")))
    await model_for(server, max_tokens=77).complete(ask(system="be brief"))
    [body] = server.bodies
    assert (body["system"], body["max_tokens"]) == ("be brief", 77)
    assert "tools" not in body


@pytest.mark.parametrize(
    ("messages", "system"),
    [
        ([Message.user("hi")], None),
        ([Message.system("be brief"), Message.user("hi")], "be brief"),
    ],
)
async def test_a_blank_system_prompt_is_left_out(
    messages: list[Message], system: str | None
) -> None:
    # Anthropic refuses a system text block of white space only.
    server = Server(anthropic_reply(text_block("ok")))
    await model_for(server).complete(ModelRequest(messages=messages, system=" \n"))
    [body] = server.bodies
    assert body.get("system") == system


async def test_a_request_without_tools_tells_earlier_calls_as_text() -> None:
    # Anthropic refuses tool_use and tool_result blocks in a request that
    # defines no tools (400: "Requests which include tool_use or tool_result
    # blocks must define tools"): an agent without tools continuing a
    # conversation that used some failed on every call.
    server = Server(anthropic_reply(text_block("ok")))
    history = [
        Message.user("look"),
        Message.assistant(
            "calling",
            tool_calls=[ToolCallPart(id="toolu_1", name="echo", arguments={"a": 1})],
        ),
        Message.tool_result("toolu_1", "1"),
        Message.user("and now?"),
    ]
    await model_for(server).complete(ModelRequest(messages=history))
    await model_for(server).complete(ModelRequest(messages=history, tools=[ECHO]))
    told, kept = server.bodies
    assert "tools" not in told
    assert told["messages"] == [
        {"role": "user", "content": "look"},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "calling"},
                {
                    "type": "text",
                    "text": '[called tool echo with {"a":1} (call toolu_1)]',
                },
            ],
        },
        {"role": "user", "content": "[result of tool call toolu_1: 1]"},
        {"role": "user", "content": "and now?"},
    ]
    assert kept["messages"][1]["content"][1]["type"] == "tool_use"


async def test_tool_calls_and_parallel_calls_are_parsed() -> None:
    server = Server(
        anthropic_reply(
            text_block("Checking both."),
            tool_use("toolu_b", "echo", text="1"),
            tool_use("toolu_a", "echo", text="2"),
        )
    )
    response = await model_for(server).complete(ask(tools=[ECHO]))
    assert response.message.parts == (
        TextPart(text="Checking both."),
        ToolCallPart(id="toolu_b", name="echo", arguments={"text": "1"}),
        ToolCallPart(id="toolu_a", name="echo", arguments={"text": "2"}),
    )


async def test_a_tool_call_without_an_id_is_given_one() -> None:
    """An Anthropic-compatible server may leave a call's id empty or out, as
    OpenAI-compatible ones do: the call is kept under a fresh id."""
    empty = tool_use("", "echo", text="1")
    missing = {k: v for k, v in tool_use("x", "echo", text="2").items() if k != "id"}
    server = Server(anthropic_reply(empty, missing))
    response = await model_for(server).complete(ask(tools=[ECHO]))
    first, second = response.message.tool_calls
    assert first.id.startswith("toolu_")
    assert second.id.startswith("toolu_")
    assert first.id != second.id
    assert (first.arguments, second.arguments) == ({"text": "1"}, {"text": "2"})


@pytest.mark.parametrize(
    ("given", "arguments"),
    [
        ({}, {}),  # no input at all
        ({"input": None}, {}),
        ({"input": ""}, {}),
        ({"input": '{"text": "1"}'}, {"text": "1"}),
        ({"input": "text=1"}, {"_raw": "text=1"}),
    ],
    ids=["missing", "null", "blank", "json text", "other text"],
)
async def test_a_tool_calls_input_is_read_as_an_openai_calls_arguments_are(
    given: dict[str, Any], arguments: dict[str, Any]
) -> None:
    # An Anthropic-compatible server that sent a call of a tool with no
    # parameters without its input, or its input as JSON text (as OpenAI's
    # arguments are), had the call refused as "not valid JSON" and not run.
    block = {"type": "tool_use", "id": "toolu_1", "name": "echo", **given}
    server = Server(anthropic_reply(block))
    [call] = (await model_for(server).complete(ask(tools=[ECHO]))).message.tool_calls
    assert call.arguments == arguments


async def test_a_tool_call_with_no_name_gets_one_no_tool_has() -> None:
    server = Server(anthropic_reply(tool_use("toolu_1", "", text="1")))
    [call] = (await model_for(server).complete(ask(tools=[ECHO]))).message.tool_calls
    assert call.name == "missing_tool_name"


async def test_an_unreadable_reply_is_a_provider_error_not_a_crash() -> None:
    server = Server(anthropic_reply({"type": "mystery_block", "x": 1}))
    with pytest.raises(ProviderError) as info:
        await model_for(server).complete(ask())
    assert (info.value.kind, info.value.retryable) == ("bad_response", False)


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


OVERFLOWS = {
    "prompt too long": (
        400,
        "invalid_request_error",
        "prompt is too long: 208310 tokens > 200000 maximum",
    ),
    "input + max_tokens": (
        400,
        "invalid_request_error",
        "input length and `max_tokens` exceed context limit: 197000 + 21333 > "
        "204698, decrease input length or `max_tokens` and try again",
    ),
    "413": (
        413,
        "request_too_large",
        "Request exceeds the maximum allowed number of bytes.",
    ),
}


@pytest.mark.parametrize(
    ("status", "kind", "message"), OVERFLOWS.values(), ids=OVERFLOWS.keys()
)
async def test_context_overflow_is_classified(
    status: int, kind: str, message: str
) -> None:
    server = Server(anthropic_error(status, kind, message))
    with pytest.raises(ProviderError) as info:
        await model_for(server).complete(ask())
    error = info.value
    assert (error.kind, error.retryable, error.status) == (
        CONTEXT_OVERFLOW,
        False,
        status,
    )
    assert message in error.message


ERRORS = {
    "429": (429, "rate_limit_error", {"retry_after": "3"}, "rate_limit", True, 3.0),
    "500": (500, "api_error", {}, "server", True, None),
    "529": (529, "overloaded_error", {}, "server", True, None),
    "401": (401, "authentication_error", {}, "auth", False, None),
    "403": (403, "permission_error", {}, "auth", False, None),
    "400": (400, "invalid_request_error", {}, "bad_request", False, None),
    "404": (404, "not_found_error", {}, "bad_request", False, None),
    "402": (402, "billing_error", {}, "quota", False, None),
    "504": (504, "timeout_error", {}, "server", True, None),
}


@pytest.mark.parametrize(
    ("status", "error_type", "headers", "kind", "retryable", "retry_after"),
    ERRORS.values(),
    ids=ERRORS.keys(),
)
async def test_http_errors_are_classified_without_sdk_retries(
    status: int,
    error_type: str,
    headers: dict[str, str],
    kind: str,
    retryable: bool,
    retry_after: float | None,
) -> None:
    server = Server(
        anthropic_error(status, error_type, "the provider says no", **headers)
    )
    with pytest.raises(ProviderError) as info:
        await model_for(server).complete(ask())
    error = info.value
    assert (error.kind, error.retryable, error.status) == (kind, retryable, status)
    assert error.retry_after == retry_after
    assert "the provider says no" in error.message
    assert len(server.requests) == 1  # the SDK did not retry on its own


async def test_an_error_the_server_says_not_to_retry_is_not_retried() -> None:
    server = Server(
        anthropic_error(529, "overloaded_error", "Busy", x_should_retry="false")
    )
    with pytest.raises(ProviderError) as info:
        await model_for(server).complete(ask())
    assert (info.value.kind, info.value.retryable) == ("server", False)


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
    # A base URL given with its /v1 (the client adds /v1/messages) said
    # only "HTTP 404: Not Found", and not where or why.
    client = anthropic.AsyncAnthropic(
        api_key="k",
        base_url="http://proxy.test/v1",
        http_client=Server(reply).http_client(),
    )
    with pytest.raises(ProviderError) as info:
        await AnthropicModel("claude-test", client=client).complete(ask())
    assert (info.value.kind, info.value.status) == ("bad_request", 404)
    said = str(info.value)
    assert "nothing is served at http://proxy.test/v1/v1/messages" in said
    assert "check the base URL" in said
    assert "without /v1" in said


async def test_a_model_not_found_is_not_blamed_on_the_base_url() -> None:
    reply = anthropic_error(404, "not_found_error", "model: claude-tset")
    with pytest.raises(ProviderError) as info:
        await model_for(Server(reply)).complete(ask())
    assert str(info.value).endswith("HTTP 404: model: claude-tset")


async def test_an_auth_error_names_the_key_to_fix() -> None:
    server = Server(anthropic_error(401, "authentication_error", "invalid x-api-key"))
    with pytest.raises(ProviderError, match="ANTHROPIC_API_KEY"):
        await model_for(server).complete(ask())


async def test_a_timeout_names_the_setting_that_bounds_it() -> None:
    with socket.create_server(("127.0.0.1", 0)) as silent:  # never answers
        port = silent.getsockname()[1]
        model = AnthropicModel(
            "m", base_url=f"http://127.0.0.1:{port}", api_key="k", timeout=0.2
        )
        with pytest.raises(ProviderError) as info:
            await model.complete(ask())
        await model.close()
    assert info.value.kind == "timeout"
    assert f"the server at http://127.0.0.1:{port} timed out" in str(info.value)
    assert "AnthropicModel.timeout=0.2 s" in str(info.value)
    with pytest.raises(ProviderError) as info:
        await model_for(Server(timeout)).complete(ask())
    assert "the timeout of the client passed in" in str(info.value)


async def test_a_server_that_cannot_be_reached_is_named_by_its_url() -> None:
    with socket.create_server(("127.0.0.1", 0)) as closed:
        port = closed.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    model = AnthropicModel("m", base_url=url, api_key="k", timeout=5)
    with pytest.raises(ProviderError) as info:
        await model.complete(ask())
    await model.close()
    assert info.value.kind == "connection"
    assert str(info.value).startswith(
        f"model provider error [connection]: could not reach the server at {url}"
    )


@pytest.mark.parametrize(
    ("failure", "kind"), [(timeout, "timeout"), (refused, "connection")]
)
async def test_transport_failures_are_retriable(failure: Any, kind: str) -> None:
    server = Server(failure)
    with pytest.raises(ProviderError) as info:
        await model_for(server).complete(ask())
    assert (info.value.kind, info.value.retryable) == (kind, True)
    assert len(server.requests) == 1


async def test_cancellation_is_never_swallowed() -> None:
    async def hang(request: httpx2.Request) -> httpx2.Response:
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    model = model_for(Server(hang))  # type: ignore[arg-type]  # an async handler
    with anyio.move_on_after(0.05) as scope:
        await model.complete(ask())
    assert scope.cancelled_caught


async def test_an_injected_client_has_its_retries_switched_off() -> None:
    server = Server(anthropic_error(529, "overloaded_error", "Overloaded"))
    client = anthropic.AsyncAnthropic(
        api_key="k", max_retries=5, http_client=server.http_client()
    )
    with pytest.raises(ProviderError):
        await AnthropicModel("m", client=client).complete(ask())
    assert len(server.requests) == 1


@pytest.mark.parametrize(
    ("model", "budget"), [("claude-sonnet-4-5", 64_000), ("claude-opus-4-0", 16_000)]
)
async def test_an_injected_client_sends_a_big_budget_unstreamed(
    model: str, budget: int
) -> None:
    # A client built with the SDK's default timeout refused, before sending
    # it, a request whose budget might take over 10 minutes, with a bare
    # ValueError that crashed the run. The client's timeout bounds the
    # wait, and the run's model_timeout the call.
    server = Server(anthropic_reply(text_block("ok")))
    client = anthropic.AsyncAnthropic(api_key="k", http_client=server.http_client())
    model_ = AnthropicModel(model, client=client, max_tokens=budget)
    reply = await model_.complete(ask())
    assert reply.message.text == "ok"
    assert server.bodies[0]["max_tokens"] == budget


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
    monkeypatch.setenv("ANTHROPIC_API_KEY", key)
    with pytest.raises(ConfigError) as info:
        AnthropicModel(
            "claude-sonnet-4-5", api_key=key if given == "argument" else None
        )
    field = "api_key" if given == "argument" else "ANTHROPIC_API_KEY"
    assert info.value.field == field
    assert char in str(info.value)
    assert at in str(info.value)
    assert key not in str(info.value)
    assert "sk-ab" not in str(info.value)


def test_a_client_without_a_key_fails_at_construction(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The SDK refused the first call with a bare TypeError ("Could not
    # resolve authentication method"), which crashed the run.
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_AUTH_TOKEN", raising=False)
    with pytest.raises(ConfigError, match="ANTHROPIC_API_KEY") as info:
        AnthropicModel("claude-sonnet-4-5", client=anthropic.AsyncAnthropic())
    assert info.value.field == "client"


@pytest.mark.parametrize(
    ("client", "expected"),
    [
        ("x", "an anthropic.AsyncAnthropic (the async client), or None"),
        (object(), "an anthropic.AsyncAnthropic (the async client), or None"),
        (
            anthropic.Anthropic(api_key="k"),
            "Anthropic is the sync one (pass anthropic.AsyncAnthropic(...) instead)",
        ),
    ],
    ids=["string", "object", "sync client"],
)
def test_a_client_that_is_not_the_async_one_is_refused(
    client: object, expected: str
) -> None:
    # Was taken, then failed inside with an AttributeError.
    with pytest.raises(ConfigError) as info:
        AnthropicModel("claude-sonnet-4-5", api_key="k", client=client)  # type: ignore[arg-type]
    assert info.value.field == "client"
    assert expected in str(info.value)


@pytest.mark.parametrize(
    "settings",
    [{"auth_token": "t"}, {"default_headers": {"x-api-key": "k"}}],
    ids=["auth token", "key header"],
)
async def test_a_client_with_another_credential_is_taken(
    monkeypatch: pytest.MonkeyPatch, settings: dict[str, Any]
) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_AUTH_TOKEN", raising=False)
    server = Server(anthropic_reply(text_block("ok")))
    client = anthropic.AsyncAnthropic(http_client=server.http_client(), **settings)
    reply = await AnthropicModel("claude-sonnet-4-5", client=client).complete(ask())
    assert reply.message.text == "ok"


def test_a_missing_key_fails_at_construction(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_AUTH_TOKEN", raising=False)
    with pytest.raises(ConfigError, match="ANTHROPIC_API_KEY") as info:
        AnthropicModel("claude-sonnet-4-5")
    assert (info.value.field, info.value.value) == ("api_key", None)


def test_the_key_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-env")
    model = AnthropicModel("claude-sonnet-4-5", timeout=5)
    assert (model._sdk.client.api_key, model._sdk.client.max_retries) == (
        "sk-ant-env",
        0,
    )


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"model": ""}, "model"),
        ({"model": "m", "max_tokens": 0}, "max_tokens"),
        ({"model": "m", "base_url": "localhost:8080"}, "base_url"),
        # The command line's spelling, sent as the name: no model has it.
        ({"model": "anthropic:claude-sonnet-4-5"}, "model"),
    ],
    ids=[
        "empty model",
        "zero max_tokens",
        "base_url without a scheme",
        "the command line's prefix",
    ],
)
def test_bad_settings_fail_at_construction(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        AnthropicModel(api_key="k", **kwargs)
    assert info.value.field == field


# -- streaming ------------------------------------------------------------------


def start(input_tokens: int = 25) -> tuple[str, dict[str, Any]]:
    message: dict[str, Any] = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-test",
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": 1},
    }
    return ("message_start", {"type": "message_start", "message": message})


def block_start(index: int, block: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    event = {"type": "content_block_start", "index": index, "content_block": block}
    return ("content_block_start", event)


def delta(index: int, **fields: Any) -> tuple[str, dict[str, Any]]:
    event = {"type": "content_block_delta", "index": index, "delta": fields}
    return ("content_block_delta", event)


def block_stop(index: int) -> tuple[str, dict[str, Any]]:
    return ("content_block_stop", {"type": "content_block_stop", "index": index})


def finish(output_tokens: int) -> list[tuple[str, dict[str, Any]]]:
    return [
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "tool_use", "stop_sequence": None},
                "usage": {"output_tokens": output_tokens},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]


async def collect(model: AnthropicModel, request: ModelRequest) -> list[StreamEvent]:
    return [event async for event in model.stream(request)]


async def drain(
    model: AnthropicModel, request: ModelRequest, into: list[StreamEvent]
) -> None:
    async for event in model.stream(request):
        into.append(event)


async def test_a_stream_yields_text_then_the_assembled_reply() -> None:
    empty_call = {"type": "tool_use", "id": "toolu_a", "name": "echo", "input": {}}
    server = Server(
        anthropic_sse(
            [
                start(input_tokens=25),
                block_start(0, text_block("")),
                ("ping", {"type": "ping"}),
                delta(0, type="text_delta", text="Let me "),
                delta(0, type="text_delta", text="check."),
                block_stop(0),
                block_start(1, empty_call),
                delta(1, type="input_json_delta", partial_json=""),
                delta(1, type="input_json_delta", partial_json='{"text": '),
                delta(1, type="input_json_delta", partial_json='"a"}'),
                block_stop(1),
                block_start(2, {**empty_call, "id": "toolu_b"}),
                delta(2, type="input_json_delta", partial_json='{"text": "b"'),
                block_stop(2),
                block_start(3, {**empty_call, "id": "toolu_c"}),
                block_stop(3),
                *finish(output_tokens=31),
            ]
        )
    )
    events = await collect(model_for(server), ask(tools=[ECHO]))
    assert events[:2] == [TextDelta(text="Let me "), TextDelta(text="check.")]
    [done] = events[2:]
    assert isinstance(done, StreamDone)
    assert done.response.message.parts == (
        TextPart(text="Let me check."),
        ToolCallPart(id="toolu_a", name="echo", arguments={"text": "a"}),
        ToolCallPart(id="toolu_b", name="echo", arguments={"_raw": '{"text": "b"'}),
        ToolCallPart(id="toolu_c", name="echo", arguments={}),
    )
    assert done.response.usage == Usage(input_tokens=25, output_tokens=31)
    assert server.bodies[0]["stream"] is True


async def test_a_streamed_replys_thinking_is_sent_back_with_its_signature() -> None:
    # The thinking came in deltas (thinking_delta, signature_delta) that
    # were dropped: the next call sent no thinking, which Anthropic refuses
    # beside the results of the calls it made.
    thinking = {"type": "thinking", "thinking": "", "signature": ""}
    redacted = {"type": "redacted_thinking", "data": "b3BhcXVl"}
    call = {"type": "tool_use", "id": "toolu_a", "name": "echo", "input": {}}
    server = Server(
        anthropic_sse(
            [
                start(input_tokens=25),
                block_start(0, thinking),
                delta(0, type="thinking_delta", thinking="The user "),
                delta(0, type="thinking_delta", thinking="wants an echo."),
                delta(0, type="signature_delta", signature="c2ln"),
                block_stop(0),
                block_start(1, redacted),
                block_stop(1),
                block_start(2, call),
                delta(2, type="input_json_delta", partial_json='{"text": "a"}'),
                block_stop(2),
                *finish(output_tokens=31),
            ]
        ),
        anthropic_reply(text_block("a")),
    )
    model = model_for(server)
    done = (await collect(model, ask(tools=[ECHO])))[-1]
    assert isinstance(done, StreamDone)
    result = Message.tool_result("toolu_a", "a")
    messages = [Message.user("hi"), done.response.message, result]
    await model.complete(ModelRequest(messages=messages, tools=[ECHO]))
    assert server.bodies[1]["messages"][1]["content"] == [
        {
            "type": "thinking",
            "thinking": "The user wants an echo.",
            "signature": "c2ln",
        },
        redacted,
        {**call, "input": {"text": "a"}},
    ]


@pytest.mark.parametrize(
    ("counts", "input_tokens", "read"),
    [
        ({}, 1105, 1000),  # no input fields: those of message_start stand
        ({"input_tokens": 7}, 1107, 1000),  # the cache counts it leaves out stand
        ({"input_tokens": 7, "cache_read_input_tokens": None}, 1107, 1000),
        ({"input_tokens": 7, "cache_read_input_tokens": 0}, 107, 0),
    ],
)
async def test_a_stream_keeps_each_input_count_its_last_event_leaves_out(
    counts: dict[str, Any], input_tokens: int, read: int
) -> None:
    first = start(input_tokens=5)
    first[1]["message"]["usage"].update(
        cache_creation_input_tokens=100, cache_read_input_tokens=1000
    )
    stop = {"type": "message_delta", "delta": {"stop_reason": "end_turn"}}
    server = Server(
        anthropic_sse(
            [
                first,
                block_start(0, text_block("Hi")),
                ("message_delta", {**stop, "usage": {**counts, "output_tokens": 4}}),
                ("message_stop", {"type": "message_stop"}),
            ]
        )
    )
    done = (await collect(model_for(server), ask()))[-1]
    assert isinstance(done, StreamDone)
    assert done.response.usage == Usage(
        input_tokens=input_tokens,
        output_tokens=4,
        cache_read_tokens=read,
        cache_write_tokens=100,
    )


async def test_an_overloaded_error_mid_stream_is_retriable() -> None:
    overloaded = {
        "type": "error",
        "error": {"type": "overloaded_error", "message": "Overloaded"},
    }
    server = Server(
        anthropic_sse(
            [
                start(),
                block_start(0, text_block("")),
                delta(0, type="text_delta", text="partial"),
                ("error", overloaded),
            ]
        )
    )
    events: list[StreamEvent] = []
    with pytest.raises(ProviderError) as info:
        await drain(model_for(server), ask(), events)
    assert events == [TextDelta(text="partial")]
    assert (info.value.kind, info.value.retryable, info.value.status) == (
        "server",
        True,
        529,
    )


@pytest.mark.parametrize(
    ("error_type", "kind", "retryable", "status"),
    [
        ("billing_error", "quota", False, 402),  # asked again, it fails again
        ("timeout_error", "server", True, 504),
        ("rate_limit_error", "rate_limit", True, 429),
    ],
)
async def test_an_error_mid_stream_is_classified_by_its_type(
    error_type: str, kind: str, retryable: bool, status: int
) -> None:
    said = {"type": "error", "error": {"type": error_type, "message": "Said so"}}
    server = Server(anthropic_sse([start(), ("error", said)]))
    with pytest.raises(ProviderError) as info:
        await collect(model_for(server), ask())
    error = info.value
    assert (error.kind, error.retryable, error.status) == (kind, retryable, status)
    assert "Said so" in error.message


async def test_a_stream_that_breaks_off_is_a_retryable_connection_error() -> None:
    """A body that ends cleanly before its stop reason is not the whole reply."""
    server = Server(
        anthropic_sse(
            [
                start(),
                block_start(0, text_block("")),
                delta(0, type="text_delta", text="Hel"),
            ]
        )
    )
    events: list[StreamEvent] = []
    with pytest.raises(ProviderError) as info:
        await drain(model_for(server), ask(), events)
    assert events == [TextDelta(text="Hel")]
    assert (info.value.kind, info.value.retryable) == ("connection", True)
    assert "before its stop reason (a message_delta event)" in str(info.value)


async def test_a_stream_that_sends_no_message_is_a_bad_response() -> None:
    server = Server(raw_json_reply(b"<html>oops</html>"))
    with pytest.raises(ProviderError) as info:
        await collect(model_for(server), ask())
    assert (info.value.kind, info.value.retryable) == ("bad_response", False)
    assert "the body is not JSON" in str(info.value)
    assert "<html>oops</html>" in str(info.value)  # what came, quoted


@pytest.mark.parametrize("events", [[], [("ping", {"type": "ping"})]])
async def test_a_stream_that_ends_before_its_message_is_retried(
    events: list[tuple[str, dict[str, Any]]],
) -> None:
    """An event stream with no message (a gateway that lost its upstream) broke off."""
    server = Server(anthropic_sse(events))
    with pytest.raises(ProviderError) as info:
        await collect(model_for(server), ask())
    assert (info.value.kind, info.value.retryable) == ("connection", True)
    assert "message_start" in str(info.value)


async def test_a_stream_error_is_classified_like_a_completion() -> None:
    server = Server(
        anthropic_error(400, "invalid_request_error", "prompt is too long: 9 > 8")
    )
    with pytest.raises(ProviderError) as info:
        await collect(model_for(server), ask())
    assert info.value.is_context_overflow


async def test_close_closes_the_http_client() -> None:
    server = Server(anthropic_reply(text_block("ok")))
    http = server.http_client()
    client = anthropic.AsyncAnthropic(api_key="k", http_client=http)
    await AnthropicModel("m", client=client).close()
    assert http.is_closed


@pytest.mark.parametrize(
    ("stop_reason", "finish_reason"),
    [
        ("end_turn", "stop"),
        ("max_tokens", "length"),
        ("stop_sequence", "stop"),
        ("some_new_reason", "some_new_reason"),
        (None, None),
    ],
)
async def test_the_stop_reason_is_kept_in_openai_words(
    stop_reason: str | None, finish_reason: str | None
) -> None:
    body = json.loads(anthropic_reply(text_block("Hi")).content)
    server = Server(json_reply({**body, "stop_reason": stop_reason}))
    response = await model_for(server).complete(ask())
    assert response.finish_reason == finish_reason


async def test_a_call_cut_off_where_it_stood_is_not_whole() -> None:
    # The API reads a cut-off call's input as far as it came: it parses.
    blocks = [text_block("Sure"), tool_use("toolu_1", "echo", text="a")]
    blocks.append(tool_use("toolu_2", "echo", text="b"))
    body = json.loads(anthropic_reply(*blocks).content)
    server = Server(json_reply({**body, "stop_reason": "max_tokens"}))
    response = await model_for(server).complete(ask(tools=[ECHO]))
    first, last = response.message.tool_calls
    assert first.arguments == {"text": "a"}  # a later block began: it is whole
    assert last.arguments == {"_raw": '{"text": "b"}'}


async def test_a_forced_output_call_cut_off_at_the_budget_is_no_answer() -> None:
    body = json.loads(anthropic_reply(tool_use("toolu_1", "Answer", n=1)).content)
    server = Server(json_reply({**body, "stop_reason": "max_tokens"}))
    spec = OutputSpec(name="Answer", schema={"type": "object"})
    response = await model_for(server).complete(ask(output=spec))
    [call] = response.message.tool_calls  # the run fails on it, naming the budget
    assert (call.arguments, response.finish_reason) == ({"_raw": '{"n": 1}'}, "length")


async def test_a_streamed_call_cut_off_at_the_budget_is_not_whole() -> None:
    stop = {"type": "message_delta", "delta": {"stop_reason": "max_tokens"}}
    call = {"type": "tool_use", "id": "toolu_a", "name": "echo", "input": {}}
    server = Server(
        anthropic_sse(
            [
                start(input_tokens=5),
                block_start(0, call),
                delta(0, type="input_json_delta", partial_json='{"text": "a"}'),
                block_start(1, {**call, "id": "toolu_b"}),
                ("message_delta", {**stop, "usage": {"output_tokens": 4}}),
                ("message_stop", {"type": "message_stop"}),
            ]
        )
    )
    done = (await collect(model_for(server), ask(tools=[ECHO])))[-1]
    assert isinstance(done, StreamDone)
    first, last = done.response.message.tool_calls
    assert first.arguments == {"text": "a"}
    assert last.arguments == {"_raw": ""}


async def test_the_forced_output_call_is_a_whole_answer() -> None:
    server = Server(anthropic_reply(tool_use("toolu_1", "Answer", n=1)))
    spec = OutputSpec(name="Answer", schema={"type": "object"})
    response = await model_for(server).complete(ask(output=spec))
    assert (response.message.text, response.finish_reason) == ('{"n": 1}', "stop")


async def test_a_stream_keeps_the_stop_reason() -> None:
    stop = {"type": "message_delta", "delta": {"stop_reason": "max_tokens"}}
    server = Server(
        anthropic_sse(
            [
                start(input_tokens=5),
                block_start(0, text_block("")),
                delta(0, type="text_delta", text="The answer is"),
                block_stop(0),
                ("message_delta", {**stop, "usage": {"output_tokens": 4}}),
                ("message_stop", {"type": "message_stop"}),
            ]
        )
    )
    done = (await collect(model_for(server), ask()))[-1]
    assert isinstance(done, StreamDone)
    assert done.response.finish_reason == "length"


@pytest.mark.parametrize(
    ("error", "kind", "retryable"),
    [
        ({"type": "overloaded_error", "message": "Said so"}, "server", True),
        ({"type": "invalid_request_error", "message": "Said so"}, "bad_request", False),
        (
            {"type": "invalid_request_error", "message": "Said so: prompt is too long"},
            CONTEXT_OVERFLOW,
            False,
        ),
        ({"message": "Said so", "code": 502}, "server", True),
    ],
)
async def test_an_error_body_of_status_200_is_classified_not_an_empty_reply(
    error: dict[str, Any], kind: str, retryable: bool
) -> None:
    # A gateway whose upstream failed after it answered sends status 200.
    server = Server(json_reply({"type": "error", "error": error}))
    with pytest.raises(ProviderError) as caught:
        await model_for(server).complete(ask())
    assert (caught.value.kind, caught.value.retryable) == (kind, retryable)
    assert "Said so" in caught.value.message


@pytest.mark.parametrize("body", [{}, {"id": "msg_1", "stop_reason": "end_turn"}])
async def test_a_reply_without_content_is_a_bad_response(body: dict[str, Any]) -> None:
    server = Server(json_reply(body))
    with pytest.raises(ProviderError) as caught:
        await model_for(server).complete(ask())
    assert caught.value.kind == "bad_response"
    assert "content" in caught.value.message


async def test_a_reply_with_a_null_error_is_a_reply() -> None:
    body = json.loads(anthropic_reply(text_block("Hi")).content)
    server = Server(json_reply({**body, "error": None}))
    response = await model_for(server).complete(ask())
    assert response.message.text == "Hi"


@pytest.mark.parametrize(
    ("kind", "status", "retryable"),
    [("overloaded_error", 529, True), ("invalid_request_error", 400, False)],
)
async def test_a_json_error_body_for_a_stream_is_classified_by_its_type(
    kind: str, status: int, retryable: bool
) -> None:
    body = {"type": "error", "error": {"type": kind, "message": "Said so"}}
    server = Server(json_reply(body))  # status 200, as some proxies send it
    with pytest.raises(ProviderError) as caught:
        await collect(model_for(server), ask())
    error = caught.value
    assert (error.status, error.retryable) == (status, retryable)
    assert "Said so" in error.message


async def test_a_whole_reply_for_a_stream_is_the_reply() -> None:
    server = Server(anthropic_reply(text_block("Hello!"), usage=(7, 2)))
    events = await collect(model_for(server), ask())
    assert events[0] == TextDelta(text="Hello!")
    done = events[-1]
    assert isinstance(done, StreamDone)
    assert done.response.usage == Usage(input_tokens=7, output_tokens=2)


async def test_a_streamed_event_that_is_not_json_fails_naming_the_event() -> None:
    """As an unstreamed body that is not JSON: an unreadable reply, not retried."""
    text = 'event: message_start\ndata: {"type": "message_start", bad\n\n'
    server = Server(
        httpx2.Response(
            200, content=text.encode(), headers={"content-type": "text/event-stream"}
        )
    )
    with pytest.raises(ProviderError) as info:
        await collect(model_for(server), ask())
    assert (info.value.kind, info.value.retryable) == ("bad_response", False)
    assert "a streamed event is not JSON" in str(info.value)
    assert '\'{"type": "message_start", bad\'' in str(info.value)


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


async def test_a_connection_dropped_mid_stream_says_the_stream_broke_off() -> None:
    """Not that the API could not be reached: it was, and it answered."""
    start = {
        "type": "message_start",
        "message": {"id": "m", "type": "message", "role": "assistant",
                    "model": "claude-test", "content": [],
                    "usage": {"input_tokens": 5, "output_tokens": 1}},
    }  # fmt: skip

    async def body() -> Any:
        yield f"event: message_start\ndata: {json.dumps(start)}\n\n".encode()
        raise httpx2.RemoteProtocolError("peer closed connection mid-body")

    server = Server(
        httpx2.Response(
            200, content=body(), headers={"content-type": "text/event-stream"}
        )
    )
    with pytest.raises(ProviderError) as info:
        await collect(model_for(server), ask())
    assert (info.value.kind, info.value.retryable) == ("connection", True)
    assert str(info.value).endswith(
        "the stream from the Anthropic API broke off: peer closed connection mid-body"
    )
