"""Values that cross the manager/compactor boundary.

A compactor receives a `CompactionContext` and answers with a
`CompactionOutcome`. The manager re-counts that outcome with its own counter
and classifies the pass as one `CompactionDecision`: `Compacted`, `NoAction`,
`ContextOverflow` (the result does not fit), `CompactorError` (the compactor
failed or broke the conversation) or `CircuitOpen` (the compactor's breaker
refused to run).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from enum import StrEnum
from types import MappingProxyType
from typing import Any, TypeAlias, final

import attrs

from turnfsm import _checks
from turnfsm.core._lines import CompactReason
from turnfsm.errors import ConfigError
from turnfsm.messages import Message
from turnfsm.providers._protocol import ModelClient, ModelRequest, ModelResponse
from turnfsm.tokens._protocol import TokenCounter

__all__ = [
    "CircuitOpen",
    "CompactBase",
    "Compacted",
    "CompactionContext",
    "CompactionDecision",
    "CompactionOutcome",
    "CompactorError",
    "ContextOverflow",
    "ModelCall",
    "NoAction",
]

ModelCall: TypeAlias = Callable[
    [ModelRequest, "ModelClient | None"], Awaitable[ModelResponse]
]
"""How a compactor calls a model: ``await call(request, model)``.

Under a `Driver`, the call runs with the run's retry policy, timeout and
usage accounting; `model` None means the agent's own model.
"""


class CompactBase(StrEnum):
    """What the compaction target is a percentage of."""

    THRESHOLD = "threshold"
    """The threshold line (`window * threshold // 100`)."""
    CONTEXT = "context"
    """The whole context window."""


def int_in(
    field: str, low: int, high: int | None, expected: str
) -> Callable[[object, object, object], None]:
    """Return an attrs validator: an int (not a bool) in ``low..high``."""
    return _checks.integer(field, low=low, high=high, expected=expected)


def optional_int(field: str, low: int) -> Callable[[object, object, Any], None]:
    """Return an attrs validator: None, or an int (not a bool) >= `low`."""
    return _checks.integer(field, low=low, optional=True)


def check_model(_inst: object, _attr: object, value: Any) -> None:
    """An attrs validator: a `ModelClient`, or None (the agent's own)."""
    if value is not None and not isinstance(value, ModelClient):
        raise ConfigError("model", value, "a ModelClient or None (the agent's own)")


def _to_messages(value: Iterable[Message]) -> tuple[Message, ...]:
    return tuple(value)


def _to_strings(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(value)


def _to_mapping(value: Mapping[str, str]) -> Mapping[str, str]:
    return MappingProxyType(dict(value))


@final
@attrs.frozen(kw_only=True)
class CompactionContext:
    """What a compactor knows about the pass it is asked to run.

    Attributes:
        tokens_before: The manager's count of the messages handed over (the
            reserved budget that rides the request is not included).
        reason: Why the pass runs (an emergency may justify more aggression).
        context_window: The model's window in tokens (0: unlimited).
        turn: The turn the pass runs in.
        counter: The manager's counter; use it for self-reported numbers so
            they are in the manager's unit.
        instructions: Guidance from pre-compact hooks.
        additional_context: Extra text from pre-compact hooks that a
            summarising compactor should fold in.
        session_id: The session the conversation belongs to ("" outside one).
        summaries: The session's recorded summaries, by summary message id
            (a summarising compactor reuses one instead of calling a model).
        model_call: Calls a model for the pass (the driver's, with its retry
            policy, timeout and usage accounting), or None: a compactor then
            calls its own model directly.
        allow_model: False when the session's circuit breaker is open: only
            deterministic work is allowed (no model call).
    """

    tokens_before: int
    reason: CompactReason
    context_window: int
    turn: int
    counter: TokenCounter
    instructions: tuple[str, ...] = attrs.field(default=(), converter=_to_strings)
    additional_context: tuple[str, ...] = attrs.field(default=(), converter=_to_strings)
    session_id: str = ""
    summaries: Mapping[str, str] = attrs.field(
        factory=dict, converter=_to_mapping, hash=False
    )
    model_call: ModelCall | None = attrs.field(default=None, eq=False, hash=False)
    allow_model: bool = True


@final
@attrs.frozen(kw_only=True)
class CompactionOutcome:
    """What a compactor returns: new messages and its self-reported sizes.

    The sizes are hints; the manager re-counts `messages` itself. A failed
    outcome carries `error` and no messages.

    Attributes:
        messages: The messages that replace the input (empty when failed).
        tokens_before: The size of the input, as the compactor saw it.
        tokens_after: The size of `messages`, as the compactor saw it.
        error: Why the compactor failed, or None.
    """

    messages: tuple[Message, ...] = attrs.field(converter=_to_messages)
    tokens_before: int
    tokens_after: int
    error: str | None = None

    @classmethod
    def compacted(
        cls, messages: Iterable[Message], before: int, after: int
    ) -> CompactionOutcome:
        """Return an outcome that replaces the input with `messages`.

        Args:
            messages: The shorter conversation.
            before: The size of the input.
            after: The size of `messages`, counted with the context's counter.
        """
        return cls(messages=messages, tokens_before=before, tokens_after=after)

    @classmethod
    def unchanged(cls, messages: Iterable[Message], before: int) -> CompactionOutcome:
        """Return an outcome that keeps `messages` at the input's size.

        Args:
            messages: The conversation, as received.
            before: The size of the input (reported as the size after, too).
        """
        return cls(messages=messages, tokens_before=before, tokens_after=before)

    @classmethod
    def failed(cls, error: str, before: int) -> CompactionOutcome:
        """Return an outcome saying the compactor could not run.

        Args:
            error: What went wrong, for the run's failure report.
            before: The size of the input.
        """
        return cls(messages=(), tokens_before=before, tokens_after=before, error=error)

    @property
    def is_failed(self) -> bool:
        """Whether the compactor reported a failure."""
        return self.error is not None


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
        message_count: How many messages the overflowing result has.
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
"""How the manager classified one compaction pass."""
