"""`ContextManager`: the sizing policy around a compactor.

The manager owns the window, the threshold, the compaction target and the one
counter every decision is measured with. It has one way in: `compact` takes
a `CompactionRequest` and answers with the event the brain takes next
(`turnfsm.core.PassEvent`), judged by re-counting the compactor's proposal
itself; a compactor's own numbers are hints. Every size it reports is the
whole request's: the messages plus the reserved budget (system prompt, tool
schemas, reply budget), so the manager, the driver, the audit record and the
hooks report one count. The verdict, in order:

0. no reason given and the request is under both lines, or no messages
   → `CompactionNoop` (the compactor is not called);
1. the session's circuit breaker is open (`failures >= max_failures`): a
   proactive pass → `CompactionCircuitOpened` at once, no compactor call; a
   pass after a provider overflow runs with `allow_model` False
   (deterministic work only); a compactor that raises
   `CompactionCircuitOpen` → `CompactionCircuitOpened`;
2. it raised anything else, reported a failure, returned something that is
   not a usable proposal, or a result that is not a valid conversation (a
   tool pair split or out of place, a repeated message id)
   → `CompactorFailed`; so is a result that drops, alters or moves a pinned
   message (`pinned_ids`: `Message.pin`, the request's `pinned`, the
   manager's `pins` rules, calls in flight), or puts a user message (not a
   summary) before the first user message or after the latest one, which
   the rule would pin next in its place; its error a
   `turnfsm.errors.PinnedMessageLost` naming the message;
3. the result plus the reserved budget is still over the window, or, on
   a pass for the message-count line (run on a request under the token
   lines), on or over the emergency line → `CompactionOverflowed`;
4. same message count and no size reduction → `CompactionNoop`;
5. with `cache_payback_calls`, a pass for a soft line that would not pay
   back within that many calls → `CompactionNoop` carrying its declined
   `PassPayback` (nothing changes);
6. anything else → `CompactionResult`, with the manager's numbers and the
   pass's `PassPayback`.

`budget()` turns the same sizing policy into the brain's `Budget`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Final, final

import attrs

from turnfsm import _checks
from turnfsm._prices import to_prices
from turnfsm.context._cache import CacheRules, cache_rules_for, payback_of
from turnfsm.context._masking import MaskingCompactor
from turnfsm.context._pairs import result_problem, scans_shared
from turnfsm.context._pass_count import count_of
from turnfsm.context._pass_count import measured as _measured
from turnfsm.context._pins import PinRules, pin_loss, pinned_ids
from turnfsm.context._protocol import ContextCompactor
from turnfsm.context._values import (
    _COUNTER_CHECK,
    CompactBase,
    CompactionContext,
    CompactionProposal,
    CompactionRequest,
    ModelCall,
)
from turnfsm.context._verdicts import OldEntryPoints
from turnfsm.core import (
    Budget,
    CompactionCircuitOpened,
    CompactionNoop,
    CompactionOverflowed,
    CompactionResult,
    CompactorFailed,
    CompactReason,
    PassEvent,
    emergency_line,
    line_reason,
    threshold_line,
)
from turnfsm.errors import CompactionCircuitOpen, ConfigError
from turnfsm.messages import Message
from turnfsm.providers import (
    FALLBACK_WINDOW,
    ModelClient,
    ModelPrices,
    ModelRequest,
    ModelResponse,
    window_for,
)
from turnfsm.tokens import TokenCounter, default_counter
from turnfsm.values import ErrorInfo, PassPayback, Usage

__all__ = [
    "CALIBRATION_CEILING",
    "CALIBRATION_FLOOR",
    "CALIBRATION_HEADROOM",
    "ContextManager",
]

CALIBRATION_FLOOR: Final = 0.25
"""The smallest factor a calibrating manager scales its estimates by."""

CALIBRATION_HEADROOM: Final = 1.02
"""What the observed ratio is multiplied by: text unlike what was observed
may read a little higher than the ratio says."""

CALIBRATION_CEILING: Final = 4.0
"""The largest factor a calibrating manager scales its estimates by."""


def _to_base(value: object) -> CompactBase:
    if isinstance(value, CompactBase):
        return value
    if isinstance(value, str) and value in CompactBase.__members__.values():
        return CompactBase(value)
    raise ConfigError(
        "compact_target", value, "CompactBase.THRESHOLD or CompactBase.CONTEXT"
    )


def _needs_prices(inst: ContextManager, _attr: object, value: int | None) -> None:
    if value is not None and inst.prices is None:
        raise ConfigError(
            "prices",
            None,
            "the model's prices (its name, or ModelPrices) when "
            f"cache_payback_calls={value} is set",
            missing=True,
        )


_SOFT_LINES: Final = frozenset(
    {CompactReason.THRESHOLD_EXCEEDED, CompactReason.MESSAGE_COUNT}
)


def _counting(call: ModelCall | None, spent: list[Usage]) -> ModelCall | None:
    """`call`, keeping what each of its responses reported in `spent`."""
    if call is None:
        return None

    async def counted(
        request: ModelRequest, model: ModelClient | None
    ) -> ModelResponse:
        response = await call(request, model)
        if response.usage is not None:
            spent.append(response.usage)
        return response

    return counted


def _describe(exc: Exception) -> str:
    text = _checks.message_of(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _proposal_problem(proposal: object) -> str | None:
    """Return why `proposal` counts as a compactor failure, or None."""
    if not isinstance(proposal, CompactionProposal):
        return f"compactor returned {type(proposal).__name__}, not a CompactionProposal"
    if proposal.error is not None:
        return proposal.error or "compactor reported a failure"
    if not proposal.messages:
        return "compactor returned an empty message list"
    if not all(isinstance(m, Message) for m in proposal.messages):
        bad = next(
            (i, m)
            for i, m in enumerate(proposal.messages)
            if not isinstance(m, Message)
        )
        return (
            f"compactor returned messages[{bad[0]}]={bad[1]!r} "
            f"({type(bad[1]).__name__}), not a Message"
        )
    return None


_RESERVED: Final = _checks.integer(low=0, expected="an int >= 0 (tokens)")
_SUMMARY: Final = _checks.instance(Usage, "a Usage, or None", optional=True)


def _conversation(value: object, name: str) -> tuple[Message, ...]:
    """`value` as a conversation, or a `ConfigError` naming `name`."""
    messages = _checks.as_tuple(value, name, "Message")
    _checks.check(messages, name, _checks.each(Message, "a Message"))
    return messages


def _not_a_strategy_name(_inst: object, _attr: object, value: object) -> None:
    """Refuse a strategy's name as a compactor, naming what makes one of it."""
    if isinstance(value, str):
        raise ConfigError(
            "compactor",
            value,
            "a ContextCompactor (an async compact() method), not a strategy's "
            f"name: {_checks.compactor_of(value)}",
        )


