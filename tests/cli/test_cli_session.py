"""A user's first session with the command line, in a pseudo-terminal.

Their agent lives in a module of their own (written into the test's directory):
a tool with a side effect (a line in a file, so a tool run twice shows), the
approval machine, and a stand-in model. `turnfsm run --agent` pauses for
approval; `turnfsm approve` in another process finishes the run; a run whose
process is killed, or that Ctrl-C interrupts, is carried on by `turnfsm
resume`, running no finished tool again.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pexpect
import pytest

from tests.helpers import REPO_ROOT

AGENT_MODULE = '''
"""The user's agent: a tool that deletes files (it writes a line instead)."""
from pathlib import Path
import time

import anyio

from turnfsm import Agent, approval_machine
from turnfsm.testing import FakeModelClient, reply, tool_call

EFFECTS = Path(__file__).with_name("effects.txt")
BLOCK = Path(__file__).with_name("block")


def delete_file(path: str) -> str:
    """Delete a file.

    Args:
        path: the file to delete.
    """
    while path.endswith("slow") and BLOCK.exists():
        time.sleep(0.05)
    with EFFECTS.open("a") as effects:
        effects.write(path + "\\n")
    return f"deleted {path}"


def _plan(request):
    results = [p.content for m in request.messages for p in m.tool_results]
    if not results:
        return reply(
            "",
            tool_call("delete_file", "c1", path="/tmp/cache.db"),
            tool_call("delete_file", "c2", path="/var/log/old.log"),
        )
    return reply("Freed: " + "; ".join(results))


def _steps(request):
    done = sum(len(m.tool_results) for m in request.messages)
    if done == 0:
        return reply("", tool_call("delete_file", "s1", path="one"))
    if done == 1:
        return reply("", tool_call("delete_file", "s2", path="two-slow"))
    return reply("finished")


async def _slow_steps(request):
    """The model thinks while BLOCK exists, after the first tool."""
    if sum(len(m.tool_results) for m in request.messages) == 1:
        while BLOCK.exists():
            await anyio.sleep(0.05)
    return _steps(request)


