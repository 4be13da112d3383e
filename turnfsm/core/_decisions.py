"""Decisions: what the brain asks the driver to do next (imperative)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final, TypeAlias, final

import attrs

from turnfsm import _checks
from turnfsm.core._conversation_checks import NO_ANSWERS
from turnfsm.core._events import (
    EVENT_TYPES,
    MessageInjected,
    RunCancelled,
    Signal,
    ToolCallsReviewed,
    ToolsFinished,
    trigger_name,
    trigger_of,
)
from turnfsm.core._lines import CompactReason
from turnfsm.errors import ConfigError, InvalidMessage, TurnFSMError
from turnfsm.messages import Message, MessageLog, OpenCalls, ToolCallPart

__all__ = [
    "DECISION_TYPES",
    "CallLLM",
    "Compact",
    "Decision",
    "Fail",
    "Finish",
    "Measure",
    "Pause",
    "Perform",
    "RunTools",
]


_log: Final = _checks.instance(MessageLog, "a MessageLog")
_name: Final = _checks.string(non_empty=True)
_call_items: Final = _checks.each(ToolCallPart, "a ToolCallPart")


@final
@attrs.frozen(kw_only=True)
class Measure:
    """Measure the whole next request and feed `Measured(estimate)`."""

    history: MessageLog = attrs.field(validator=_log)
    pending: MessageLog = attrs.field(validator=_log)

    @property
    def messages(self) -> tuple[Message, ...]:
        """The conversation the next request would carry (history + pending)."""
        return (*self.history, *self.pending)


@final
@attrs.frozen(kw_only=True)
class CallLLM:
    """Call the model with history + pending; feed its reply or failure."""

    history: MessageLog = attrs.field(validator=_log)
    pending: MessageLog = attrs.field(validator=_log)
    turn: int = attrs.field(validator=_checks.integer(low=0))

    @property
    def messages(self) -> tuple[Message, ...]:
        """The conversation to send (history + pending)."""
        return (*self.history, *self.pending)


def _calls(value: Iterable[ToolCallPart]) -> tuple[ToolCallPart, ...]:
    return _checks.as_tuple(value, "calls", "ToolCallPart")


def _strings(value: Iterable[str]) -> tuple[str, ...]:
    return _checks.as_tuple(value, "accepts", "str")


@final
@attrs.frozen(kw_only=True)
class RunTools:
    """Run the tool `calls` of the last reply; feed `ToolsFinished`.

    `calls` are the calls that have no result yet (a reviewer may have
    answered some itself); it may be empty, then feed `ToolsFinished()`.
    """

    calls: tuple[ToolCallPart, ...] = attrs.field(
        converter=_calls, validator=_call_items
    )


@final
@attrs.frozen(kw_only=True)
class Compact:
    """Run a compaction pass over history + pending for `reason`."""

    reason: CompactReason = attrs.field(
        validator=_checks.instance(CompactReason, "a CompactReason")
    )
    history: MessageLog = attrs.field(validator=_log)
    pending: MessageLog = attrs.field(validator=_log)

    @property
    def messages(self) -> tuple[Message, ...]:
        """The conversation to compact (history + pending)."""
        return (*self.history, *self.pending)


@final
@attrs.frozen(kw_only=True)
class Finish:
    """The run is done; `text` is the final answer."""

    text: str = attrs.field(validator=_checks.string())


def _error_key(error: TurnFSMError) -> tuple[type[TurnFSMError], tuple[object, ...]]:
    # Exceptions compare by identity; a decision is a value, so two `Fail`s
    # are equal when their errors have the same type and fields (`args`).
    return (type(error), error.args)


@final
@attrs.frozen(kw_only=True)
class Fail:
    """The run failed with `error`."""

    error: TurnFSMError = attrs.field(
        eq=_error_key, validator=_checks.instance(TurnFSMError, "a TurnFSMError")
    )


@final
@attrs.frozen(kw_only=True)
class Perform:
    """Carry out the user-registered effect `effect` (a custom machine phase)."""

    effect: str = attrs.field(validator=_name)
    phase: str = attrs.field(validator=_name)


@final
@attrs.frozen(kw_only=True)
class Pause:
    """Wait for an answer from outside (a human, another system) in `phase`.

    The run ends ``paused``; it resumes when one of the `accepts` triggers is
    fed, in whatever process opens the store. `calls` are the last reply's
    unanswered tool calls the pause waits on (``tool_calls_reviewed``
    answers them).
    """

    phase: str = attrs.field(validator=_name)
    calls: tuple[ToolCallPart, ...] = attrs.field(
        converter=_calls, validator=_call_items
    )
    accepts: tuple[str, ...] = attrs.field(
        converter=_strings, validator=_checks.each(str, "a trigger name")
    )

    @property
    def takes_review(self) -> bool:
        """Whether a review of its tool calls answers it (`ToolCallsReviewed`).

        That is what ``turnfsm approve`` and ``reject`` send. A pause of a
        machine file of your own may take only signals: answer it with
        `Agent.resume` and one of them.
        """
        return _REVIEW in self.accepts

    @property
    def answers(self) -> tuple[str, ...]:
        """The triggers of the events that answer it: those it accepts from outside.

        A run's start or a step's outcome never does, whatever transition
        the phase has on it: a paused run makes no step, and such an event
        would skip every check its step makes.
        """
        return tuple(t for t in self.accepts if t not in NO_ANSWERS)

    def check_answer(self, event: object) -> None:
        """Refuse `event` unless it is an answer this pause can take.

        The answer must be an event whose trigger the phase accepts (or a
        `RunCancelled`). The tool results it carries (`ToolCallsReviewed`,
        `ToolsFinished`) must answer calls the pause waits on, each once,
        before any other message; a message it adds (`MessageInjected`, a
        `Signal`'s message) carries no tool calls or tool results. Every way
        of answering a paused run asks this before anything is written: a
        refused answer leaves the run paused, to be answered again, where
        feeding it would end the run failed.

        Raises:
            ConfigError: `event` is not such an answer; names the field and
                the value (the call id, with the ids the pause waits on; or
                the message at fault, ``event.results[i]``, a review's result
                that is not an error among them).
        """
        answers = self.answers
        if not isinstance(event, EVENT_TYPES) or (
            trigger_of(event) not in answers and not isinstance(event, RunCancelled)
        ):
            raise ConfigError(
                "event",
                event,
                f"an event the paused phase {self.phase!r} accepts: "
                + ", ".join(answers)
                + self._how_to_answer(event),
            )
        if isinstance(event, ToolCallsReviewed | ToolsFinished):
            self._check_results(
                event.results, review=isinstance(event, ToolCallsReviewed)
            )
        elif isinstance(event, MessageInjected | Signal):
            message = event.message
            if message is not None and (message.tool_calls or message.tool_results):
                raise ConfigError(
                    "event.message",
                    message.id,
                    "a message without tool calls or tool results (their other "
                    "half could never follow)",
                )

    def _how_to_answer(self, value: object) -> str:
        """`` (...)``: how `value`, which is no answer, is made one, if it shows."""
        if isinstance(value, type) and issubclass(value, EVENT_TYPES):
            return " (an instance, not the class)"
        maker = getattr(value, "__self__", None)
        if isinstance(maker, type) and issubclass(maker, EVENT_TYPES):
            name = getattr(value, "__name__", "")
            return f" (call it: {maker.__name__}.{name}())"
        if _REVIEW in self.accepts and not isinstance(value, EVENT_TYPES):
            return " (ToolCallsReviewed.approve_all() lets every call run)"
        return ""

    def _check_results(
        self, results: tuple[Message, ...], *, review: bool = False
    ) -> None:
        """Refuse `results` unless they answer the waited calls as the brain checks.

        A review's (`review`) tool results are the error results of the
        calls it rejects: a call it answers with a success would never run,
        and the model would read the reviewer's text as the tool's result.
        The message at fault is named by its place, ``event.results[i]``.
        """
        waited = tuple(call.id for call in self.calls)
        listed = ", ".join(waited) or "none"
        state = OpenCalls(ids=waited)
        for i, message in enumerate(results):
            if review and any(not r.is_error for r in message.tool_results):
                raise ConfigError(
                    f"event.results[{i}]",
                    message,
                    "an error tool result, the answer to a call the reviewer "
                    "rejects (ToolCallsReviewed.reject makes them): a call the "
                    "reviewer approves gets no result and runs",
                )
            try:
                state = state.then((message,))
            except InvalidMessage as exc:
                if exc.field == "tool_result.call_id":
                    raise ConfigError(
                        "event.results.call_id",
                        exc.value,
                        "the id of a tool call the paused run waits on "
                        f"({listed}), each answered once",
                    ) from None
                raise ConfigError(
                    f"event.results[{i}]",
                    message,
                    f"a tool result for call {exc.value!r} before any other "
                    f"message (the paused run waits on {listed})",
                ) from None


Decision: TypeAlias = (
    Measure | CallLLM | RunTools | Compact | Finish | Fail | Perform | Pause
)
"""Any decision the brain emits."""

DECISION_TYPES: Final[tuple[type[Decision], ...]] = (
    Measure,
    CallLLM,
    RunTools,
    Compact,
    Finish,
    Fail,
    Perform,
    Pause,
)
"""Every decision class, in a stable order."""


_REVIEW: Final = trigger_name(ToolCallsReviewed)
