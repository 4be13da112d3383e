"""A process killed inside a sub-agent's tool call: its resumed parent carries it on.

A real process (`subagent_worker.py`) is killed with SIGKILL inside the
child's second tool call, after its side effect. Another process resumes
the parent's run from the store alone (taking over the dead process's
lease): the parent's call runs again and
finds the child it started, which goes on where it stopped. The child's
first call, whose result is in its log, does not run again; the second,
cut short, is closed as interrupted (its effects unknown), not run twice.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.driver import subagent_worker as worker
from tests.helpers import run_killed
from turnfsm.core import ToolsFinished
from turnfsm.driver import replay
from turnfsm.persistence import Session, SQLiteStore, child_sessions

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


def _nothing(_label: str) -> None:
    pass


def _kill_mid_child(tmp: Path) -> tuple[Path, Path, str]:
    path, effects, session_file = tmp / "s.db", tmp / "fx", tmp / "id"
    run_killed(
        "tests.driver.subagent_worker", str(path), str(effects), str(session_file)
    )
    assert effects.read_text().split() == ["first", "second"]
    return path, effects, session_file.read_text()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_parent_killed_mid_child_resumes_and_no_tool_runs_twice(
    tmp_path: Path,
) -> None:
    path, effects, session_id = _kill_mid_child(tmp_path)

    async with SQLiteStore(path) as store:
        (run,) = (await Session.load(store, session_id)).runs
        assert run.outcome == "running"  # the process died: nothing ended it
        (kid,) = await child_sessions(store, session_id)
        assert [r.outcome for r in kid.runs] == ["running"]

        agent = worker.parent(store, str(effects), _nothing)
        # The dead process's leases are still live: force takes the parent's
        # over, and with it the child's, which the same process held.
        result = await agent.driver.resume(
            await Session.load(store, session_id), run.run_id, force=True
        )

        assert result.outcome == "done", result.error
        assert effects.read_text().split() == ["first", "second"]  # once each
        assert result.text.startswith("the worker said: steps: first done; ")
        assert "interrupted" in result.text  # the cut-short call, closed
        (kid,) = await child_sessions(store, session_id)
        assert [r.outcome for r in kid.runs] == ["done"]
        for session in (await Session.load(store, session_id), kid):
            for ran in session.runs:
                assert replay(None, session, ran.run_id).ok


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_parent_killed_after_its_child_answered_takes_the_answer_again(
    tmp_path: Path,
) -> None:
    # The child ended done; the parent died while its model read the answer.
    # The parent's call is safe to run twice, so its result rode the next
    # reply's append, lost with the process: the resumed parent runs the
    # call again, which finds the ended child and takes its answer from its
    # log. No second child run, no step run twice.
    path, effects, session_file = tmp_path / "s.db", tmp_path / "fx", tmp_path / "id"
    run_killed(
        "tests.driver.subagent_worker",
        str(path),
        str(effects),
        str(session_file),
        "parent-model",
    )
    assert effects.read_text().split() == ["first", "second"]
    session_id = session_file.read_text()

    async with SQLiteStore(path) as store:
        (run,) = (await Session.load(store, session_id)).runs
        assert run.outcome == "running"
        assert ToolsFinished not in [type(e) for e in run.events]
        (kid,) = await child_sessions(store, session_id)
        assert [r.outcome for r in kid.runs] == ["done"]
        agent = worker.parent(store, str(effects), _nothing)
        result = await agent.driver.resume(
            await Session.load(store, session_id), run.run_id, force=True
        )

        assert result.outcome == "done", result.error
        assert result.text == "the worker said: steps: first done; second done"
        assert effects.read_text().split() == ["first", "second"]  # once each
        (again,) = await child_sessions(store, session_id)
        assert again.id == kid.id
        assert [r.outcome for r in again.runs] == ["done"]  # no second child run
        for session in (await Session.load(store, session_id), again):
            for ran in session.runs:
                assert replay(None, session, ran.run_id).ok
