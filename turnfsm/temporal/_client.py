"""Starting a durable run and steering it: `start_durable` and `DurableRun`."""

from __future__ import annotations

import logging
import re
import time
import weakref
from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import Any, Final, final

import anyio.lowlevel
import attrs
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import (
    DescribeNamespaceRequest,
    DescribeTaskQueueRequest,
    GetWorkflowExecutionHistoryReverseRequest,
)
from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowQueryFailedError,
    WorkflowQueryRejectedError,
    WorkflowUpdateFailedError,
    WorkflowUpdateRPCTimeoutOrCancelledError,
)
from temporalio.common import (
    QueryRejectCondition,
    WorkflowIDConflictPolicy,
    WorkflowIDReusePolicy,
)
from temporalio.exceptions import (
    ApplicationError,
    CancelledError,
    TerminatedError,
    WorkflowAlreadyStartedError,
)
from temporalio.service import RPCError, RPCStatusCode

from turnfsm import _checks, serde
from turnfsm._checks import check_id
from turnfsm.agent import Agent
from turnfsm.core import EVENT_TYPES, Event, ToolCallsReviewed
from turnfsm.driver import InvalidArguments, OutputType, RunResult, as_messages
from turnfsm.errors import (
    DURABLE_OWNER,
    Cancelled,
    ConfigError,
    RunCrashed,
    SessionBusy,
    SessionNotFound,
    TemporalUnreachable,
    WaitTimedOut,
)
from turnfsm.messages import Message
from turnfsm.persistence import machine_digest, new_id
from turnfsm.temporal._activities import TURNFSM_ERROR, failure_error
from turnfsm.temporal._payloads import (
    MAX_TASK_TIMEOUT,
    WORKFLOW,
    DurableOptions,
    RunSpec,
    RunStatus,
    payload_size,
    workflow_id_of,
)

__all__ = ["DurableRun", "sdk_reason", "start_durable"]

logger = logging.getLogger("turnfsm.temporal")

_SHOWN: Final = 80
"""Characters of a long message an error about it shows."""

_DEFAULT_LIMIT: Final = attrs.fields(DurableOptions).payload_limit.default
"""`DurableOptions.payload_limit` when the caller does not choose it."""

_TASK_EVENTS: Final = 20
"""The newest events of a workflow read for why its task fails (the failure
is among the last few: scheduled, started, failed, then its retries)."""

_FRESH: Final = 90.0
"""Seconds since a worker's last poll within which it counts as serving: a
live worker polls again at least each minute (Temporal's long poll)."""

_OVERHEAD: Final = 1024
"""Bytes Temporal adds to a payload besides its JSON (encoding, names)."""


_WATCH_FIRST: Final = 2.0
"""Seconds `DurableRun.result` waits before it first asks whether the run's
workflow task fails on its workers; each wait after is twice the last."""

_WATCH_MOST: Final = 60.0
"""The longest wait between two of those asks."""

_STATUS_WAIT: Final = 10.0
"""Seconds a timed-out `DurableRun.result` asks the run's status for at most."""

_check_timeout = _checks.seconds("timeout")


_SERVER_LIMITS: Final[weakref.WeakKeyDictionary[Client, int | None]] = (
    weakref.WeakKeyDictionary()
)
"""Each client's server limit, once its namespace said it (`server_payload_limit`)."""


async def server_payload_limit(client: Client) -> int | None:
    """The most bytes the client's Temporal server takes in one payload.

    Its ``limit.blobSize.error`` as the namespace reports it, less what
    Temporal adds to the JSON; None when the server does not say, or could
    not be asked (a caller's own deadline goes on as itself). Asked once
    per client: every start and every steering call of it reads that answer.
    """
    if client in _SERVER_LIMITS:
        return _SERVER_LIMITS[client]
    try:
        described = await client.workflow_service.describe_namespace(
            DescribeNamespaceRequest(namespace=client.namespace)
        )
    except RPCError:
        await anyio.lowlevel.checkpoint_if_cancelled()
        return None  # not said this time: each caller's own check stands
    limit = described.namespace_info.limits.blob_size_limit_error
    said = _SERVER_LIMITS[client] = limit - _OVERHEAD if limit > _OVERHEAD else None
    return said


