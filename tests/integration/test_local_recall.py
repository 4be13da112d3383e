"""The recall tool on the real local model, its call forced: logged and replayed.

A scripted first part reads a tool result into the session and a summary
pass replaces it; then the bundled model, made to call a tool
(``tool_choice="required"``, the recall tool the only one offered), calls
``recall`` on the real llama.cpp server. The tiny base model picks its own
arguments, so the test checks the mechanics, not its wits: the call ran
against the run's own session, its result is in the log like any tool
result, and the run replays exactly.
"""

from __future__ import annotations

from collections.abc import Iterator

import anyio
import pytest

from tests.integration._local import require_local_extra, threads
from turnfsm import Agent, recall_tool
from turnfsm.context import ContextManager, SummarizingCompactor, replaced_ids
from turnfsm.driver import RetryPolicy, Session, replay
from turnfsm.messages import Role
from turnfsm.persistence import MemoryStore, event_messages
from turnfsm.testing import FakeModelClient, reply, tool_call

require_local_extra()

from turnfsm.providers import LlamaServer, OpenAIModel  # noqa: E402

pytestmark = [pytest.mark.local_model, pytest.mark.slow, pytest.mark.timeout(1200)]

N_CTX = 2048
SECRET = "vault code 4711-ZEBRA"


def read_vault() -> str:
    """Read the vault's log."""
    return f"vault log: {SECRET}\n" + "padding line of the vault log\n" * 40


@pytest.fixture(scope="module")
def server() -> Iterator[LlamaServer]:
    with LlamaServer(n_ctx=N_CTX, n_threads=threads()) as running:
        yield running


def summarising() -> ContextManager:
    summary = FakeModelClient(lambda _r: "## Active Task\nAnswer about the vault.")
    return ContextManager(
        SummarizingCompactor(model=summary, keep_recent_turns=1),
        context_window=N_CTX,
    )


async def archived(store: MemoryStore) -> Session:
    """A session whose vault read a summary pass replaced."""
    script = iter(
        [
            reply("", tool_call("read_vault", "call_read")),
            "I read the vault log.",
            "Noted.",
        ]
    )
    agent = Agent(
        model=FakeModelClient(lambda _r: next(script)),
        tools=[read_vault],
        context=summarising(),
        store=store,
    )
    assert (await agent.run("read the vault log")).ok
    assert (await agent.run("thanks")).ok
    assert (await agent.compact()).ok
    assert SECRET not in "".join(
        m.text + "".join(p.content for p in m.tool_results)
        for m in agent.session.history
    )
    assert any(replaced_ids(m) for m in agent.session.history)
    return agent.session


def test_the_local_model_calls_recall_and_the_run_replays_exactly(
    server: LlamaServer,
) -> None:
    store = MemoryStore()

    async def go() -> tuple[Session, str]:
        session = await archived(store)
        model = OpenAIModel(
            model="local",
            base_url=server.base_url,
            context_window=server.context_window,
            tool_choice="required",  # a base model: make it call the tool
        )
        agent = Agent(
            model=model,
            tools=[recall_tool(max_chars=1_500)],
            system_prompt="Use recall to read back the vault log, then answer.",
            context=summarising(),
            # Room for the whole call: the model lists ids at length, and a
            # call cut off at its budget fails the run, naming the budget.
            max_output_tokens=160,
            max_turns=2,
            retry=RetryPolicy(max_attempts=1),
            model_timeout=300,
            session=session,
        )
        try:
            result = await agent.run("What is the vault code?")
        finally:
            await model.close()
        return session, result.run_id

    session, run_id = anyio.run(go)
    run = session.run(run_id)
    calls = [
        c
        for t in run.turns
        for c in session.message(t.output).tool_calls
        if c.name == "recall"
    ]
    assert calls, "the forced call did not reach the recall tool"
    logged = [
        m for entry in session.run_entries(run_id) for m in event_messages(entry.event)
    ]
    results = [
        p
        for m in logged
        if m.role is Role.TOOL
        for p in m.tool_results
        if p.call_id in {c.id for c in calls}
    ]
    assert results, "the recall result is not in the log"
    # The tool ran in the run's session (bad arguments are an error result
    # naming them; a call outside a run would say so).
    for part in results:
        assert "has no conversation to read" not in part.content
        assert part.is_error or part.content.startswith("recalled")
    print(
        f"run {run.outcome}; recall arguments {[c.arguments for c in calls]}; "
        f"secret recalled: {any(SECRET in p.content for p in results)}"
    )
    reopened = anyio.run(Session.load, store, session.id)
    assert replay(None, reopened, run_id).ok
