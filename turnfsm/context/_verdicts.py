"""The manager's old verdicts, kept one release for callers that read them.

`ContextManager.compact` answers with the brain's own event
(`turnfsm.core.PassEvent`); the old entry points (`compact_with_reason`,
`ensure_context_fits`, `compact_manual`, `force_compact`) still answer with
these classes, made from that event by `verdict_of`, and warn.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, TypeAlias, final

import attrs

from turnfsm import _deprecated
from turnfsm.context._values import CompactionRequest, ModelCall
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
    "OldEntryPoints",
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


class OldEntryPoints:
    """`ContextManager`'s four old ways in, kept one release (each warns)."""

    if TYPE_CHECKING:  # what `ContextManager` provides

        @property
        def strategy(self) -> str: ...
        async def compact(self, request: CompactionRequest) -> PassEvent: ...
        def count(self, messages: Sequence[Message]) -> int: ...
        def reason_for(self, estimate: int) -> CompactReason | None: ...

    async def compact_with_reason(
        self,
        messages: Sequence[Message],
        *,
        turn: int,
        reason: CompactReason,
        instructions: Iterable[str] = (),
        additional_context: Iterable[str] = (),
        reserved: int = 0,
        tokens_before: int | None = None,
        failures: int = 0,
        session_id: str = "",
        summaries: Mapping[str, str] | None = None,
        model_call: ModelCall | None = None,
        target_tokens: int | None = None,
    ) -> CompactionDecision:
        """Run a pass for `reason` (deprecated: use `compact`)."""
        request = CompactionRequest(
            messages=messages,
            reason=reason,
            turn=turn,
            instructions=instructions,
            additional_context=additional_context,
            reserved=reserved,
            tokens_before=tokens_before,
            failures=failures,
            session_id=session_id,
            summaries=summaries or {},
            model_call=model_call,
            target_tokens=target_tokens,
        )
        return await self._old("compact_with_reason", request)

    async def ensure_context_fits(
        self, messages: Sequence[Message], *, turn: int, reserved: int = 0
    ) -> CompactionDecision:
        """Compact only over a line (deprecated: use `compact` with no reason)."""
        request = CompactionRequest(messages=messages, turn=turn, reserved=reserved)
        before = self.count(request.messages) + reserved
        reason = self.reason_for(before)
        if reason is None:
            _deprecated.warn(
                "ContextManager.ensure_context_fits",
                "ContextManager.compact(CompactionRequest(...))",
            )
            return NoAction(
                tokens_before=before,
                tokens_after=before,
                reason=None,
                strategy=self.strategy,
            )
        request = attrs.evolve(request, reason=reason, tokens_before=before)
        return await self._old("ensure_context_fits", request)

    async def compact_manual(
        self, messages: Sequence[Message], *, turn: int, reserved: int = 0
    ) -> CompactionDecision:
        """Compact now (deprecated: use `compact` with `CompactReason.MANUAL`)."""
        request = CompactionRequest(
            messages=messages, reason=CompactReason.MANUAL, turn=turn, reserved=reserved
        )
        return await self._old("compact_manual", request)

    async def force_compact(
        self,
        messages: Sequence[Message],
        *,
        turn: int,
        reserved: int = 0,
        ephemeral: bool = False,
        failures: int = 0,
        session_id: str = "",
        summaries: Mapping[str, str] | None = None,
        model_call: ModelCall | None = None,
    ) -> CompactionDecision:
        """Compact now unless ephemeral (deprecated: use `compact`, reason MANUAL)."""
        request = CompactionRequest(
            messages=messages,
            reason=CompactReason.MANUAL,
            turn=turn,
            reserved=reserved,
            failures=failures,
            session_id=session_id,
            summaries=summaries or {},
            model_call=model_call,
        )
        if ephemeral:
            _deprecated.warn(
                "ContextManager.force_compact",
                "ContextManager.compact(CompactionRequest(...))",
            )
            before = self.count(request.messages) + reserved
            return NoAction(
                tokens_before=before,
                tokens_after=before,
                reason=CompactReason.MANUAL,
                strategy=self.strategy,
            )
        return await self._old("force_compact", request)

    async def _old(self, name: str, request: CompactionRequest) -> CompactionDecision:
        _deprecated.warn(
            f"ContextManager.{name}",
            "ContextManager.compact(CompactionRequest(...))",
            stacklevel=4,
        )
        event = await self.compact(request)
        return verdict_of(
            event,
            reason=request.reason,
            strategy=self.strategy,
            message_count=len(request.messages),
        )
