"""REDUCERS and FAILURES: the named, pure state updates a machine file may use.

A reducer maps (snapshot, event) to the next snapshot; a failure builder
maps (snapshot, event) to the `Failure` a transition into a fail phase records.
Each reducer is written as the fields it changes (`CHANGES`): the brain
applies a transition's base fields and all its reducers' changes to one
copy of the snapshot, and `REDUCERS` holds each as the function of the
snapshot that returns the updated copy.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, Final, TypeAlias

from turnfsm.core._events import (
    CompactionCircuitOpened,
    CompactionNoop,
    CompactionOverflowed,
    CompactionResult,
    CompactorFailed,
    ContextOverflowed,
    Event,
    MessageInjected,
    ModelFailed,
    ModelReplied,
    OutputRejected,
    RunCancelled,
    RunStarted,
    Signal,
    ToolCallsReviewed,
    ToolsFinished,
    trigger_of,
)
from turnfsm.core._lines import CompactReason
from turnfsm.core._snapshot import Failure, Snapshot
from turnfsm.errors import IllegalEvent, InvalidMessage
from turnfsm.messages import MessageLog, Role

__all__ = [
    "ACCEPTS",
    "CHANGES",
    "FAILURES",
    "REDUCERS",
    "Changes",
    "FailureBuilder",
    "Reducer",
    "record_signal_message",
]

Reducer: TypeAlias = Callable[[Snapshot, Event], Snapshot]
"""A pure update of the snapshot."""

Changes: TypeAlias = dict[str, Any]
"""The fields a reducer changes, by name, with their new values (internal)."""

FailureBuilder: TypeAlias = Callable[[Snapshot, Event], Failure]
"""A pure description of why a run fails."""


def record_start(s: Snapshot, e: Event) -> Changes:
    """Take the run's input as pending.

    A second start is a driver bug: `IllegalEvent`.
    """
    if s.is_started or not isinstance(e, RunStarted):
        raise IllegalEvent(phase=s.phase, event=trigger_of(e))
    return {"pending": s.pending.extend(e.input), "is_started": True}


def record_estimate(s: Snapshot, e: Event) -> Changes:
    """Keep the measured size of the next request."""
    assert hasattr(e, "estimate")
    return {"estimate": e.estimate}


def record_reply(s: Snapshot, e: Event) -> Changes:
    """Append the reply to pending and count the turn.

    A model call came: the counts of compaction passes and of overflow
    retries in a row start again.
    """
    assert isinstance(e, ModelReplied)
    return {
        "pending": s.pending.append(e.message),
        "last_reply": e.message,
        "turns": s.turns + 1,
        "compactions": 0,
        "overflow_retries": _overflows_after_a_reply(s),
    }


def record_rejection(s: Snapshot, e: Event) -> Changes:
    """Append the rejected answer and the re-ask to pending; count turn and retry.

    Both are ordinary messages: the model sees what it said and why it was
    refused. A model call came: the counts of compaction passes and of
    overflow retries in a row start again.
    """
    assert isinstance(e, OutputRejected)
    return {
        "pending": s.pending.extend((e.message, e.feedback)),
        "last_reply": e.message,
        "turns": s.turns + 1,
        "compactions": 0,
        "overflow_retries": _overflows_after_a_reply(s),
        "output_retries": s.output_retries + 1,
    }


def _overflows_after_a_reply(s: Snapshot) -> int:
    """0: a reply starts the count again (a run logged before kept counting)."""
    return 0 if s.overflow_retries_in_a_row else s.overflow_retries


def record_results(s: Snapshot, e: Event) -> Changes:
    """Append the tool results to pending."""
    assert isinstance(e, ToolsFinished)
    return {"pending": s.pending.extend(e.results)}


def record_review(s: Snapshot, e: Event) -> Changes:
    """Append the reviewer's results (the rejected calls' answers) to pending."""
    assert isinstance(e, ToolCallsReviewed)
    return {"pending": s.pending.extend(e.results)}


def record_signal_message(key: str, s: Snapshot, e: Event) -> Changes:
    """Append the signal's message, its data at `key`, to pending.

    A transition's ``message = KEY`` runs this before its actions. The
    message travels on the event (`Signal.message`, which the driver builds
    from the data as it feeds the signal), so a replayed log gives the same
    history; a signal without one, or with one that is no plain user
    message, is refused.
    """
    assert isinstance(e, Signal)  # the loader allows `message` on signals only
    message = e.message
    if message is None:
        raise InvalidMessage(f"signal {e.name!r}.data", dict(e.data), _unsaid(key, e))
    if message.role is not Role.USER or message.tool_calls or message.tool_results:
        raise InvalidMessage(
            f"signal {e.name!r}.message",
            message.id,
            "a signal's message must be a user message without tool calls or "
            "tool results",
        )
    return {"pending": s.pending.append(message)}


def _unsaid(key: str, e: Signal) -> str:
    """Why a signal's data did not become the message a transition adds."""
    said = f"the machine file adds the signal's data {key!r} to the conversation"
    text = e.data.get(key)
    if text is None:
        return f"{said}; give the signal data {{{key!r}: TEXT}}"
    if not text.strip():
        return f"{said}, and it is blank; give it the text to add"
    return (
        f"{said}, but the signal carries no message: feed it through the "
        f"driver, or build it with message=Message.user(data[{key!r}])"
    )


