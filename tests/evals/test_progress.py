"""`turnfsm eval` says where it is on stderr; stdout stays the table."""

from __future__ import annotations

import re

import pytest

from tests.evals._judged import context_only, judged
from turnfsm.cli import main
from turnfsm.evals import (
    CORPUS_SESSIONS,
    EvalProgress,
    corpus_probes,
)
from turnfsm.testing import FakeModelClient

pytestmark = pytest.mark.timeout(300)

Capture = pytest.CaptureFixture[str]
ARGV = ["eval", "--strategy", "masking", "--strategy", "layered"]


def test_progress_goes_to_stderr_and_the_table_to_stdout(capsys: Capture) -> None:
    assert main(ARGV) == 0
    quiet = capsys.readouterr()
    assert quiet.err == ""  # stderr is not a terminal: no progress by default
    assert main([*ARGV, "--progress"]) == 0
    told = capsys.readouterr()
    assert told.out == quiet.out  # the same table, and only the table
    lines = told.err.splitlines()
    assert all(line.startswith("turnfsm eval: strategy ") for line in lines)
    coding, chat = CORPUS_SESSIONS
    # Masking calls no model: each session's replay, then the strategy.
    assert lines[:3] == [
        f"turnfsm eval: strategy 1/2 masking, session 1/2 {coding}: replaying",
        f"turnfsm eval: strategy 1/2 masking, session 2/2 {chat}: replaying",
        "turnfsm eval: strategy 1/2 masking: measured",
    ]
    assert lines[3] == (
        f"turnfsm eval: strategy 2/2 layered, session 1/2 {coding}: replaying"
    )
    assert lines[-1] == "turnfsm eval: strategy 2/2 layered: measured"
    # Every summary call is told, counted; the table's count is the last.
    counts = [int(n) for n in re.findall(r": summary call (\d+)$", told.err, re.M)]
    (calls,) = re.findall(r"^\| layered \| [^|]+ \| \d+ \| (\d+) \|", told.out, re.M)
    assert counts == list(range(1, int(calls) + 1))
    assert int(calls) > 0
    chat_replay = f"turnfsm eval: strategy 2/2 layered, session 2/2 {chat}: replaying"
    assert chat_replay in lines[4:-1]


def test_no_progress_turns_it_off(capsys: Capture) -> None:
    assert main([*ARGV, "--no-progress"]) == 0
    assert capsys.readouterr().err == ""


@pytest.mark.anyio
async def test_a_judges_answers_are_told_probe_by_probe() -> None:
    told: list[EvalProgress] = []
    await judged("digest", FakeModelClient(context_only), progress=told.append)
    coding, chat = CORPUS_SESSIONS
    steps = [(p.session, p.step, p.count, p.total) for p in told]
    per_session = {
        s: sum(1 for p in corpus_probes() if p.session == s) for s in (coding, chat)
    }
    assert steps == [
        (coding, "replay", 0, 0),
        *[(coding, "probe", n, per_session[coding]) for n in range(1, 9)],
        (chat, "replay", 0, 0),
        *[(chat, "probe", n, per_session[chat]) for n in range(1, 9)],
        (chat, "done", 0, 0),
    ]
    assert str(told[1]) == (
        f"strategy 1/1 digest, session 1/2 {coding}: judge answered probe 1/8"
    )
