"""Errors a run ends on: its limits, the provider, cancellation, a crash, a replay."""

from __future__ import annotations

import datetime
import warnings
from collections.abc import Iterable
from typing import Final, final

import attrs

import turnfsm
from turnfsm._waits import WAIT_ASKED, waited_for
from turnfsm.errors._base import TurnFSMError

__all__ = [
    "CONTEXT_OVERFLOW",
    "Cancelled",
    "ContinuedAsNew",
    "LogInconsistent",
    "MaxTurnsExceeded",
    "ModelServerFailed",
    "OutputInvalid",
    "PayloadTooLarge",
    "ProviderError",
    "ReplayDiverged",
    "ReplayError",
    "RunCrashed",
    "RunFailed",
    "SessionBusy",
    "SubagentFailed",
    "SubagentTooDeep",
    "SubagentTooMany",
    "SubagentWaiting",
    "TemporalUnreachable",
    "WaitTimedOut",
]


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
@attrs.frozen(auto_exc=True, init=False)
class ProviderError(TurnFSMError):
    """Raised when the model API failed and the retry policy gave up.

    Attributes:
        message: What the provider said.
        retryable: Whether the failure was transient (a rate limit, a
            timeout, a server error): the retry policy retries those.
        kind: How it failed (``"rate_limit"``, ``"context_overflow"``, ...).
        retry_after: Seconds the provider asked to wait, if it said.
        status: The HTTP status, if there was one.
        attempts: How many times the call was made before the run gave up
            (None: not counted, as when the error was raised by a client).
        elapsed: Seconds from the first attempt to the last one's failure
            (None: not counted).
        usage: What the provider reported for a reply it made, and billed,
            that the client could not use (one cut off at the model's
            window, a refusal, a paused turn): the run counts it. None
            for an error that came with no reply.
    """

    message: str
    # Stored under the key the log has always used.
    retryable: bool = attrs.field(
        default=False, metadata={"turnfsm.stored_as": "retriable"}
    )
    kind: str = "error"
    retry_after: float | None = None
    status: int | None = None
    attempts: int | None = attrs.field(default=None, kw_only=True)
    elapsed: float | None = attrs.field(default=None, kw_only=True)
    # Left out of the stored form while None (`turnfsm.core.OMITTED_IF_DEFAULT`).
    # Named through the package, which loads it when the annotation is read:
    # the values import the errors, so the errors cannot import the values.
    usage: turnfsm.Usage | None = attrs.field(
        default=None, kw_only=True, metadata={"turnfsm.omitted_if_default": True}
    )

    def __init__(
        self,
        message: str,
        retryable: bool = False,
        kind: str = "error",
        retry_after: float | None = None,
        status: int | None = None,
        *,
        attempts: int | None = None,
        elapsed: float | None = None,
        usage: turnfsm.Usage | None = None,
        retriable: bool | None = None,
    ) -> None:
        if retriable is not None:  # the old name, kept one release
            warnings.warn(
                "ProviderError(retriable=...) is deprecated and will be removed "
                "in turnfsm 0.3; use retryable=",
                DeprecationWarning,
                stacklevel=2,
            )
            retryable = retriable
        self.__attrs_init__(
            message,
            retryable,
            kind,
            retry_after,
            status,
            attempts=attempts,
            elapsed=elapsed,
            usage=usage,
        )

    @property
    def retriable(self) -> bool:
        """Whether the failure was transient (deprecated: read `retryable`)."""
        warnings.warn(
            "ProviderError.retriable is deprecated and will be removed in "
            "turnfsm 0.3; use ProviderError.retryable",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.retryable

    @property
    def is_context_overflow(self) -> bool:
        """Whether the provider said the request is longer than its context."""
        return self.kind == CONTEXT_OVERFLOW

    def __str__(self) -> str:
        text = f"model provider error [{self.kind}]: {self.message}"
        if not self.retryable or self.attempts is None:
            return text
        if text.endswith(".") and not text.endswith(".."):
            # The sentence goes on: "Connection error; tried 4 times".
            text = text[:-1]
        text += _tried(self.attempts, self.elapsed)
        if self.retry_after is not None and WAIT_ASKED not in text:
            # When to try again, as the provider's last answer said.
            text += f"; {waited_for(self.retry_after)}"
        return text


def _tried(attempts: int, elapsed: float | None) -> str:
    """Say, in words, how often a call of a retried kind was made."""
    retried = "errors of this kind are retried, as far as the RetryPolicy allows"
    if attempts == 1:
        return f"; tried once ({retried})"
    over = f" over {elapsed:.1f} s" if elapsed is not None else ""
    return f"; tried {attempts} times{over}, failing each time ({retried})"


CONTEXT_OVERFLOW = "context_overflow"
"""The `ProviderError.kind` of a provider's context-length rejection."""

CONTENT_FILTER = "content_filter"
"""The `ProviderError.kind` of a reply the provider refused or withheld.

It is also the finish reason (`ModelResponse.finish_reason`) of a reply the
provider's content filter stopped. A refusal is not retried: asked again,
the provider refuses again.
"""

CONTEXT_CHECK = "ContextCheck"
"""The error type of the run's own window check refusing a request or a reply.

Before each model call the request is measured, and each reply before it is
committed; one over the window is refused as the provider would refuse it,
with this type on the `ContextOverflowed` event's error.
"""


DURABLE_OWNER: Final = "temporal:"
"""How a durable run's workflow names itself as its session's lease owner.

``temporal:WORKFLOW_ID``: the workflow holds the session while its run runs,
paused or not.
"""


def busy_words(exc: SessionBusy, take_over: str) -> str:
    """`exc`'s message, its take-over spoken as a command line or a page does it.

    The library's words name Python's ``force=True``; on the command line
    it is `take_over` (``--force``, or the command that has it).
    """
    return str(exc).replace("with force=True", f"with {take_over}")


@final
@attrs.frozen(auto_exc=True)
class SessionBusy(TurnFSMError):
    """Raised when a run starts on a session that another run is still using.

    `run_id` names the session's open run, when there is one. When a store
    holds owner leases, `owner` names the process that holds the session,
    `alive` says whether its lease is live (its process renews it while it
    runs; one that ended unable to release it, its store down, leaves it
    live until it runs out) or expired (its process likely died), `since`
    when it took the session (seconds since the epoch, on the store's
    clock), and `until` when its lease runs out if it is not renewed (a
    process that is gone renews nothing: past it, resume and abandon take
    the run over). A durable
    run's workflow holds its session as ``temporal:WORKFLOW_ID`` while it
    runs, paused or not.
    """

    session_id: str
    run_id: str | None = None
    owner: str | None = attrs.field(default=None, kw_only=True)
    alive: bool | None = attrs.field(default=None, kw_only=True)
    since: float | None = attrs.field(default=None, kw_only=True)
    until: float | None = attrs.field(default=None, kw_only=True)

    def __str__(self) -> str:
        run = f" (run {self.run_id!r})" if self.run_id is not None else ""
        if self.owner is not None and self.alive is not None:
            held = f"{self.owner!r}{_since(self.since)}"
            workflow = self.owner.removeprefix(DURABLE_OWNER)
            if self.alive and workflow != self.owner:
                return (
                    f"session {self.session_id!r}{run} is held by its durable run, "
                    f"Temporal workflow {workflow!r}{_since(self.since)}; answer, "
                    "steer or cancel it there (DurableRun), or take it over with "
                    "force=True only once that workflow has ended without ending "
                    "the run (terminated, or failed: its DurableRun.result() "
                    "raises)"
                )
            if self.alive:
                # Live is all the store knows: a process that ended with its
                # lease unreleased (its store failed) holds it until then.
                until = _when(self.until)
                live = f"live until {until}" if until else "live"
                gone = (
                    f" (past {until}, resume and abandon take it over without it)"
                    if until
                    else ""
                )
                return (
                    f"session {self.session_id!r}{run} is held by {held}, whose "
                    f"lease is {live} (its process renews it while it runs); wait "
                    "for its run to end, or take it over with force=True only if "
                    f"you know that process is gone{gone}"
                )
            return (
                f"session {self.session_id!r}{run} was held by {held}, whose "
                "lease has expired (its process likely died); resume or abandon "
                "the run to take it over"
            )
        if self.run_id is not None:
            ids = f"{self.session_id!r}, {self.run_id!r}"
            return (
                f"session {self.session_id!r} has an open run {self.run_id!r} "
                "(paused, interrupted, or its process died); resume or abandon "
                f"it first (await agent.resume({ids}, ...) or await "
                f"agent.abandon({ids}))"
            )
        return (
            f"session {self.session_id!r} is running another run; wait for it "
            "to end (a conversation takes one run at a time), or, for another "
            "conversation, give this run a Session of its own (run(..., "
            "session=...): Session(store=agent.store) starts one, await "
            "Session.open(agent.store, ID) reopens a stored one)"
        )


def _since(since: float | None) -> str:
    """Return `` since 2026-05-09 07:35:25 UTC`` (empty for None or a bad time)."""
    when = _when(since)
    return f" since {when}" if when else ""


def _when(at: float | None) -> str:
    """Return ``2026-05-09 07:35:25 UTC`` (empty for None or a bad time)."""
    if at is None:
        return ""
    try:
        when = datetime.datetime.fromtimestamp(at, datetime.UTC)
    except (OverflowError, OSError, ValueError):
        return ""
    return f"{when:%Y-%m-%d %H:%M:%S} UTC"


class ReplayError(TurnFSMError):
    """Base class of the errors of replaying a logged run; never raised directly.

    Each names the run (`run_id`), the event where the replay stopped
    (`index`, its position among the run's events, 0-based; `event`, its
    trigger), what the log says there (`expected`) and what was found
    instead (`actual`); `entry` is that event's position in the session's
    log (`Session.entries[entry]`), when known.
    """

    run_id: str
    index: int
    event: str
    expected: str
    actual: str
    entry: int | None

    def _where(self) -> str:
        at = f" in entries[{self.entry}]" if self.entry is not None else ""
        return f"event #{self.index} ({self.event}){at}"


@final
@attrs.frozen(auto_exc=True)
class ReplayDiverged(ReplayError):
    """Raised when a run's logged events do not replay to the logged decisions.

    `index` is the first diverging event of the run, `event` its trigger;
    `expected` is what the log says the brain answered, `actual` what a
    fresh brain answers; `entry` is the event's position in the session's
    log, when known.
    """

    run_id: str
    index: int
    event: str
    expected: str
    actual: str
    entry: int | None = None

    def __str__(self) -> str:
        return (
            f"run {self.run_id!r} diverges at {self._where()}: the log says "
            f"{self.expected}, the brain says {self.actual}; the log was changed, "
            "or the machine or a guard is not the one it ran on"
        )


@final
@attrs.frozen(auto_exc=True)
class LogInconsistent(ReplayError):
    """Raised when a run's log contradicts itself, so the run cannot be replayed.

    Events out of order, repeated or missing, an event the brain cannot take
    where the log puts it, a model reply that is not the assistant message
    the run's turn records name, or a history before the run that is not a
    whole conversation: the log was changed or damaged after it was written.
    `expected` is what the rest of the log says, `actual` what the event
    carries.
    """

    run_id: str
    index: int
    event: str
    expected: str
    actual: str
    entry: int | None = None

    def __str__(self) -> str:
        return (
            f"run {self.run_id!r} cannot be replayed at {self._where()}: the log "
            f"says {self.expected}, but {self.actual}; the log was changed or "
            "damaged after it was written - restore it from a copy"
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
class RunFailed(TurnFSMError):
    """Raised by `RunResult.raise_for_failure()` for a run that ended in `failed`."""

    error: TurnFSMError

    @property
    def outcome(self) -> TurnFSMError:
        """The error the run ended with."""
        return self.error

    def __str__(self) -> str:
        return f"run failed: {self.error}"


@final
@attrs.frozen(auto_exc=True)
class SubagentFailed(TurnFSMError):
    """A sub-agent's run did not end with an answer; its parent's call gets this.

    The parent's tool call (see ``Agent.as_tool``) ends with an error result
    naming this error; the parent's run goes on. `session_id` is the child's
    session (in the parent's store; "" when it never started), `outcome`
    how its run ended, `cause` its error's type and message.
    """

    tool: str
    session_id: str
    outcome: str
    cause: str

    def __str__(self) -> str:
        if not self.session_id:  # it never started
            return f"the sub-agent {self.tool!r} did not run: {self.cause}"
        return (
            f"the sub-agent {self.tool!r} ended {self.outcome}: {self.cause} (its "
            f"run is kept as session {self.session_id!r}, in the parent agent's "
            "store)"
        )


@final
@attrs.frozen(auto_exc=True)
class SubagentTooDeep(TurnFSMError):
    """A sub-agent was asked for deeper than its tool's `max_depth` allows.

    Sub-agents that delegate to sub-agents (or to themselves) stop here: the
    call gets an error result and no child run starts.
    """

    tool: str
    depth: int
    max_depth: int

    def __str__(self) -> str:
        return (
            f"the sub-agent {self.tool!r} would run at depth {self.depth}, over "
            f"its max_depth of {self.max_depth}: answer without delegating "
            "further, or raise max_depth where it is set (the tool or the "
            "machine file)"
        )


@final
@attrs.frozen(auto_exc=True)
class SubagentWaiting(TurnFSMError):
    """A sub-agent's run paused for an answer (an approval): its caller's run stops.

    The caller's run ends ``interrupted`` with this error, its call to the
    sub-agent open: answer the caller's run (``Agent.resume`` with the
    event, or ``turnfsm approve`` on either session) and the answer goes to
    the sub-agent's run, which goes on; then the caller does. `session_id`
    and `run_id` are the paused run's (the innermost, when sub-agents nest),
    `phase` where it waits, `calls` the ids of the tool calls it waits on.
    """

    tool: str
    session_id: str
    run_id: str
    phase: str
    calls: tuple[str, ...] = ()

    def __str__(self) -> str:
        return (
            f"the sub-agent {self.tool!r} waits in {self.phase} on "
            f"{len(self.calls)} tool call(s) (session {self.session_id!r}, run "
            f"{self.run_id!r}): answer this run (`turnfsm approve` or `reject` "
            "on either session) and both go on"
        )


@final
@attrs.frozen(auto_exc=True)
class ContinuedAsNew(TurnFSMError):
    """A durable run's workflow history grew long: the run goes on in a new one.

    Temporal keeps every step of a workflow in its history, and a history
    has limits (its server ends a workflow past them). Past
    `DurableOptions.history_limit` events, or when the server suggests it,
    a durable run stops between two steps, ``interrupted`` with this error,
    and its workflow continues as new (the same workflow id, a fresh
    history), which resumes the run from its log at once. Nothing is asked
    of anyone: the error only marks, in the run's log, where it happened.
    `workflow_id` is the workflow's, `history_events` and `history_bytes`
    the size of the history it left.
    """

    workflow_id: str
    history_events: int
    history_bytes: int

    def __str__(self) -> str:
        return (
            f"the durable run goes on in a new run of Temporal workflow "
            f"{self.workflow_id!r}: its history reached {self.history_events} "
            f"events ({self.history_bytes} bytes); nothing to do, the workflow "
            "resumes it"
        )


@final
@attrs.frozen(auto_exc=True)
class PayloadTooLarge(TurnFSMError):
    """A durable run's step would carry more than Temporal takes in one payload.

    Temporal refuses an activity's input past its limit for one payload (2
    MB by default), and would fail the workflow task that scheduled it again
    and again. The run ends ``failed`` with this error instead, before the
    step: `effect` names the step (``call_llm``, ``compact``, an effect of
    your machine), `size` the bytes its activity would carry (mostly the
    conversation), `limit` the run's `DurableOptions.payload_limit`.
    `returned` is True when the step's activity made an answer past the
    limit instead (a model's reply, say): the run fails after that one
    attempt, where Temporal would run the activity again and again.
    """

    effect: str
    size: int
    limit: int
    returned: bool = False

    def __str__(self) -> str:
        if self.returned:
            return (
                f"the {self.effect!r} step of this durable run returned "
                f"{self.size:,} bytes from its activity, over "
                f"DurableOptions.payload_limit={self.limit:,} (Temporal's limit "
                "for one payload): ask for less (the model's max_tokens, a "
                "smaller answer), or raise the server's limit.blobSize.error "
                "and payload_limit with it"
            )
        return (
            f"the {self.effect!r} step of this durable run would carry "
            f"{self.size:,} bytes to its activity, over "
            f"DurableOptions.payload_limit={self.limit:,} (Temporal's limit for "
            "one payload): lower the agent's context window or its compaction "
            "threshold, or raise the server's limit.blobSize.error and "
            "payload_limit with it"
        )


@final
@attrs.frozen(auto_exc=True)
class SubagentTooMany(TurnFSMError):
    """A run asked a sub-agent tool for more sub-agents than its `max_children`.

    The call gets an error result and no child run starts; the run goes on
    (its model can do the rest itself, or in fewer, larger tasks).
    """

    tool: str
    started: int
    max_children: int

    def __str__(self) -> str:
        return (
            f"this run has started {self.started} sub-agent(s) with "
            f"{self.tool!r}, its max_children: do the rest without delegating, "
            "or in fewer, larger tasks; or raise max_children where it is set "
            "(the tool or the machine file)"
        )


def _texts(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(value)


@final
@attrs.frozen(auto_exc=True)
class ModelServerFailed(TurnFSMError, RuntimeError):
    """Raised when a local model server (`LlamaServer`) did not start.

    It exited before it answered, or did not answer within its startup
    timeout (it was stopped then). `model_path` and `port` name the server,
    `reason` says which, `lines` are the lines of its log that say why (its
    errors, else its last lines), and `log_path` is the file its whole log
    was kept in.
    """

    model_path: str
    port: int
    reason: str
    lines: tuple[str, ...] = attrs.field(default=(), converter=_texts)
    log_path: str = ""

    def __str__(self) -> str:
        said = "".join(f"\n  {line}" for line in self.lines)
        if said:
            said = f"; its log says:{said}"
        kept = f"\n(its whole log: {self.log_path})" if self.log_path else ""
        return (
            f"the llama.cpp server of {self.model_path} on port {self.port} "
            f"{self.reason}{said}{kept}"
        )


@final
@attrs.frozen(auto_exc=True)
class TemporalUnreachable(TurnFSMError):
    """Raised when the Temporal server of a durable run did not answer.

    The server is down, restarting or out of reach: `address` names it and
    `reason` says what the connection met. A started run is kept by the
    server (with a state that persists) and goes on when it is back; call
    again then. `starting` is True when the run was being started: the
    start may or may not have reached the server.
    """

    address: str
    session_id: str
    reason: str
    starting: bool = False

    def __str__(self) -> str:
        lost = f"no answer from the Temporal server at {self.address} ({self.reason})"
        if self.starting:
            return (
                f"{lost}; the durable run of session {self.session_id!r} may or "
                "may not have started: when the server is back, ask "
                f"DurableRun(client, {self.session_id!r}).status() before "
                "starting it again"
            )
        return (
            f"{lost}; the durable run of session {self.session_id!r} is kept by "
            "the server and goes on when it is back: call again then"
        )


@final
@attrs.frozen(auto_exc=True)
class WaitTimedOut(TurnFSMError, TimeoutError):
    """Raised when a durable run did not end within the wait asked for.

    ``DurableRun.result(timeout=...)``: the run goes on, kept by its
    workflow; wait again, or ask its status. `reason` says where it is, as
    `DurableRun.status` says it: running in a phase, paused for an answer,
    or stuck because its workflow task fails on its workers (then that
    failure, a `ConfigError`, is the cause).
    """

    session_id: str
    seconds: float
    reason: str

    def __str__(self) -> str:
        return (
            f"the durable run of session {self.session_id!r} did not end within "
            f"{self.seconds:g}s: {self.reason}"
        )
