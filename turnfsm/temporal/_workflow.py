"""The Turn FSM as a Temporal workflow: the brain here, the effects as activities.

Theory of operation
-------------------
The workflow runs the agent's own `Driver` loop (`Driver.run`, then
`Driver.resume` after each pause), on a copy of the driver whose effects
schedule activities (`turnfsm.temporal._activities`) instead of meeting the
outside world themselves:

- the model call, each compaction pass and every custom effect is one
  ``turnfsm.effect`` activity; each tool call of a batch is one
  ``turnfsm.tool`` activity, run concurrently;
- the built-in measurement runs here: it only counts tokens (deterministic);
- the session's log is the same log as in-process, written through a
  store (`_WorkflowLog`) that keeps what the loop appends until the next
  activity carries it to the real store, before its effect starts; a
  pause, the end of the run and a batch of several tool calls write it
  first with ``turnfsm.append``.

So the brain, the machine file, the audit trail, the hooks and the stores
are those of an in-process run; the workflow's history is the journal of
every effect's outcome, and replaying it rebuilds the same brain. What the
brain sees comes only from events (the activities' results, the updates'
arguments) and from the workflow's clock and id source, so a replay makes
the same decisions, timestamps and message ids.

Observing hooks (`on_transition`, `on_run_end`, ...) are called here, but
not while Temporal replays history the workflow already made: each fires
once per step in the normal course. The hooks an effect calls
(`on_model_call_*`, `on_tool_*`, `pre_compact`) are called in the activity.

Steering: the updates ``approve``, ``reject`` and ``answer`` answer a pause;
``inject`` queues a message (`RunControl.inject`); the signal ``cancel``
ends the run ``cancelled`` and the workflow completes with that result.
Cancelling the workflow itself (Temporal's cancellation) records the run
as cancelled, then the workflow ends cancelled. The query ``status`` (and
``phase``, ``estimate``, ``last_decision``) reads where the run is.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any, Final, final

from temporalio import workflow
from temporalio.common import RetryPolicy as TemporalRetry
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.exceptions import CancelledError as TemporalCancelled

with workflow.unsafe.imports_passed_through():
    # Imported here, not lazily: a lazy import (importlib) inside a workflow
    # is not passed through the sandbox (turnfsm's machine files, anyio's
    # backend).
    import anyio._backends._asyncio  # noqa: F401
    import attrs

    import turnfsm._resources  # noqa: F401
    from turnfsm import serde
    from turnfsm.agent import Agent
    from turnfsm.core import (
        CallLLM,
        Compact,
        Event,
        ModelFailed,
        Pause,
        RunCancelled,
        RunTools,
        ToolCallsReviewed,
        ToolsFinished,
        trigger_of,
    )
    from turnfsm.driver import BUILTIN_EFFECTS, Driver, EffectContext, RunControl
    from turnfsm.driver._effects import effect_key
    from turnfsm.errors import (
        ConfigError,
        InvalidMessage,
        SessionConflict,
        TurnFSMError,
    )
    from turnfsm.hooks import (
        DecisionInfo,
        Hook,
        RunEndInfo,
        RunStartInfo,
        TransitionInfo,
    )
    from turnfsm.hooks._dispatch import _METHODS
    from turnfsm.messages import Message
    from turnfsm.persistence import Entry, Session, SessionInfo, decision_key
    from turnfsm.temporal._activities import (
        CRASHED,
        TRANSIENT,
        TURNFSM_ERROR,
        agent_named,
        append_log,
        load_log,
        run_effect,
        run_tool,
    )
    from turnfsm.temporal._payloads import (
        MARGIN,
        NO_LIMIT,
        WORKFLOW,
        DurableOptions,
        RunSpec,
        result_to_json,
    )
    from turnfsm.values import ErrorInfo

__all__ = ["EffectCrashed", "TurnWorkflow"]

_REVIEWED: Final = "tool_calls_reviewed"


@final
class EffectCrashed(Exception):
    """An activity failed for good outside its effect's events (internal)."""


def _now() -> float:
    return workflow.now().timestamp()


