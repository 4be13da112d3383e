"""One run's trace: what the hook holds open for it, its spans, its transitions."""

from __future__ import annotations

from contextvars import Token
from typing import Any, TypeAlias

import attrs
from opentelemetry import context as otel_context
from opentelemetry.trace import Span, Status, StatusCode, Tracer

from turnfsm.core import emergency_line, threshold_line
from turnfsm.errors import EffectFailed
from turnfsm.hooks import RunEndInfo, RunStartInfo, TransitionInfo
from turnfsm.messages import Message
from turnfsm.tracing import attributes as A
from turnfsm.tracing._compaction_spans import fail_effect
from turnfsm.tracing._content import (
    error_status,
    messages_json,
    record_without_text,
    total_attributes,
    without_content,
)
from turnfsm.values import ErrorInfo

__all__ = [
    "OpenRun",
    "Opened",
    "add_transition",
    "close",
    "end_open",
    "end_run",
    "end_turn",
    "run_attributes",
]


Opened: TypeAlias = Token[otel_context.Context]
"""What made a call's span current: detached when the call ends."""


@attrs.define(eq=False)
class OpenRun:
    """What one run's trace holds open (internal)."""

    root: Span
    tracer: Tracer  # the run's spans all come from the one that made its root
    session_id: str
    root_context: otel_context.Context
    turn: Span | None = None
    turn_context: otel_context.Context | None = None
    estimate: int | None = None
    estimate_source: str = "estimated"
    phase: str = ""
    turn_over: bool = False
    compaction: Span | None = None
    compaction_error: ErrorInfo | None = None  # the open pass's, when it failed
    effect: Span | None = None
    compacted: bool = False
    decided_at: float = 0.0
    decided_phase: str = ""
    calls: dict[str, tuple[Span, Opened]] = attrs.field(factory=dict)
    tools: dict[str, tuple[Span, Opened]] = attrs.field(factory=dict)


def run_attributes(info: RunStartInfo, *, capture: bool) -> dict[str, Any]:
    """The ``invoke_agent`` span's attributes as the run starts."""
    attributes: dict[str, Any] = {
        A.OPERATION_NAME: A.OP_INVOKE_AGENT,
        A.AGENT_NAME: info.agent,
        A.CONVERSATION_ID: info.session_id,
        A.RUN_ID: info.run_id,
        A.MACHINE_NAME: info.machine,
        A.MACHINE_DIGEST: info.digest,
        A.RUN_RESUMED: info.resumed,
    }
    if info.resumed_from is not None:
        attributes[A.RUN_RESUMED_FROM] = info.resumed_from
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
            attributes[A.THRESHOLD_LINE] = threshold_line(
                window, budget.threshold, budget.threshold_tokens
            )
    if capture and info.input:
        attributes[A.INPUT_MESSAGES] = messages_json(info.input)
    return attributes


def end_run(run: OpenRun, info: RunEndInfo, *, capture: bool) -> None:
    """Close every span the run holds open, then the run's own."""
    # Cut short: cancelled by its own control, or interrupted from outside.
    cancelled = info.outcome in ("cancelled", "interrupted")
    error = info.error
    if isinstance(error, EffectFailed) and run.effect is not None:
        fail_effect(run.effect, error, capture=capture)  # what failed the run
    close(run, cancelled=cancelled)
    root = run.root
    usage = info.usage
    root.set_attributes(
        {
            A.RUN_OUTCOME: info.outcome,
            A.RUN_TURNS: info.turns,
            A.PHASE: info.phase,
            **total_attributes(usage),
        }
    )
    if capture and info.text:
        root.set_attribute(
            A.OUTPUT_MESSAGES, messages_json((Message.assistant(info.text),))
        )
    if cancelled:
        root.set_attribute(A.CANCELLED, True)
    elif error is not None:
        root.set_attribute(A.ERROR_TYPE, type(error).__name__)
        said = str(error) if capture else without_content(error)
        if said is None:
            root.record_exception(error)
            said = str(error)
        else:
            record_without_text(root, error, said)
        root.set_status(error_status(said))
    elif info.outcome in ("done", "paused"):
        root.set_status(Status(StatusCode.OK))
    root.end()


def close(run: OpenRun, *, cancelled: bool) -> None:
    """End what a run left open (a cancel, a crash, a pause)."""
    # Their tokens belong to the tasks that ran them (each calls its own
    # end hook, cancelled or not); only the spans are left to end.
    for span, _token in (*run.calls.values(), *run.tools.values()):
        end_open(span, cancelled)
    run.calls.clear()
    run.tools.clear()
    for left in (run.effect, run.compaction):
        if left is not None:
            end_open(left, cancelled)
    if run.turn is not None:
        end_turn(run, cancelled=cancelled)
    run.effect = run.compaction = None


def end_turn(run: OpenRun, *, cancelled: bool = False) -> None:
    turn = run.turn
    assert turn is not None
    said: dict[str, Any] = {A.PHASE: run.phase}  # where the turn got to
    if run.estimate is not None:
        said[A.ESTIMATE] = run.estimate
        said[A.ESTIMATE_SOURCE] = run.estimate_source
    if cancelled:
        said[A.CANCELLED] = True
    turn.set_attributes(said)  # at once: one lock, one pass of the SDK's checks
    turn.end()
    run.turn = run.turn_context = None


def end_open(span: Span, cancelled: bool) -> None:
    if cancelled:
        span.set_attribute(A.CANCELLED, True)
    span.end()


def add_transition(run: OpenRun, info: TransitionInfo) -> None:
    """Record the transition as a span event (from, to, trigger, guards)."""
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
        source = info.estimate_source or "estimated"
        attributes[A.ESTIMATE_SOURCE] = run.estimate_source = source
    run.phase = step.dest
    span = run.turn if run.turn is not None else run.root
    span.add_event(A.EVENT_TRANSITION, attributes)
