"""The audit trail: the log entries one step of a run makes, from its facts.

The loop hands each function the decision carried out, the event it came
to, and the brain's state before and after taking it; the functions return
the entries to append. A compaction pass's record is made here once, after
the brain took its event, so its verdict is decided once: a result the brain
refused is `stalled` from the start, never rewritten afterwards.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Final

from turnfsm import _checks
from turnfsm.context import ContextManager
from turnfsm.core import (
    CallLLM,
    Compact,
    CompactionCircuitOpened,
    CompactionNoop,
    CompactionOverflowed,
    CompactionResult,
    CompactorFailed,
    ModelReplied,
    OutputRejected,
    PassEvent,
    Snapshot,
)
from turnfsm.driver._context import Reported, report_limit
from turnfsm.driver._context_settings import context_settings
from turnfsm.driver._effects import is_extension
from turnfsm.hooks import CircuitInfo, HookDispatcher
from turnfsm.messages import SUMMARY_COVERS, Message, MessageLog
from turnfsm.persistence import (
    BreakerChanged,
    Committed,
    CompactionRecord,
    ContextSettings,
    Entry,
    RunRecord,
    Session,
    SummaryRecorded,
    TurnRecord,
    Verdict,
)
from turnfsm.providers import ModelPrices
from turnfsm.tokens import TokenCounter
from turnfsm.values import Usage

__all__ = [
    "UNUSED",
    "Audit",
    "committed",
    "compaction_record",
    "logged_cost",
    "summaries",
    "turn_record",
    "verdict_of",
]


def turn_record(
    run_id: str,
    decision: CallLLM,
    event: ModelReplied | OutputRejected,
    context: tuple[int, list[str]],
    estimate: int | None = None,
) -> TurnRecord:
    """The record of one model call: the context it saw, its reply and usage.

    `context` is the call's context as a change from the run's previous
    call: (ids kept, ids added); `estimate` is turnfsm's estimate of the
    request's input tokens, beside what the provider reported.
    """
    keep, added = context
    return TurnRecord(
        run_id=run_id,
        turn=decision.turn,
        keep=keep,
        added=added,
        output=event.message.id,
        usage=event.usage,
        estimate=estimate,
    )


def verdict_of(event: PassEvent, *, taken: bool | None) -> Verdict:
    """What a pass came to, given whether the brain committed its result.

    `taken` is True when the brain committed the result, False when it took
    the event without committing (the no-progress guard), None when it
    refused the event's messages as a broken conversation.
    """
    match event:
        case CompactionResult():
            if taken is None:
                return Verdict.FAILED
            return Verdict.COMPACTED if taken else Verdict.STALLED
        case CompactionNoop(vetoed=vetoed):
            return Verdict.VETOED if vetoed else Verdict.NOOP
        case CompactionOverflowed():
            return Verdict.OVERFLOW
        case CompactorFailed():
            return Verdict.FAILED
        case CompactionCircuitOpened():
            return Verdict.CIRCUIT_OPEN


def compaction_record(
    run_id: str,
    key: str,
    decision: Compact,
    event: PassEvent,
    before: Snapshot,
    *,
    taken: bool | None,
    strategy: str,
) -> CompactionRecord:
    """The one record of a pass: what it covered, what replaced it, its verdict.

    Args:
        run_id: The run.
        key: The pass's idempotency key, unique in the session.
        decision: The `Compact` decision the pass carried out.
        event: The event the pass came to.
        before: The brain's state before it took `event`.
        taken: See `verdict_of`.
        strategy: The compactor's class name ("" without a context manager).
    """
    covers = [m.id for m in decision.history] + [m.id for m in decision.pending]
    replacement: Sequence[str] = covers
    match event:
        case CompactionResult(messages=new, before=size, after=after):
            replacement = [m.id for m in new]
        case CompactionNoop(before=size, after=after):
            pass
        case CompactionOverflowed(used=after, before=measured):
            # A pass outside a run follows no measurement: its own says.
            size = before.estimate or measured or after
        case CompactorFailed(used=after):
            size = before.estimate or after
        case CompactionCircuitOpened():
            size = after = before.estimate or 0
    return CompactionRecord(
        run_id=run_id,
        turn=before.turns,
        reason=decision.reason,
        strategy=strategy,
        verdict=verdict_of(event, taken=taken),
        covers=covers,
        replacement=replacement,
        tokens_before=size,
        tokens_after=after,
        key=key,
        usage=None if isinstance(event, CompactionCircuitOpened) else event.usage,
        payback=event.payback
        if isinstance(event, CompactionResult | CompactionNoop)
        else None,
    )


def committed(run_id: str, old: MessageLog, new: MessageLog) -> Committed:
    """Describe how the committed history changed from `old` to `new`."""
    keep = len(old)
    if len(new) >= keep and new.store_key[0] is old.store_key[0]:
        return Committed(run_id=run_id, keep=keep, messages=[m.id for m in new[keep:]])
    return Committed(run_id=run_id, keep=0, messages=[m.id for m in new])


def summaries(
    run_id: str, messages: Sequence[Message], kept: Iterable[Message] = ()
) -> list[SummaryRecorded]:
    """The summaries a committed compaction brought in (`SUMMARY_COVERS`).

    A summary of the pass's input (`kept`) that it kept as it was is not
    brought in: it is recorded once, by the pass that wrote it.
    """
    said = {(m.id, m.text) for m in kept if SUMMARY_COVERS in m.metadata}
    return [
        SummaryRecorded(
            run_id=run_id,
            message_id=m.id,
            content=m.text,
            covers_up_to_message_id=m.metadata[SUMMARY_COVERS],
        )
        for m in messages
        if SUMMARY_COVERS in m.metadata and (m.id, m.text) not in said
    ]


UNUSED: Final = Usage()
"""Nothing used yet: a run's tallies and a child tally start here (frozen: shared)."""


