"""`TracingHook`: a run as OpenTelemetry spans, events and metrics (GenAI conventions).

The span tree of one run::

    invoke_agent {agent}                      INTERNAL, the run
      turnfsm.turn                            one per turn (measure .. tools)
        turnfsm.compaction                    a pass: reason, tokens, outcome
          chat {model}                        CLIENT, a summary call attempt
        chat {model}                          CLIENT, one per attempt (retries)
        execute_tool {tool}                   INTERNAL, one per tool call
        turnfsm.effect                        a custom phase's effect
      (every transition: a `turnfsm.transition` span event)

Spans are parented explicitly (a hook sees a run from the loop's task and
its tools' tasks); the model-call and tool spans are also made current
while they run, so spans an SDK or a tool makes nest under them.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from typing import Any, Final, final

import attrs
from opentelemetry import context as otel_context
from opentelemetry import metrics, trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from turnfsm.core import (
    Compact,
    ModelReplied,
    OutputRejected,
    Perform,
    RunTools,
    ToolsFinished,
    emergency_line,
    threshold_line,
)
from turnfsm.errors import Cancelled, ProviderError
from turnfsm.hooks import (
    DecisionInfo,
    Hook,
    ModelCallEnd,
    ModelCallInfo,
    OutcomeInfo,
    RunEndInfo,
    RunStartInfo,
    ToolCallEnd,
    ToolCallInfo,
    TransitionInfo,
)
from turnfsm.messages import Message
from turnfsm.persistence import CompactionRecord, Verdict
from turnfsm.tracing import attributes as A

__all__ = ["CAPTURE_CONTENT_ENV", "TracingHook"]

CAPTURE_CONTENT_ENV: Final = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
"""The standard switch for GenAI message content in telemetry (off by default)."""

_SCOPE: Final = "turnfsm"


def _version() -> str:
    from turnfsm import __version__

    return __version__


@attrs.define(eq=False)
class _Run:
    """What one run's trace holds open (internal)."""

    root: Span
    session_id: str
    root_context: otel_context.Context
    turn: Span | None = None
    turn_context: otel_context.Context | None = None
    estimate: int | None = None
    phase: str = ""
    turn_over: bool = False
    compaction: Span | None = None
    effect: Span | None = None
    compacted: bool = False
    decided_at: float = 0.0
    decided_phase: str = ""
    calls: dict[str, tuple[Span, object]] = attrs.field(factory=dict)
    tools: dict[str, tuple[Span, object]] = attrs.field(factory=dict)


