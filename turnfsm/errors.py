"""Every exception turnfsm raises, in one tree.

```
TurnFSMError                 base class; never raised directly
├── DefinitionError          (ValueError) a machine file is invalid; .problems
├── ConfigError              (ValueError) a setting is out of range; field, value
├── InvalidMessage           (ValueError) a malformed message or history; field
├── IllegalEvent             event not accepted in this phase (a driver bug)
├── MachineBroken            an earlier handle() raised; no further input
├── ContextExceeded          the run could not fit the window; .used, .limit, .largest
│   ├── CompactionStalled    no-progress guard fired; .limit is the size before the pass
│   └── CompactionFailed     the compactor failed; .cause
├── CompactionCircuitOpen    the compaction circuit breaker is open
├── CompactionLimitExceeded  the run used all its compaction passes
├── MaxTurnsExceeded         the run used all its model calls
├── OutputInvalid            the final answer never fit the output type; .errors
├── Cancelled                the run was cancelled through ``TurnMachine.cancel()``
├── ProviderError            the model API failed after retries; .retriable
├── SessionBusy              another run is using the session (or one is open)
├── ReplayDiverged           a logged run does not replay to its logged decisions
├── RunCrashed               a run ended on an unexpected exception (logged)
├── InvalidReturn            (TypeError) an effect or a model returned the wrong type
├── ToolError                a tool could not be registered or described
├── StoreError               a record could not be loaded or saved
│   ├── CorruptRecord        (ValueError) stored data does not read back; .path
│   ├── SessionConflict      another writer appended to the session first
│   ├── DuplicateRecord      an append repeats a compaction's idempotency key
│   └── StoreUnusable        a store file or database cannot be used; .path, .reason
└── RunFailed                raised by ``RunResult.raise_for_failure()``; .outcome
```

Expected failures of a run (a compaction that cannot shrink, a provider that
keeps failing) are *outcomes*: the run ends in the ``failed`` phase and the
error is carried on the `RunResult`. Only misuse and bad configuration raise at
the call site.

`LargeItem` and `Problem` are not errors: they are the plain values a
`ContextExceeded` lists in `largest` to say what filled the window, and a
`DefinitionError` in `problems` to say what is wrong with a machine file, where.

This module imports no other turnfsm module, so every module may import it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final, Literal, final

import attrs

__all__ = [
    "CONTEXT_OVERFLOW",
    "Cancelled",
    "CompactionCircuitOpen",
    "CompactionFailed",
    "CompactionLimitExceeded",
    "CompactionStalled",
    "ConfigError",
    "ContextExceeded",
    "CorruptRecord",
    "DefinitionError",
    "DuplicateRecord",
    "IllegalEvent",
    "InvalidMessage",
    "InvalidReturn",
    "LargeItem",
    "MachineBroken",
    "MaxTurnsExceeded",
    "OutputInvalid",
    "Problem",
    "ProviderError",
    "ReplayDiverged",
    "RunCrashed",
    "RunFailed",
    "SessionBusy",
    "SessionConflict",
    "StoreError",
    "StoreUnusable",
    "ToolError",
    "TurnFSMError",
]


class TurnFSMError(Exception):
    """Base class of every turnfsm exception; never raised directly."""


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


@final
@attrs.frozen(auto_exc=True)
class ConfigError(TurnFSMError, ValueError):
    """Raised when a setting is out of range; names the field and the value."""

    field: str
    value: Any
    expected: str

    def __str__(self) -> str:
        return f"invalid {self.field}={self.value!r}: expected {self.expected}"


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


_KINDS: Final = ("tool_result", "tool_call", "message")


@final
@attrs.frozen(kw_only=True)
class LargeItem:
    """One big piece of a context: a tool result, a tool call or a message's text.

    A `ContextExceeded` lists the largest ones in `largest`, so its message
    says what filled the window (`largest_items` finds them, `explain` fills them).

    Attributes:
        kind: ``"tool_result"``, ``"tool_call"`` or ``"message"`` (the text
            parts of one message).
        role: the role of the message holding it.
        turn: the 1-based turn it is in; a turn starts at each user message,
            and items before the first user message are in turn 0.
        index: the position of its message in the context.
        tokens: its size, by the run's counter.
        tool: the tool's name for a tool call or result (a result's is found
            from the call it answers; ``""`` if unknown); ``""`` otherwise.
        call_id: the tool call's id for a tool call or result; ``""`` otherwise.
    """

    kind: Literal["tool_result", "tool_call", "message"] = attrs.field(
        validator=attrs.validators.in_(_KINDS)
    )
    role: str
    turn: int
    index: int
    tokens: int
    tool: str = ""
    call_id: str = ""

    def __str__(self) -> str:
        call = f" (call {self.call_id})" if self.call_id else ""
        match self.kind:
            case "tool_result":
                what = f"tool result of {self.tool}" if self.tool else "tool result"
            case "tool_call":
                what = f"tool call to {self.tool}" if self.tool else "tool call"
            case _:
                what, call = f"{self.role} message #{self.index}", ""
        when = f"in turn {self.turn}" if self.turn else "before the first turn"
        return f"{what}{call} {when}: {self.tokens:,} tokens"


def _items(value: Iterable[LargeItem]) -> tuple[LargeItem, ...]:
    return tuple(value)


def _largest_text(largest: tuple[LargeItem, ...]) -> str:
    """Return the ``"; largest: ..."`` tail of a `ContextExceeded` message."""
    if not largest:
        return ""
    items = ", ".join(str(item) for item in largest)
    # The hint follows where the listed tokens are: tool results shrink in
    # place (digested), anything else only by summarising the old turns.
    results = sum(i.tokens for i in largest if i.kind == "tool_result")
    if 2 * results >= sum(i.tokens for i in largest):
        hint = "ToolResultDigest or LayeredCompactor shrink tool results"
    else:
        hint = "SummarizingCompactor summarises old turns"
    return f"; largest: {items}; {hint}"


@attrs.frozen(auto_exc=True)
class ContextExceeded(TurnFSMError):
    """Raised when a run could not fit the context window.

    `used` and `limit` are payload-comparable token estimates. `limit` is the
    window when the compacted result still did not fit. `largest` lists the
    biggest items of the context, biggest first (empty when not measured);
    the message then names them and the strategy that would shrink them.
    """

    used: int
    limit: int
    largest: tuple[LargeItem, ...] = attrs.field(
        default=(), converter=_items, kw_only=True
    )

    def __str__(self) -> str:
        return (
            f"context exceeded: {self.used} tokens used, limit {self.limit}; "
            "use a bigger window or a compactor that shrinks harder"
        ) + _largest_text(self.largest)


@final
@attrs.frozen(auto_exc=True)
class CompactionStalled(ContextExceeded):
    """Raised when a compaction pass saved nothing (the no-progress guard).

    `used` is the size after the pass and `limit` the size before it; a
    pre-compact hook that vetoes over the line ends here too.
    """

    def __str__(self) -> str:
        return (
            f"compaction stalled: {self.used} tokens after the pass, "
            f"{self.limit} before; nothing was saved (a vetoing hook or a "
            "conversation the compactor cannot cut) - see what is biggest, "
            "choose a strategy that shrinks it, or a bigger window"
        ) + _largest_text(self.largest)


@final
@attrs.frozen(auto_exc=True)
class CompactionFailed(ContextExceeded):
    """Raised when the compactor itself failed; `cause` says why."""

    cause: str = ""

    def __str__(self) -> str:
        return (
            f"compaction failed at {self.used} tokens (limit {self.limit}): "
            f"{self.cause}"
        ) + _largest_text(self.largest)


@final
@attrs.frozen(auto_exc=True)
class CompactionCircuitOpen(TurnFSMError):
    """Raised when the compaction circuit breaker is open and refuses to run."""

    failures: int

    def __str__(self) -> str:
        return (
            f"compaction circuit open after {self.failures} consecutive failures; "
            "reset the breaker once the summary model is healthy"
        )


@final
@attrs.frozen(auto_exc=True)
class CompactionLimitExceeded(TurnFSMError):
    """Raised when a run used all of its `max_compactions` compaction passes."""

    max_compactions: int

    def __str__(self) -> str:
        return (
            f"the run reached max_compactions={self.max_compactions} compaction "
            "passes without a request that fits; raise max_compactions, or check "
            "for a hook that adds a message after every pass"
        )


@final
@attrs.frozen(auto_exc=True)
class MaxTurnsExceeded(TurnFSMError):
    """Raised when a run used all of its `max_turns` model calls."""

    max_turns: int

    def __str__(self) -> str:
        return (
            f"the run reached max_turns={self.max_turns} without a final answer; "
            "raise max_turns or check the tools for a loop"
        )


def _strings(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(value)


@final
@attrs.frozen(auto_exc=True)
class OutputInvalid(TurnFSMError):
    """Raised when the model's final answer never fit the run's output type.

    The model was asked again `retries` times (`max_output_retries`);
    `errors` lists what was wrong with its last answer.
    """

    errors: tuple[str, ...] = attrs.field(converter=_strings)
    retries: int = 0

    def __str__(self) -> str:
        listed = "; ".join(self.errors) or "(no detail)"
        return (
            f"the final answer did not fit the output type after {self.retries} "
            f"re-ask(s): {listed}; raise max_output_retries or simplify the type"
        )


@final
@attrs.frozen(auto_exc=True)
class Cancelled(TurnFSMError):
    """Raised when a run was cancelled through `TurnMachine.cancel()`."""

    reason: str = "cancelled"

    def __str__(self) -> str:
        return f"run cancelled: {self.reason}"


@final
@attrs.frozen(auto_exc=True)
class ProviderError(TurnFSMError):
    """Raised when the model API failed and the retry policy gave up."""

    message: str
    retriable: bool = False
    kind: str = "error"
    retry_after: float | None = None
    status: int | None = None

    @property
    def is_context_overflow(self) -> bool:
        """Whether the provider said the request is longer than its context."""
        return self.kind == CONTEXT_OVERFLOW

    def __str__(self) -> str:
        hint = " (transient; retries exhausted)" if self.retriable else ""
        return f"model provider error [{self.kind}]{hint}: {self.message}"


CONTEXT_OVERFLOW = "context_overflow"
"""The `ProviderError.kind` of a provider's context-length rejection."""


