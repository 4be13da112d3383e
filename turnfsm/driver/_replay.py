"""Replay: re-feed a logged run's events into a fresh brain.

The brain is deterministic: the same machine, budget, starting history and
events give the same phases and decisions. Replaying a run's log therefore
checks the log (a tampered or truncated log diverges at a named event) and
rebuilds the brain exactly where the run stopped, which is how a paused or
interrupted run resumes in any process that opens the store.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import Final, final

import attrs

from turnfsm.core import (
    PASS_EVENT_TYPES,
    UNUSED_REPLY_TYPES,
    CallLLM,
    Compact,
    CompactionResult,
    Decision,
    Fail,
    Finish,
    MachineSpec,
    ModelReplied,
    OutputRejected,
    PassEvent,
    Pause,
    Snapshot,
    TurnMachine,
    trigger_of,
)
from turnfsm.driver._audit import compaction_record, summaries
from turnfsm.errors import (
    Cancelled,
    ConfigError,
    ContinuedAsNew,
    IllegalEvent,
    InvalidMessage,
    LogInconsistent,
    ReplayDiverged,
    ReplayError,
    RunCrashed,
    StoreUnusable,
    SubagentWaiting,
)
from turnfsm.messages import Joined, Message, MessageLog, Role
from turnfsm.persistence import (
    Committed,
    CompactionRecord,
    Entry,
    EventRecorded,
    RunEnded,
    RunRecord,
    Session,
    SummaryRecorded,
    TurnRecord,
    decision_key,
    machine_digest,
)
from turnfsm.values import Usage

__all__ = [
    "ReplayReport",
    "rebased",
    "rebuild",
    "replay",
    "stored_machine",
]


@final
@attrs.frozen(kw_only=True)
class ReplayReport:
    """What replaying one run found.

    Attributes:
        run_id: The run.
        events: How many logged events were re-fed.
        divergence: The first event whose phase or decision differs from the
            log (a `ReplayDiverged`), or where the log contradicts itself (a
            `LogInconsistent`), or None.
        history_matches: Whether the replayed committed history equals the
            one the log's commit points project (message for message).
        history_difference: How the replayed history differs from the log's
            (the counts, and the first message that differs), or None when
            it matches.
        commit: The position in the session's log of the run's last commit,
            whose history differs, or None.
    """

    run_id: str
    events: int
    divergence: ReplayError | None = attrs.field(eq=False)
    history_matches: bool
    history_difference: str | None = None
    commit: int | None = None

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

    With `check`, the log is checked as it is fed: the events come in their
    logged order (none repeated, moved or missing), every model reply is the
    assistant message its turn record names, each turn's recorded context is
    the request the brain makes, every answer of the brain is the logged
    one, and each end of the run (or pause) says what the brain did: its
    phase, its model calls, its outcome and final answer.

    A run stopped from outside (interrupted, or crashed) may have gone on
    past what its log took (a store that stopped answering), so its end is
    checked as far as that allows: it names a phase of the machine, and
    counts at least the model calls, usage and compaction usage its log
    holds.

    Two recorded figures are not checked, as the log cannot say what they
    should be: a turn record's `estimate` (the run's token counter's count
    of the request, with the tool schemas and system text it was sent with;
    the log keeps neither that counter nor, for a counter of your own, a
    way to make it again), and a compaction record's `strategy` (the name
    of the compactor that made the pass; a run resumed in another process
    may use another one, and the log keeps only the one the run began
    with).

    Args:
        spec: The machine the run ran on.
        session: The session holding the run's log.
        run_id: The run.
        check: Check the log, and compare every answer with it.
        on_step: Called with the brain after each event it took (its
            `last_step` is the transition that fired, if any), e.g. to draw
            the path the run took.

    Raises:
        ConfigError: the session has no such run.
        ReplayDiverged: `check` and the brain answers differently from the log.
        LogInconsistent: the log contradicts itself: the history before the
            run is not a whole conversation, or an event is one the brain
            cannot take where the log puts it (always), or, with `check`, an
            event is out of order, a reply is not what the turn records say,
            or an end of the run is not where the brain stopped.
    """
    record = _record(session, run_id)
    feed = _Feed(session, record, check=check)
    try:
        machine = TurnMachine.start(
            spec, budget=record.opened.budget, history=session.history_before(run_id)
        )
    except InvalidMessage as exc:
        raise feed.inconsistent(
            None,
            "the history before the run is a whole conversation",
            f"it is not: {exc}",
        ) from None
    if not record.opened.overflow_retries_in_a_row:
        # A run logged before a reply started the count again: as it ran.
        snapshot = attrs.evolve(machine.snapshot, overflow_retries_in_a_row=False)
        machine = TurnMachine.from_snapshot(spec, snapshot)
    rebases = session.rebases(run_id)
    if check:
        feed.check_ends(0, machine)
    for index, entry in enumerate(session.run_entries(run_id)):
        event = entry.event
        if index in rebases:  # the session was compacted while the run waited
            machine = rebased(spec, machine, rebases[index])
        last = machine.decision
        before = machine.snapshot
        if check:
            feed.check(index, entry, last)
        try:
            decision = machine.handle(event)
        except InvalidMessage:
            actual = (entry.phase, "error:InvalidMessage")
            machine = TurnMachine.from_snapshot(spec, before)
            if check:
                feed.check_pass(entry, last, before, taken=None)
        except IllegalEvent as exc:
            other = _other_machine(spec, record)
            if other is not None:  # the log may be sound: the machine differs
                refused = f"phase {exc.phase!r} does not take {exc.event!r}"
                raise ReplayDiverged(
                    run_id=run_id,
                    index=index,
                    event=trigger_of(event),
                    expected=" -> ".join((entry.phase, entry.decision)),
                    actual=f"{refused} ({other})",
                    entry=feed.position(entry),
                ) from None
            raise feed.inconsistent(
                entry,
                f"it led to {entry.phase} -> {entry.decision}",
                f"phase {exc.phase!r} does not take {exc.event!r} (an event "
                "before it is missing, repeated or out of order)",
            ) from None

        else:
            actual = (machine.phase, decision_key(decision))
            if on_step is not None:
                on_step(machine)
            if check:
                taken = machine.snapshot.history is not before.history
                feed.check_pass(entry, last, before, taken=taken)
        logged = (entry.phase, entry.decision)
        if check and actual != logged:
            other = _other_machine(spec, record)
            raise ReplayDiverged(
                run_id=run_id,
                index=index,
                event=trigger_of(event),
                expected=" -> ".join(logged),
                actual=" -> ".join(actual) + (f" ({other})" if other else ""),
                entry=feed.position(entry),
            )
        if check:
            feed.check_ends(index + 1, machine)
    if check:
        feed.finish()
    return machine


