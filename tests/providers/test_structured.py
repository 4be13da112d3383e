"""Structured output in each provider's native mode, as the SDKs send it."""

from __future__ import annotations

import dataclasses
from typing import Any

import anthropic
import openai
import pytest

from tests.providers._mock import (
    Server,
    anthropic_reply,
    anthropic_sse,
    json_reply,
    openai_reply,
    tool_use,
)
from turnfsm.driver import Driver
from turnfsm.driver._output import OutputType
from turnfsm.errors import ConfigError, ProviderError
from turnfsm.messages import Message, TextPart
from turnfsm.providers import ModelRequest, OutputSpec, ToolSchema
from turnfsm.providers._anthropic import AnthropicModel
from turnfsm.providers._openai import OpenAIModel
from turnfsm.providers._stream import StreamDone, TextDelta

pytestmark = pytest.mark.anyio


@dataclasses.dataclass
class Person:
    name: str
    age: int


def spec_of(tp: Any) -> OutputSpec:
    spec = OutputType.of(tp).spec
    assert spec is not None
    return spec


PERSON = spec_of(Person)
LOOSE = OutputSpec(
    name="Loose",
    schema={"type": "object", "properties": {"a": {"type": "integer"}}},
    strict=False,
)
ECHO = ToolSchema(
    name="echo",
    description="Echo the text back.",
    parameters={"type": "object", "properties": {"text": {"type": "string"}}},
)


def openai_model(server: Server, **kwargs: Any) -> OpenAIModel:
    client = openai.AsyncOpenAI(
        api_key="sk-test",
        base_url="http://llama.test/v1",
        http_client=server.http_client(),
    )
    return OpenAIModel("gpt-test", client=client, **kwargs)


def anthropic_model(server: Server) -> AnthropicModel:
    client = anthropic.AsyncAnthropic(
        api_key="sk-ant-test", http_client=server.http_client()
    )
    return AnthropicModel("claude-test", client=client, max_tokens=64)


def answer(call_id: str, **fields: Any) -> dict[str, Any]:
    return {"type": "tool_use", "id": call_id, "name": "Person", "input": fields}


def ask(output: OutputSpec | None, **kwargs: Any) -> ModelRequest:
    return ModelRequest(messages=[Message.user("who?")], output=output, **kwargs)


# -- OpenAI --------------------------------------------------------------------


async def test_openai_sends_a_strict_json_schema_response_format() -> None:
    server = Server(openai_reply('{"name": "Ada", "age": 36}'))

    response = await openai_model(server).complete(ask(PERSON))

    assert server.bodies[0]["response_format"] == {
        "type": "json_schema",
        "json_schema": {
            "name": "Person",
            "schema": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "age": {"type": "integer"},
                },
                "required": ["name", "age"],
                "additionalProperties": False,
            },
            "strict": True,
        },
    }
    assert response.message.text == '{"name": "Ada", "age": 36}'


async def test_openai_is_not_strict_when_the_schema_does_not_qualify() -> None:
    server = Server(openai_reply('{"a": 1}'))

    await openai_model(server).complete(ask(LOOSE))

    assert server.bodies[0]["response_format"]["json_schema"]["strict"] is False


async def test_no_output_sends_no_response_format() -> None:
    server = Server(openai_reply("hi"))

    await openai_model(server).complete(ask(None))

    assert "response_format" not in server.bodies[0]


async def test_llama_cpp_gets_json_object_with_the_schema() -> None:
    server = Server(openai_reply('{"name": "Ada", "age": 36}'))
    model = openai_model(server, structured_output="json_object")

    await model.complete(ask(PERSON))

    assert server.bodies[0]["response_format"] == {
        "type": "json_object",
        "schema": dict(PERSON.schema),
    }


# llama-cpp-python's server answers a body it cannot read with HTTP 500 (its
# route handler wraps FastAPI's validation error, a 422 elsewhere): here a
# json_schema response_format, which it does not take. Its message, as sent.
LLAMA_CPP_PYTHON_NO_JSON_SCHEMA = {
    "error": {
        "message": "1 validation error:\n  {'type': 'literal_error', 'loc': "
        "('body', 'response_format', 'type'), 'msg': \"Input should be 'text' "
        "or 'json_object'\", 'input': 'json_schema', 'ctx': {'expected': "
        "\"'text' or 'json_object'\"}}\n\n  File \"/venv/lib/python3.11/"
        'site-packages/llama_cpp/server/app.py", line 376, in '
        "create_chat_completion\n    POST /v1/chat/completions",
        "type": "internal_server_error",
        "param": None,
        "code": None,
    }
}
# llama.cpp's own server before it took json_schema (ik_llama.cpp still so).
LLAMA_SERVER_NO_JSON_SCHEMA = {
    "error": {
        "code": 500,
        "message": 'response_format type must be one of "text" or "json_object", '
        "but got: json_schema",
        "type": "server_error",
    }
}
NO_JSON_SCHEMA = {
    "llama-cpp-python": LLAMA_CPP_PYTHON_NO_JSON_SCHEMA,
    "llama-server": LLAMA_SERVER_NO_JSON_SCHEMA,
}


@pytest.mark.parametrize("body", NO_JSON_SCHEMA.values(), ids=NO_JSON_SCHEMA.keys())
async def test_a_server_without_json_schema_fails_at_once_naming_the_fix(
    body: dict[str, Any],
) -> None:
    # It was a retryable server error: the run asked 4 times, with backoff,
    # and failed the same way each time.
    server = Server(json_reply(body, 500))

    result = await Driver(model=openai_model(server), output_type=Person).run("who?")

    assert len(server.requests) == 1
    error = result.error
    assert isinstance(error, ProviderError)
    assert (error.kind, error.retryable, error.status) == ("bad_request", False, 500)
    said = str(error)
    assert "takes no response_format of type json_schema" in said
    assert 'structured_output="json_object"' in said
    assert "File " not in said  # the server's trace is left out


