"""One run of the driver: the brain, its effects, and the run's log.

Theory of operation
-------------------
One loop per run, and the run is its log. The brain (`TurnMachine`) answers
every event with a decision; the loop appends the event to the session's
log (with the phase and decision it led to), awaits the decision's effect,
and feeds the event the effect returns back into the brain:

    event = RunStarted(input)
    while True:
        decision = brain.handle(event);  log.append(event, decision)
        if decision ends or pauses the run: break
        event = await effects[decision](ctx, decision)

Rule 1 - effects are plain functions, `async (ctx, decision) -> Event`, the
same shape for the built-in phases and the ones users add. Each step gets a
frozen `EffectContext`; effects record nothing. The loop writes the audit
trail (turns, compaction passes, commit points) from (decision, event) and
calls the observing hooks (`_audit`).

Rule 2 - the log is written as it happens, never only at the end. A
commit point (a compaction the brain accepted, a finished run) is in the
log before the next effect starts, so whatever happens afterwards -
failure, cancellation, a crash - the committed history stays committed.

Rule 3 - nothing oversized is ever sent, and nothing invalid is ever
committed. The driver measures the whole request (history + pending +
extras + reply budget) and re-measures right before each call; the brain
checks every event's messages (tool pairs, roles) before adopting them, so
a broken event from any producer fails the run with a typed error.

Rule 4 - every run can be stopped. The loop yields to the event loop at
every step; `RunControl.cancel()` interrupts the effect in flight; compaction
passes and user effects run under a timeout (`carry_out`); a cancelled run
still ends in the log (outcome ``cancelled``) and the cancellation
propagates.

Rule 5 - outside failures become events once, at the effect that met them;
bugs propagate unchanged (the run is logged as crashed first, `_ending`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Final

import anyio
import anyio.lowlevel
import attrs

from turnfsm import _checks
from turnfsm._lines import emergency_line
from turnfsm.context import pin_loss, pinned_ids, result_problem
from turnfsm.core import (
    PASS_EVENT_TYPES,
    UNUSED_REPLY_TYPES,
    CallLLM,
    Compact,
    CompactionNoop,
    CompactionResult,
    CompactReason,
    Decision,
    Event,
    Fail,
    Finish,
    Measure,
    Measured,
    MessageInjected,
    ModelReplied,
    OutputRejected,
    Pause,
    RunCancelled,
    RunStarted,
    RunTools,
    Signal,
    ToolCallsReviewed,
    ToolsFinished,
    TurnMachine,
    trigger_of,
)
from turnfsm.driver import _audit
from turnfsm.driver._audit import Audit
from turnfsm.driver._cancels import cancel_errors, cancel_requested
from turnfsm.driver._carry import EffectSettings, carry_out
from turnfsm.driver._context import (
    EffectContext,
    RunResources,
    ToolJournal,
    UsageTally,
)
from turnfsm.driver._context_settings import context_settings
from turnfsm.driver._control import RunControl, RunResult, injection_refusal
from turnfsm.driver._effects import (
    BUILTIN_EFFECTS,
    checked_answer,
    effect_key,
    reply_taken,
)
from turnfsm.driver._ending import Ending
from turnfsm.driver._interrupted import interrupted_result, to_close
from turnfsm.driver._model_calls import describe_model
from turnfsm.driver._output import asked_for, output_digest
from turnfsm.driver._subagents import ChildTally
from turnfsm.errors import (
    ConfigError,
    ContinuedAsNew,
    EffectFailed,
    InvalidMessage,
    InvalidReturn,
    PayloadTooLarge,
    RunCrashed,
    StoreUnusable,
    SubagentWaiting,
    TurnFSMError,
)
from turnfsm.hooks import (
    DecisionInfo,
    OutcomeInfo,
    RunStartInfo,
    TransitionInfo,
)
from turnfsm.messages import Joined, Message, MessageLog, Role
from turnfsm.persistence import (
    Entry,
    EventRecorded,
    MachineStored,
    ParentLink,
    RunOpened,
    RunRecord,
    Session,
    ToolResultRecorded,
    decision_key,
)

__all__ = ["RunLoop"]

logger = logging.getLogger("turnfsm.driver")


class RunLoop(Ending):
    """One run of the driver: the brain, its effects and the log (internal)."""

    def __init__(
        self,
        settings: EffectSettings,
        session: Session,
        machine: TurnMachine,
        run: RunResources,
        control: RunControl | None,
    ) -> None:
        self.settings = settings
        self.session = session
        self.machine = machine
        self.run = run
        self.control = control
        self.hooks = run.hooks
        self.run_id = run.run_id
        self.index = 0
        self.audit = Audit(
            run.run_id,
            session,
            self.hooks,
            settings.context,
            run.clock,
            settings.prices,
        )
        self._effects = settings.effects
        # The effects of the user's (not the built-in ones) whose events are
        # checked against the phase (`_check_accepted`): most runs have none.
        self._own_effects = settings._own_effects
        self._wants_transition = self.hooks.wants("on_transition")
        self._estimate_source = "estimated"  # where the snapshot's estimate came from
        self._journal: ToolJournal | None = None  # made on the first batch of calls
        self._resumed: Mapping[str, Message] = {}  # a resumed batch's results
        self._interrupted: frozenset[str] = frozenset()  # of them, closed here
        self._lock: anyio.Lock | None = None  # made on the first journaled result
        # Entries written with the next append: the run's opening, a
        # measurement, a batch of tools safe to run twice (`feed`).
        self._riding: list[Entry] = []
        self.held: list[Entry] = []  # the last step's entries, written with the end
        self.held_history: MessageLog | None = None
        self.ended = False  # its RunEnded is in the log
        self.abandoning = False  # an abandoned run ends failed, not cancelled
        self.before = machine.snapshot  # as of the last feed (for diagnostics)
        self.step: EffectContext | None = None  # the step an effect carries out
        self._heard_end = False  # on_run_end is called once
        # What on_run_start hears (input, resumed), until the run's first step.
        # The run's input, and the outcome a resumed run had (None: a new run).
        self._start: tuple[tuple[Message, ...], str | None] | None = None
        self.parent: ParentLink | None = None  # the call that delegated the run
        self.children = ChildTally(run.run_id)  # what its sub-agents used

    # -- the log -------------------------------------------------------
    def open(self, input: tuple[Message, ...]) -> None:
        """Open the run; its opening is written with its first event, atomically.

        A run whose opening were in the log without its input (the process
        died between the two appends) would resume without it.
        """
        settings = self.settings
        manager = settings.context
        self.audit.opened(self.session.history)
        if manager is not None and manager.use_reported_usage:
            self.audit.carry_over(
                self.session,
                manager.counter,
                window=self.machine.snapshot.budget.context_window,
            )
        if not self.session.has_machine(settings.digest):
            # The machine goes in the log once: a run resumes on it without
            # the file.
            self._riding.append(MachineStored.of(settings.digest, settings.definition))
        self._riding.append(
            RunOpened(
                run_id=self.run_id,
                machine=settings.machine_name,
                digest=settings.digest,
                budget=self.machine.snapshot.budget,
                at=self.run.clock(),
                context=None if manager is None else context_settings(manager),
                parent=self.parent,
                output=asked_for(self.run.output),
                overflow_retries_in_a_row=(
                    self.machine.snapshot.overflow_retries_in_a_row
                ),
                output_digest=output_digest(self.run.output),
            )
        )
        self._start = (input, None)

    def _started(self) -> None:
        """Tell the `on_run_start` hooks, once, as the run's first step.

        Told inside the run's guard: a strict hook that raises there crashes
        the run, logged failed, and the hooks hear its end.
        """
        if self._start is None:
            return
        input, resumed_from = self._start
        self._start = None
        if not self.hooks.wants("on_run_start"):
            return
        model, provider = describe_model(self.run.model)
        self.hooks.call(
            "on_run_start",
            RunStartInfo(
                session_id=self.session.id,
                run_id=self.run_id,
                input=input,
                agent=self.settings.agent,
                machine=self.settings.machine_name,
                digest=self.settings.digest,
                budget=self.machine.snapshot.budget,
                model=model,
                provider=provider,
                resumed=resumed_from is not None,
                resumed_from=resumed_from,
            ),
        )

    def restore(self, record: RunRecord) -> None:
        """Pick up a run from its record (a resumed or abandoned run)."""
        self.index = len(record.events)
        self.audit.restore(record)
        manager = self.settings.context
        if manager is not None and manager.use_reported_usage:
            self.audit.carry_over(
                self.session,
                manager.counter,
                window=self.machine.snapshot.budget.context_window,
            )
            self.audit.resume_reported(
                record,
                self.machine.snapshot,
                manager.counter,
                window=self.machine.snapshot.budget.context_window,
            )
        self._resumed = self.session.recorded_results(self.run_id)
        self._start = ((), record.outcome)

    async def _write(self, *entries: Entry, history: MessageLog | None = None) -> None:
        """Append `entries` to the log, after the entries riding with them.

        Once they are kept, the hooks hear of the compaction passes (and the
        breaker's opening) among them (`Audit.tell`).
        """
        riding, self._riding = self._riding, []
        try:
            await self.append(*riding, *entries, history=history)
        except BaseException:
            # Not written. What rode is the earlier steps' (the run's opening,
            # a measurement, a batch of tools safe to run twice): it rides on
            # to the interruption's append (or the crash's), so the run opens
            # in the log before it ends and its resume does not run that batch
            # again; this step is done again. (An append in doubt that did
            # land leaves the log moved on: that append is refused whole.)
            self._riding[:0] = riding
            raise
        # Kept: the hooks hear of the passes it holds (never of one unwritten).
        self.audit.tell(riding)
        self.audit.tell(entries)

    async def _record_result(self, result: Message) -> None:
        """Log one tool result of the batch in flight (calls finish concurrently)."""
        entry = ToolResultRecorded(run_id=self.run_id, index=self.index, result=result)
        # One writer at a time (the versioned append); an uncontended lock is
        # taken without waiting, so the usual lone call pays no checkpoint
        # (the loop's own checkpoint per step is where cancellation lands).
        lock = self._lock
        if lock is None:
            lock = self._lock = anyio.Lock()
        try:
            lock.acquire_nowait()
        except anyio.WouldBlock:
            await lock.acquire()
        try:
            await self._write(entry)
        finally:
            lock.release()

    async def feed(self, event: Event, last: Decision | None) -> Decision:
        """Feed `event` to the brain and append it, and what it led to, to the log."""
        machine = self.machine
        before = self.before = machine.snapshot
        # The entries riding with the next append stay in `_riding` until it
        # is made (`_write`, `end`): a step that fails before it (a clock
        # that breaks) still opens the run in the log before its end.
        entries: list[Entry] = []
        if self.held:  # a step fed after a run-ending one (it changes nothing)
            entries += self.held
            self.held = []
        if type(event) is Signal and event.message is None:
            event = self._with_message(event)
        if isinstance(last, CallLLM) and isinstance(event, _REPLIES):
            run = self.run
            estimate = run.meter.measure(last.history, last.pending, extras=run.extras)
            entries.append(self.audit.turn(last, event, estimate=estimate))
        elif isinstance(event, UNUSED_REPLY_TYPES) and event.usage is not None:
            self.audit.spent(event.usage)  # a reply that came, unusable
        try:
            decision = machine.handle(event)
        except InvalidMessage as exc:
            # A producer (effect, compactor, injection) broke the conversation:
            # nothing of it is adopted; the run fails naming the call id.
            if isinstance(last, Compact) and isinstance(event, CompactionResult):
                entries += self.audit.compaction(
                    last, event, before, taken=None, key=self._key()
                )
            entries.append(self._recorded(event, before.phase, "error:InvalidMessage"))
            await self._write(*entries)
            raise _Broken(exc) from None
        after = machine.snapshot
        changed = after.history is not before.history
        if isinstance(event, Measured):
            self._estimate_source = event.source
        elif after.estimate != before.estimate:  # a pass's own count
            self._estimate_source = "estimated"
        if isinstance(last, Compact) and isinstance(event, PASS_EVENT_TYPES):
            entries += self.audit.compaction(
                last, event, before, taken=changed, key=self._key()
            )
        entries.append(self._recorded(event, after.phase, decision_key(decision)))
        if changed:
            if isinstance(event, CompactionResult):
                entries += _audit.summaries(
                    self.run_id,
                    event.messages,
                    kept=Joined(before.history, before.pending),
                )
            entries.append(_audit.committed(self.run_id, before.history, after.history))
        if isinstance(decision, _ENDS):
            # The run's end is one append: these entries (its final commit
            # among them) are written with its `RunEnded` (`Ending.end`).
            self.held, self.held_history = entries, after.history
        elif not changed and (
            type(event) is Measured
            or (
                type(event) is ToolsFinished
                and type(last) is RunTools
                and not to_close(last.calls, {}, self.run.tools)
            )
        ):
            # A measurement is redone from the log after a crash, and so is a
            # batch whose every tool is safe to run twice (`Tool.idempotent`:
            # a call with no logged result runs again on resume). Either rides
            # the next append (the reply's, the pass's, the run's end): one
            # commit less a turn, and a crash before that append loses
            # nothing replay needs. Any other batch's results are written
            # before the model is asked again: such a call never runs twice.
            self._riding += entries
        else:
            await self._write(*entries, history=after.history)
        if self._wants_transition and machine.last_step is not None:
            self.hooks.call(
                "on_transition",
                TransitionInfo(
                    run_id=self.run_id,
                    step=machine.last_step,
                    estimate=after.estimate,
                    estimate_source=(
                        None if after.estimate is None else self._estimate_source
                    ),
                    turn=after.turns,
                ),
            )
        return decision

    def _with_message(self, event: Signal) -> Signal:
        """The signal with the message its data adds, where the machine says so.

        The message is made here, once, and logged on the event: a replay
        feeds it as it was (the brain refuses a signal missing it). Its id
        is the run's and the event's position in it, so a durable workflow
        that re-runs this code makes the same one.
        """
        key = self.machine.message_key(event)
        text = event.data.get(key) if key is not None else None
        if text is None or not text.strip():
            return event  # the brain says what is missing
        message = Message.user(text, id=f"msg_{self.run_id}_{self.index}")
        return attrs.evolve(event, message=message)

    def _key(self) -> str:
        """The idempotency key of the pass whose event is fed next."""
        return f"{self.run_id}:{self.index}"

    def _recorded(self, event: Event, phase: str, decision: str) -> EventRecorded:
        entry = EventRecorded(
            run_id=self.run_id,
            index=self.index,
            event=event,
            phase=phase,
            decision=decision,
            at=self.run.clock(),
        )
        self.index += 1
        return entry

    # -- the loop ------------------------------------------------------
    async def go(self, event: Event) -> RunResult:
        """Feed `event`, then carry decisions out until the run ends or pauses."""
        return await self._guarded(event, None)

    async def carry_on(self, decision: Decision) -> RunResult:
        """Carry out `decision` (the one in flight when the process died)."""
        return await self._guarded(None, decision)

    async def _guarded(
        self, event: Event | None, decision: Decision | None
    ) -> RunResult:
        try:
            self._started()
            if event is not None:
                decision = await self.feed(event, None)
            elif type(decision) is RunTools:
                await self._close_unfinished(decision)
            assert decision is not None
            return await self._steps(decision)
        except _Broken as broken:
            return await self.end(None, broken.error)
        except (SubagentWaiting, ContinuedAsNew) as waiting:
            # A sub-agent paused for an answer: this run stops where it is,
            # its call open, and goes on when resumed with that answer. A
            # durable run's long history stops it likewise, between two
            # steps, for its workflow to resume it in a new one.
            if self.ended:  # a strict `on_run_end` hook raised it: its own
                raise
            self.step = None
            with anyio.CancelScope(shield=True):
                stopped = await self.interrupt(str(waiting), waiting)
            return stopped
        except (InvalidReturn, EffectFailed, PayloadTooLarge) as exc:
            # An effect or the model broke its contract, or a durable run's
            # step cannot be carried: the run fails, logged, naming which
            # (nothing it returned is fed to the brain). Raised once the run
            # has ended, it is a strict `on_run_end` hook's: the end stands.
            if self.ended:
                raise
            logger.error("run %s: %s", self.run_id, exc)
            self.step = None
            return await self.end(None, exc)
        except (anyio.get_cancelled_exc_class(), KeyboardInterrupt) as exc:
            if not isinstance(exc, KeyboardInterrupt) and not cancel_requested():
                # Raised by the run's own code (a model client or an effect
                # that awaited something cancelled elsewhere), not a cancel
                # of the run: its crash, as any other exception of theirs,
                # not an interruption that leaves the session held. Raised as
                # that crash: a task nobody cancelled is not told it was.
                with anyio.CancelScope(shield=True):
                    await self.crash(exc)
                raise RunCrashed(
                    type=type(exc).__name__, message=_checks.message_of(exc)
                ) from exc
            self._keep_spent()
            with anyio.CancelScope(shield=True):
                await self.interrupt(_INTERRUPTED)
            raise
        except StoreUnusable as exc:
            # The store could not take a write (a server down, a file locked
            # too long): the run stops where its log says, as if its process
            # had died, and resumes once the store is back. It is no crash:
            # logged failed, it could not be resumed.
            self._keep_spent()
            if not self.session.has_run(self.run_id):
                # Its first write failed: the run never began (no input in
                # the log to resume from), so nothing of it is written.
                self.hear_end("interrupted", self.machine.snapshot, "", exc)
                raise
            with anyio.CancelScope(shield=True):
                await self.interrupt(str(exc), exc)
            raise
        except BaseException as exc:
            with anyio.CancelScope(shield=True):
                await self.crash(exc)
            raise
        finally:
            # The journal calls back into this loop: dropped, the loop (its
            # session and store) goes when the caller lets go, not at the
            # garbage collector's next full pass (a per-request store's file).
            self._journal = None

    async def _close_unfinished(self, decision: RunTools) -> None:
        """Close the resumed batch's calls that have no result, as interrupted.

        The process that ran them died (or was interrupted) before their
        results were logged: their effects are unknown. A call of a tool
        that is safe to run twice (`Tool.idempotent`) runs again instead.
        The closing results are logged, like results, before anything runs:
        a second crash finds them.
        """
        recorded = self._resumed
        calls = to_close(decision.calls, recorded, self.run.tools)
        if not calls:
            return
        results = [interrupted_result(call) for call in calls]
        logger.warning(
            "run %s: closing %d call(s) left without a result as interrupted: %s",
            self.run_id,
            len(calls),
            ", ".join(call.id for call in calls),
        )
        await self._write(
            *(
                ToolResultRecorded(run_id=self.run_id, index=self.index, result=r)
                for r in results
            )
        )
        closed = {call.id: r for call, r in zip(calls, results, strict=True)}
        self._resumed = {**recorded, **closed}
        self._interrupted = frozenset(closed)

    async def _steps(self, decision: Decision) -> RunResult:
        # Hooks are never added during a run (only detached), so what they
        # want is looked up once; a detached hook is simply not called.
        hooks = self.hooks
        wants_decision = hooks.wants("on_decision")
        wants_outcome = hooks.wants("on_outcome")
        control = self.control
        while True:
            if control is not None:
                decision = await self._steer(decision)
            if isinstance(decision, _ENDS):
                return await self.end(decision, None)
            # A checkpoint per step, where cancellation lands and other tasks
            # run; a measurement is a count in memory whose next step (a model
            # call, a pass) has its own, so it goes without one.
            if type(decision) is not Measure:
                await anyio.lowlevel.checkpoint()
            if wants_decision:
                hooks.call(
                    "on_decision",
                    DecisionInfo(
                        run_id=self.run_id,
                        phase=self.machine.phase,
                        decision=decision,
                        turn=self.machine.snapshot.turns,
                    ),
                )
            event = await self._effect(decision)
            if wants_outcome:
                hooks.call(
                    "on_outcome",
                    OutcomeInfo(
                        run_id=self.run_id,
                        phase=self.machine.phase,
                        decision=decision,
                        event=event,
                    ),
                )
            # Steering that arrived while the effect ran is applied before its
            # outcome, so a final reply still sees an injected message (it
            # waits in the inbox). Not after a measurement: the estimate must
            # be of the request as it is.
            if (
                control is not None
                and type(decision) is not Measure
                and type(event) is not RunCancelled
            ):
                steered = await self._steer(decision)
                if isinstance(steered, _ENDS):
                    return await self.end(steered, None)
            decision = await self.feed(event, decision)

    async def _steer(self, decision: Decision) -> Decision:
        """Feed what the `RunControl` queued (injections, a cancel).

        An injection waits in the queue while the phase has no
        ``message_injected`` transition (a machine file of your own may leave
        it out); one queued before the run, that the machine takes in no
        phase, fails the run, naming it (`RunControl.inject` refuses one
        made while the run runs).
        A run that has failed (a cancel ended it) takes nothing more: what is
        queued stays queued.
        """
        if self.control is None or type(decision) is Fail:
            return decision
        spec = self.machine.spec
        waiting: list[Event] = []
        for queued in self.control.drain():
            if type(queued) is MessageInjected and not waiting:
                refusal = injection_refusal(spec)
                if refusal is not None:  # queued before the run: no phase takes it
                    raise _Broken(InvalidMessage("message", queued.message.id, refusal))
                if trigger_of(queued) not in spec.accepts(self.machine.phase):
                    waiting.append(queued)  # until a phase takes it
                    continue
            elif waiting and type(queued) is MessageInjected:
                waiting.append(queued)  # in order, behind the first
                continue
            decision = await self.feed(queued, None)
        if waiting:
            self.control.put_back(waiting)
        return decision

    def _context(self, decision: Decision) -> EffectContext:
        """The frozen context of one step."""
        journal = None
        if type(decision) is RunTools:
            journal = self._journal
            if self._resumed:  # the batch in flight when the process died
                journal = ToolJournal(
                    recorded=self._resumed,
                    record=self._record_result,
                    interrupted=self._interrupted,
                )
                self._resumed, self._interrupted = {}, frozenset()
            elif journal is None:
                journal = self._journal = ToolJournal(record=self._record_result)
        return EffectContext(
            run=self.run,
            snapshot=self.machine.snapshot,
            journal=journal,
            spent=UsageTally(),
            reported=self.audit.reported,
            ratio=self.audit.ratio,
        )

    async def _effect(self, decision: Decision) -> Event:
        """Carry `decision` out under its timeout, interruptible by the control."""
        step = self.step = self._context(decision)
        try:
            event = await carry_out(self.settings, step, decision, self.control)
        except cancel_errors(Exception) as exc:
            if not isinstance(exc, Exception) and cancel_requested():
                raise  # the run is cancelled; one nothing asked for is the effect's
            # Typed already (a durable run's EffectFailed among them), except
            # a value an effect of yours made wrong (a Signal's data, a
            # Message), which is its failure like any exception it raises.
            if isinstance(exc, TurnFSMError) and not isinstance(
                exc, ConfigError | InvalidMessage
            ):
                raise
            key = effect_key(decision)
            if self.settings.effects[key] is BUILTIN_EFFECTS.get(key) or getattr(
                exc, "is_crash", False
            ):
                raise  # a bug of turnfsm's: the run crashes, logged
            logger.error("run %s: effect %r raised", self.run_id, key, exc_info=exc)
            raise EffectFailed(
                effect=key, type=type(exc).__name__, message=_checks.message_of(exc)
            ) from exc
        self._check_accepted(decision, event)
        event = self._doubt_carried(decision, event)
        if (
            type(event) is ModelReplied
            and type(decision) is CallLLM
            and "call_llm" in self._own_effects
        ):
            # An effect of the user's in place of the model call: its reply
            # is taken as the built-in's is (call ids of its own, held to the
            # window, a final answer read as the output type).
            _check_reply(event)
            taken = reply_taken(step, decision, event)
            event = (
                checked_answer(self.run.output, taken)
                if type(taken) is ModelReplied
                else taken
            )
        if type(event) is RunCancelled:
            self._keep_spent()
        self.step = None
        return event

    def _doubt_carried(self, decision: Decision, event: Event) -> Event:
        """Drop a carried-over report that a pass found nothing to cut for.

        An earlier run's report put this request over a line, but the pass
        it triggered finds the conversation no smaller by the manager's
        count: nothing it could cut. Failing the run (the no-progress
        guard) would fail every later run of the session the same way,
        before any model call could report again. So the report is dropped
        and the pass is a no-op from the reported size down to the
        manager's: the request is measured again without it, and sent if
        it fits the window, for the provider to count (or refuse) anew.
        Once per report: the guard still stops any further pass that saves
        nothing.
        """
        reported = self.audit.reported
        if (
            type(decision) is not Compact
            or type(event) is not CompactionNoop
            or event.vetoed
            or reported is None
            or not reported.carried
        ):
            return event
        estimate = self.machine.snapshot.estimate
        if estimate is None or estimate <= event.before:
            return event
        self.audit.reported = None
        return attrs.evolve(event, before=estimate)

    def _check_accepted(self, decision: Decision, event: Event) -> None:
        """Refuse an event from an effect of the user's that the phase does not take.

        Fed to the brain, it would be an `IllegalEvent`, which speaks of a
        driver bug; the effect is named instead, with what the phase takes.

        Raises:
            InvalidReturn: the phase has no transition on the event's trigger,
                the event is a `MessageInjected` (only the outside feeds one),
                or a `CompactionResult` that loses a pinned message.
        """
        own = self._own_effects
        if not own:
            return
        key = effect_key(decision)
        if key not in own:
            return
        machine = self.machine
        if type(event) is MessageInjected:
            # The outside's event: returned by a step, the phase (which stays
            # where it is on it) would run the effect again, as often as it
            # returns one, and the message would wait for a measure phase.
            raise InvalidReturn(
                f"effect {key!r}",
                "MessageInjected",
                "an event of the step's own outcome: a message is injected from"
                " outside (RunControl.inject); to add one to the conversation,"
                " return a signal whose transition names a key of its data with"
                " message = KEY",
            )
        if type(event) is RunStarted:
            raise InvalidReturn(
                f"effect {key!r}",
                "RunStarted",
                "an event of the step's own outcome: a run starts once, with the"
                " input it was given",
            )
        accepts = machine.spec.accepts(machine.phase)
        trigger = trigger_of(event)
        if trigger not in accepts:
            name = type(event).__name__
            raise InvalidReturn(
                f"effect {key!r}",
                f"{name}({trigger!r})" if type(event) is Signal else name,
                f"an event that phase {machine.phase!r} has a transition for, "
                "one of " + ", ".join(repr(t) for t in accepts),
            )
        if type(event) is ToolCallsReviewed:
            # A review runs the calls it approves, and answers the others
            # with an error saying why (`ToolCallsReviewed.reject`).
            for message in event.results:
                for part in message.tool_results:
                    if not part.is_error:
                        raise InvalidReturn(
                            f"effect {key!r}",
                            f"a ToolCallsReviewed answering call {part.call_id!r} "
                            "with a result that is no error",
                            "a review whose results are the errors of the calls it"
                            " rejects (ToolCallsReviewed.reject): a call answered"
                            " with a success never runs, and the model would read"
                            " the reviewer's text as the tool's",
                        )
        if type(event) is CompactionResult:
            snapshot = machine.snapshot
            given = list(Joined(snapshot.history, snapshot.pending))
            self._check_pins(key, event, given)
            self._check_result(key, decision, event, given)
        if isinstance(event, CompactionResult | CompactionNoop) and isinstance(
            decision, Compact
        ):
            self._check_saving(key, decision, event)

    def _check_saving(
        self, key: str, decision: Compact, event: CompactionResult | CompactionNoop
    ) -> None:
        """Refuse a pass of the user's that says it saved what it did not.

        The no-progress guard reads a pass's sizes: a pass that says it saved
        tokens and did not would come round for ever on a machine bounded by
        the guard. A no-op changed nothing, so it saved nothing; a result is
        measured as the built-in pass measures (uncalibrated, reserve in).

        Raises:
            InvalidReturn: a no-op whose `after` is under its `before`, or a
                result that says so while its messages measure no less than
                the conversation it was given.
        """
        if event.after >= event.before:
            return  # no saving said: the guard judges it
        said = f"{type(event).__name__}(before={event.before}, after={event.after})"
        if type(event) is CompactionNoop:
            raise InvalidReturn(
                f"effect {key!r}",
                said,
                "a no-op whose after is at least its before: it changed nothing, "
                "so it saved nothing (return a CompactionResult for a pass that did)",
            )
        run = self.run
        before = run.measure(decision.history, decision.pending)
        after = run.measure(event.messages)
        if after >= before:
            raise InvalidReturn(
                f"effect {key!r}",
                said,
                f"a pass whose sizes are its messages': they measure {after} "
                f"tokens, the conversation it was given {before}, so it saved "
                "nothing (return CompactionNoop(before, after) for such a pass)",
            )

    def _check_result(
        self,
        key: str,
        decision: Decision,
        event: CompactionResult,
        given: list[Message],
    ) -> None:
        """Refuse a pass of the user's that the manager would refuse of a strategy.

        Its messages must make a conversation (tool calls paired, no id
        twice, the messages it keeps in their order, none empty: the rules
        of `turnfsm.context.result_problem`), and fit the window: a result
        over it (or, for a message-count pass, on its emergency line, where
        the request fitted) would be committed, and every later run would
        fail on it.

        Raises:
            InvalidReturn: the result breaks one of those rules; nothing of
                it is adopted.
        """
        problem = result_problem(event.messages, given)
        window = self.machine.snapshot.budget.context_window
        if problem is None and window:
            size = self.run.measure(event.messages)
            line = (
                emergency_line(window)
                if isinstance(decision, Compact)
                and decision.reason is CompactReason.MESSAGE_COUNT
                else window + 1
            )
            if size >= line:
                problem = (
                    f"it measures {size} tokens, over the {window}-token window"
                    if size > window
                    else f"it measures {size} tokens, on the emergency line of the "
                    f"{window}-token window, where the request it was made for fitted"
                )
        if problem is not None:
            raise InvalidReturn(
                f"effect {key!r}",
                f"a CompactionResult of {len(event.messages)} messages",
                f"a result the conversation can take ({problem}); nothing of it "
                "was adopted",
            )

    def _check_pins(
        self, key: str, event: CompactionResult, messages: list[Message]
    ) -> None:
        """Refuse a pass made by an effect of the user's that loses a pinned message.

        The context manager holds every strategy to the pins; an effect that
        makes a pass itself (a `compact` of its own, a phase of its own) is
        held to them here, by the manager's rules (the default ones without
        a manager).

        Raises:
            InvalidReturn: the result drops, alters or moves a pinned message
                of `messages`, the conversation the pass was given.
        """
        context = self.run.context
        pinned = pinned_ids(messages) if context is None else context.pinned(messages)
        lost = pin_loss(messages, event.messages, pinned, strategy=f"effect {key!r}")
        if lost is not None:
            raise InvalidReturn(
                f"effect {key!r}",
                f"a CompactionResult that {lost.what} the pinned {lost.role} "
                f"message {lost.message_id}",
                "a result that keeps every pinned message word for word and in "
                "order; nothing of it was adopted",
            )

    def _keep_spent(self) -> None:
        """Keep what an interrupted pass's model calls cost (no record follows)."""
        step = self.step
        if step is not None:
            spent = step.spent.total
            if spent is not None:
                self.audit.compaction_usage += spent
            self.step = None


def _check_reply(replied: ModelReplied) -> None:
    """Refuse a reply of an effect in place of the model call that no model makes.

    An empty one stands, as a model's does (the machine decides what follows).

    Raises:
        InvalidReturn: its message is not the assistant's.
    """
    message = replied.message
    if message.role is not Role.ASSISTANT:
        raise InvalidReturn(
            "effect 'call_llm'",
            f"a ModelReplied whose message {message.id!r} is the "
            f"{message.role.value}'s",
            "a reply of the assistant's",
        )


_ENDS: Final = (Finish, Fail, Pause)
"""The decisions that end a run (or pause it): made once, not a union per step."""
_REPLIES: Final = (ModelReplied, OutputRejected)
"""The events of a model call that came back with a reply."""

_INTERRUPTED: Final = (
    "interrupted from outside (Ctrl-C, or a cancelled task); resume the run to go "
    "on, or abandon it"
)


class _Broken(Exception):
    """The brain refused an event's messages (internal: ends the run failed)."""

    def __init__(self, error: InvalidMessage) -> None:
        super().__init__(str(error))
        self.error = error