class Audit:
    """A run's audit trail as it grows: its turns, its passes, their usage.

    The loop asks it for the entries a model reply or a compaction pass
    makes; it keeps what the run has spent and the provider's count of the
    last call, and tells the hooks of each pass (its one record) and of the
    circuit breaker's opening, once the log keeps them (`tell`).
    """

    def __init__(
        self,
        run_id: str,
        session: Session,
        hooks: HookDispatcher,
        manager: ContextManager | None,
        clock: Callable[[], float],
        prices: ModelPrices | None = None,
    ) -> None:
        self.run_id = run_id
        self.session = session
        self.hooks = hooks
        self.manager = manager
        self.clock = clock
        self.usage = UNUSED  # the agent's own model calls
        self.reported_calls = 0  # those of them the provider reported usage for
        self.prices = prices
        self.cost: float | None = None if prices is None else 0.0
        """What the agent's own model calls cost, in US dollars (None: no
        prices, or a reply whose usage the provider did not report)."""
        self.compaction_usage = UNUSED  # the passes' summary calls
        self.reported: Reported | None = None  # the provider's count of the last call
        self._context: tuple[MessageLog, MessageLog] | None = None
        # The context settings the run's ratio is looked up by, made once.
        self._ratio_key: tuple[ContextSettings | None] | None = None

    def opened(self, history: MessageLog) -> None:
        """Start a new run's contexts from the history it opens with.

        Its first turn record then names only what was added to that
        history (a long session's history is not listed again each run).
        Not for a resumed run: its next turn lists its whole context.
        """
        self._context = (history, MessageLog())

    def carry_over(
        self, session: Session, counter: TokenCounter, *, window: int = 0
    ) -> None:
        """Start from the provider's count of the session's last model call.

        When the session's history still begins with what that call saw (no
        compaction since), the count, plus the estimate of what was added
        after it, stands for the history: the first measurement of a new run
        uses it, in a new process too (a restart does not forget it).
        """
        for run in reversed(session.runs):
            turns = [t for t in run.turns if t.usage and t.usage.input_tokens]
            if not turns:
                continue
            last = turns[-1]
            seen = run.context(run.turns.index(last))
            history = session.history
            if [m.id for m in history.items_from(0)][: len(seen)] != list(seen):
                return
            assert last.usage is not None
            if not _plausible(last.usage.input_tokens, window):
                return
            added = counter.count(list(history.items_from(len(seen))))
            self.reported = Reported(
                tokens=last.usage.input_tokens
                + _checks.token_count(added, counter, "count"),
                history=history,
                pending=MessageLog(),
                carried=True,
            )
            return

    def restore(self, record: RunRecord) -> None:
        """Pick up what a run logged so far (a resumed or abandoned run)."""
        spent = [usage for usage in record.call_usages if usage is not None]
        self.usage = sum(spent, Usage())
        self.reported_calls = len(spent)
        self.cost = logged_cost(self.prices, record)
        self.compaction_usage = sum(
            (c.usage for c in record.compactions if c.usage), Usage()
        )

    def resume_reported(
        self,
        record: RunRecord,
        now: Snapshot,
        counter: TokenCounter,
        *,
        window: int = 0,
    ) -> None:
        """Start a resumed run from the provider's count of its last call.

        When the brain's request (`now`'s history, then its pending
        messages) still begins with what that call saw, the count plus the
        estimate of what came after it stands for the request, in a new
        process too; else (a compaction since, or no report) the run keeps
        what `carry_over` found, if anything.
        """
        turns = [t for t in record.turns if t.usage and t.usage.input_tokens]
        if not turns:
            return
        last = turns[-1]
        seen = list(record.context(record.turns.index(last)))
        current = [*now.history, *now.pending]
        if [m.id for m in current[: len(seen)]] != seen:
            return
        assert last.usage is not None
        if not _plausible(last.usage.input_tokens, window):
            return
        added = counter.count(current[len(seen) :])
        self.reported = Reported(
            tokens=last.usage.input_tokens
            + _checks.token_count(added, counter, "count"),
            history=now.history,
            pending=now.pending,
        )

    @property
    def ratio(self) -> float | None:
        """The session's largest reported-to-estimated ratio so far, or None.

        Of the estimates of this run's counter only
        (`Session.reported_ratio_for`).
        """
        key = self._ratio_key
        if key is None:
            manager = self.manager
            settings = None if manager is None else context_settings(manager)
            key = self._ratio_key = (settings,)
        return self.session.reported_ratio_for(key[0])

    def turn(
        self,
        decision: CallLLM,
        event: ModelReplied | OutputRejected,
        *,
        estimate: int | None = None,
    ) -> Entry:
        """The turn a model reply makes; keeps its usage and the provider's count.

        `estimate` is turnfsm's uncalibrated estimate of the request's input
        tokens, recorded beside the provider's report.
        """
        usage = event.usage
        if usage is None:
            self.cost = None  # a reply the provider did not say the usage of
        else:
            self.spent(usage)
            if usage.input_tokens:
                self.reported = Reported(
                    tokens=usage.input_tokens,
                    history=decision.history,
                    pending=decision.pending,
                )
        return turn_record(
            self.run_id,
            decision,
            event,
            self._context_change(decision),
            estimate,
        )

    def spent(self, usage: Usage) -> None:
        """Count a model call's reported `usage` (and its cost) in the run's."""
        self.usage = self.usage + usage
        self.reported_calls += 1
        if self.prices is not None and self.cost is not None:
            self.cost += float(self.prices.usage_cost(usage))

    def _context_change(self, decision: CallLLM) -> tuple[int, list[str]]:
        """The context of this call as a change from the previous call's."""
        history, pending = decision.history, decision.pending
        last, self._context = self._context, (history, pending)
        if (
            last is not None
            and is_extension(history, last[0], same=True)
            and is_extension(pending, last[1], same=False)
        ):
            keep = len(history) + len(last[1])
            return keep, [m.id for m in pending.items_from(len(last[1]))]
        return 0, [m.id for m in history] + [m.id for m in pending]

    def compaction(
        self,
        decision: Compact,
        event: PassEvent,
        before: Snapshot,
        *,
        taken: bool | None,
        key: str,
    ) -> list[Entry]:
        """The pass's one record and the breaker's opening (told once kept: `tell`)."""
        manager = self.manager
        record = compaction_record(
            self.run_id,
            key,
            decision,
            event,
            before,
            taken=taken,
            strategy=type(manager.compactor).__name__ if manager else "",
        )
        if record.usage is not None:
            self.compaction_usage = self.compaction_usage + record.usage
        return [record, *self._breaker(record)]

    def tell(self, written: Sequence[Entry]) -> None:
        """Tell the hooks of the passes and the breaker's opening in `written`.

        Called once the log keeps `written`: a hook hears of a pass with the
        very record the log keeps, never of one an append failed to write
        (a resume would run that pass again, and the hooks hear it then).
        """
        for entry in written:
            if type(entry) is CompactionRecord:
                self.hooks.compaction_pass(entry, self.session.id)
            elif (
                type(entry) is BreakerChanged
                and entry.open
                and self.hooks.wants("on_circuit_opened")
            ):
                self.hooks.call(
                    "on_circuit_opened",
                    CircuitInfo(
                        session_id=self.session.id,
                        run_id=self.run_id,
                        failures=entry.failures,
                    ),
                )

    def _breaker(self, record: CompactionRecord) -> list[Entry]:
        """The breaker's opening, when this failed pass reaches `max_failures`.

        Written once, on the transition; the count itself is a projection
        of the session's log (`Session.compaction_failures`).
        """
        manager = self.manager
        if manager is None or record.verdict is not Verdict.FAILED:
            return []
        failures = self.session.compaction_failures + 1
        if failures != manager.max_failures:
            return []
        return [
            BreakerChanged(
                run_id=self.run_id, open=True, failures=failures, at=self.clock()
            )
        ]


def _plausible(tokens: int, window: int) -> bool:
    """Whether a logged report of `tokens` can stand for a request under `window`.

    A report past `report_limit` was logged by a run that did not read
    reports (or before they were checked): it is not carried, so the
    session stays usable.
    """
    limit = report_limit(window)
    return limit is None or tokens <= limit


def logged_cost(prices: ModelPrices | None, record: RunRecord) -> float | None:
    """What the model calls of the run `record` logs cost, at `prices`.

    None when there are no prices, or when a reply (a turn) came without
    the usage that prices it: a figure that leaves out a call is no cost.
    """
    if prices is None or any(turn.usage is None for turn in record.turns):
        return None
    return sum(
        float(prices.usage_cost(usage))
        for usage in record.call_usages
        if usage is not None
    )