def _other_machine(spec: MachineSpec, record: RunRecord) -> str | None:
    """How `spec` differs from the machine `record`'s run began on (None: it is it)."""
    opened = record.opened
    digest = machine_digest(spec)
    if digest == opened.digest:
        return None
    return (
        f"the machine replayed, {spec.name} {digest}, is not the one the run "
        f"began on, {opened.machine} {opened.digest}"
    )


def rebased(
    spec: MachineSpec, machine: TurnMachine, history: MessageLog
) -> TurnMachine:
    """`machine` over `history`, committed by another run while it waited.

    Its own buffers (what it said, the calls awaiting approval) are kept as
    they are: a pass of the session compacts only the committed history.
    """
    snapshot = attrs.evolve(machine.snapshot, history=history)
    return TurnMachine.from_snapshot(spec, snapshot)


def replay(spec: MachineSpec | None, session: Session, run_id: str) -> ReplayReport:
    """Replay the logged run `run_id` on `spec` and report the first divergence.

    `spec` None: the machine the run began on, as the log keeps it (a process
    without the machine's file replays the run all the same). A log that
    contradicts itself is reported too (a `LogInconsistent`), as is a
    replayed history that differs from the one the log projects.

    Raises:
        ConfigError: `session` is no `Session` (an id: read it first, with
            `Session.load`), the session has no such run, or `spec` is None
            and the log keeps no machine for it.
    """
    if not isinstance(session, Session):
        raise ConfigError(
            "session",
            session,
            "a Session (an id names one: await Session.load(store, ID) reads it)",
        )
    record = _record(session, run_id)
    if spec is None:
        spec = stored_machine(session, record)
    events = len(session.run_entries(run_id))
    try:
        machine = rebuild(spec, session, run_id)
    except ReplayError as diverged:
        return ReplayReport(
            run_id=run_id, events=events, divergence=diverged, history_matches=False
        )
    expected = list(session.history_after(run_id))
    replayed = list(machine.snapshot.history)
    if replayed == expected:
        return ReplayReport(
            run_id=run_id, events=events, divergence=None, history_matches=True
        )
    commits = [
        i
        for i, entry in enumerate(session.entries)
        if isinstance(entry, Committed) and entry.run_id == run_id
    ]
    return ReplayReport(
        run_id=run_id,
        events=events,
        divergence=None,
        history_matches=False,
        history_difference=_difference(expected, replayed),
        commit=commits[-1] if commits else None,
    )


