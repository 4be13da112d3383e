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
- a call of a sub-agent tool (`Agent.as_tool`) whose agent the worker
  serves runs that agent as a child workflow, this same workflow type: its
  run is linked to the call (`RunSpec.parent`), its session is in this
  run's store, its answer is the call's result, and the parent waits for
  it, a pause for an answer included (the child is answered on its own
  workflow); cancelling the parent cancels it. A phase running a
  sub-agent (`PhaseDelegation`) does the same, its answer the signal the
  phase ends with;
- the built-in measurement runs here: it only counts tokens (deterministic);
- the session's log is the same log as in-process, written through a
  store (`_WorkflowLog`, in `turnfsm.temporal._remote`) that keeps what
  the loop appends until the next activity carries it to the real store,
  before its effect starts; a pause, the end of the run and a batch of
  several tool calls write it first with ``turnfsm.append``;
- with `DurableOptions.local_activities`, the effects and tool calls run as
  local activities, in this worker, inside the workflow task; each carries
  only the log of workflow tasks that have ended (their results are in the
  history), the run's first step writes the log first, and a step whose
  worker stops mid-way runs again as an activity the server schedules, for
  another worker to carry out (the task ends, keeping the steps it finished).

So the brain, the machine file, the audit trail, the hooks and the stores
are those of an in-process run; the workflow's history is the journal of
every effect's outcome, and replaying it rebuilds the same brain. What the
brain sees comes only from events (the activities' results, the updates'
arguments) and from the workflow's clock and id source, so a replay makes
the same decisions, timestamps and message ids.

A long run moves to a fresh history: past `DurableOptions.history_limit`
events, or when the server suggests it, an effect about to begin stops the
run instead (`ContinuedAsNew`, logged as its interruption; `_Remote`), and
the workflow continues as new with `RunSpec.resume`, resuming the run from
its log with what its steering had queued.

Observing hooks (`on_transition`, `on_run_end`, ...) are called here, but
not while Temporal replays history the workflow already made: each fires
once per step in the normal course. The hooks an effect calls
(`on_model_call_*`, `on_tool_*`, `pre_compact`) are called in the activity.

Steering: the updates ``approve``, ``reject`` and ``answer`` answer a pause;
``inject`` queues a message (`RunControl.inject`); the signal ``cancel``
ends the run ``cancelled`` and the workflow completes with that result.
Cancelling the workflow itself (Temporal's cancellation) records the run
as cancelled, then the workflow ends cancelled. The query ``status`` (and
``phase``, ``estimate``, ``last_decision``) reads where the run is, and
which child workflows it waits on.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, Final, final

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.exceptions import CancelledError as TemporalCancelled

with workflow.unsafe.imports_passed_through():
    # Imported here, not lazily: a lazy import (importlib) inside a workflow
    # is not passed through the sandbox (turnfsm's machine files, anyio's
    # backend).
    import anyio._backends._asyncio  # noqa: F401
    import attrs

    import turnfsm._resources  # noqa: F401
    from turnfsm import _checks, serde
    from turnfsm.agent import Agent
    from turnfsm.core import (
        Event,
        Pause,
        RunCancelled,
        Signal,
        ToolCallsReviewed,
        trigger_of,
    )
    from turnfsm.driver import (
        Delegation,
        Driver,
        RunControl,
        RunResult,
        check_answer,
        injection_refusal,
        missing_tools,
    )
    from turnfsm.errors import (
        ConfigError,
        ContinuedAsNew,
        InvalidMessage,
        SessionBusy,
        SessionConflict,
        TurnFSMError,
    )
    from turnfsm.hooks import (
        HOOK_METHODS,
        DecisionInfo,
        Hook,
        RunEndInfo,
        RunStartInfo,
        TransitionInfo,
    )
    from turnfsm.messages import Message
    from turnfsm.persistence import Session, decision_key, machine_digest
    from turnfsm.temporal._activities import (
        CRASHED,
        agent_named,
        not_retried,
    )
    from turnfsm.temporal._payloads import (
        WORKFLOW,
        DurableOptions,
        RunSpec,
        RunStatus,
        payload_size,
        run_result,
    )
    from turnfsm.temporal._remote import (
        CALL_TIMED_OUT,
        _Remote,
        _WorkflowLog,
        new_message_id,
        now,
    )

__all__ = ["TurnWorkflow"]


_REVIEWED: Final = "tool_calls_reviewed"


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

    def resumed(self, status: RunStatus) -> None:
        """Start from where the run stopped (continued as new), not from scratch."""
        self.phase = status.phase
        self.estimate = status.estimate
        self.decision = status.decision
        self.turn = status.turn

    def on_transition(self, info: TransitionInfo) -> None:
        self.phase = info.step.dest
        self.estimate = info.estimate
        self.turn = info.turn

    def on_decision(self, info: DecisionInfo) -> None:
        self.decision = decision_key(info.decision)

    def on_run_end(self, info: RunEndInfo) -> None:
        self.phase = info.phase
        if not isinstance(info.error, ContinuedAsNew) and info.outcome != "paused":
            # Stopped to continue as new, the run goes on: still running
            # (its steering is taken, and carried to the new workflow run).
            # Paused, it is told so with what it waits for (`paused`), once
            # its log is written: never paused waiting for nothing.
            self.outcome = info.outcome

    def paused(self, waiting: Pause | None) -> None:
        """The run waits for `waiting` (None: an answer came, it goes on)."""
        self.waiting = waiting
        self.outcome = "running" if waiting is None else "paused"

    def value(self, children: tuple[str, ...] = ()) -> RunStatus:
        return RunStatus(
            phase=self.phase,
            estimate=self.estimate,
            decision=self.decision,
            turn=self.turn,
            outcome=self.outcome,
            waiting=self.waiting,
            children=children,
        )

    def to_json(self, children: tuple[str, ...]) -> Any:
        return serde.to_json(self.value(children))


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
            for name in HOOK_METHODS
            if getattr(kind, name, None) is not getattr(Hook, name)
        }
        cls = _QUIET[kind] = type(f"Quiet{kind.__name__}", (_Quiet,), overridden)
    return cls(hook)


