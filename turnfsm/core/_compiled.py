"""A `MachineSpec` built into a `transitions` Machine, shared by every run on it.

The only module that imports `transitions`: `_Compiled` builds the Machine
and the table the brain picks transitions from (see `_machine.py`, Rule 1);
`Step` is what one fired transition leaves for a hook or a trace.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from functools import partial
from typing import Any, TypeAlias, final

import attrs
from transitions import EventData, Machine, State, Transition
from transitions.core import Event as TransitionsEvent

from turnfsm.core._deciders import Decide, _decider
from turnfsm.core._events import EVENT_TYPES, Event, Signal, trigger_name
from turnfsm.core._guards import GUARDS, Guard
from turnfsm.core._lines import CompactReason
from turnfsm.core._reducers import (
    CHANGES,
    FAILURES,
    Changes,
    FailureBuilder,
    record_signal_message,
)
from turnfsm.core._snapshot import Snapshot
from turnfsm.core._spec import MachineSpec

__all__ = ["Step", "_Compiled", "_Model", "_compiled", "_select"]


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

    __slots__ = ("data", "state", "step")

    def __init__(self, snapshot: Snapshot) -> None:
        self.state = snapshot.phase
        self.step: Step | None = None
        self.data: EventData | None = None
        """The run's `EventData`, filled anew for each firing (see `_Firing`)."""


@final
class _Firing:
    """One transition of the Machine, fired from the phase it leaves (internal).

    `reduce` is its work on the snapshot, in Rule 2's order; `fire` then
    moves the model as `Event.trigger` would for a trigger of this
    transition alone, minus its look-ups: the brain has picked the
    transition already (its source is the model's state), so it hands
    `Transition.execute` the `EventData` that `Event._process` would, and
    `transitions` changes the state. The transitions carry no callbacks and
    the Machine no queue and no `prepare_event`, `finalize_event` or
    `on_exception` callbacks, so nothing the trigger would do is left out.
    """

    __slots__ = (
        "base",
        "event",
        "failure",
        "machine",
        "on_enter",
        "reducers",
        "source",
        "step",
        "transition",
    )

    def __init__(
        self,
        machine: Machine,
        name: str,
        step: Step,
        base: dict[str, Any],
        failure: FailureBuilder | None,
        reducers: tuple[tuple[_Change, ...], tuple[_Change, ...]],
    ) -> None:
        self.event: TransitionsEvent = machine.events[name]
        self.machine = machine
        self.source: State = machine.get_state(step.source)
        self.transition: Transition = self.event.transitions[step.source][0]
        self.step = step
        self.base = base
        """The fields the transition sets: the phase, its compaction reason."""
        self.failure = failure
        self.reducers, self.on_enter = reducers
        """Its actions (a signal's message first), its destination's `on_enter`."""

    @property
    def name(self) -> str:
        """The transition's trigger of its own (``measured#3``)."""
        return self.event.name

    def reduce(self, model: _Model, s: Snapshot, event: Event) -> Snapshot:
        """Return the snapshot the transition leaves from `s`.

        Rule 2's order: the phase and the reason or failure, the actions,
        then the destination's `on_enter`; the step is recorded once the
        actions passed. The reducers never read the model's state, so they
        run before `fire` moves it, and a reducer that raises leaves the
        model where it was.
        """
        failure = self.failure
        if failure is not None:
            s = s.replace(**self.base, failure=failure(s, event))
        else:
            s = s.replace(**self.base)
        # One copy per event: each reducer's changes go into the copy made
        # above, which no one else holds until it is returned; a reducer
        # reads it with the changes of those before it, as it would read
        # the snapshot they returned.
        fields = s.__dict__
        for changes in self.reducers:
            fields.update(changes(s, event))
        model.step = self.step
        for changes in self.on_enter:
            fields.update(changes(s, event))
        return s

    def fire(self, model: _Model) -> None:
        """Move `model` to the transition's destination, by `transitions`.

        A run fires one transition at a time and nothing keeps the
        `EventData`, so each run has one, set as `Event._process` would make
        it anew (its machine and model are the run's own): a third of a
        microsecond less per event than building one.
        """
        data = model.data
        if data is None:
            data = EventData(self.source, self.event, self.machine, model, (), {})
            model.data = data
        else:
            data.state = self.source
            data.event = self.event
            data.error = None
            data.result = False
        data.transition = self.transition
        data.result = self.transition.execute(data)


_Candidate: TypeAlias = tuple[tuple[Guard, ...], tuple[Guard, ...], _Firing]
"""One transition of a (phase, trigger) group: its conditions, its `unless`
guards and how it is fired (internal)."""

_Groups: TypeAlias = dict[str, tuple[_Candidate, ...]]
"""Phase -> the transitions one trigger may fire there, in file order."""


def _select(
    candidates: tuple[_Candidate, ...], s: Snapshot, event: Event
) -> _Firing | None:
    """Return the firing of the first candidate whose guards pass."""
    for conditions, unless, fire in candidates:
        for guard in conditions:
            if not guard(s, event):
                break
        else:
            for guard in unless:
                if guard(s, event):
                    break
            else:
                return fire
    return None


@final
class _Compiled:
    """One `MachineSpec` built into a `transitions` Machine, shared by its runs.

    Building the Machine is most of what starting a run would cost, so it is
    built once per spec: no model is ever registered with it (each run's
    `_Model` travels in the run's own `EventData`), so runs share nothing but
    the transition table (internal).
    """

    __slots__ = ("by_type", "decide", "machine", "messages", "signals", "terminal")

    def __init__(self, spec: MachineSpec) -> None:
        # The brain runs the reducers (see `_Firing.reduce`) and `transitions`
        # only changes the state: neither states nor transitions carry
        # callbacks, a phase's `on_enter` reducers run with each transition
        # that enters it.
        states = [State(s.name) for s in spec.states]
        entering = {s.name: _reducers(s.on_enter) for s in spec.states}
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
        self.messages: dict[str, str] = {}
        """A transition's trigger of its own -> the data key its signal adds."""
        for index, t in enumerate(spec.transitions):
            conditions = tuple(GUARDS[g] for g in t.conditions)
            unless = tuple(GUARDS[g] for g in t.unless)
            failure = FAILURES[t.error] if t.error is not None else None
            reducers = _reducers(t.actions)
            name = f"{t.trigger}#{index}"
            if t.message is not None:
                # The signal's message joins pending first, then the actions.
                reducers = (partial(record_signal_message, t.message), *reducers)
                self.messages[name] = t.message
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
                # An internal transition (no dest) enters no phase.
                on_enter = entering[t.dest] if t.dest is not None else ()
                machine.add_transition(name, source, t.dest)
                fire = _Firing(machine, name, step, base, failure, (reducers, on_enter))
                by_phase = groups.setdefault(t.trigger, {})
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


_Change: TypeAlias = Callable[[Snapshot, Event], Changes]
"""A reducer as the fields it changes (see `CHANGES`)."""


def _reducers(names: tuple[str, ...]) -> tuple[_Change, ...]:
    return tuple(CHANGES[name] for name in names)


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
