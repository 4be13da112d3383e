"""The brain's state: buffers, estimate, counters, budget (frozen, serialisable)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, final

import attrs

from turnfsm import _checks
from turnfsm.core._lines import CompactReason
from turnfsm.errors import (
    CONTEXT_CHECK,
    CONTEXT_OVERFLOW,
    Cancelled,
    CompactionCircuitOpen,
    CompactionFailed,
    CompactionLimitExceeded,
    CompactionStalled,
    ConfigError,
    ContextExceeded,
    MaxTurnsExceeded,
    OutputInvalid,
    ProviderError,
    TurnFSMError,
)
from turnfsm.messages import Message, MessageLog, OpenCalls
from turnfsm.values import ErrorInfo

__all__ = ["SCHEMA_VERSION", "Budget", "Failure", "Snapshot"]

SCHEMA_VERSION: Final = 1
"""The version of `Snapshot.to_dict` output."""


def _count(name: str, low: int) -> _checks.Check:
    return _checks.integer(name, low=low, high=_checks.MAX_COUNT)


@final
@_checks.keyword_checked
@attrs.frozen(kw_only=True)
class Budget:
    """The limits one run works within.

    Attributes:
        context_window: the model's window in tokens (at most 100,000,000);
            0 disables both lines.
        threshold: the soft line in percent of the window (0 disables it).
        threshold_tokens: the soft line in tokens, in place of `threshold`
            (an absolute line, at most the window), or None.
        auto_compact: whether the soft lines (the threshold line and the
            message-count line) trigger compaction.
        max_turns: the most model calls one run may make.
        max_overflow_retries: compact-and-retry passes after provider
            overflows in a row, without a reply in between (each model
            reply starts the count again).
        max_compactions: the most compaction passes in a row, with no model
            call between them (a long run compacts as often as its length
            needs; each model call starts the count again).
        max_messages: the message-count line: more messages than
            this compact; 0 turns the line off.
        max_output_retries: re-asks after a final answer that does not fit
            the run's output type.

    Each count is at most 1,000,000.

    Raises:
        ConfigError: a field is of the wrong type or out of its range.
    """

    context_window: int = attrs.field(
        default=200_000,
        validator=_checks.integer("context_window", low=0, high=_checks.MAX_TOKENS),
    )
    threshold: int = attrs.field(
        default=80, validator=_checks.integer("threshold", low=0, high=100)
    )
    auto_compact: bool = attrs.field(
        default=True, validator=_checks.boolean("auto_compact")
    )
    threshold_tokens: int | None = attrs.field(
        default=None,
        validator=[
            _checks.integer(low=1, high=_checks.MAX_TOKENS, optional=True),
            lambda inst, _a, value: _within_window(inst, value),
        ],
    )
    max_turns: int = attrs.field(default=50, validator=_count("max_turns", 1))
    max_overflow_retries: int = attrs.field(
        default=2, validator=_count("max_overflow_retries", 0)
    )
    max_compactions: int = attrs.field(
        default=20, validator=_count("max_compactions", 1)
    )
    max_messages: int = attrs.field(default=0, validator=_count("max_messages", 0))
    max_output_retries: int = attrs.field(
        default=2, validator=_count("max_output_retries", 0)
    )


def _within_window(budget: Budget, tokens: int | None) -> None:
    """An absolute threshold line lies inside the window it is a line of."""
    window = budget.context_window
    if tokens is not None and window and tokens > window:
        raise ConfigError(
            "threshold_tokens", tokens, f"at most the context_window ({window})"
        )


_ERROR_BUILDERS: Final[dict[str, Callable[[Failure], TurnFSMError]]] = {
    "max_turns_exceeded": lambda f: MaxTurnsExceeded(max_turns=f.limit),
    "context_exceeded": lambda f: ContextExceeded(
        used=f.used,
        limit=f.limit,
        provider_message=_provider_message(f),
        window_check=_window_check(f),
    ),
    "compaction_stalled": lambda f: CompactionStalled(
        used=f.used,
        limit=f.limit,
        provider_message=_provider_message(f),
        window_check=_window_check(f),
    ),
    "compaction_failed": lambda f: CompactionFailed(
        used=f.used, limit=f.limit, cause=f.detail
    ),
    "compaction_circuit_open": lambda f: CompactionCircuitOpen(failures=f.used),
    "compaction_limit_exceeded": lambda f: CompactionLimitExceeded(
        max_compactions=f.limit
    ),
    "cancelled": lambda f: Cancelled(reason=f.detail),
    "output_invalid": lambda f: OutputInvalid(
        errors=f.detail.splitlines(), retries=f.used
    ),
    "provider_error": lambda f: ProviderError(
        message=f.detail,
        retryable=f.retryable,
        kind=f.error_type,
        retry_after=f.retry_after,
        status=f.status,
        attempts=f.attempts,
        elapsed=f.elapsed,
    ),
}


def _provider_message(failure: Failure) -> str:
    """The provider's words, when the failure carries its overflow refusal."""
    return failure.detail if failure.error_type == CONTEXT_OVERFLOW else ""


