"""Replay: re-feed a logged run's events into a fresh brain.

The brain is deterministic: the same machine, budget, starting history and
events give the same phases and decisions. Replaying a run's log therefore
checks the log (a tampered or truncated log diverges at a named event) and
rebuilds the brain exactly where the run stopped, which is how a paused or
interrupted run resumes in any process that opens the store.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import final

import attrs

from turnfsm.core import MachineSpec, TurnMachine, trigger_of
from turnfsm.errors import ConfigError, InvalidMessage, ReplayDiverged
from turnfsm.messages import MessageLog
from turnfsm.persistence import Session, decision_key

__all__ = ["ReplayReport", "rebuild", "replay"]


@final
@attrs.frozen(kw_only=True)
class ReplayReport:
    """What replaying one run found.

    Attributes:
        run_id: The run.
        events: How many logged events were re-fed.
        divergence: The first event whose phase or decision differs from the
            log (or whose history differs), or None.
        history_matches: Whether the replayed committed history equals the
            one the log's commit points project.
    """

    run_id: str
    events: int
    divergence: ReplayDiverged | None = attrs.field(eq=False)
    history_matches: bool

    @property
    def ok(self) -> bool:
        """Whether the run replayed exactly."""
        return self.divergence is None and self.history_matches


def rebuild(
    spec: MachineSpec,
    session: Session,
    run_id: str,
    *,
    check: bool = True,
    on_step: Callable[[TurnMachine], None] | None = None,
) -> TurnMachine:
    """Return a brain that has been fed every logged event of `run_id`.

    Args:
        spec: The machine the run ran on.
        session: The session holding the run's log.
        run_id: The run.
        check: Compare every answer with the log (raise on a divergence).
        on_step: Called with the brain after each event it took (its
            `last_step` is the transition that fired, if any), e.g. to draw
            the path the run took.

    Raises:
        ConfigError: the session has no such run.
        ReplayDiverged: `check` and the brain answers differently from the log.
    """
    try:
        record = session.run(run_id)
    except KeyError:
        expected = f"a run of session {session.id!r}"
        raise ConfigError("run_id", run_id, expected) from None
    machine = TurnMachine.start(
        spec, budget=record.opened.budget, history=session.history_before(run_id)
    )
    for entry in session.run_entries(run_id):
        try:
            decision = machine.handle(entry.event)
        except InvalidMessage:
            actual = (entry.phase, "error:InvalidMessage")
            machine = TurnMachine.from_snapshot(spec, machine.snapshot)
        else:
            actual = (machine.phase, decision_key(decision))
            if on_step is not None:
                on_step(machine)
        logged = (entry.phase, entry.decision)
        if check and actual != logged:
            raise ReplayDiverged(
                run_id=run_id,
                index=entry.index,
                event=trigger_of(entry.event),
                expected=" -> ".join(logged),
                actual=" -> ".join(actual),
            )
    return machine


def replay(spec: MachineSpec, session: Session, run_id: str) -> ReplayReport:
    """Replay the logged run `run_id` on `spec` and report the first divergence.

    Raises:
        ConfigError: the session has no such run.
    """
    events = len(session.run_entries(run_id))
    try:
        machine = rebuild(spec, session, run_id)
    except ReplayDiverged as diverged:
        return ReplayReport(
            run_id=run_id, events=events, divergence=diverged, history_matches=False
        )
    expected = session.history_after(run_id)
    replayed: MessageLog = machine.snapshot.history
    matches = [m.id for m in replayed] == [m.id for m in expected]
    return ReplayReport(
        run_id=run_id, events=events, divergence=None, history_matches=matches
    )
