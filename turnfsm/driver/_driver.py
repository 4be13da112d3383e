"""The Driver: the hands that carry out the brain's decisions.

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
same shape for the built-in phases and the ones users add. They record
nothing; the loop writes the audit trail (turns, compaction passes, commit
points) from (decision, event) and calls the observing hooks.

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
passes and user effects run under a timeout; a cancelled run still ends in
the log (outcome ``cancelled``) and the cancellation propagates.

Rule 5 - outside failures become events once, at the effect that met them;
bugs propagate unchanged (the run is logged as crashed first).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final, final

import anyio
import anyio.lowlevel
import attrs

from turnfsm._resources import default_machine
from turnfsm.context import ContextManager
from turnfsm.core import (
    Budget,
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
    MachineSpec,
    Measure,
    ModelReplied,
    Pause,
    Perform,
    RunCancelled,
    RunStarted,
    RunTools,
    TurnMachine,
    trigger_of,
)
from turnfsm.driver._control import RunControl, RunResult
from turnfsm.driver._effects import (
    BUILTIN_EFFECTS,
    Effect,
    EffectContext,
    effect_key,
)
from turnfsm.driver._replay import rebuild
from turnfsm.driver._retry import RetryPolicy
from turnfsm.driver._tools import Tool, tools_by_name
from turnfsm.errors import (
    Cancelled,
    ConfigError,
    InvalidMessage,
    RunCrashed,
    SessionBusy,
    TurnFSMError,
)
from turnfsm.hooks import (
    CompactionInfo,
    DecisionInfo,
    Hook,
    OutcomeInfo,
    RunEndInfo,
    RunStartInfo,
    TransitionInfo,
)
from turnfsm.hooks._dispatch import HookDispatcher
from turnfsm.messages import Message, MessageLog, OpenCalls, check_history
from turnfsm.persistence import (
    Committed,
    CompactionRecord,
    Entry,
    EventRecorded,
    RunEnded,
    RunOpened,
    Session,
    ToolResultRecorded,
    TurnRecord,
    decision_key,
    machine_digest,
    new_id,
)
from turnfsm.providers import ModelClient, ToolSchema
from turnfsm.tokens import Meter, TokenCounter, default_counter
from turnfsm.values import ErrorInfo, Usage

__all__ = ["Driver"]

logger = logging.getLogger("turnfsm.driver")


def _seconds(name: str) -> Any:
    def check(_inst: object, _attr: object, value: object) -> None:
        if value is None:
            return
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        if not ok or not value > 0 or value == float("inf"):  # type: ignore[operator]
            raise ConfigError(name, value, "a finite number of seconds > 0, or None")

    return check


def _count(name: str, low: int) -> Any:
    def check(_inst: object, _attr: object, value: object) -> None:
        if type(value) is not int or value < low:
            raise ConfigError(name, value, f"an int >= {low}")

    return check


def _optional_count(name: str) -> Any:
    def check(_inst: object, _attr: object, value: object) -> None:
        if value is not None and (type(value) is not int or value < 1):
            raise ConfigError(name, value, "an int >= 1, or None")

    return check


@final
@attrs.define(eq=False, kw_only=True)
class Driver:
    """Runs the Turn FSM against a model, tools and a context manager.

    Attributes:
        model: the `ModelClient` to call.
        tools: tools the model may call (functions are wrapped as `Tool`s).
        system_prompt: sent with every request and counted in every measure.
        context: the `ContextManager` (window, lines, compactor); None means
            no compaction: a pass over the line is a no-op and the run fails.
        context_window: the window when there is no context manager.
        max_turns: model calls per run.
        max_overflow_retries: compact-and-retry passes after provider overflows.
        max_compactions: compaction passes per run.
        tool_timeout: seconds each tool call may take (None: no limit).
        model_timeout: seconds each model attempt may take (None: no limit).
        compaction_timeout: seconds a compaction pass may take (None: no limit).
        effect_timeout: seconds a custom effect may take (None: no limit).
        retry: the policy for transient model errors.
        hooks: observers; see `Hook`.
        strict_hooks: re-raise hook errors instead of detaching the hook.
        machine: the machine definition (defaults to ``machines/turn.toml``).
        effects: effects by name: one for every custom phase of `machine`
            (its ``effect = NAME``); a built-in name (``measure``,
            ``call_llm``, ``run_tools``, ``compact``) replaces that effect.
        max_output_tokens: the reply budget asked of the model; it is part
            of the reserved budget, so a request always leaves room for it.
        clock: wall-clock seconds for the log's timestamps.
    """

    model: ModelClient
    tools: Sequence[Tool | Callable[..., Any]] = ()
    system_prompt: str | None = attrs.field(default=None)
    context: ContextManager | None = attrs.field(factory=ContextManager)
    context_window: int = attrs.field(default=0, validator=_count("context_window", 0))
    max_turns: int = attrs.field(default=50, validator=_count("max_turns", 1))
    max_overflow_retries: int = attrs.field(
        default=2, validator=_count("max_overflow_retries", 0)
    )
    max_compactions: int = attrs.field(
        default=20, validator=_count("max_compactions", 1)
    )
    tool_timeout: float | None = attrs.field(
        default=60.0, validator=_seconds("tool_timeout")
    )
    model_timeout: float | None = attrs.field(
        default=300.0, validator=_seconds("model_timeout")
    )
    compaction_timeout: float | None = attrs.field(
        default=120.0, validator=_seconds("compaction_timeout")
    )
    effect_timeout: float | None = attrs.field(
        default=300.0, validator=_seconds("effect_timeout")
    )
    retry: RetryPolicy = attrs.field(factory=RetryPolicy)
    hooks: Sequence[Hook] = ()
    strict_hooks: bool = False
    machine: MachineSpec = attrs.field(factory=default_machine)
    effects: Mapping[str, Effect] = attrs.field(factory=dict)
    max_output_tokens: int | None = attrs.field(
        default=None, validator=_optional_count("max_output_tokens")
    )
    clock: Callable[[], float] = time.time
    _tools: dict[str, Tool] = attrs.field(init=False)
    _budget: Budget = attrs.field(init=False)
    _schemas: tuple[ToolSchema, ...] = attrs.field(init=False)
    _effects: dict[str, Effect] = attrs.field(init=False)
    _digest: str = attrs.field(init=False)
    _extras: tuple[str, ...] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.model, ModelClient):
            raise ConfigError("model", self.model, "a ModelClient (async complete())")
        if self.system_prompt is not None and not isinstance(self.system_prompt, str):
            raise ConfigError("system_prompt", self.system_prompt, "a string or None")
        if not isinstance(self.machine, MachineSpec):
            raise ConfigError("machine", self.machine, "a MachineSpec")
        if self.context is not None and not isinstance(self.context, ContextManager):
            raise ConfigError("context", self.context, "a ContextManager or None")
        self._tools = tools_by_name(self.tools)
        self._schemas = tuple(t.schema for t in self._tools.values())
        self._budget = (
            self.context.budget(
                max_turns=self.max_turns,
                max_overflow_retries=self.max_overflow_retries,
                max_compactions=self.max_compactions,
            )
            if self.context is not None
            else Budget(
                context_window=self.context_window,
                max_turns=self.max_turns,
                max_overflow_retries=self.max_overflow_retries,
                max_compactions=self.max_compactions,
            )
        )
        self._effects = {**BUILTIN_EFFECTS, **self.effects}
        for name, effect in self.effects.items():
            if not callable(effect):
                raise ConfigError(f"effects[{name!r}]", effect, "an async function")
        for state in self.machine.states:
            if state.effect is not None and state.effect not in self._effects:
                raise ConfigError(
                    "effects",
                    sorted(self.effects),
                    f"an effect named {state.effect!r} for phase {state.name!r}",
                )
        self._digest = machine_digest(self.machine)
        extras = [self.system_prompt or ""]
        if self._schemas:
            extras.append(json.dumps([attrs.asdict(s) for s in self._schemas]))
        self._extras = tuple(e for e in extras if e)

    @property
    def budget(self) -> Budget:
        """The limits each run works within (built by the context manager)."""
        return self._budget

    @property
    def counter(self) -> TokenCounter:
        """The one counter used everywhere: the context manager's."""
        return self.context.counter if self.context else default_counter()

    async def run(
        self,
        input: str | Message | Iterable[Message],
        *,
        session: Session | None = None,
        control: RunControl | None = None,
        hooks: Sequence[Hook] = (),
    ) -> RunResult:
        """Run the loop until the brain finishes, fails or pauses.

        Args:
            input: the run's new messages (a string becomes one user message).
            session: the conversation to continue; a new one if None. Its
                log is appended to as the run goes.
            control: a `RunControl` to inject messages or cancel while the
                run runs.
            hooks: extra hooks for this run only (after the driver's own).
                When one wants `on_text_delta` and the model can `stream`,
                replies are streamed.

        Returns:
            The `RunResult`; a failed run is an outcome (see
            `RunResult.raise_for_failure`).

        Raises:
            InvalidMessage: the input is malformed (nothing was written).
            SessionBusy: another run is using `session`, or a run of it is
                paused or unfinished (resume or abandon it first).
            SessionConflict: another writer appended to the session's log.
        """
        messages = _as_messages(input)
        session = session if session is not None else Session()
        if not isinstance(session, Session):
            raise ConfigError("session", session, "a Session or None")
        # O(new messages): the history's own state is memoised on its log.
        OpenCalls.of(session.history).then(messages).require_closed()
        with session.claim():
            waiting = session.open_runs()
            if waiting:
                raise SessionBusy(session.id, run_id=waiting[-1].run_id)
            run_id = new_id("run")
            machine = TurnMachine.start(
                self.machine, budget=self._budget, history=session.history
            )
            loop = self._loop(session, run_id, machine, control, hooks)
            loop.open(messages)
            return await loop.go(RunStarted(input=messages))

    async def resume(
        self,
        session: Session,
        run_id: str,
        event: Event | None = None,
        *,
        control: RunControl | None = None,
        hooks: Sequence[Hook] = (),
    ) -> RunResult:
        """Continue a paused (or unfinished) run of `session` from its log.

        The brain is rebuilt by replaying the run's logged events (checking
        every decision against the log), then `event` — the answer the run
        waits for, e.g. `ToolCallsReviewed.approve_all()` — is fed next.
        Without `event`, an unfinished run (its process died) redoes the
        decision it was carrying out.

        Raises:
            ConfigError: no such run; the run is not open; the machine is not
                the one the run began on; `event` is not an event the paused
                phase accepts.
            ReplayDiverged: the log does not replay on this machine.
            SessionBusy: another run is using `session`.
        """
        with session.claim():
            record = _open_run(session, run_id)
            opened = record.opened
            if opened.digest != self._digest:
                raise ConfigError(
                    "machine",
                    f"{self.machine.name} ({self._digest})",
                    f"the machine run {run_id!r} began on "
                    f"({opened.machine} {opened.digest})",
                )
            machine = rebuild(self.machine, session, run_id)
            decision = machine.decision
            if isinstance(decision, Pause):
                if event is None or trigger_of(event) not in decision.accepts:
                    raise ConfigError(
                        "event",
                        event,
                        f"an event the paused phase {decision.phase!r} accepts: "
                        + ", ".join(decision.accepts),
                    )
            elif event is not None:
                raise ConfigError("event", event, "None: the run is not paused")
            loop = self._loop(session, run_id, machine, control, hooks)
            loop.restore(record)
            if event is None:
                return await loop.carry_on(decision)
            return await loop.go(event)

    async def abandon(
        self, session: Session, run_id: str, *, reason: str = "abandoned"
    ) -> RunResult:
        """End a paused or unfinished run as cancelled; nothing it said is committed.

        Raises:
            ConfigError: no such run, or the run is not open.
            SessionBusy: another run is using `session`.
        """
        with session.claim():
            record = _open_run(session, run_id)
            machine = rebuild(self.machine, session, run_id, check=False)
            loop = self._loop(session, run_id, machine, None, ())
            loop.restore(record)
            return await loop.go(RunCancelled(reason=reason))

    def _loop(
        self,
        session: Session,
        run_id: str,
        machine: TurnMachine,
        control: RunControl | None,
        hooks: Sequence[Hook],
    ) -> _Loop:
        dispatcher = HookDispatcher.of([*self.hooks, *hooks], strict=self.strict_hooks)
        meter = Meter(self.counter)
        kept = self._extras
        reserved = (meter.measure(extras=kept) if kept else 0) + (
            self.max_output_tokens or 0
        )
        ctx = EffectContext(
            run_id=run_id,
            session_id=session.id,
            snapshot=machine.snapshot,
            model=self.model,
            tools=self._tools,
            tool_schemas=self._schemas,
            system_prompt=self.system_prompt,
            context=self.context,
            meter=meter,
            extras=kept,
            reserved=reserved,
            max_output_tokens=self.max_output_tokens,
            retry=self.retry,
            model_timeout=self.model_timeout,
            tool_timeout=self.tool_timeout,
            hooks=dispatcher,
            stream=dispatcher.wants("on_text_delta")
            and callable(getattr(self.model, "stream", None)),
            clock=self.clock,
            new_id=new_id,
            ephemeral=session.is_ephemeral,
        )
        loop = _Loop(self, session, machine, ctx, control)
        ctx.record = loop.record_result
        return loop