def _durable(agent: Agent, remote: _Remote) -> Driver:
    """The agent's driver, its effects scheduling activities (see the module)."""
    driver = agent.driver
    effects = remote.effects()
    # The phases running the sub-agents the machine file declares take no
    # effect of their own (the driver builds theirs): set after it is built.
    declared = {s.name for s in driver.machine.subagents}
    durable = attrs.evolve(
        driver,
        effects={k: e for k, e in effects.items() if k not in declared},
        hooks=[_quiet(h) for h in driver.hooks],
        tracing=False,  # spans are made by the activities' effects
        clock=now,
        compaction_timeout=None,  # enforced inside the activities
        effect_timeout=None,
        # The workflow's log only buffers (the activities write the store,
        # each under its own timeout); a deadline here would be a timer.
        store_timeout=None,
    )
    durable._effects.update({k: effects[k] for k in declared})
    return durable


@final
@workflow.defn(name=WORKFLOW)
class TurnWorkflow:
    """One run of an agent, durable: see the module's theory of operation."""

    @workflow.init
    def __init__(self, start: dict[str, Any]) -> None:
        self._control = RunControl()
        self._answers: list[Event] = []
        self._status = _Status()
        self._remote: _Remote | None = None
        self._tools: frozenset[str] = frozenset()  # the workers' agent's
        self._changed: ConfigError | None = None  # the workers' agent is not it
        # The run's driver and session, to check an answer as resuming would.
        self._answering: tuple[Driver, Session] | None = None
        try:
            self._spec: RunSpec | TurnFSMError = serde.from_json(RunSpec, start)
        except TurnFSMError as exc:  # not a start turnfsm wrote
            self._spec = exc
        else:
            # What the run's steering queued before it continued as new goes
            # first: before any message injected into this workflow run; and
            # its status is where it stopped, while the log is read again.
            self._control.requeue(self._spec.queued)
            if self._spec.status is not None:
                self._status.resumed(self._spec.status)

    @workflow.run
    async def run(self, start: dict[str, Any]) -> Any:
        """Run the agent's loop to its end; return the `RunResult` as JSON."""
        spec = self._spec
        if isinstance(spec, TurnFSMError):
            raise not_retried(spec) from None
        # A sub-agent's run records the call that started it; its own
        # sub-agents are one deeper.
        with Delegation.child_run(spec.parent):
            return await self._run(spec)

    async def _run(self, spec: RunSpec) -> Any:
        agent = agent_named(spec.agent, workflow.info().task_queue)
        self._tools = frozenset(agent.driver._tools)
        served = machine_digest(agent.driver.machine)
        if spec.machine and spec.machine != served:
            # Another build of the agent than the run's: refused at its start;
            # a run under way stops here, to go on once the workers serve it.
            self._changed = ConfigError(
                "agent",
                spec.agent,
                f"the agent as the run was started with it, on machine "
                f"{spec.machine}; the workers of its task queue serve it on "
                f"machine {served}: give the workers and the caller the same "
                "build of the agent",
            )
            raise not_retried(self._changed)
        log = _WorkflowLog(spec)
        session = await Session.open(log, spec.session_id)
        self._remote = remote = _Remote(spec, agent.driver, log)
        driver = _durable(agent, remote)
        self._answering = (driver, session)
        hooks = [self._status]
        control = self._control
        result: RunResult[Any] | None = None
        try:
            if spec.resume:  # continued as new: the run is open in its log
                result = await driver.resume(
                    session, spec.run_id, control=control, hooks=hooks
                )
            else:
                result = await driver.run(
                    spec.input,
                    session=session,
                    control=control,
                    hooks=hooks,
                    run_id=spec.run_id,
                )
            await _written(log)
            while result.outcome == "paused":
                self._status.paused(result.waiting)
                event, cancelled = await self._next_answer()
                self._status.paused(None)
                try:
                    result = await driver.resume(
                        session, spec.run_id, event, control=control, hooks=hooks
                    )
                except ConfigError as exc:  # the answer refused: nothing written
                    raise left_paused(exc, spec.session_id) from exc
                await _written(log)
                if cancelled:
                    raise asyncio.CancelledError
            if _continues(result):
                # Its log is written; what its steering queued goes with it.
                await workflow.wait_condition(workflow.all_handlers_finished)
        except asyncio.CancelledError:
            if result is not None and _continues(result):
                # The workflow was cancelled while the run stopped to continue
                # as new: the run ends here, cancelled, and lets its session go.
                control.cancel("the workflow was cancelled")
                await driver.resume(session, spec.run_id, control=control, hooks=hooks)
            await log.flush()  # the loop logged the cancellation
            raise
        except ApplicationError:
            raise
        except TurnFSMError as exc:
            # Refused before it began (SessionBusy, bad input), or ended by a
            # typed error the loop logged: the caller gets the same error.
            if isinstance(exc, SessionBusy):
                raise not_retried(log.busy(exc)) from exc
            if not isinstance(exc, SessionConflict):
                await _flushed(log)  # else the store takes nothing from this run
            raise not_retried(exc) from exc
        except Exception as exc:
            # The loop logged the crash; the workflow fails for good.
            await log.flush()
            kind, message = _checks.crash_named(exc)
            raise ApplicationError(
                f"the run crashed: {kind}: {message}",
                {"type": kind, "message": message},
                type=CRASHED,
                non_retryable=True,
            ) from exc
        if _continues(result):
            workflow.continue_as_new(
                serde.to_json(
                    attrs.evolve(
                        spec,
                        input=(),
                        resume=True,
                        queued=control.queued(),
                        status=self._status.value(),
                    )
                )
            )
        return run_result(result)

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
            given = "; an answer to its pause is on its way" if self._answers else ""
            raise ApplicationError(
                f"a run paused for an answer (it is in phase "
                f"{self._status.phase!r}{given})",
                type="turnfsm.not_paused",
                non_retryable=True,
            )
        if trigger not in waiting.answers:
            raise ApplicationError(
                f"an answer the paused phase {waiting.phase!r} accepts "
                f"({', '.join(waiting.answers)}), not {trigger}",
                type="turnfsm.not_accepted",
                non_retryable=True,
            )

    def _require_tools(self, answer: Event) -> None:
        """Refuse an answer that lets run a call whose tool the workers lack.

        Taken, it would fail the workflow, its run left paused in the log.
        """
        waiting = self._status.waiting
        assert waiting is not None  # _require_paused
        missing = missing_tools(waiting.calls, answer, self._tools)
        if missing:
            names = ", ".join(sorted({c.name for c in missing}))
            calls = ", ".join(c.id for c in missing)
            raise ApplicationError(
                f"an answer the workers can carry out: their agent lacks the "
                f"tools the run calls ({names}); serve the agent with them "
                "(create_worker) and answer again, or reject the calls to them "
                f"({calls}) with DurableRun.reject; the run stays paused",
                type="turnfsm.bad_answer",
                non_retryable=True,
            )

    @workflow.update(name="approve")
    async def approve(self) -> None:
        """Approve every tool call the paused run waits on."""
        self._answers.append(ToolCallsReviewed.approve_all())

    @approve.validator
    def _check_approve(self) -> None:
        self._require_paused(_REVIEWED)
        self._require_tools(ToolCallsReviewed.approve_all())

    @workflow.update(name="reject")
    async def reject(self, reasons: dict[str, str]) -> None:
        """Reject the tool calls named in `reasons` (call id -> reason)."""
        self._answers.append(ToolCallsReviewed.reject(reasons, new_id=new_message_id))

    @reject.validator
    def _check_reject(self, reasons: dict[str, str]) -> None:
        self._require_paused(_REVIEWED)
        self._check_size("reasons", reasons)
        waiting = self._status.waiting
        calls = {c.id for c in waiting.calls} if waiting is not None else set()
        unknown = [k for k in reasons if k not in calls]
        strings = all(isinstance(v, str) for v in reasons.values())
        if not reasons or unknown or not strings:  # none: it would approve all
            raise ApplicationError(
                f"the paused calls' ids ({', '.join(sorted(calls))}) mapped to "
                "reasons (strings), at least one; unknown: "
                f"{', '.join(map(str, unknown)) or 'none'}",
                type="turnfsm.bad_answer",
                non_retryable=True,
            )
        # Answered by id only: the validator may not draw fresh message ids.
        self._require_tools(ToolCallsReviewed.reject(reasons, new_id=lambda: "m"))

    @workflow.update(name="answer")
    async def answer(self, event: dict[str, Any]) -> None:
        """Answer the pause with any event its phase accepts (as JSON)."""
        self._answers.append(serde.from_json(Event, event))

    @answer.validator
    def _check_answer(self, event: dict[str, Any]) -> None:
        self._check_size("an answer", event)
        try:
            parsed = serde.from_json(Event, event)
        except Exception as exc:
            raise _refused(exc) from None
        self._require_paused(trigger_of(parsed))
        waiting = self._status.waiting
        assert waiting is not None  # _require_paused
        try:
            waiting.check_answer(parsed)  # the call ids it answers, its messages
            if self._answering is not None and isinstance(parsed, Signal):
                # The text a signal adds to the conversation (missing or
                # blank, resuming would refuse it, failing the workflow):
                # the check an in-process resume makes, on the run's log.
                driver, session = self._answering
                spec = self._spec
                assert isinstance(spec, RunSpec)  # the run is paused
                check_answer(driver, session, spec.run_id, parsed)
        except ConfigError as exc:
            raise _refused(exc) from None
        self._require_tools(parsed)

    @workflow.update(name="inject")
    async def inject(self, message: str | dict[str, Any]) -> None:
        """Queue a message (text, or a message as JSON) for the next safe point."""
        try:
            self._control.inject(_message(message))
        except InvalidMessage as exc:  # refused, not a failed workflow task
            raise not_retried(exc) from None

    @inject.validator
    def _check_inject(self, message: str | dict[str, Any]) -> None:
        if self._status.outcome not in ("running", "paused"):
            raise ApplicationError(
                f"a run still going (it has ended {self._status.outcome})",
                type="turnfsm.ended",
                non_retryable=True,
            )
        self._check_size("a message", message)
        refusal = self._injection_refusal()
        if isinstance(message, str):
            if refusal is not None:
                raise not_retried(InvalidMessage("message", message, refusal))
            return
        try:
            parsed = serde.from_json(Message, message)
        except Exception as exc:
            raise not_retried(
                InvalidMessage("message", message, f"a message ({exc})")
            ) from None
        if refusal is not None:
            raise not_retried(InvalidMessage("message", parsed.id, refusal))
        try:
            # Checked against what is queued, without queueing it: a message
            # queued already is refused here, as RunControl.inject refuses it.
            probe = RunControl()
            probe.requeue(self._control.queued())
            probe.inject(parsed)
        except InvalidMessage as exc:
            raise not_retried(exc) from None

    def _injection_refusal(self) -> str | None:
        """Why the run's machine takes no injected message (None: it takes them).

        Asked of the agent the workers serve, paused or not: a message its
        machine takes in no phase would fail the run when it next steps.
        None when the workers serve no such agent (the run fails on that).
        """
        spec = self._spec
        if not isinstance(spec, RunSpec):
            return None
        try:
            agent = agent_named(spec.agent, workflow.info().task_queue)
        except ApplicationError:
            return None
        return injection_refusal(agent.driver.machine)

    def _check_size(self, what: str, value: object) -> None:
        """Refuse an answer or a message past half the payload limit.

        It would ride in every later step (a reason as a tool result, a
        message in the conversation) and fail the run there: refused where
        it is sent, the run goes on.
        """
        spec = self._spec
        options = spec.options if isinstance(spec, RunSpec) else DurableOptions()
        limit = options.payload_limit // 2
        size = payload_size(value)
        if size > limit:
            raise ApplicationError(
                f"{what} of at most {limit:,} bytes (half of "
                "DurableOptions.payload_limit, what a durable run's step carries "
                f"of one message); this one is {size:,}",
                type="turnfsm.bad_answer",
                non_retryable=True,
            )

    @workflow.signal(name=CALL_TIMED_OUT)
    def call_timed_out(self, reason: str) -> None:
        """The call that runs this sub-agent timed out: end the run, unless it waits.

        As in-process, a sub-agent past its caller's ``tool_timeout`` (a
        phase's ``effect_timeout``) ends, cancelled; one waiting for an
        answer, or on a sub-agent of its own, is left to wait: its caller
        waits for it, and tells it again later.
        """
        waits = self._status.waiting is not None or (
            self._remote is not None and bool(self._remote.children)
        )
        if not waits and self._status.outcome == "running":
            self.cancel(reason)

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
    def status(self) -> Any:
        """Phase, estimate, last decision, turns, outcome, what the run waits for.

        What it waits for: the answer a pause waits for, or the sub-agents'
        runs (child workflows) in flight, by session id.
        """
        if self._changed is not None:
            raise not_retried(self._changed)
        remote = self._remote
        return self._status.to_json(tuple(remote.children) if remote else ())

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