async def queue_polled(client: Client, task_queue: str) -> bool:
    """Whether a worker polled `task_queue` for workflow tasks lately.

    Temporal lists a queue's pollers of the last few minutes, a worker
    killed meanwhile too: one counts if it polled in the last 90 seconds.
    A server that cannot say counts as polled (nothing to advise).
    """
    try:
        described = await client.workflow_service.describe_task_queue(
            DescribeTaskQueueRequest(
                namespace=client.namespace,
                task_queue=TaskQueue(name=task_queue),
                task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
            )
        )
    except RPCError:
        await anyio.lowlevel.checkpoint_if_cancelled()
        return True
    now = time.time()
    return any(
        now - poller.last_access_time.ToSeconds() < _FRESH
        for poller in described.pollers
    )


def _clipped(value: object) -> object:
    """`value` as an error shows it: a long one, its first characters and its length."""
    if isinstance(value, str):
        if len(value) <= _SHOWN:
            return value
        return f"{value[:_SHOWN]}... ({len(value):,} characters)"
    if value is None or isinstance(value, bool | int | float):
        return value
    shown = repr(value)
    if len(shown) <= 2 * _SHOWN:
        return value
    return f"{shown[:_SHOWN]}... ({len(shown):,} characters)"


def _input_shown(messages: Iterable[Message]) -> object:
    """A run's input as an error shows it: its texts, clipped."""
    texts = [m.text for m in messages]
    return _clipped(texts[0] if len(texts) == 1 else texts)


def _past_server(name: str, value: object, size: int, limit: int) -> ConfigError:
    return ConfigError(
        name,
        value,
        f"at most {limit:,} bytes, what this Temporal server takes in one "
        f"payload (its limit.blobSize.error, less a margin); this one is {size:,}",
    )


