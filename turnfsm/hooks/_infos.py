"""The frozen records the hooks' methods receive, one per method."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal, final

import attrs

from turnfsm import _checks
from turnfsm.core import Budget, CompactReason, Decision, Event, Step
from turnfsm.messages import Message, ToolCallPart
from turnfsm.providers import ModelRequest, ModelResponse
from turnfsm.values import Usage

__all__ = [
    "CircuitInfo",
    "CompactionDone",
    "CompactionInfo",
    "DecisionInfo",
    "ModelCallEnd",
    "ModelCallInfo",
    "OutcomeInfo",
    "PreCompact",
    "PreCompactInfo",
    "RunEndInfo",
    "RunStartInfo",
    "TextDeltaInfo",
    "TextDiscardedInfo",
    "ToolCallEnd",
    "ToolCallInfo",
    "TransitionInfo",
]


@final
@attrs.frozen(kw_only=True)
class RunStartInfo:
    """A run began, or a paused or unfinished run went on (`resumed`).

    Attributes:
        session_id: The session.
        run_id: The run.
        input: The run's new messages (empty for a resumed run).
        agent: The driver's name (`Driver.name`).
        machine: The machine's name.
        digest: The machine's digest (what the run's log is checked against).
        budget: The limits the run works within (window, lines, counts).
        model: The model's name, when the client says (``client.model``).
        provider: The provider's name (``client.provider_name``, else the
            client's class name).
        resumed: The run was resumed from its log (paused or unfinished).
        resumed_from: What the run's log said of it when it was resumed:
            ``"paused"``, ``"interrupted"`` (stopped by a cancel, Ctrl-C or
            a store that failed), or ``"running"`` (its process died while
            it ran: a crash, a kill); None for a run that begins.
    """

    session_id: str
    run_id: str
    input: tuple[Message, ...]
    agent: str = "turnfsm"
    machine: str = ""
    digest: str = ""
    budget: Budget | None = None
    model: str | None = None
    provider: str | None = None
    resumed: bool = False
    resumed_from: str | None = None


@final
@attrs.frozen(kw_only=True)
class TransitionInfo:
    """The brain moved from one phase to another (or stayed, internally).

    `estimate` is the brain's measure of the next request at that point
    (None until measured), `estimate_source` where that count came from
    (``"estimated"``, ``"calibrated"`` or ``"reported"``, as on `Measured`;
    None with no estimate), `turn` the model calls made so far.
    """

    run_id: str
    step: Step
    estimate: int | None = None
    turn: int = 0
    estimate_source: str | None = None


@final
@attrs.frozen(kw_only=True)
class DecisionInfo:
    """The brain decided; the driver is about to carry the decision out."""

    run_id: str
    phase: str
    decision: Decision
    turn: int


@final
@attrs.frozen(kw_only=True)
class OutcomeInfo:
    """The driver carried a decision out and is feeding `event` back."""

    run_id: str
    phase: str
    decision: Decision
    event: Event


@final
@attrs.frozen(kw_only=True)
class TextDeltaInfo:
    """A piece of streamed model text."""

    run_id: str
    turn: int
    text: str


@final
@attrs.frozen(kw_only=True)
class TextDiscardedInfo:
    """A streamed model-call attempt failed after sending text: that text is void.

    The pieces of `text` came to `on_text_delta`, but the attempt broke off
    (`error`): they are no part of any reply. When the retry policy tries
    again, the next attempt streams its reply from the beginning.

    Attributes:
        run_id: The run.
        turn: The turn the call serves.
        attempt: The attempt that failed (1 for the first).
        text: Every piece the attempt sent, joined.
        error: What ended the attempt.
    """

    run_id: str
    turn: int
    attempt: int
    text: str
    error: Exception


@final
@attrs.frozen(kw_only=True)
class ModelCallInfo:
    """One attempt at a model call is about to be sent.

    Every attempt is reported, retries included, and every one is followed
    by exactly one `ModelCallEnd` carrying this record, however it ends.

    Attributes:
        session_id: The session.
        run_id: The run.
        key: Names this attempt (unique in the process).
        turn: The turn the call serves (the model calls made so far, + 1).
        attempt: 1 for the first attempt, 2 for the first retry, ...
        purpose: ``"turn"`` for the agent's own call, ``"summary"`` for a
            compaction pass's summary call.
        model: The model's name, when the client says (``client.model``).
        provider: The provider's name.
        request: What is sent.
        waited: Seconds waited (the retry policy's backoff) before it.
    """

    session_id: str
    run_id: str
    key: str
    turn: int
    attempt: int
    purpose: Literal["turn", "summary"]
    model: str | None
    provider: str | None
    request: ModelRequest
    waited: float = 0.0


@final
@attrs.frozen(kw_only=True)
class ModelCallEnd:
    """A model-call attempt ended: with a reply, or an error (cancellation too).

    Attributes:
        call: The attempt's `ModelCallInfo`.
        response: The reply, or None when the attempt raised.
        error: What the attempt raised (a `ProviderError`, a timeout, the
            cancellation), or None.
        duration: Seconds the attempt took.
    """

    call: ModelCallInfo
    response: ModelResponse | None
    error: BaseException | None
    duration: float

    @property
    def usage(self) -> Usage | None:
        """The usage the reply reported, or None."""
        return self.response.usage if self.response is not None else None


@final
@attrs.frozen(kw_only=True)
class ToolCallInfo:
    """A tool call is about to run (a call a previous process ran is not).

    Attributes:
        session_id: The session.
        run_id: The run.
        turn: The turn whose reply asked for the call.
        call: The call, as the model made it.
        interrupted: The call does not run: a resumed run closes it as
            interrupted, because the process that ran it stopped (a crash,
            an interrupt) before it finished, so its effects are unknown.
            Its `ToolCallEnd` follows at once, its `result` the error result
            that says so (a tool marked `idempotent` runs again instead).
    """

    session_id: str
    run_id: str
    turn: int
    call: ToolCallPart
    interrupted: bool = False


@final
@attrs.frozen(kw_only=True)
class ToolCallEnd:
    """A tool call ended: its result message, or what stopped it.

    Attributes:
        call: The call's `ToolCallInfo`.
        result: The tool result message (an error result for a tool that
            raised, timed out or does not exist), or None when the call was
            cancelled.
        error: The cancellation that stopped it, or None.
        duration: Seconds the call took.
        raised: The exception the tool raised, with its traceback (its
            `result` is the error result the model sees), or None.
    """

    call: ToolCallInfo
    result: Message | None
    error: BaseException | None
    duration: float
    raised: Exception | None = None

    @property
    def interrupted(self) -> bool:
        """Whether the call was closed as interrupted on resume (it did not run).

        Its `result` is the error result that says so (`is_error` is True).
        """
        return self.call.interrupted

    @property
    def is_error(self) -> bool:
        """Whether the call failed (an error result, or no result at all)."""
        if self.result is None:
            return True
        return any(getattr(p, "is_error", False) for p in self.result.parts)


@final
@attrs.frozen(kw_only=True)
class RunEndInfo:
    """A run ended (or paused) in `phase`; `outcome` says how.

    Called on every outcome: done, failed, cancelled or paused; a run that
    crashed on an unexpected exception ends failed with `RunCrashed`.

    Attributes:
        run_id: The run.
        phase: The phase it ended in.
        text: The final answer (done runs).
        error: The typed cause of a failed or cancelled run.
        outcome: done, failed, cancelled or paused.
        session_id: The session.
        turns: Model calls the run made.
        usage: What the agent's model calls reported, summed.
        compaction_usage: What the compaction passes' summary calls reported.
    """

    run_id: str
    phase: str
    text: str
    error: Exception | None
    outcome: str = "done"
    session_id: str = ""
    turns: int = 0
    usage: Usage = attrs.field(factory=Usage)
    compaction_usage: Usage = attrs.field(factory=Usage)


@final
@attrs.frozen(kw_only=True)
class PreCompactInfo:
    """A compaction pass is about to run over `messages`."""

    run_id: str
    reason: CompactReason
    turn: int
    tokens_before: int
    messages: tuple[Message, ...]


def _to_pins(value: Iterable[str]) -> tuple[str, ...]:
    return _checks.as_tuple(value, "pin", "message ids (strings)")


@final
@_checks.keyword_checked
@attrs.frozen(kw_only=True)
class PreCompact:
    """A `pre_compact` hook's answer: veto the pass, or steer the compactor.

    `instructions` and `additional_context` reach the compactor through its
    `CompactionContext`. `pin` names messages (by id, from
    `PreCompactInfo.messages`) that this pass must keep word for word,
    besides the ones pinned already; an id of no message there makes the
    answer a hook error (`InvalidReturn`: the hook is logged and detached).

    Raises:
        ConfigError: `veto` is not a bool, `instructions` or
            `additional_context` is neither text nor None, or `pin` is not a
            sequence of message ids.
    """

    veto: bool = attrs.field(default=False, validator=_checks.boolean())
    instructions: str | None = attrs.field(
        default=None, validator=_checks.string(optional=True)
    )
    additional_context: str | None = attrs.field(
        default=None, validator=_checks.string(optional=True)
    )
    pin: tuple[str, ...] = attrs.field(
        default=(),
        converter=_to_pins,
        validator=_checks.each(str, "a message id (a string)"),
    )


@final
@attrs.frozen(kw_only=True)
class CompactionInfo:
    """A compaction pass finished (deprecated: `Hook.on_compaction_pass`).

    `compacted` is False for a no-op or veto.

    `outcome` is the pass's logged outcome (compacted, noop, vetoed,
    overflow, stalled, failed, circuit_open), `strategy` the compactor's
    class name, `usage` what its summary calls reported.
    """

    run_id: str
    reason: CompactReason
    turn: int
    tokens_before: int
    tokens_after: int
    messages_before: int
    messages_after: int
    compacted: bool
    vetoed: bool = False
    outcome: str = ""
    strategy: str = ""
    usage: Usage | None = None

    @property
    def tokens_saved(self) -> int:
        """Tokens the pass saved (0 for a no-op)."""
        return max(0, self.tokens_before - self.tokens_after)


@final
@attrs.frozen(kw_only=True)
class CompactionDone:
    """A pass compacted a session's conversation (deprecated).

    `Hook.on_compaction_pass` receives the pass's `CompactionRecord` instead.

    Its logged form is the run's `CompactionRecord` (outcome "compacted").

    Attributes:
        session_id: The session.
        run_id: The run the pass ran in.
        turn: The turns the run had taken.
        trigger: Why the pass ran.
        strategy: The compactor's class name.
        covers: Ids of the messages the pass was given.
        replacement: Ids of the messages that replace them.
        tokens_before: The request's size before the pass (reserved included).
        tokens_after: Its size after.
        usage: What the pass's summary-model calls reported, or None.
    """

    session_id: str
    run_id: str
    turn: int
    trigger: CompactReason
    strategy: str
    covers: tuple[str, ...]
    replacement: tuple[str, ...]
    tokens_before: int
    tokens_after: int
    usage: Usage | None = None

    @property
    def tokens_saved(self) -> int:
        """Tokens the pass saved."""
        return max(0, self.tokens_before - self.tokens_after)


@final
@attrs.frozen(kw_only=True)
class CircuitInfo:
    """A session's compaction circuit breaker opened after `failures` failures."""

    session_id: str
    run_id: str
    failures: int
