"""How a run ends: its outcome, its last log entry, its result.

A run ends in exactly one of six ways (done, failed, cancelled, paused,
interrupted, or a crash logged as failed) and each is written to the log
once, then told to the `on_run_end` hooks once. An interrupted run (Ctrl-C,
a cancel from outside) is not fed to the brain: its log keeps what completed
and it resumes like a crashed one. `Ending` is the part of the run's loop
(`RunLoop`) that does it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from turnfsm import _checks
from turnfsm.context import explain
from turnfsm.core import (
    Decision,
    Event,
    Fail,
    Finish,
    Pause,
    Snapshot,
    TurnMachine,
)
from turnfsm.driver._arguments import InvalidArguments
from turnfsm.driver._audit import Audit, committed
from turnfsm.driver._carry import EffectSettings
from turnfsm.driver._context import RunResources, ending_time
from turnfsm.driver._control import RunResult
from turnfsm.driver._lease import confirm
from turnfsm.driver._store_calls import store_call
from turnfsm.driver._subagents import ChildTally
from turnfsm.errors import (
    Cancelled,
    ContextExceeded,
    LeaseLost,
    RunCrashed,
    SessionConflict,
    StoreUnusable,
    TurnFSMError,
)
from turnfsm.hooks import HookDispatcher, RunEndInfo
from turnfsm.messages import Joined, MessageLog
from turnfsm.persistence import Committed, Entry, RunEnded, Session

__all__ = ["Ending"]

logger = logging.getLogger("turnfsm.driver")


class Ending:
    """Ends a run: logs its one `RunEnded` and tells the hooks (internal)."""

    settings: EffectSettings
    session: Session
    machine: TurnMachine
    run: RunResources
    hooks: HookDispatcher
    run_id: str
    audit: Audit
    abandoning: bool
    before: Snapshot
    _riding: list[Entry]
    _heard_end: bool
    held: list[Entry]
    held_history: MessageLog | None
    ended: bool
    children: ChildTally

    feed: Callable[[Event, Decision | None], Awaitable[Decision]]

    async def append(self, *entries: Entry, history: MessageLog | None = None) -> None:
        """Append `entries` to the run's log, for at most the store's timeout.

        Raises:
            StoreUnusable: the store did not answer in time (`store_call`).
            LeaseLost: another process took the session over (`confirm`).
        """
        session = self.session
        await confirm(session)
        await store_call(
            session.append(*entries, history=history),
            seconds=self.settings.store_timeout,
            store=session.store,
            method="append",
            writes=True,
        )

    async def end(
        self,
        decision: Finish | Fail | Pause | None,
        error: TurnFSMError | None,
        *,
        interrupted: bool = False,
    ) -> RunResult:
        """Log the run's end and return its result."""
        snapshot = self.machine.snapshot
        text = decision.text if isinstance(decision, Finish) else ""
        waiting = decision if isinstance(decision, Pause) else None
        if isinstance(decision, Fail):
            error = decision.error
        manager = self.settings.context
        if isinstance(error, ContextExceeded):
            # Say what filled the window (the brain's own error stays as it
            # decided it: the log's decisions replay unchanged), with the
            # run's one counter, whether or not a context manager is there.
            context = self.before
            messages = Joined(context.history, context.pending)
            error = explain(
                error,
                messages,
                self.run.meter.counter,
                strategy="" if manager is None else type(manager.compactor).__name__,
                pinned=() if manager is None else manager.pinned(messages),
            )
        if interrupted:
            outcome = "interrupted"
        elif waiting is not None:
            outcome = "paused"
        elif error is None:
            outcome = "done"
        elif isinstance(error, Cancelled) and not self.abandoning:
            outcome = "cancelled"
        else:
            outcome = "failed"
        # A run that ends before its first event was logged (a crash in the
        # first feed) still opens in the log before it ends, and a measurement
        # riding the next append is written. The last step's entries (a done
        # run's final commit) go in the same append.
        riding, self._riding = self._riding, []
        held, self.held = self.held, []
        if not held and isinstance(decision, Finish):
            held = self._resumed_commit(snapshot)
        try:
            await self.append(
                *riding,
                *held,
                RunEnded(
                    run_id=self.run_id,
                    outcome=outcome,  # type: ignore[arg-type]
                    phase=snapshot.phase,
                    text=text,
                    error=error,
                    usage=self.audit.usage,
                    turns=snapshot.turns,
                    waiting=waiting,
                    at=ending_time(self.run.clock),
                    compaction_usage=self.audit.compaction_usage,
                ),
                history=self.held_history if held else None,
            )
        except BaseException:
            # Not written: the interruption's append that follows (or a
            # retry) writes them, so the last step is not done again.
            self._riding[:0] = riding
            self.held[:0] = held
            raise
        self.ended = True
        # Kept: the hooks hear of the last step's pass, then of the end (even
        # when a strict hook raises on the pass: the end is logged).
        try:
            self.audit.tell(riding)
            self.audit.tell(held)
        finally:
            self.hear_end(outcome, snapshot, text, error)
        return RunResult(
            output=self._output(outcome, text),
            outcome=outcome,  # type: ignore[arg-type]
            text=text,
            error=error,
            usage=self.audit.usage,
            session_id=self.session.id,
            run_id=self.run_id,
            turns=snapshot.turns,
            waiting=waiting,
            compaction_usage=self.audit.compaction_usage,
            children_usage=self.children.usage,
            cost=self.audit.cost,
            children_cost=self.children.cost,
            reported_calls=self.audit.reported_calls,
        )

    def _output(self, outcome: str, text: str) -> Any:
        """The final answer read as the run's output type (None without one).

        Every reply was checked as it came (`checked_answer`), whichever
        effect made it; a run resumed from a log written before replies of
        replaced effects were checked may end on one that does not read:
        None, and logged.
        """
        output = self.run.output
        if output is None or outcome != "done":
            return None
        try:
            return output.parse(text)
        except InvalidArguments as exc:
            logger.warning(
                "run %s: the final answer does not fit: %s",
                self.run_id,
                "; ".join(output.errors(exc)),
            )
            return None

    def hear_end(
        self, outcome: str, snapshot: Snapshot, text: str, error: TurnFSMError | None
    ) -> None:
        """Tell the `on_run_end` hooks, once."""
        if self._heard_end:
            return
        self._heard_end = True
        if self.hooks.wants("on_run_end"):
            self.hooks.call(
                "on_run_end",
                RunEndInfo(
                    run_id=self.run_id,
                    phase=snapshot.phase,
                    text=text,
                    error=error,
                    outcome=outcome,
                    session_id=self.session.id,
                    turns=snapshot.turns,
                    usage=self.audit.usage,
                    compaction_usage=self.audit.compaction_usage,
                ),
            )

    def _resumed_commit(self, snapshot: Snapshot) -> list[Entry]:
        """The commit of a run resumed at its end: its last step is logged, not it.

        An end whose append failed leaves the last step to the interruption's
        append, without its commit (the run had not finished); the resumed
        run finishes on that step, and commits what it says now.
        """
        history = self.session.history
        if [m.id for m in snapshot.history] == [m.id for m in history]:
            return []
        self.held_history = snapshot.history
        return [committed(self.run_id, history, snapshot.history)]

    async def interrupt(
        self, reason: str, error: TurnFSMError | None = None
    ) -> RunResult:
        """Record an interruption (shielded; never raises); return the result.

        The brain is not told: the run stays where it was, its log keeps
        what completed (journaled tool results, committed passes), and
        `resume` carries the decision in flight out again, as after a crash.
        `error` is the run's error (default: `Cancelled(reason)`).
        """
        error = Cancelled(reason=reason) if error is None else error
        if not self.ended:
            # The last step's commit is not made: the run has not finished.
            self.held = [e for e in self.held if not isinstance(e, Committed)]
            try:
                return await self.end(None, error, interrupted=True)
            except LeaseLost:  # another process carries the run on: said once
                self.hear_end("interrupted", self.machine.snapshot, "", error)
            except (StoreUnusable, SessionConflict) as down:
                # The run stays open, to resume; or another writer (a store
                # file made anew) moved the log on: said in one line.
                logger.warning(
                    "run %s: could not record its interruption: %s", self.run_id, down
                )
                self.hear_end("interrupted", self.machine.snapshot, "", error)
            except Exception:
                self._unrecorded("interruption")
                self.hear_end("interrupted", self.machine.snapshot, "", error)
        return RunResult(
            outcome="interrupted",
            text="",
            error=error,
            usage=self.audit.usage,
            session_id=self.session.id,
            run_id=self.run_id,
            turns=self.machine.snapshot.turns,
            compaction_usage=self.audit.compaction_usage,
            children_usage=self.children.usage,
            cost=self.audit.cost,
            children_cost=self.children.cost,
            reported_calls=self.audit.reported_calls,
        )

    async def crash(self, exc: BaseException) -> None:
        """Record that the run ended on an unexpected exception (shielded).

        Observers hear of it even when the log cannot take it (its store is
        down): the run is over in this process, whatever the log says.
        """
        kind, message = _checks.crash_named(exc)
        crashed = RunCrashed(type=kind, message=message)
        if self.ended:  # its end is logged (an `on_run_end` hook raised): once
            return
        # What the last step would have committed is not: the run crashed.
        self.held = [e for e in self.held if not isinstance(e, Committed)]
        if isinstance(exc, SessionConflict):
            # Another writer appended first: this view cannot append (its
            # version is stale), and the caller gets the conflict, to reload.
            self.hear_end("failed", self.machine.snapshot, "", crashed)
            return
        try:
            await self.end(None, crashed)
        except Exception:
            self._unrecorded("crash")
            self.hear_end("failed", self.machine.snapshot, "", crashed)

    def _unrecorded(self, what: str) -> None:
        """Log the exception that cut short the logging of the run's `what`.

        When the end was written, it came from a (strict) hook told of it.
        """
        if self.ended:
            logger.exception(
                "run %s: its %s is recorded; a hook told of it raised",
                self.run_id,
                what,
            )
        else:
            logger.exception("run %s: could not record its %s", self.run_id, what)
