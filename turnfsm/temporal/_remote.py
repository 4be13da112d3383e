"""A durable run's effects and log, as the workflow sees them (internal).

`_Remote` gives the driver's copy in the workflow an effect for every name
it has: each schedules its activity (`turnfsm.temporal._activities`), but
the built-in measurement, which only counts tokens, runs in the workflow.
`_WorkflowLog` is the session's store there: it keeps what the loop appends
until the next activity carries it to the real store. See the theory of
operation in `turnfsm.temporal._workflow`.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
from collections.abc import Awaitable, Mapping, Sequence
from datetime import timedelta
from typing import Any, Final, final

from temporalio import workflow
from temporalio.common import RetryPolicy as TemporalRetry
from temporalio.common import WorkflowIDReusePolicy
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    ChildWorkflowError,
    FailureError,
    WorkflowAlreadyStartedError,
)
from temporalio.exceptions import CancelledError as TemporalCancelled
from temporalio.workflow import ChildWorkflowHandle, ParentClosePolicy

with workflow.unsafe.imports_passed_through():
    import attrs

    from turnfsm import serde
    from turnfsm.core import (
        CallLLM,
        Compact,
        Event,
        ModelFailed,
        Perform,
        RunCancelled,
        RunTools,
        ToolsFinished,
    )
    from turnfsm.driver import (
        BUILTIN_EFFECTS,
        Delegation,
        Driver,
        EffectContext,
        PhaseDelegation,
        RunResult,
        child_ids,
        effect_key,
        late_result,
        timed_out,
    )
    from turnfsm.errors import (
        ConfigError,
        ContinuedAsNew,
        PayloadTooLarge,
        SessionBusy,
        SessionConflict,
        SubagentFailed,
    )
    from turnfsm.hooks import ToolCallInfo
    from turnfsm.messages import Message, ToolCallPart
    from turnfsm.persistence import (
        Entry,
        ParentLink,
        Session,
        SessionInfo,
        machine_digest,
    )
    from turnfsm.temporal._activities import (
        CRASHED,
        STOPPING,
        TRANSIENT,
        TURNFSM_ERROR,
        append_log,
        failure_error,
        load_log,
        run_effect,
        run_tool,
        serves,
        too_large_result,
    )
    from turnfsm.temporal._payloads import (
        MARGIN,
        NO_LIMIT,
        WORKFLOW,
        DurableOptions,
        RunSpec,
        fitting,
        payload_size,
        surely_within,
        workflow_id_of,
    )
    from turnfsm.values import ErrorInfo

__all__ = ["EffectCrashed", "_Remote", "_WorkflowLog", "new_message_id", "now"]


@attrs.frozen(kw_only=True)
class _ChildRun:
    """A call of a sub-agent tool, run as a child workflow of the served agent."""

    delegation: Delegation
    call: ToolCallPart
    link: ParentLink
    task: str


@attrs.frozen
class _Unanswered:
    """A child workflow that gave no answer: cancelled on its own, refused, crashed."""

    session_id: str
    outcome: str
    cause: str


@attrs.frozen
class _Late:
    """A child workflow that did not answer within its caller's limit (ended)."""

    limit: float


@attrs.frozen
class _Earlier:
    """A child of the call ran before (its workflow id is taken): its log answers."""

    session: Session
    run_id: str


@final
class EffectCrashed(Exception):
    """An activity failed for good outside its effect's events (internal).

    A crash, not an effect's failure: the run is logged crashed (`is_crash`),
    on the exception the activity raised when it sent its type and message
    (``crashed_as``), as an in-process run is.
    """

    is_crash = True

    def __init__(self, message: str, crashed_as: tuple[str, str] | None = None):
        super().__init__(message)
        if crashed_as is not None:
            self.crashed_as = crashed_as


def now() -> float:
    """The workflow's clock, in seconds (the log's timestamps)."""
    return workflow.now().timestamp()


def new_message_id() -> str:
    """A message id from the workflow's id source (the same on a replay)."""
    return "msg_" + workflow.uuid4().hex[:24]


CALL_TIMED_OUT: Final = "call_timed_out"
"""The signal a sub-agent's workflow gets when its caller's limit is past."""

