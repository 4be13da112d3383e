"""Events: what happened, fed to the brain by the driver (past tense).

Each event's trigger is the snake_case form of its class name
(`ModelReplied` -> ``"model_replied"``), derived, never retyped.

Every event is built by keyword or positionally, its fields in the order its
docstring lists them (``Measured(120)`` is ``Measured(estimate=120)``,
``Signal("revise", {"feedback": "..."})`` is ``Signal(name="revise",
data={"feedback": "..."})``); fields with a default come last.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from typing import Final, Literal, TypeAlias, final

import attrs

from turnfsm import _checks
from turnfsm.errors import ConfigError
from turnfsm.messages import Message, new_message_id
from turnfsm.values import OMITTED_IF_DEFAULT, ErrorInfo, PassPayback, Usage

__all__ = [
    "EVENT_TYPES",
    "MEASURE_SOURCES",
    "OMITTED_IF_DEFAULT",
    "PASS_EVENT_TYPES",
    "CompactionCircuitOpened",
    "CompactionNoop",
    "CompactionOverflowed",
    "CompactionResult",
    "CompactorFailed",
    "ContextOverflowed",
    "ErrorInfo",
    "Event",
    "MeasureSource",
    "Measured",
    "MessageInjected",
    "ModelFailed",
    "ModelReplied",
    "OutputRejected",
    "PassEvent",
    "RunCancelled",
    "RunStarted",
    "Signal",
    "ToolCallsReviewed",
    "ToolsFinished",
    "Usage",
    "trigger_name",
    "trigger_of",
]


_non_negative: Final = _checks.integer(low=0)

MeasureSource: TypeAlias = Literal["estimated", "calibrated", "reported"]
"""Where a `Measured` count came from (its `source`)."""

MEASURE_SOURCES: Final[tuple[MeasureSource, ...]] = (
    "estimated",
    "calibrated",
    "reported",
)
"""Every `MeasureSource`."""
_message: Final = _checks.instance(Message, "a Message")
_usage: Final = _checks.instance(Usage, "a Usage", optional=True)
_payback: Final = _checks.instance(PassPayback, "a PassPayback", optional=True)
_error: Final = _checks.instance(ErrorInfo, "an ErrorInfo")
_messages: Final = _checks.each(Message, "a Message")


def _input(value: Iterable[Message]) -> tuple[Message, ...]:
    return _checks.as_tuple(value, "input", "Message")


def _results(value: Iterable[Message]) -> tuple[Message, ...]:
    return _checks.as_tuple(value, "results", "Message")


def _compacted(value: Iterable[Message]) -> tuple[Message, ...]:
    return _checks.as_tuple(value, "messages", "Message")


@final
@attrs.frozen
class RunStarted:
    """A run began: `input` are the run's new messages (they become pending).

    Fields, in positional order: `input`.
    """

    input: tuple[Message, ...] = attrs.field(converter=_input, validator=_messages)


@final
@attrs.frozen
class Measured:
    """The driver measured the whole next request at `estimate` tokens.

    `source` says where the count came from: ``"estimated"`` (turnfsm's
    counter), ``"calibrated"`` (the counter's estimate scaled by what the
    provider reported, `ContextManager.calibrate`) or ``"reported"`` (the
    provider's count for the last call, plus the estimate of what was added
    since, `ContextManager.use_reported_usage`).

    Fields, in positional order: `estimate`, `source`.
    """

    estimate: int = attrs.field(validator=_non_negative)
    source: MeasureSource = attrs.field(
        default="estimated",
        validator=_checks.one_of(MEASURE_SOURCES),
        metadata={OMITTED_IF_DEFAULT: True},
    )


@final
@attrs.frozen
class ModelReplied:
    """The model answered with `message` (an assistant message).

    Fields, in positional order: `message`, `usage`.
    """

    message: Message = attrs.field(validator=_message)
    usage: Usage | None = attrs.field(default=None, validator=_usage)


def _strings(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(value)


def _reask_text(errors: tuple[str, ...]) -> str:
    """Return the user message that asks the model for a valid final answer."""
    lines = ["Your answer does not match the required output schema:"]
    lines += [f"- {error}" for error in errors]
    lines.append("Answer again with only the corrected JSON value.")
    return "\n".join(lines)


@final
@attrs.frozen
class OutputRejected:
    """The model's final reply did not fit the run's output type.

    `message` is the reply (it stays in the conversation, like any reply),
    `errors` each problem the driver found in it, and `feedback` the user
    message that lists them and asks again. `feedback` is made here, by
    whoever builds the event, so a replayed log gives the same history.

    Fields, in positional order: `message`, `errors`, `feedback`, `usage`.
    """

    message: Message
    errors: tuple[str, ...] = attrs.field(converter=_strings)
    feedback: Message = attrs.field()
    usage: Usage | None = None

    @feedback.default
    def _ask_again(self) -> Message:
        return Message.user(_reask_text(self.errors))


@final
@attrs.frozen
class ModelFailed:
    """The model call failed for good (the retry policy gave up).

    `usage` is what a reply that came and could not be used (cut off at its
    budget, withheld by a filter) cost, as the provider reported it; None
    when no reply came or none was reported.

    Fields, in positional order: `error`, `usage`.
    """

    error: ErrorInfo = attrs.field(validator=_error)
    usage: Usage | None = attrs.field(
        default=None, validator=_usage, metadata={OMITTED_IF_DEFAULT: True}
    )


@final
@attrs.frozen
class ContextOverflowed:
    """The provider rejected the request as longer than its context.

    Or a reply came that does not fit the window beside the request, which
    is not committed: `usage` is what that reply cost, as the provider
    reported it; None when no reply came or none was reported.

    Fields, in positional order: `error`, `usage`.
    """

    error: ErrorInfo = attrs.field(validator=_error)
    usage: Usage | None = attrs.field(
        default=None, validator=_usage, metadata={OMITTED_IF_DEFAULT: True}
    )


@final
@attrs.frozen
class ToolsFinished:
    """Every tool call of the last reply has a result in `results`.

    Fields, in positional order: `results`.
    """

    results: tuple[Message, ...] = attrs.field(converter=_results, validator=_messages)


@final
@attrs.frozen
class ToolCallsReviewed:
    """A reviewer answered a pause over the last reply's tool calls.

    `results` are the error tool results of the rejected calls; approved
    calls get none, and the next `RunTools` runs them. A result that is not
    an error is refused where the answer is given (`Pause.check_answer`),
    or where an effect of yours returns it: its call would never run, and
    the model would read it as the tool's. Build one with
    `approve_all()` or `reject(...)`: the results' message ids are made here,
    by whoever builds the event, so a replayed log gives the same history.

    Fields, in positional order: `results`.
    """

    results: tuple[Message, ...] = attrs.field(
        default=(), converter=_results, validator=_messages
    )

    @classmethod
    def approve_all(cls) -> ToolCallsReviewed:
        """Return the review that approves every call (no results)."""
        return cls()

    @classmethod
    def reject(
        cls,
        reasons: Mapping[str, str],
        *,
        new_id: Callable[[], str] = new_message_id,
    ) -> ToolCallsReviewed:
        """Return the review that rejects each call id in `reasons` with its reason.

        Each rejected call is answered by an error tool result reading
        ``rejected by the reviewer: REASON`` (``rejected by the reviewer``
        for a blank reason); the other calls are approved.
        `new_id` makes the results' message ids (a Temporal workflow passes
        its deterministic source).

        Raises:
            ConfigError: `reasons` is not a mapping of call ids to reasons,
                or is empty (it would reject nothing and approve every call:
                `approve_all` says so).
        """
        if not isinstance(reasons, Mapping) or not reasons:
            raise ConfigError(
                "reasons",
                reasons,
                "a mapping of each call id to reject to its reason, such as "
                "{'c2': 'never touch /etc'}, naming at least one call "
                "(approve_all() lets every call run)",
            )
        for call_id, reason in reasons.items():
            if not isinstance(call_id, str) or not call_id.strip():
                raise ConfigError(
                    "reasons",
                    call_id,
                    "a mapping keyed by call ids, the strings of the paused "
                    "run's Pause.calls (call.id)",
                )
            if not isinstance(reason, str):
                raise ConfigError(f"reasons[{call_id!r}]", reason, "a string")
        return cls(
            results=[
                Message.tool_result(
                    call_id,
                    f"rejected by the reviewer: {reason}"
                    if reason.strip()
                    else "rejected by the reviewer",
                    is_error=True,
                    id=new_id(),
                )
                for call_id, reason in reasons.items()
            ]
        )


@final
@attrs.frozen
class CompactionResult:
    """A compaction pass replaced the conversation with `messages`.

    `before` and `after` are the driver's measurements of the whole request;
    `payback` what the pass costs against what it saves by the prompt cache
    (None: the context manager worked out no figures).

    Fields, in positional order: `messages`, `before`, `after`, `usage`, `payback`.
    """

    messages: tuple[Message, ...] = attrs.field(
        converter=_compacted, validator=_messages
    )
    before: int = attrs.field(validator=_non_negative)
    after: int = attrs.field(validator=_non_negative)
    usage: Usage | None = attrs.field(default=None, validator=_usage)
    payback: PassPayback | None = attrs.field(default=None, validator=_payback)


@final
@attrs.frozen
class CompactionNoop:
    """A compaction pass changed nothing (no manager, a veto, nothing to cut).

    `vetoed` says a pre-compact hook stopped the pass; `payback` with
    `declined` set, that the context manager declined a result that would
    not pay back soon enough (the brain reads only the sizes; the audit
    trail and the hooks read the rest).

    Fields, in positional order: `before`, `after`, `vetoed`, `usage`, `payback`.
    """

    before: int = attrs.field(validator=_non_negative)
    after: int = attrs.field(validator=_non_negative)
    vetoed: bool = attrs.field(default=False, validator=_checks.boolean())
    usage: Usage | None = attrs.field(default=None, validator=_usage)
    payback: PassPayback | None = attrs.field(default=None, validator=_payback)


@final
@attrs.frozen
class CompactionOverflowed:
    """The compacted conversation still does not fit: `used` of `limit`.

    `before` is the conversation's size before the pass, as the pass
    measured it (None: not said).

    Fields, in positional order: `used`, `limit`, `usage`, `before`.
    """

    used: int = attrs.field(validator=_non_negative)
    limit: int = attrs.field(validator=_non_negative)
    usage: Usage | None = attrs.field(default=None, validator=_usage)
    before: int | None = attrs.field(
        default=None,
        validator=attrs.validators.optional(_non_negative),
        metadata={OMITTED_IF_DEFAULT: True},
    )


@final
@attrs.frozen
class CompactorFailed:
    """The compactor raised or reported a failure.

    Fields, in positional order: `used`, `limit`, `error`, `usage`.
    """

    used: int = attrs.field(validator=_non_negative)
    limit: int = attrs.field(validator=_non_negative)
    error: ErrorInfo = attrs.field(validator=_error)
    usage: Usage | None = attrs.field(default=None, validator=_usage)


@final
@attrs.frozen
class CompactionCircuitOpened:
    """The compaction circuit breaker is open after `failures` failures.

    Fields, in positional order: `failures`.
    """

    failures: int = attrs.field(validator=_non_negative)


@final
@attrs.frozen
class MessageInjected:
    """A message was injected from outside (steering, human input).

    Fields, in positional order: `message`.
    """

    message: Message = attrs.field(validator=_message)


@final
@attrs.frozen
class RunCancelled:
    """The run was cancelled.

    Fields, in positional order: `reason`.
    """

    reason: str = attrs.field(default="cancelled", validator=_checks.string())


@final
@attrs.frozen
class Signal:
    """A custom trigger for a user machine's own phases (declared in `signals`).

    `data` is what the signal carries. Where the machine file gives a
    transition ``message = "KEY"``, the signal's ``data["KEY"]`` joins the
    conversation as a user message, `message`: the driver builds it when it
    feeds the signal and logs it on the event (its id made from the run's id
    and the event's place in the run), so a replayed log gives the same
    history; or the event's builder gives it. `message` is stored with the
    event only when it is set.

    Fields, in positional order: `name`, `data`, `message`.
    """

    name: str = attrs.field(validator=_checks.string(non_empty=True))
    data: Mapping[str, str] = attrs.field(
        factory=dict, hash=False, validator=_checks.string_mapping()
    )
    message: Message | None = attrs.field(
        default=None,
        validator=_checks.instance(Message, "a Message", optional=True),
        metadata={OMITTED_IF_DEFAULT: True},
    )


PassEvent: TypeAlias = (
    CompactionResult
    | CompactionNoop
    | CompactionOverflowed
    | CompactorFailed
    | CompactionCircuitOpened
)
"""What one compaction pass feeds the brain: the context manager's result."""

UNUSED_REPLY_TYPES: Final = (ModelFailed, ContextOverflowed)
"""The events whose `usage` is what a reply that came and was not used cost.

Cut off at its budget, withheld by a filter, or over the window: the
provider billed it all the same, so a run's usage and cost count it.
"""

PASS_EVENT_TYPES: Final[tuple[type[PassEvent], ...]] = (
    CompactionResult,
    CompactionNoop,
    CompactionOverflowed,
    CompactorFailed,
    CompactionCircuitOpened,
)
"""Every class of `PassEvent`."""

Event: TypeAlias = (
    RunStarted
    | Measured
    | ModelReplied
    | OutputRejected
    | ModelFailed
    | ContextOverflowed
    | ToolsFinished
    | ToolCallsReviewed
    | CompactionResult
    | CompactionNoop
    | CompactionOverflowed
    | CompactorFailed
    | CompactionCircuitOpened
    | MessageInjected
    | RunCancelled
    | Signal
)
"""Any event the brain accepts."""

EVENT_TYPES: Final[tuple[type[Event], ...]] = (
    RunStarted,
    Measured,
    ModelReplied,
    OutputRejected,
    ModelFailed,
    ContextOverflowed,
    ToolsFinished,
    ToolCallsReviewed,
    CompactionResult,
    CompactionNoop,
    CompactionOverflowed,
    CompactorFailed,
    CompactionCircuitOpened,
    MessageInjected,
    RunCancelled,
    Signal,
)
"""Every event class, in a stable order."""

_CAMEL = re.compile(r"(?<!^)(?=[A-Z])")


def trigger_name(cls: type[Event]) -> str:
    """Return the trigger of an event class: its name in snake_case."""
    return _CAMEL.sub("_", cls.__name__).lower()


_TRIGGERS: Final[dict[type[Event], str]] = {
    cls: trigger_name(cls) for cls in EVENT_TYPES
}


def trigger_of(event: Event) -> str:
    """Return the trigger name of `event` (a `Signal` uses its own name)."""
    if isinstance(event, Signal):
        return event.name
    return _TRIGGERS[type(event)]