def _as_messages(value: str | Message | Iterable[Message]) -> tuple[Message, ...]:
    if isinstance(value, str):
        return (Message.user(value),)
    if isinstance(value, Message):
        return (value,)
    if value is None or not isinstance(value, Iterable):
        raise InvalidMessage("input", value, "a string, a Message or Messages")
    return check_history(value)


def _open_run(session: Session, run_id: str) -> Any:
    try:
        record = session.run(run_id)
    except KeyError:
        raise ConfigError(
            "run_id", run_id, f"a run of session {session.id!r}"
        ) from None
    if not record.is_open:
        raise ConfigError(
            "run_id", run_id, f"a paused or unfinished run (it is {record.outcome})"
        )
    return record


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
        driver: Driver,
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
        self.compactions = 0
        self.context: tuple[MessageLog, MessageLog] | None = None
        self._effects = driver._effects
        self._wants_transition = self.hooks.wants("on_transition")
        self._journal: anyio.Lock | None = None  # made on the first tool result
        self._opening: RunOpened | None = None  # written with the first event

    # -- the log -------------------------------------------------------
    def open(self, input: tuple[Message, ...]) -> None:
        """Open the run; its opening is written with its first event, atomically.

        A run whose opening were in the log without its input (the process
        died between the two appends) would resume without it.
        """
        self._opening = RunOpened(
            run_id=self.run_id,
            machine=self.driver.machine.name,
            digest=self.driver._digest,
            budget=self.machine.snapshot.budget,
            at=self.ctx.clock(),
        )
        if self.hooks.wants("on_run_start"):
            self.hooks.call(
                "on_run_start",
                RunStartInfo(
                    session_id=self.session.id, run_id=self.run_id, input=input
                ),
            )

    def restore(self, record: Any) -> None:
        self.index = len(record.events)
        self.usage = sum((t.usage for t in record.turns if t.usage), Usage())
        self.compactions = len(record.compactions)
        self.ctx.recorded = self.session.recorded_results(self.run_id)

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
        before = machine.snapshot
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
        entries.append(self._recorded(event, after.phase, decision_key(decision)))
        if after.history is not before.history:
            entries.append(_committed(self.run_id, before.history, after.history))
        await self.session.append(*entries, history=after.history)
        if self._wants_transition and machine.last_step is not None:
            self.hooks.call(
                "on_transition",
                TransitionInfo(run_id=self.run_id, step=machine.last_step),
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

    def _audit(self, decision: Decision, event: Event, before: Any) -> list[Entry]:
        """The audit entries a decision's outcome makes (a turn, a compaction)."""
        if isinstance(decision, CallLLM) and isinstance(event, ModelReplied):
            if event.usage is not None:
                self.usage = self.usage + event.usage
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
                return [self._compaction(decision, event, outcome, before)]
        return []

    def _context_change(self, decision: CallLLM) -> tuple[int, list[str]]:
        """The context of this call as a change from the previous call's."""
        history, pending = decision.history, decision.pending
        last, self.context = self.context, (history, pending)
        if (
            last is not None
            and _extends(history, last[0], same=True)
            and _extends(pending, last[1], same=False)
        ):
            keep = len(history) + len(last[1])
            return keep, [m.id for m in pending.items_from(len(last[1]))]
        return 0, [m.id for m in history] + [m.id for m in pending]

    def _compaction(
        self, decision: Compact, event: Event, outcome: str, before: Any
    ) -> CompactionRecord:
        covers = [m.id for m in decision.history] + [m.id for m in decision.pending]
        match event:
            case CompactionResult(messages=new, before=size, after=after):
                replacement = [m.id for m in new]
            case CompactionNoop(before=size, after=after, vetoed=vetoed):
                replacement = covers
                outcome = "vetoed" if vetoed else "noop"
            case CompactionOverflowed(used=after) | CompactorFailed(used=after):
                size, replacement = before.estimate or after, covers
            case _:
                size = after = before.estimate or 0
                replacement = covers
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
        )
        self.compactions += 1
        self._report(record)
        return record

    def _report(self, record: CompactionRecord) -> None:
        hooks = self.hooks
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
        except anyio.get_cancelled_exc_class():
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
            event = await self._effect(decision)
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
        key = effect_key(decision)
        effect = self._effects[key]
        control = self.control
        limit = self._limit(decision)
        if limit is None and control is None:
            return await effect(self.ctx, decision)
        with anyio.CancelScope() as scope:
            if limit is not None:
                scope.deadline = anyio.current_time() + limit
            if control is not None:
                control._scope = scope
            try:
                return await effect(self.ctx, decision)
            finally:
                if control is not None:
                    control._scope = None
        cancel = control.take_cancel() if control is not None else None
        if cancel is not None:
            return cancel
        return self._timed_out(decision, key, limit)

    def _limit(self, decision: Decision) -> float | None:
        kind = type(decision)
        if kind is Compact:
            return self.driver.compaction_timeout
        if kind is Perform:
            return self.driver.effect_timeout
        return None

    def _timed_out(self, decision: Decision, key: str, limit: float | None) -> Event:
        snapshot = self.machine.snapshot
        if isinstance(decision, Compact):
            used = snapshot.estimate or 0
            return CompactorFailed(
                used=used,
                limit=snapshot.budget.context_window,
                error=ErrorInfo(
                    type="TimeoutError",
                    message=f"the compaction pass timed out after {limit}s",
                ),
            )
        return RunCancelled(reason=f"effect {key!r} timed out after {limit}s")

    # -- the end -------------------------------------------------------
    async def _end(
        self, decision: Finish | Fail | Pause | None, error: TurnFSMError | None
    ) -> RunResult:
        snapshot = self.machine.snapshot
        text = decision.text if isinstance(decision, Finish) else ""
        waiting = decision if isinstance(decision, Pause) else None
        if isinstance(decision, Fail):
            error = decision.error
        if waiting is not None:
            outcome = "paused"
        elif error is None:
            outcome = "done"
        elif isinstance(error, Cancelled):
            outcome = "cancelled"
        else:
            outcome = "failed"
        # A run that ends before its first event was logged (a crash in the
        # first feed) still opens in the log before it ends.
        opening = () if self._opening is None else (self._opening,)
        self._opening = None
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
            ),
        )
        if self.hooks.wants("on_run_end"):
            self.hooks.call(
                "on_run_end",
                RunEndInfo(
                    run_id=self.run_id,
                    phase=snapshot.phase,
                    text=text,
                    error=error,
                    outcome=outcome,
                ),
            )
        return RunResult(
            outcome=outcome,  # type: ignore[arg-type]
            text=text,
            error=error,
            usage=self.usage,
            session_id=self.session.id,
            run_id=self.run_id,
            turns=snapshot.turns,
            waiting=waiting,
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

    async def _crash(self, exc: BaseException) -> None:
        """Record that the run ended on an unexpected exception (shielded)."""
        try:
            await self._end(None, RunCrashed(type=type(exc).__name__, message=str(exc)))
        except Exception:
            logger.exception("run %s: could not record its crash", self.run_id)


class _Broken(Exception):
    """The brain refused an event's messages (internal: ends the run failed)."""

    def __init__(self, error: InvalidMessage) -> None:
        super().__init__(str(error))
        self.error = error


def _extends(new: MessageLog, old: MessageLog, *, same: bool) -> bool:
    """Whether `new` is `old` (`same`) or `old` plus more (no copy compared)."""
    if new is old:
        return True
    if new.store_key[0] is not old.store_key[0]:
        return False
    return len(new) == len(old) if same else len(new) >= len(old)


def _committed(run_id: str, old: MessageLog, new: MessageLog) -> Committed:
    """Describe how the committed history changed from `old` to `new`."""
    keep = len(old)
    if len(new) >= keep and new.store_key[0] is old.store_key[0]:
        return Committed(run_id=run_id, keep=keep, messages=[m.id for m in new[keep:]])
    return Committed(run_id=run_id, keep=0, messages=[m.id for m in new])
