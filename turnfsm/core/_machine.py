"""TurnMachine: the brain. The only module that imports `transitions`.

Theory of operation
-------------------
The brain is a pure function of (spec, snapshot, event) wrapped in an object.
`handle(event)` derives the trigger from the event's class, asks the
`transitions` Machine built from the spec to fire it, and returns the
decision of the phase it lands in. Nothing else moves the machine.

Rule 1 - transitions are data. Guards, reducers and failure builders are
looked up by name in fixed tables; the spec validated every name at load
time, so at run time a (phase, trigger) pair either fires exactly one
transition (the first whose guards pass; every group ends unconditionally)
or is not accepted at all (`IllegalEvent`).

Rule 2 - state changes happen in one order: the transition's `actions`
reducers (with the snapshot's phase already set to the destination), then the
destination's `on_enter` reducers. A compact transition records its reason,
a fail transition its `Failure`.

Rule 3 - terminal phases absorb: once `done` or `failed`, every feed is a
no-op that returns the same decision. If `handle()` raises (an illegal event,
an invalid message, a bug), the machine keeps its last good snapshot and
refuses all further input with `MachineBroken` (h11's ERROR state).

Rule 4 - the buffers stay a valid conversation, whoever fed the messages (a
built-in effect, a user effect, an injection, a compactor, a reviewer).
Before a new snapshot is adopted: `history` is a whole conversation (every
tool call answered); `history + pending` is a valid prefix (only the last
reply's calls may still be open: tools not run yet, or awaiting a review);
and when the decision sends the conversation on (`CallLLM`, `Compact`,
`Finish`) no call is open. Else `handle()` raises `InvalidMessage` naming the
call id. `OpenCalls` memoises each checked prefix on the `MessageLog`, so
the check costs O(new messages) per event, not O(history) (DESIGN 3, STYLE 14).

No clock, no I/O, no randomness: time, ids and token counts arrive on events,
so the same events in the same order give the same phases and decisions.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, final

import attrs
from transitions import Machine, MachineError, State

from turnfsm.core._decisions import (
    CallLLM,
    Compact,
    Decision,
    Fail,
    Finish,
    Measure,
    Pause,
    Perform,
    RunTools,
)
from turnfsm.core._events import (
    Event,
    MessageInjected,
    RunCancelled,
    Signal,
    trigger_of,
)
from turnfsm.core._guards import GUARDS
from turnfsm.core._lines import CompactReason
from turnfsm.core._reducers import FAILURES, REDUCERS
from turnfsm.core._snapshot import Budget, Snapshot
from turnfsm.core._spec import MachineSpec, TransitionSpec
from turnfsm.errors import (
    ConfigError,
    IllegalEvent,
    InvalidMessage,
    MachineBroken,
    TurnFSMError,
)
from turnfsm.messages import Message, MessageLog, OpenCalls, ToolCallPart

__all__ = ["Step", "TurnMachine"]


@final
@attrs.frozen(kw_only=True)
class Step:
    """One fired transition: what a hook or a trace sees."""

    source: str
    dest: str
    trigger: str
    reason: CompactReason | None = None
    error: str | None = None


class _Model:
    """The object `transitions` moves between states (internal)."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.state = snapshot.phase
        self.snapshot = snapshot
        self.event: Event | None = None
        self.step: Step | None = None


def _check_guard(name: str, negate: bool, model: _Model, _data: Any) -> bool:
    assert model.event is not None
    return GUARDS[name](model.snapshot, model.event) is not negate


def _fire(spec: TransitionSpec, source: str, model: _Model, _data: Any) -> None:
    event = model.event
    assert event is not None
    s = model.snapshot
    dest = spec.dest if spec.dest is not None else s.phase
    updates: dict[str, Any] = {"phase": dest}
    if spec.reason is not None:
        updates["compact_reason"] = spec.reason
    if spec.error is not None:
        updates["failure"] = FAILURES[spec.error](s, event)
    s = s.replace(**updates)
    for name in spec.actions:
        s = REDUCERS[name](s, event)
    model.snapshot = s
    model.step = Step(
        source=source,
        dest=dest,
        trigger=spec.trigger,
        reason=spec.reason,
        error=spec.error,
    )


