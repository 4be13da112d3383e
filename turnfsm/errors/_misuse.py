"""Errors of misuse: a bad definition, setting, message, tool, return value or feed."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, final

import attrs

from turnfsm.errors._base import TurnFSMError

__all__ = [
    "ConfigError",
    "DefinitionError",
    "EffectFailed",
    "IllegalEvent",
    "InvalidMessage",
    "InvalidReturn",
    "MachineBroken",
    "Problem",
    "ToolError",
    "WindowTooLarge",
]


@final
@attrs.frozen(kw_only=True)
class Problem:
    """One problem of a machine file: where it is, what is wrong, a likely fix.

    `str()` gives the message and the suggestion, for example
    ``transition #3 (measured): unknown guard 'is_over_treshold_line' (did you
    mean 'is_over_threshold_line'?)``.

    Attributes:
        message: what is wrong, naming the entry (``state 'call_llm'``,
            ``transition #3 (measured)``) and the value.
        line: the 1-based line of the file it is on: the line of the key or
            of the array item at fault, else of the nearest enclosing table
            written in the file (a ``[[transitions]]`` header, a state's line);
            `None` for the file as a whole (a missing top-level key) or when
            the definition came without its text (`MachineSpec.from_dict`).
        field: the path of the value in the parsed file, such as
            ``transitions[2].conditions[0]`` or ``states.call_llm`` (0-based
            indexes; ``""`` for the file as a whole).
        value: the value at fault, as parsed (`None` when it is missing).
        suggestion: the known name closest to a misspelt one, if any is close.
    """

    message: str
    line: int | None = None
    field: str = ""
    value: Any = None
    suggestion: str | None = None

    def __str__(self) -> str:
        if self.suggestion is None:
            return self.message
        return f"{self.message} (did you mean {self.suggestion!r}?)"


def _problems(value: Iterable[Problem | str]) -> tuple[Problem, ...]:
    return tuple(p if isinstance(p, Problem) else Problem(message=p) for p in value)


@final
@attrs.frozen(auto_exc=True)
class DefinitionError(TurnFSMError, ValueError):
    """Raised when a machine file is invalid; lists every problem at once.

    `problems` holds one `Problem` per fault, in the order the loader found
    them: the names and types of each entry first, then the checks of the
    graph (reachability, exits, termination, limits, cancellation) on what
    resolved. `str()` puts one problem on each line,
    ``FILE:LINE: MESSAGE (did you mean 'NAME'?)``, as compilers do, so
    editors can jump to each; a problem without a line reads ``FILE: MESSAGE``.
    Plain strings given as problems become problems without a line.
    """

    source: str
    problems: tuple[Problem, ...] = attrs.field(converter=_problems)

    def __str__(self) -> str:
        return "\n".join(
            f"{self.source}:{p.line}: {p}" if p.line else f"{self.source}: {p}"
            for p in self.problems
        )


@attrs.frozen(auto_exc=True)
class ConfigError(TurnFSMError, ValueError):
    """Raised when a setting is out of range; names the field and the value.

    A setting that was not given at all (a command line option left out)
    says so: `missing` is True and the message reads ``missing FIELD``.
    """

    field: str
    value: Any
    expected: str
    missing: bool = attrs.field(default=False, kw_only=True)

    def __str__(self) -> str:
        if self.missing:
            return f"missing {self.field}: expected {self.expected}"
        return f"invalid {self.field}={self.value!r}: expected {self.expected}"


@final
@attrs.frozen(auto_exc=True)
class WindowTooLarge(ConfigError):
    """Raised when a configured window is larger than the model's real one.

    The model's window comes from the price and limits catalogue turnfsm
    ships with (the ``genai-prices`` package), or from the llama.cpp server
    the model runs on. A request that size would be refused by the provider,
    so the setting is refused when the agent is built, before any run.

    Attributes:
        model: the model's name, as configured.
        window: the model's context window in tokens.
    """

    model: str = ""
    window: int = 0

    def __str__(self) -> str:
        return (
            f"{self.field}={self.value!r} is larger than {self.model}'s context "
            f"window of {self.window} tokens: give at most {self.window}, or "
            "leave it unset to use the model's window"
        )


@final
@attrs.frozen(auto_exc=True)
class ReserveTooLarge(ConfigError):
    """Raised when what rides every request alone fills the window.

    The system prompt, the tool schemas, the output type's schema and the
    reply budget are sent with every request, which is sent only under the
    window's emergency line (95 % of it): an agent whose window they alone
    fill to that line could send none, so it is refused when it is built.
    `field` names the largest of them.

    Attributes:
        reserved: their tokens, the reply budget included.
        window: the context window in tokens.
    """

    reserved: int = 0
    window: int = 0


@final
@attrs.frozen(auto_exc=True)
class InvalidMessage(TurnFSMError, ValueError):
    """Raised when a message or a history is malformed; names the field and value."""

    field: str
    value: Any
    reason: str

    def __str__(self) -> str:
        return f"invalid message {self.field}={self.value!r}: {self.reason}"


@final
@attrs.frozen(auto_exc=True)
class IllegalEvent(TurnFSMError):
    """Raised when an event is not accepted in the current phase (a driver bug)."""

    phase: str
    event: str

    def __str__(self) -> str:
        return (
            f"event {self.event!r} is not accepted in phase {self.phase!r}; "
            "feed only the event the last decision asked for"
        )


@final
@attrs.frozen(auto_exc=True)
class MachineBroken(TurnFSMError):
    """Raised when a machine whose earlier `handle()` raised is fed again."""

    phase: str
    cause: str

    def __str__(self) -> str:
        return (
            f"the machine broke in phase {self.phase!r} ({self.cause}); "
            "start a new machine from the last good snapshot"
        )


@final
@attrs.frozen(auto_exc=True)
class ToolError(TurnFSMError, ValueError):
    """Raised when a tool cannot be registered or described."""

    tool: str
    reason: str

    def __str__(self) -> str:
        return f"tool {self.tool!r}: {self.reason}"


@final
@attrs.frozen(auto_exc=True)
class EffectFailed(TurnFSMError):
    """Raised when an effect of yours raised: the run ends ``failed`` with it.

    An effect you register (a phase of your own, or one that replaces a
    built-in) that raises ends its run as a typed failure rather than a
    crash; the traceback goes to the ``turnfsm.driver`` logger at ERROR.
    `effect` names it, `type` and `message` say what it raised.
    """

    effect: str
    type: str
    message: str

    def __str__(self) -> str:
        return (
            f"effect {self.effect!r} raised {self.type}: {self.message} (its "
            "traceback is logged by the 'turnfsm.driver' logger); fix the effect, "
            "or make it return an event for what went wrong"
        )


@final
@attrs.frozen(auto_exc=True)
class InvalidReturn(TurnFSMError, TypeError):
    """Raised when an effect, a model, a hook or a store returns the wrong type.

    From an effect or a model, the run ends ``failed`` with this error
    (logged, like a malformed message). From a hook (an awaitable, or a
    `pre_compact` answer that is not a `PreCompact` or pins a message the
    pass does not have), it is what the hook raised: the hook is logged and
    detached, or, with ``strict_hooks``, it propagates. From a store's
    `load`, reading the session raises it.
    `source` names the effect (``effect 'call_llm'``), the model (``model
    FakeModelClient``), the hook (``hook MyHook.pre_compact``) or the store
    (``store MyStore.load``), `value` is the repr of what it returned.
    """

    source: str
    value: str
    expected: str

    def __str__(self) -> str:
        return f"{self.source} returned {self.value}: expected {self.expected}"
