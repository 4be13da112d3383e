"""The entries of a session's append-only log.

A session is a log; everything else (the working history, the audit trail of
runs, turns and compactions) is a projection of it. The driver
appends each entry as it happens:

| entry | when |
|---|---|
| `MachineStored` | a machine's definition, once per digest, before a run on it opens |
| `RunOpened` | a run begins: its budget, the machine it runs on, its context settings |
| `EventRecorded` | every event fed to the brain, in order (the replay source) |
| `TurnRecord` | every model reply: the context it saw (message ids), usage |
| `CompactionRecord` | every compaction pass, whatever it came to |
| `ToolResultRecorded` | a tool call's result, as the call finishes (in a batch) |
| `SummaryRecorded` | a committed compaction brought in a summary |
| `Committed` | the brain changed its committed history (a commit point) |
| `RunEnded` | the run ended: done, failed, cancelled or paused |
| `BreakerChanged` | the compaction circuit breaker opened, or was reset |

Message content is carried once, by the event that brought the message in;
the other entries name messages by id.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from enum import StrEnum
from types import MappingProxyType
from typing import Any, Final, Literal, TypeAlias, final

import attrs

from turnfsm import _checks, _deprecated
from turnfsm._identity import IdentityMap
from turnfsm.core import (
    OMITTED_IF_DEFAULT,
    Budget,
    CallLLM,
    Compact,
    CompactReason,
    Decision,
    Event,
    Fail,
    Finish,
    MachineSpec,
    Measure,
    Pause,
    Perform,
    RunTools,
)
from turnfsm.errors import TurnFSMError
from turnfsm.messages import JSONValue, Message
from turnfsm.persistence._context_settings import ContextSettings
from turnfsm.persistence._parent_link import ParentLink
from turnfsm.values import PassPayback, Usage

__all__ = [
    "ENTRY_TYPES",
    "OUTCOMES",
    "BreakerChanged",
    "Committed",
    "CompactionRecord",
    "Entry",
    "EventRecorded",
    "MachineStored",
    "Outcome",
    "RunEnded",
    "RunOpened",
    "SummaryRecorded",
    "ToolResultRecorded",
    "TurnRecord",
    "Verdict",
    "decision_key",
    "event_messages",
    "machine_digest",
]

Outcome: TypeAlias = Literal["done", "failed", "cancelled", "interrupted", "paused"]
"""How a run ended."""

OUTCOMES: Final[tuple[Outcome, ...]] = (
    "done",
    "failed",
    "cancelled",
    "interrupted",
    "paused",
)
"""Every run outcome."""


def _ids(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(value)


def _mapping(value: Mapping[str, JSONValue]) -> Mapping[str, JSONValue]:
    return MappingProxyType(dict(value))


def _is_time(value: object) -> bool:
    """Whether a log can hold `value` as an entry's `at`: a number, not a bool.

    An int or float that reads back as a float (an int past any float does
    not). NaN and the infinities pass: logs hold them (a run's clock was
    not always checked, and a reset took any `at`) and have always read
    them back, and this check is made again on every entry read. What
    stamps a time of its own checks that it is finite: the driver's clock
    (`_checks.clock_reading`), and `Session.reset_breaker`.
    """
    if type(value) is float:  # every reading of a clock, every entry read back
        return True
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        float(value)
    except OverflowError:  # an int past any float: the log could not read it
        return False
    return True


_AT: Final = _checks.satisfies(
    _is_time, "wall-clock seconds: an int or float (not a bool)"
)


@final
@attrs.frozen(kw_only=True)
class RunOpened:
    """A run began on `machine` (name and digest) within `budget`.

    `context` is the context settings it ran with (None: it had no context
    manager, or its log was written before they were kept). `parent` names
    the run and tool call that delegated this run to a sub-agent (None: the
    run was not delegated). `output` is the name of the structured answer it
    was asked for (its output type's; None: plain text, or its log was
    written before it was kept): a resumed run is asked for the same.
    `output_digest` is a digest of the schema of that answer, ``"text"`` for
    plain text (None: its log was written before it was kept): a run is
    resumed only with an output type of the same schema, not another of
    the same name.
    `overflow_retries_in_a_row` is True for a run whose model replies start
    the count of its overflow retries again (`Budget.max_overflow_retries`
    counts them in a row); a log written before has it False, and its runs
    replay and resume counting them over the whole run, as they ran.

    Raises:
        ConfigError: `at` is not wall-clock seconds (an int or float, not a
            bool); names `at` and the value.
    """

    run_id: str
    machine: str
    digest: str
    budget: Budget
    at: float = attrs.field(validator=_AT)
    context: ContextSettings | None = attrs.field(
        default=None, metadata={OMITTED_IF_DEFAULT: True}
    )
    parent: ParentLink | None = attrs.field(
        default=None, metadata={OMITTED_IF_DEFAULT: True}
    )
    output: str | None = attrs.field(default=None, metadata={OMITTED_IF_DEFAULT: True})
    overflow_retries_in_a_row: bool = attrs.field(
        default=False, metadata={OMITTED_IF_DEFAULT: True}
    )
    output_digest: str | None = attrs.field(
        default=None, metadata={OMITTED_IF_DEFAULT: True}
    )


@final
@attrs.frozen(kw_only=True)
class EventRecorded:
    """The `index`-th event of a run, and what the brain made of it.

    `phase` and `decision` (a `decision_key`) are what the brain answered;
    a replay checks that a fresh brain answers the same.

    Raises:
        ConfigError: `at` is not wall-clock seconds (an int or float, not a
            bool); names `at` and the value.
    """

    run_id: str
    index: int
    event: Event
    phase: str
    decision: str
    at: float = attrs.field(validator=_AT)


@final
@attrs.frozen(kw_only=True)
class TurnRecord:
    """One model call of a run: the context it saw, the reply, the usage.

    The context is written as a change from the run's previous turn, so a
    turn costs O(new messages) in the log however long the conversation is:
    the first `keep` message ids of the previous turn's context, then the
    ids in `added` (`RunRecord.context(n)` spells it out). A run's first turn
    is a change from the committed history the run opened with, so a run on
    a long session does not list that history again.

    Its two counts say where they came from: `usage` is what the provider
    reported for the call, `estimate` is turnfsm's estimate of the same
    request's input (the manager's counter over the messages, the system
    prompt and the tool schemas; no reply budget). Their ratio is what a
    calibrating `ContextManager` learns from.

    Attributes:
        run_id: The run.
        turn: The call's number in the run.
        keep: Message ids kept from the previous turn's context (the first
            turn's: from the history the run opened with).
        added: Message ids added after them.
        output: The reply's message id.
        usage: The provider's reported usage (None: it reported none).
        estimate: turnfsm's estimated input tokens of the request (None: not
            measured, as in logs written before it was recorded).
    """

    run_id: str
    turn: int
    keep: int
    added: tuple[str, ...] = attrs.field(converter=_ids, repr=False)
    output: str
    usage: Usage | None = None
    estimate: int | None = None

    @property
    def reported_ratio(self) -> float | None:
        """The provider's input tokens over `estimate`, or None without both."""
        if self.usage is None or not self.usage.input_tokens or not self.estimate:
            return None
        return self.usage.input_tokens / self.estimate