def _new_message_id() -> str:
    return "msg_" + workflow.uuid4().hex[:24]


def _seconds(value: float | None) -> timedelta:
    return NO_LIMIT if value is None else timedelta(seconds=value + MARGIN)


class _WorkflowLog:
    """The session's store as the workflow sees it: appends wait for an activity.

    `append` keeps the entries; the next activity carries them (`take`) and
    writes them before its effect starts; `flush` writes them on their own.
    """

    def __init__(self, spec: RunSpec) -> None:
        self._spec = spec
        self._written = 0  # the store's version, as far as the workflow knows
        self._pending: list[Entry] = []

    def options(self) -> dict[str, Any]:
        """How a log activity is scheduled."""
        options = self._spec.options
        return {
            "start_to_close_timeout": timedelta(seconds=options.log_timeout),
            "heartbeat_timeout": timedelta(seconds=options.heartbeat_timeout),
            "retry_policy": _infra_retry(options),
        }

    async def load(self, session_id: str) -> tuple[Entry, ...]:
        data = await workflow.execute_activity(
            load_log,
            {"agent": self._spec.agent, "session_id": session_id},
            **self.options(),
        )
        entries = tuple(serde.open_envelope(e, Entry) for e in data["entries"])
        self._written = len(entries)
        return entries

    async def append(
        self, session_id: str, entries: Sequence[Entry], *, expected_version: int
    ) -> int:
        version = self._written + len(self._pending)
        if expected_version != version:
            raise SessionConflict(
                session_id=session_id, expected=expected_version, actual=version
            )
        self._pending.extend(entries)
        return version + len(entries)

    async def list_sessions(self) -> tuple[SessionInfo, ...]:
        raise ConfigError("store", "the workflow's log", "a store that lists sessions")

    def take(self) -> dict[str, Any] | None:
        """The entries not yet written, for the next activity to write first."""
        if not self._pending:
            return None
        return {
            "entries": [serde.envelope(e) for e in self._pending],
            "version": self._written,
        }

    def done(self, log: Mapping[str, Any] | None) -> None:
        """Count `log` (what `take` gave an activity that succeeded) as written."""
        if log:
            count = len(log["entries"])
            del self._pending[:count]
            self._written += count

    def request(self, log: dict[str, Any]) -> dict[str, Any]:
        """The ``turnfsm.append`` request that writes `log` (from `take`)."""
        return {
            "agent": self._spec.agent,
            "session_id": self._spec.session_id,
            "log": log,
        }

    async def flush(self) -> None:
        """Write what is pending now (before a pause, at the end)."""
        log = self.take()
        if log is None:
            return
        await workflow.execute_activity(append_log, self.request(log), **self.options())
        self.done(log)


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

    def effects(self) -> dict[str, Any]:
        """An effect for every name the driver has (built-in ones included)."""
        effects: dict[str, Any] = {}
        for key, effect in self.driver._effects.items():
            builtin = BUILTIN_EFFECTS.get(key)
            if key == "measure" and effect is builtin:
                effects[key] = effect  # counting only: it runs here
            elif key == "run_tools" and effect is builtin:
                effects[key] = self.run_tools
            else:
                effects[key] = self._effect(key)
        return effects

    def cancel(self, reason: str) -> bool:
        """Cancel the activities in flight; False if there were none."""
        self.cancelled = reason
        tasks = [t for t in self._tasks if not t.done()]
        for task in tasks:
            task.cancel()
        return bool(tasks)

    async def _run(self, activity: Any, request: Any, **options: Any) -> Any:
        task = asyncio.ensure_future(
            workflow.execute_activity(activity, request, **options)
        )
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
            retry = TemporalRetry(
                initial_interval=timedelta(seconds=policy.initial_wait),
                maximum_interval=timedelta(seconds=policy.max_wait),
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
            "session_id": ctx.session_id,
            "run_id": ctx.run_id,
            "snapshot": serde.to_json(ctx.snapshot),
        }

    def _effect(self, key: str) -> Any:
        async def effect(ctx: EffectContext, decision: Any) -> Event:
            if self.cancelled is not None:
                return RunCancelled(reason=self.cancelled)
            request = self._request(ctx)
            request["key"] = key
            request["log"] = log = self.log.take()
            try:
                data = await self._run(
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

    async def run_tools(self, ctx: EffectContext, decision: RunTools) -> Event:
        """Run each call as its own activity, concurrently; results in call order."""
        if self.cancelled is not None:
            return RunCancelled(reason=self.cancelled)
        calls = decision.calls
        log = self.log.take()
        if len(calls) > 1 and log is not None:  # one writer: not the calls racing
            try:
                await self._run(append_log, self.log.request(log), **self.log.options())
            except ActivityError as exc:
                return self._failed(exc, decision)
            self.log.done(log)
            log = None
        request = self._request(ctx)
        schedule = self._schedule("run_tools")

        async def one(index: int) -> Message:
            call = calls[index]
            data = await self._run(
                run_tool,
                {**request, "call": serde.to_json(call), "log": log},
                summary=f"tool {call.name} ({call.id})",
                **schedule,
            )
            message: Message = serde.from_json(Message, data)
            return message

        try:
            results = await asyncio.gather(*(one(i) for i in range(len(calls))))
        except ActivityError as exc:
            return self._failed(exc, decision)
        self.log.done(log)
        return ToolsFinished(results=results)

    def _failed(self, exc: ActivityError, decision: Any) -> Event:
        """The event (or the error) an activity that failed for good stands for."""
        cause = exc.cause
        if isinstance(cause, TemporalCancelled):
            if self.cancelled is not None:
                return RunCancelled(reason=self.cancelled)
            raise asyncio.CancelledError  # the workflow is being cancelled
        if isinstance(cause, ApplicationError):
            details = cause.details
            if cause.type == TRANSIENT and details:
                event: Event = serde.from_json(Event, details[0])
                return event
            if cause.type == TURNFSM_ERROR and details:
                raise serde.error_from_json(details[0]) from None
            if cause.type == CRASHED:
                raise EffectCrashed(cause.message) from None
        if isinstance(decision, CallLLM):
            # The model call never came back (timeouts, retries spent).
            return ModelFailed(
                error=ErrorInfo(
                    type="activity_failed", message=str(cause or exc), retryable=True
                )
            )
        raise EffectCrashed(f"{effect_key(decision)}: {cause or exc}") from None


def _summary(decision: Any) -> str:
    if isinstance(decision, CallLLM):
        return f"model call, turn {decision.turn + 1}"
    if isinstance(decision, Compact):
        return f"compaction ({decision.reason.value})"
    return effect_key(decision)


class _Status(Hook):
    """Where the run is, for the queries (always called, replay included)."""

    def __init__(self) -> None:
        self.phase = "start"
        self.estimate: int | None = None
        self.decision = ""
        self.turn = 0
        self.outcome = "running"
        self.waiting: Pause | None = None

    def on_run_start(self, info: RunStartInfo) -> None:
        self.outcome = "running"  # resumed after a pause, too

    def on_transition(self, info: TransitionInfo) -> None:
        self.phase = info.step.dest
        self.estimate = info.estimate
        self.turn = info.turn

    def on_decision(self, info: DecisionInfo) -> None:
        self.decision = decision_key(info.decision)

    def on_run_end(self, info: RunEndInfo) -> None:
        self.phase = info.phase
        self.outcome = info.outcome

    def to_json(self) -> dict[str, Any]:
        return {
            "phase": self.phase,
            "estimate": self.estimate,
            "decision": self.decision,
            "turn": self.turn,
            "outcome": self.outcome,
            "waiting": serde.to_json(self.waiting) if self.waiting else None,
        }


class _Quiet(Hook):
    """A hook that is not called while the workflow replays (internal)."""

    def __init__(self, inner: Hook) -> None:
        self.inner = inner


_QUIET: dict[type, type[_Quiet]] = {}


def _quiet(hook: Hook) -> Hook:
    """Wrap `hook` so that it hears each step once, not again on a replay."""
    kind = type(hook)
    cls = _QUIET.get(kind)
    if cls is None:

        def forward(name: str) -> Any:
            def method(self: _Quiet, info: Any) -> Any:
                if workflow.unsafe.is_replaying():
                    return None
                return getattr(self.inner, name)(info)

            method.__name__ = name
            return method

        overridden = {
            name: forward(name)
            for name in _METHODS
            if getattr(kind, name, None) is not getattr(Hook, name)
        }
        cls = _QUIET[kind] = type(f"Quiet{kind.__name__}", (_Quiet,), overridden)
    return cls(hook)


def _durable(agent: Agent, remote: _Remote) -> Driver:
    """The agent's driver, its effects scheduling activities (see the module)."""
    driver = agent.driver
    return attrs.evolve(
        driver,
        effects=remote.effects(),
        hooks=[_quiet(h) for h in driver.hooks],
        tracing=False,  # spans are made by the activities' effects
        clock=_now,
        compaction_timeout=None,  # enforced inside the activities
        effect_timeout=None,
    )


@final
@workflow.defn(name=WORKFLOW)
class TurnWorkflow:
    """One run of an agent, durable: see the module's theory of operation."""

    def __init__(self) -> None:
        self._control = RunControl()
        self._answers: list[Event] = []
        self._status = _Status()
        self._remote: _Remote | None = None

    @workflow.run
    async def run(self, start: dict[str, Any]) -> dict[str, Any]:
        """Run the agent's loop to its end; return the `RunResult` as JSON."""
        spec = RunSpec.from_json(start)
        agent = agent_named(spec.agent, workflow.info().task_queue)
        log = _WorkflowLog(spec)
        session = await Session.load(log, spec.session_id)
        self._remote = remote = _Remote(spec, agent.driver, log)
        driver = _durable(agent, remote)
        hooks = [self._status]
        control = self._control
        try:
            result = await driver.run(
                spec.input,
                session=session,
                control=control,
                hooks=hooks,
                run_id=spec.run_id,
            )
            await log.flush()
            while result.outcome == "paused":
                self._status.waiting = result.waiting
                event, cancelled = await self._next_answer()
                self._status.waiting = None
                result = await driver.resume(
                    session, spec.run_id, event, control=control, hooks=hooks
                )
                await log.flush()
                if cancelled:
                    raise asyncio.CancelledError
        except asyncio.CancelledError:
            await log.flush()  # the loop logged the cancellation
            raise
        except ApplicationError:
            raise
        except TurnFSMError as exc:
            # Refused before it began (SessionBusy, bad input), or ended by a
            # typed error the loop logged: the caller gets the same error.
            await log.flush()
            raise ApplicationError(
                str(exc),
                serde.error_to_json(exc),
                type=TURNFSM_ERROR,
                non_retryable=True,
            ) from exc
        except Exception as exc:
            # The loop logged the crash; the workflow fails for good.
            await log.flush()
            raise ApplicationError(
                f"the run crashed: {type(exc).__name__}: {exc}",
                {"type": type(exc).__name__, "message": str(exc)},
                type=CRASHED,
                non_retryable=True,
            ) from exc
        return result_to_json(result)

    async def _next_answer(self) -> tuple[Event, bool]:
        """Wait for the paused run's answer; a workflow cancel is one too."""
        try:
            await workflow.wait_condition(lambda: bool(self._answers))
        except asyncio.CancelledError:
            return RunCancelled(reason="the workflow was cancelled"), True
        return self._answers.pop(0), False

    # -- answers to a pause --------------------------------------------
    def _require_paused(self, trigger: str) -> None:
        waiting = self._status.waiting
        if waiting is None or self._answers:
            raise ApplicationError(
                f"run {self._status.phase!r} is not waiting for an answer",
                type="turnfsm.not_paused",
                non_retryable=True,
            )
        if trigger not in waiting.accepts:
            raise ApplicationError(
                f"the paused phase {waiting.phase!r} accepts "
                f"{', '.join(waiting.accepts)}, not {trigger}",
                type="turnfsm.not_accepted",
                non_retryable=True,
            )

    @workflow.update(name="approve")
    async def approve(self) -> None:
        """Approve every tool call the paused run waits on."""
        self._answers.append(ToolCallsReviewed.approve_all())

    @approve.validator
    def _check_approve(self) -> None:
        self._require_paused(_REVIEWED)

    @workflow.update(name="reject")
    async def reject(self, reasons: dict[str, str]) -> None:
        """Reject the tool calls named in `reasons` (call id -> reason)."""
        self._answers.append(ToolCallsReviewed.reject(reasons, new_id=_new_message_id))

    @reject.validator
    def _check_reject(self, reasons: dict[str, str]) -> None:
        self._require_paused(_REVIEWED)
        waiting = self._status.waiting
        calls = {c.id for c in waiting.calls} if waiting is not None else set()
        unknown = [k for k in reasons if k not in calls]
        if unknown or not all(isinstance(v, str) for v in reasons.values()):
            raise ApplicationError(
                f"reasons must map the paused calls' ids ({', '.join(sorted(calls))})"
                f" to strings; unknown: {', '.join(map(str, unknown)) or 'none'}",
                type="turnfsm.bad_answer",
                non_retryable=True,
            )

    @workflow.update(name="answer")
    async def answer(self, event: dict[str, Any]) -> None:
        """Answer the pause with any event its phase accepts (as JSON)."""
        self._answers.append(serde.from_json(Event, event))

    @answer.validator
    def _check_answer(self, event: dict[str, Any]) -> None:
        try:
            parsed = serde.from_json(Event, event)
        except Exception as exc:
            raise _refused(exc) from None
        self._require_paused(trigger_of(parsed))

    @workflow.update(name="inject")
    async def inject(self, message: str | dict[str, Any]) -> None:
        """Queue a message (text, or a message as JSON) for the next safe point."""
        self._control.inject(_message(message))

    @inject.validator
    def _check_inject(self, message: str | dict[str, Any]) -> None:
        if self._status.outcome not in ("running", "paused"):
            raise ApplicationError(
                f"the run has ended ({self._status.outcome})",
                type="turnfsm.ended",
                non_retryable=True,
            )
        if isinstance(message, str):
            return
        try:
            RunControl().inject(serde.from_json(Message, message))
        except Exception as exc:
            raise _refused(exc) from None

    @workflow.signal(name="cancel")
    def cancel(self, reason: str = "cancelled") -> None:
        """End the run ``cancelled``; the workflow completes with that result."""
        if self._status.waiting is not None and not self._answers:
            self._answers.append(RunCancelled(reason=reason))
        elif self._remote is None or not self._remote.cancel(reason):
            # No activity in flight: the loop takes it at its next step (no
            # cancel scope is open between effects).
            self._control.cancel(reason)

    # -- where the run is ----------------------------------------------
    @workflow.query(name="status")
    def status(self) -> dict[str, Any]:
        """Phase, estimate, last decision, turns, outcome, what a pause waits for."""
        return self._status.to_json()

    @workflow.query(name="phase")
    def phase(self) -> str:
        """The phase the run is in."""
        return self._status.phase

    @workflow.query(name="estimate")
    def estimate(self) -> int | None:
        """The brain's estimate of the next request, in tokens."""
        return self._status.estimate

    @workflow.query(name="last_decision")
    def last_decision(self) -> str:
        """The last decision carried out (``call_llm``, ``compact:threshold``...)."""
        return self._status.decision


def _refused(exc: Exception) -> ApplicationError:
    """An update's argument does not read: refused before it reaches the run."""
    return ApplicationError(str(exc), type="turnfsm.bad_answer", non_retryable=True)


def _message(value: str | dict[str, Any]) -> Message:
    if isinstance(value, str):
        return Message.user(value, id=_new_message_id())
    try:
        message: Message = serde.from_json(Message, value)
    except Exception as exc:
        raise InvalidMessage("message", value, f"a message ({exc})") from None
    return message