@final
@attrs.frozen(auto_exc=True)
class SessionBusy(TurnFSMError):
    """Raised when a run starts on a session that another run is still using."""

    session_id: str
    run_id: str | None = None

    def __str__(self) -> str:
        if self.run_id is not None:
            return (
                f"session {self.session_id!r} has an open run {self.run_id!r} "
                "(paused, or its process died); resume or abandon it first"
            )
        return (
            f"session {self.session_id!r} is running another run; wait for it, "
            "or give this run its own Session"
        )


@final
@attrs.frozen(auto_exc=True)
class ToolError(TurnFSMError, ValueError):
    """Raised when a tool cannot be registered or described."""

    tool: str
    reason: str

    def __str__(self) -> str:
        return f"tool {self.tool!r}: {self.reason}"


class StoreError(TurnFSMError):
    """Base class of the errors of loading and saving records; never raised directly.

    A load or save that failed, an unknown schema version and a write
    conflict are store errors.
    """


@final
@attrs.frozen(auto_exc=True)
class CorruptRecord(StoreError, ValueError):
    """Raised when stored data does not read back as the record it should be.

    `type` names what was being read (``"Snapshot"``, ``"Event"``), `path`
    where in the data the problem is (``"events[3].message.parts"``; empty
    for the whole value) and `reason` what is wrong there. An unknown schema
    version is a corrupt record too (its `path` is ``"v"``).
    """

    type: str
    path: str
    reason: str

    def __str__(self) -> str:
        where = f" at {self.path}" if self.path else ""
        return (
            f"corrupt {self.type} record{where}: {self.reason}; it was written "
            "by another turnfsm version or changed since"
        )


