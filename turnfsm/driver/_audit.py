"""The audit trail: the log entries one step of a run makes, from its facts.

The loop hands each function the decision carried out, the event it came
to, and the brain's state before and after taking it; the functions return
the entries to append. A compaction pass's record is made here once, after
the brain took its event, so its verdict is decided once: a result the brain
refused is `stalled` from the start, never rewritten afterwards.
"""

from __future__ import annotations

from collections.abc import Sequence

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
from turnfsm.messages import SUMMARY_COVERS, Message, MessageLog
from turnfsm.persistence import (
    Committed,
    CompactionRecord,
    SummaryRecorded,
    TurnRecord,
    Verdict,
)

__all__ = [
    "committed",
    "compaction_record",
    "summaries",
    "turn_record",
    "verdict_of",
]


def turn_record(
    run_id: str,
    decision: CallLLM,
    event: ModelReplied | OutputRejected,
    context: tuple[int, list[str]],
) -> TurnRecord:
    """The record of one model call: the context it saw, its reply and usage.

    `context` is the call's context as a change from the run's previous
    call: (ids kept, ids added).
    """
    keep, added = context
    return TurnRecord(
        run_id=run_id,
        turn=decision.turn,
        keep=keep,
        added=added,
        output=event.message.id,
        usage=event.usage,
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
        case CompactionOverflowed(used=after) | CompactorFailed(used=after):
            size = before.estimate or after
        case CompactionCircuitOpened():
            size = after = before.estimate or 0
    return CompactionRecord(
        run_id=run_id,
        turn=before.turns,
        reason=decision.reason,
        strategy=strategy,
        outcome=verdict_of(event, taken=taken),
        covers=covers,
        replacement=replacement,
        tokens_before=size,
        tokens_after=after,
        key=key,
        usage=None if isinstance(event, CompactionCircuitOpened) else event.usage,
    )


def committed(run_id: str, old: MessageLog, new: MessageLog) -> Committed:
    """Describe how the committed history changed from `old` to `new`."""
    keep = len(old)
    if len(new) >= keep and new.store_key[0] is old.store_key[0]:
        return Committed(run_id=run_id, keep=keep, messages=[m.id for m in new[keep:]])
    return Committed(run_id=run_id, keep=0, messages=[m.id for m in new])


def summaries(run_id: str, messages: Sequence[Message]) -> list[SummaryRecorded]:
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