def _window_check(failure: Failure) -> str:
    """The run's own check's words, when it refused the request or the reply."""
    return failure.detail if failure.error_type == CONTEXT_CHECK else ""


@final
@attrs.frozen(kw_only=True)
class Failure:
    """Why a run failed, as plain data; `to_error()` builds the exception."""

    kind: str = attrs.field(validator=_checks.one_of(_ERROR_BUILDERS, "kind"))
    used: int = attrs.field(default=0, validator=_checks.integer(low=0))
    limit: int = attrs.field(default=0, validator=_checks.integer(low=0))
    detail: str = attrs.field(default="", validator=_checks.string())
    error_type: str = attrs.field(default="", validator=_checks.string())
    retryable: bool = attrs.field(default=False, validator=_checks.boolean())
    status: int | None = attrs.field(
        default=None, validator=_checks.integer(low=0, optional=True)
    )
    retry_after: float | None = attrs.field(
        default=None, validator=_checks.number(low=0, optional=True)
    )
    attempts: int | None = attrs.field(
        default=None, validator=_checks.integer(low=0, optional=True)
    )
    elapsed: float | None = attrs.field(
        default=None, validator=_checks.number(low=0, optional=True)
    )

    def to_error(self) -> TurnFSMError:
        """Return the typed error this failure stands for."""
        return _ERROR_BUILDERS[self.kind](self)


def _log(value: Any, name: str) -> MessageLog:
    if isinstance(value, MessageLog):
        return value
    return MessageLog(_checks.as_tuple(value, name, "Message"))


def _history(value: Any) -> MessageLog:
    return _log(value, "history")


def _pending(value: Any) -> MessageLog:
    return _log(value, "pending")


def _inbox(value: Any) -> tuple[Message, ...]:
    return _checks.as_tuple(value, "inbox", "Message")


def _messages(_inst: object, attr: Any, value: Sequence[Message]) -> None:
    # A log's items never change and its views share one memo: each item is
    # checked once, however many snapshots hold the log (every step makes
    # one), so a run on a long session does not re-check its history.
    memo = value.memo if type(value) is MessageLog else {}
    checked = memo.get(_CHECKED, 0)
    for i in range(checked, len(value)):
        item = value[i]
        if not isinstance(item, Message):
            raise ConfigError(f"{attr.name}[{i}]", item, "a Message")
    if len(value) > checked:
        memo[_CHECKED] = len(value)


_CHECKED: Final = object()
"""The key, in a log's memo, of how many of its items are known to be messages."""


