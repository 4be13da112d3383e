"""`turnfsm sessions compact ID`: the operator's /compact, outside any run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from tests.cli.compact_agent import agent
from tests.helpers import REPO_ROOT, run_killed
from turnfsm import Agent, ContextManager, Driver
from turnfsm.cli import main
from turnfsm.persistence import Session, SQLiteStore, SummaryRecorded
from turnfsm.testing import ScriptedModel, reply, tool_call

Capture = pytest.CaptureFixture[str]


def _compact(db: Path, session_id: str) -> list[str]:
    """`turnfsm sessions compact` of `session_id` by the summarising agent."""
    return [
        "sessions",
        "compact",
        session_id,
        "--store",
        str(db),
        "--agent",
        "tests.cli.compact_agent:agent",
    ]


def _filled(db: Path) -> str:
    async def go() -> str:
        async with SQLiteStore(db) as store:
            made = agent()
            session = Session(store=store)
            for i in range(8):
                fact = f"fact {i}: the code of box {i} is {1000 + i}. " + "w " * 300
                assert (await made.driver.run(fact, session=session)).ok
            return session.id

    return anyio.run(go)


def _summaries(db: Path, session_id: str) -> int:
    async def go() -> int:
        async with SQLiteStore(db) as store:
            session = await Session.load(store, session_id)
        return sum(isinstance(e, SummaryRecorded) for e in session.entries)

    return anyio.run(go)


def test_compacting_twice_from_the_cli_writes_one_summary(
    tmp_path: Path, capsys: Capture
) -> None:
    db = tmp_path / "s.db"
    session_id = _filled(db)
    command = _compact(db, session_id)
    assert main(command) == 0
    first = capsys.readouterr().out
    assert first.startswith(f"session {session_id}: compacted by SummarizingCompactor")
    assert "1 summary written" in first
    assert main(command) == 0
    second = capsys.readouterr().out
    assert "compacted" not in second.split(":")[1]
    assert "messages, none replaced" in second  # it said "16 -> 6 messages"
    assert "summary written" not in second
    assert _summaries(db, session_id) == 1
    assert main(["sessions", "show", session_id, "--store", str(db)]) == 0
    shown = capsys.readouterr().out
    assert "compactions (2):" in shown
    assert "manual" in shown


def test_without_an_agent_the_default_strategy_runs_and_calls_no_model(
    tmp_path: Path, capsys: Capture
) -> None:
    db = tmp_path / "s.db"
    session_id = _filled(db)
    assert main(["sessions", "compact", session_id, "--store", str(db)]) == 0
    out = capsys.readouterr().out
    assert "compacted by MaskingCompactor (manual)" in out
    assert _summaries(db, session_id) == 0


def test_a_pass_the_open_breaker_refused_says_so_not_zero_tokens(
    tmp_path: Path, capsys: Capture
) -> None:
    db = tmp_path / "s.db"
    session_id = _filled(db)

    class Broken:
        async def compact(self, messages: object, target: int, ctx: object) -> None:
            raise RuntimeError("the summary model is down")

    async def open_the_breaker() -> None:
        async with SQLiteStore(db) as store:
            session = await Session.load(store, session_id)
            driver = Driver(model=ScriptedModel.of(), context=ContextManager(Broken()))
            for _ in range(3):
                assert not (await driver.compact(session)).ok
            assert session.compaction_failures == 3

    anyio.run(open_the_breaker)
    assert main(["sessions", "compact", session_id, "--store", str(db)]) == 1
    out = capsys.readouterr().out
    assert out == (
        f"session {session_id}: circuit_open by MaskingCompactor (manual): "
        "refused, as the compaction circuit breaker is open; 16 messages kept\n"
    )


def test_an_unknown_session_is_named(tmp_path: Path, capsys: Capture) -> None:
    db = tmp_path / "s.db"
    _filled(db)
    assert main(["sessions", "compact", "ses_nope", "--store", str(db)]) == 2
    assert "ses_nope" in capsys.readouterr().err


@pytest.mark.slow
def test_a_compaction_killed_mid_pass_is_taken_over_with_force(
    tmp_path: Path, capsys: Capture
) -> None:
    # The killed process's lease stays live for a while: the refusal says
    # how to take it over on the command line, and --force carries the
    # unfinished pass on, writing its summary once.
    db = tmp_path / "s.db"
    session_id = _filled(db)
    run_killed("tests.driver.compact_worker", str(db), session_id)
    command = _compact(db, session_id)
    assert main(command) == 2
    err = capsys.readouterr().err
    assert "take it over with --force only if you know that process is gone" in err
    assert "force=True" not in err
    assert main([*command, "--force"]) == 0
    assert "1 summary written" in capsys.readouterr().out
    assert _summaries(db, session_id) == 1


def test_a_session_with_an_interrupted_run_names_the_commands(
    tmp_path: Path, capsys: Capture
) -> None:
    # A run cut short from outside (Ctrl-C, a cancelled task) stays open:
    # the refusal names the commands that answer or resume it, not
    # Python's agent.resume(...).
    db = tmp_path / "s.db"

    async def wait(path: str) -> str:
        """Wait.

        Args:
            path: The file.
        """
        await anyio.sleep_forever()
        return path

    async def interrupted() -> str:
        async with SQLiteStore(db) as store:
            agent = Agent(
                model=ScriptedModel.of(reply("", tool_call("wait", "c1", path="x"))),
                tools=[wait],
                store=store,
            )
            with anyio.move_on_after(0.5):
                await agent.run("wait for x")
            (run,) = agent.session.open_runs()
            assert run.outcome == "interrupted"
            return agent.session.id

    session_id = anyio.run(interrupted)
    assert main(["sessions", "compact", session_id, "--store", str(db)]) == 2
    err = capsys.readouterr().err
    assert "agent.resume" not in err
    assert f"turnfsm approve|reject|abandon {session_id} --store {db}" in err
    assert f"carry it on with turnfsm resume {session_id} --store {db}" in err
    assert err.rstrip().endswith("then compact it")


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=str)
def test_a_pass_stopped_by_a_signal_lets_the_session_go(
    tmp_path: Path, signum: signal.Signals
) -> None:
    # SIGTERM (`kill`, a service stopped) killed `turnfsm sessions compact`
    # mid-pass, as Ctrl-C did not: the session stayed held until its lease
    # ran out, refusing every run and pass meanwhile.
    db = tmp_path / "s.db"
    session_id = _filled(db)
    command = _compact(db, session_id)
    command[-1] = "tests.cli.compact_agent:slow_agent"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    with subprocess.Popen(
        [sys.executable, "-m", "turnfsm", *command],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as program:
        assert program.stdout is not None
        assert program.stdout.readline() == "compacting\n"
        program.send_signal(signum)
        _, err = program.communicate(timeout=30)

    assert program.returncode == 130
    assert err == "\nturnfsm: interrupted\n"
    again = subprocess.run(
        [sys.executable, "-m", "turnfsm", *_compact(db, session_id)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert again.returncode == 0, again.stderr


def test_a_session_compacted_while_a_run_is_paused_still_shows_that_run(
    tmp_path: Path, capsys: Capture
) -> None:
    # `sessions list` showed the manual pass's `done` for a session that
    # takes no new task, and `show` no longer listed the paused run's
    # messages beyond the history.
    store = ["--store", str(tmp_path / "s.db")]
    careful = ["--agent", "tests.cli.approval_agent:careful"]
    assert main(["run", "Free disk.", *careful, *store]) == 3
    capsys.readouterr()
    assert main(["sessions", "list", *store]) == 0
    session_id = capsys.readouterr().out.splitlines()[1].split()[0]
    assert main(["sessions", "compact", session_id, *store]) == 0
    capsys.readouterr()

    assert main(["sessions", "list", *store]) == 0
    row = capsys.readouterr().out.splitlines()[1].split()
    assert row[-2:] == ["2", "paused"]
    assert main(["sessions", "show", session_id, *store]) == 0
    out = capsys.readouterr().out
    assert "\n2 more in its unfinished run run_" in out
    assert "\n  user      Free disk.\n" in out
