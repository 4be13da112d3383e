"""A run killed in the middle of a tool call resumes with the call closed.

A real process (`cut_short_worker.py`) is killed with SIGKILL inside a tool,
after the tool's side effect and before its result reached the log. Another
process resumes the run: the call, whose effects are unknown, is closed with
an error result saying it was interrupted (logged like any result), and the
tool is not run again; a tool marked safe to run twice (``idempotent``) runs
again instead. Either way no call is left open: the run finishes, every run
replays, and the next compaction pass folds the history.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.driver import cut_short_worker as worker
from tests.helpers import REPO_ROOT
from turnfsm.driver import replay
from turnfsm.messages import check_history
from turnfsm.persistence import Session, SQLiteStore, ToolResultRecorded, Verdict

pytestmark = pytest.mark.anyio


def _kill_mid_tool(tmp: Path) -> tuple[Path, Path, str]:
    path, effects, session_file = tmp / "s.db", tmp / "effects", tmp / "session"
    killed = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.driver.cut_short_worker",
            str(path),
            str(effects),
            str(session_file),
        ],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()
    assert effects.read_text().split() == ["p1"]  # the side effect happened
    return path, effects, session_file.read_text()


def _nothing() -> None:
    pass


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("idempotent", [False, True])
async def test_a_call_killed_mid_tool_is_closed_as_interrupted_on_resume(
    tmp_path: Path, idempotent: bool
) -> None:
    path, effects, session_id = _kill_mid_tool(tmp_path)
    store = SQLiteStore(path)
    session = await Session.load(store, session_id)
    (run,) = session.open_runs()
    assert run.outcome == "running"
    driver = worker.driver(str(effects), idempotent=idempotent, then=_nothing)

    # The dead process's lease is still live: force takes it over.
    result = await driver.resume(session, run.run_id, force=True)

    assert result.outcome == "done", result.error
    (closing,) = [p for m in session.history for p in m.tool_results]
    if idempotent:  # safe to run twice: it ran again
        assert effects.read_text().split() == ["p1", "p1"]
        assert (closing.content, closing.is_error) == ("p1 delivered", False)
        assert result.text == "delivery: p1 delivered"
    else:  # ran once: closed as interrupted, the model told so
        assert effects.read_text().split() == ["p1"]
        assert closing.is_error
        assert closing.content == (
            "tool 'deliver' was interrupted: the run stopped before this call "
            "finished, so its effects are unknown (it may have done all, some "
            "or none of its work); call it again if it is still needed"
        )
        assert result.text.startswith("delivery: tool 'deliver' was interrupted")
        # Logged like a result, in the run that made the call.
        (logged,) = [e for e in session.entries if isinstance(e, ToolResultRecorded)]
        assert (logged.run_id, logged.result.tool_results) == (run.run_id, (closing,))
    check_history(session.history)
    assert all(replay(None, session, r.run_id).ok for r in session.runs)

    # No call is left open: the next pass folds the history.
    compacted = await driver.compact(session)
    assert compacted.ok, compacted.error
    (record,) = session.runs[-1].compactions
    assert record.verdict is Verdict.COMPACTED
    assert record.tokens_after < record.tokens_before
    check_history(session.history)
    reopened = await Session.load(store, session_id)
    assert list(reopened.history) == list(session.history)
    assert all(replay(None, reopened, r.run_id).ok for r in reopened.runs)
    assert len(effects.read_text().split()) == (2 if idempotent else 1)
    await store.aclose()