@final
class TracingHook(Hook):
    """Trace runs with OpenTelemetry: spans, transition events and metrics.

    One hook serves any number of concurrent runs. A `Driver` adds one by
    itself once a tracer provider is set up (see `Driver.tracing` and
    `turnfsm.tracing.configure`); pass one among its hooks to choose the
    providers or to capture content.

    Args:
        tracer_provider: Where spans go (default: the global provider).
        meter_provider: Where metrics go (default: the global provider).
        capture_content: Record messages, tool arguments and results on the
            spans. Off unless asked for, or unless the environment sets
            ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true``.
    """

    traces_runs: Final = True  # tells the driver not to add its own

    def __init__(
        self,
        *,
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: metrics.MeterProvider | None = None,
        capture_content: bool | None = None,
    ) -> None:
        version = _version()
        self._tracer = trace.get_tracer(
            _SCOPE, version, tracer_provider=tracer_provider
        )
        meter = metrics.get_meter(_SCOPE, version, meter_provider=meter_provider)
        self._tokens = meter.create_histogram(
            A.METRIC_TOKEN_USAGE,
            unit="{token}",
            description="Tokens used per model call, by type (input, output).",
            explicit_bucket_boundaries_advisory=A.TOKEN_BUCKETS,
        )
        self._duration = meter.create_histogram(
            A.METRIC_OPERATION_DURATION,
            unit="s",
            description="Seconds each model call attempt or tool call took.",
            explicit_bucket_boundaries_advisory=A.DURATION_BUCKETS,
        )
        self._phases = meter.create_histogram(
            A.METRIC_PHASE_DURATION,
            unit="s",
            description="Seconds the driver spent carrying out each phase.",
            explicit_bucket_boundaries_advisory=A.DURATION_BUCKETS,
        )
        self._compactions = meter.create_counter(
            A.METRIC_COMPACTIONS,
            unit="{pass}",
            description="Compaction passes, by reason and outcome.",
        )
        self._saved = meter.create_counter(
            A.METRIC_TOKENS_SAVED,
            unit="{token}",
            description="Tokens the compaction passes saved.",
        )
        self._run_count = meter.create_counter(
            A.METRIC_RUNS, unit="{run}", description="Runs ended, by outcome."
        )
        if capture_content is None:
            flag = os.environ.get(CAPTURE_CONTENT_ENV, "")
            capture_content = flag.strip().lower() in ("1", "true", "yes")
        self.capture_content = capture_content
        self._runs: dict[str, _Run] = {}

    # -- the run -------------------------------------------------------
    def on_run_start(self, info: RunStartInfo) -> None:
        """Open the run's ``invoke_agent`` span."""
        stale = self._runs.pop(info.run_id, None)
        if stale is not None:  # a run that never ended here (its end went unlogged)
            self._close(stale, cancelled=True)
            _end_open(stale.root, cancelled=True)
        attributes: dict[str, Any] = {
            A.OPERATION_NAME: A.OP_INVOKE_AGENT,
            A.AGENT_NAME: info.agent,
            A.CONVERSATION_ID: info.session_id,
            A.RUN_ID: info.run_id,
            A.MACHINE_NAME: info.machine,
            A.MACHINE_DIGEST: info.digest,
            A.RUN_RESUMED: info.resumed,
        }
        if info.provider:
            attributes[A.PROVIDER_NAME] = info.provider
        if info.model:
            attributes[A.REQUEST_MODEL] = info.model
        budget = info.budget
        if budget is not None and budget.context_window:
            window = budget.context_window
            attributes[A.WINDOW] = window
            attributes[A.EMERGENCY_LINE] = emergency_line(window)
            if budget.threshold:
                attributes[A.THRESHOLD_LINE] = threshold_line(window, budget.threshold)
        if self.capture_content and info.input:
            attributes[A.INPUT_MESSAGES] = _messages_json(info.input)
        root = self._tracer.start_span(
            f"{A.OP_INVOKE_AGENT} {info.agent}",
            kind=SpanKind.INTERNAL,
            attributes=attributes,
        )
        self._runs[info.run_id] = _Run(
            root=root,
            session_id=info.session_id,
            root_context=trace.set_span_in_context(root),
        )

    def on_run_end(self, info: RunEndInfo) -> None:
        """Close every span the run holds open, then the run's own."""
        run = self._runs.pop(info.run_id, None)
        if run is None:
            return
        cancelled = info.outcome == "cancelled"
        self._close(run, cancelled=cancelled)
        root = run.root
        usage = info.usage
        root.set_attributes(
            {
                A.RUN_OUTCOME: info.outcome,
                A.RUN_TURNS: info.turns,
                A.PHASE: info.phase,
                A.USAGE_INPUT_TOKENS: usage.input_tokens,
                A.USAGE_OUTPUT_TOKENS: usage.output_tokens,
            }
        )
        if self.capture_content and info.text:
            root.set_attribute(
                A.OUTPUT_MESSAGES, _messages_json((Message.assistant(info.text),))
            )
        error = info.error
        if cancelled:
            root.set_attribute(A.CANCELLED, True)
        elif error is not None:
            root.set_attribute(A.ERROR_TYPE, type(error).__name__)
            root.set_status(Status(StatusCode.ERROR, str(error)))
        root.end()
        self._run_count.add(1, {A.RUN_OUTCOME: info.outcome})

    def _close(self, run: _Run, *, cancelled: bool) -> None:
        """End what a run left open (a cancel, a crash, a pause)."""
        # Their tokens belong to the tasks that ran them (each calls its own
        # end hook, cancelled or not); only the spans are left to end.
        for span, _token in (*run.calls.values(), *run.tools.values()):
            _end_open(span, cancelled)
        run.calls.clear()
        run.tools.clear()
        for left in (run.effect, run.compaction):
            if left is not None:
                _end_open(left, cancelled)
        if run.turn is not None:
            self._end_turn(run, cancelled=cancelled)
        run.effect = run.compaction = None

    def _end_turn(self, run: _Run, *, cancelled: bool = False) -> None:
        turn = run.turn
        assert turn is not None
        turn.set_attribute(A.PHASE, run.phase)  # where the turn got to
        if run.estimate is not None:
            turn.set_attribute(A.ESTIMATE, run.estimate)
        _end_open(turn, cancelled)
        run.turn = run.turn_context = None

    # -- turns, phases, transitions -------------------------------------
    def on_decision(self, info: DecisionInfo) -> None:
        """Open a turn when one begins; open a compaction or effect span."""
        run = self._runs.get(info.run_id)
        if run is None:
            return
        decision = info.decision
        if run.turn is None or run.turn_over:
            if run.turn is not None:
                self._end_turn(run)
            # Tools (a resumed approval) belong to the turn whose call asked.
            number = info.turn if isinstance(decision, RunTools) else info.turn + 1
            run.turn = turn = self._tracer.start_span(
                A.SPAN_TURN,
                context=run.root_context,
                attributes={A.TURN_NUMBER: max(number, 1)},
            )
            run.turn_context = trace.set_span_in_context(turn)
            run.turn_over = False
        if isinstance(decision, Compact):
            run.compaction = self._tracer.start_span(
                A.SPAN_COMPACTION,
                context=run.turn_context,
                attributes={A.COMPACTION_REASON: str(decision.reason)},
            )
        elif isinstance(decision, Perform):
            run.effect = self._tracer.start_span(
                A.SPAN_EFFECT,
                context=run.turn_context,
                attributes={A.EFFECT: decision.effect, A.PHASE: info.phase},
            )
        run.decided_at = time.perf_counter()
        run.decided_phase = info.phase

    def on_outcome(self, info: OutcomeInfo) -> None:
        """Time the phase; tool results, or a reply that calls none, end a turn."""
        run = self._runs.get(info.run_id)
        if run is None:
            return
        self._phases.record(
            time.perf_counter() - run.decided_at, {A.PHASE: run.decided_phase}
        )
        event = info.event
        if isinstance(event, ToolsFinished) or (
            # A message injected meanwhile, or a re-ask for a structured
            # answer, makes the run go on: a new turn.
            isinstance(event, ModelReplied | OutputRejected)
            and not event.message.tool_calls
        ):
            run.turn_over = True  # ended when the next turn begins, or the run
        if run.effect is not None and isinstance(info.decision, Perform):
            run.effect.end()
            run.effect = None

    def on_transition(self, info: TransitionInfo) -> None:
        """Record the transition as a span event (from, to, trigger, guards)."""
        run = self._runs.get(info.run_id)
        if run is None:
            return
        step = info.step
        attributes: dict[str, Any] = {
            A.TRANSITION_FROM: step.source,
            A.TRANSITION_TO: step.dest,
            A.TRANSITION_TRIGGER: step.trigger,
            A.TRANSITION_INDEX: step.index,
            A.TRANSITION_GUARDS: step.guards,
        }
        if step.reason is not None:
            attributes[A.TRANSITION_REASON] = str(step.reason)
        if step.error is not None:
            attributes[A.TRANSITION_ERROR] = step.error
        if info.estimate is not None:
            attributes[A.ESTIMATE] = run.estimate = info.estimate
        run.phase = step.dest
        span = run.turn if run.turn is not None else run.root
        span.add_event(A.EVENT_TRANSITION, attributes)

    # -- compaction ----------------------------------------------------
    def on_compaction_pass(self, record: CompactionRecord) -> None:
        """End the pass's span with its verdict and tokens."""
        run = self._runs.get(record.run_id)
        if run is None:
            return
        saved = record.tokens_saved
        labels = {
            A.COMPACTION_REASON: str(record.reason),
            A.COMPACTION_OUTCOME: str(record.outcome),
            A.COMPACTION_STRATEGY: record.strategy,
        }
        self._compactions.add(1, labels)
        if saved and record.compacted:
            self._saved.add(saved, labels)
        if record.compacted:
            run.compacted = True
        span = run.compaction
        run.compaction = None
        if span is None:
            return
        span.set_attributes(
            {
                A.COMPACTION_STRATEGY: record.strategy,
                A.COMPACTION_OUTCOME: str(record.outcome),
                A.TOKENS_BEFORE: record.tokens_before,
                A.TOKENS_AFTER: record.tokens_after,
                A.TOKENS_SAVED: saved if record.compacted else 0,
            }
        )
        if record.usage is not None:
            span.set_attributes(
                {
                    A.USAGE_INPUT_TOKENS: record.usage.input_tokens,
                    A.USAGE_OUTPUT_TOKENS: record.usage.output_tokens,
                }
            )
        if record.outcome in (Verdict.FAILED, Verdict.OVERFLOW):
            span.set_attribute(A.ERROR_TYPE, f"compaction_{record.outcome}")
            span.set_status(Status(StatusCode.ERROR, f"the pass {record.outcome}"))
        span.end()

    # -- model calls -------------------------------------------------------
    def on_model_call_start(self, info: ModelCallInfo) -> None:
        """Open a ``chat`` span for the attempt (made current while it runs)."""
        run = self._runs.get(info.run_id)
        if run is None:
            return
        if info.purpose == "summary" and run.compaction is not None:
            parent = trace.set_span_in_context(run.compaction)
        else:
            parent = run.turn_context or run.root_context
        request = info.request
        attributes: dict[str, Any] = {
            A.OPERATION_NAME: A.OP_CHAT,
            A.CONVERSATION_ID: info.session_id,
            A.ATTEMPT: info.attempt,
            A.PURPOSE: info.purpose,
        }
        if info.provider:
            attributes[A.PROVIDER_NAME] = info.provider
        if info.model:
            attributes[A.REQUEST_MODEL] = info.model
        if request.max_tokens is not None:
            attributes[A.REQUEST_MAX_TOKENS] = request.max_tokens
        if request.temperature is not None:
            attributes[A.REQUEST_TEMPERATURE] = request.temperature
        if info.attempt > 1:
            attributes[A.RETRY_WAIT] = round(info.waited, 6)
        if info.purpose == "turn" and run.compacted:
            attributes[A.CONVERSATION_COMPACTED] = True
            run.compacted = False
        if self.capture_content:
            attributes[A.INPUT_MESSAGES] = _messages_json(request.messages)
            if request.system:
                attributes[A.SYSTEM_INSTRUCTIONS] = request.system
        span = self._tracer.start_span(
            f"{A.OP_CHAT} {info.model}" if info.model else A.OP_CHAT,
            context=parent,
            kind=SpanKind.CLIENT,
            attributes=attributes,
        )
        token = otel_context.attach(trace.set_span_in_context(span))
        run.calls[info.key] = (span, token)

    def on_model_call_end(self, info: ModelCallEnd) -> None:
        """End the attempt's span: its usage, or its error."""
        call = info.call
        run = self._runs.get(call.run_id)
        if run is None:
            return
        opened = run.calls.pop(call.key, None)
        if opened is None:
            return
        span, token = opened
        _detach(token)
        labels: dict[str, Any] = {A.OPERATION_NAME: A.OP_CHAT}
        if call.provider:
            labels[A.PROVIDER_NAME] = call.provider
        if call.model:
            labels[A.REQUEST_MODEL] = call.model
        response = info.response
        if response is not None:
            if response.model:
                span.set_attribute(A.RESPONSE_MODEL, response.model)
                labels[A.RESPONSE_MODEL] = response.model
            usage = response.usage
            if usage is not None:
                span.set_attributes(
                    {
                        A.USAGE_INPUT_TOKENS: usage.input_tokens,
                        A.USAGE_OUTPUT_TOKENS: usage.output_tokens,
                    }
                )
                self._tokens.record(
                    usage.input_tokens, {**labels, A.TOKEN_TYPE: "input"}
                )
                self._tokens.record(
                    usage.output_tokens, {**labels, A.TOKEN_TYPE: "output"}
                )
            if self.capture_content:
                span.set_attribute(
                    A.OUTPUT_MESSAGES, _messages_json((response.message,))
                )
        elif info.error is not None:
            kind = _fail(span, info.error)
            if kind is not None:
                labels[A.ERROR_TYPE] = kind
        self._duration.record(info.duration, labels)
        span.end()

    # -- tools -----------------------------------------------------------
    def on_tool_start(self, info: ToolCallInfo) -> None:
        """Open an ``execute_tool`` span (made current while the tool runs)."""
        run = self._runs.get(info.run_id)
        if run is None:
            return
        call = info.call
        attributes: dict[str, Any] = {
            A.OPERATION_NAME: A.OP_EXECUTE_TOOL,
            A.TOOL_NAME: call.name,
            A.TOOL_CALL_ID: call.id,
            A.TOOL_TYPE: "function",
            A.CONVERSATION_ID: info.session_id,
        }
        if self.capture_content:
            attributes[A.TOOL_CALL_ARGUMENTS] = _json(call.arguments)
        span = self._tracer.start_span(
            f"{A.OP_EXECUTE_TOOL} {call.name}",
            context=run.turn_context or run.root_context,
            kind=SpanKind.INTERNAL,
            attributes=attributes,
        )
        token = otel_context.attach(trace.set_span_in_context(span))
        run.tools[call.id] = (span, token)

    def on_tool_end(self, info: ToolCallEnd) -> None:
        """End the tool's span; an error result marks it failed."""
        run = self._runs.get(info.call.run_id)
        if run is None:
            return
        opened = run.tools.pop(info.call.call.id, None)
        if opened is None:
            return
        span, token = opened
        _detach(token)
        labels: dict[str, Any] = {
            A.OPERATION_NAME: A.OP_EXECUTE_TOOL,
            A.TOOL_NAME: info.call.call.name,
        }
        if info.result is not None:
            # A tool message has no text parts: its content is its results'.
            text = "".join(p.content for p in info.result.tool_results)
            if self.capture_content:
                span.set_attribute(A.TOOL_CALL_RESULT, text)
            if info.is_error:
                span.set_attribute(A.ERROR_TYPE, "tool_error")
                # An error result is content too (it may quote the arguments).
                described = text[:500] if self.capture_content else None
                span.set_status(Status(StatusCode.ERROR, described))
                labels[A.ERROR_TYPE] = "tool_error"
        elif info.error is not None:
            kind = _fail(span, info.error)
            if kind is not None:
                labels[A.ERROR_TYPE] = kind
        self._duration.record(info.duration, labels)
        span.end()