def _enter(names: tuple[str, ...], model: _Model, _data: Any) -> None:
    assert model.event is not None
    s = model.snapshot
    for name in names:
        s = REDUCERS[name](s, model.event)
    model.snapshot = s


def _build(spec: MachineSpec, model: _Model) -> Machine:
    states = [
        State(
            s.name,
            on_enter=[partial(_enter, s.on_enter, model)] if s.on_enter else None,
        )
        for s in spec.states
    ]
    machine = Machine(
        model=model,
        states=states,
        initial=model.state,
        auto_transitions=False,
        # STYLE asks for model_override=True, but then transitions logs a
        # warning for every trigger the private model does not pre-declare;
        # binding them onto `_Model` is harmless: only `handle()` triggers.
        model_override=False,
        send_event=True,
        ignore_invalid_triggers=False,
    )
    for t in spec.transitions:
        guards: list[str | Callable[..., bool | None]] = []
        guards.extend(partial(_check_guard, g, False, model) for g in t.conditions)
        guards.extend(partial(_check_guard, g, True, model) for g in t.unless)
        for source in t.sources:
            machine.add_transition(
                t.trigger,
                source,
                t.dest,
                conditions=guards or None,
                before=[partial(_fire, t, source, model)],
            )
    return machine


@final
class TurnMachine:
    """The brain of one run: feed it events, it answers with decisions.

    Build one with `TurnMachine.start(spec, budget=...)` or restore one with
    `TurnMachine.from_snapshot(spec, snapshot)`; then alternate
    `decision = machine.handle(event)` with carrying the decision out.
    """

    __slots__ = ("_broken", "_decision", "_machine", "_model", "_snapshot", "_spec")

    def __init__(self, spec: MachineSpec, snapshot: Snapshot) -> None:
        """Prefer `start` or `from_snapshot`; this validates nothing."""
        self._spec = spec
        self._snapshot = snapshot
        self._model = _Model(snapshot)
        self._machine = _build(spec, self._model)
        self._broken: str | None = None
        self._decision = _decide(spec, snapshot)

    @classmethod
    def start(
        cls,
        spec: MachineSpec,
        *,
        budget: Budget | None = None,
        history: tuple[Message, ...] | MessageLog = (),
    ) -> TurnMachine:
        """Return a machine in the initial phase over a committed `history`.

        Raises:
            InvalidMessage: `history` is not a whole conversation (a tool
                result for no call, a call without a result); names the id.
        """
        log = history if isinstance(history, MessageLog) else MessageLog(history)
        snapshot = Snapshot(phase=spec.initial, budget=budget or Budget(), history=log)
        return cls.from_snapshot(spec, snapshot)

    @classmethod
    def from_snapshot(cls, spec: MachineSpec, snapshot: Snapshot) -> TurnMachine:
        """Return a machine that continues from `snapshot`.

        Raises:
            ConfigError: the snapshot's phase is not a phase of `spec`.
            InvalidMessage: the snapshot's buffers are not a valid
                conversation (Rule 4); names the call id.
        """
        if snapshot.phase not in spec.phases:
            known = ", ".join(spec.phases)
            raise ConfigError(
                "phase", snapshot.phase, f"a phase of {spec.name!r} ({known})"
            )
        machine = cls(spec, snapshot)
        _check_buffers(snapshot, machine.decision)
        return machine

    @property
    def spec(self) -> MachineSpec:
        """The machine definition."""
        return self._spec

    @property
    def phase(self) -> str:
        """The current phase."""
        return self._snapshot.phase

    @property
    def snapshot(self) -> Snapshot:
        """The current state, as a frozen, serialisable value."""
        return self._snapshot

    @property
    def decision(self) -> Decision:
        """The current decision; asking twice without a feed gives the same one."""
        return self._decision

    @property
    def last_step(self) -> Step | None:
        """The transition the last `handle()` fired, if any."""
        return self._model.step

    @property
    def is_finished(self) -> bool:
        """Whether the machine is in a terminal phase."""
        return self._snapshot.phase in self._spec.terminal

    def handle(self, event: Event) -> Decision:
        """Apply `event` and return the next decision.

        In a terminal phase every event is a no-op. On an exception the
        machine stays in the phase it was in, keeps its snapshot and refuses
        further input.

        Raises:
            IllegalEvent: the phase does not accept the event (a driver bug).
            InvalidMessage: the event's messages would break the conversation
                (Rule 4: an orphaned tool result or call; names the call id).
            MachineBroken: an earlier call raised.
        """
        if self._broken is not None:
            raise MachineBroken(phase=self.phase, cause=self._broken)
        self._model.step = None
        if self.is_finished:
            return self._decision
        try:
            self._fire(event)
            snapshot = self._model.snapshot
            decision = _decide(self._spec, snapshot)
            _check_buffers(snapshot, decision)
        except BaseException as exc:
            self._broken = f"{type(exc).__name__}: {exc}"
            self._model.snapshot = self._snapshot
            self._model.state = self._snapshot.phase
            if isinstance(exc, MachineError):
                raise IllegalEvent(phase=self.phase, event=trigger_of(event)) from None
            raise
        self._snapshot = snapshot
        self._decision = decision
        return decision

    def _fire(self, event: Event) -> None:
        trigger = trigger_of(event)
        machine_event = self._machine.events.get(trigger)
        # A Signal fires only a declared signal, never a built-in trigger
        # (Signal(name="measured") would reach reducers that read a Measured).
        is_spoof = isinstance(event, Signal) and trigger not in self._spec.signals
        if machine_event is None or is_spoof:
            raise IllegalEvent(phase=self.phase, event=trigger)
        self._model.event = event
        if not machine_event.trigger(self._model):
            raise IllegalEvent(phase=self.phase, event=trigger)
        self._model.event = None

    def cancel(self, reason: str = "cancelled") -> Decision:
        """End the run: the next decision is `Fail(Cancelled)`.

        A no-op in a terminal phase.
        """
        return self.handle(RunCancelled(reason=reason))

    def inject(self, message: Message) -> Decision:
        """Add `message` to pending (at once in `start`, else at the next `start`).

        Raises:
            InvalidMessage: `message` carries tool calls or tool results (their
                other half could never follow); the machine is unchanged.
        """
        if message.tool_calls or message.tool_results:
            raise InvalidMessage(
                "message.parts",
                message.id,
                "an injected message cannot carry tool calls or tool results",
            )
        return self.handle(MessageInjected(message=message))


