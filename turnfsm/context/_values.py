"""Values that cross the manager's and the compactor's boundaries.

A pass has one shape end to end: the caller hands the manager one
`CompactionRequest`; the manager hands its compactor the messages, a target
and a `CompactionContext`; the compactor answers with a
`CompactionProposal`; the manager re-counts the proposal with its own counter
and answers with the brain's own event (`turnfsm.core.PassEvent`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from enum import StrEnum
from types import MappingProxyType
from typing import Any, Final, TypeAlias, final

import attrs

from turnfsm import _checks
from turnfsm.core import CompactReason
from turnfsm.errors import ConfigError
from turnfsm.messages import Message
from turnfsm.providers import ModelClient, ModelRequest, ModelResponse
from turnfsm.tokens import TokenCounter

__all__ = [
    "CompactBase",
    "CompactionContext",
    "CompactionProposal",
    "CompactionRequest",
    "ModelCall",
]

_COUNTER_CHECK: Final = _checks.instance(
    TokenCounter,
    "a TokenCounter (count() and count_text() methods)",
    called=("count", "count_text", "units", "text_units", "tokens"),
)
"""The check of a token counter handed in: its protocol's methods, callable."""

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


def _to_messages(value: Iterable[Message]) -> tuple[Message, ...]:
    return tuple(value)


def _request_messages(value: Iterable[Message]) -> tuple[Message, ...]:
    return _checks.as_tuple(value, "messages", "Message")