careful = Agent(
    model=FakeModelClient(_plan), tools=[delete_file], machine=approval_machine()
)
toolless = Agent(model=FakeModelClient(_plan), machine=approval_machine())
steps = Agent(model=FakeModelClient(_steps), tools=[delete_file])
slow_steps = Agent(model=FakeModelClient(_slow_steps), tools=[delete_file])
'''


@pytest.fixture
def home(tmp_path: Path) -> Path:
    (tmp_path / "cleaner.py").write_text(AGENT_MODULE)
    return tmp_path


def _env(home: Path) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), str(home)]),
        "TURNFSM_STORE": str(home / "sessions.db"),
        "XDG_DATA_HOME": str(home / "xdg"),
        "TERM": "xterm",
    }


def _turnfsm(home: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "turnfsm", *argv],
        cwd=home,
        env=_env(home),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _effects(home: Path) -> list[str]:
    path = home / "effects.txt"
    return path.read_text().splitlines() if path.exists() else []


def test_a_run_pauses_for_approval_and_another_process_approves(home: Path) -> None:
    child = pexpect.spawn(
        sys.executable,
        ["-m", "turnfsm", "run", "Free some disk space.", "--agent", "cleaner:careful"],
        cwd=str(home),
        env=_env(home),
        encoding="utf-8",
        timeout=60,
    )
    child.expect(r"session (ses_\w+) stored in ")
    session_id = child.match.group(1)
    child.expect("paused in await_approval, waiting on 2 tool call")
    child.expect(r'c1  delete_file\(\{"path": "/tmp/cache.db"\}\)')
    child.expect(r'c2  delete_file\(\{"path": "/var/log/old.log"\}\)')
    answer = f"turnfsm approve|reject|abandon {session_id} --agent cleaner:careful"
    child.expect_exact(answer)
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 3  # paused
    assert _effects(home) == []  # nothing ran before the approval

    approved = _turnfsm(home, "approve", session_id, "--agent", "cleaner:careful")
    assert approved.returncode == 0, approved.stderr
    assert "\x1b" not in approved.stdout  # piped: plain lines, no status line
    lines = approved.stdout.splitlines()
    assert lines[:3] == [
        f"run {_run_id(approved.stdout)} waits in await_approval on 2 tool call(s):",
        '  c1  delete_file({"path": "/tmp/cache.db"})',
        '  c2  delete_file({"path": "/var/log/old.log"})',
    ]
    assert "Freed: deleted /tmp/cache.db; deleted /var/log/old.log" in lines
    assert any(line.startswith("run done: 2 model call(s)") for line in lines)
    assert sorted(_effects(home)) == ["/tmp/cache.db", "/var/log/old.log"]

    again = _turnfsm(home, "approve", session_id, "--agent", "cleaner:careful")
    assert again.returncode == 2
    assert "has none" in again.stderr
    assert sorted(_effects(home)) == ["/tmp/cache.db", "/var/log/old.log"]


def test_approving_calls_to_a_tool_the_agent_lacks_names_the_reject(
    home: Path,
) -> None:
    # The model may call a tool that no agent has (one it made up): the way
    # on is to reject those calls, and the refusal says how.
    paused = _turnfsm(
        home, "run", "Free some disk space.", "--agent", "cleaner:careful"
    )
    assert paused.returncode == 3, paused.stderr
    found = re.search(r"session (ses_\w+) stored in", paused.stdout + paused.stderr)
    assert found is not None, paused.stdout
    session_id = found.group(1)

    refused = _turnfsm(home, "approve", session_id, "--agent", "cleaner:toolless")
    assert refused.returncode == 2
    reject = f"turnfsm reject {session_id} --call c1 --call c2"
    assert reject in refused.stderr, refused.stderr
    rejected = _turnfsm(
        home, *reject.split()[1:], "--agent", "cleaner:toolless", "--reason", "no"
    )
    assert rejected.returncode == 0, rejected.stderr
    assert _effects(home) == []


def _run_id(text: str) -> str:
    found = re.search(r"run (run_\w+)", text)
    assert found is not None, text
    return found.group(1)


def test_a_killed_run_is_resumed_and_runs_no_finished_tool_again(home: Path) -> None:
    (home / "block").touch()
    child = pexpect.spawn(
        sys.executable,
        ["-m", "turnfsm", "run", "Delete two files.", "--agent", "cleaner:steps"],
        cwd=str(home),
        env=_env(home),
        encoding="utf-8",
        timeout=60,
    )
    child.expect(r"\[run_tools\] RunTools")  # the first tool
    child.expect_exact('[tool] delete_file({"path": "one"})')
    child.expect_exact("[tool] delete_file -> 11 characters")
    child.expect_exact('[tool] delete_file({"path": "two-slow"})')  # it blocks
    # On a terminal, a live status line: phase, tokens, calls, tools.
    child.expect(r"run_tools \| \d+ of \d+ tokens \| 2 model call\(s\) \| 2 tool")
    deadline = time.monotonic() + 30
    while _effects(home) != ["one"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _effects(home) == ["one"]
    # While it runs, another process's resume is refused, never told that
    # the run's process ended.
    listed = _turnfsm(home, "sessions", "list")
    session_id = re.findall(r"^(ses_\w+)", listed.stdout, re.MULTILINE)[0]
    live = _turnfsm(home, "resume", session_id, "--agent", "cleaner:steps")
    assert live.returncode == 2
    assert "is unfinished (its process ended, or is still running it)" in live.stdout
    assert "whose lease is live" in live.stderr
    os.kill(child.pid, signal.SIGKILL)
    child.expect(pexpect.EOF)
    child.close()
    (home / "block").unlink()

    listed = _turnfsm(home, "sessions", "list")
    session_id = re.findall(r"^(ses_\w+)", listed.stdout, re.MULTILINE)[0]
    # The killed process's lease has not expired yet: --force takes it over.
    busy = _turnfsm(home, "resume", session_id, "--agent", "cleaner:steps")
    assert busy.returncode == 2
    assert "take it over with --force only if" in busy.stderr, busy.stderr
    assert "force=True" not in busy.stderr  # Python's word, not the command's
    resumed = _turnfsm(
        home, "resume", session_id, "--agent", "cleaner:steps", "--force"
    )
    assert resumed.returncode == 0, resumed.stderr
    assert "is unfinished (its process ended, or is still running it)" in (
        resumed.stdout
    )
    assert "finished" in resumed.stdout.splitlines()
    # "one" ran once; "two-slow", cut short by the kill, is closed as
    # interrupted on resume (delete_file is not marked safe to run twice):
    # its effects are unknown, so it is not run again behind the model's back.
    assert _effects(home) == ["one"]
    shown = _turnfsm(home, "sessions", "show", session_id)
    assert "'delete_file' was interrupted" in shown.stdout, shown.stdout


def test_ctrl_c_interrupts_a_run_and_resume_runs_no_finished_tool_again(
    home: Path,
) -> None:
    (home / "block").touch()
    child = pexpect.spawn(
        sys.executable,
        ["-m", "turnfsm", "run", "Delete two files.", "--agent", "cleaner:slow_steps"],
        cwd=str(home),
        env=_env(home),
        encoding="utf-8",
        timeout=60,
    )
    child.expect_exact("[tool] delete_file -> 11 characters")  # "one" is done
    deadline = time.monotonic() + 30
    while _effects(home) != ["one"] and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)  # the model is thinking about the second step
    child.sendintr()  # Ctrl-C on the terminal
    child.expect_exact("interrupting: the run keeps what it finished")
    child.expect(r"turnfsm resume (ses_\w+) --agent cleaner:slow_steps")
    session_id = child.match.group(1)
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 130
    assert _effects(home) == ["one"]
    (home / "block").unlink()

    resumed = _turnfsm(home, "resume", session_id, "--agent", "cleaner:slow_steps")

    assert resumed.returncode == 0, resumed.stderr
    assert "finished" in resumed.stdout.splitlines()
    # The Ctrl-C landed while the model thought: no call was cut short, and
    # the second step runs on resume ("one" ran once).
    assert _effects(home) == ["one", "two-slow"]