def _check_buffers(s: Snapshot, decision: Decision) -> None:
    """Rule 4: raise `InvalidMessage` unless the buffers are a valid conversation."""
    OpenCalls.of(s.history).require_closed()
    # history is whole, so pending is checked as a conversation of its own.
    left_open = OpenCalls.of(s.pending)
    if isinstance(decision, CallLLM | Compact | Finish):
        left_open.require_closed()


def _unanswered(s: Snapshot) -> tuple[ToolCallPart, ...]:
    """The last reply's tool calls that have no result in pending yet."""
    if s.last_reply is None:
        return ()
    open_ids = list(OpenCalls.of(s.pending).ids)
    calls = []
    for call in s.last_reply.tool_calls:
        if call.id in open_ids:
            open_ids.remove(call.id)
            calls.append(call)
    return tuple(calls)


def _accepts(spec: MachineSpec, phase: str) -> tuple[str, ...]:
    return tuple(sorted({t.trigger for t in spec.transitions if phase in t.sources}))


def _decide(spec: MachineSpec, s: Snapshot) -> Decision:
    state = spec.state(s.phase)
    kind = state.decision
    if kind == "measure":
        return Measure(history=s.history, pending=s.pending)
    if kind == "call_llm":
        return CallLLM(history=s.history, pending=s.pending, turn=s.turns + 1)
    if kind == "run_tools":
        return RunTools(calls=_unanswered(s))
    if kind == "pause":
        return Pause(
            phase=s.phase, calls=_unanswered(s), accepts=_accepts(spec, s.phase)
        )
    if kind == "compact":
        reason = s.compact_reason or CompactReason.MANUAL
        return Compact(reason=reason, history=s.history, pending=s.pending)
    if kind == "finish":
        return Finish(text=s.last_reply.text if s.last_reply is not None else "")
    if kind == "fail":
        error: TurnFSMError = (
            s.failure.to_error()
            if s.failure is not None
            else IllegalEvent(phase=s.phase, event="?")
        )
        return Fail(error=error)
    return Perform(effect=state.effect or "", phase=s.phase)
