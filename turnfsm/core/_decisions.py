"""Decisions: what the brain asks the driver to do next (imperative)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final, TypeAlias, final

import attrs

from turnfsm.core._lines import CompactReason
from turnfsm.errors import TurnFSMError
from turnfsm.messages import Message, MessageLog, ToolCallPart

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


@final
@attrs.frozen(kw_only=True)
class Measure:
    """Measure the whole next request and feed `Measured(estimate)`."""

    history: MessageLog
    pending: MessageLog

    @property
    def messages(self) -> tuple[Message, ...]:
        """The conversation the next request would carry (history + pending)."""
        return (*self.history, *self.pending)


@final
@attrs.frozen(kw_only=True)
class CallLLM:
    """Call the model with history + pending; feed its reply or failure."""

    history: MessageLog
    pending: MessageLog
    turn: int

    @property
    def messages(self) -> tuple[Message, ...]:
        """The conversation to send (history + pending)."""
        return (*self.history, *self.pending)


def _calls(value: Iterable[ToolCallPart]) -> tuple[ToolCallPart, ...]:
    return tuple(value)


def _strings(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(value)


@final
@attrs.frozen(kw_only=True)
class RunTools:
    """Run the tool `calls` of the last reply; feed `ToolsFinished`.

    `calls` are the calls that have no result yet (a reviewer may have
    answered some itself); it may be empty, then feed `ToolsFinished()`.
    """

    calls: tuple[ToolCallPart, ...] = attrs.field(converter=_calls)


@final
@attrs.frozen(kw_only=True)
class Compact:
    """Run a compaction pass over history + pending for `reason`."""

    reason: CompactReason
    history: MessageLog
    pending: MessageLog

    @property
    def messages(self) -> tuple[Message, ...]:
        """The conversation to compact (history + pending)."""
        return (*self.history, *self.pending)


@final
@attrs.frozen(kw_only=True)
class Finish:
    """The run is done; `text` is the final answer."""

    text: str


def _error_key(error: TurnFSMError) -> tuple[type[TurnFSMError], tuple[object, ...]]:
    # Exceptions compare by identity; a decision is a value, so two `Fail`s
    # are equal when their errors have the same type and fields (`args`).
    return (type(error), error.args)


@final
@attrs.frozen(kw_only=True)
class Fail:
    """The run failed with `error`."""

    error: TurnFSMError = attrs.field(eq=_error_key)


@final
@attrs.frozen(kw_only=True)
class Perform:
    """Carry out the user-registered effect `effect` (a custom machine phase)."""

    effect: str
    phase: str


@final
@attrs.frozen(kw_only=True)
class Pause:
    """Wait for an answer from outside (a human, another system) in `phase`.

    The run ends ``paused``; it resumes when one of the `accepts` triggers is
    fed, in whatever process opens the store. `calls` are the last reply's
    unanswered tool calls the pause waits on (``tool_calls_reviewed``
    answers them).
    """

    phase: str
    calls: tuple[ToolCallPart, ...] = attrs.field(converter=_calls)
    accepts: tuple[str, ...] = attrs.field(converter=_strings)


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