@final
@_checks.keyword_checked(hint=_checks.strategy_hint)
@attrs.frozen(kw_only=True)
class ContextManager(OldEntryPoints):
    """Decide whether a conversation must shrink, shrink it, and judge the result.

    With the defaults (the model's window, threshold 80, target 70% of the
    threshold line) a 200,000-token window puts the threshold line at
    160,000 tokens, the emergency line at 190,000 and the compaction target
    at 112,000; a 128,000-token one at 102,400, 121,600 and 71,680.

    Attributes:
        compactor: The strategy that shrinks (default `MaskingCompactor`: tool
            results capped, old ones digested, then the middle truncated, with
            no model call);
            the only setting that may be passed positionally.
        context_window: The window in tokens, at most 100,000,000 and at
            most the model's known one; 0 disables both lines. None (the
            default): the model's window, as `window_for` chooses it when
            the manager is given to an agent (a model whose window is not
            known: 200,000); the manager alone draws its lines on 200,000.
        threshold: The soft line, in percent of the window (0..100; 0 turns
            the threshold line off). A whole percentage: 80, not 0.8.
        auto_compact: Whether the soft lines, the threshold line and the
            message-count line, trigger compaction (the emergency line
            always does).
        threshold_tokens: The soft line in tokens, in place of `threshold`:
            an absolute line (``threshold_tokens=150_000``), at most the
            window; None: the percentage.
        compact_target: What `compact_target_pct` is a percentage of.
        compact_target_pct: The target size, in percent (1..100).
        counter: The one counter every measurement uses (default: the
            conservative counter, which errs high).
        use_reported_usage: Measure with the input tokens
            the provider reported for the run's last call, plus the messages
            added since, instead of the estimate (which is used when there is
            no report: a run's first measurement, after a compaction). The
            request is still checked against the window with the estimate
            before it is sent.
        calibrate: Scale every measurement of a request by what the
            provider reported (False by default). The factor is the
            session's largest ratio of reported to estimated input tokens
            over its model calls made with the same counter
            (`Session.reported_ratio_for`), plus 2 %
            (`CALIBRATION_HEADROOM`), kept between `CALIBRATION_FLOOR` and
            `CALIBRATION_CEILING`: the estimate may come down only as far
            as every call observed allows. It is used
            for the lines and for the check before sending; until the first
            report, and on a provider that reports nothing, the estimate
            stands.
        max_failures: Consecutive failed passes (at most 1,000,000) that open its
            circuit breaker (3 by default). The count lives in the session's
            log, so it survives restarts and is per session.
        max_messages: The message-count line (50 by default; at most
            1,000,000): a conversation with more messages compacts (reason
            MESSAGE_COUNT); 0 turns it off.
        pins: The rules that pin messages besides `Message.pin` (default:
            the system prompt, the first user message and the latest user
            request). Every pass keeps pinned messages word for word; a pass
            that drops, alters or moves one is refused.
        prices: The model's prices (`ModelPrices`, or a known model's
            name: ``"claude-sonnet-4-5"``); with them every pass's
            `PassPayback` includes its cost, its saving per later call and
            the calls it takes to pay back. None: token figures only.
        cache_rules: The provider's prompt-cache rules (None: those of the
            provider `prices` belong to, from `CACHE_RULES`).
        cache_payback_calls: Keep a pass for a soft line (the threshold or
            the message count) only when it pays back within this many
            calls (1..1,000,000); otherwise the pass is declined: nothing
            changes, the record is a noop with its figures, and the run
            calls the model (the line starts no pass again until the next
            compaction commits). The emergency line, an overflow and a
            manual pass always compact. None (the default): no check.
            Needs `prices`.

    Raises:
        ConfigError: On construction, naming the field and the value, when a
            setting is out of range or of the wrong type.
    """

    # The one positional setting: ``ContextManager(MyCompactor(), ...)``.
    compactor: ContextCompactor = attrs.field(
        factory=MaskingCompactor,
        validator=[
            _not_a_strategy_name,
            _checks.instance(
                ContextCompactor,
                "a ContextCompactor (an async compact() method)",
                awaited=("compact",),
            ),
        ],
        kw_only=False,
    )
    context_window: int | None = attrs.field(
        default=None,
        validator=_checks.integer(
            low=0,
            high=_checks.MAX_TOKENS,
            optional=True,
            expected="an int in 0..100,000,000 (tokens), or None (the model's)",
        ),
    )
    threshold: int = attrs.field(
        default=80,
        validator=_checks.percentage(low=0, high=100),
    )
    auto_compact: bool = attrs.field(default=True, validator=_checks.boolean())
    threshold_tokens: int | None = attrs.field(
        default=None,
        validator=[
            _checks.integer(low=1, high=_checks.MAX_TOKENS, optional=True),
            lambda inst, _a, value: Budget(
                context_window=inst.window, threshold_tokens=value
            ),
        ],
    )
    compact_target: CompactBase = attrs.field(
        default=CompactBase.THRESHOLD, converter=_to_base
    )
    compact_target_pct: int = attrs.field(
        default=70,
        validator=_checks.percentage(low=1, high=100),
    )
    counter: TokenCounter = attrs.field(
        factory=default_counter,
        validator=_COUNTER_CHECK,
    )
    use_reported_usage: bool = attrs.field(default=False, validator=_checks.boolean())
    calibrate: bool = attrs.field(default=False, validator=_checks.boolean())
    max_failures: int = attrs.field(
        default=3, validator=_checks.integer(low=1, high=_checks.MAX_COUNT)
    )
    max_messages: int = attrs.field(
        default=50,
        validator=_checks.integer(
            low=0,
            high=_checks.MAX_COUNT,
            expected="an int in 0..1,000,000 (0: no line)",
        ),
    )
    pins: PinRules = attrs.field(
        factory=PinRules,
        validator=_checks.instance(PinRules, "a PinRules (which rules pin)"),
    )
    prices: ModelPrices | None = attrs.field(
        default=None,
        converter=to_prices,
        validator=_checks.instance(
            ModelPrices,
            "ModelPrices or a model with known prices (claude-sonnet-4-5)",
            optional=True,
        ),
    )
    cache_rules: CacheRules | None = attrs.field(
        default=None,
        validator=_checks.instance(CacheRules, "CacheRules", optional=True),
    )
    cache_payback_calls: int | None = attrs.field(
        default=None,
        validator=[
            _checks.integer(
                low=1,
                high=_checks.MAX_COUNT,
                optional=True,
                expected="an int in 1..1,000,000 (calls), or None (no check)",
            ),
            _needs_prices,
        ],
    )

    # -- the window and the lines ------------------------------------------
    @property
    def window(self) -> int:
        """The window the lines are drawn on: `context_window`, else 200,000."""
        if self.context_window is None:
            return FALLBACK_WINDOW
        return self.context_window

    def for_model(
        self, model: object, *, field: str = "context_window"
    ) -> ContextManager:
        """Return the manager for runs on `model`: its window chosen by `window_for`.

        With no `context_window`, a copy on the model's known window (else
        200,000); with one, the manager itself once the window is checked
        against the model's. A `Driver` calls it when it is built.

        `model` is the model client, not a model's name (`known_window`
        looks a name's window up).

        Raises:
            WindowTooLarge: `context_window` is larger than the model's
                known window (`field` names it in the message).
            ConfigError: `threshold_tokens` is over the model's window; or
                `model` is no model client (a model's name, a class, a
                number: field ``model``).
        """
        window = window_for(model, self.context_window, field=field)
        if window == self.context_window:
            return self
        return attrs.evolve(self, context_window=window)

    @property
    def threshold_line(self) -> int:
        """`threshold_tokens`, else ``context_window * threshold // 100``.

        Strictly over it compacts (with `auto_compact`).
        """
        return threshold_line(self.window, self.threshold, self.threshold_tokens)

    @property
    def emergency_line(self) -> int:
        """``context_window * 95 // 100``; on or over it always compacts."""
        return emergency_line(self.window)

    @property
    def target_tokens(self) -> int:
        """The size a pass aims for, before any reserved budget."""
        base = (
            self.threshold_line
            if self.compact_target is CompactBase.THRESHOLD
            else self.window
        )
        return base * self.compact_target_pct // 100

    def count(self, messages: Sequence[Message]) -> int:
        """Return the manager's token count of `messages`.

        In a pass, the very messages the pass was handed are counted once:
        their count is the one the pass measured them at.

        Raises:
            ConfigError: The counter returned something other than an int
                >= 0; the error names the counter and the value.
        """
        counter = self.counter
        # In a pass, the messages it was handed are counted once.
        return _checks.token_count(count_of(counter, messages), counter, "count")

    def calibration_factor(self, ratio: float | None) -> float:
        """Return the factor estimates are scaled by, given the observed `ratio`.

        1.0 without `calibrate` or without an observed ratio (None); else
        `ratio` times `CALIBRATION_HEADROOM`, kept between
        `CALIBRATION_FLOOR` and `CALIBRATION_CEILING`.
        """
        if not self.calibrate or ratio is None or not math.isfinite(ratio):
            return 1.0
        factor = ratio * CALIBRATION_HEADROOM
        return min(CALIBRATION_CEILING, max(CALIBRATION_FLOOR, factor))

    def calibrated(self, estimate: int, ratio: float | None) -> int:
        """Return `estimate` scaled by `calibration_factor(ratio)`, rounded up."""
        factor = self.calibration_factor(ratio)
        if factor == 1.0:
            return estimate
        return math.ceil(estimate * factor)

    def reason_for(self, estimate: int) -> CompactReason | None:
        """Return why a payload of `estimate` tokens must compact, or None.

        The same predicate the turn machine uses before every model call: the
        emergency line first (inclusive, always on), then the threshold line
        (strict, only with `auto_compact`).
        """
        return line_reason(
            estimate,
            self.window,
            self.threshold,
            auto_compact=self.auto_compact,
            tokens=self.threshold_tokens,
        )

    def pinned(
        self, messages: Sequence[Message], also: Sequence[str] = ()
    ) -> frozenset[str]:
        """Return the ids of the pinned messages of `messages` (`pinned_ids`).

        Args:
            messages: The conversation.
            also: More ids to pin (a pre-compact hook's).

        Raises:
            ConfigError: `messages` is no conversation, or `also` no ids.
        """
        messages = _conversation(messages, "messages")
        also = _checks.as_tuple(also, "also", "message ids (strings)")
        _checks.check(also, "also", _checks.each(str, "a message id (a string)"))
        return pinned_ids(messages, self.pins, also)

    @property
    def strategy(self) -> str:
        """The compactor's class name, as every pass's record reports it."""
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
                overflows in a row, without a reply in between.
            **limits: Any further `Budget` field (a run limit), passed through.

        Raises:
            ConfigError: A limit is out of range (raised by `Budget`).
            TypeError: `limits` names a field the manager owns or no field.
        """
        return Budget(
            context_window=self.window,
            threshold=self.threshold,
            auto_compact=self.auto_compact,
            threshold_tokens=self.threshold_tokens,
            max_messages=self.max_messages,
            max_turns=max_turns,
            max_overflow_retries=max_overflow_retries,
            **limits,
        )

    # -- the pass ----------------------------------------------------------
    async def compact(self, request: CompactionRequest) -> PassEvent:
        """Run one pass as `request` asks and judge it; return the brain's event.

        Args:
            request: The pass: the messages, why, and what rides with them.

        Returns:
            `CompactionResult` (the messages that replace the conversation,
            with the manager's counts), `CompactionNoop` (nothing changed, or
            nothing was asked: under both lines with no reason given),
            `CompactionOverflowed` (the result plus `reserved` is over the
            window, or, on a pass for the message-count line, on or over its
            emergency line), `CompactorFailed` (the compactor failed or broke the
            conversation) or `CompactionCircuitOpened`. Every size includes
            `request.reserved`.

        Raises:
            ConfigError: `request` is not a `CompactionRequest`.
        """
        if not isinstance(request, CompactionRequest):
            raise ConfigError("request", request, "a CompactionRequest")
        before = request.tokens_before
        measured = before is None  # `before` is then the counter's own figure
        if before is None:
            before = self.count(request.messages) + request.reserved
        reason = request.reason
        if reason is None:
            reason = self.reason_for(before)
            if reason is None:  # under both lines: nothing is asked
                return CompactionNoop(before=before, after=before)
        allow_model = True
        if request.failures >= self.max_failures:
            if reason is not CompactReason.OVERFLOW:  # fail fast, no model call
                return CompactionCircuitOpened(failures=request.failures)
            allow_model = False  # an overflow still gets the deterministic work
        if not request.messages:
            return CompactionNoop(before=before, after=before)
        size = before - request.reserved if measured else None
        # Its pins, its cut and its check: one pair scan; its input, one count.
        with scans_shared(), _measured(self.counter, request.messages, size):
            return await self._pass(
                request, before, reason, allow_model=allow_model, measured=measured
            )

    async def _pass(
        self,
        request: CompactionRequest,
        before: int,
        reason: CompactReason,
        *,
        allow_model: bool,
        measured: bool,
    ) -> PassEvent:
        """Run the compactor; `before` is the messages plus the reserved budget.

        `measured`: `before` is the counter's count (not the caller's figure).
        """
        messages, reserved = request.messages, request.reserved
        # The request checked its messages and pins when it was made.
        pinned = pinned_ids(messages, self.pins, request.pinned)
        spent: list[Usage] = []
        ctx = CompactionContext(
            tokens_before=before - reserved,  # what the compactor is handed
            reason=reason,
            context_window=request.context_window or self.window,
            turn=request.turn,
            counter=self.counter,
            instructions=request.instructions,
            additional_context=request.additional_context,
            session_id=request.session_id,
            summaries=request.summaries,
            model_call=request.model_call
            if self.prices is None
            else _counting(request.model_call, spent),
            allow_model=allow_model,
            pinned=pinned,
        )
        aim = (
            self.target_tokens
            if request.target_tokens is None
            else (request.target_tokens)
        )
        try:
            proposal = await self.compactor.compact(
                messages, max(0, aim - reserved), ctx
            )
        # An outside failure becomes a value; cancellation (a BaseException)
        # is never caught here.
        except CompactionCircuitOpen as exc:
            try:
                return CompactionCircuitOpened(failures=exc.failures)
            except ConfigError as bad:  # its count is the compactor's own value
                problem: str | None = f"compactor raised CompactionCircuitOpen: {bad}"
        except Exception as exc:
            if getattr(exc, "is_crash", False):
                raise  # a strict hook's error in a summary call: not the pass's
            problem = _describe(exc)
        else:
            problem = _proposal_problem(proposal)
            if problem is None:
                problem = result_problem(proposal.messages, messages)
            if problem is None:
                lost = pin_loss(
                    messages,
                    proposal.messages,
                    pinned,
                    strategy=self.strategy,
                    rules=self.pins,
                )
                if lost is not None:
                    return CompactorFailed(
                        used=before,
                        limit=self.window,
                        error=ErrorInfo.from_exception(lost),
                    )
        if problem is not None:
            return CompactorFailed(
                used=before,
                limit=self.window,
                error=ErrorInfo(type="CompactorError", message=problem),
            )
        new = proposal.messages
        # The compactor's numbers are only hints; the reserved budget rides too.
        after = self.count(new) + reserved
        if self.window > 0 and (
            after > self.window
            # A pass for the message-count line ran on a request under the
            # token lines: a result that reaches the emergency line would be
            # committed, and compacted again, where the request fitted.
            or (
                reason is CompactReason.MESSAGE_COUNT
                and after >= emergency_line(self.window)
            )
        ):
            return CompactionOverflowed(used=after, limit=self.window, before=before)
        if len(new) == len(messages) and (
            after >= before
            or all(a is b or a == b for a, b in zip(new, messages, strict=True))
        ):
            # Nothing saved; or nothing changed, whatever a counter says of
            # it (one whose count disagrees with its units reads it smaller).
            return CompactionNoop(before=before, after=max(after, before))
        sizes = (before if measured else self.count(messages) + reserved, after)
        payback = self._payback(messages, new, sizes, sum(spent, Usage()))
        declined = self._declined(payback, reason)
        if declined is not None:
            return CompactionNoop(before=before, after=before, payback=declined)
        return CompactionResult(
            messages=new, before=before, after=after, payback=payback
        )

    def payback(
        self,
        before: Sequence[Message],
        after: Sequence[Message],
        reserved: int = 0,
        summary: Usage | None = None,
    ) -> PassPayback:
        """Return what replacing `before` with `after` costs against what it saves.

        Measured with the manager's counter, priced at `prices` (token
        figures only without them) under `cache_rules` (else the
        provider's).

        Args:
            before: The conversation a pass was given.
            after: The conversation it proposes.
            reserved: The request's tokens beside its messages.
            summary: What the pass's summary calls reported.

        Raises:
            ConfigError: an argument is not what it says, naming it.
        """
        before = _conversation(before, "before")
        after = _conversation(after, "after")
        _checks.check(reserved, "reserved", _RESERVED)
        _checks.check(summary, "summary", _SUMMARY)
        sizes = (self.count(before) + reserved, self.count(after) + reserved)
        return self._payback(before, after, sizes, summary)

    def _payback(
        self,
        before: Sequence[Message],
        after: Sequence[Message],
        sizes: tuple[int, int],
        summary: Usage | None,
    ) -> PassPayback:
        """`payback`, the two sizes (reserved budget included) measured already."""
        rules = self.cache_rules
        if rules is None and self.prices is not None:
            rules = cache_rules_for(self.prices)
        return payback_of(
            before,
            after,
            self.count,
            sizes=sizes,
            prices=self.prices,
            rules=rules,
            summary=summary,
        )

    def _declined(
        self, payback: PassPayback, reason: CompactReason
    ) -> PassPayback | None:
        """`payback` marked declined, when the pass does not pay back in time."""
        limit = self.cache_payback_calls
        if limit is None or reason not in _SOFT_LINES or not payback.priced:
            return None
        calls = payback.payback_calls
        if calls is not None and calls <= limit:
            return None
        if calls is None:
            note = "declined: it would never pay back"
        else:
            note = (
                f"declined: it would pay back after {calls} calls, "
                f"more than cache_payback_calls={limit}"
            )
        return attrs.evolve(payback, declined=True, note=note)