def _continues(result: RunResult[Any]) -> bool:
    """Whether the run stopped for its workflow to continue as new."""
    return result.outcome == "interrupted" and isinstance(result.error, ContinuedAsNew)


async def _written(log: _WorkflowLog) -> None:
    """Write the log; its activity cancelled with the workflow is that cancellation."""
    try:
        await log.flush()
    except ActivityError as exc:
        if isinstance(exc.cause, TemporalCancelled):
            raise asyncio.CancelledError from None
        raise


async def _flushed(log: _WorkflowLog) -> None:
    """Write the log of a run that ended on a typed error, if the store takes it.

    A store that refused the run's log (another store than the one the
    run began in) refuses it again: the run's own error stands.
    """
    with contextlib.suppress(TurnFSMError):
        await log.flush()


def left_paused(exc: ConfigError, session_id: str) -> ConfigError:
    """`exc`, refusing a paused run's answer, saying the workflow ends on it.

    Nothing was written: the log keeps the run paused, and its session held
    by a workflow that will not answer it again.
    """
    expected = exc.expected.removesuffix("; the run stays paused")
    return ConfigError(
        exc.field,
        exc.value,
        f"{expected}. This answer failed the run's workflow: the session's log "
        "keeps the run paused and its session held, so take the run over with "
        f"force=True: turnfsm resume {session_id} --force, or turnfsm abandon "
        f"{session_id} --force (Agent.resume or Agent.abandon with force=True)",
    )


def _refused(exc: Exception) -> ApplicationError:
    """An update's argument does not read: refused before it reaches the run."""
    return ApplicationError(str(exc), type="turnfsm.bad_answer", non_retryable=True)


def _message(value: str | dict[str, Any]) -> Message:
    if isinstance(value, str):
        return Message.user(value, id=new_message_id())
    try:
        message: Message = serde.from_json(Message, value)
    except Exception as exc:
        raise InvalidMessage("message", value, f"a message ({exc})") from None
    return message
