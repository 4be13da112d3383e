"""TurnMachine: the brain, over the Machine `_compiled.py` builds from its spec.

Theory of operation
-------------------
The brain is a pure function of (spec, snapshot, event) wrapped in an object.
`handle(event)` derives the trigger from the event's class, picks the
transition it fires, computes the new snapshot, asks the `transitions`
Machine built from the spec to move the run's state, and returns the
decision of the phase it lands in. Nothing else moves the machine. The
Machine is built once per spec and shared by every run on it: each run is a
small model object that travels in its own `EventData`, never registered
with the Machine.

Rule 1 - transitions are data. Guards, reducers and failure builders are
looked up by name in fixed tables; the spec validated every name at load
time, so at run time a (phase, trigger) pair either fires exactly one
transition (the first whose guards pass; every group ends unconditionally)
or is not accepted at all (`IllegalEvent`). The guards are pure, so the
brain evaluates a group itself from a table built once per spec, runs the
winner's reducers (Rule 2) and fires it through `transitions` as the trigger
of that transition alone (``measured#3``) would, by its `Transition.execute`:
the state change is `transitions`', but no guard is checked twice or through
its machinery, no trigger looks up what the brain knows, and no callback is
dispatched (the transitions carry none). A reducer that raises stops the
event before `transitions` moves the state.

Rule 2 - state changes happen in one order: a signal's message, where the
transition names one (``message = KEY``: `Signal.message` joins pending), then
the transition's `actions` reducers (with the snapshot's phase already set to
the destination), then the destination's `on_enter` reducers. A compact
transition records its reason, a fail transition its `Failure`.

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
`Finish`) no call is open; and no message joins pending or the inbox under
an id the conversation (history, pending, inbox) holds already. Else
`handle()` raises `InvalidMessage` naming the call or message id.
`OpenCalls` and `require_new_ids` keep what they learnt on the `MessageLog`
(and the machine keeps pending's open calls, which a reply or results that
only append go on from), so the checks cost O(new messages) per event, not
O(history).

No clock, no I/O, no randomness: time, ids and token counts arrive on events,
so the same events in the same order give the same phases and decisions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, NoReturn, final

from turnfsm import _checks
from turnfsm.core._compiled import Step, _compiled, _Model, _select
from turnfsm.core._decisions import CallLLM, Compact, Decision, Finish
from turnfsm.core._events import (
    EVENT_TYPES,
    Event,
    MessageInjected,
    RunCancelled,
    Signal,
    trigger_of,
)
from turnfsm.core._snapshot import Budget, Snapshot
from turnfsm.core._spec import MachineSpec
from turnfsm.errors import ConfigError, IllegalEvent, InvalidMessage, MachineBroken
from turnfsm.messages import Message, MessageLog, OpenCalls, require_new_ids

__all__ = ["TurnMachine"]

_EVENT_CLASSES: Final = frozenset(EVENT_TYPES)  # each final: its type says it all
_EVENT: Final = _checks.instance(
    EVENT_TYPES, "an event (turnfsm.core.EVENT_TYPES)", "event"
)


def _check_spec(spec: object) -> None:
    if not isinstance(spec, MachineSpec):
        raise ConfigError("spec", spec, "a MachineSpec (load_machine, default_machine)")


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
        if isinstance(machine.decision, CallLLM | Compact | Finish):
            machine._open.require_closed()  # a snapshot's own fault
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
            ConfigError: `event` is not an event (None, a trigger's name);
                the machine is unchanged and takes the next event.
            MachineBroken: an earlier call raised.
        """
        if self._broken is not None:
            raise MachineBroken(phase=self.phase, cause=self._broken)
        if type(event) not in _EVENT_CLASSES:
            _checks.check(event, "event", _EVENT)
        model = self._model
        model.step = None
        before = self._snapshot
        compiled = self._compiled
        if before.phase in compiled.terminal:
            return self._decision
        try:
            groups = compiled.by_type.get(type(event))
            if groups is None and isinstance(event, Signal):
                # A Signal fires only a declared signal, never a built-in trigger
                # (Signal(name="measured") would reach reducers that read a Measured).
                groups = compiled.signals.get(event.name)
            candidates = groups.get(model.state) if groups is not None else None
            fire = None if candidates is None else _select(candidates, before, event)
            if fire is None:
                raise IllegalEvent(phase=before.phase, event=trigger_of(event))
            snapshot = fire.reduce(model, before, event)
            fire.fire(model)
            pending = snapshot.pending
            if snapshot.history is before.history and snapshot.inbox is before.inbox:
                # The usual event: history and the inbox untouched, pending as
                # it was (a measurement) or grown by appends (a reply, results).
                if pending is before.pending:
                    left_open = self._open
                else:
                    added = _added(before.pending, pending)
                    if added is None:
                        left_open = self._checked(before, snapshot)
                    else:  # the checks of `_checked` on what joined, in its order
                        left_open = self._open.then(added)
                        require_new_ids(
                            added,
                            snapshot.history,
                            before.pending,
                            snapshot.inbox,
                            field="message",
                        )
            else:
                left_open = self._checked(before, snapshot)
            decision = compiled.decide[snapshot.phase](snapshot, left_open)
            # Rule 4: no call may stay open when the conversation is sent on
            # (decisions are final classes: their type says it).
            if left_open.ids and type(decision) in _SENDS_ON:
                _unanswered(left_open, snapshot.phase, _SENDS_ON[type(decision)])
        except BaseException as exc:
            self._broken = f"{type(exc).__name__}: {exc}"
            model.state = before.phase
            raise
        self._snapshot = snapshot
        self._open = left_open
        self._decision = decision
        return decision

    def _checked(self, before: Snapshot, snapshot: Snapshot) -> OpenCalls:
        """Rule 4 on what changed but did not only grow: return pending's open calls.

        History was whole and pending's open calls are known for the snapshot
        we leave, so this pays only for what changed.
        """
        if snapshot.history is not before.history:
            committed = OpenCalls.of(snapshot.history)
            if committed.ids and snapshot.phase in self._compiled.terminal:
                # A run that ends committing a reply's calls unanswered.
                _unanswered(committed, snapshot.phase, _SENDS_ON[Finish])
            committed.require_closed()
        pending = snapshot.pending
        left_open = self._open if pending is before.pending else OpenCalls.of(pending)
        _check_new_ids(before, snapshot)
        return left_open

    def message_key(self, event: Signal) -> str | None:
        """Return the key of `event`'s data that feeding it adds to the conversation.

        That is the ``message`` of the transition `event` would fire now (the
        first of its group whose guards pass); `None` when that transition
        names none, or when the phase does not accept `event`. The driver
        asks before it feeds a signal, to build `Signal.message`. Changes
        nothing.
        """
        if self._broken is not None or self.is_finished:
            return None
        compiled = self._compiled
        groups = compiled.signals.get(event.name)
        candidates = groups.get(self._model.state) if groups is not None else None
        if candidates is None:
            return None
        fire = _select(candidates, self._snapshot, event)
        return None if fire is None else compiled.messages.get(fire.name)

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