@final
@attrs.frozen(auto_exc=True)
class SessionConflict(StoreError):
    """Raised when an append finds the session's log at another version.

    Another writer (a second process, host or `Session` view) appended first;
    nothing of this append was written.
    """

    session_id: str
    expected: int
    actual: int

    def __str__(self) -> str:
        return (
            f"session {self.session_id!r} changed under this writer: expected "
            f"version {self.expected}, found {self.actual}; another writer "
            "appended first - reload the session and retry"
        )


@final
@attrs.frozen(auto_exc=True)
class DuplicateRecord(StoreError):
    """Raised when an append carries a compaction key the session already holds.

    A compaction record's idempotency `key` is unique in its session, so a
    pass that was already logged (a retried or redone append) is not logged
    twice; nothing of this append was written.
    """

    session_id: str
    key: str

    def __str__(self) -> str:
        return (
            f"session {self.session_id!r} already holds the compaction record "
            f"with key {self.key!r}; nothing was appended - reload the session, "
            "the pass is logged already"
        )


@final
@attrs.frozen(auto_exc=True)
class StoreUnusable(StoreError):
    """Raised when a store's file or database cannot be used; it was left unchanged.

    `path` names the file (or database) and `reason` what is wrong with it:
    not an SQLite file, another application's database, or a schema newer
    than this turnfsm knows.
    """

    path: str
    reason: str

    def __str__(self) -> str:
        return (
            f"cannot use {self.path} as a turnfsm session store: {self.reason} "
            "(nothing was changed)"
        )