@final
@attrs.frozen(kw_only=True, slots=False)
class Snapshot:
    """Everything the brain knows; equal snapshots give equal decisions.

    `history` is the committed conversation, `pending` this run's messages,
    `inbox` messages injected while the request could not take them yet.
    `overflow` is the refusal that started the last compact-and-retry pass
    (a provider's, or the driver's own check of a reply), so that a pass
    that cannot make the request fit fails quoting the provider.
    `overflow_retries_in_a_row` says whether a model reply starts the count
    of `overflow_retries` again (True); a run logged before it did counts
    them over the whole run (False), and replays so.
    """

    phase: str = attrs.field(validator=_checks.string(non_empty=True))
    budget: Budget = attrs.field(
        factory=Budget, validator=_checks.instance(Budget, "a Budget")
    )
    history: MessageLog = attrs.field(
        factory=MessageLog, converter=_history, validator=_messages
    )
    pending: MessageLog = attrs.field(
        factory=MessageLog, converter=_pending, validator=_messages
    )
    inbox: tuple[Message, ...] = attrs.field(
        default=(), converter=_inbox, validator=_messages
    )
    estimate: int | None = attrs.field(
        default=None, validator=_checks.integer(low=0, optional=True)
    )
    turns: int = attrs.field(default=0, validator=_checks.integer(low=0))
    overflow_retries: int = attrs.field(default=0, validator=_checks.integer(low=0))
    compactions: int = attrs.field(default=0, validator=_checks.integer(low=0))
    output_retries: int = attrs.field(default=0, validator=_checks.integer(low=0))
    overflow_retries_in_a_row: bool = attrs.field(
        default=True, validator=_checks.boolean()
    )
    compact_reason: CompactReason | None = attrs.field(
        default=None,
        validator=_checks.instance(CompactReason, "a CompactReason", optional=True),
    )
    message_line_spent: bool = attrs.field(default=False, validator=_checks.boolean())
    threshold_line_spent: bool = attrs.field(default=False, validator=_checks.boolean())
    last_reply: Message | None = attrs.field(
        default=None, validator=_checks.instance(Message, "a Message", optional=True)
    )
    failure: Failure | None = attrs.field(
        default=None, validator=_checks.instance(Failure, "a Failure", optional=True)
    )
    overflow: ErrorInfo | None = attrs.field(
        default=None,
        validator=_checks.instance(ErrorInfo, "an ErrorInfo", optional=True),
    )
    is_started: bool = attrs.field(default=False, validator=_checks.boolean())
    schema_version: int = attrs.field(
        default=SCHEMA_VERSION, validator=_checks.one_of((SCHEMA_VERSION,))
    )

    def replace(self, **changes: Any) -> Snapshot:
        """Return a copy with `changes` (the brain's internal, unvalidated evolve).

        The reducers produce well-typed values, so this skips attrs' converters
        and validators: it is an order of magnitude cheaper than
        `attrs.evolve` on the per-event hot path. Outside code should build
        snapshots with the constructor or `attrs.evolve`.
        """
        new = object.__new__(Snapshot)
        fields = new.__dict__
        fields.update(self.__dict__)
        fields.update(changes)
        return new

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-compatible dict; `Snapshot.from_dict` reverses it."""
        data: dict[str, Any] = {
            "schema_version": self.schema_version,
            "phase": self.phase,
            "budget": attrs.asdict(self.budget),
            "history": [m.to_dict() for m in self.history],
            "pending": [m.to_dict() for m in self.pending],
            "inbox": [m.to_dict() for m in self.inbox],
            "estimate": self.estimate,
            "turns": self.turns,
            "overflow_retries": self.overflow_retries,
            "compactions": self.compactions,
            "output_retries": self.output_retries,
            "compact_reason": self.compact_reason,
            "message_line_spent": self.message_line_spent,
            "threshold_line_spent": self.threshold_line_spent,
            "last_reply": None
            if self.last_reply is None
            else self.last_reply.to_dict(),
            "failure": None if self.failure is None else _failure_dict(self.failure),
            "is_started": self.is_started,
        }
        if self.overflow is not None:  # left out while None: the form of before
            data["overflow"] = attrs.asdict(self.overflow)
        if not self.overflow_retries_in_a_row:  # written only for a run of before
            data["overflow_retries_in_a_row"] = False
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Snapshot:
        """Build a snapshot from `to_dict` output.

        Raises:
            ConfigError: the schema version is unknown or a field is invalid.
            InvalidMessage: `history` is not a whole conversation or
                `history + pending` not a valid prefix of one (an orphaned
                tool call or result); names the call id.
        """
        if not isinstance(data, Mapping):
            raise ConfigError("snapshot", data, "a mapping (Snapshot.to_dict output)")
        version = data.get("schema_version")
        if not _checks.is_int(version) or version != SCHEMA_VERSION:
            raise ConfigError("schema_version", version, f"{SCHEMA_VERSION}")
        try:
            snapshot = cls._from_dict(data)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            if isinstance(exc, ConfigError):
                raise
            field = exc.args[0] if isinstance(exc, KeyError) else "snapshot"
            raise ConfigError(str(field), None, f"a valid snapshot ({exc})") from exc
        # The brain's Rule 4 on the buffers (the decision-dependent part needs
        # the spec: `TurnMachine.from_snapshot` checks it).
        OpenCalls.of(snapshot.history).require_closed()
        OpenCalls.of(snapshot.pending)
        return snapshot

    @classmethod
    def _from_dict(cls, data: Mapping[str, Any]) -> Snapshot:
        def messages(name: str) -> Callable[[Any], list[Message]]:
            def read(value: Any) -> list[Message]:
                items = _checks.as_tuple(value, name, "messages")
                return [Message.from_dict(m) for m in items]

            return read

        return cls(
            phase=data["phase"],
            budget=_read(data, "budget", lambda v: Budget(**v)),
            history=_read(data, "history", messages("history")),
            pending=_read(data, "pending", messages("pending")),
            inbox=_read(data, "inbox", messages("inbox")),
            estimate=data["estimate"],
            turns=data["turns"],
            overflow_retries=data["overflow_retries"],
            compactions=data.get("compactions", 0),
            output_retries=data.get("output_retries", 0),
            overflow_retries_in_a_row=data.get("overflow_retries_in_a_row", True),
            compact_reason=_read(data, "compact_reason", _reason),
            message_line_spent=data.get("message_line_spent", False),
            threshold_line_spent=data.get("threshold_line_spent", False),
            last_reply=_read(data, "last_reply", Message.from_dict),
            failure=_read(data, "failure", _failure),
            overflow=_read(data, "overflow", lambda v: ErrorInfo(**v))
            if "overflow" in data
            else None,
            is_started=data["is_started"],
        )


def _failure_dict(failure: Failure) -> dict[str, Any]:
    """A failure's stored form, `retry_after` left out while None (as before)."""
    data = attrs.asdict(failure)
    if data["retry_after"] is None:
        del data["retry_after"]
    return data


def _failure(data: Mapping[str, Any]) -> Failure:
    """A stored failure (its `retryable` was once written ``retriable``)."""
    fields = dict(data)
    if "retriable" in fields:
        fields["retryable"] = fields.pop("retriable")
    return Failure(**fields)


def _read(data: Mapping[str, Any], name: str, build: Callable[[Any], Any]) -> Any:
    """Return `build(data[name])` (None stays None), errors naming `name`.

    A `ConfigError` from inside already names its field and passes unchanged.
    """
    value = data[name]
    if value is None:
        return None
    try:
        return build(value)
    except ConfigError:
        raise  # it names the field inside (``threshold`` of the budget)
    except (TypeError, ValueError, AttributeError) as exc:
        raise ConfigError(name, value, f"a valid {name} ({exc})") from exc


def _reason(value: object) -> CompactReason:
    if isinstance(value, str) and value in _REASONS:
        return CompactReason(value)
    raise ConfigError("compact_reason", value, "one of " + ", ".join(_REASONS))


_REASONS: Final = tuple(r.value for r in CompactReason)
