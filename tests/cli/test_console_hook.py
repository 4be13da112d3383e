"""`turnfsm.hooks.ConsoleHook`: a run printed as it happens, for your own agent."""

from __future__ import annotations

import io

import anyio
import pytest

from turnfsm import Agent, ContextManager
from turnfsm.hooks import ConsoleHook
from turnfsm.testing import ScriptedModel, reply, tool_call
from turnfsm.tokens import HeuristicTokenCounter


def lookup(city: str, days: int = 1) -> str:
    """Look the weather up.

    Args:
        city: where.
        days: how many days.
    """
    return f"{city}: sunny for {days} day(s)"


def broken(city: str) -> str:
    """Fail.

    Args:
        city: where.
    """
    raise RuntimeError("down")


def _agent(out: io.StringIO, *, replies: bool, live: bool | None = None) -> Agent:
    return Agent(
        model=ScriptedModel.of(
            reply("", tool_call("lookup", "c1", city="Oslo", days=2)),
            reply("", tool_call("broken", "c2", city="Rome")),
            "Sunny in Oslo.",
        ),
        tools=[lookup, broken],
        context=ContextManager(context_window=10_000, counter=HeuristicTokenCounter()),
        hooks=[ConsoleHook(out, replies=replies, live=live)],
    )


@pytest.mark.parametrize("replies", [True, False])
def test_piped_it_prints_tool_names_arguments_and_results(replies: bool) -> None:
    out = io.StringIO()
    result = _agent(out, replies=replies).run_sync("Weather?")
    assert result.ok
    lines = out.getvalue().splitlines()
    assert '[tool] lookup({"city": "Oslo", "days": 2})' in lines
    assert "[tool] lookup -> 24 characters" in lines
    assert '[tool] broken({"city": "Rome"})' in lines
    assert any(
        line.startswith("[tool] broken -> ") and line.endswith("(an error result)")
        for line in lines
    )
    assert "  call_llm --model_replied--> done" in lines
    measures = [line for line in lines if line.startswith("[measure] request = ")]
    assert len(measures) == 3
    assert measures[0].endswith(
        "tokens (estimated), threshold line 8000, emergency line 9500, window 10000"
    )
    assert lines.count("Sunny in Oslo.") == (1 if replies else 0)
    assert "\x1b" not in out.getvalue()  # not a terminal: no status line


def test_live_on_a_stream_that_is_no_terminal_prints_the_same_lines() -> None:
    plain, live = io.StringIO(), io.StringIO()
    _agent(plain, replies=True).run_sync("Weather?")
    _agent(live, replies=True, live=True).run_sync("Weather?")
    assert live.getvalue().splitlines() == plain.getvalue().splitlines()


def test_it_is_exported_where_hooks_are() -> None:
    import turnfsm.hooks

    assert "ConsoleHook" in turnfsm.hooks.__all__


async def slow(city: str) -> str:
    """Take a long time.

    Args:
        city: where.
    """
    await anyio.sleep(30)
    return city


def test_a_tool_call_cut_short_is_said_to_be_interrupted() -> None:
    out = io.StringIO()
    agent = Agent(
        model=ScriptedModel.of(reply("", tool_call("slow", "c1", city="Oslo"))),
        tools=[slow],
        hooks=[ConsoleHook(out)],
    )

    async def cut_short() -> None:
        with anyio.move_on_after(0.5):  # as Ctrl-C cancels `turnfsm run`
            await agent.run("Weather?")

    anyio.run(cut_short)

    assert "[tool] slow interrupted" in out.getvalue().splitlines()
    assert "CancelledError" not in out.getvalue()
