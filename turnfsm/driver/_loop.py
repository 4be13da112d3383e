"""One run of the driver: the brain, its effects' context, and the run's log.

`Driver` builds a `_Loop` per run (or per resumed run); see the theory of
operation in `turnfsm.driver._driver`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Final, final

import anyio
import anyio.lowlevel
import attrs

from turnfsm.context import ContextManager
from turnfsm.context._diagnose import explain
from turnfsm.core import (
    EVENT_TYPES,
    CallLLM,
    Compact,
    CompactionCircuitOpened,
    CompactionNoop,
    CompactionOverflowed,
    CompactionResult,
    CompactorFailed,
    Decision,
    Event,
    Fail,
    Finish,
    Measure,
    ModelReplied,
    OutputRejected,
    Pause,
    Perform,
    RunCancelled,
    RunTools,
    Snapshot,
    TurnMachine,
)
from turnfsm.driver._arguments import InvalidArguments
from turnfsm.driver._control import RunControl, RunResult
from turnfsm.driver._effects import (
    Effect,
    EffectContext,
    describe_model,
    effect_key,
    is_extension,
)
from turnfsm.errors import (
    Cancelled,
    ContextExceeded,
    InvalidMessage,
    InvalidReturn,
    RunCrashed,
    TurnFSMError,
)
from turnfsm.hooks import (
    CircuitInfo,
    CompactionDone,
    CompactionInfo,
    DecisionInfo,
    OutcomeInfo,
    RunEndInfo,
    RunStartInfo,
    TransitionInfo,
)
from turnfsm.messages import SUMMARY_COVERS, Joined, Message, MessageLog
from turnfsm.persistence import (
    BreakerChanged,
    Committed,
    CompactionRecord,
    Entry,
    EventRecorded,
    RunEnded,
    RunOpened,
    RunRecord,
    Session,
    SummaryRecorded,
    ToolResultRecorded,
    TurnRecord,
    decision_key,
)
from turnfsm.values import ErrorInfo, Usage

__all__ = ["LoopSettings", "_Loop", "carry_out"]

logger = logging.getLogger("turnfsm.driver")


@final
@attrs.frozen(kw_only=True)
class LoopSettings:
    """What a run's loop takes from its `Driver` (internal)."""

    machine_name: str
    digest: str
    agent: str
    effects: Mapping[str, Effect]
    context: ContextManager | None
    compaction_timeout: float | None
    effect_timeout: float | None


_COMPACTION_OUTCOMES: Final = {
    CompactionResult: "compacted",
    CompactionNoop: "noop",
    CompactionOverflowed: "overflow",
    CompactorFailed: "failed",
    CompactionCircuitOpened: "circuit_open",
}