class Verdict(StrEnum):
    """What one compaction pass came to, decided once, when the brain took it."""

    COMPACTED = "compacted"
    """The pass replaced the conversation, and the brain committed it."""
    NOOP = "noop"
    """The pass changed nothing (no manager, nothing to cut, under the lines)."""
    VETOED = "vetoed"
    """A pre-compact hook stopped the pass."""
    OVERFLOW = "overflow"
    """The result, with the reserved budget, was still over the window."""
    FAILED = "failed"
    """The compactor failed, broke the conversation, or timed out."""
    CIRCUIT_OPEN = "circuit_open"
    """The session's circuit breaker was open: nothing ran."""
    STALLED = "stalled"
    """The pass saved nothing, and the brain refused it (no progress)."""


@final
@attrs.frozen(kw_only=True)
class CompactionRecord:
    """One compaction pass of a run, whatever it came to.

    Attributes:
        run_id: The run the pass ran in.
        turn: The turns taken when it ran.
        reason: Why it ran.
        strategy: The compactor's class name ("" without a context manager).
        verdict: What the pass came to (a `Verdict`): compacted, noop,
            vetoed, overflow, failed, circuit_open, or stalled (a result the
            brain refused: it saved nothing).
        covers: Ids of the messages the pass was given (history + pending).
        replacement: Ids of the messages that replace them (== covers when
            nothing was compacted).
        tokens_before: The request's size before the pass (reserved included).
        tokens_after: Its size after the pass (== before when nothing changed).
        key: The idempotency key, unique in the session.
        usage: What the pass's summary-model calls reported (None: no
            call), apart from the agent's own turns.
        payback: What the pass costs against what it saves by the prompt
            cache: the tokens whose cache it invalidates, its cost and the
            saving per later call (None: no figures, as in logs written
            before they were recorded). A pass the context manager declined
            (`cache_payback_calls`) is a noop with ``payback.declined``.
    """

    run_id: str
    turn: int
    reason: CompactReason
    strategy: str
    # Stored under the key the log has always used.
    verdict: Verdict = attrs.field(
        converter=Verdict, metadata={"turnfsm.stored_as": "outcome"}
    )
    covers: tuple[str, ...] = attrs.field(converter=_ids, repr=False)
    replacement: tuple[str, ...] = attrs.field(converter=_ids, repr=False)
    tokens_before: int
    tokens_after: int
    key: str
    usage: Usage | None = None
    payback: PassPayback | None = None

    @property
    def compacted(self) -> bool:
        """Whether the pass replaced the conversation."""
        return self.verdict is Verdict.COMPACTED

    @property
    def vetoed(self) -> bool:
        """Whether a pre-compact hook vetoed the pass."""
        return self.verdict is Verdict.VETOED

    @property
    def outcome(self) -> Verdict:
        """The pass's verdict (deprecated: read `verdict`)."""
        _deprecated.warn("CompactionRecord.outcome", "CompactionRecord.verdict")
        return self.verdict

    @property
    def tokens_saved(self) -> int:
        """Tokens the pass saved (0 unless it compacted)."""
        if not self.compacted:  # what it made was not taken
            return 0
        return max(0, self.tokens_before - self.tokens_after)


