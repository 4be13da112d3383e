"""A 640-token local window with the defaults: ten runs, none fails for want of a pass.

The real llama.cpp server runs the bundled model with ``n_ctx`` 640; the agent
takes that window from the server and the default strategy. Each run reads one
long page through a tool (about 500 tokens, most of the window), so the
request crosses the lines after the first tool call. With the truncator alone
as the default, two runs in four stalled at 513 tokens; with the default
strategy every run ends done, or at its turn limit when the tiny base model
keeps calling the tool, and never with a context error.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Literal

import anyio
import pytest

from tests.integration._local import require_local_extra, threads
from turnfsm.agent import Agent
from turnfsm.driver import RetryPolicy, RunResult, Session
from turnfsm.errors import ContextExceeded

require_local_extra()

from turnfsm.providers import LlamaServer, OpenAIModel  # noqa: E402

pytestmark = [pytest.mark.local_model, pytest.mark.slow, pytest.mark.timeout(1200)]

N_CTX = 640
RUNS = 10

PAGE = " ".join(
    f"Line {i}: the pump at station {i % 7} reported pressure {40 + i}."
    for i in range(60)
)


def read_page(name: Literal["today"]) -> str:
    """Read a page of the station log.

    Args:
        name: the page to read: "today", the only one (its call's arguments
            are then a few tokens, not a free string up to the reply's limit).
    """
    return PAGE


@pytest.fixture(scope="module")
def server() -> Iterator[LlamaServer]:
    with LlamaServer(n_ctx=N_CTX, n_threads=threads()) as running:
        yield running


def test_ten_runs_in_a_640_token_window_never_fail_for_want_of_a_pass(
    server: LlamaServer,
) -> None:
    sessions = [Session() for _ in range(RUNS)]

    async def runs() -> list[RunResult]:
        model = OpenAIModel(
            model="local",
            base_url=server.base_url,
            context_window=server.context_window,
            tool_choice="required",  # a base model: make it read the page
        )
        agent = Agent(
            model=model,
            tools=[read_page],
            system_prompt="Read the page with read_page, then answer in a few words.",
            max_output_tokens=24,
            max_turns=3,
            retry=RetryPolicy(max_attempts=1),
            model_timeout=120,
        )
        try:
            out = []
            for i, session in enumerate(sessions):
                question = f"Run {i}: which station reported last?"
                out.append(await agent.run(question, session=session))
            return out
        finally:
            await model.close()

    results = anyio.run(runs)

    outcomes = Counter(r.outcome if r.ok else type(r.error).__name__ for r in results)
    calls = sum(
        len(t.tool_calls)
        for s in sessions
        for m in s.runs[0].turns
        for t in [s.message(m.output)]
    )
    passes = Counter(c.verdict.value for s in sessions for c in s.runs[0].compactions)
    print(
        f"{RUNS} runs in a {N_CTX}-token window: {dict(outcomes)}; "
        f"{calls} tool calls; passes {dict(passes)}"
    )
    assert calls >= RUNS  # the page was read: the window was really put to work
    assert not [r.error for r in results if isinstance(r.error, ContextExceeded)]
    assert set(outcomes) <= {"done", "MaxTurnsExceeded"}
