"""A run paused in a phase of yours that waits for a signal, not a review."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from turnfsm import Agent, review_machine
from turnfsm.cli import main
from turnfsm.core import MachineSpec
from turnfsm.testing import FakeModelClient, reply

Capture = pytest.CaptureFixture[str]
AGENT = "tests.cli.test_signal_pause:human_review"


def human_review() -> Agent:
    """The review machine, its review a pause for a person (no tool calls)."""
    data = review_machine().to_dict()
    data["name"] = "human_review"
    data["states"]["await_review"] = {"decision": "pause"}
    return Agent(
        model=FakeModelClient(lambda request: reply("a draft")),
        machine=MachineSpec.from_dict(data),
    )


def test_a_pause_on_no_tool_call_says_it_waits_for_an_answer(
    capsys: Capture, tmp_path: Path
) -> None:
    # It said "waiting on 0 tool call(s):", a colon before nothing.
    store = str(tmp_path / "s.db")
    assert main(["run", "Write a haiku.", "--agent", AGENT, "--store", store]) == 3
    out = capsys.readouterr().out
    found = re.search(r"run (run_\w+) paused in await_review, (.*)\n", out)
    assert found is not None, out
    run_id, waits = found.groups()
    assert waits == "waiting for an answer"
    session_id = re.findall(r"session (ses_\w+) stored in", out)[0]

    assert main(["approve", session_id, "--agent", AGENT, "--store", store]) == 2
    assert capsys.readouterr().out == (
        f"run {run_id} waits in await_review for an answer\n"
    )

    assert main(["sessions", "show", session_id, "--store", store]) == 0
    shown = capsys.readouterr().out
    assert "    paused in await_review, waiting for an answer\n" in shown
    assert "tool call(s)" not in shown