@final
@attrs.frozen(kw_only=True)
class ToolResultRecorded:
    """One tool call of the batch in flight finished with `result`.

    Written as each call finishes, before the batch's `ToolsFinished`: a run
    resumed after its process died does not run a recorded call again.
    """

    run_id: str
    index: int
    result: Message


@final
@attrs.frozen(kw_only=True)
class SummaryRecorded:
    """A committed compaction brought in a summary.

    Attributes:
        run_id: The run whose compaction committed it.
        message_id: The summary message (its content is carried by the
            compaction's event).
        content: The summary's text.
        covers_up_to_message_id: The last message the summary covers (the
            message's `SUMMARY_COVERS` metadata).
    """

    run_id: str
    message_id: str
    content: str
    covers_up_to_message_id: str


@final
@attrs.frozen(kw_only=True)
class Committed:
    """The committed history became its first `keep` messages plus `messages`."""

    run_id: str
    keep: int
    messages: tuple[str, ...] = attrs.field(converter=_ids, repr=False)


@final
@attrs.frozen(kw_only=True)
class RunEnded:
    """A run ended (or paused: `waiting` says for what).

    Raises:
        ConfigError: `at` is not wall-clock seconds (an int or float, not a
            bool); names `at` and the value.
    """

    run_id: str
    outcome: Outcome
    phase: str
    text: str = ""
    error: TurnFSMError | None = attrs.field(default=None, eq=False)
    usage: Usage = attrs.field(factory=Usage)
    turns: int = 0
    waiting: Pause | None = None
    at: float = attrs.field(default=0.0, validator=_AT)
    compaction_usage: Usage = attrs.field(factory=Usage)


@final
@attrs.frozen(kw_only=True)
class BreakerChanged:
    """The session's compaction circuit breaker opened, or was reset.

    Opened by the run whose failed pass reached the manager's
    `max_failures` (written once, on the transition); reset by an operator
    (`Session.reset_breaker`, ``turnfsm sessions reset-breaker``), outside
    any run: `run_id` is then "".

    Attributes:
        run_id: The run that opened it, or "" for an operator's reset.
        open: True: opened; False: reset (closed).
        failures: The consecutive failures counted at the change.
        at: Wall-clock seconds.

    Raises:
        ConfigError: `at` is not wall-clock seconds (an int or float, not a
            bool); names `at` and the value.
    """

    run_id: str
    open: bool
    failures: int
    at: float = attrs.field(default=0.0, validator=_AT)


@final
@attrs.frozen(kw_only=True)
class MachineStored:
    """The definition of a machine a run of the session began on.

    Written once per digest, before the first run on that machine opens: a
    run then resumes, is abandoned or is replayed on the machine it began
    on, in a process that has the store but not the machine's file.

    Attributes:
        digest: The machine's digest (`machine_digest`).
        name: The machine's name.
        definition: The machine as a file's data (`MachineSpec.to_dict`).
        phases: Its phases, in file order: the log writes a table's keys
            sorted, and the order of the phases is part of the machine.
            Empty in a log written before the order was kept.
        subagents: Its sub-agents' names, in file order, for the same reason.
        run_id: Always "": the machine belongs to the session, not a run.
    """

    digest: str
    name: str
    definition: Mapping[str, JSONValue] = attrs.field(converter=_mapping, hash=False)
    phases: tuple[str, ...] = attrs.field(
        default=(), converter=tuple, metadata={OMITTED_IF_DEFAULT: True}
    )
    subagents: tuple[str, ...] = attrs.field(
        default=(), converter=tuple, metadata={OMITTED_IF_DEFAULT: True}
    )
    run_id: str = ""

    @classmethod
    def of(cls, digest: str, definition: Mapping[str, Any]) -> MachineStored:
        """Return the entry keeping `definition` (`MachineSpec.to_dict`) as `digest`."""
        return cls(
            digest=digest,
            name=definition["name"],
            definition=definition,
            phases=tuple(definition["states"]),
            subagents=tuple(definition.get("subagents", ())),
        )

    def spec(self) -> MachineSpec:
        """Return the machine, checked again as it is read.

        Not against the rules on what a run keeps: the runs that began on it
        are finished, abandoned and replayed on it as it was, even when a
        machine file like it is refused today. The bounds (termination,
        request sizes, limits, cancellation) are checked as for any file.
        """
        definition = dict(self.definition)
        for key, order in (("states", self.phases), ("subagents", self.subagents)):
            if key in definition:
                definition[key] = _in_order(definition[key], order)
        spec = MachineSpec.from_dict(
            definition, source=f"<stored {self.name}>", recorded=True
        )
        # A log written before the order of the phases was kept reads them
        # back sorted, and the digest counts their order: the machine is the
        # one of the digest it was stored under.
        _DIGESTS.put(spec, self.digest)
        return spec


