"""Opening a run, or reopening one, with its session held: the driver's entry points.

`Driver.run`, `resume`, `abandon` and `compact` check their arguments and
come here: the session is claimed in this process and, in a store several
processes share, its owner lease is held (`_lease`) while the run's loop
(`RunLoop`) carries the run to its end.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Coroutine, Sequence
from typing import TYPE_CHECKING, Any

import anyio

from turnfsm.core import (
    Event,
    Pause,
    Perform,
    RunCancelled,
    RunStarted,
    RunTools,
    TurnMachine,
)
from turnfsm.driver._control import RunControl, RunResult
from turnfsm.driver._inputs import reopen
from turnfsm.driver._lease import holding, lease_owner, owner_id, worked_on_here
from turnfsm.driver._loop import RunLoop
from turnfsm.driver._output import OutputType, check_resumed
from turnfsm.driver._store_calls import read_session
from turnfsm.driver._subagents import (
    PhaseDelegation,
    answering,
    count_earlier_children,
    end_open_children,
    run_scope,
)
from turnfsm.driver._subprocess import loading_main
from turnfsm.driver._tools import missing_tools
from turnfsm.errors import (
    ConfigError,
    SessionBusy,
    SessionConflict,
    SubagentWaiting,
)
from turnfsm.hooks import Hook
from turnfsm.messages import Message
from turnfsm.persistence import Lease, RunRecord, Session, new_id

if TYPE_CHECKING:
    from turnfsm.driver._driver import Driver

__all__ = ["abandon_run", "resume_run", "start_run"]

logger = logging.getLogger("turnfsm.driver")


async def start_run(
    driver: Driver,
    session: Session,
    messages: tuple[Message, ...],
    run_id: str | None,
    control: RunControl | None,
    hooks: Sequence[Hook],
    output: OutputType | None,
    *,
    beside_paused: bool = False,
) -> RunResult[Any]:
    """Open a run of `session` with `messages` and carry it to its end.

    `beside_paused`: the run may open while others wait for an answer
    (paused, or stopped for a paused sub-agent): a pass of the session's
    committed history; such a run keeps its buffers, and takes the
    compacted history when it goes on.
    """
    _not_in_a_tools_process()
    waiting = [
        run
        for run in session.open_runs()
        if not (beside_paused and _waits_for_answer(run))
    ]
    with session.claim():
        if waiting and await _not_held_elsewhere(session, driver.store_timeout):
            # Refused before it holds the session: a resume or an abandon of
            # the open run in this process meanwhile is not told the session
            # is busy with a run that is only being refused.
            raise await _refusal(
                session, waiting[-1].run_id, None, driver.store_timeout
            )
        async with holding(
            session, ttl=driver.lease_ttl, store_timeout=driver.store_timeout
        ) as previous:
            if waiting:  # held by another process: its lease tells how
                raise await _refusal(
                    session, waiting[-1].run_id, previous, driver.store_timeout
                )
            run_id = run_id or new_id("run")
            machine = TurnMachine.start(
                driver.machine, budget=driver.budget, history=session.history
            )
            loop = _loop(driver, session, run_id, machine, control, hooks, output)
            with run_scope(run_id, control, machine.spec) as (
                loop.parent,
                loop.children,
            ):
                loop.open(messages)
                return await _going(
                    driver, session, loop, loop.go(RunStarted(input=messages))
                )


def _not_in_a_tools_process() -> None:
    """Refuse a run the script starts while an in_subprocess tool's process loads it.

    Raises:
        ConfigError: this process runs a tool and loads the caller's script
            to find it, and the script starts a run at its top level.
    """
    script = loading_main()
    if script is not None:
        raise ConfigError(
            "__main__",
            script,
            'a script that starts its runs under `if __name__ == "__main__":`; '
            "an in_subprocess tool's process loads the script to find the "
            "tool, and would run the agent again, calling its model and "
            "writing its store, on every call",
        )


async def resume_run(
    driver: Driver,
    session: Session,
    run_id: str,
    event: Event | None,
    control: RunControl | None,
    hooks: Sequence[Hook],
    output: OutputType | None,
    *,
    force: bool,
) -> RunResult[Any]:
    """Carry the open run `run_id` on, with `event` if it is paused.

    A run stopped by a paused sub-agent (its error `SubagentWaiting`) takes
    the sub-agent's answer: `event` goes to the sub-agent's run, and this
    run carries its open call on.
    """
    _not_in_a_tools_process()
    waiting = _waits_on_subagent(session, run_id)
    answer: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
    # A cancel ends this run, not only the sub-agent it waits on.
    cancel = event if waiting is not None and type(event) is RunCancelled else None
    if waiting is not None and event is not None and cancel is None:
        await _check_sub_answer(driver, session, waiting, event)
        answer = answering(waiting.session_id, event)
    if waiting is not None:
        event = None
    with session.claim(), answer:
        async with holding(
            session,
            ttl=driver.lease_ttl,
            store_timeout=driver.store_timeout,
            force=force,
        ) as previous:
            loop = _reopened(driver, session, run_id, event, control, hooks, output)
            if waiting is not None:
                _check_carries(driver, loop, waiting)
            else:
                _check_approved(loop, event)
            gone = previous.owner if previous is not None else None
            with run_scope(run_id, control, loop.machine.spec, taken_over=gone) as (
                _,
                loop.children,
            ):
                await count_earlier_children(
                    loop.children, driver, session, loop.machine.spec
                )
                if cancel is not None:  # no one waits on its sub-agents any more
                    await end_open_children(
                        driver,
                        session,
                        run_id,
                        loop.machine.spec,
                        "its parent's run was cancelled",
                        tally=loop.children,
                    )
                    return await loop.go(cancel)
                if event is None:
                    going = loop.carry_on(loop.machine.decision)
                else:
                    going = loop.go(event)
                return await _going(driver, session, loop, going)


async def _going(
    driver: Driver,
    session: Session,
    loop: RunLoop,
    going: Coroutine[Any, Any, RunResult[Any]],
) -> RunResult[Any]:
    """Await the run; if it crashed, end the sub-agents it left open.

    A crash (a strict hook's error, a bug) stops the calls in flight, their
    sub-agents' runs with them, and ends the run failed: no one will carry
    those sub-agents on.
    """
    try:
        return await going
    except Exception:
        if (
            session.has_run(loop.run_id)
            and session.run(loop.run_id).outcome == "failed"
        ):
            with anyio.CancelScope(shield=True):
                try:
                    await end_open_children(
                        driver,
                        session,
                        loop.run_id,
                        loop.machine.spec,
                        "its parent's run failed",
                    )
                except Exception:  # the crash is what the caller gets
                    logger.exception(
                        "run %s: could not end its sub-agents", loop.run_id
                    )
        raise


async def _check_sub_answer(
    driver: Driver, session: Session, waiting: SubagentWaiting, event: Event
) -> None:
    """Refuse, before anything is written, an answer the paused sub-agent cannot take.

    Handed down, it would fail the call to the sub-agent, and the caller
    would go on with the sub-agent still waiting; refused here, both stay
    waiting, to be answered again (`Pause.check_answer`).
    """
    kid = await read_session(
        session.store, waiting.session_id, seconds=driver.store_timeout
    )
    run = next((r for r in kid.runs if r.run_id == waiting.run_id), None)
    if run is not None and run.outcome == "paused" and run.waiting is not None:
        run.waiting.check_answer(event)


def _check_carries(driver: Driver, loop: RunLoop, waiting: SubagentWaiting) -> None:
    """Refuse, before anything is written, a driver that cannot carry the call on.

    The run stopped in a call to a sub-agent tool: resumed without that tool
    (or with one not safe to run again), the call would be closed as
    interrupted and the sub-agent's answer lost.
    """
    decision = loop.machine.decision
    if isinstance(decision, Perform):  # a phase that runs a sub-agent
        effect = driver.effects_by_name.get(decision.effect)
        if effect is not None and PhaseDelegation.of(effect) is not None:
            return
        raise ConfigError(
            "effects",
            sorted(driver.effects_by_name),
            f"the sub-agent phase the run waits in ({decision.phase}), to carry "
            f"on its sub-agent waiting in session {waiting.session_id}: resume "
            "it with the agent that ran it",
        )
    calls = decision.calls if isinstance(decision, RunTools) else ()
    tools = loop.run.tools
    if any(c.name in tools and tools[c.name].idempotent for c in calls):
        return
    names = ", ".join(sorted({c.name for c in calls})) or "?"
    raise ConfigError(
        "tools",
        sorted(tools),
        f"the sub-agent tool the run waits in ({names}), to carry on its call "
        f"to the sub-agent waiting in session {waiting.session_id}: resume it "
        "with the agent that ran it",
    )


def _check_approved(loop: RunLoop, event: Event | None) -> None:
    """Refuse, before anything is written, an approval of a call with no tool.

    Resumed without it, the approved call would be answered "not available"
    and the approval used up, the action never taken.
    """
    decision = loop.machine.decision
    if not isinstance(decision, Pause):
        return
    tools = loop.run.tools
    missing = missing_tools(decision.calls, event, tools)
    if missing:
        # A tool the model made up has no agent to resume with: rejecting
        # the calls to it (an error result each, which the model reads) is
        # the way on.
        names = ", ".join(sorted({c.name for c in missing}))
        calls = ", ".join(c.id for c in missing)
        raise ConfigError(
            "tools",
            sorted(tools),
            f"the tools the run calls ({names}): resume it with an agent that "
            f"has them, or reject the calls to them ({calls}) with "
            "ToolCallsReviewed.reject; the run stays paused",
        )


def _waits_for_answer(run: RunRecord) -> bool:
    """Whether open `run` waits for an answer: paused, or its sub-agent is."""
    return run.outcome == "paused" or (
        run.outcome == "interrupted" and isinstance(run.error, SubagentWaiting)
    )


def _waits_on_subagent(session: Session, run_id: str) -> SubagentWaiting | None:
    """The paused sub-agent run `run_id` stopped for (None: it did not)."""
    for run in session.open_runs():
        if run.run_id == run_id and run.outcome == "interrupted":
            error = run.error
            return error if isinstance(error, SubagentWaiting) else None
    return None


async def abandon_run(
    driver: Driver, session: Session, run_id: str, reason: str, *, force: bool
) -> RunResult[Any]:
    """End the open run `run_id` as failed, `Cancelled(reason)`."""
    with session.claim():
        async with holding(
            session,
            ttl=driver.lease_ttl,
            store_timeout=driver.store_timeout,
            force=force,
        ):
            loop = _reopened(driver, session, run_id, None, None, (), None, check=False)
            loop.abandoning = True
            return await loop.go(RunCancelled(reason=reason))


def _reopened(
    driver: Driver,
    session: Session,
    run_id: str,
    event: Event | None,
    control: RunControl | None,
    hooks: Sequence[Hook],
    output: OutputType | None,
    *,
    check: bool = True,
) -> RunLoop:
    """The loop of the open run `run_id`, its brain rebuilt from the log."""
    record, machine = reopen(
        driver.machine,
        driver.digest,
        driver.effects_by_name,
        session,
        run_id,
        event,
        check=check,
    )
    if check:
        opened = record.opened
        check_resumed(run_id, opened.output, opened.output_digest, output)
    loop = _loop(driver, session, run_id, machine, control, hooks, output)
    loop.restore(record)
    return loop


def _loop(
    driver: Driver,
    session: Session,
    run_id: str,
    machine: TurnMachine,
    control: RunControl | None,
    hooks: Sequence[Hook],
    output: OutputType | None,
) -> RunLoop:
    run = driver.resources(
        run_id, session=session, session_id=session.id, hooks=hooks, output=output
    )
    return RunLoop(driver.effect_settings, session, machine, run, control)


async def _not_held_elsewhere(session: Session, store_timeout: float | None) -> bool:
    """Whether no run works on `session` now, here or in another process.

    Its open run is then paused, interrupted, or its process died: the
    refusal says to resume or abandon it. One running is refused by the
    hold, saying so.
    """
    if worked_on_here(session):
        return False
    owner = await lease_owner(session, store_timeout)
    return owner is None or owner == owner_id()


async def _refusal(
    session: Session, run_id: str, previous: Lease | None, store_timeout: float | None
) -> SessionBusy | SessionConflict:
    """The refusal of a run on a session whose view shows run `run_id` open.

    The view may be older than the log: the run ended in another process
    after the view was read and before this one took the lease. Then the
    view is stale (`SessionConflict`: read the session again), not busy;
    being told to resume or abandon a run that has ended misleads.
    """
    if previous is None:  # the lease was free: read what the log says now
        store = session.store
        stored = await read_session(store, session.id, seconds=store_timeout)
        if stored.version != session.version and not stored.open_runs():
            return SessionConflict(session.id, session.version, stored.version)
    return _busy(session, run_id, previous)


def _busy(session: Session, run_id: str, previous: Lease | None) -> SessionBusy:
    """The refusal of a run on a session whose run `run_id` is open."""
    if previous is None:
        return SessionBusy(session.id, run_id=run_id)
    # This process took the lease over: its previous owner is gone.
    return SessionBusy(
        session.id,
        run_id=run_id,
        owner=previous.owner,
        alive=False,
        since=previous.since,
    )
