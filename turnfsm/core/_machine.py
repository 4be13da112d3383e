"""TurnMachine: the brain. The only module that imports `transitions`.

Theory of operation
-------------------
The brain is a pure function of (spec, snapshot, event) wrapped in an object.
`handle(event)` derives the trigger from the event's class, asks the
`transitions` Machine built from the spec to fire it, and returns the
decision of the phase it lands in. Nothing else moves the machine. The
Machine is built once per spec and shared by every run on it: each run is a
small model object that `transitions` hands back to the callbacks in its
`EventData` (``send_event=True``), never registered with the Machine.

Rule 1 - transitions are data. Guards, reducers and failure builders are
looked up by name in fixed tables; the spec validated every name at load
time, so at run time a (phase, trigger) pair either fires exactly one
transition (the first whose guards pass; every group ends unconditionally)
or is not accepted at all (`IllegalEvent`). The guards are pure, so the
brain evaluates a group itself from a table built once per spec, and fires
the winner through `transitions` under a trigger of that transition alone
(``measured#3``): the state change, the callbacks and their order are
`transitions`', but no guard is checked twice or through its machinery.

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

import weakref
from collections.abc import Callable
from functools import partial
from typing import Any, Protocol, TypeAlias, final

import attrs
from transitions import Machine, State
from transitions.core import Event as TransitionsEvent

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
    EVENT_TYPES,
    Event,
    MessageInjected,
    RunCancelled,
    Signal,
    trigger_name,
    trigger_of,
)
from turnfsm.core._guards import GUARDS, Guard
from turnfsm.core._lines import CompactReason
from turnfsm.core._reducers import FAILURES, REDUCERS, FailureBuilder, Reducer
from turnfsm.core._snapshot import Budget, Snapshot
from turnfsm.core._spec import MachineSpec, StateSpec
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
    """One fired transition: what a hook or a trace sees.

    Attributes:
        source: The phase it left.
        dest: The phase it entered (`source` for an internal transition).
        trigger: The event's trigger.
        reason: The compaction reason the transition sets, if any.
        error: The failure it builds, if any.
        index: Its position among the machine file's transitions (0-based):
            which edge of the diagram fired.
        guards: The guards that passed: its ``conditions``, then each of its
            ``unless`` as ``not NAME``.
    """

    source: str
    dest: str
    trigger: str
    reason: CompactReason | None = None
    error: str | None = None
    index: int = -1
    guards: tuple[str, ...] = ()


class _Model:
    """The object `transitions` moves between states: one per run (internal)."""

    __slots__ = ("event", "snapshot", "state", "step")

    def __init__(self, snapshot: Snapshot) -> None:
        self.state = snapshot.phase
        self.snapshot = snapshot
        self.event: Event | None = None
        self.step: Step | None = None


class _Data(Protocol):
    """What the callbacks read of the `EventData` transitions hands them."""

    model: _Model


Decide: TypeAlias = Callable[[Snapshot, OpenCalls], Decision]
"""The decision a phase emits, given the snapshot and its pending's open calls."""


_Candidate: TypeAlias = tuple[tuple[Guard, ...], tuple[Guard, ...], TransitionsEvent]
"""One transition of a (phase, trigger) group: its conditions, its `unless`
guards and the `transitions` event that fires it alone (internal)."""

_Groups: TypeAlias = dict[str, tuple[_Candidate, ...]]
"""Phase -> the transitions one trigger may fire there, in file order."""


def _select(candidates: tuple[_Candidate, ...], s: Snapshot, event: Event) -> Any:
    """Return the `transitions` event of the first candidate whose guards pass."""
    for conditions, unless, fire in candidates:
        passed = True
        for guard in conditions:
            if not guard(s, event):
                passed = False
                break
        if passed:
            for guard in unless:
                if guard(s, event):
                    passed = False
                    break
        if passed:
            return fire
    return None


def _fire(
    step: Step,
    base: dict[str, Any],
    failure: FailureBuilder | None,
    reducers: tuple[Reducer, ...],
    data: _Data,
) -> None:
    model = data.model
    event = model.event
    assert event is not None
    s = model.snapshot
    if failure is not None:
        s = s.replace(**base, failure=failure(s, event))
    else:
        s = s.replace(**base)
    for reducer in reducers:
        s = reducer(s, event)
    model.snapshot = s
    model.step = step


def _enter(reducers: tuple[Reducer, ...], data: _Data) -> None:
    model = data.model
    event = model.event
    assert event is not None
    s = model.snapshot
    for reducer in reducers:
        s = reducer(s, event)
    model.snapshot = s


