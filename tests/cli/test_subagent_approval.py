"""A sub-agent pauses for approval; another process approves it through the CLI.

``manager`` gives the clean-up to ``careful``, a sub-agent on the approval
machine. The sub-agent's run pauses on its two deletions, and its caller's
run stops with it (exit status 3, the same as a paused run). ``turnfsm
approve`` on the sub-agent's session, in another process, answers it
through its caller: both go on, each deletion runs once, and the caller
ends with the sub-agent's report. Approving the caller's session works the
same way.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from tests.cli import approval_agent
from tests.helpers import REPO_ROOT
from turnfsm.cli import main
from turnfsm.persistence import Session, SQLiteStore, child_sessions

MANAGER = "tests.cli.approval_agent:manager"
Capture = pytest.CaptureFixture[str]


@pytest.fixture(autouse=True)
def _fresh_effects() -> None:
    approval_agent.DELETED.clear()


def _stopped(store: str, capsys: Capture) -> tuple[str, str]:
    """Run the manager until its sub-agent pauses; its session and the child's."""
    assert main(["run", "Free disk.", "--agent", MANAGER, "--store", store]) == 3
    out = capsys.readouterr().out
    found = re.search(r"session (ses_\w+) stored in", out)
    assert found is not None, out
    parent = found.group(1)
    assert "run interrupted: the sub-agent 'cleaner' waits in await_approval" in out
    assert f"answer it with: turnfsm approve|reject {parent} --agent {MANAGER}" in out

    async def child() -> str:
        async with SQLiteStore(store) as sessions:
            (kid,) = await child_sessions(sessions, parent)
        return kid.id

    kid = anyio.run(child)
    assert kid in out
    assert approval_agent.DELETED == []
    return parent, kid


def _turnfsm(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "turnfsm", *argv],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _outcomes(store: str, *session_ids: str) -> list[list[str]]:
    async def load() -> list[list[str]]:
        async with SQLiteStore(store) as sessions:
            loaded = [await Session.load(sessions, i) for i in session_ids]
        return [[r.outcome for r in s.runs] for s in loaded]

    return anyio.run(load)


def test_approving_the_sub_agent_from_another_process_resumes_both(
    tmp_path: Path, capsys: Capture
) -> None:
    store = str(tmp_path / "s.db")
    parent, kid = _stopped(store, capsys)

    approved = _turnfsm("approve", kid, "--agent", MANAGER, "--store", store)

    assert approved.returncode == 0, approved.stderr
    lines = approved.stdout.splitlines()
    assert re.fullmatch(
        r"run run_\w+ waits in await_approval on 2 tool call\(s\):", lines[0]
    )
    assert lines[1:3] == [
        '  c1  delete_file({"path": "/tmp/cache.db"})',
        '  c2  delete_file({"path": "/etc/hosts"})',
    ]
    assert lines[3].startswith("it is a sub-agent's run: its caller, run ")
    assert lines[3].endswith(f"of session {parent}, goes on with it")
    assert (
        "The cleaner said: Report: deleted /tmp/cache.db; deleted /etc/hosts" in lines
    )
    assert _outcomes(store, parent, kid) == [["done"], ["done"]]
    # The caller and its sub-agent replay from the store, each on its machine.
    assert main(["replay", "--session", parent, "--store", store]) == 0
    replayed = capsys.readouterr().out.splitlines()
    assert len(replayed) == 3
    assert re.fullmatch(r"run_\w+: \d+ events replayed exactly \(done\)", replayed[0])
    assert replayed[1] == f"  sub-agent session {kid}:"
    assert re.fullmatch(
        r"    run_\w+: \d+ events replayed exactly \(done\)", replayed[2]
    )
    # Nothing is left to answer, on either session.
    for session_id in (parent, kid):
        again = _turnfsm("approve", session_id, "--agent", MANAGER, "--store", store)
        assert again.returncode == 2
        assert "has none" in again.stderr


def test_rejecting_through_the_caller_s_session_reaches_the_sub_agent(
    tmp_path: Path, capsys: Capture
) -> None:
    store = str(tmp_path / "s.db")
    parent, kid = _stopped(store, capsys)
    argv = ["reject", parent, "--agent", MANAGER, "--store", store, "--call", "c2"]
    assert main([*argv, "--reason", "never /etc"]) == 0
    out = capsys.readouterr().out
    assert '  c2  delete_file({"path": "/etc/hosts"})' in out
    assert "rejected by the reviewer: never /etc" in out
    assert approval_agent.DELETED == ["/tmp/cache.db"]
    assert _outcomes(store, parent, kid) == [["done"], ["done"]]


def test_two_paused_sub_agents_of_one_batch_are_answered_one_after_the_other(
    tmp_path: Path, capsys: Capture
) -> None:
    store = str(tmp_path / "s.db")
    agent = "tests.cli.approval_agent:two_cleaners"
    assert main(["run", "Free disk.", "--agent", agent, "--store", store]) == 3
    out = capsys.readouterr().out
    named = re.search(r"\(session '(ses_\w+)'", out)
    assert named is not None, out
    parent = re.search(r"session (ses_\w+) stored in", out)
    assert parent is not None

    async def kids() -> list[str]:
        async with SQLiteStore(store) as sessions:
            return [k.id for k in await child_sessions(sessions, parent.group(1))]

    first = named.group(1)
    (other,) = [k for k in anyio.run(kids) if k != first]
    # The caller waits on `first`: answering the other one first is refused.
    argv = ["--agent", agent, "--store", store]
    assert main(["approve", other, *argv]) == 2
    refused = capsys.readouterr().err
    assert f"the sub-agent run its caller waits on first: session {first}" in refused
    assert approval_agent.DELETED == []
    # Answered in turn, through either session: both go on, then the caller.
    assert main(["approve", first, *argv]) == 3  # the caller now waits on the other
    assert main(["approve", other, *argv]) == 0
    assert sorted(approval_agent.DELETED) == sorted(["/tmp/cache.db", "/etc/hosts"] * 2)
    assert _outcomes(store, parent.group(1), first, other) == [
        ["done"],
        ["done"],
        ["done"],
    ]


def test_show_of_a_caller_waiting_on_its_sub_agent_says_to_answer_it(
    tmp_path: Path, capsys: Capture
) -> None:
    # `sessions show` advised `turnfsm resume`, which refuses the run (it
    # waits for an answer), and cut its reason short with nothing in full.
    store = str(tmp_path / "s.db")
    parent, kid = _stopped(store, capsys)
    assert main(["sessions", "show", parent, "--store", store]) == 0
    out = capsys.readouterr().out
    (run_line, in_full, answer) = out.split("\nruns (1):\n")[1].splitlines()[:3]
    assert run_line.endswith("...")
    assert in_full.startswith(
        "    error in full: the sub-agent 'cleaner' waits in await_approval on 2 "
        f"tool call(s) (session '{kid}', run 'run_"
    )
    assert in_full.endswith(
        "answer this run (`turnfsm approve` or `reject` on either session) and "
        "both go on"
    )
    assert answer == f"    answer it: turnfsm approve|reject {parent} --store {store}"
    assert "resume" not in out.split("\nruns (1):\n")[1]
