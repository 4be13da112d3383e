"""A cancelled run ends every span it opened, wherever the cancel lands.

Cancelled by the run's `RunControl`, or interrupted by a cancel scope around the run,
while the model answers, a tool runs, a summary call runs inside a
compaction pass, or the retry policy waits: every span that started is
exported, and exactly the ones the cancel cut short carry
``turnfsm.cancelled`` (on asyncio and trio, as every test here).
"""

from __future__ import annotations

from typing import Literal

import anyio
import pytest

from tests.tracing._spans import Named, Traced, history, said, traced_driver
from turnfsm.context import ContextManager, SummarizingCompactor
from turnfsm.driver import Driver, RetryPolicy, RunControl, Session
from turnfsm.errors import ProviderError
from turnfsm.messages import Message
from turnfsm.providers import ModelRequest, ModelResponse
from turnfsm.testing import FakeModelClient, tool_call
from turnfsm.tokens import HeuristicTokenCounter
from turnfsm.tracing import attributes as A

pytestmark = pytest.mark.anyio

Where = Literal["model", "tool", "summary", "backoff"]

ROOT = "invoke_agent assistant"
CUT: dict[Where, list[str]] = {
    "model": ["chat gpt-test", ROOT, "turnfsm.turn 1"],
    "tool": ["execute_tool hang", ROOT, "turnfsm.turn 1"],
    "summary": ["chat summarizer", ROOT, "turnfsm.compaction", "turnfsm.turn 1"],
    "backoff": [ROOT, "turnfsm.turn 1"],  # the failed attempt had ended
}


def _scenario(
    traced: Traced, where: Where, reached: anyio.Event
) -> tuple[Driver, list[Message]]:
    """A driver that blocks at `where` (setting `reached`), and its input."""

    async def hang() -> str:
        """Hang until cancelled."""
        reached.set()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    async def hang_model(request: ModelRequest) -> ModelResponse:
        await hang()
        raise AssertionError("unreachable")

    async def answer(request: ModelRequest) -> ModelResponse:
        if where == "model":
            await hang()
        if where == "backoff":
            reached.set()  # the cancel lands in the wait before the retry
            raise ProviderError("slow down", retryable=True, kind="rate_limit")
        return said("", tool_call("hang", "c1"))

    model = FakeModelClient(answer)
    if where == "summary":
        summaries = Named(FakeModelClient(hang_model), model="summarizer")
        context = ContextManager(
            SummarizingCompactor(model=summaries, keep_recent_turns=2),
            context_window=4_000,
            threshold=60,
            counter=HeuristicTokenCounter(),
        )
        return traced_driver(traced, model, context=context), history(10, 500)
    retry = RetryPolicy(max_attempts=2, initial_wait=60, jitter=False)
    return traced_driver(traced, model, tools=[hang], retry=retry), [Message.user("go")]


@pytest.mark.parametrize("how", ["control", "scope"])
@pytest.mark.parametrize("where", ["model", "tool", "summary", "backoff"])
async def test_a_cancel_ends_every_open_span(where: Where, how: str) -> None:
    traced = Traced.create()
    reached = anyio.Event()
    driver, messages = _scenario(traced, where, reached)
    control = RunControl()
    session = Session()
    with anyio.fail_after(5):
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as group:

                async def cancel() -> None:
                    await reached.wait()
                    if how == "control":
                        control.cancel("user pressed stop")
                    else:
                        scope.cancel()

                group.start_soon(cancel)
                await driver.run(messages, session=session, control=control)
    assert scope.cancelled_caught == (how == "scope")  # a scope's cancel propagates
    # The run's own control cancels it; a cancel from outside interrupts it.
    outcome = "cancelled" if how == "control" else "interrupted"
    assert session.runs[-1].outcome == outcome
    assert traced.unended() == []
    [(_, _, root, _)] = traced.tree()  # every started span was exported
    assert root[A.RUN_OUTCOME] == outcome
    cut = sorted(s.name for s in traced.spans if (s.attributes or {}).get(A.CANCELLED))
    assert cut == CUT[where]