@final
class _Compiled:
    """One `MachineSpec` built into a `transitions` Machine, shared by its runs.

    Building the Machine is most of what starting a run would cost, so it is
    built once per spec: its callbacks read the run's `_Model` from the
    `EventData` (``send_event=True``), and no model is ever registered with
    it, so runs share nothing but the transition table (internal).
    """

    __slots__ = ("by_type", "decide", "machine", "signals", "terminal")

    def __init__(self, spec: MachineSpec) -> None:
        states = [
            State(
                s.name,
                on_enter=[partial(_enter, _reducers(s.on_enter))]
                if s.on_enter
                else None,
            )
            for s in spec.states
        ]
        machine = Machine(
            model=None,
            states=states,
            initial=spec.initial,
            auto_transitions=False,
            model_override=True,
            send_event=True,
            ignore_invalid_triggers=False,
        )
        # The guards are pure, so the brain picks the transition a trigger
        # fires itself (the first whose guards pass, in file order, as
        # `transitions` would) and fires it through `transitions` under a
        # trigger of its own, which then has no condition left to check.
        groups: dict[str, dict[str, list[_Candidate]]] = {}
        for index, t in enumerate(spec.transitions):
            conditions = tuple(GUARDS[g] for g in t.conditions)
            unless = tuple(GUARDS[g] for g in t.unless)
            failure = FAILURES[t.error] if t.error is not None else None
            reducers = _reducers(t.actions)
            name = f"{t.trigger}#{index}"
            for source in t.sources:
                dest = t.dest if t.dest is not None else source
                step = Step(
                    source=source,
                    dest=dest,
                    trigger=t.trigger,
                    reason=t.reason,
                    error=t.error,
                    index=index,
                    guards=(*t.conditions, *(f"not {g}" for g in t.unless)),
                )
                base: dict[str, Any] = {"phase": dest}
                if t.reason is not None:
                    base["compact_reason"] = t.reason
                machine.add_transition(
                    name,
                    source,
                    t.dest,
                    before=[partial(_fire, step, base, failure, reducers)],
                )
            fire = machine.events[name]
            by_phase = groups.setdefault(t.trigger, {})
            for source in t.sources:
                by_phase.setdefault(source, []).append((conditions, unless, fire))
        table: dict[str, _Groups] = {
            trigger: {phase: tuple(c) for phase, c in by_phase.items()}
            for trigger, by_phase in groups.items()
        }
        self.machine = machine
        self.by_type: dict[type, _Groups] = {
            cls: table[trigger_name(cls)]
            for cls in EVENT_TYPES
            if cls is not Signal and trigger_name(cls) in table
        }
        self.signals: dict[str, _Groups] = {
            name: table[name] for name in spec.signals if name in table
        }
        self.terminal = frozenset(spec.terminal)
        self.decide: dict[str, Decide] = {
            s.name: _decider(spec, s) for s in spec.states
        }


def _reducers(names: tuple[str, ...]) -> tuple[Reducer, ...]:
    return tuple(REDUCERS[name] for name in names)


def _check_spec(spec: object) -> None:
    if not isinstance(spec, MachineSpec):
        raise ConfigError("spec", spec, "a MachineSpec (load_machine, default_machine)")


_COMPILED: dict[int, tuple[weakref.ref[MachineSpec], _Compiled]] = {}


def _compiled(spec: MachineSpec) -> _Compiled:
    """Return the built machine of `spec`, building it on first use."""
    key = id(spec)
    entry = _COMPILED.get(key)
    if entry is None or entry[0]() is not spec:
        # The entry goes with the spec, so an id is never reused stale.
        ref = weakref.ref(spec, lambda _ref: _COMPILED.pop(key, None))
        entry = _COMPILED[key] = (ref, _Compiled(spec))
    return entry[1]


