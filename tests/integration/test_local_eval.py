"""`turnfsm eval --judge local`: the bundled model answers every probe.

The mechanics on a real model (real HTTP, a real tokenizer): a user's stored
session is replayed under truncation, and Gemma 3 270M on llama.cpp is
asked each probe's question over each final context. What it answers is not
checked (a small base model), only that each probe got an answer and the
table shows the judge's column.

Skipped when the ``local`` extra is missing, unless TURNFSM_REQUIRE_LOCAL_MODEL
is set (CI sets it).
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from tests.integration._local import require_local_extra
from turnfsm import Agent
from turnfsm.cli import main
from turnfsm.persistence import Session, SQLiteStore
from turnfsm.testing import ScriptedModel

require_local_extra()

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


def test_the_local_judge_answers_every_probe(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "sessions.db"
    anyio.run(_record, db)
    probes = tmp_path / "probes.toml"
    probes.write_text(
        '[[probe]]\nsession = "support-42"\nkind = "fact"\n'
        'question = "What is the deploy code?"\nexpect = "7431"\n'
        '[[probe]]\nkind = "next_step"\n'
        'question = "What did the user ask last?"\nexpect = "How are things"\n'
    )
    argv = ["eval", "support-42", "--probes", str(probes), "--store", str(db)]
    argv += ["--window", "2000", "--judge", "local"]
    argv += ["--strategy", "truncating"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "| judge right |" in out
    assert "Judge: local" in out
    rows = [line for line in out.splitlines() if line.startswith("| support-42 |")]
    assert len(rows) == 2  # one row per probe
    for row in rows:  # present/judged marks: the judge answered each probe
        assert row.count("/") == 2
