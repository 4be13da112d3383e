"""``--machine`` names what the command line can run; it refuses the rest plainly."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests import docs_tables
from turnfsm.cli import main

Capture = pytest.CaptureFixture[str]


def test_the_help_offers_review_only_with_an_agent_of_yours() -> None:
    # It offered "a shipped one by its name (approval, review)", and
    # `--machine review` is always refused: its reviewer is code.
    text = " ".join(docs_tables.cli_help("run")().split())
    assert "(approval, review)" not in text
    assert "approval (review needs a reviewer of your own" in text
    assert "give --agent)" in text


def test_simulate_on_a_machine_with_an_effect_names_the_option(
    tmp_path: Path, capsys: Capture
) -> None:
    # It said "invalid effects=['compact', 'run_tools']", an option no one typed.
    store = ["--store", str(tmp_path / "s.db")]
    assert main(["demo", *store]) == 0
    found = re.search(r"session (ses_\w+) stored in", capsys.readouterr().out)
    assert found is not None

    assert main(["simulate", found.group(1), "--machine", "review", *store]) == 2

    assert capsys.readouterr().err == (
        "turnfsm simulate: invalid --machine='review': expected a machine a "
        "simulation can run; this one needs an effect named 'review' for phase "
        "'await_review', code of your own that a simulation has not\n"
    )