async def test_a_body_llama_cpp_python_cannot_read_is_not_retried() -> None:
    # Any request it cannot read is a 500 that would repeat.
    body = {
        "error": {
            "message": "1 validation error:\n  {'type': 'less_than_equal', 'loc': "
            "('body', 'temperature'), 'msg': 'Input should be less than or equal "
            'to 2\'}\n\n  File "/venv/llama_cpp/server/app.py", line 376, in '
            "create_chat_completion\n    POST /v1/chat/completions",
            "type": "internal_server_error",
        }
    }
    server = Server(json_reply(body, 500))

    with pytest.raises(ProviderError) as info:
        await openai_model(server).complete(ask(None))

    error = info.value
    assert (error.kind, error.retryable, error.status) == ("bad_request", False, 500)
    assert "('body', 'temperature')" in error.message
    assert "File " not in error.message


async def test_another_server_error_is_still_retried() -> None:
    body = {"error": {"message": "CUDA out of memory", "type": "server_error"}}

    with pytest.raises(ProviderError) as info:
        await openai_model(Server(json_reply(body, 500))).complete(ask(PERSON))

    assert (info.value.kind, info.value.retryable) == ("server", True)


def test_the_structured_mode_is_checked() -> None:
    with pytest.raises(ConfigError, match="structured_output"):
        OpenAIModel("gpt-test", api_key="sk", structured_output="grammar")  # type: ignore[arg-type]


def test_the_cli_local_client_uses_json_object() -> None:
    from turnfsm.cli._run import local_client

    client = local_client("http://127.0.0.1:9/v1")

    assert isinstance(client, OpenAIModel)
    assert client.structured_output == "json_object"


# -- Anthropic -----------------------------------------------------------------


async def test_anthropic_forces_a_tool_named_after_the_output() -> None:
    server = Server(anthropic_reply(answer("toolu_1", name="Ada", age=36)))

    response = await anthropic_model(server).complete(ask(PERSON))

    body = server.bodies[0]
    assert body["tools"] == [
        {
            "name": "Person",
            "description": "Give your final answer in this format.",
            "input_schema": dict(PERSON.schema),
        }
    ]
    assert body["tool_choice"] == {"type": "tool", "name": "Person"}
    # The forced call comes back as the reply's JSON text: no call without a result.
    assert response.message.parts == (TextPart(text='{"name": "Ada", "age": 36}'),)
    assert response.message.tool_calls == ()


async def test_anthropic_beside_real_tools_lets_the_model_pick_any_tool() -> None:
    server = Server(anthropic_reply(tool_use("toolu_1", "echo", text="a")))

    response = await anthropic_model(server).complete(ask(PERSON, tools=[ECHO]))

    body = server.bodies[0]
    assert [t["name"] for t in body["tools"]] == ["echo", "Person"]
    assert body["tool_choice"] == {"type": "any"}
    assert [c.name for c in response.message.tool_calls] == ["echo"]


async def test_anthropic_streamed_output_call_becomes_text() -> None:
    call = {"type": "tool_use", "id": "toolu_a", "name": "Person", "input": {}}
    server = Server(
        anthropic_sse(
            [
                (
                    "message_start",
                    {
                        "type": "message_start",
                        "message": {
                            "id": "msg_1",
                            "type": "message",
                            "role": "assistant",
                            "model": "claude-test",
                            "content": [],
                            "stop_reason": None,
                            "stop_sequence": None,
                            "usage": {"input_tokens": 5, "output_tokens": 0},
                        },
                    },
                ),
                (
                    "content_block_start",
                    {"type": "content_block_start", "index": 0, "content_block": call},
                ),
                *[
                    (
                        "content_block_delta",
                        {
                            "type": "content_block_delta",
                            "index": 0,
                            "delta": {"type": "input_json_delta", "partial_json": p},
                        },
                    )
                    for p in ('{"name": "Ada",', ' "age": 36}')
                ],
                (
                    "content_block_stop",
                    {"type": "content_block_stop", "index": 0},
                ),
                (
                    "message_delta",
                    {
                        "type": "message_delta",
                        "delta": {"stop_reason": "tool_use", "stop_sequence": None},
                        "usage": {"output_tokens": 9},
                    },
                ),
                ("message_stop", {"type": "message_stop"}),
            ]
        )
    )

    events = [e async for e in anthropic_model(server).stream(ask(PERSON))]

    # The answer's JSON streams as it comes, as the text of a JSON mode does.
    assert events[:-1] == [
        TextDelta(text='{"name": "Ada",'),
        TextDelta(text=' "age": 36}'),
    ]
    done = events[-1]
    assert isinstance(done, StreamDone)
    assert done.response.message.parts == (TextPart(text='{"name": "Ada", "age": 36}'),)


async def test_a_driver_run_on_anthropic_reads_the_forced_answer() -> None:
    server = Server(
        anthropic_reply(answer("toolu_1", name="Ada", age="x")),
        anthropic_reply(answer("toolu_2", name="Ada", age=36)),
    )
    driver = Driver(model=anthropic_model(server), output_type=Person)

    result = await driver.run("who?")

    assert result.output == Person("Ada", 36)
    second = server.bodies[1]["messages"]
    assert [m["role"] for m in second] == ["user", "assistant", "user"]
    assert second[1]["content"] == '{"name": "Ada", "age": "x"}'
    assert "age: expected integer" in str(second[2]["content"])