class _Loop:
    """One run of the driver: the brain, its context and the log (internal)."""

    def __init__(
        self,
        driver: LoopSettings,
        session: Session,
        machine: TurnMachine,
        ctx: EffectContext,
        control: RunControl | None,
    ) -> None:
        self.driver = driver
        self.session = session
        self.machine = machine
        self.ctx = ctx
        self.control = control
        self.hooks = ctx.hooks
        self.run_id = ctx.run_id
        self.index = 0
        self.usage = Usage()
        self.compaction_usage = Usage()
        self.compactions = 0
        self.context: tuple[MessageLog, MessageLog] | None = None
        self._effects = driver.effects
        self._wants_transition = self.hooks.wants("on_transition")
        self._journal: anyio.Lock | None = None  # made on the first tool result
        self._opening: RunOpened | None = None  # written with the first event
        self.abandoning = False  # an abandoned run ends failed, not cancelled
        self.before = machine.snapshot  # as of the last feed (for diagnostics)
        self.in_flight: Decision | None = None  # the decision an effect carries out
        self._heard_end = False  # on_run_end is called once

    # -- the log -------------------------------------------------------
    def open(self, input: tuple[Message, ...]) -> None:
        """Open the run; its opening is written with its first event, atomically.

        A run whose opening were in the log without its input (the process
        died between the two appends) would resume without it.
        """
        self._opening = RunOpened(
            run_id=self.run_id,
            machine=self.driver.machine_name,
            digest=self.driver.digest,
            budget=self.machine.snapshot.budget,
            at=self.ctx.clock(),
        )
        self._started(input, resumed=False)

    def _started(self, input: tuple[Message, ...], *, resumed: bool) -> None:
        if not self.hooks.wants("on_run_start"):
            return
        model, provider = describe_model(self.ctx.model)
        self.hooks.call(
            "on_run_start",
            RunStartInfo(
                session_id=self.session.id,
                run_id=self.run_id,
                input=input,
                agent=self.driver.agent,
                machine=self.driver.machine_name,
                digest=self.driver.digest,
                budget=self.machine.snapshot.budget,
                model=model,
                provider=provider,
                resumed=resumed,
            ),
        )

    def restore(self, record: RunRecord) -> None:
        self.index = len(record.events)
        self.usage = sum((t.usage for t in record.turns if t.usage), Usage())
        self.compaction_usage = sum(
            (c.usage for c in record.compactions if c.usage), Usage()
        )
        self.compactions = len(record.compactions)
        self.ctx.recorded = self.session.recorded_results(self.run_id)
        self._started((), resumed=True)

    async def record_result(self, result: Message) -> None:
        """Log one tool result of the batch in flight (calls finish concurrently)."""
        entry = ToolResultRecorded(run_id=self.run_id, index=self.index, result=result)
        # One writer at a time (the versioned append); an uncontended lock is
        # taken without waiting, so the usual lone call pays no checkpoint
        # (the loop's own checkpoint per step is where cancellation lands).
        lock = self._journal
        if lock is None:
            lock = self._journal = anyio.Lock()
        try:
            lock.acquire_nowait()
        except anyio.WouldBlock:
            await lock.acquire()
        try:
            await self.session.append(entry)
        finally:
            lock.release()

    async def feed(self, event: Event, last: Decision | None) -> Decision:
        """Feed `event` to the brain and append it, and what it led to, to the log."""
        machine = self.machine
        before = self.before = machine.snapshot
        entries: list[Entry] = [] if last is None else self._audit(last, event, before)
        if self._opening is not None:
            entries.insert(0, self._opening)
            self._opening = None
        try:
            decision = machine.handle(event)
        except InvalidMessage as exc:
            # A producer (effect, compactor, injection) broke the conversation:
            # nothing of it is adopted; the run fails naming the call id.
            entries.append(self._recorded(event, before.phase, "error:InvalidMessage"))
            await self.session.append(*entries)
            raise _Broken(exc) from None
        after = machine.snapshot
        self.ctx.snapshot = after
        if isinstance(last, Compact):
            self._settle(entries, before, after)
        entries.append(self._recorded(event, after.phase, decision_key(decision)))
        if after.history is not before.history:
            if isinstance(event, CompactionResult):
                entries.extend(_summaries(self.run_id, event.messages))
            entries.append(_committed(self.run_id, before.history, after.history))
        await self.session.append(*entries, history=after.history)
        if self._wants_transition and machine.last_step is not None:
            self.hooks.call(
                "on_transition",
                TransitionInfo(
                    run_id=self.run_id,
                    step=machine.last_step,
                    estimate=after.estimate,
                    turn=after.turns,
                ),
            )
        return decision

    def _recorded(self, event: Event, phase: str, decision: str) -> EventRecorded:
        entry = EventRecorded(
            run_id=self.run_id,
            index=self.index,
            event=event,
            phase=phase,
            decision=decision,
            at=self.ctx.clock(),
        )
        self.index += 1
        return entry

    def _audit(self, decision: Decision, event: Event, before: Snapshot) -> list[Entry]:
        """The audit entries a decision's outcome makes (a turn, a compaction)."""
        if isinstance(decision, CallLLM) and isinstance(
            event, ModelReplied | OutputRejected
        ):
            if event.usage is not None:
                self.usage = self.usage + event.usage
                if event.usage.input_tokens:
                    self.ctx.reported = (
                        event.usage.input_tokens,
                        decision.history,
                        decision.pending,
                    )
            keep, added = self._context_change(decision)
            return [
                TurnRecord(
                    run_id=self.run_id,
                    turn=decision.turn,
                    keep=keep,
                    added=added,
                    output=event.message.id,
                    usage=event.usage,
                )
            ]
        if isinstance(decision, Compact):
            outcome = _COMPACTION_OUTCOMES.get(type(event))
            if outcome is not None:
                record = self._compaction(decision, event, outcome, before)
                return [record, *self._breaker(record)]
        return []

    def _breaker(self, record: CompactionRecord) -> list[Entry]:
        """The breaker's opening, when this failed pass reaches `max_failures`.

        Written once, on the transition; the count itself is a projection
        of the session's log (`Session.compaction_failures`).
        """
        manager = self.driver.context
        if manager is None or record.outcome != "failed":
            return []
        failures = self.session.compaction_failures + 1
        if failures != manager.max_failures:
            return []
        if self.hooks.wants("on_circuit_opened"):
            self.hooks.call(
                "on_circuit_opened",
                CircuitInfo(
                    session_id=self.session.id, run_id=self.run_id, failures=failures
                ),
            )
        return [
            BreakerChanged(
                run_id=self.run_id, open=True, failures=failures, at=self.ctx.clock()
            )
        ]

    def _context_change(self, decision: CallLLM) -> tuple[int, list[str]]:
        """The context of this call as a change from the previous call's."""
        history, pending = decision.history, decision.pending
        last, self.context = self.context, (history, pending)
        if (
            last is not None
            and is_extension(history, last[0], same=True)
            and is_extension(pending, last[1], same=False)
        ):
            keep = len(history) + len(last[1])
            return keep, [m.id for m in pending.items_from(len(last[1]))]
        return 0, [m.id for m in history] + [m.id for m in pending]

    def _compaction(
        self, decision: Compact, event: Event, outcome: str, before: Snapshot
    ) -> CompactionRecord:
        covers = [m.id for m in decision.history] + [m.id for m in decision.pending]
        usage: Usage | None = None
        match event:
            case CompactionResult(messages=new, before=size, after=after, usage=usage):
                replacement = [m.id for m in new]
            case CompactionNoop(before=size, after=after, vetoed=vetoed, usage=usage):
                replacement = covers
                outcome = "vetoed" if vetoed else "noop"
            case (
                CompactionOverflowed(used=after, usage=usage)
                | CompactorFailed(used=after, usage=usage)
            ):
                size, replacement = before.estimate or after, covers
            case _:
                size = after = before.estimate or 0
                replacement = covers
        if usage is not None:
            self.compaction_usage = self.compaction_usage + usage
        manager = self.driver.context
        record = CompactionRecord(
            run_id=self.run_id,
            turn=before.turns,
            reason=decision.reason,
            strategy=type(manager.compactor).__name__ if manager else "",
            outcome=outcome,  # type: ignore[arg-type]
            covers=covers,
            replacement=replacement,
            tokens_before=size,
            tokens_after=after,
            key=f"{self.run_id}:{self.index}",
            usage=usage,
        )
        self.compactions += 1
        return record

    def _settle(self, entries: list[Entry], before: Snapshot, after: Snapshot) -> None:
        """Settle the pass's record on what the brain made of it, then report it.

        A result the brain refused (the no-progress guard: it saved nothing)
        is logged as stalled, not compacted: nothing was committed.
        """
        for i, entry in enumerate(entries):
            if isinstance(entry, CompactionRecord):
                if entry.compacted and after.history is before.history:
                    entry = entries[i] = attrs.evolve(entry, outcome="stalled")
                self._report(entry)
                return

    def _report(self, record: CompactionRecord) -> None:
        hooks = self.hooks
        if record.compacted and hooks.wants("on_compaction_done"):
            hooks.call(
                "on_compaction_done",
                CompactionDone(
                    session_id=self.session.id,
                    run_id=self.run_id,
                    turn=record.turn,
                    trigger=record.reason,
                    strategy=record.strategy,
                    covers=record.covers,
                    replacement=record.replacement,
                    tokens_before=record.tokens_before,
                    tokens_after=record.tokens_after,
                    usage=record.usage,
                ),
            )
        if not (hooks.wants("post_compact") or hooks.wants("on_compaction")):
            return
        info = CompactionInfo(
            run_id=self.run_id,
            reason=record.reason,
            turn=record.turn,
            tokens_before=record.tokens_before,
            tokens_after=record.tokens_after,
            messages_before=len(record.covers),
            messages_after=len(record.replacement),
            compacted=record.compacted,
            vetoed=record.vetoed,
            outcome=record.outcome,
            strategy=record.strategy,
            usage=record.usage,
        )
        if record.compacted:
            hooks.call("on_compaction", info)
        hooks.call("post_compact", info)

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
            if event is not None:
                decision = await self.feed(event, None)
            assert decision is not None
            return await self._steps(decision)
        except _Broken as broken:
            return await self._end(None, broken.error)
        except InvalidReturn as exc:
            # An effect or the model broke its contract: the run fails,
            # logged, naming which (nothing it returned is fed to the brain).
            logger.error("run %s: %s", self.run_id, exc)
            self.in_flight = None
            return await self._end(None, exc)
        except anyio.get_cancelled_exc_class():
            self._keep_spent(self.in_flight)
            with anyio.CancelScope(shield=True):
                await self._abort(RunCancelled(reason="cancelled from outside"))
            raise
        except BaseException as exc:
            with anyio.CancelScope(shield=True):
                await self._crash(exc)
            raise

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
            if isinstance(decision, Finish | Fail | Pause):
                return await self._end(decision, None)
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
            self.in_flight = decision
            event = await self._effect(decision)
            self.in_flight = None
            if self.ctx.recorded and isinstance(decision, RunTools):
                self.ctx.recorded = {}  # the resumed batch is done
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
                if isinstance(steered, Finish | Fail | Pause):
                    return await self._end(steered, None)
            decision = await self.feed(event, decision)

    async def _steer(self, decision: Decision) -> Decision:
        """Feed what the `RunControl` queued (injections, a cancel)."""
        if self.control is not None:
            for queued in self.control.drain():
                decision = await self.feed(queued, None)
        return decision

    async def _effect(self, decision: Decision) -> Event:
        """Carry `decision` out under its timeout, interruptible by the control."""
        event = await carry_out(self.driver, self.ctx, decision, self.control)
        if type(event) is RunCancelled:
            self._keep_spent(decision)
        return event

    def _keep_spent(self, decision: Decision | None) -> None:
        """Keep what an interrupted pass's model calls cost (no record follows)."""
        if isinstance(decision, Compact) and self.ctx.spent:
            self.compaction_usage = self.compaction_usage + sum(self.ctx.spent, Usage())
            self.ctx.spent.clear()

    # -- the end -------------------------------------------------------
    async def _end(
        self, decision: Finish | Fail | Pause | None, error: TurnFSMError | None
    ) -> RunResult:
        snapshot = self.machine.snapshot
        text = decision.text if isinstance(decision, Finish) else ""
        waiting = decision if isinstance(decision, Pause) else None
        if isinstance(decision, Fail):
            error = decision.error
        if isinstance(error, ContextExceeded) and self.driver.context is not None:
            # Say what filled the window (the brain's own error stays as it
            # decided it: the log's decisions replay unchanged).
            context = self.before
            error = explain(
                error,
                Joined(context.history, context.pending),
                self.driver.context.counter,
            )
        if waiting is not None:
            outcome = "paused"
        elif error is None:
            outcome = "done"
        elif isinstance(error, Cancelled) and not self.abandoning:
            outcome = "cancelled"
        else:
            outcome = "failed"
        # A run that ends before its first event was logged (a crash in the
        # first feed) still opens in the log before it ends.
        opening = () if self._opening is None else (self._opening,)
        self._opening = None
        await self._append_end(opening, outcome, snapshot, text, error, waiting)
        self._hear_end(outcome, snapshot, text, error)
        return RunResult(
            output=self._output(outcome, text),
            outcome=outcome,  # type: ignore[arg-type]
            text=text,
            error=error,
            usage=self.usage,
            session_id=self.session.id,
            run_id=self.run_id,
            turns=snapshot.turns,
            waiting=waiting,
            compaction_usage=self.compaction_usage,
        )

    def _output(self, outcome: str, text: str) -> Any:
        """The final answer read as the run's output type (None without one).

        The built-in `call_llm` validated it already; a replacement effect
        may not have: an answer that does not read is None, and logged.
        """
        output = self.ctx.output
        if output is None or outcome != "done":
            return None
        try:
            return output.parse(text)
        except InvalidArguments as exc:
            logger.warning(
                "run %s: the final answer does not fit: %s", self.run_id, exc
            )
            return None

    async def _append_end(
        self,
        opening: tuple[RunOpened, ...],
        outcome: str,
        snapshot: Snapshot,
        text: str,
        error: TurnFSMError | None,
        waiting: Pause | None,
    ) -> None:
        await self.session.append(
            *opening,
            RunEnded(
                run_id=self.run_id,
                outcome=outcome,  # type: ignore[arg-type]
                phase=snapshot.phase,
                text=text,
                error=error,
                usage=self.usage,
                turns=snapshot.turns,
                waiting=waiting,
                at=self.ctx.clock(),
                compaction_usage=self.compaction_usage,
            ),
        )

    def _hear_end(
        self, outcome: str, snapshot: Snapshot, text: str, error: TurnFSMError | None
    ) -> None:
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
                    usage=self.usage,
                    compaction_usage=self.compaction_usage,
                ),
            )

    async def _abort(self, event: RunCancelled) -> None:
        """Record a cancellation from outside (shielded; never raises)."""
        decision: Decision = Fail(error=Cancelled(reason=event.reason))
        try:
            fed = await self.feed(event, None)
            if isinstance(fed, Fail):
                decision = fed
        except Exception:  # a broken brain: the run still ends cancelled
            logger.debug("run %s: the brain refused the cancel", self.run_id)
        try:
            await self._end(decision, None)  # type: ignore[arg-type]
        except Exception:
            logger.exception("run %s: could not record its cancellation", self.run_id)
            error = decision.error if isinstance(decision, Fail) else None
            self._hear_end("cancelled", self.machine.snapshot, "", error)

    async def _crash(self, exc: BaseException) -> None:
        """Record that the run ended on an unexpected exception (shielded).

        Observers hear of it even when the log cannot take it (its store is
        down): the run is over in this process, whatever the log says.
        """
        crashed = RunCrashed(type=type(exc).__name__, message=str(exc))
        try:
            await self._end(None, crashed)
        except Exception:
            logger.exception("run %s: could not record its crash", self.run_id)
            snapshot = self.machine.snapshot
            self._hear_end("failed", snapshot, "", crashed)


