"""The local model as the judge: it answers every probe over the final context.

The mechanics on a real model (real HTTP, a real tokenizer): a user's stored
session is replayed under truncation, and Gemma 3 270M on llama.cpp is
asked each probe's question over each final context. What it answers is not
checked (a small base model), only that each probe got one and the table
shows the judge's column.

Skipped when the ``local`` extra is missing, unless TURNFSM_REQUIRE_LOCAL_MODEL
is set (CI sets it).
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from tests.integration._local import require_local_extra, threads
from turnfsm import Agent
from turnfsm.evals import Evaluation, evaluate, load_probes, shipped_strategy
from turnfsm.persistence import Session, SQLiteStore
from turnfsm.testing import ExtractiveSummaryModel, ScriptedModel

require_local_extra()

from turnfsm.providers import LlamaServer, OpenAIModel  # noqa: E402

pytestmark = [pytest.mark.local_model, pytest.mark.slow, pytest.mark.timeout(600)]


async def _record(path: Path) -> None:
    store = SQLiteStore(path)
    agent = Agent(
        model=ScriptedModel.of("Hello.", "Noted.", *["Fine."] * 4),
        session=Session("support-42", store=store),
    )
    await agent.run("Hello!")
    await agent.run("Remember: the deploy code is 7431. " + "Some detail. " * 150)
    for _ in range(4):
        await agent.run("How are things? " + "More detail. " * 150)
    await store.aclose()


def test_the_local_judge_answers_every_probe(tmp_path: Path) -> None:
    db = tmp_path / "sessions.db"
    anyio.run(_record, db)
    probes = tmp_path / "probes.toml"
    probes.write_text(
        '[[probe]]\nsession = "support-42"\nkind = "fact"\n'
        'question = "What is the deploy code?"\nexpect = "7431"\n'
        '[[probe]]\nkind = "next_step"\n'
        'question = "What did the user ask last?"\nexpect = "How are things"\n'
    )
    evaluation = anyio.run(_judged, db, probes)
    (result,) = evaluation.results
    assert [p.probe.question for p in result.probes] == [
        "What is the deploy code?",
        "What did the user ask last?",
    ]
    for probe in result.probes:  # the model answered (right or not)
        assert isinstance(probe.answer, str)
        assert probe.answer.strip()
    assert "| judge right |" in evaluation.table()


async def _judged(db: Path, probes: Path) -> Evaluation:
    store = SQLiteStore(db)
    session = await Session.load(store, "support-42")
    await store.aclose()
    with LlamaServer(n_ctx=4096, n_threads=threads()) as server:
        judge = OpenAIModel(model="local", base_url=server.base_url, timeout=600)
        try:
            return await evaluate(
                [session],
                load_probes(probes),
                strategies={"truncating": lambda m: shipped_strategy("truncating", m)},
                window=2_000,
                summary_model=ExtractiveSummaryModel(),
                judge=judge,
            )
        finally:
            await judge.close()