def record_compaction(s: Snapshot, e: Event) -> Changes:
    """Replace history with the compacted messages and clear pending: a commit.

    The message-count and threshold lines count again on the new conversation.
    """
    assert isinstance(e, CompactionResult)
    return {
        "history": MessageLog(e.messages),
        "pending": MessageLog(),
        "estimate": e.after,
        "message_line_spent": False,
        "threshold_line_spent": False,
    }


def spend_message_line(s: Snapshot, e: Event) -> Changes:
    """Turn the message-count line off until the next commit (its pass did nothing)."""
    return {"message_line_spent": True}


def spend_threshold_line(s: Snapshot, e: Event) -> Changes:
    """Turn the threshold line off until the next commit (its pass saved nothing).

    A threshold pass could not shrink a request that fits: until the next
    commit the threshold line starts no pass; the emergency line still does.
    """
    return {"threshold_line_spent": True}


def record_noop(s: Snapshot, e: Event) -> Changes:
    """Refresh the estimate only; the messages stay as they are."""
    assert isinstance(e, CompactionNoop)
    return {"estimate": e.after}


def count_overflow(s: Snapshot, e: Event) -> Changes:
    """Spend one overflow retry (a reply starts the count again); keep the refusal.

    The refusal is kept for a pass that stalls, to quote.
    """
    overflow = e.error if isinstance(e, ContextOverflowed) else None
    return {"overflow_retries": s.overflow_retries + 1, "overflow": overflow}


def count_compaction(s: Snapshot, e: Event) -> Changes:
    """Count one compaction pass (since the last model call)."""
    return {"compactions": s.compactions + 1}


def record_injection(s: Snapshot, e: Event) -> Changes:
    """Queue an injected message in the inbox (`flush_inbox` moves it on)."""
    assert isinstance(e, MessageInjected)
    return {"inbox": (*s.inbox, e.message)}


def flush_inbox(s: Snapshot, e: Event) -> Changes:
    """Move the queued messages into pending; the machine file says where."""
    if not s.inbox:
        return {}
    return {"pending": s.pending.extend(s.inbox), "inbox": ()}


def commit_pending(s: Snapshot, e: Event) -> Changes:
    """Append pending to history (a run that succeeds)."""
    return {"history": s.history.extend(s.pending), "pending": MessageLog()}


def discard_pending(s: Snapshot, e: Event) -> Changes:
    """Drop pending and the inbox (a run that fails leaves no trace in history)."""
    return {"pending": MessageLog(), "inbox": ()}


CHANGES: Final[Mapping[str, Callable[[Snapshot, Event], Changes]]] = MappingProxyType(
    {
        "commit_pending": commit_pending,
        "count_compaction": count_compaction,
        "count_overflow": count_overflow,
        "discard_pending": discard_pending,
        "flush_inbox": flush_inbox,
        "record_compaction": record_compaction,
        "spend_message_line": spend_message_line,
        "spend_threshold_line": spend_threshold_line,
        "record_estimate": record_estimate,
        "record_injection": record_injection,
        "record_noop": record_noop,
        "record_rejection": record_rejection,
        "record_reply": record_reply,
        "record_results": record_results,
        "record_review": record_review,
        "record_start": record_start,
    }
)
"""Reducer name -> the fields it changes, given the snapshot and the event."""


def _reducer(changes: Callable[[Snapshot, Event], Changes]) -> Reducer:
    """The reducer that applies `changes` to a copy of the snapshot.

    It bears the name, the docstring and the source of `changes`, and its
    own signature: a `Reducer`'s, ``(s, e) -> Snapshot``.
    """

    def reduce(s: Snapshot, e: Event) -> Snapshot:
        fields = changes(s, e)
        return s.replace(**fields) if fields else s

    signature = inspect.signature(reduce)
    functools.update_wrapper(reduce, changes, assigned=_NAMED)
    reduce.__signature__ = signature  # type: ignore[attr-defined]
    return reduce


