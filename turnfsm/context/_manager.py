"""`ContextManager`: the sizing policy around a compactor.

The manager owns the window, the threshold, the compaction target and the one
counter every decision is measured with. It runs a compactor and classifies
the pass by re-counting the result itself; a compactor's own numbers are
hints. Every size it reports is the whole request's: the messages plus the
reserved budget (system prompt, tool schemas, reply budget), so the manager,
the driver, the audit record and the hooks report one count. Classification,
in order:

0. no messages → `NoAction` (the compactor is not called);
1. the session's circuit breaker is open (`failures >= max_failures`): a
   proactive pass → `CircuitOpen` at once, no compactor call; a pass after a
   provider overflow runs with `allow_model` False (deterministic work
   only); a compactor that raises `CompactionCircuitOpen` → `CircuitOpen`;
2. it raised anything else, reported a failure, returned something that is
   not a usable outcome, or a result that is not a valid conversation (a
   tool pair split or out of place, a repeated message id) → `CompactorError`;
3. the result plus the reserved budget is still over the window
   → `ContextOverflow`;
4. same message count and no size reduction → `NoAction`;
5. anything else → `Compacted`, with the manager's numbers.

`budget()` turns the same sizing policy into the brain's `Budget`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import final

import attrs

from turnfsm import _checks
from turnfsm.context._pairs import result_problem
from turnfsm.context._protocol import ContextCompactor
from turnfsm.context._truncating import TruncatingCompactor
from turnfsm.context._values import (
    CircuitOpen,
    CompactBase,
    Compacted,
    CompactionContext,
    CompactionDecision,
    CompactionOutcome,
    CompactorError,
    ContextOverflow,
    ModelCall,
    NoAction,
    int_in,
)
from turnfsm.core import Budget
from turnfsm.core._lines import (
    CompactReason,
    emergency_line,
    line_reason,
    threshold_line,
)
from turnfsm.errors import CompactionCircuitOpen, ConfigError
from turnfsm.messages import Message
from turnfsm.tokens import default_counter
from turnfsm.tokens._protocol import TokenCounter

__all__ = ["ContextManager"]


_check_bool = _checks.boolean()


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


def _check_tokens_before(tokens_before: object, reserved: int) -> None:
    if type(tokens_before) is not int or tokens_before < reserved:
        raise ConfigError(
            "tokens_before",
            tokens_before,
            f"an int >= reserved ({reserved}): the count of the messages plus "
            "the reserved budget",
        )


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
        use_reported_usage: Seed 004's trigger: measure with the input tokens
            the provider reported for the run's last call, plus the messages
            added since, instead of the estimate (which is used when there is
            no report: a run's first measurement, after a compaction). The
            request is still checked against the window with the estimate
            before it is sent.
        max_failures: Consecutive failed passes of a session that open its
            circuit breaker (seed 000: 3). The count lives in the session's
            log, so it survives restarts and is per session.
        max_messages: The message-count line (seed 000: 50): a conversation
            with more messages compacts (reason MESSAGE_COUNT); 0 turns it off.

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
        validator=int_in("context_window", 0, None, "an int >= 0 (tokens)"),
    )
    threshold: int = attrs.field(
        default=80,
        validator=int_in(
            "threshold", 0, 100, "an int percentage in 0..100 (80, not 0.8)"
        ),
    )
    auto_compact: bool = attrs.field(default=True, validator=_check_bool)
    compact_target: CompactBase = attrs.field(
        default=CompactBase.THRESHOLD, converter=_to_base
    )
    compact_target_pct: int = attrs.field(
        default=70,
        validator=int_in(
            "compact_target_pct", 1, 100, "an int percentage in 1..100 (70, not 0.7)"
        ),
    )
    counter: TokenCounter = attrs.field(
        factory=default_counter, validator=_check_counter
    )
    use_reported_usage: bool = attrs.field(default=False, validator=_check_bool)
    max_failures: int = attrs.field(
        default=3, validator=int_in("max_failures", 1, None, "an int >= 1")
    )
    max_messages: int = attrs.field(
        default=50,
        validator=int_in("max_messages", 0, None, "an int >= 0 (0: no line)"),
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

    @property
    def strategy(self) -> str:
        """The compactor's class name, as every verdict reports it."""
        return type(self.compactor).__name__

    def budget(
        self, *, max_turns: int = 50, max_overflow_retries: int = 2, **limits: int
    ) -> Budget:
        """Return the brain's `Budget`: this manager's lines plus the run limits.

        The one place the sizing policy becomes a `Budget`: the window, the
        threshold and `auto_compact` come from the manager, so the brain and
        the manager draw the same lines.

        Args:
            max_turns: The most model calls one run may make.
            max_overflow_retries: Compact-and-retry passes after provider
                overflows.
            **limits: Any further `Budget` field (a run limit), passed through.

        Raises:
            ConfigError: A limit is out of range (raised by `Budget`).
            TypeError: `limits` names a field the manager owns or no field.
        """
        return Budget(
            context_window=self.context_window,
            threshold=self.threshold,
            auto_compact=self.auto_compact,
            max_messages=self.max_messages,
            max_turns=max_turns,
            max_overflow_retries=max_overflow_retries,
            **limits,
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
        tokens_before: int | None = None,
        failures: int = 0,
        session_id: str = "",
        summaries: Mapping[str, str] | None = None,
        model_call: ModelCall | None = None,
        target_tokens: int | None = None,
    ) -> CompactionDecision:
        """Run the compactor on `messages` and classify the pass.

        Args:
            messages: The conversation (history and pending, as one list).
            turn: The turn the pass runs in.
            reason: Why the pass runs; passed to the compactor and echoed.
            instructions: Guidance from pre-compact hooks.
            additional_context: Extra text from pre-compact hooks.
            reserved: Tokens that ride the request besides `messages` (system
                prompt, tool schemas, reply budget); they must still fit
                afterwards, and every reported size includes them.
            tokens_before: The caller's count of `messages` plus `reserved`,
                with this manager's counter, when it already has it (the
                manager then does not recount); None: the manager counts.
            failures: The session's consecutive failed passes so far (its
                circuit breaker: open at `max_failures`).
            session_id: The session, for the compactor's idempotency key.
            summaries: The session's recorded summaries, by message id.
            model_call: How the compactor calls a model (the driver's).
            target_tokens: The size to aim for instead of `target_tokens`
                (the reserved budget included), e.g. calibrated to what the
                provider reported; None: the manager's.

        Returns:
            `Compacted`, `NoAction`, `ContextOverflow` (the result plus
            `reserved` is over the window), `CompactorError` (the compactor
            failed or broke the conversation) or `CircuitOpen`.

        Raises:
            ConfigError: `reserved` is not an int >= 0, or `tokens_before`
                is not an int >= `reserved`.
        """
        _check_reserved(reserved)
        if tokens_before is None:
            tokens_before = self.count(messages) + reserved
        else:
            _check_tokens_before(tokens_before, reserved)
        if type(failures) is not int or failures < 0:
            raise ConfigError("failures", failures, "an int >= 0")
        if target_tokens is not None and (
            type(target_tokens) is not int or target_tokens < 0
        ):
            raise ConfigError("target_tokens", target_tokens, "an int >= 0 or None")
        allow_model = True
        if failures >= self.max_failures:
            if reason is not CompactReason.OVERFLOW:  # fail fast, no model call
                return CircuitOpen(
                    failures=failures, reason=reason, strategy=self.strategy
                )
            allow_model = False  # an overflow still gets the deterministic work
        return await self._pass(
            messages,
            tokens_before,
            turn=turn,
            reason=reason,
            instructions=instructions,
            additional_context=additional_context,
            reserved=reserved,
            session_id=session_id,
            summaries=summaries or {},
            model_call=model_call,
            allow_model=allow_model,
            target_tokens=target_tokens,
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
        before = self.count(messages) + reserved
        reason = self.reason_for(before)
        if reason is None:
            return NoAction(
                tokens_before=before,
                tokens_after=before,
                reason=None,
                strategy=self.strategy,
            )
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
        """Compact now, skipping the lines but keeping the ephemeral guard (seed 004).

        The operator's ``/compact``: like `compact_manual`, but an ephemeral
        session (a cron job, a one-off) never compacts, and the session's
        circuit breaker and summaries apply as in a run.

        Args:
            messages: The conversation.
            turn: The current turn.
            reserved: Tokens that ride the request besides `messages`.
            ephemeral: The session is ephemeral: `NoAction`, nothing runs.
            failures: The session's consecutive failed passes (its breaker).
            session_id: The session, for the compactor's idempotency key.
            summaries: The session's recorded summaries, by message id.
            model_call: How the compactor calls a model.

        Returns:
            `NoAction` (reason MANUAL) for an ephemeral session, else the
            classification of the pass.

        Raises:
            ConfigError: `reserved` or `failures` is out of range.
        """
        _check_reserved(reserved)
        if type(failures) is not int or failures < 0:
            raise ConfigError("failures", failures, "an int >= 0")
        if ephemeral:
            before = self.count(messages) + reserved
            return NoAction(
                tokens_before=before,
                tokens_after=before,
                reason=CompactReason.MANUAL,
                strategy=self.strategy,
            )
        return await self.compact_with_reason(
            messages,
            turn=turn,
            reason=CompactReason.MANUAL,
            reserved=reserved,
            failures=failures,
            session_id=session_id,
            summaries=summaries,
            model_call=model_call,
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
        session_id: str = "",
        summaries: Mapping[str, str] | None = None,
        model_call: ModelCall | None = None,
        allow_model: bool = True,
        target_tokens: int | None = None,
    ) -> CompactionDecision:
        """Run one pass; `before` is the count of `messages` plus `reserved`."""
        strategy = self.strategy
        if not messages:
            return NoAction(
                tokens_before=before,
                tokens_after=before,
                reason=reason,
                strategy=strategy,
            )
        ctx = CompactionContext(
            tokens_before=before - reserved,  # what the compactor is handed
            reason=reason,
            context_window=self.context_window,
            turn=turn,
            counter=self.counter,
            instructions=instructions,
            additional_context=additional_context,
            session_id=session_id,
            summaries=summaries or {},
            model_call=model_call,
            allow_model=allow_model,
        )
        aim = self.target_tokens if target_tokens is None else target_tokens
        target = max(0, aim - reserved)
        try:
            outcome = await self.compactor.compact(messages, target, ctx)
        # An outside failure becomes a value; cancellation (a BaseException)
        # is never caught here.
        except CompactionCircuitOpen as exc:
            return CircuitOpen(failures=exc.failures, reason=reason, strategy=strategy)
        except Exception as exc:
            problem: str | None = _describe(exc)
        else:
            problem = _outcome_problem(outcome)
            if problem is None:
                problem = result_problem(outcome.messages, messages)
        if problem is not None:
            return CompactorError(
                used=before,
                window=self.context_window,
                message_count=len(messages),
                error=problem,
                reason=reason,
                strategy=strategy,
            )
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
        # The compactor's numbers are only hints; the reserved budget rides too.
        after = self.count(new) + reserved
        strategy = self.strategy
        if self.context_window > 0 and after > self.context_window:
            return ContextOverflow(
                used=after,
                window=self.context_window,
                message_count=len(new),
                reason=reason,
                strategy=strategy,
            )
        if len(new) == count_before and after >= before:
            return NoAction(
                tokens_before=before,
                tokens_after=after,
                reason=reason,
                strategy=strategy,
            )
        return Compacted(
            messages=new,
            tokens_before=before,
            tokens_after=after,
            tokens_saved=max(0, before - after),
            reason=reason,
            strategy=strategy,
        )