@final
class DurableRun:
    """A run executing as a Temporal workflow: wait for it, answer it, steer it.

    Get one from `Agent.start_durable` (or `start_durable`); another process
    reaches the same run with ``DurableRun(client, session_id, agent=agent)``,
    a sub-agent's run (a child workflow) too, by its session id.

    Each method raises `SessionNotFound` when Temporal knows no durable run
    of the session. Answering, steering and asking the status need a worker
    serving the run's queue, and wait for one: bound the wait with
    `anyio.fail_after`, whose `TimeoutError` comes through as usual. Each
    raises `TemporalUnreachable` when the Temporal server does not answer
    (down, restarting): the run is kept there; call again when it is back.
    """

    __slots__ = ("_agent", "_client", "_handle", "session_id")

    def __init__(
        self,
        client: Client,
        session_id: str,
        *,
        agent: Agent | None = None,
        handle: WorkflowHandle[Any, Any] | None = None,
    ) -> None:
        """Attach to the workflow of `session_id`'s latest durable run.

        Args:
            client: A connected Temporal client.
            session_id: The run's session.
            agent: The agent (reads a structured answer into
                `RunResult.output`); optional.
            handle: The workflow's handle, when the caller holds it.
        """
        self.session_id = check_id("session_id", session_id)
        self._agent = agent
        self._client = client
        self._handle = handle or client.get_workflow_handle(workflow_id_of(session_id))

    @property
    def workflow_id(self) -> str:
        """The workflow's id (``turnfsm-SESSION``)."""
        return self._handle.id

    @property
    def handle(self) -> WorkflowHandle[Any, Any]:
        """The Temporal workflow handle (for anything not wrapped here)."""
        return self._handle

    # A timeout of its own, not only a caller's `anyio.fail_after`: when it
    # runs out, the error says where the run is and why it does not end.
    async def result(
        self,
        *,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> RunResult[Any]:
        """Wait for the run to end (or pause for good) and return its result.

        A run that failed is an outcome, as in-process (`RunResult.error`).

        While it waits, it watches the run's workflow: when its task fails
        on the workers, again and again (workers serving another build of
        the agent), or when no worker has asked its task queue for work
        lately (none started yet, a misspelt queue, its workers stopped),
        the run cannot go on, and a warning on the ``turnfsm.temporal``
        logger says why, as `status` does (once for each reason; the wait
        goes on, as the run does once workers that can run it serve its
        task queue).

        Args:
            timeout: Seconds to wait at most (None: as long as the run
                takes). The run is not touched when the wait runs out.

        Raises:
            WaitTimedOut: the run did not end within `timeout`; it says
                where the run is (running in a phase, paused for an answer,
                its queue served by no worker, or its workflow task failing
                on its workers, the `ConfigError` `status` raises being the
                cause). The run goes on.
            Cancelled: the workflow itself was cancelled (the log records
                the run as cancelled).
            RunCrashed: the run crashed on a bug (its log records it), or
                its workflow was terminated from outside (its log does not
                say so, and its session stays held: take it over with
                ``force=True``).
            SessionNotFound: Temporal knows no durable run of the session.
            TurnFSMError: the run was refused as `Driver.run` refuses one
                (`SessionBusy`: a run of the session is paused or unfinished;
                `InvalidMessage`: the input does not continue the history),
                or its store failed (`SessionConflict`, ...).
            ConfigError: `timeout` is not a number of seconds > 0.
        """
        _checks.check(timeout, "timeout", _check_timeout)
        data: Any = None
        caught: Exception | None = None
        async with anyio.create_task_group() as group:
            group.start_soon(self._watch)
            try:
                with anyio.move_on_after(timeout) as waited:
                    data = await self._ended()
            except Exception as exc:  # raised as itself, not in a group
                caught = exc
            group.cancel_scope.cancel()
        if caught is not None:
            raise caught
        if waited.cancelled_caught:
            assert timeout is not None
            error, cause = await self._timed_out(timeout)
            raise error from cause
        result: RunResult[Any] = serde.from_json(RunResult, data)
        return attrs.evolve(result, output=self._output(result))

    async def _ended(self) -> Any:
        """The workflow's answer: the run's result as JSON.

        Raises:
            (as `result`)
        """
        try:
            return await self._handle.result()
        except WorkflowFailureError as exc:
            cause = exc.cause
            if isinstance(cause, CancelledError):
                raise Cancelled(reason="the workflow was cancelled") from exc
            if isinstance(cause, TerminatedError):
                # Not a crash of the run: its log stops where the workflow
                # was, and its session stays held.
                raise RunCrashed(
                    type="TerminatedError",
                    message=(
                        f"its workflow was terminated from outside ({cause}); the "
                        "session's log keeps the run where it was, and the session "
                        "stays held by the workflow: take the run over with "
                        "force=True (turnfsm resume --force, turnfsm abandon --force)"
                    ),
                ) from exc
            raise failure_error(cause) from exc
        except RPCError as exc:
            raise await self._refusal(exc, "result", None) from exc
        except RuntimeError as exc:
            self._raise_if_lost(exc)
            raise

    async def _watch(self) -> None:
        """Warn while the run's workflow task fails, or no worker serves it (`result`).

        Once for each reason; asked after 2 seconds, then twice as long
        each time, up to a minute. Never raises: the wait says what the
        server does.
        """
        delay, said = _WATCH_FIRST, ""
        while True:
            await anyio.sleep(delay)
            delay = min(2 * delay, _WATCH_MOST)
            try:
                failing = await self._failing_task()
                why = f"its workflow task fails on its workers: {failing}"
                if failing is None:
                    unserved = await self._unserved()
                    why = f"no worker serves it: {unserved}" if unserved else ""
            except Exception:  # the server's trouble: the wait meets it too
                await anyio.lowlevel.checkpoint_if_cancelled()
                continue
            if why and why != said:
                logger.warning(
                    "the durable run of session %r waits, and does not go on: %s",
                    self.session_id,
                    why,
                )
            said = why

    async def _timed_out(
        self, seconds: float
    ) -> tuple[WaitTimedOut, ConfigError | None]:
        """Why the run did not end within `seconds`, as `status` says; its cause.

        Raises:
            TemporalUnreachable: the server did not answer.
        """
        cause: ConfigError | None = None
        reason = f"its status did not come within {_STATUS_WAIT:g}s (ask status())"
        try:
            with anyio.fail_after(_STATUS_WAIT):
                cause = await self._failing_task() or await self._unserved()
                if cause is None:
                    reason = _where(await self.status())
        except ConfigError as exc:  # status says why it does not go on
            cause = exc
        except TimeoutError:
            pass
        except RPCError as exc:
            raise await self._refusal(exc, "result", None) from exc
        if cause is not None:
            reason = f"it does not go on: {cause}"
        return WaitTimedOut(self.session_id, seconds, reason), cause

    def _output(self, result: RunResult[Any]) -> Any:
        output: OutputType | None = (
            self._agent.driver._output if self._agent is not None else None
        )
        if output is None or result.outcome != "done":
            return None
        try:
            return output.parse(result.text)
        except InvalidArguments:
            return None

    async def status(self) -> RunStatus:
        """Ask the workflow where the run is.

        A run waiting on sub-agents (`RunStatus.children`) asks their
        workflows too: those paused for an answer, at any depth, are in
        `RunStatus.children_waiting`. A worker answers: with none serving
        the run's queue, this waits for one (bound it with
        `anyio.fail_after`).

        Raises:
            ConfigError: the workers serve another build of the run's agent
                (another machine, another context window): its workflow
                cannot go on there; or its workflow's task fails on them
                for another reason (named); or no worker serves its task
                queue (named, after about 30 seconds).
            SessionNotFound: Temporal knows no durable run of the session.
        """
        ended: str | None = None  # how its workflow ended, when not cleanly
        try:
            failing = await self._failing_task()
            if failing is not None:
                raise failing
            try:
                answer = await self._handle.query(
                    "status",
                    reject_condition=QueryRejectCondition.NOT_COMPLETED_CLEANLY,
                )
            except WorkflowQueryRejectedError as rejected:
                ended = _ENDED.get(rejected.status) if rejected.status else None
                answer = await self._handle.query("status")
        except WorkflowQueryFailedError as exc:
            changed = self._changed_agent(str(exc))
            if changed is None:
                raise
            raise changed from exc
        except RPCError as exc:
            raise await self._refusal(exc, "status", None) from exc
        except RuntimeError as exc:
            self._raise_if_lost(exc)
            raise
        status: RunStatus = serde.from_json(RunStatus, answer)
        if ended is not None and status.outcome in ("running", "paused"):
            # Its history ends mid-run (terminated from outside) or before
            # the run began (refused): nothing will answer it or go on.
            return attrs.evolve(status, outcome=ended, waiting=None)
        waiting: list[str] = []
        for session_id in status.children:
            try:
                child = await DurableRun(self._client, session_id).status()
            except (RPCError, WorkflowQueryFailedError, SessionNotFound):
                continue  # not started yet, or ended: not waiting
            if child.waiting is not None:
                waiting.append(session_id)
            waiting.extend(child.children_waiting)
        return attrs.evolve(status, children_waiting=tuple(waiting))

    async def _failing_task(self) -> ConfigError | None:
        """Why the run's workflow task fails on its workers, again and again.

        None when it does not: its last task did not fail (one that timed
        out is redone), or was not retried yet. Temporal refuses (or never
        answers) the queries of such a workflow, and its run waits until
        workers that can run it serve its queue.
        """
        described = (await self._handle.describe()).raw_description
        if (
            not described.HasField("pending_workflow_task")
            or described.pending_workflow_task.attempt < 2
        ):
            return None
        events = (
            await self._client.workflow_service.get_workflow_execution_history_reverse(
                GetWorkflowExecutionHistoryReverseRequest(
                    namespace=self._client.namespace,
                    execution=WorkflowExecution(workflow_id=self.workflow_id),
                    maximum_page_size=_TASK_EVENTS,
                )
            )
        )
        why = None
        for event in events.history.events:  # the newest first
            if event.HasField("workflow_task_failed_event_attributes"):
                why = event.workflow_task_failed_event_attributes.failure.message
                break
            if event.HasField("workflow_task_timed_out_event_attributes") or (
                event.HasField("workflow_task_completed_event_attributes")
            ):
                return None  # a task that took too long is redone: not stuck
        if why is None:
            return None
        changed = self._changed_agent(why)
        if changed is not None:
            return changed
        return ConfigError(
            "agent",
            self._agent.driver.name if self._agent is not None else None,
            f"workers that can run this run's workflow; each attempt of its "
            f"task fails there ({why}); the run waits until workers that can "
            "run it serve its task queue, or terminate its workflow and take the "
            f"run over with force=True (turnfsm resume {self.session_id} "
            f"--force, or turnfsm abandon {self.session_id} --force)",
        )

    def _changed_agent(self, why: str) -> ConfigError | None:
        """The workers' agent is not the run's, if `why` says so (else None).

        Its workflow cannot go on there: each attempt fails (a history the
        agent does not make again), until the workers serve the run's agent.
        """
        if "Nondeterminism" not in why and "invalid agent=" not in why:
            return None
        name = self._agent.driver.name if self._agent is not None else None
        session = self.session_id
        return ConfigError(
            "agent",
            name,
            f"workers serving the agent this run began with; theirs takes other "
            f"steps than the run's history ({why}). Serve its task queue with the "
            "agent as it was (the same machine, context settings, tools and "
            "effects) and the run "
            "goes on where it was, or terminate its workflow and take the run "
            f"over with force=True (turnfsm resume {session} --force, or "
            f"turnfsm abandon {session} --force)",
        )

    async def approve(self) -> None:
        """Approve every tool call the paused run waits on.

        Raises:
            ConfigError: the run is not paused on a tool review, or its
                workflow's task fails on the workers serving its queue
                (another build of its agent: named, with the way on).
        """
        await self._update("approve")

    async def reject(self, reasons: Mapping[str, str]) -> None:
        """Reject the paused calls named in `reasons` (call id -> reason).

        Raises:
            ConfigError: the run is not paused on a review, `reasons` names
                no call (an empty one would approve them all), or a call id
                is not one it waits on.
        """
        ToolCallsReviewed.reject(reasons)  # its shape, before the round trip
        await self._update("reject", dict(reasons))

    async def answer(self, event: Event) -> None:
        """Answer the pause with any event its phase accepts.

        Raises:
            ConfigError: `event` is no event, the run is not paused, or its
                phase does not take it.
        """
        if not isinstance(event, EVENT_TYPES):  # sent, it fails to decode there
            raise ConfigError(
                "event",
                event,
                "an event the paused phase accepts (ToolCallsReviewed."
                "approve_all() lets every call run; Signal(name, data) answers "
                "a pause phase of your own machine file)",
            )
        await self._update("answer", serde.to_json(event))

    async def inject(self, message: str | Message) -> None:
        """Queue a message for the run's next safe point (`RunControl.inject`).

        Raises:
            InvalidMessage: refused as `RunControl.inject` refuses it: the
                message carries tool calls or tool results, is queued
                already, or the run's machine takes injected messages in
                no phase (it names the machine); the run goes on.
            ConfigError: the run has ended.
        """
        await self._update(
            "inject", message if isinstance(message, str) else serde.to_json(message)
        )

    async def cancel(self, reason: str = "cancelled") -> None:
        """End the run ``cancelled`` (the workflow completes with that result).

        Raises:
            ConfigError: the run has ended.
        """
        await self._check_size("cancel", _clipped(reason), reason)
        try:
            await self._handle.signal("cancel", reason)
        except RPCError as exc:
            raise await self._refusal(exc, "cancel", reason) from exc
        except RuntimeError as exc:
            self._raise_if_lost(exc)
            raise

    async def _update(self, name: str, *args: Any) -> None:
        value = _clipped(args[0] if args else None)
        await self._check_size(name, value, args)
        try:
            await self._handle.execute_update(name, args=args)
        except WorkflowUpdateFailedError as exc:
            cause = exc.cause  # its message, without the failure's type
            if isinstance(cause, ApplicationError) and cause.type == TURNFSM_ERROR:
                raise failure_error(cause) from exc  # the typed error refusing it
            why = cause.message if isinstance(cause, ApplicationError) else str(cause)
            raise ConfigError(name, value, why) from exc
        except WorkflowUpdateRPCTimeoutOrCancelledError:
            # Temporal's word for a wait the caller gave up (a deadline of
            # theirs): the cancellation goes on as itself.
            await anyio.lowlevel.checkpoint_if_cancelled()
            raise
        except RPCError as exc:
            raise await self._refusal(exc, name, value) from exc
        except RuntimeError as exc:
            self._raise_if_lost(exc)
            raise

    async def _check_size(self, name: str, shown: object, args: object) -> None:
        """Refuse `args` past the server's limit for one payload, before sending.

        Past it, the server refuses a signal, and an update would fail the
        workflow task that takes it, again and again.
        """
        # None: the server did not say, and the workflow's own check stands.
        try:
            limit = await server_payload_limit(self._client)
        except RuntimeError as exc:
            self._raise_if_lost(exc)
            raise
        if limit is not None:
            size = payload_size(args)
            if size > limit:
                raise _past_server(name, shown, size, limit)

    def _raise_if_lost(self, exc: RuntimeError) -> None:
        """Raise `TemporalUnreachable` if `exc` says the server did not answer."""
        lost = _unreachable(self._client, self.session_id, exc)
        if lost is not None:
            raise lost from exc

    async def _refusal(self, exc: RPCError, name: str, value: object) -> Exception:
        """What `exc`, raised by Temporal for `name`, means to the caller.

        A caller's own deadline (`anyio.fail_after`) cancels the call, and
        Temporal answers with an `RPCError`: the cancellation goes on as
        itself. A server that does not answer is `TemporalUnreachable`; a
        workflow Temporal does not know is `SessionNotFound`; one that has
        ended refuses what would steer it (`ConfigError`), as does one whose
        task fails on its workers (naming why, as `status` does).
        Anything else is Temporal's error as it came.
        """
        await anyio.lowlevel.checkpoint_if_cancelled()
        lost = _unreachable(self._client, self.session_id, exc)
        if lost is not None:
            return lost
        if name == "status" and exc.status != RPCStatusCode.NOT_FOUND:
            unserved = await self._unserved(exc)
            if unserved is not None:
                return unserved
        steers = name not in ("result", "status")
        if steers and _task_failing(exc):
            # Temporal takes no update while the workflow's task fails.
            failing = await self._failing_task()
            if failing is not None:
                return failing
        if steers and "size exceeds limit" in exc.message:
            # The server's own refusal of a payload past its limit.
            return ConfigError(
                name, value, f"a payload within this Temporal server's limit ({exc})"
            )
        if exc.status != RPCStatusCode.NOT_FOUND and not (steers and _ended(exc)):
            return exc
        try:
            await self._handle.describe()
        except RPCError as missing:
            if missing.status == RPCStatusCode.NOT_FOUND:  # never started
                return SessionNotFound(
                    self.session_id,
                    store=(
                        f"the durable runs of Temporal namespace "
                        f"{self._client.namespace!r}"
                    ),
                )
        if not steers:
            return exc
        return ConfigError(name, value, "a run still going (it has ended)")

    async def _unserved(self, exc: RPCError | None = None) -> ConfigError | None:
        """`ConfigError` naming the run's task queue if no worker polls it, else None.

        A query needs a worker: with none, Temporal gives up after about 30
        seconds, in words of its own (`exc`, when a query failed: "Timeout
        expired", "no poller seen"). The latter is Temporal's own word that
        none polls, though the queue's pollers still list a worker stopped
        moments ago.
        """
        try:
            queue = (await self._handle.describe()).task_queue
        except RPCError:
            await anyio.lowlevel.checkpoint_if_cancelled()
            return None
        said = "" if exc is None else exc.message
        if "no poller seen" not in said and await queue_polled(self._client, queue):
            return None
        return ConfigError(
            "task_queue",
            queue,
            "a task queue a worker serves: none has asked it for work lately, "
            "so nothing answers the run's status; start one (turnfsm worker "
            f"--task-queue {queue}, or create_worker) and the run goes on there",
        )


def _unreachable(
    client: Client,
    session_id: str,
    exc: RuntimeError | RPCError,
    *,
    starting: bool = False,
) -> TemporalUnreachable | None:
    """`TemporalUnreachable` for a server that did not answer, else None.

    The SDK says so with an `RPCError` (unavailable) from a client that
    was connected, or a `RuntimeError` from one connecting lazily.
    """
    text = exc.message if isinstance(exc, RPCError) else str(exc)
    if isinstance(exc, RuntimeError) and "client connect" not in text:
        return None
    if isinstance(exc, RPCError) and exc.status != RPCStatusCode.UNAVAILABLE:
        return None
    return TemporalUnreachable(
        address=client.service_client.config.target_host,
        session_id=session_id,
        reason=sdk_reason(text) or text,
        starting=starting,
    )


def sdk_reason(text: str) -> str | None:
    """The innermost reason in the SDK's connection error (``Connection refused``).

    None when `text` quotes none.
    """
    reasons = re.findall(r'(?:message|error): "([^"]+)"', text)
    return reasons[-1] if reasons else None


_ENDED: Final = {
    WorkflowExecutionStatus.TERMINATED: "terminated",
    WorkflowExecutionStatus.TIMED_OUT: "terminated",
    WorkflowExecutionStatus.FAILED: "failed",
}
"""The outcome of a workflow that ended without its run ending (`status`)."""


def _task_failing(exc: RPCError) -> bool:
    """Whether Temporal refused an update because the workflow's task fails."""
    return "Workflow Task in failed state" in exc.message


def _ended(exc: RPCError) -> bool:
    """Whether Temporal refused a call because the workflow has ended."""
    return "closed before" in exc.message or "already completed" in exc.message


async def start_durable(
    agent: Agent,
    input: str | Message | Iterable[Message],
    *,
    client: Client,
    task_queue: str,
    session_id: str | None = None,
    run_id: str | None = None,
    options: DurableOptions | None = None,
) -> DurableRun:
    """Start a run of `agent` as a Temporal workflow (see `Agent.start_durable`)."""
    if not isinstance(agent, Agent):
        raise ConfigError("agent", agent, "an Agent")
    if not isinstance(client, Client):
        raise ConfigError("client", client, "a temporalio.client.Client")
    if not isinstance(task_queue, str) or not task_queue:
        raise ConfigError("task_queue", task_queue, "a non-empty string")
    if options is not None and not isinstance(options, DurableOptions):
        raise ConfigError("options", options, "DurableOptions or None")
    if options is not None and options.task_timeout > MAX_TASK_TIMEOUT:
        raise ConfigError(
            "task_timeout",
            options.task_timeout,
            f"seconds <= {MAX_TASK_TIMEOUT:g}: Temporal's longest workflow task "
            "(a longer one is cut to it without a word)",
        )
    messages = as_messages(input)
    session = check_id("session_id", session_id or agent.session.id)
    given = options is not None and options.payload_limit != _DEFAULT_LIMIT
    options = options or DurableOptions()
    try:
        server = await server_payload_limit(client)  # None: the start says
    except RuntimeError as exc:
        if (lost := _unreachable(client, session, exc, starting=True)) is not None:
            raise lost from exc
        raise
    if server is not None and options.payload_limit > server and not given:
        # The default, past a server that takes less: the server's.
        options = attrs.evolve(options, payload_limit=server)
    elif server is not None and options.payload_limit > server:
        # Each step's activity would be refused by the server, and the
        # run would never end: refused here instead.
        raise ConfigError(
            "payload_limit",
            options.payload_limit,
            f"at most {server:,} bytes, what this Temporal server takes in one "
            "payload (its limit.blobSize.error, less a margin): give "
            f"DurableOptions(payload_limit={server:_}) or less",
        )
    spec = RunSpec(
        agent=agent.driver.name,
        session_id=session,
        run_id=check_id("run_id", run_id) if run_id else new_id("run"),
        input=messages,
        options=options,
        machine=machine_digest(agent.driver.machine),
    )
    start = serde.to_json(spec)
    if server is not None and (size := payload_size(start)) > server:
        # The server refuses the start with its own RPCError.
        raise _past_server("input", _input_shown(messages), size, server)
    try:
        handle = await client.start_workflow(
            WORKFLOW,
            start,
            id=workflow_id_of(session),
            task_queue=task_queue,
            id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
            id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
            static_summary=f"{agent.driver.name}: run {spec.run_id}",
            task_timeout=timedelta(seconds=spec.options.task_timeout),
        )
    except (RPCError, RuntimeError) as exc:
        if (lost := _unreachable(client, session, exc, starting=True)) is not None:
            raise lost from exc
        raise
    except WorkflowAlreadyStartedError:
        # The session's open durable run: named, to be reached through it.
        raise SessionBusy(
            session, owner=f"{DURABLE_OWNER}{workflow_id_of(session)}", alive=True
        ) from None
    return DurableRun(client, session, agent=agent, handle=handle)


def _where(status: RunStatus) -> str:
    """Where a run that did not end within a wait is, from its `status`."""
    goes_on = "; it goes on: wait again with result(), or ask status()"
    if status.waiting is not None:
        calls = ", ".join(call.id for call in status.waiting.calls)
        return (
            f"it is paused in phase {status.waiting.phase}, waiting for an answer"
            + (f" on calls {calls}" if calls else "")
            + " (approve(), reject() or answer() it)"
        )
    if status.children_waiting:
        return (
            "it waits on sub-agents' runs paused for an answer: "
            f"{', '.join(status.children_waiting)} (answer each on "
            "DurableRun(client, session_id))"
        )
    if status.outcome != "running":
        return f"it ended {status.outcome} as the wait ran out: call result() again"
    if status.children:
        return f"it waits on sub-agents' runs: {', '.join(status.children)}{goes_on}"
    return (
        f"it is running, in phase {status.phase}, after {status.turn} model calls "
        f"(the last step: {status.decision}){goes_on}"
    )
