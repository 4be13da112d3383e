"""The real clients behind the real driver, over a scripted HTTP server."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import anthropic
import anyio
import openai
import pytest

from tests.providers._mock import (
    Server,
    anthropic_error,
    anthropic_reply,
    json_reply,
    openai_call,
    openai_reply,
    text_block,
    tool_use,
)
from turnfsm.context import (
    ContextManager,
    MaskingCompactor,
    SummarizingCompactor,
    TruncatingCompactor,
)
from turnfsm.driver import Driver, RetryPolicy, Session
from turnfsm.messages import Message
from turnfsm.providers._anthropic import AnthropicModel
from turnfsm.providers._openai import OpenAIModel
from turnfsm.tokens import HeuristicTokenCounter

pytestmark = pytest.mark.anyio

NO_WAIT = RetryPolicy(max_attempts=3, initial_wait=0, jitter=False)
OVERFLOW_BODY = {
    "error": {
        "message": "This model's maximum context length is 1024 tokens. However, "
        "you requested 1630 tokens (1610 in the messages, 20 in the completion). "
        "Please reduce the length of the messages or completion.",
        "type": "invalid_request_error",
        "param": "messages",
        "code": "context_length_exceeded",
    }
}


def echo(text: str) -> str:
    """Echo the text back.

    Args:
        text: what to echo.
    """
    return text


def openai_model(server: Server) -> OpenAIModel:
    client = openai.AsyncOpenAI(
        api_key="sk-test",
        base_url="http://llama.test/v1",
        http_client=server.http_client(),
    )
    return OpenAIModel("local", client=client)


def anthropic_model(server: Server) -> AnthropicModel:
    client = anthropic.AsyncAnthropic(api_key="k", http_client=server.http_client())
    return AnthropicModel("claude-test", client=client)


def history(n: int, size: int = 200) -> list[Message]:
    out: list[Message] = []
    for i in range(n):
        out.append(Message.user(f"question {i} " + "q" * size))
        out.append(Message.assistant(f"answer {i} " + "a" * size))
    return out


def driver(model: Any, **kwargs: Any) -> Driver:
    context = ContextManager(
        TruncatingCompactor(),
        context_window=100_000,
        counter=HeuristicTokenCounter(),
    )
    return Driver(model=model, context=context, retry=NO_WAIT, **kwargs)


async def test_openai_tool_call_then_final_answer() -> None:
    server = Server(
        openai_reply(None, openai_call("call_1", "echo", '{"text": "hi"}')),
        openai_reply("done: hi", usage=(30, 4)),
    )
    with anyio.fail_after(10):
        result = await driver(openai_model(server), tools=[echo]).run("say hi")
    assert (result.outcome, result.text, result.turns) == ("done", "done: hi", 2)
    assert result.usage.output_tokens == 3 + 4
    first, second = server.bodies
    assert [t["function"]["name"] for t in first["tools"]] == ["echo"]
    assert second["messages"][1:] == [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [openai_call("call_1", "echo", '{"text":"hi"}')],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "hi"},
    ]


async def test_a_call_with_an_empty_name_is_answered_and_the_run_goes_on() -> None:
    server = Server(
        openai_reply(None, openai_call("call_1", "", '{"text": "hi"}')),
        openai_reply("done"),
    )
    with anyio.fail_after(10):
        result = await driver(openai_model(server), tools=[echo]).run("say hi")
    assert (result.outcome, result.text, result.turns) == ("done", "done", 2)
    call, answer = server.bodies[1]["messages"][-2:]
    assert call["tool_calls"][0]["function"]["name"] == "missing_tool_name"
    assert answer["content"].startswith("[error] tool 'missing_tool_name'")


async def test_anthropic_tool_call_then_final_answer() -> None:
    server = Server(
        anthropic_reply(tool_use("toolu_1", "echo", text="hi")),
        anthropic_reply(text_block("done: hi")),
    )
    with anyio.fail_after(10):
        result = await driver(
            anthropic_model(server), tools=[echo], system_prompt="be brief"
        ).run("say hi")
    assert (result.outcome, result.text, result.turns) == ("done", "done: hi", 2)
    first, second = server.bodies
    assert first["system"] == second["system"] == "be brief"
    assert second["messages"][1:] == [
        {"role": "assistant", "content": [tool_use("toolu_1", "echo", text="hi")]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "hi"}
            ],
        },
    ]


async def test_an_anthropic_turn_that_thought_sends_its_thinking_with_the_results() -> (
    None
):
    # A model that thinks before it calls a tool: Anthropic refuses the
    # call's result unless the thinking comes back with it, unchanged.
    thinking = {"type": "thinking", "thinking": "echo it", "signature": "c2ln"}
    redacted = {"type": "redacted_thinking", "data": "b3BhcXVl"}
    call = tool_use("toolu_1", "echo", text="hi")
    server = Server(
        anthropic_reply(thinking, redacted, call),
        anthropic_reply(thinking, text_block("done: hi")),
    )
    session = Session()
    with anyio.fail_after(10):
        result = await driver(anthropic_model(server), tools=[echo]).run(
            "say hi", session=session
        )
    assert (result.outcome, result.text) == ("done", "done: hi")
    assert server.bodies[1]["messages"][1] == {
        "role": "assistant",
        "content": [thinking, redacted, call],
    }


async def test_an_anthropic_call_cut_off_at_max_tokens_never_runs() -> None:
    # Anthropic sends the input of a call it cut off read as far as it came:
    # it looks whole, but the last arguments are missing.
    body = json.loads(anthropic_reply(tool_use("toolu_1", "shout", text="ha")).content)
    ran: list[str] = []

    def shout(text: str) -> str:
        """Shout the text.

        Args:
            text: what to shout.
        """
        ran.append(text)
        return text.upper()

    server = Server(json_reply({**body, "stop_reason": "max_tokens"}))
    session = Session()
    with anyio.fail_after(10):
        result = await driver(anthropic_model(server), tools=[shout]).run(
            "shout", session=session
        )
    assert result.outcome == "failed"
    assert result.error is not None
    assert result.error.kind == "max_tokens"
    assert "call to 'shout'" in str(result.error)
    assert ran == []
    assert len(server.requests) == 1


OVERFLOW_THEN_OK: dict[str, tuple[Callable[[Server], Any], Server]] = {
    "openai": (
        openai_model,
        Server(json_reply(OVERFLOW_BODY, 400), openai_reply("ok after compaction")),
    ),
    "anthropic": (
        anthropic_model,
        Server(
            anthropic_error(
                400, "invalid_request_error", "prompt is too long: 9000 > 8000"
            ),
            anthropic_reply(text_block("ok after compaction")),
        ),
    ),
}


@pytest.mark.parametrize("provider", OVERFLOW_THEN_OK.keys())
async def test_overflow_compacts_and_retries_then_succeeds(provider: str) -> None:
    make, template = OVERFLOW_THEN_OK[provider]
    server = Server(*template.replies)  # a fresh script for each backend
    session = Session()
    with anyio.fail_after(10):
        result = await driver(make(server)).run(history(6), session=session)
    assert (result.outcome, result.text) == ("done", "ok after compaction")
    first, second = server.bodies
    assert len(second["messages"]) < len(first["messages"])
    events = [type(e).__name__ for e in session.runs[0].events]
    assert events[:5] == [
        "RunStarted",
        "Measured",
        "ContextOverflowed",
        "CompactionResult",
        "ModelReplied",
    ]


async def test_a_rate_limit_is_retried_by_the_driver_not_the_sdk() -> None:
    limited = json_reply(
        {"error": {"message": "slow down", "type": "requests"}},
        429,
        {"retry-after": "0"},
    )
    server = Server(limited, openai_reply("fine"))
    with anyio.fail_after(10):
        result = await driver(openai_model(server)).run("hi")
    assert (result.outcome, result.text) == ("done", "fine")
    assert len(server.requests) == 2


async def test_an_auth_error_fails_the_run_with_the_hint() -> None:
    server = Server(anthropic_error(401, "authentication_error", "invalid x-api-key"))
    with anyio.fail_after(10):
        result = await driver(anthropic_model(server)).run("hi")
    assert result.outcome == "failed"
    assert "ANTHROPIC_API_KEY" in str(result.error)
    assert len(server.requests) == 1


def list_dir() -> str:
    """List the files here."""
    return "report-\udcff.txt"  # a name os.listdir decodes from bytes not UTF-8


LONE_SURROGATE_TOOL: dict[str, tuple[Callable[[Server], Any], Server]] = {
    "openai": (
        openai_model,
        Server(
            openai_reply(None, openai_call("call_1", "list_dir", "{}")),
            openai_reply("one file"),
        ),
    ),
    "anthropic": (
        anthropic_model,
        Server(
            anthropic_reply(tool_use("toolu_1", "list_dir")),
            anthropic_reply(text_block("one file")),
        ),
    ),
}


@pytest.mark.parametrize("provider", LONE_SURROGATE_TOOL.keys())
async def test_text_with_a_lone_surrogate_is_sent_as_a_replacement_character(
    provider: str,
) -> None:
    make, template = LONE_SURROGATE_TOOL[provider]
    server = Server(*template.replies)
    with anyio.fail_after(10):
        result = await driver(make(server), tools=[list_dir]).run("ls \udcfe")
    assert (result.outcome, result.text) == ("done", "one file")
    first, second = server.bodies
    assert "ls \ufffd" in json.dumps(first["messages"][0], ensure_ascii=False)
    assert "report-\ufffd.txt" in json.dumps(second["messages"], ensure_ascii=False)


def look(query: str) -> str:
    """Look something up.

    Args:
        query: what to look up.
    """
    return f"found {query}"


@pytest.mark.parametrize("compactor", ["truncating", "masking", "summarizing"])
async def test_a_thinking_tool_loop_compacts_before_its_thinking_is_over_the_window(
    compactor: str,
) -> None:
    # Each reply thinks at length (about 1,000 tokens) before it calls a
    # tool, and its thinking goes back in every later request. The
    # counters did not count it: the window check saw a few tokens a turn,
    # never compacted, and the 12th request was about 12,000 tokens on a
    # 6,000-token window.
    window = 6_000
    thought = "I should look this up again, to be sure of it. " * 80  # 4,000 chars
    sizes: list[int] = []
    thinking = {"type": "thinking", "thinking": thought, "signature": "c2ln" * 8}

    def reply(request: Any) -> Any:
        body = json.loads(request.content)
        if "tools" not in body:  # a summary's request
            return anthropic_reply(text_block("the user asked to look things up"))
        # The request's size, as the heuristic counter reads it, at the least:
        # the thinking blocks' JSON and every text sent.
        chars = sum(
            len(json.dumps(block, ensure_ascii=False))
            if block.get("type") in ("thinking", "redacted_thinking")
            else len(json.dumps(block, ensure_ascii=False)) // 2
            for m in body["messages"]
            if isinstance(m["content"], list)
            for block in m["content"]
        )
        sizes.append(chars // 4)
        n = len(sizes)
        if n == 12:
            return anthropic_reply(thinking, text_block("done"), usage=(chars // 4, 3))
        call = tool_use(f"toolu_{n}", "look", query=f"item {n}")
        return anthropic_reply(thinking, call, usage=(chars // 4, 3))

    made: Any = {
        # One task, one long exchange: the cut falls inside it.
        "truncating": TruncatingCompactor(compact_newest_exchange=True),
        "masking": MaskingCompactor(),
        "summarizing": SummarizingCompactor(compact_newest_exchange=True),
    }[compactor]
    context = ContextManager(
        made, context_window=window, counter=HeuristicTokenCounter()
    )
    server = Server(reply)
    model = anthropic_model(server)
    agent = Driver(model=model, context=context, retry=NO_WAIT, tools=[look])
    with anyio.fail_after(30):
        result = await agent.run("look up twelve items")
    assert len(sizes) >= 12, (result.outcome, result.error)
    assert max(sizes) <= window, sizes
    # Each reply's thinking still goes back with its own call.
    last = server.bodies[-1]["messages"]
    for m in last:
        if m["role"] == "assistant" and isinstance(m["content"], list):
            kinds = [b["type"] for b in m["content"]]
            if "tool_use" in kinds:
                assert m["content"][0] == thinking, kinds
