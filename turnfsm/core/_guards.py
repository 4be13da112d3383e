"""GUARDS: the named, pure predicates a machine file may use as conditions.

Each takes the snapshot *before* the transition and the event being handled.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Final, TypeAlias

from turnfsm.core import _lines
from turnfsm.core._events import (
    CompactionNoop,
    CompactionResult,
    Event,
    Measured,
    ModelReplied,
)
from turnfsm.core._snapshot import Snapshot

__all__ = ["GUARDS", "Guard"]

Guard: TypeAlias = Callable[[Snapshot, Event], bool]
"""A pure predicate over (snapshot, event)."""


def _estimate(snapshot: Snapshot, event: Event) -> int:
    """The size the event reports (a measurement, or a pass's after), else the last."""
    if isinstance(event, Measured):
        return event.estimate
    if isinstance(event, CompactionResult | CompactionNoop):
        return event.after
    return snapshot.estimate or 0


def is_turn_limit_reached(snapshot: Snapshot, event: Event) -> bool:
    """The run already made `max_turns` model calls."""
    return snapshot.turns >= snapshot.budget.max_turns


def is_over_emergency_line(snapshot: Snapshot, event: Event) -> bool:
    """The estimate is on or over 95 % of a non-zero window (always active).

    It holds whatever `auto_compact` says.
    """
    estimate = _estimate(snapshot, event)
    return _lines.is_over_emergency_line(estimate, snapshot.budget.context_window)


def is_over_threshold_line(snapshot: Snapshot, event: Event) -> bool:
    """`auto_compact` is on and the estimate is strictly over the threshold line."""
    budget = snapshot.budget
    return _lines.is_over_threshold_line(
        _estimate(snapshot, event),
        budget.context_window,
        budget.threshold,
        auto_compact=budget.auto_compact,
        tokens=budget.threshold_tokens,
    )


def is_over_message_line(snapshot: Snapshot, event: Event) -> bool:
    """`auto_compact` is on and there are more than `max_messages` (not 0) messages."""
    budget = snapshot.budget
    limit = budget.max_messages
    return (
        bool(limit)
        and budget.auto_compact
        and len(snapshot.history) + len(snapshot.pending) > limit
    )


def is_message_line_spent(snapshot: Snapshot, event: Event) -> bool:
    """A pass for the message-count line changed nothing since the last commit."""
    return snapshot.message_line_spent


def is_threshold_line_spent(snapshot: Snapshot, event: Event) -> bool:
    """A threshold-line pass could not shrink the request since the last commit."""
    return snapshot.threshold_line_spent


def is_threshold_pass(snapshot: Snapshot, event: Event) -> bool:
    """The pass runs for the threshold line (under the emergency line)."""
    return snapshot.compact_reason is _lines.CompactReason.THRESHOLD_EXCEEDED


def is_message_count_pass(snapshot: Snapshot, event: Event) -> bool:
    """The pass runs for the message-count line alone (the token lines held)."""
    return snapshot.compact_reason is _lines.CompactReason.MESSAGE_COUNT


def has_tool_calls(snapshot: Snapshot, event: Event) -> bool:
    """The model's reply asks for at least one tool call."""
    return isinstance(event, ModelReplied) and bool(event.message.tool_calls)


def has_injected_messages(snapshot: Snapshot, event: Event) -> bool:
    """Messages were injected while the model was answering."""
    return bool(snapshot.inbox)


def has_overflow_retries_left(snapshot: Snapshot, event: Event) -> bool:
    """Fewer than `max_overflow_retries` passes in a row, without a reply in between.

    The compact-and-retry passes after a provider's overflow: each model
    reply starts their count again.
    """
    return snapshot.overflow_retries < snapshot.budget.max_overflow_retries


def has_output_retries_left(snapshot: Snapshot, event: Event) -> bool:
    """Fewer than `max_output_retries` re-asks for a valid final answer were spent."""
    return snapshot.output_retries < snapshot.budget.max_output_retries


def is_compaction_limit_reached(snapshot: Snapshot, event: Event) -> bool:
    """The run made `max_compactions` compaction passes in a row (no model call)."""
    return snapshot.compactions >= snapshot.budget.max_compactions


def is_no_progress(snapshot: Snapshot, event: Event) -> bool:
    """The compaction pass saved nothing: `after >= before` (the no-progress guard)."""
    if isinstance(event, CompactionResult | CompactionNoop):
        return event.after >= event.before
    return False


GUARDS: Final[Mapping[str, Guard]] = MappingProxyType(
    {
        "has_injected_messages": has_injected_messages,
        "has_output_retries_left": has_output_retries_left,
        "has_overflow_retries_left": has_overflow_retries_left,
        "has_tool_calls": has_tool_calls,
        "is_compaction_limit_reached": is_compaction_limit_reached,
        "is_no_progress": is_no_progress,
        "is_over_emergency_line": is_over_emergency_line,
        "is_message_count_pass": is_message_count_pass,
        "is_message_line_spent": is_message_line_spent,
        "is_over_message_line": is_over_message_line,
        "is_over_threshold_line": is_over_threshold_line,
        "is_threshold_line_spent": is_threshold_line_spent,
        "is_threshold_pass": is_threshold_pass,
        "is_turn_limit_reached": is_turn_limit_reached,
    }
)
"""Guard name -> predicate; the only names a machine file may use."""
