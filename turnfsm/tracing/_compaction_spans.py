"""The spans of a turn's compaction passes and effects: opened, labelled, ended."""

from __future__ import annotations

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span

from turnfsm.core import Compact, Perform
from turnfsm.errors import EffectFailed
from turnfsm.persistence import CompactionRecord, Verdict
from turnfsm.tracing import attributes as A
from turnfsm.tracing._content import (
    error_status,
    record_without_text,
    total_attributes,
    without_content,
)
from turnfsm.values import ErrorInfo, PassPayback

__all__ = [
    "end_compaction",
    "fail_effect",
    "pass_labels",
    "payback_attributes",
    "start_compaction",
    "start_effect",
]


def start_compaction(
    tracer: trace.Tracer, parent: otel_context.Context | None, decision: Compact
) -> Span:
    """Open a ``turnfsm.compaction`` span for the pass `decision` asks for."""
    return tracer.start_span(
        A.SPAN_COMPACTION,
        context=parent,
        attributes={A.COMPACTION_REASON: str(decision.reason)},
    )


def start_effect(
    tracer: trace.Tracer,
    parent: otel_context.Context | None,
    decision: Perform,
    phase: str,
) -> Span:
    """Open a ``turnfsm.effect`` span for a custom phase's effect."""
    return tracer.start_span(
        A.SPAN_EFFECT,
        context=parent,
        attributes={A.EFFECT: decision.effect, A.PHASE: phase},
    )


def fail_effect(span: Span, error: EffectFailed, *, capture: bool) -> None:
    """Mark an effect's span failed: what it raised, with its traceback.

    Without content capture, a failure that quotes the model's words (a
    sub-agent phase's child whose answer never fit) leaves them out.
    """
    span.set_attribute(A.ERROR_TYPE, error.type)
    raised = error.__cause__  # the effect's own exception, when in this process
    exception = raised if isinstance(raised, Exception) else error
    said = f"{error.type}: {error.message}"
    quiet = None if capture else without_content(error)
    if quiet is None:
        span.record_exception(exception)
    else:
        said = quiet
        record_without_text(span, exception, said)
    span.set_status(error_status(said))


def pass_labels(record: CompactionRecord) -> dict[str, str]:
    """The metric labels of a compaction pass: reason, outcome, strategy."""
    return {
        A.COMPACTION_REASON: str(record.reason),
        A.COMPACTION_OUTCOME: str(record.verdict),
        A.COMPACTION_STRATEGY: record.strategy,
    }


def payback_attributes(payback: PassPayback) -> dict[str, int | float | bool]:
    """The span attributes of a pass's cache figures (costs only when priced)."""
    out: dict[str, int | float | bool] = {
        A.CACHE_INVALIDATED: payback.invalidated_tokens,
        A.CACHE_REWRITTEN: payback.rewritten_tokens,
        A.CACHE_DECLINED: payback.declined,
    }
    if payback.cost is not None:
        out[A.CACHE_COST] = payback.cost
    if payback.saving is not None:
        out[A.CACHE_SAVING] = payback.saving
    if payback.payback_calls is not None:
        out[A.CACHE_PAYBACK_CALLS] = payback.payback_calls
    return out


def end_compaction(
    span: Span, record: CompactionRecord, error: ErrorInfo | None = None
) -> None:
    """End the pass's span with its verdict, tokens and cache figures.

    `error` is the compactor's failure, when it raised or reported one: the
    span records it as its exception.
    """
    span.set_attributes(
        {
            A.COMPACTION_STRATEGY: record.strategy,
            A.COMPACTION_OUTCOME: str(record.verdict),
            A.TOKENS_BEFORE: record.tokens_before,
            A.TOKENS_AFTER: record.tokens_after,
            A.TOKENS_SAVED: record.tokens_saved if record.compacted else 0,
            # The pass's counts are turnfsm's estimates; the turnfsm.usage
            # ones below are what its summary calls reported (each call's
            # chat span, under this one, carries its own gen_ai.usage).
            A.TOKENS_SOURCE: "estimated",
        }
    )
    if record.usage is not None:
        span.set_attributes(total_attributes(record.usage))
    if record.payback is not None:
        span.set_attributes(payback_attributes(record.payback))
    if record.verdict in (Verdict.FAILED, Verdict.OVERFLOW):
        span.set_attribute(A.ERROR_TYPE, f"compaction_{record.verdict}")
        if record.verdict is Verdict.OVERFLOW:
            described = (
                f"the pass left {record.tokens_after} tokens, still over the window"
            )
        elif error is not None:
            # The compactor's exception crossed into the run as a value
            # (translated once, at the effect): recorded as the exception.
            span.add_event(
                A.EVENT_EXCEPTION,
                {A.EXCEPTION_TYPE: error.type, A.EXCEPTION_MESSAGE: error.message},
            )
            described = f"the pass failed: {error.message or error.type}"
        else:
            described = "the pass failed"
        span.set_status(error_status(described))
    span.end()