_NAMED: Final = ("__module__", "__name__", "__qualname__", "__doc__")
"""What a reducer takes from its changes (`functools.WRAPPER_ASSIGNMENTS`
but its annotations)."""


REDUCERS: Final[Mapping[str, Reducer]] = MappingProxyType(
    {name: _reducer(changes) for name, changes in CHANGES.items()}
)
"""Reducer name -> pure update; the only names a machine file may use."""


def _max_turns(s: Snapshot, e: Event) -> Failure:
    return Failure(kind="max_turns_exceeded", used=s.turns, limit=s.budget.max_turns)


def _compaction_limit(s: Snapshot, e: Event) -> Failure:
    return Failure(
        kind="compaction_limit_exceeded",
        used=s.compactions,
        limit=s.budget.max_compactions,
    )


def _context_exceeded(s: Snapshot, e: Event) -> Failure:
    if isinstance(e, CompactionOverflowed):
        return Failure(kind="context_exceeded", used=e.used, limit=e.limit)
    error = e.error if isinstance(e, ContextOverflowed) else None
    return Failure(
        kind="context_exceeded",
        used=s.estimate or 0,
        limit=s.budget.context_window,
        detail="" if error is None else error.message,
        error_type="" if error is None else error.type,
    )


def _stalled(s: Snapshot, e: Event) -> Failure:
    """The pass saved nothing; a pass run on an overflow quotes the refusal."""
    assert isinstance(e, CompactionResult | CompactionNoop)
    error = s.overflow if s.compact_reason is CompactReason.OVERFLOW else None
    return Failure(
        kind="compaction_stalled",
        used=e.after,
        limit=e.before,
        detail="" if error is None else error.message,
        error_type="" if error is None else error.type,
    )


def _compaction_failed(s: Snapshot, e: Event) -> Failure:
    assert isinstance(e, CompactorFailed)
    return Failure(
        kind="compaction_failed",
        used=e.used,
        limit=e.limit,
        detail=e.error.message,
        error_type=e.error.type,
    )


def _circuit_open(s: Snapshot, e: Event) -> Failure:
    assert isinstance(e, CompactionCircuitOpened)
    return Failure(kind="compaction_circuit_open", used=e.failures)


def _cancelled(s: Snapshot, e: Event) -> Failure:
    reason = e.reason if isinstance(e, RunCancelled) else "cancelled"
    return Failure(kind="cancelled", detail=reason)


def _output_invalid(s: Snapshot, e: Event) -> Failure:
    assert isinstance(e, OutputRejected)
    return Failure(
        kind="output_invalid", used=s.output_retries, detail="\n".join(e.errors)
    )


def _provider_error(s: Snapshot, e: Event) -> Failure:
    assert isinstance(e, ModelFailed)
    return Failure(
        kind="provider_error",
        detail=e.error.message,
        error_type=e.error.type,
        retryable=e.error.retryable,
        status=e.error.status,
        retry_after=e.error.retry_after,
        attempts=e.error.attempts,
        elapsed=e.error.elapsed,
    )


FAILURES: Final[Mapping[str, FailureBuilder]] = MappingProxyType(
    {
        "cancelled": _cancelled,
        "compaction_circuit_open": _circuit_open,
        "compaction_failed": _compaction_failed,
        "compaction_limit_exceeded": _compaction_limit,
        "compaction_stalled": _stalled,
        "context_exceeded": _context_exceeded,
        "max_turns_exceeded": _max_turns,
        "output_invalid": _output_invalid,
        "provider_error": _provider_error,
    }
)
"""Failure name -> builder; the `error` a transition into a fail phase names."""


ACCEPTS: Final[Mapping[str, frozenset[str]]] = MappingProxyType(
    {
        "record_start": frozenset({"run_started"}),
        "record_estimate": frozenset({"measured"}),
        "record_reply": frozenset({"model_replied"}),
        "record_rejection": frozenset({"output_rejected"}),
        "record_results": frozenset({"tools_finished"}),
        "record_review": frozenset({"tool_calls_reviewed"}),
        "record_compaction": frozenset({"compaction_result"}),
        "record_noop": frozenset({"compaction_noop"}),
        "record_injection": frozenset({"message_injected"}),
        "compaction_stalled": frozenset({"compaction_result", "compaction_noop"}),
        "compaction_failed": frozenset({"compactor_failed"}),
        "compaction_circuit_open": frozenset({"compaction_circuit_opened"}),
        "provider_error": frozenset({"model_failed"}),
        "output_invalid": frozenset({"output_rejected"}),
    }
)
"""Reducers and failure builders that read one kind of event, by the triggers
they accept; the loader rejects them anywhere else. Unlisted names accept any."""
