"""Replaying a run on a machine other than the one it began on names both."""

from __future__ import annotations

import gc
import json

import attrs
import pytest

from tests.helpers import restamp
from turnfsm import Agent, default_machine, review_machine
from turnfsm.core import Event, MachineSpec, Perform, Signal
from turnfsm.driver import EffectContext, replay
from turnfsm.errors import ConfigError, LogInconsistent, ReplayDiverged
from turnfsm.persistence import (
    MachineStored,
    Session,
    load_session,
    machine_digest,
    session_lines,
)
from turnfsm.testing import ScriptedModel


async def approve(ctx: EffectContext, decision: Perform) -> Event:
    return Signal("approved")


@pytest.fixture(scope="module")
def reviewed() -> Session:
    """A session whose one run went through the review machine's approval."""
    agent = Agent(
        model=ScriptedModel.of("a draft"),
        machine=review_machine(),
        effects={"review": approve},
    )
    assert agent.run_sync("write a haiku").outcome == "done"
    return agent.session


def _renamed(spec: MachineSpec) -> MachineSpec:
    """The review machine, its `approved` signal renamed `ok` (and so its name)."""
    data = spec.to_dict()
    data["name"] = "renamed"
    data["signals"] = ["ok", "revise"]
    for transition in data["transitions"]:
        if transition["trigger"] == "approved":
            transition["trigger"] = "ok"
    return MachineSpec.from_dict(data)


def test_a_sound_log_is_not_blamed_when_the_machine_does_not_take_its_event(
    reviewed: Session,
) -> None:
    # It said the log "was changed or damaged after it was written - restore
    # it from a copy" (a LogInconsistent), of a log that was sound.
    run_id = reviewed.runs[-1].run_id
    spec = _renamed(review_machine())

    report = replay(spec, reviewed, run_id)

    error = report.divergence
    assert isinstance(error, ReplayDiverged)
    assert not isinstance(error, LogInconsistent)
    assert error.event == "approved"
    logged = reviewed.runs[-1].opened
    assert error.actual == (
        "phase 'await_review' does not take 'approved' (the machine replayed, "
        f"renamed {machine_digest(spec)}, is not the one the run began on, "
        f"review {logged.digest})"
    )
    assert "restore it from a copy" not in str(error)


def test_a_divergence_on_another_machine_names_both_machines(
    reviewed: Session,
) -> None:
    run_id = reviewed.runs[-1].run_id

    report = replay(default_machine(), reviewed, run_id)

    error = report.divergence
    assert isinstance(error, ReplayDiverged)
    assert error.expected == "await_review -> perform:review"
    assert error.actual.startswith("done -> finish (the machine replayed, turn ")
    assert error.actual.endswith(
        f"is not the one the run began on, review {reviewed.runs[-1].opened.digest})"
    )


def test_the_run_replays_on_its_own_machine(reviewed: Session) -> None:
    run_id = reviewed.runs[-1].run_id

    assert replay(None, reviewed, run_id).ok
    assert replay(review_machine(), reviewed, run_id).ok


def test_a_sessions_id_given_for_the_session_is_refused_naming_it(
    reviewed: Session,
) -> None:
    # It failed inside: 'str' object has no attribute 'run'.
    run_id = reviewed.runs[-1].run_id
    with pytest.raises(ConfigError) as caught:
        replay(None, reviewed.id, run_id)  # type: ignore[arg-type]
    assert (caught.value.field, caught.value.value) == ("session", reviewed.id)
    assert "Session.load" in str(caught.value)


@pytest.mark.anyio
async def test_the_machine_a_log_keeps_is_the_one_its_runs_began_on() -> None:
    # Written out, a machine's phases came back in another order, so its
    # digest differed: a changed line of the log was said to be replayed on
    # "not the one the run began on", of the very machine the log keeps.
    agent = Agent(model=ScriptedModel.of("fine"))
    assert (await agent.run("hello")).outcome == "done"
    lines = list(session_lines(agent.session))
    read = await load_session(lines)
    opened = read.runs[-1].opened
    kept = read.machine(opened.digest)
    assert kept is not None
    assert machine_digest(kept) == opened.digest == machine_digest(default_machine())

    measured = next(i for i, line in enumerate(lines) if '"Measured"' in line)
    edited = json.loads(lines[measured].replace('"call_llm:1"', '"call_llm:9"'))
    lines[measured] = json.dumps(edited)
    lines = restamp(lines)  # edited by one who knows the format
    changed = await load_session(lines)
    error = replay(None, changed, opened.run_id).divergence
    assert isinstance(error, ReplayDiverged)
    assert (error.expected, error.actual) == (
        "call_llm -> call_llm:9",
        "call_llm -> call_llm:1",
    )


async def _kept(agent: Agent) -> tuple[MachineStored, str]:
    """The machine entry `agent`'s log keeps, read back, and its run's digest."""
    assert (await agent.run("hello")).outcome == "done"
    read = await load_session(list(session_lines(agent.session)))
    digest = read.runs[-1].opened.digest
    entry = next(
        e for e in read.entries if isinstance(e, MachineStored) and e.digest == digest
    )
    return entry, digest


@pytest.mark.anyio
async def test_a_machine_read_back_from_a_log_keeps_its_phases_order() -> None:
    # The digest counts the order of the phases, and the log writes a
    # table's keys sorted: the entry keeps the order beside the table.
    machine = review_machine()
    assert list(machine.phases) != sorted(machine.phases)
    agent = Agent(
        model=ScriptedModel.of("a draft"), machine=machine, effects={"review": approve}
    )
    entry, digest = await _kept(agent)
    kept = entry.spec()

    assert kept.phases == machine.phases
    # A copy is a new object: its digest is worked out from what it holds.
    assert machine_digest(attrs.evolve(kept)) == digest == machine_digest(machine)


@pytest.mark.anyio
async def test_a_machine_kept_without_its_order_keeps_its_stored_digest() -> None:
    # A log written before the order was kept reads the phases back sorted.
    # Each machine read from it is the one of its digest, for as long as it
    # lives, also once an equal one read before it is gone.
    entry, digest = await _kept(Agent(model=ScriptedModel.of("fine")))
    old = attrs.evolve(entry, phases=(), subagents=())
    first, second = old.spec(), old.spec()
    assert second.phases == tuple(sorted(default_machine().phases))
    assert first == second
    assert first is not second

    del first
    gc.collect()

    assert machine_digest(second) == digest == machine_digest(default_machine())