@final
class TurnMachine:
    """The brain of one run: feed it events, it answers with decisions.

    Build one with `TurnMachine.start(spec, budget=...)` or restore one with
    `TurnMachine.from_snapshot(spec, snapshot)`; then alternate
    `decision = machine.handle(event)` with carrying the decision out.
    """

    __slots__ = (
        "_broken",
        "_compiled",
        "_decision",
        "_model",
        "_open",
        "_snapshot",
        "_spec",
    )

    def __init__(self, spec: MachineSpec, snapshot: Snapshot) -> None:
        """Prefer `start` or `from_snapshot`; this validates nothing."""
        self._spec = spec
        self._compiled = _compiled(spec)
        self._snapshot = snapshot
        self._model = _Model(snapshot)
        self._broken: str | None = None
        self._open = OpenCalls.of(snapshot.pending)
        self._decision = self._compiled.decide[snapshot.phase](snapshot, self._open)

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
        _check_spec(spec)
        snapshot = Snapshot(
            phase=spec.initial,
            budget=Budget() if budget is None else budget,
            history=history,
        )
        return cls.from_snapshot(spec, snapshot)

    @classmethod
    def from_snapshot(cls, spec: MachineSpec, snapshot: Snapshot) -> TurnMachine:
        """Return a machine that continues from `snapshot`.

        Raises:
            ConfigError: the snapshot's phase is not a phase of `spec`.
            InvalidMessage: the snapshot's buffers are not a valid
                conversation (Rule 4); names the call id.
        """
        _check_spec(spec)
        if not isinstance(snapshot, Snapshot):
            raise ConfigError("snapshot", snapshot, "a Snapshot")
        if snapshot.phase not in _compiled(spec).decide:
            known = ", ".join(spec.phases)
            raise ConfigError(
                "phase", snapshot.phase, f"a phase of {spec.name!r} ({known})"
            )
        OpenCalls.of(snapshot.history).require_closed()
        machine = cls(spec, snapshot)
        _check_open(machine._open, machine.decision)
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
        return self._snapshot.phase in self._compiled.terminal

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
        model = self._model
        model.step = None
        before = self._snapshot
        if before.phase in self._compiled.terminal:
            return self._decision
        try:
            self._fire(event)
            snapshot = model.snapshot
            # Rule 4, paying only for what changed: history was whole and
            # pending's open calls are known for the snapshot we leave.
            if snapshot.history is not before.history:
                OpenCalls.of(snapshot.history).require_closed()
            pending = snapshot.pending
            left_open = (
                self._open if pending is before.pending else OpenCalls.of(pending)
            )
            decision = self._compiled.decide[snapshot.phase](snapshot, left_open)
            _check_open(left_open, decision)
        except BaseException as exc:
            self._broken = f"{type(exc).__name__}: {exc}"
            model.snapshot = before
            model.state = before.phase
            raise
        self._snapshot = snapshot
        self._open = left_open
        self._decision = decision
        return decision

    def _fire(self, event: Event) -> None:
        compiled = self._compiled
        groups = compiled.by_type.get(type(event))
        if groups is None and isinstance(event, Signal):
            # A Signal fires only a declared signal, never a built-in trigger
            # (Signal(name="measured") would reach reducers that read a Measured).
            groups = compiled.signals.get(event.name)
        model = self._model
        candidates = groups.get(model.state) if groups is not None else None
        fire = (
            _select(candidates, model.snapshot, event)
            if candidates is not None
            else None
        )
        if fire is None:
            raise IllegalEvent(phase=self.phase, event=trigger_of(event))
        model.event = event
        fire.trigger(model)
        model.event = None

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


def _check_open(left_open: OpenCalls, decision: Decision) -> None:
    """Rule 4: no call may stay open when the conversation is sent on."""
    if left_open.ids and isinstance(decision, CallLLM | Compact | Finish):
        left_open.require_closed()


def _unanswered(s: Snapshot, left_open: OpenCalls) -> tuple[ToolCallPart, ...]:
    """The last reply's tool calls that have no result in pending yet."""
    if s.last_reply is None:
        return ()
    open_ids = list(left_open.ids)
    calls = []
    for call in s.last_reply.tool_calls:
        if call.id in open_ids:
            open_ids.remove(call.id)
            calls.append(call)
    return tuple(calls)


def _accepts(spec: MachineSpec, phase: str) -> tuple[str, ...]:
    return tuple(sorted({t.trigger for t in spec.transitions if phase in t.sources}))


def _decider(spec: MachineSpec, state: StateSpec) -> Decide:
    """Return how the phase `state` decides (built once per spec)."""
    kind = state.decision
    phase = state.name
    if kind == "measure":
        return lambda s, _o: Measure(history=s.history, pending=s.pending)
    if kind == "call_llm":
        return lambda s, _o: CallLLM(
            history=s.history, pending=s.pending, turn=s.turns + 1
        )
    if kind == "run_tools":
        return lambda s, o: RunTools(calls=_unanswered(s, o))
    if kind == "pause":
        accepts = _accepts(spec, phase)
        return lambda s, o: Pause(phase=phase, calls=_unanswered(s, o), accepts=accepts)
    if kind == "compact":
        return lambda s, _o: Compact(
            reason=s.compact_reason or CompactReason.MANUAL,
            history=s.history,
            pending=s.pending,
        )
    if kind == "finish":
        return lambda s, _o: Finish(
            text=s.last_reply.text if s.last_reply is not None else ""
        )
    if kind == "fail":
        return lambda s, _o: Fail(error=_error_of(s))
    effect = state.effect or ""
    return lambda _s, _o: Perform(effect=effect, phase=phase)


def _error_of(s: Snapshot) -> TurnFSMError:
    if s.failure is not None:
        return s.failure.to_error()
    return IllegalEvent(phase=s.phase, event="?")
