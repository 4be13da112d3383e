"""The manager's old verdicts, kept one release for callers that read them.

`ContextManager.compact` answers with the brain's own event
(`turnfsm.core.PassEvent`); the old entry points (`compact_with_reason`,
`ensure_context_fits`, `compact_manual`, `force_compact`) still answer with
these classes, made from that event by `verdict_of`, and warn.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeAlias, final

import attrs

from turnfsm.core import (
    CompactionCircuitOpened,
    CompactionNoop,
    CompactionOverflowed,
    CompactionResult,
    CompactorFailed,
    CompactReason,
    PassEvent,
)
from turnfsm.messages import Message

__all__ = [
    "CircuitOpen",
    "Compacted",
    "CompactionDecision",
    "CompactorError",
    "ContextOverflow",
    "NoAction",
    "verdict_of",
]


def _to_messages(value: Iterable[Message]) -> tuple[Message, ...]:
    return tuple(value)


@final
@attrs.frozen(kw_only=True)
class Compacted:
    """The pass shrank the conversation; `messages` replaces it wholesale.

    Every size is the whole request's: the messages plus the reserved budget
    (system prompt, tool schemas, reply budget), so the manager, the driver,
    the audit record and the hooks all report one count.

    Attributes:
        messages: The compacted conversation.
        tokens_before: The manager's count before the pass, reserved included.
        tokens_after: The manager's count of `messages`, reserved included.
        tokens_saved: `tokens_before - tokens_after`, never below 0.
        reason: Why the pass ran.
        strategy: The compactor's class name (``"TruncatingCompactor"``).
    """

    messages: tuple[Message, ...] = attrs.field(converter=_to_messages)
    tokens_before: int
    tokens_after: int
    tokens_saved: int
    reason: CompactReason
    strategy: str


@final
@attrs.frozen(kw_only=True)
class NoAction:
    """Nothing changed: the caller keeps its messages as they are.

    Attributes:
        tokens_before: The manager's count before the pass, reserved included.
        tokens_after: The manager's count after it, reserved included (never
            below `tokens_before` when a compactor ran, equal when none did).
        reason: Why the pass ran, or was considered.
        strategy: The compactor's class name.
    """

    tokens_before: int
    tokens_after: int
    reason: CompactReason | None
    strategy: str


@final
@attrs.frozen(kw_only=True)
class ContextOverflow:
    """The compactor's result, plus the reserved budget, is over the window.

    Attributes:
        used: Tokens the request would use, reserved budget included.
        window: The context window.
        message_count: How many messages the pass was handed.
        reason: Why the pass ran.
        strategy: The compactor's class name.
    """

    used: int
    window: int
    message_count: int
    reason: CompactReason
    strategy: str

    @property
    def utilization(self) -> float:
        """`used / window`, or 0.0 for an unlimited window (0)."""
        return self.used / self.window if self.window else 0.0

    def __str__(self) -> str:
        return (
            f"context overflow: {self.used} tokens used of {self.window} window "
            f"({self.message_count} messages, {self.used - self.window} overflow)"
        )


@final
@attrs.frozen(kw_only=True)
class CompactorError:
    """The compactor failed; the caller keeps its messages as they are.

    It raised, reported a failure, returned something that is not a usable
    outcome, or returned messages that break the conversation (a tool call
    split from its result or a result out of place, a repeated message id).

    Attributes:
        used: The size of the input, reserved budget included (nothing was
            saved).
        window: The context window.
        message_count: How many messages the input has.
        error: What went wrong, for the run's failure report.
        reason: Why the pass ran.
        strategy: The compactor's class name.
    """

    used: int
    window: int
    message_count: int
    error: str
    reason: CompactReason
    strategy: str

    def __str__(self) -> str:
        return f"compactor {self.strategy} failed: {self.error}"


@final
@attrs.frozen(kw_only=True)
class CircuitOpen:
    """The compactor refused to run: its circuit breaker is open.

    Produced when the compactor raises `turnfsm.errors.CompactionCircuitOpen`.

    Attributes:
        failures: The consecutive failures that opened the breaker.
        reason: Why the pass ran.
        strategy: The compactor's class name.
    """

    failures: int
    reason: CompactReason
    strategy: str

    def __str__(self) -> str:
        return f"compaction circuit open after {self.failures} consecutive failures"


CompactionDecision: TypeAlias = (
    Compacted | NoAction | ContextOverflow | CompactorError | CircuitOpen
)
"""How the manager classified one compaction pass (deprecated)."""


def verdict_of(
    event: PassEvent,
    *,
    reason: CompactReason | None,
    strategy: str,
    message_count: int,
) -> CompactionDecision:
    """Return the old verdict for `event` (`message_count`: messages handed in)."""
    match event:
        case CompactionResult(messages=new, before=before, after=after):
            return Compacted(
                messages=new,
                tokens_before=before,
                tokens_after=after,
                tokens_saved=max(0, before - after),
                reason=reason or CompactReason.MANUAL,
                strategy=strategy,
            )
        case CompactionNoop(before=before, after=after):
            return NoAction(
                tokens_before=before,
                tokens_after=after,
                reason=reason,
                strategy=strategy,
            )
        case CompactionOverflowed(used=used, limit=window):
            return ContextOverflow(
                used=used,
                window=window,
                message_count=message_count,
                reason=reason or CompactReason.MANUAL,
                strategy=strategy,
            )
        case CompactorFailed(used=used, limit=window, error=error):
            return CompactorError(
                used=used,
                window=window,
                message_count=message_count,
                error=error.message,
                reason=reason or CompactReason.MANUAL,
                strategy=strategy,
            )
        case CompactionCircuitOpened(failures=failures):
            return CircuitOpen(
                failures=failures,
                reason=reason or CompactReason.MANUAL,
                strategy=strategy,
            )