def _in_order(table: JSONValue, order: tuple[str, ...]) -> JSONValue:
    """`table` with the keys `order` names first, in that order."""
    if not order or not isinstance(table, Mapping):
        return table
    ordered = {key: table[key] for key in order if key in table}
    return ordered | {key: value for key, value in table.items() if key not in ordered}


Entry: TypeAlias = (
    MachineStored
    | RunOpened
    | EventRecorded
    | TurnRecord
    | CompactionRecord
    | ToolResultRecorded
    | SummaryRecorded
    | Committed
    | RunEnded
    | BreakerChanged
)
"""Any entry of a session's log."""

ENTRY_TYPES: Final[tuple[type[Entry], ...]] = (
    MachineStored,
    RunOpened,
    EventRecorded,
    TurnRecord,
    CompactionRecord,
    ToolResultRecorded,
    SummaryRecorded,
    Committed,
    RunEnded,
    BreakerChanged,
)
"""Every entry class, in a stable order."""


def decision_key(decision: Decision) -> str:
    """Return the short, comparable form of `decision` that the log keeps.

    It names the decision and what distinguishes it (the turn, the tool call
    ids, the reason, the error type), never whole message lists.
    """
    match decision:
        case Measure():
            return "measure"
        case CallLLM(turn=turn):
            return f"call_llm:{turn}"
        case RunTools(calls=calls):
            return "run_tools:" + ",".join(c.id for c in calls)
        case Compact(reason=reason):
            return f"compact:{reason.value}"
        case Finish():
            return "finish"
        case Fail(error=error):
            return f"fail:{type(error).__name__}"
        case Perform(effect=effect):
            return f"perform:{effect}"
        case Pause(phase=phase):
            return f"pause:{phase}"


def _decides_by(field: attrs.Attribute[Any], value: object) -> bool:
    """Whether a field of a spec goes into its digest.

    A transition's `message`, a phase's `subagent` and the machine's
    `subagents` count only when set, so the machines written before them
    keep their digests (and their runs resume). The sub-agents' own machines
    (`children`) are theirs: their runs record their digests.
    """
    if field.name in ("source", "_by_name", "_accepts", "_triggers", "children"):
        return False
    if field.name in ("message", "subagent"):
        return value is not None
    return not (field.name == "subagents" and not value)


def machine_digest(spec: MachineSpec) -> str:
    """Return a digest of what `spec` decides by (not where it was loaded from).

    Computed once per spec object (a driver built per request reuses it).
    """
    known = _DIGESTS.get(spec)
    if known is not None:
        return known
    data = attrs.asdict(spec, filter=_decides_by)
    text = json.dumps(data, sort_keys=True, default=str)
    return _DIGESTS.put(spec, hashlib.sha256(text.encode()).hexdigest()[:16])


_DIGESTS: Final[IdentityMap[MachineSpec, str]] = IdentityMap()
"""Each live spec's digest (a stored machine's is the one it was stored under)."""


def event_messages(event: Event) -> tuple[Message, ...]:
    """Return the messages `event` brings in (content is stored once, here)."""
    kind = type(event)
    names = _FIELD_NAMES.get(kind)
    if names is None:
        names = _FIELD_NAMES[kind] = tuple(f.name for f in attrs.fields(kind))
    found: list[Message] = []
    for name in names:
        value = getattr(event, name)
        if type(value) is Message:  # Message is final
            found.append(value)
        elif isinstance(value, tuple) and value and type(value[0]) is Message:
            found.extend(value)
    return tuple(found)


_FIELD_NAMES: Final[dict[type, tuple[str, ...]]] = {}
"""Event class -> its field names (`attrs.fields` is slow on the hot path)."""
