"""`ContextManager`: the sizing policy around a compactor.

The manager owns the window, the threshold, the compaction target and the one
counter every decision is measured with. It runs a compactor and classifies
the pass by re-counting the result itself; a compactor's own numbers are
hints. Classification, in order:

1. the compactor raised or reported a failure (or returned nothing)
   → `ContextOverflow` with `compactor_error`;
2. the result plus the reserved budget is still over the window
   → `ContextOverflow`;
3. same message count and no size reduction → `NoAction`;
4. anything else → `Compacted`, with the manager's numbers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import final

import attrs

from turnfsm.context._pairs import pair_tool_traffic
from turnfsm.context._protocol import ContextCompactor
from turnfsm.context._truncating import TruncatingCompactor
from turnfsm.context._values import (
    CompactBase,
    Compacted,
    CompactionContext,
    CompactionDecision,
    CompactionOutcome,
    ContextOverflow,
    NoAction,
)
from turnfsm.core._lines import (
    CompactReason,
    emergency_line,
    line_reason,
    threshold_line,
)
from turnfsm.errors import ConfigError
from turnfsm.messages import Message
from turnfsm.tokens import default_counter
from turnfsm.tokens._protocol import TokenCounter

__all__ = ["ContextManager"]


def _int_in(
    field: str, low: int, high: int | None, expected: str
) -> Callable[[object, object, object], None]:
    """Return an attrs validator: an int (not a bool) in ``low..high``."""

    def check(_inst: object, _attr: object, value: object) -> None:
        if type(value) is not int or value < low or (high is not None and value > high):
            raise ConfigError(field, value, expected)

    return check


def _check_bool(_inst: object, attr: attrs.Attribute[bool], value: object) -> None:
    if not isinstance(value, bool):
        raise ConfigError(attr.name, value, "a bool")


def _check_compactor(_inst: object, _attr: object, value: object) -> None:
    if not isinstance(value, ContextCompactor):
        raise ConfigError(
            "compactor", value, "a ContextCompactor (an async compact() method)"
        )


def _check_counter(_inst: object, _attr: object, value: object) -> None:
    if not isinstance(value, TokenCounter):
        raise ConfigError(
            "counter", value, "a TokenCounter (count() and count_text() methods)"
        )


def _to_base(value: object) -> CompactBase:
    if isinstance(value, CompactBase):
        return value
    if isinstance(value, str) and value in CompactBase.__members__.values():
        return CompactBase(value)
    raise ConfigError(
        "compact_target", value, "CompactBase.THRESHOLD or CompactBase.CONTEXT"
    )


def _check_reserved(reserved: object) -> None:
    if type(reserved) is not int or reserved < 0:
        raise ConfigError("reserved", reserved, "an int >= 0 (tokens)")


def _describe(exc: Exception) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _orphan_problem(
    messages: Sequence[Message], outcome: CompactionOutcome
) -> str | None:
    """Reject a result that split a tool call from its result (any compactor)."""
    before = pair_tool_traffic(messages)
    after = pair_tool_traffic(outcome.messages)
    if len(after.lone_results) > len(before.lone_results) or len(
        after.lone_calls
    ) > len(before.lone_calls):
        return "the compactor orphaned a tool call or a tool result"
    return None


def _outcome_problem(outcome: object) -> str | None:
    """Return why `outcome` counts as a compactor failure, or None."""
    if not isinstance(outcome, CompactionOutcome):
        return f"compactor returned {type(outcome).__name__}, not a CompactionOutcome"
    if outcome.error is not None:
        return outcome.error or "compactor reported a failure"
    if not outcome.messages:
        return "compactor returned an empty message list"
    if not all(isinstance(m, Message) for m in outcome.messages):
        return "compactor returned something that is not a Message"
    return None


@final
@attrs.frozen(kw_only=True)
class ContextManager:
    """Decide whether a conversation must shrink, shrink it, and judge the result.

    With the defaults (window 200,000, threshold 80, target 70% of the
    threshold line) the threshold line is 160,000 tokens, the emergency line
    190,000 and the compaction target 112,000.

    Attributes:
        compactor: The strategy that shrinks (default `TruncatingCompactor`);
            the only setting that may be passed positionally.
        context_window: The model's window in tokens; 0 disables both lines.
        threshold: The soft line, in percent of the window (0..100; 0 turns
            the threshold line off). A whole percentage: 80, not 0.8.
        auto_compact: Whether the threshold line triggers compaction (the
            emergency line always does).
        compact_target: What `compact_target_pct` is a percentage of.
        compact_target_pct: The target size, in percent (1..100).
        counter: The one counter every measurement uses (default: the
            conservative counter, which errs high).

    Raises:
        ConfigError: On construction, naming the field and the value, when a
            setting is out of range or of the wrong type.
    """

    # The one positional setting: ``ContextManager(MyCompactor(), ...)``.
    compactor: ContextCompactor = attrs.field(
        factory=TruncatingCompactor, validator=_check_compactor, kw_only=False
    )
    context_window: int = attrs.field(
        default=200_000,
        validator=_int_in("context_window", 0, None, "an int >= 0 (tokens)"),
    )
    threshold: int = attrs.field(
        default=80,
        validator=_int_in(
            "threshold", 0, 100, "an int percentage in 0..100 (80, not 0.8)"
        ),
    )
    auto_compact: bool = attrs.field(default=True, validator=_check_bool)
    compact_target: CompactBase = attrs.field(
        default=CompactBase.THRESHOLD, converter=_to_base
    )
    compact_target_pct: int = attrs.field(
        default=70,
        validator=_int_in(
            "compact_target_pct", 1, 100, "an int percentage in 1..100 (70, not 0.7)"
        ),
    )
    counter: TokenCounter = attrs.field(
        factory=default_counter, validator=_check_counter
    )

    # -- the lines -------------------------------------------------------
    @property
    def threshold_line(self) -> int:
        """``context_window * threshold // 100``; strictly over it compacts."""
        return threshold_line(self.context_window, self.threshold)

    @property
    def emergency_line(self) -> int:
        """``context_window * 95 // 100``; on or over it always compacts."""
        return emergency_line(self.context_window)

    @property
    def target_tokens(self) -> int:
        """The size a pass aims for, before any reserved budget."""
        base = (
            self.threshold_line
            if self.compact_target is CompactBase.THRESHOLD
            else self.context_window
        )
        return base * self.compact_target_pct // 100

    def count(self, messages: Sequence[Message]) -> int:
        """Return the manager's token count of `messages`."""
        return self.counter.count(messages)

    def reason_for(self, estimate: int) -> CompactReason | None:
        """Return why a payload of `estimate` tokens must compact, or None.

        The same predicate the turn machine uses before every model call: the
        emergency line first (inclusive, always on), then the threshold line
        (strict, only with `auto_compact`).
        """
        return line_reason(
            estimate,
            self.context_window,
            self.threshold,
            auto_compact=self.auto_compact,
        )

    # -- passes ------------------------------------------------------------
    async def compact_with_reason(
        self,
        messages: Sequence[Message],
        *,
        turn: int,
        reason: CompactReason,
        instructions: Iterable[str] = (),
        additional_context: Iterable[str] = (),
        reserved: int = 0,
    ) -> CompactionDecision:
        """Run the compactor on `messages` and classify the pass.

        Args:
            messages: The conversation (history and pending, as one list).
            turn: The turn the pass runs in.
            reason: Why the pass runs; passed to the compactor and echoed.
            instructions: Guidance from pre-compact hooks.
            additional_context: Extra text from pre-compact hooks.
            reserved: Tokens that ride the request besides `messages` (system
                prompt, tool schemas, memory); they must still fit afterwards.

        Returns:
            `Compacted`, `NoAction`, or `ContextOverflow` when the compactor
            failed or its result plus `reserved` is over the window.

        Raises:
            ConfigError: `reserved` is not an int >= 0.
        """
        _check_reserved(reserved)
        return await self._pass(
            messages,
            self.count(messages),
            turn=turn,
            reason=reason,
            instructions=instructions,
            additional_context=additional_context,
            reserved=reserved,
        )

    async def ensure_context_fits(
        self, messages: Sequence[Message], *, turn: int, reserved: int = 0
    ) -> CompactionDecision:
        """Compact `messages` only if they plus `reserved` cross a line.

        Args:
            messages: The conversation.
            turn: The current turn.
            reserved: Tokens that ride the request besides `messages`.

        Returns:
            `NoAction` (reason None) under the lines; otherwise the
            classification of a pass run with the line's reason.

        Raises:
            ConfigError: `reserved` is not an int >= 0.
        """
        _check_reserved(reserved)
        before = self.count(messages)
        reason = self.reason_for(before + reserved)
        if reason is None:
            return NoAction(tokens_before=before, tokens_after=before, reason=None)
        return await self._pass(
            messages, before, turn=turn, reason=reason, reserved=reserved
        )

    async def compact_manual(
        self, messages: Sequence[Message], *, turn: int, reserved: int = 0
    ) -> CompactionDecision:
        """Compact `messages` now, whatever the lines say (reason MANUAL).

        Args:
            messages: The conversation.
            turn: The current turn.
            reserved: Tokens that ride the request besides `messages`.

        Returns:
            The classification of the pass.

        Raises:
            ConfigError: `reserved` is not an int >= 0.
        """
        return await self.compact_with_reason(
            messages, turn=turn, reason=CompactReason.MANUAL, reserved=reserved
        )

    async def _pass(
        self,
        messages: Sequence[Message],
        before: int,
        *,
        turn: int,
        reason: CompactReason,
        reserved: int,
        instructions: Iterable[str] = (),
        additional_context: Iterable[str] = (),
    ) -> CompactionDecision:
        if not messages:
            return NoAction(tokens_before=before, tokens_after=before, reason=reason)
        ctx = CompactionContext(
            tokens_before=before,
            reason=reason,
            context_window=self.context_window,
            turn=turn,
            counter=self.counter,
            instructions=instructions,
            additional_context=additional_context,
        )
        target = max(0, self.target_tokens - reserved)
        try:
            outcome = await self.compactor.compact(messages, target, ctx)
        # An outside failure becomes a value; cancellation (a BaseException)
        # is never caught here.
        except Exception as exc:
            problem: str | None = _describe(exc)
        else:
            problem = _outcome_problem(outcome) or _orphan_problem(messages, outcome)
        if problem is not None:
            return self._overflow(before + reserved, len(messages), reason, problem)
        return self._classify(len(messages), before, outcome, reason, reserved)

    def _classify(
        self,
        count_before: int,
        before: int,
        outcome: CompactionOutcome,
        reason: CompactReason,
        reserved: int,
    ) -> CompactionDecision:
        new = outcome.messages
        after = self.count(new)  # the compactor's numbers are only hints
        if self.context_window > 0 and after > self.context_window - reserved:
            return self._overflow(after + reserved, len(new), reason, None)
        if len(new) == count_before and after >= before:
            return NoAction(tokens_before=before, tokens_after=after, reason=reason)
        return Compacted(
            messages=new,
            tokens_before=before,
            tokens_after=after,
            tokens_saved=max(0, before - after),
            reason=reason,
        )

    def _overflow(
        self, used: int, message_count: int, reason: CompactReason, error: str | None
    ) -> ContextOverflow:
        return ContextOverflow(
            used=used,
            window=self.context_window,
            message_count=message_count,
            compactor_error=error,
            reason=reason,
        )