async def carry_out(
    settings: LoopSettings,
    ctx: EffectContext,
    decision: Decision,
    control: RunControl | None = None,
) -> Event:
    """Carry `decision` out with its effect, under its timeout; return the event.

    The one way an effect is run, by the loop and by a Temporal activity
    (`turnfsm.temporal`) alike: a compaction pass past `compaction_timeout`
    is `CompactorFailed`, a custom effect past `effect_timeout` cancels the
    run, and a `control`'s cancel interrupts the effect (its `RunCancelled`
    is returned).

    Raises:
        InvalidReturn: the effect returned something other than an event.
    """
    key = effect_key(decision)
    effect = settings.effects[key]
    limit = _limit(settings, decision)
    if limit is None and control is None:
        return _event_of(key, await effect(ctx, decision))
    with anyio.CancelScope() as scope:
        if limit is not None:
            scope.deadline = anyio.current_time() + limit
        if control is not None:
            control._scope = scope
        try:
            return _event_of(key, await effect(ctx, decision))
        finally:
            if control is not None:
                control._scope = None
    cancel = control.take_cancel() if control is not None else None
    if cancel is not None:
        return cancel
    return _timed_out(ctx, decision, key, limit)


def _limit(settings: LoopSettings, decision: Decision) -> float | None:
    kind = type(decision)
    if kind is Compact:
        return settings.compaction_timeout
    if kind is Perform:
        return settings.effect_timeout
    return None