def _to_strings(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(value)


def _to_ids(value: Iterable[str]) -> tuple[str, ...]:
    return _checks.as_tuple(value, "pinned", "message ids (strings)")


def _to_id_set(value: Iterable[str]) -> frozenset[str]:
    return frozenset(value)


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
        pinned: The ids of the pinned messages: keep them word for word and
            in order (`turnfsm.context.keep_pinned` does it for a proposal);
            the manager refuses a result that drops, alters or moves one.
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
    pinned: frozenset[str] = attrs.field(default=frozenset(), converter=_to_id_set)


@final
@attrs.frozen(kw_only=True)
class CompactionProposal:
    """What a compactor returns: new messages and its self-reported sizes.

    The sizes are hints; the manager re-counts `messages` itself. A failed
    proposal carries `error` and no messages.

    Attributes:
        messages: The messages that replace the input (empty when failed).
        tokens_before: The size of the input, as the compactor saw it.
        tokens_after: The size of `messages`, as the compactor saw it.
        error: Why the compactor failed, or None.
    """

    messages: tuple[Message, ...] = attrs.field(converter=_to_messages)
    tokens_before: int = attrs.field(validator=_checks.integer(low=0))
    tokens_after: int = attrs.field(validator=_checks.integer(low=0))
    error: str | None = attrs.field(
        default=None, validator=_checks.string(optional=True)
    )

    @classmethod
    def compacted(
        cls, messages: Iterable[Message], before: int, after: int
    ) -> CompactionProposal:
        """Return a proposal that replaces the input with `messages`.

        Args:
            messages: The shorter conversation.
            before: The size of the input.
            after: The size of `messages`, counted with the context's counter.
        """
        return cls(messages=messages, tokens_before=before, tokens_after=after)

    @classmethod
    def unchanged(cls, messages: Iterable[Message], before: int) -> CompactionProposal:
        """Return a proposal that keeps `messages` at the input's size.

        Args:
            messages: The conversation, as received.
            before: The size of the input (reported as the size after, too).
        """
        return cls(messages=messages, tokens_before=before, tokens_after=before)

    @classmethod
    def failed(cls, error: str, before: int) -> CompactionProposal:
        """Return a proposal saying the compactor could not run.

        Args:
            error: What went wrong, for the run's failure report.
            before: The size of the input.
        """
        return cls(messages=(), tokens_before=before, tokens_after=before, error=error)

    @property
    def is_failed(self) -> bool:
        """Whether the compactor reported a failure."""
        return self.error is not None


def _check_pinned(
    inst: CompactionRequest, _attr: object, pinned: tuple[str, ...]
) -> None:
    """Refuse a pin naming none of the request's messages: it would pin nothing."""
    if not pinned:
        return
    ids = {m.id for m in inst.messages}
    for i, pin in enumerate(pinned):
        if pin not in ids:
            raise ConfigError(
                f"pinned[{i}]", pin, "the id of one of the request's messages"
            )


def _check_tokens_before(inst: CompactionRequest, _attr: object, value: Any) -> None:
    if value is None:
        return
    if not _checks.is_int(value) or value < inst.reserved:
        raise ConfigError(
            "tokens_before",
            value,
            f"an int >= reserved ({inst.reserved}): the count of the messages "
            "plus the reserved budget, or None",
        )


@final
@attrs.frozen(kw_only=True)
class CompactionRequest:
    """One pass asked of a `ContextManager`: what to shrink, why, and with what.

    Checked once, here; `ContextManager.compact` takes nothing else.

    Attributes:
        messages: The conversation (history and pending, as one list).
        reason: Why the pass runs. None: only if the messages plus
            `reserved` cross one of the manager's lines (the line names
            the reason); under both lines nothing runs.
            `CompactReason.MANUAL` is a manual pass (the operator's
            ``/compact``): it runs whatever the lines say.
        turn: The turn the pass runs in.
        reserved: Tokens that ride the request besides `messages` (system
            prompt, tool schemas, reply budget); they must still fit
            afterwards, and every reported size includes them.
        tokens_before: The caller's count of `messages` plus `reserved`, with
            the manager's counter, when it has it already; None: the
            manager counts.
        instructions: Guidance from pre-compact hooks.
        additional_context: Extra text from pre-compact hooks.
        failures: The session's consecutive failed passes so far (its
            circuit breaker opens at the manager's `max_failures`).
        session_id: The session, for the compactor's idempotency key.
        summaries: The session's recorded summaries, by message id.
        model_call: How the compactor calls a model (a driver's: its retry
            policy, timeout and usage accounting), or None.
        target_tokens: The size to aim for (reserved budget included)
            instead of the manager's `target_tokens`, e.g. calibrated to
            what the provider reported; None: the manager's.
        pinned: Ids of more messages to pin for this pass (a pre-compact
            hook's), besides the ones `Message.pin` and the manager's
            `PinRules` pin; each the id of one of `messages`.
        context_window: The window the compactor is told
            (`CompactionContext.context_window`) instead of the manager's,
            in the tokens its counter reads: a calibrating run's, when the
            provider counts more than the counter does (the driver sets it,
            so that a summary sent to the agent's model fits the window as
            the provider counts it); None: the manager's.

    Raises:
        ConfigError: On construction, naming the field and the value.
    """

    messages: tuple[Message, ...] = attrs.field(
        converter=_request_messages,
        validator=_checks.each(Message, "a Message"),
    )
    reason: CompactReason | None = attrs.field(
        default=None,
        validator=_checks.instance(CompactReason, "a CompactReason", optional=True),
    )
    turn: int = attrs.field(default=0, validator=_checks.integer(low=0))
    reserved: int = attrs.field(
        default=0, validator=_checks.integer(low=0, expected="an int >= 0 (tokens)")
    )
    tokens_before: int | None = attrs.field(
        default=None, validator=_check_tokens_before
    )
    instructions: tuple[str, ...] = attrs.field(default=(), converter=_to_strings)
    additional_context: tuple[str, ...] = attrs.field(default=(), converter=_to_strings)
    failures: int = attrs.field(default=0, validator=_checks.integer(low=0))
    session_id: str = attrs.field(default="", validator=_checks.string())
    summaries: Mapping[str, str] = attrs.field(
        factory=dict, converter=_to_mapping, hash=False
    )
    model_call: ModelCall | None = attrs.field(
        default=None,
        eq=False,
        hash=False,
        validator=_checks.callable_(optional=True),
    )
    target_tokens: int | None = attrs.field(
        default=None, validator=_checks.integer(low=0, optional=True)
    )
    pinned: tuple[str, ...] = attrs.field(
        default=(),
        converter=_to_ids,
        validator=[_checks.each(str, "a message id (a string)"), _check_pinned],
    )
    context_window: int | None = attrs.field(
        default=None,
        validator=_checks.integer(
            low=1, optional=True, expected="an int >= 1 (tokens), or None"
        ),
    )