@final
@attrs.frozen(auto_exc=True)
class ReplayDiverged(TurnFSMError):
    """Raised when a run's logged events do not replay to the logged decisions.

    `index` is the first diverging event of the run, `event` its trigger;
    `expected` is what the log says the brain answered, `actual` what a
    fresh brain answers.
    """

    run_id: str
    index: int
    event: str
    expected: str
    actual: str

    def __str__(self) -> str:
        return (
            f"run {self.run_id!r} diverges at event #{self.index} ({self.event}): "
            f"the log says {self.expected}, the brain says {self.actual}; the log "
            "was changed, or the machine or a guard is not the one it ran on"
        )


@final
@attrs.frozen(auto_exc=True)
class RunCrashed(TurnFSMError):
    """Raised when a run ended on an unexpected exception; logged as its error.

    The exception itself (a bug in an effect, a tool wrapper, a hook or a
    store) propagated to the caller; the run's log records it as this value.
    """

    type: str
    message: str

    def __str__(self) -> str:
        return f"run crashed on {self.type}: {self.message}"


@final
@attrs.frozen(auto_exc=True)
class InvalidReturn(TurnFSMError, TypeError):
    """Raised when an effect or a model returns a value of the wrong type.

    The run ends ``failed`` with this error (logged, like a malformed
    message): `source` names the effect (``effect 'call_llm'``) or the model
    (``model FakeModelClient``), `value` is the repr of what it returned.
    """

    source: str
    value: str
    expected: str

    def __str__(self) -> str:
        return f"{self.source} returned {self.value}: expected {self.expected}"


@final
@attrs.frozen(auto_exc=True)
class RunFailed(TurnFSMError):
    """Raised by `RunResult.raise_for_failure()` for a run that ended in `failed`."""

    error: TurnFSMError

    @property
    def outcome(self) -> TurnFSMError:
        """The error the run ended with."""
        return self.error

    def __str__(self) -> str:
        return f"run failed: {self.error}"
