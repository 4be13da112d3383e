"""A real summary model: Gemma 3 270M on llama.cpp writes the session's summaries.

A session crosses the threshold line twice. The first pass writes a first
summary; the second updates it (its prompt carries the first summary under
"PREVIOUS SUMMARY:"); both are stored in the session's SQLite log and the
runs complete. The agent's own turns come from a script, so that what is
proven is the summary path: real HTTP, real tokenizer, real replies.

Skipped when the ``local`` extra is missing, unless TURNFSM_REQUIRE_LOCAL_MODEL
is set (CI sets it).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from tests.integration._local import require_local_extra, threads
from turnfsm.context import ContextManager, SummarizingCompactor
from turnfsm.driver import Driver, RetryPolicy, Session
from turnfsm.messages import SUMMARY_COVERS, Message
from turnfsm.persistence import SQLiteStore, SummaryRecorded
from turnfsm.providers import ModelClient, ModelRequest, ModelResponse
from turnfsm.testing import FakeModelClient

require_local_extra()

from turnfsm.providers import LlamaServer, OpenAIModel  # noqa: E402

pytestmark = [pytest.mark.local_model, pytest.mark.slow, pytest.mark.timeout(1200)]

N_CTX = 2048


@pytest.fixture(scope="module")
def server() -> Iterator[LlamaServer]:
    with LlamaServer(n_ctx=N_CTX, n_threads=threads()) as running:
        yield running


class Recording:
    """Wraps the real summary model and keeps every prompt it was sent."""

    def __init__(self, model: ModelClient) -> None:
        self.model = model
        self.prompts: list[str] = []

    async def complete(self, request: ModelRequest) -> ModelResponse:
        self.prompts.append(request.messages[-1].text)
        return await self.model.complete(request)


def facts(start: int, count: int) -> list[Message]:
    out: list[Message] = []
    for i in range(start, start + count):
        out.append(
            Message.user(
                f"Note {i}: the server in rack {i} has IP 10.0.{i}.7 and owner "
                f"Dana{i}. " + "It runs the billing service nightly. " * 12
            )
        )
        out.append(Message.assistant(f"Noted: rack {i}, 10.0.{i}.7, Dana{i}."))
    return out


def test_a_real_model_writes_a_first_summary_then_updates_it(
    server: LlamaServer, tmp_path: Path
) -> None:
    async def go() -> tuple[Session, Recording, list[str]]:
        real = OpenAIModel(model="local", base_url=server.base_url)
        summaries = Recording(real)
        agent = FakeModelClient(lambda _r: "Noted.")
        store = SQLiteStore(tmp_path / "sessions.db")
        driver = Driver(
            model=agent,
            context=ContextManager(
                SummarizingCompactor(
                    model=summaries,  # type: ignore[arg-type]
                    keep_recent_turns=2,
                    max_summary_tokens=160,
                    summary_window=N_CTX,
                ),
                context_window=2_000,
                threshold=60,
            ),
            retry=RetryPolicy(max_attempts=2, initial_wait=0.1),
            model_timeout=240,
            # A summary on two shared cores can take minutes under load: the
            # test checks what is summarised, not how fast.
            compaction_timeout=480,
        )
        session = Session(store=store)
        outcomes = []
        try:
            for batch in (facts(0, 8), facts(8, 6)):
                result = await driver.run(batch, session=session)
                outcomes.append(result.outcome if result.ok else str(result.error))
            reopened = await Session.load(store, session.id)
        finally:
            await real.close()
            await store.aclose()
        return reopened, summaries, outcomes

    session, summaries, outcomes = anyio.run(go)
    assert outcomes == ["done", "done"]
    recorded = [e for e in session.entries if isinstance(e, SummaryRecorded)]
    assert len(recorded) == 2, [type(e).__name__ for e in session.entries]
    first, second = recorded
    assert first.content.strip()
    assert second.content.strip()
    assert second.message_id != first.message_id
    # The update's prompt carried the first summary (possibly through chunks:
    # the last prompt of the second pass is the one that folds it in).
    body = first.content.split("\n\n", 1)[1].strip()
    updates = [p for p in summaries.prompts if "PREVIOUS SUMMARY:" in p]
    assert updates, "no iterative-update prompt was sent"
    assert body[:200] in updates[-1]
    assert "NEW TURNS TO INCORPORATE:" in updates[-1]
    # The working history starts with the latest summary.
    head = session.history[0]
    assert head.id == second.message_id
    assert SUMMARY_COVERS in head.metadata
    runs = session.runs
    assert all(c.usage is not None for r in runs for c in r.compactions if c.compacted)