_SHORTEST_WAIT: Final = 0.001
"""The shortest wait between a model call's attempts Temporal is given (seconds)."""


def _seconds(value: float | None) -> timedelta:
    return NO_LIMIT if value is None else timedelta(seconds=value + MARGIN)


class _WorkflowLog:
    """The session's store as the workflow sees it: appends wait for an activity.

    `append` keeps the entries; the next activity carries them (`take`) and
    writes them before its effect starts; `flush` writes them on their own.

    A local activity carries only the entries of finished workflow tasks:
    its own result, and so what the loop logs from it, reaches the history
    when the task it runs in ends. A store ahead of the history would hold
    a step that a worker dying meanwhile runs again, and answers otherwise.
    An activity the server schedules starts after the task that scheduled
    it ended: it may carry everything.
    """

    def __init__(self, spec: RunSpec) -> None:
        self._spec = spec
        self._written = 0  # the store's version, as far as the workflow knows
        self.held: dict[str, Any] | None = None
        """Who else held the session's lease when its log was read (None: none)."""
        self._pending: list[Entry] = []
        self._tasks: list[int] = []  # each pending entry's workflow task

    def options(self) -> dict[str, Any]:
        """How a log activity is scheduled."""
        options = self._spec.options
        return {
            "start_to_close_timeout": timedelta(seconds=options.log_timeout),
            "heartbeat_timeout": timedelta(seconds=options.heartbeat_timeout),
            "retry_policy": _infra_retry(options),
        }

    async def load(self, session_id: str) -> tuple[Entry, ...]:
        """Read the session's log, in as many activities as the payload limit needs."""
        read: list[Any] = []
        while True:
            data = await workflow.execute_activity(
                load_log,
                {
                    "agent": self._spec.agent,
                    "store": self._spec.store,
                    "session_id": session_id,
                    "start": len(read),
                    "budget": self._spec.options.payload_limit - _ENVELOPE,
                },
                **self.options(),
            )
            read.extend(data["entries"])
            if not data.get("more"):
                break
        entries = tuple(serde.open_envelope(e, Entry) for e in read)
        if session_id == self._spec.session_id:
            # Not another session's log: a resumed run reads its children's.
            self._written = len(entries)
            self.held = data.get("held")
        return entries

    def busy(self, refused: SessionBusy) -> SessionBusy:
        """`refused`, naming the process that held the session when it was read."""
        held = self.held
        if held is None or refused.owner is not None:
            return refused
        return SessionBusy(
            refused.session_id,
            refused.run_id,
            owner=held["owner"],
            alive=True,
            since=held["since"],
            until=held["until"],
        )

    async def append(
        self, session_id: str, entries: Sequence[Entry], *, expected_version: int
    ) -> int:
        version = self._written + len(self._pending)
        if expected_version != version:
            raise SessionConflict(
                session_id=session_id, expected=expected_version, actual=version
            )
        self._pending.extend(entries)
        task = _task() if self._spec.options.local_activities else 0
        self._tasks.extend([task] * len(entries))
        return version + len(entries)

    async def list_sessions(self) -> tuple[SessionInfo, ...]:
        raise ConfigError("store", "the workflow's log", "a store that lists sessions")

    def take(
        self, budget: int | None = None, *, finished: bool = False
    ) -> dict[str, Any] | None:
        """The entries not yet written, for the next activity to write first.

        With `budget`, the first of them whose JSON takes at most that many
        bytes (at least one): what one activity's input can carry. With
        `finished`, only those made in workflow tasks that have ended (for
        a local activity).
        """
        pending = self._pending
        if finished:
            # Tags never decrease: those of ended tasks come first.
            pending = pending[: bisect.bisect_left(self._tasks, _task())]
        if not pending:
            return None
        entries = [serde.envelope(e) for e in pending]
        if budget is not None:
            del entries[fitting(entries, budget) :]
        return {"entries": entries, "version": self._written}

    def done(self, log: Mapping[str, Any] | None) -> None:
        """Count `log` (what `take` gave an activity that succeeded) as written."""
        if log:
            count = len(log["entries"])
            del self._pending[:count]
            del self._tasks[:count]
            self._written += count

    def request(self, log: dict[str, Any]) -> dict[str, Any]:
        """The ``turnfsm.append`` request that writes `log` (from `take`)."""
        return {
            "agent": self._spec.agent,
            "store": self._spec.store,
            "session_id": self._spec.session_id,
            "log": log,
        }

    async def flush(self) -> None:
        """Write what is pending now (before a pause, at the end).

        In as many activities as the payload limit needs (one, mostly).

        Raises:
            TurnFSMError: the store refused the log, for good (its
                `SessionConflict`, or `StoreUnusable`: another store than
                the one the run began in).
        """
        budget = self._spec.options.payload_limit - _ENVELOPE
        while (log := self.take(budget)) is not None:
            try:
                await workflow.execute_activity(
                    append_log, self.request(log), **self.options()
                )
            except ActivityError as exc:
                cause = exc.cause
                if (
                    isinstance(cause, ApplicationError)
                    and cause.type == TURNFSM_ERROR
                    and cause.details
                ):
                    raise serde.error_from_json(cause.details[0]) from None
                raise
            self.done(log)


