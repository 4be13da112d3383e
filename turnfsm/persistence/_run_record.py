"""`RunRecord`: the audit trail of one run, projected from its session's log."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import islice
from typing import Final, Literal, final

import attrs

from turnfsm.core import (
    UNUSED_REPLY_TYPES,
    ContextOverflowed,
    Event,
    ModelFailed,
    Pause,
    RunStarted,
)
from turnfsm.errors import RunCrashed, TurnFSMError
from turnfsm.messages import Message, MessageLog
from turnfsm.persistence._records import (
    CompactionRecord,
    EventRecorded,
    RunEnded,
    RunOpened,
    ToolResultRecorded,
    TurnRecord,
)
from turnfsm.values import Usage

__all__ = ["GOES_ON", "RunRecord", "_Run"]

GOES_ON: Final = frozenset({"paused", "interrupted"})
"""The outcomes of an ended run that can still go on (be resumed)."""


@final
@attrs.frozen(kw_only=True)
class RunRecord:
    """The audit trail of one run, projected from the log; never rewritten.

    Attributes:
        run_id: The run.
        outcome: done, failed, cancelled, paused — or running: the run has
            no end in the log (in flight, or its process died).
        phase: The phase the run ended (or paused) in.
        input: The run's new messages.
        events: Every event fed to the brain, in order.
        turns: Every model call: the context it saw, its reply, its usage.
        compactions: Every compaction pass.
        text: The final answer ("" unless done).
        error: Why the run failed, or None.
        usage: Provider usage summed over the turns.
        waiting: What a paused run waits for.
        history: The committed history the run opened with: its first
            turn's context begins with some of it (`context`).
        continued: How many times the run stopped for its durable run's
            workflow to continue as new (a fresh Temporal history) and went
            on (`ContinuedAsNew`); 0 for a run that never did.
    """

    run_id: str
    outcome: Literal["done", "failed", "cancelled", "interrupted", "paused", "running"]
    phase: str
    input: tuple[Message, ...] = attrs.field(repr=False)
    events: tuple[Event, ...] = attrs.field(repr=False)
    turns: tuple[TurnRecord, ...] = attrs.field(repr=False)
    compactions: tuple[CompactionRecord, ...]
    text: str
    error: TurnFSMError | None = attrs.field(eq=False)
    usage: Usage
    waiting: Pause | None = None
    opened: RunOpened = attrs.field(repr=False, eq=False)
    history: MessageLog = attrs.field(factory=MessageLog, repr=False, eq=False)
    continued: int = attrs.field(default=0, eq=False)

    @property
    def reported_calls(self) -> int:
        """How many of its replies (`call_usages`) the provider reported usage for.

        Some OpenAI-compatible servers report none: their `usage` stays 0
        tokens, which is then no count at all.
        """
        return sum(1 for usage in self.call_usages if usage is not None)

    @property
    def call_usages(self) -> tuple[Usage | None, ...]:
        """What each of its model calls that got a reply cost, as reported.

        Its `turns`' usage, then that of the replies that came and could not
        be used (cut off at their budget, withheld by a filter, over the
        window: `UNUSED_REPLY_TYPES`); None where the provider said nothing.
        """
        return _call_usages(self.turns, self.events)

    @property
    def failed_calls(self) -> int:
        """How many of its model calls failed, or were refused as too long.

        Failed for good: the retries gave up. They are not among its
        `turns`, which are the calls that replied: a run whose provider
        refused its first call has no turn, yet asked.
        """
        failed = (ModelFailed, ContextOverflowed)
        return sum(1 for event in self.events if isinstance(event, failed))

    @property
    def cut_short(self) -> bool:
        """Whether it ended while it may have been waiting on its model.

        Cancelled, interrupted, crashed on an exception, or never ended in
        its log (its process stopped): a model call then out left no trace
        in the log, so a run with no `turns` may still have asked.
        """
        crashed = isinstance(self.error, RunCrashed)
        return crashed or self.outcome in ("cancelled", "interrupted", "running")

    @property
    def usage_unreported(self) -> bool:
        """Whether its model calls were made and the provider reported usage for none.

        Its `usage` (0 tokens) is then no count at all; a run with no
        model call used nothing, which is a count.
        """
        return bool(self.turns) and not self.reported_calls

    @property
    def is_open(self) -> bool:
        """Whether the run can still go on (paused, interrupted, or never ended)."""
        return self.outcome == "running" or self.outcome in GOES_ON

    def context(self, index: int) -> tuple[str, ...]:
        """Return the ids of the messages the model saw on `turns[index]`.

        Raises:
            IndexError: the run has no such turn.
        """
        if not -len(self.turns) <= index < len(self.turns):
            raise IndexError(f"the run has {len(self.turns)} turns, not {index + 1}")
        return next(islice(self.contexts(), index % len(self.turns), None))

    def contexts(self) -> Iterator[tuple[str, ...]]:
        """Yield the ids of the messages the model saw on each turn, in order.

        The first turn keeps the first `keep` messages of the history the
        run opened with; each later one, of the turn before it.
        """
        ids: tuple[str, ...] = ()
        for n, turn in enumerate(self.turns):
            if n == 0:
                ids = tuple(m.id for m in islice(self.history, turn.keep))
            ids = ids[: turn.keep] + turn.added
            yield ids


def _call_usages(
    turns: Iterable[TurnRecord], events: Iterable[Event]
) -> tuple[Usage | None, ...]:
    """`RunRecord.call_usages` of a run's `turns` and `events`."""
    failed = (
        event.usage
        for event in events
        if isinstance(event, UNUSED_REPLY_TYPES) and event.usage is not None
    )
    return (*(turn.usage for turn in turns), *failed)


@attrs.define(eq=False)
class _Run:
    """The entries of one run, as they arrive (internal)."""

    opened: RunOpened
    version: int  # the log's version right before `opened`
    history: MessageLog  # the committed history right before `opened`
    last: int = 0  # the log's version right after the run's latest entry
    events: list[EventRecorded] = attrs.field(factory=list)
    turns: list[TurnRecord] = attrs.field(factory=list)
    compactions: list[CompactionRecord] = attrs.field(factory=list)
    results: list[ToolResultRecorded] = attrs.field(factory=list)
    ended: RunEnded | None = None
    continued: int = 0  # its stops for a durable workflow to continue as new
    # The record last built, and `last` when it was: every entry of the run
    # moves `last`, so a run that did not change returns the same record.
    _built: tuple[int, RunRecord] | None = None

    def record(self) -> RunRecord:
        built = self._built
        if built is not None and built[0] == self.last:
            return built[1]
        record = self._record()
        self._built = (self.last, record)
        return record

    def _record(self) -> RunRecord:
        end = self.ended
        first = self.events[0].event if self.events else None
        if end is not None:
            phase = end.phase
        else:
            phase = self.events[-1].phase if self.events else ""
        return RunRecord(
            run_id=self.opened.run_id,
            outcome="running" if end is None else end.outcome,
            phase=phase,
            input=first.input if isinstance(first, RunStarted) else (),
            events=tuple(e.event for e in self.events),
            turns=tuple(self.turns),
            compactions=tuple(self.compactions),
            text="" if end is None else end.text,
            error=None if end is None else end.error,
            usage=sum(
                (
                    u
                    for u in _call_usages(self.turns, (e.event for e in self.events))
                    if u
                ),
                Usage(),
            )
            if end is None
            else end.usage,
            waiting=None if end is None else end.waiting,
            opened=self.opened,
            history=self.history,
            continued=self.continued,
        )
