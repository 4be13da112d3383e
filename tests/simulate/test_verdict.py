"""`simulate`'s verdict: a run went as recorded only if its outcome and passes did."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from tests.helpers import restamp
from tests.simulate._runs import measured
from turnfsm import Agent, ContextManager, TruncatingCompactor
from turnfsm.cli import main
from turnfsm.errors import CompactionStalled
from turnfsm.persistence import (
    MemoryStore,
    Session,
    SessionStore,
    SQLiteStore,
    dump_session,
    load_session,
)
from turnfsm.simulate import simulate
from turnfsm.testing import ScriptedModel, reply, tool_call

Capture = pytest.CaptureFixture[str]


def read(path: str) -> str:
    """Read a file.

    Args:
        path: the file's path.
    """
    return f"# {path}\n" + "".join(f"line {n} of {path}\n" for n in range(40))


def read_log(name: str) -> str:
    """Read a log file.

    Args:
        name: the log file.
    """
    return f"{name}: " + "ERROR disk full\n" * 470


def _reads(first: int, last: int) -> list[object]:
    return [
        reply(f"Reading {i}.", tool_call("read", f"c{i}", path=f"f{i}.py"))
        for i in range(first, last)
    ]


async def _two_reply_budgets(store: SessionStore) -> Session:
    """A session whose second run asks for a far larger reply than its first."""
    context = ContextManager(context_window=3_000, threshold=80)
    first = Agent(
        model=ScriptedModel.of(*_reads(0, 3), "three read"),
        tools=[read],
        context=context,
        store=store,
        max_output_tokens=100,
    )
    assert (await first.run("read three files")).ok
    second = Agent(
        model=ScriptedModel.of(*_reads(3, 9), "all read"),
        tools=[read],
        context=context,
        store=store,
        max_output_tokens=2_300,
    )
    await second.open_session(first.session.id)
    assert (await second.run("read six more")).ok
    return await Session.load(store, first.session.id)


async def _stalled(store: SessionStore) -> Session:
    """A session whose one run fails: its pass cannot shrink a huge result."""
    model = ScriptedModel.of(
        reply("", tool_call("read_log", "c1", name="app.log")), "Done."
    )
    agent = Agent(
        model=model,
        tools=[read_log],
        context=ContextManager(TruncatingCompactor(), context_window=4_000),
        store=store,
        max_output_tokens=50,
    )
    result = await agent.run("Audit app.log.")
    assert isinstance(result.error, CompactionStalled)
    return await Session.load(store, agent.session.id)


@pytest.mark.anyio
async def test_each_run_reserves_its_own_reply_budget() -> None:
    stored = await _two_reply_budgets(MemoryStore())
    first, second = stored.runs
    assert not first.compactions
    assert second.compactions  # the larger reply budget brought the passes
    sim = await simulate(stored)
    assert sim.differences == ()
    assert sim.passes == (*first.compactions, *second.compactions)
    assert [c.tokens for c in sim.calls] == measured(first) + measured(second)


@pytest.mark.anyio
async def test_a_stalled_run_went_as_recorded_only_where_it_stalls_again() -> None:
    stored = await _stalled(MemoryStore())
    (run,) = stored.runs
    assert run.outcome == "failed"
    same = await simulate(stored)
    assert same.differences == ()
    assert same.passes == run.compactions
    # In a window it fits, the run does not stall: it asks for a second
    # call the log does not hold. It failed both times, not alike.
    wide = ContextManager(TruncatingCompactor(), context_window=100_000)
    other = await simulate(stored, context=wide)
    assert other.passes == ()
    (note,) = other.differences
    assert note.startswith(
        f"run {run.run_id} ended failed with ProviderError in the simulation "
        "(CompactionStalled in the log): "
    )
    assert "no recorded reply for call 2" in note


@pytest.mark.anyio
async def test_other_passes_under_the_runs_own_settings_differ(
    tmp_path: Path,
) -> None:
    stored = await _two_reply_budgets(MemoryStore())
    second = stored.runs[1]
    path = tmp_path / "session.jsonl"
    dump_session(stored, str(path))
    lines = path.read_text().splitlines()
    # A log that lost its last pass's record: the simulation makes one more.
    last = max(i for i, line in enumerate(lines) if '"CompactionRecord"' in line)
    assert json.loads(lines[last])["type"] == "CompactionRecord"
    edited = await load_session(restamp(lines[:last] + lines[last + 1 :]))
    sim = await simulate(edited)
    passes = len(second.compactions)
    assert sim.differences == (
        f"run {second.run_id} made {passes} compaction passes in the simulation "
        f"({passes - 1} in the log)",
    )


def _stored(record: str) -> str:
    async def make() -> str:
        store = SQLiteStore("sessions.db")
        try:
            maker = _stalled if record == "stalled" else _two_reply_budgets
            return (await maker(store)).id
        finally:
            await store.aclose()

    return anyio.run(make)


@pytest.mark.parametrize("record", ["stalled", "two reply budgets"])
def test_the_command_says_a_run_went_as_recorded_when_it_did(
    record: str, capsys: Capture
) -> None:
    session_id = _stored(record)
    assert main(["simulate", session_id, "--store", "sqlite:///sessions.db"]) == 0
    out = capsys.readouterr().out
    assert "differs:" not in out
    assert "passes: 0" not in out


def test_the_command_fails_a_run_that_did_not_go_as_recorded(
    capsys: Capture,
) -> None:
    session_id = _stored("stalled")
    args = ["simulate", session_id, "--store", "sqlite:///sessions.db"]
    assert main([*args, "--window", "100000"]) == 1
    out = capsys.readouterr().out
    assert "differs: run run_" in out
    assert "ended failed with ProviderError in the simulation" in out
    assert "(CompactionStalled in the log): " in out


def test_a_pass_before_a_runs_first_call_is_said_to_come_before_call_1(
    capsys: Capture,
) -> None:
    session_id = _stored("two reply budgets")
    assert main(["simulate", session_id, "--store", "sqlite:///sessions.db"]) == 0
    out = capsys.readouterr().out
    assert ": emergency -> compacted" in out
    assert "after call 0" not in out  # the table numbers calls from 1
    assert " before call 1: emergency -> compacted" in out
