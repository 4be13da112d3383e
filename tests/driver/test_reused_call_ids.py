"""A model that repeats its tool call ids: each call still gets its own result."""

from __future__ import annotations

import pytest

from turnfsm import Agent
from turnfsm.messages import Message
from turnfsm.persistence import MemoryStore, child_sessions
from turnfsm.providers import ModelRequest, ModelResponse
from turnfsm.testing import FakeModelClient, reply, tool_call

pytestmark = pytest.mark.anyio


def answers(request: ModelRequest) -> list[str]:
    return [p.content for m in request.messages for p in m.tool_results]


def kid() -> Agent:
    return Agent(
        model=FakeModelClient(lambda r: reply(f"answer to {r.messages[-1].text}"))
    )


async def test_a_call_id_reused_in_the_next_turn_starts_a_new_sub_agent() -> None:
    def lead(request: ModelRequest) -> Message:
        n = sum(len(m.tool_results) for m in request.messages)
        if n < 2:
            return reply("", tool_call("kid", "call_0", task=f"task {'AB'[n]}"))
        return reply(
            " | ".join(p.content for m in request.messages for p in m.tool_results)
        )

    store = MemoryStore()
    agent = Agent(
        model=FakeModelClient(lead),
        tools=[kid().as_tool(name="kid", description="d")],
        store=store,
    )
    result = await agent.run("go")
    assert result.text == "answer to task A | answer to task B"
    calls = [c.id for m in agent.session.history for c in m.tool_calls]
    assert calls == ["call_0", "call_0_2"]
    assert len(await child_sessions(store, agent.session.id)) == 2


async def test_one_id_twice_in_a_batch_gets_two_results() -> None:
    def lead(request: ModelRequest) -> Message:
        if not request.messages[-1].tool_results:
            return reply(
                "",
                tool_call("kid", "same", task="task A"),
                tool_call("kid", "same", task="task B"),
            )
        return reply(" | ".join(answers(request)))

    store = MemoryStore()
    agent = Agent(
        model=FakeModelClient(lead),
        tools=[kid().as_tool(name="kid", description="d")],
        store=store,
    )
    result = await agent.run("go")
    assert result.outcome == "done", result.error
    assert sorted(result.text.split(" | ")) == ["answer to task A", "answer to task B"]
    assert len(await child_sessions(store, agent.session.id)) == 2


async def test_a_reply_object_the_model_gives_twice_joins_the_conversation_twice() -> (
    None
):
    # A client that caches its replies returns the same message, id and all:
    # a final answer was committed with an id the conversation had (its
    # counts, pins and compaction passes tell messages apart by id), and a
    # tool call refused as a message given twice.
    def echo(text: str) -> str:
        """Echo the text.

        Args:
            text: What to echo.
        """
        return text

    calling = ModelResponse(message=reply("", tool_call("echo", "c1", text="hi")))
    answer = ModelResponse(message=Message.assistant("cached answer"))
    agent = Agent(
        model=FakeModelClient(
            lambda r: answer if r.messages[-1].tool_results else calling
        ),
        tools=[echo],
    )

    for task in ("first", "second"):
        result = await agent.run(task)
        assert (result.outcome, result.text) == ("done", "cached answer")

    history = list(agent.session.history)
    assert [m.text for m in history if m.role.value == "user"] == ["first", "second"]
    assert len({m.id for m in history}) == len(history) == 8
    assert history[1].id == calling.message.id  # the first time, as it came
    assert history[3].id == answer.message.id