def _check_new_ids(before: Snapshot, after: Snapshot) -> None:
    """Rule 4: what joined the buffers has ids the conversation has not.

    A compaction pass replaces the buffers (the manager checks its result);
    what only moved (a commit, the inbox flushed) is checked again, cheaply.
    A commit may carry a message that was never pending (a final reply).
    """
    history, pending, inbox = after.history, after.pending, after.inbox
    if history is not before.history:
        kept = _kept(before.history, history)
        if kept is not None and kept < len(history):
            committed = history.items_from(kept)
            require_new_ids(committed, before.history, field="message")
    if pending is not before.pending:
        kept = _kept(before.pending, pending)
        if kept is None:
            require_new_ids(pending, history, inbox, field="message")
        elif kept < len(pending):
            added = pending.items_from(kept)
            require_new_ids(added, history, before.pending, inbox, field="message")
    if inbox is not before.inbox:
        waiting = _kept(before.inbox, inbox)
        if waiting is None:
            require_new_ids(inbox, history, pending, field="message")
        else:  # what joined it (nothing, when only a copy was made)
            queued = inbox[waiting:]
            require_new_ids(queued, history, pending, before.inbox, field="message")


def _added(before: MessageLog, after: MessageLog) -> list[Message] | None:
    """What `after` appended to `before` (a longer view of its log), else None."""
    store, n = before.store_key
    after_store, length = after.store_key
    if after_store is not store or length < n:
        return None
    return list(after.items_from(n))


def _kept(before: Sequence[Message], after: Sequence[Message]) -> int | None:
    """How many items `after` keeps from `before` (all, when it only grew), or None."""
    n = len(before)
    if len(after) < n or (n and after[n - 1] is not before[n - 1]):
        return None
    return n


def _unanswered(calls: OpenCalls, phase: str, doing: str) -> NoReturn:
    """Refuse to go on in `phase` (`doing` it) with `calls` unanswered."""
    raise InvalidMessage(
        "tool_call.id",
        calls.ids[0],
        "a tool call with no result before the next message: phase "
        f"{phase!r} would {doing} with it unanswered (each call of a reply "
        "needs its result first: from a run_tools phase, or from a review "
        "that rejects it)",
    )


_SENDS_ON: Final[dict[type[Decision], str]] = {
    CallLLM: "call the model",
    Compact: "compact the conversation",
    Finish: "end the run",
}