def _timed_out(
    ctx: EffectContext, decision: Decision, key: str, limit: float | None
) -> Event:
    snapshot = ctx.snapshot
    if isinstance(decision, Compact):
        used = snapshot.estimate or 0
        spent = ctx.spent
        usage = sum(spent, Usage()) if spent else None
        spent.clear()
        return CompactorFailed(
            used=used,
            limit=snapshot.budget.context_window,
            error=ErrorInfo(
                type="TimeoutError",
                message=f"the compaction pass timed out after {limit}s",
            ),
            usage=usage,
        )
    return RunCancelled(reason=f"effect {key!r} timed out after {limit}s")


def _event_of(key: str, value: object) -> Event:
    """Return what effect `key` returned if it is an event; else raise."""
    if not isinstance(value, EVENT_TYPES):
        text = repr(value)
        raise InvalidReturn(
            f"effect {key!r}",
            text if len(text) <= 200 else text[:197] + "...",
            "an event (turnfsm.core.EVENT_TYPES)",
        )
    return value


class _Broken(Exception):
    """The brain refused an event's messages (internal: ends the run failed)."""

    def __init__(self, error: InvalidMessage) -> None:
        super().__init__(str(error))
        self.error = error


def _committed(run_id: str, old: MessageLog, new: MessageLog) -> Committed:
    """Describe how the committed history changed from `old` to `new`."""
    keep = len(old)
    if len(new) >= keep and new.store_key[0] is old.store_key[0]:
        return Committed(run_id=run_id, keep=keep, messages=[m.id for m in new[keep:]])
    return Committed(run_id=run_id, keep=0, messages=[m.id for m in new])


def _summaries(run_id: str, messages: tuple[Message, ...]) -> list[Entry]:
    """The summaries a committed compaction brought in (`SUMMARY_COVERS`)."""
    return [
        SummaryRecorded(
            run_id=run_id,
            message_id=m.id,
            content=m.text,
            covers_up_to_message_id=m.metadata[SUMMARY_COVERS],
        )
        for m in messages
        if SUMMARY_COVERS in m.metadata
    ]