def _stopping(failure: BaseException | None) -> bool:
    """Whether a local activity failed because its worker is stopping."""
    return isinstance(failure, ApplicationError) and failure.type == STOPPING


def _task() -> int:
    """The workflow task running: the history's length when it began.

    It grows with every task (each adds its own events), and a task's local
    activities add theirs only when it ends.
    """
    return workflow.info().get_current_history_length()


_ENVELOPE: Final = 4096
"""Bytes of an activity's input besides what it carries (ids, names, keys)."""


_TOOL_WAIT: Final = 20
"""How long a tool call the run has waits for a worker with the tool, in
`DurableOptions.retry_max` waits (the longest wait between attempts)."""


def _infra_retry(options: DurableOptions) -> TemporalRetry:
    """Retries of an activity lost with its worker or its store: unbounded."""
    return TemporalRetry(
        initial_interval=timedelta(seconds=options.retry_initial),
        maximum_interval=timedelta(seconds=options.retry_max),
        non_retryable_error_types=[TURNFSM_ERROR, CRASHED],
    )


class _Remote:
    """The effects of a durable run: each schedules its activity.

    A ``cancel`` signal cancels the activities in flight (their tasks: a
    Temporal activity is not interrupted through a cancel scope), and the
    effect returns `RunCancelled`; an activity cancelled without one is the
    workflow's own cancellation, raised as such.
    """

    def __init__(self, spec: RunSpec, driver: Driver, log: _WorkflowLog) -> None:
        self.spec = spec
        self.driver = driver
        self.log = log
        self.cancelled: str | None = None  # the reason of a cancel signal
        self._tasks: set[asyncio.Task[Any]] = set()
        self._started = 0  # effects begun in this workflow run
        self.children: dict[str, None] = {}
        """The session ids of the child workflows in flight, in start order."""

    def effects(self) -> dict[str, Any]:
        """An effect for every name the driver has (built-in ones included)."""
        effects: dict[str, Any] = {}
        for key, effect in self.driver._effects.items():
            builtin = BUILTIN_EFFECTS.get(key)
            if key == "measure" and effect is builtin:
                effects[key] = effect  # counting only: it runs here
            elif key == "run_tools" and effect is builtin:
                effects[key] = self.run_tools
            elif (phase := self._served_phase(effect)) is not None:
                effects[key] = self._phase(phase)
            else:
                effects[key] = self._effect(key)
                if effect is builtin:
                    # The built-in step, run in an activity: its event is
                    # checked there, as in-process, not again as a user's.
                    effects[key].runs_builtin = True
        return effects

    @staticmethod
    def _served_phase(effect: Any) -> PhaseDelegation | None:
        """The sub-agent phase `effect` runs, if this worker serves its agent."""
        phase = PhaseDelegation.of(effect)
        if phase is None or not serves(
            phase.delegation.driver, workflow.info().task_queue
        ):
            return None
        return phase

    def cancel(self, reason: str) -> bool:
        """Cancel the activities in flight; False if there were none."""
        self.cancelled = reason
        tasks = [t for t in self._tasks if not t.done()]
        for task in tasks:
            task.cancel()
        return bool(tasks)

    def _begin(self) -> None:
        """Count an effect begun; first stop the run if its history grew long.

        Past `DurableOptions.history_limit` events, or when the server
        suggests it, the run stops here, before a model call, a compaction
        pass or an effect of its machine begins (`ContinuedAsNew`, logged as
        its interruption), for the workflow to continue as new and resume
        it, carrying that decision out. Never before a tool batch or a
        sub-agent: resumed, a batch with no results is closed as
        interrupted, as after a crash, where here it is known not to have
        begun. A workflow run that has begun no effect yet goes on: each one
        carries the run at least a step further.
        """
        if self._started:
            info = workflow.info()
            limit = self.spec.options.history_limit
            events = info.get_current_history_length()
            if (
                limit is not None and events >= limit
            ) or info.is_continue_as_new_suggested():
                raise ContinuedAsNew(
                    workflow_id=info.workflow_id,
                    history_events=events,
                    history_bytes=info.get_current_history_size(),
                )
        self._started += 1

    def _fits(self, ctx: EffectContext, request: dict[str, Any]) -> bool:
        """Whether `request` is within the payload limit (see `DurableOptions`).

        Measured only when the step's estimate leaves room for doubt: a
        token stands for at most 64 bytes of JSON (a run of spaces), and
        the log riding with the conversation can double it.
        """
        limit = self.spec.options.payload_limit
        snapshot = ctx.snapshot
        if snapshot.estimate is not None:
            messages = len(snapshot.history) + len(snapshot.pending)
            bound = 128 * snapshot.estimate + _ENVELOPE * (
                messages + len(snapshot.inbox) + 1
            )
            if bound <= limit:
                return True
        return payload_size(request) <= limit

    def _too_large(self, key: str, request: dict[str, Any]) -> PayloadTooLarge:
        return PayloadTooLarge(
            effect=key,
            size=payload_size(request),
            limit=self.spec.options.payload_limit,
        )

    @property
    def local(self) -> bool:
        """Whether effects and tool calls run as local activities."""
        return self.spec.options.local_activities

    async def _run(self, activity: Any, request: Any, **options: Any) -> Any:
        return await self._track(
            workflow.execute_activity(activity, request, **options)
        )

    async def _step(self, activity: Any, request: Any, **options: Any) -> Any:
        """Run an effect's or a tool call's activity: local, if the run says so.

        A local activity that its worker's stopping cut short runs again as
        an activity the server schedules: the workflow task then ends,
        keeping the steps it finished (their results are in the history),
        and a worker that goes on carries this one out. Replayed, the
        recorded failure schedules the same activity.
        """
        if not self.local:
            return await self._run(activity, request, **options)
        local = {k: v for k, v in options.items() if k != "heartbeat_timeout"}
        try:
            return await self._track(
                workflow.execute_local_activity(activity, request, **local)
            )
        except ActivityError as exc:
            if not _stopping(exc.cause):
                raise
        except FailureError as exc:  # its failure itself: as an activity's
            if not _stopping(exc):
                raise ActivityError(
                    str(exc),
                    scheduled_event_id=0,
                    started_event_id=0,
                    identity="",
                    activity_type=getattr(activity, "__name__", ""),
                    activity_id="",
                    retry_state=None,
                ) from exc
        return await self._run(activity, request, **options)

    async def _track(self, work: Awaitable[Any]) -> Any:
        """Await `work` as a task a ``cancel`` signal cancels."""
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        try:
            return await task
        finally:
            self._tasks.discard(task)

    def _schedule(self, key: str) -> dict[str, Any]:
        driver, options = self.driver, self.spec.options
        retry = _infra_retry(options)
        if key == "call_llm":
            limit = _seconds(driver.model_timeout)
            policy = driver.retry
            # As `RetryPolicy.backoff` waits: never longer than `max_wait`
            # (Temporal refuses a first wait over the longest), never 0.
            longest = max(policy.max_wait, _SHORTEST_WAIT)
            retry = TemporalRetry(
                initial_interval=timedelta(
                    seconds=min(max(policy.initial_wait, _SHORTEST_WAIT), longest)
                ),
                maximum_interval=timedelta(seconds=longest),
                non_retryable_error_types=[TURNFSM_ERROR, CRASHED],
            )
        elif key == "compact":
            limit = _seconds(driver.compaction_timeout)
        elif key == "run_tools":
            limit = _seconds(driver.tool_timeout)
        else:
            limit = _seconds(driver.effect_timeout)
        return {
            "start_to_close_timeout": limit,
            "heartbeat_timeout": timedelta(seconds=options.heartbeat_timeout),
            "retry_policy": retry,
        }

    def _request(self, ctx: EffectContext) -> dict[str, Any]:
        return {
            "agent": self.spec.agent,
            "store": self.spec.store,
            "session_id": ctx.session_id,
            "run_id": ctx.run_id,
            "snapshot": serde.to_json(ctx.snapshot),
        }

    def _effect(self, key: str) -> Any:
        async def effect(ctx: EffectContext, decision: Any) -> Event:
            if self.cancelled is not None:
                return RunCancelled(reason=self.cancelled)
            self._begin()
            request = self._request(ctx)
            request["key"] = key
            request["payload_limit"] = self.spec.options.payload_limit
            if self.local and self._started == 1:
                try:  # the lease, and the run's opening, before its first step
                    await self._track(self.log.flush())
                except ActivityError as exc:
                    return self._failed(exc, decision)
            request["log"] = log = self.log.take(finished=self.local)
            if not self._fits(ctx, request):
                try:  # the log on its own first (in parts), then the step
                    await self._track(self.log.flush())
                except ActivityError as exc:
                    return self._failed(exc, decision)
                request["log"] = log = None
                if not self._fits(ctx, request):
                    raise self._too_large(key, request)
            try:
                data = await self._step(
                    run_effect,
                    request,
                    summary=_summary(decision),
                    **self._schedule(key),
                )
            except ActivityError as exc:
                return self._failed(exc, decision)
            self.log.done(log)
            event: Event = serde.from_json(Event, data)
            return event

        effect.__name__ = f"durable_{key}"
        return effect

    def _phase(self, phase: PhaseDelegation) -> Any:
        """The effect of a sub-agent phase: its agent runs as a child workflow.

        The child's task, ids, link and limits are the in-process ones
        (`PhaseDelegation`); the phase ends with the same signal.
        """

        async def effect(ctx: EffectContext, decision: Perform) -> Event:
            if self.cancelled is not None:
                return RunCancelled(reason=self.cancelled)
            snapshot = ctx.snapshot
            try:
                task = phase.task_of(snapshot, decision.effect)
            except SubagentFailed as exc:  # no task: no child
                return phase.failed(decision, exc)
            call_id = PhaseDelegation.call_id(decision, snapshot)
            link = phase.admit(decision, ctx.session_id, ctx.run_id, call_id)
            if not isinstance(link, ParentLink):
                return link  # refused: a limit, routed by on_failure
            try:  # the child's run is linked to what this log holds (in parts)
                await self._track(self.log.flush())
            except ActivityError as exc:
                return self._failed(exc, decision)
            driver = phase.delegation.driver
            limit = self.driver.effect_timeout
            try:
                ended = await self._child_workflow(driver, link, task, limit=limit)
            except ChildWorkflowError:  # cancelled with this run
                return self._interrupted()
            if isinstance(ended, _Late):
                return timed_out(ctx, decision, decision.effect, ended.limit, effect)
            if isinstance(ended, _Unanswered):
                error = SubagentFailed(
                    decision.effect, ended.session_id, ended.outcome, ended.cause
                )
                return phase.failed(decision, error)
            if isinstance(ended, _Earlier):
                return await phase.answer_from_log(
                    decision, ended.session, ended.run_id
                )
            return phase.answer(decision, ended)

        effect.__name__ = f"durable_{phase.delegation.driver.name}"
        phase.mark(effect)  # a resumed run counts the children it started
        return effect

    async def run_tools(self, ctx: EffectContext, decision: RunTools) -> Event:
        """Run each call as its own activity, concurrently; results in call order.

        A call of a sub-agent tool whose agent this worker serves runs that
        agent as a child workflow instead (`_child`).
        """
        if self.cancelled is not None:
            return RunCancelled(reason=self.cancelled)
        calls = decision.calls
        # In call order, before anything starts: the sub-agents' limits count
        # the calls as in-process.
        plans = [self._plan(ctx, call) for call in calls]
        limit = self.spec.options.payload_limit
        # A tool needs its call and turn, not the conversation: each call's
        # activity (and the history keeping its input) is the call's size.
        request = {
            "agent": self.spec.agent,
            "store": self.spec.store,
            "session_id": ctx.session_id,
            "run_id": ctx.run_id,
            "turn": ctx.turn,
            "result_limit": limit // 2,
        }
        log = self.log.take(finished=self.local)
        # The log rides with a lone tool activity (when both fit in one
        # payload: the log holds the reply, and so the call, too); otherwise
        # it is written first, in parts: one writer, not the calls racing,
        # and a child's run is linked to what its parent's log holds. Local
        # activities leave it to the next step but for a child: writing it
        # ends the workflow task.
        children = any(plan is not None for plan in plans)
        rides = (
            log is not None
            and plans == [None]
            and payload_size({**request, "call": serde.to_json(calls[0]), "log": log})
            <= limit
        )
        if (self.local and children) or (
            log is not None and not rides and not self.local
        ):
            try:
                await self._track(self.log.flush())
            except ActivityError as exc:
                return self._failed(exc, decision)
        if not rides:
            log = None
        schedule = self._schedule("run_tools")
        finished: dict[int, Message] = {}

        async def one(index: int) -> Message:
            call, plan = calls[index], plans[index]
            if plan is not None:  # heard by the hooks here: no activity has it
                finished[index] = answer = await self._observed(ctx, call, plan)
                return answer
            asked = {**request, "call": serde.to_json(call), "log": log}
            if call.name in ctx.run.tools and not self.local:
                # Not this run's worker's to say it has no such tool: the
                # call waits for a worker that has it (another build's).
                asked["wait_for_tool"] = _TOOL_WAIT * self.spec.options.retry_max
            data = await self._step(
                run_tool,
                asked,
                summary=f"tool {call.name} ({call.id})",
                **schedule,
            )
            message: Message = serde.from_json(Message, data)
            finished[index] = message
            return message

        try:
            results = await asyncio.gather(*(one(i) for i in range(len(calls))))
        except ActivityError as exc:
            if isinstance(exc.cause, TemporalCancelled):
                await _keep(ctx, finished)
            return self._failed(exc, decision)
        except ChildWorkflowError:  # cancelled: the one failure `_child` raises
            await _keep(ctx, finished)
            return self._interrupted()
        self.log.done(log)
        return ToolsFinished(results=_within(calls, results, limit // 2))

    async def _observed(
        self, ctx: EffectContext, call: ToolCallPart, plan: _ChildRun | Message
    ) -> Message:
        """A sub-agent's call between the run's `on_tool_start` and `on_tool_end`.

        A call refused by a limit (`plan` is its result) is heard too, as
        in-process.
        """
        info = ToolCallInfo(
            session_id=ctx.session_id, run_id=ctx.run_id, turn=ctx.turn, call=call
        )

        async def run() -> tuple[Message, None]:
            if isinstance(plan, Message):  # refused: a sub-agent limit
                return plan, None
            return _made_here(await self._child(plan)), None

        return await ctx.run.hooks.tool_call(info, run, clock=workflow.time)

    def _plan(
        self, ctx: EffectContext, call: ToolCallPart
    ) -> _ChildRun | Message | None:
        """How `call` runs: a child workflow, refused, or (None) an activity."""
        tool = ctx.run.tools.get(call.name)
        delegation = Delegation.of(tool) if tool is not None else None
        if delegation is None or not serves(
            delegation.driver, workflow.info().task_queue
        ):
            return None  # not a sub-agent, or one this worker does not serve
        task = Delegation.task(call)
        if task is None:
            return None  # the tool's activity says what is wrong with the call
        link = delegation.admit(call, ctx.session_id, ctx.run_id)
        if isinstance(link, Message):
            return _made_here(link)
        return _ChildRun(delegation=delegation, call=call, link=link, task=task)

    async def _child(self, child: _ChildRun) -> Message:
        """Run the sub-agent of a call as a child workflow; the call's result.

        Raises:
            ChildWorkflowError: the child was cancelled with this run.
        """
        call, delegation = child.call, child.delegation
        ended = await self._child_workflow(
            delegation.driver, child.link, child.task, limit=self.driver.tool_timeout
        )
        if isinstance(ended, _Late):
            return late_result(call, ended.limit)
        if isinstance(ended, _Unanswered):
            return Delegation.failed(call, ended.session_id, ended.outcome, ended.cause)
        if isinstance(ended, _Earlier):
            return await delegation.answer_from_log(call, ended.session, ended.run_id)
        return delegation.answer(call, ended)

    async def _child_workflow(
        self, driver: Driver, link: ParentLink, task: str, *, limit: float | None
    ) -> RunResult[Any] | _Unanswered | _Earlier | _Late:
        """Run `driver`'s agent on `task` as the child workflow of `link`.

        The child's ids come from the call (`child_ids`): a replayed parent
        finds the child it started in its history. A child the workflow
        cannot start because one of that id ran before (an earlier attempt
        at this run, the workflow reset) answers from its session's log
        (`_Earlier`); a child cancelled on its own, refused or crashed gives
        no answer (`_Unanswered`). A child that has not answered within
        `limit` seconds (the caller's `tool_timeout`, or `effect_timeout`
        for a phase, as in-process) is told so (`CALL_TIMED_OUT`): one at
        work ends, cancelled (`_Late`); one waiting for an answer goes on
        waiting, and is told again after each further `limit`.

        Raises:
            ChildWorkflowError: the child was cancelled with this run.
        """
        session_id, run_id = child_ids(link.session_id, link.run_id, link.call_id)
        options = self.spec.options
        agent = driver.name
        spec = RunSpec(
            agent=agent,
            session_id=session_id,
            run_id=run_id,
            input=(Message.user(task, id=new_message_id()),),
            options=options,
            parent=link,
            store=self.spec.store or self.spec.agent,
            machine=machine_digest(driver.machine),
        )
        self.children[session_id] = None
        try:
            handle = await self._track(
                workflow.start_child_workflow(
                    WORKFLOW,
                    serde.to_json(spec),
                    id=workflow_id_of(session_id),
                    task_queue=workflow.info().task_queue,
                    parent_close_policy=ParentClosePolicy.REQUEST_CANCEL,
                    id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
                    task_timeout=timedelta(seconds=options.task_timeout),
                    static_summary=f"{agent}: run {run_id}, "
                    f"for call {link.call_id} of run {link.run_id}",
                )
            )
            late = f"its call {link.call_id!r}, or a call above it, timed out"
            told = False
            while limit is not None and not handle.done():
                if not await self._in_time(handle, limit):
                    # Past the limit: a child at work ends, cancelled; one
                    # waiting for an answer goes on waiting (as in-process,
                    # where its caller's run stops until it is answered),
                    # and is told again once it has worked `limit` more.
                    # (A child that ended meanwhile takes no signal: its
                    # result is read below.)
                    with contextlib.suppress(Exception):
                        await handle.signal(CALL_TIMED_OUT, late)
                    told = True
            data = await self._track(handle)
        except WorkflowAlreadyStartedError:
            session = await Session.open(_WorkflowLog(spec), spec.session_id)
            return _Earlier(session, run_id)
        except ChildWorkflowError as exc:
            if isinstance(exc.cause, TemporalCancelled):
                current = asyncio.current_task()
                if self.cancelled is not None or (current and current.cancelling()):
                    raise  # this run is being cancelled, its child with it
                # Cancelled on its own: no answer, as a child cancelled
                # in-process.
                cause = "its workflow was cancelled"
                return _Unanswered(session_id, "cancelled", cause)
            error = failure_error(exc.cause)  # refused, or crashed
            return _Unanswered(session_id, "failed", f"{type(error).__name__}: {error}")
        finally:
            self.children.pop(session_id, None)
        result: RunResult[Any] = serde.from_json(RunResult, data)
        if told and result.outcome == "cancelled" and late in str(result.error):
            assert limit is not None  # told only past a limit
            return _Late(limit)
        return result

    async def _in_time(
        self, handle: ChildWorkflowHandle[Any, Any], limit: float
    ) -> bool:
        """Wait at most `limit` seconds for the child of `handle` to end.

        Returns:
            Whether it ended in time. A ``cancel`` signal meanwhile cancels
            the child with this run, as an unbounded wait would.
        """
        try:
            await self._track(workflow.wait_condition(handle.done, timeout=limit))
        except TimeoutError:
            return False
        except asyncio.CancelledError:
            if self.cancelled is None:
                raise  # the workflow itself is cancelled: the child goes with it
            handle.cancel()
        return True

    def _interrupted(self) -> Event:
        """An activity or a child was cancelled: by a ``cancel`` signal, or not."""
        if self.cancelled is not None:
            return RunCancelled(reason=self.cancelled)
        raise asyncio.CancelledError  # the workflow is being cancelled

    def _failed(self, exc: ActivityError, decision: Any) -> Event:
        """The event (or the error) an activity that failed for good stands for."""
        cause = exc.cause
        if isinstance(cause, TemporalCancelled):
            return self._interrupted()
        if isinstance(cause, ApplicationError):
            details = cause.details
            if cause.type == TRANSIENT and details:
                event: Event = serde.from_json(Event, details[0])
                return event
            if cause.type == TURNFSM_ERROR and details:
                raise serde.error_from_json(details[0]) from None
            if cause.type == CRASHED:
                raise EffectCrashed(cause.message, _raised(details)) from None
        if isinstance(decision, CallLLM):
            # The model call never came back (timeouts, retries spent).
            return ModelFailed(
                error=ErrorInfo(
                    type="activity_failed", message=str(cause or exc), retryable=True
                )
            )
        failure = cause or exc
        message = f"{effect_key(decision)}: {failure}"
        raise EffectCrashed(message, (type(failure).__name__, message)) from None


def _raised(details: Sequence[Any]) -> tuple[str, str] | None:
    """The type name and message of the exception a crashed activity sent."""
    detail = details[0] if details else None
    if isinstance(detail, Mapping) and {"type", "message"} <= set(detail):
        return str(detail["type"]), str(detail["message"])
    return None


async def _keep(ctx: EffectContext, finished: Mapping[int, Message]) -> None:
    """Log the results of a batch's calls that finished before it was cut short.

    As in-process: a cancelled or interrupted run keeps what its tools did,
    and its resume closes only the calls left without a result.
    """
    record = ctx.journal.record if ctx.journal is not None else None
    if record is None:
        return
    for index in sorted(finished):
        await record(finished[index])


def _within(
    calls: Sequence[ToolCallPart], results: Sequence[Message], limit: int
) -> list[Message]:
    """A batch's results, together within `limit` bytes (half the payload limit).

    A tool's activity keeps its own result within it; a batch is one entry
    of the log and one step of the conversation, and a sub-agent's answer
    comes from its workflow: the largest results give way to error results
    saying so until the batch fits.
    """
    kept = list(results)
    text = sum(len(r.content) for m in kept for r in m.tool_results)
    if surely_within(text, len(kept), limit):
        return kept  # not measured
    sizes = [payload_size(serde.to_json(m)) for m in kept]
    left = set(range(len(kept)))
    while left and sum(sizes) > limit:
        largest = max(sorted(left), key=sizes.__getitem__)
        left.discard(largest)
        kept[largest] = too_large_result(
            calls[largest], kept[largest], limit, batch=len(kept) > 1
        )
        sizes[largest] = payload_size(serde.to_json(kept[largest]))
    return kept


def _made_here(message: Message) -> Message:
    """A result made in the workflow, its id from the workflow's id source."""
    return attrs.evolve(message, id=new_message_id())


def _summary(decision: Any) -> str:
    if isinstance(decision, CallLLM):
        return f"model call, turn {decision.turn + 1}"
    if isinstance(decision, Compact):
        return f"compaction ({decision.reason.value})"
    return effect_key(decision)
