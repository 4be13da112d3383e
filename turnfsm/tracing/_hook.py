"""`TracingHook`: a run as OpenTelemetry spans, events and metrics (GenAI conventions).

The span tree of one run::

    invoke_agent {agent}                      INTERNAL, the run
      turnfsm.turn {n}                        one per turn (measure .. tools):
                                              its number, estimate and usage
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

import time
from collections.abc import Callable
from typing import Final, final

from opentelemetry import context as otel_context
from opentelemetry import metrics, trace
from opentelemetry.trace import Span, SpanKind

from turnfsm._checks import boolean, check, instance
from turnfsm.core import (
    Compact,
    CompactorFailed,
    ModelReplied,
    OutputRejected,
    Perform,
    RunCancelled,
    RunTools,
    ToolsFinished,
)
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
from turnfsm.persistence import CompactionRecord
from turnfsm.tracing import attributes as A
from turnfsm.tracing._call_spans import (
    chat_attributes,
    end_chat,
    end_tool,
    tool_attributes,
)
from turnfsm.tracing._compaction_spans import (
    end_compaction,
    pass_labels,
    start_compaction,
    start_effect,
)
from turnfsm.tracing._content import NAME_CHARS, cut, total_attributes
from turnfsm.tracing._otlp import CAPTURE_CONTENT_ENV, _env_flag
from turnfsm.tracing._run_spans import (
    Opened,
    OpenRun,
    add_transition,
    close,
    end_open,
    end_run,
    end_turn,
    run_attributes,
)

__all__ = ["CAPTURE_CONTENT_ENV", "TracingHook"]


_SCOPE: Final = "turnfsm"

_WENT_ON_KEPT: Final = 10_000
"""Paused or interrupted runs whose root a resumption here can link to."""

_REPLIES: Final = (ModelReplied, OutputRejected)


def _loose_attributes(run_id: str, turn: int) -> dict[str, str | int]:
    """What a call made where its run is not open says of it: no run span does."""
    return {A.RUN_ID: run_id, A.TURN_NUMBER: turn}


def _version() -> str:
    from turnfsm import __version__

    return __version__


_TRACER_PROVIDER: Final = instance(
    trace.TracerProvider, "an OpenTelemetry TracerProvider", optional=True
)
_METER_PROVIDER: Final = instance(
    metrics.MeterProvider, "an OpenTelemetry MeterProvider", optional=True
)


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

    Raises:
        ConfigError: a provider is not an OpenTelemetry one, or
            `capture_content` is not True, False or None; or it is not
            given and that variable is neither true nor false (``1``,
            ``yes``, ``0``, ``no`` too).
    """

    traces_runs: Final = True  # tells the driver not to add its own

    def __init__(
        self,
        *,
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: metrics.MeterProvider | None = None,
        capture_content: bool | None = None,
    ) -> None:
        check(tracer_provider, "tracer_provider", _TRACER_PROVIDER)
        check(meter_provider, "meter_provider", _METER_PROVIDER)
        check(capture_content, "capture_content", boolean(optional=True))
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
            capture_content = _env_flag(CAPTURE_CONTENT_ENV)
        self.capture_content = capture_content
        self._runs: dict[str, OpenRun] = {}
        # The model and tool calls made where their run is not open: a
        # durable run's activities, in a worker (the run lives in its
        # workflow). Each is a span of its own, under the current span.
        self._loose: dict[tuple[str, str, str], tuple[Span, Opened]] = {}
        # The root span of each run that paused or was interrupted here, so
        # that the trace of its resumption links to it (newest kept).
        self._went_on: dict[str, trace.SpanContext] = {}
        self._tracer_for: Callable[[str], trace.Tracer] | None = None

    def _trace_agents_apart(self, tracer_for: Callable[[str], trace.Tracer]) -> None:
        """Trace each agent's runs with ``tracer_for(agent name)`` from now on.

        `configure` uses it so that each agent's runs land in a service
        (Jaeger) and a project (Phoenix) named after the agent.
        """
        self._tracer_for = tracer_for

    # -- the run -------------------------------------------------------
    def on_run_start(self, info: RunStartInfo) -> None:
        """Open the run's ``invoke_agent`` span."""
        stale = self._runs.pop(info.run_id, None)
        if stale is not None:  # a run that never ended here (its end went unlogged)
            close(stale, cancelled=True)
            end_open(stale.root, cancelled=True)
        tracer = self._tracer
        if self._tracer_for is not None:
            tracer = self._tracer_for(info.agent)
        earlier = self._went_on.pop(info.run_id, None) if info.resumed else None
        root = tracer.start_span(
            f"{A.OP_INVOKE_AGENT} {info.agent}",
            kind=SpanKind.INTERNAL,
            attributes=run_attributes(info, capture=self.capture_content),
            links=None if earlier is None else (trace.Link(earlier),),
        )
        self._runs[info.run_id] = OpenRun(
            root=root,
            tracer=tracer,
            session_id=info.session_id,
            root_context=trace.set_span_in_context(root),
        )

    def on_run_end(self, info: RunEndInfo) -> None:
        """Close every span the run holds open, then the run's own."""
        run = self._runs.pop(info.run_id, None)
        if run is None:
            return
        end_run(run, info, capture=self.capture_content)
        self._run_count.add(1, {A.RUN_OUTCOME: info.outcome})
        if info.outcome in ("paused", "interrupted"):  # it can go on: link to it
            went_on = self._went_on
            went_on[info.run_id] = run.root.get_span_context()
            if len(went_on) > _WENT_ON_KEPT:  # never resumed here: forget the oldest
                del went_on[next(iter(went_on))]

    # -- turns, phases, transitions -------------------------------------
    def on_decision(self, info: DecisionInfo) -> None:
        """Open a turn when one begins; open a compaction or effect span."""
        run = self._runs.get(info.run_id)
        if run is None:
            return
        decision = info.decision
        if run.turn is None or run.turn_over:
            if run.turn is not None:
                end_turn(run)
            # Tools (a resumed approval) belong to the turn whose call asked.
            number = info.turn if isinstance(decision, RunTools) else info.turn + 1
            number = max(number, 1)
            run.turn = turn = run.tracer.start_span(
                f"{A.SPAN_TURN} {number}",
                context=run.root_context,
                attributes={A.TURN_NUMBER: number},
            )
            run.turn_context = trace.set_span_in_context(turn)
            run.turn_over = False
        if isinstance(decision, Compact):
            run.compaction = start_compaction(run.tracer, run.turn_context, decision)
        elif isinstance(decision, Perform):
            run.effect = start_effect(
                run.tracer, run.turn_context, decision, info.phase
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
            isinstance(event, _REPLIES) and not event.message.tool_calls
        ):
            run.turn_over = True  # ended when the next turn begins, or the run
        elif isinstance(event, CompactorFailed):
            run.compaction_error = event.error  # its span ends with the record
        if run.effect is not None and isinstance(info.decision, Perform):
            # A cancel, or the effect's timeout, cut it short: not its outcome.
            end_open(run.effect, isinstance(event, RunCancelled))
            run.effect = None

    def on_transition(self, info: TransitionInfo) -> None:
        """Record the transition as a span event (from, to, trigger, guards)."""
        run = self._runs.get(info.run_id)
        if run is None:
            return
        add_transition(run, info)

    # -- compaction ----------------------------------------------------
    def on_compaction_pass(self, record: CompactionRecord) -> None:
        """End the pass's span with its verdict and tokens."""
        run = self._runs.get(record.run_id)
        if run is None:
            return
        saved = record.tokens_saved
        labels = pass_labels(record)
        self._compactions.add(1, labels)
        if saved and record.compacted:
            self._saved.add(saved, labels)
        if record.compacted:
            run.compacted = True
        span, error = run.compaction, run.compaction_error
        run.compaction = run.compaction_error = None
        if span is None:
            return
        end_compaction(span, record, error)

    # -- model calls -------------------------------------------------------
    def on_model_call_start(self, info: ModelCallInfo) -> None:
        """Open a ``chat`` span for the attempt (made current while it runs)."""
        run = self._runs.get(info.run_id)
        if run is None:
            span = self._tracer.start_span(
                f"{A.OP_CHAT} {info.model}" if info.model else A.OP_CHAT,
                kind=SpanKind.CLIENT,
                attributes={
                    **chat_attributes(
                        info, compacted=False, capture=self.capture_content
                    ),
                    **_loose_attributes(info.run_id, info.turn),
                },
            )
            token = otel_context.attach(trace.set_span_in_context(span))
            self._loose[("chat", info.run_id, info.key)] = (span, token)
            return
        if info.purpose == "summary" and run.compaction is not None:
            parent = trace.set_span_in_context(run.compaction)
        else:
            parent = run.turn_context or run.root_context
        compacted = info.purpose == "turn" and run.compacted
        if compacted:
            run.compacted = False
        span = run.tracer.start_span(
            f"{A.OP_CHAT} {info.model}" if info.model else A.OP_CHAT,
            context=parent,
            kind=SpanKind.CLIENT,
            attributes=chat_attributes(
                info, compacted=compacted, capture=self.capture_content
            ),
        )
        token = otel_context.attach(trace.set_span_in_context(span))
        run.calls[info.key] = (span, token)

    def on_model_call_end(self, info: ModelCallEnd) -> None:
        """End the attempt's span: its usage, or its error."""
        call = info.call
        run = self._runs.get(call.run_id)
        if run is None:
            opened = self._loose.pop(("chat", call.run_id, call.key), None)
        else:
            opened = run.calls.pop(call.key, None)
        if opened is None:
            return
        span, token = opened
        otel_context.detach(token)
        labels = end_chat(span, info, tokens=self._tokens, capture=self.capture_content)
        self._duration.record(info.duration, labels)
        span.end()
        usage = info.usage
        if run is None:
            return
        if call.purpose == "turn" and usage is not None and run.turn is not None:
            # The turn's reply: what the run log records as the turn's usage.
            run.turn.set_attributes(total_attributes(usage))

    # -- tools -----------------------------------------------------------
    def on_tool_start(self, info: ToolCallInfo) -> None:
        """Open an ``execute_tool`` span (made current while the tool runs)."""
        run = self._runs.get(info.run_id)
        attributes = tool_attributes(info, capture=self.capture_content)
        if run is None:
            attributes.update(_loose_attributes(info.run_id, info.turn))
        span = (self._tracer if run is None else run.tracer).start_span(
            f"{A.OP_EXECUTE_TOOL} {cut(info.call.name, NAME_CHARS)}",
            context=None if run is None else run.turn_context or run.root_context,
            kind=SpanKind.INTERNAL,
            attributes=attributes,
        )
        token = otel_context.attach(trace.set_span_in_context(span))
        if run is None:
            self._loose[("tool", info.run_id, info.call.id)] = (span, token)
        else:
            run.tools[info.call.id] = (span, token)

    def on_tool_end(self, info: ToolCallEnd) -> None:
        """End the tool's span; an error result marks it failed."""
        run = self._runs.get(info.call.run_id)
        if run is None:
            key = ("tool", info.call.run_id, info.call.call.id)
            opened = self._loose.pop(key, None)
        else:
            opened = run.tools.pop(info.call.call.id, None)
        if opened is None:
            return
        span, token = opened
        otel_context.detach(token)
        labels = end_tool(span, info, capture=self.capture_content)
        self._duration.record(info.duration, labels)
        span.end()