def _difference(logged: list[Message], replayed: list[Message]) -> str:
    """How the `replayed` history differs from the `logged` one, in words."""
    at = next(
        (i for i, (a, b) in enumerate(zip(logged, replayed, strict=False)) if a != b),
        min(len(logged), len(replayed)),
    )

    def said(messages: list[Message]) -> str:
        if at >= len(messages):
            return "none"
        message = messages[at]
        return f"{message.role.value} message {message.id}"

    same = at < min(len(logged), len(replayed)) and logged[at].id == replayed[at].id
    return (
        f"the log commits a history of {len(logged)} message(s), the replayed "
        f"events make {len(replayed)}; message #{at + 1} is {said(logged)} in "
        f"the log, {said(replayed)} replayed"
        + (" (its content differs)" if same else "")
    )


def _record(session: Session, run_id: str) -> RunRecord:
    try:
        return session.run(run_id)
    except KeyError:
        known = [run.run_id for run in session.runs]
        close = difflib.get_close_matches(str(run_id), known, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        expected = f"a run of session {session.id!r}{hint}"
        raise ConfigError("run_id", run_id, expected) from None


_REPLIES: Final = (ModelReplied, OutputRejected)


class _Feed:
    """The checks of one run's log as its events are fed (`rebuild`)."""

    def __init__(self, session: Session, record: RunRecord, *, check: bool) -> None:
        self.session = session
        self.record = record
        self.turns = record.turns if check else ()
        self.replies = 0  # model replies fed so far
        self._contexts = record.contexts()
        self.context: tuple[str, ...] = ()  # the ids the last turn's model saw
        self.ends: dict[int, list[RunEnded]] = {}
        self.summaries: list[SummaryRecorded] = []  # in the order written
        if check:
            self.ends, self.summaries = _ends(session, record.run_id)
        self.summarized = 0  # summary records matched so far
        self.passes = record.compactions if check else ()
        self.passed = 0  # compaction passes fed so far
        self.unusable = Usage()  # what replies that failed the run cost so far

    def position(self, entry: Entry) -> int | None:
        """Where `entry` is in the session's log (looked up only on a failure)."""
        return next((i for i, e in enumerate(self.session.entries) if e is entry), None)

    def inconsistent(
        self, entry: EventRecorded | None, expected: str, actual: str
    ) -> LogInconsistent:
        events = self.session.run_entries(self.record.run_id)
        if entry is None:  # before the first event: at the run's opening
            index = 0
            event = trigger_of(events[0].event) if events else "run_started"
            at: Entry = self.record.opened
        else:
            index = next((i for i, e in enumerate(events) if e is entry), entry.index)
            event, at = trigger_of(entry.event), entry
        return LogInconsistent(
            run_id=self.record.run_id,
            index=index,
            event=event,
            expected=expected,
            actual=actual,
            entry=self.position(at),
        )

    def check(self, index: int, entry: EventRecorded, decision: Decision) -> None:
        """Check the `index`-th event before the brain takes it."""
        if entry.index != index:
            raise self.inconsistent(
                entry,
                f"event #{index} of the run comes here",
                f"the event here is logged as #{entry.index} (an event is "
                "missing, repeated or out of order)",
            )
        event = entry.event
        if isinstance(event, UNUSED_REPLY_TYPES) and event.usage is not None:
            self.unusable = self.unusable + event.usage  # a reply that came
        if not isinstance(event, _REPLIES):
            return
        reply = event.message
        if self.replies >= len(self.turns):
            raise self.inconsistent(
                entry,
                f"{len(self.turns)} model call(s), each with its turn record",
                f"no turn record names the reply {reply.id!r}",
            )
        turn = self.turns[self.replies]
        self.replies += 1
        self.context = next(self._contexts)
        if reply.id != turn.output:
            raise self.inconsistent(
                entry,
                f"turn {turn.turn}'s reply is message {turn.output!r}",
                f"the event carries message {reply.id!r}",
            )
        if event.usage != turn.usage:
            raise self.inconsistent(
                entry,
                f"turn {turn.turn}'s usage is {turn.usage!r}",
                f"the reply reported {event.usage!r}",
            )
        if reply.role is not Role.ASSISTANT:
            raise self.inconsistent(
                entry,
                f"turn {turn.turn}'s reply {reply.id!r} is the model's "
                "(an assistant message)",
                f"the event carries it as a {reply.role.value} message",
            )
        if isinstance(decision, CallLLM):
            self._check_context(entry, turn, decision)

    def _check_context(
        self, entry: EventRecorded, turn: TurnRecord, decision: CallLLM
    ) -> None:
        if turn.turn != decision.turn:
            raise self.inconsistent(
                entry,
                f"the reply answers model call {turn.turn}",
                f"the brain made model call {decision.turn}",
            )
        logged = self.context
        sent = tuple(m.id for m in (*decision.history, *decision.pending))
        if logged != sent:
            k = next(
                (
                    i
                    for i, (a, b) in enumerate(zip(logged, sent, strict=False))
                    if a != b
                ),
                min(len(logged), len(sent)),
            )
            said = repr(logged[k]) if k < len(logged) else "nothing more"
            made = repr(sent[k]) if k < len(sent) else "nothing more"
            raise self.inconsistent(
                entry,
                f"model call {turn.turn} saw {said} at message {k} of its context",
                f"the brain's request has {made} there",
            )

    def check_pass(
        self,
        entry: EventRecorded,
        last: Decision,
        before: Snapshot,
        *,
        taken: bool | None,
    ) -> None:
        """Check the record of the compaction pass whose event `entry` is.

        The record is what the pass's decision and event make of it: what
        it covered and what replaced it, its tokens, its turn and verdict.
        """
        event = entry.event
        if not isinstance(last, Compact) or not isinstance(event, PASS_EVENT_TYPES):
            return
        pass_event: PassEvent = event
        run_id = self.record.run_id
        if self.passed >= len(self.passes):
            raise self.inconsistent(
                entry,
                "each compaction pass has its compaction record",
                "no compaction record names this pass",
            )
        logged = self.passes[self.passed]
        self.passed += 1
        made = compaction_record(
            run_id,
            f"{run_id}:{entry.index}",
            last,
            pass_event,
            before,
            taken=taken,
            strategy=logged.strategy,
        )
        differs = [
            field.name
            for field in attrs.fields(CompactionRecord)
            if getattr(made, field.name) != getattr(logged, field.name)
        ]
        if differs:
            name = differs[0]
            raise LogInconsistent(
                run_id=run_id,
                index=entry.index,
                event=trigger_of(event),
                expected=f"the pass's {name} is {_said(getattr(made, name))}",
                actual=f"its compaction record has {_said(getattr(logged, name))}",
                entry=self.position(logged),
            )
        if taken and isinstance(pass_event, CompactionResult):
            kept = Joined(before.history, before.pending)
            self._check_summaries(entry, summaries(run_id, pass_event.messages, kept))

    def _check_summaries(
        self, entry: EventRecorded, brought: list[SummaryRecorded]
    ) -> None:
        """Check the summary records of the pass `entry` committed."""
        for made in brought:
            if self.summarized >= len(self.summaries):
                raise self.inconsistent(
                    entry,
                    f"the pass brought in the summary {made.message_id!r}",
                    "no summary record names it",
                )
            logged = self.summaries[self.summarized]
            self.summarized += 1
            if logged != made:
                raise LogInconsistent(
                    run_id=self.record.run_id,
                    index=entry.index,
                    event=trigger_of(entry.event),
                    expected=f"the pass brought in the summary {made.message_id!r}"
                    f" ({made.content[:40]!r}...)",
                    actual=f"its summary record says {logged.message_id!r}"
                    f" ({logged.content[:40]!r}...)",
                    entry=self.position(logged),
                )

    def _usage_problem(self, end: RunEnded) -> str | None:
        """What `end` says of the usage its turns and passes did not report.

        An interrupted or crashed run may have used more than its log took
        (a store that stalled), never less.
        """
        ahead = end.outcome == "interrupted" or isinstance(end.error, RunCrashed)
        turns = self.turns[: self.replies]
        used = sum((t.usage for t in turns if t.usage), self.unusable)
        if end.usage != used and not (ahead and _covers(end.usage, used)):
            return f"its end says it used {end.usage!r}, its turns {used!r}"
        passes = self.passes[: self.passed]
        spent = sum((p.usage for p in passes if p.usage), Usage())
        said = end.compaction_usage
        if said != spent and not (ahead and _covers(said, spent)):
            return f"its end says its passes used {said!r}, their records {spent!r}"
        return None

    def check_ends(self, fed: int, machine: TurnMachine) -> None:
        """Check each end of the run logged after its first `fed` events.

        An end (or pause) says where the brain stopped: its phase and model
        calls as the brain has them, and an outcome its last decision
        allows (done: the final answer it gave; paused: the pause it made).
        """
        for end in self.ends.get(fed, ()):
            said = _end_problem(end, machine) or self._usage_problem(end)
            if said is None:
                continue
            events = self.session.run_entries(self.record.run_id)
            after = f"{machine.snapshot.turns} model call(s)"
            deciding = decision_key(machine.decision)
            raise LogInconsistent(
                run_id=self.record.run_id,
                index=fed,
                event=trigger_of(events[fed].event) if fed < len(events) else "end",
                expected=f"the run stopped in phase {machine.phase!r} after "
                f"{after}, deciding {deciding}",
                actual=said,
                entry=self.position(end),
            )

    def finish(self) -> None:
        """Every turn, pass and summary record was matched by its event."""
        events = self.session.run_entries(self.record.run_id)
        left: list[tuple[Entry, str]] = [
            (s, f"the summary {s.message_id!r} was brought in by a pass")
            for s in self.summaries[self.summarized :]
        ] + [
            (p, f"the compaction pass {p.key!r} has its event")
            for p in self.passes[self.passed :]
        ]
        if left:
            logged, expected = left[0]
            raise LogInconsistent(
                run_id=self.record.run_id,
                index=len(events),
                event="end of the run's events",
                expected=expected,
                actual="no event of the run is that pass",
                entry=self.position(logged),
            )
        if self.replies < len(self.turns):
            turn = self.turns[self.replies]
            events = self.session.run_entries(self.record.run_id)
            raise LogInconsistent(
                run_id=self.record.run_id,
                index=len(events),
                event="end of the run's events",
                expected=f"model call {turn.turn} replied with {turn.output!r}",
                actual="no event carries that reply",
                entry=self.position(turn),
            )


def _said(value: object) -> str:
    """`value` as a record's field says it, shortened for an error."""
    if isinstance(value, tuple) and len(value) > 4:
        return f"{len(value)} ids ({', '.join(map(repr, value[:2]))}, ...)"
    if isinstance(value, tuple):
        return f"{len(value)} id(s) {list(value)!r}"
    text = getattr(value, "value", value)
    return repr(text)


def _ends(
    session: Session, run_id: str
) -> tuple[dict[int, list[RunEnded]], list[SummaryRecorded]]:
    """The ends (and pauses) of run `run_id`, and its summary records.

    The ends by how many of the run's events precede each.
    """
    ends: dict[int, list[RunEnded]] = {}
    said: list[SummaryRecorded] = []
    fed = 0
    for entry in session.entries:
        if entry.run_id != run_id:
            continue
        if isinstance(entry, EventRecorded):
            fed += 1
        elif isinstance(entry, RunEnded):
            ends.setdefault(fed, []).append(entry)
        elif isinstance(entry, SummaryRecorded):
            said.append(entry)
    return ends, said


_INTERRUPTIONS: Final = (Cancelled, SubagentWaiting, ContinuedAsNew, StoreUnusable)
"""What an interrupted run's end says stopped it."""


def _covers(said: Usage, logged: Usage) -> bool:
    """Whether usage `said` is at least `logged`, count by count."""
    return all(
        getattr(said, field.name) >= getattr(logged, field.name)
        for field in attrs.fields(Usage)
    )


def _end_problem(end: RunEnded, machine: TurnMachine) -> str | None:
    """What `end` says that the brain, where it stopped, did not do (None: nothing).

    Wherever the run stopped, its end names a phase of its machine and
    counts at least the model calls its log holds: a run stopped from
    outside (interrupted, crashed, its store stalled) may be ahead of its
    log, never behind it.
    """
    said = f"its end says it ended {end.outcome}"
    decision = machine.decision
    if end.phase not in machine.spec.phases:
        return f"{said} in phase {end.phase!r}"
    if end.turns < machine.snapshot.turns:
        return f"{said} after {end.turns} model call(s)"
    if end.outcome == "interrupted":
        # Stopped from outside, wherever the brain was: an interruption says
        # what stopped it (never the brain's own end), and goes on from the
        # log, not from the phase its end names.
        if isinstance(end.error, _INTERRUPTIONS):
            return None
        return f"{said} ({end.error or 'no error'})"
    if not isinstance(decision, Finish | Fail | Pause):
        # Stopped from outside while the brain was mid-run (interrupted, a
        # crash, a store that stopped answering): wherever the brain was,
        # maybe past events its log could not take; never done or paused.
        return said if end.outcome in ("done", "paused") else None
    if isinstance(end.error, RunCrashed):
        return None  # stopped from outside before its end was written
    if end.phase != machine.phase:
        return f"{said} in phase {end.phase!r}"
    if end.turns != machine.snapshot.turns:
        return f"{said} after {end.turns} model call(s)"
    if isinstance(decision, Finish):
        if end.outcome != "done":
            return said
        if end.text != decision.text:
            return f"{said} with the answer {end.text!r}"
        return None
    if isinstance(decision, Pause):
        if end.outcome != "paused":
            return said
        if end.waiting != decision:
            return f"{said} waiting for {end.waiting!r}"
        return None
    if end.outcome not in ("failed", "cancelled"):
        return said
    if type(end.error) is not type(decision.error):
        return f"{said} on {end.error or 'no error'}, not {decision.error}"
    return None


def stored_machine(session: Session, record: RunRecord) -> MachineSpec:
    """The machine run `record` began on, as `session`'s log keeps it.

    Raises:
        ConfigError: the log keeps no machine of that digest.
    """
    opened = record.opened
    spec = session.machine(opened.digest)
    if spec is None:
        raise ConfigError(
            "machine",
            None,
            f"the machine run {record.run_id!r} began on ({opened.machine} "
            f"{opened.digest}); the log does not keep it: give its file",
            missing=True,
        )
    return spec