def _fail(span: Span, error: BaseException) -> str | None:
    """Mark `span` with how its operation ended; the error type, or None (cancel)."""
    if _is_cancellation(error):
        span.set_attribute(A.CANCELLED, True)
        return None
    if isinstance(error, ProviderError):
        # Its own words, not its text as a run's failure ("retries exhausted").
        kind, described = error.kind, error.message
    else:
        kind, described = type(error).__name__, str(error)
    span.set_attribute(A.ERROR_TYPE, kind)
    span.record_exception(error)
    span.set_status(Status(StatusCode.ERROR, described[:500]))
    return kind


def _is_cancellation(error: BaseException) -> bool:
    if isinstance(error, Cancelled):
        return True
    kind = type(error)
    return kind.__name__ in ("CancelledError", "Cancelled") and kind.__module__ in (
        "asyncio.exceptions",
        "trio",
        "trio._core._exceptions",
    )


def _end_open(span: Span, cancelled: bool) -> None:
    if cancelled:
        span.set_attribute(A.CANCELLED, True)
    span.end()


def _detach(token: object) -> None:
    otel_context.detach(token)  # type: ignore[arg-type]


def _messages_json(messages: Any) -> str:
    return _json([m.to_dict() for m in messages])


def _json(value: object) -> str:
    if isinstance(value, Mapping):
        value = dict(value)
    return json.dumps(value, default=str, ensure_ascii=False)
