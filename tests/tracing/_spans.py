"""Span-tree helpers for the tracing tests: a run's spans as nested tuples.

`Traced` wires a `TracingHook` to the SDK's in-memory exporter and metric
reader, and remembers the order spans start in, and which of them ended.
`Traced.tree()` renders what was exported as
``(name, kind, {attributes}, [events..., child spans...])``, so a test reads
like the trace:

- attributes are the span's, all of them; ids given in `masks` read as their
  placeholder, timings as ``"<seconds>"``; a status other than UNSET is the
  pseudo-attribute ``"(status)"``;
- a transition event reads ``"measured: start -> compact #3 [guards]
  reason=emergency estimate=5305"`` (every attribute it has is in the
  string: an unknown one fails the rendering), an exception event
  ``"exception ProviderError: ..."``;
- children come in the order they started; a batch of tool calls, which
  start concurrently, in call-id order.

It also checks what holds for every trace: every started span ended, and
every span of a tree is in its root's trace.

Below it: the runs the tests share (a `Named` model, `said` replies with
usage, `traced_driver`) and builders of the attribute dicts each span kind
carries (`agent`, `chat`, `tool`, `turn`, `compaction`), so a tree states
every attribute without repeating the constant ones.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, Literal, TypeAlias

import attrs
from opentelemetry.context import Context
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    HistogramDataPoint,
    InMemoryMetricReader,
    NumberDataPoint,
)
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)
from opentelemetry.trace import StatusCode

from turnfsm._resources import default_machine
from turnfsm.context import ContextManager, TruncatingCompactor
from turnfsm.driver import Driver, RunResult
from turnfsm.messages import Message, ToolCallPart
from turnfsm.persistence import machine_digest
from turnfsm.providers import ModelClient, ModelRequest, ModelResponse
from turnfsm.testing import reply
from turnfsm.tokens import HeuristicTokenCounter
from turnfsm.tracing import TracingHook
from turnfsm.tracing import attributes as A
from turnfsm.values import Usage

__all__ = [
    "COMPACTED",
    "DIGEST",
    "STARTED",
    "STATUS",
    "Named",
    "Node",
    "Traced",
    "agent",
    "boom",
    "chat",
    "compaction",
    "echo",
    "file_transitions",
    "history",
    "manager",
    "masks",
    "said",
    "tool",
    "traced_driver",
    "transitions",
    "turn",
]

Node: TypeAlias = tuple[str, str, dict[str, Any], list[Any]]
"""One span: (name, kind, attributes, [events, then child spans])."""

STATUS: Final = "(status)"
"""The pseudo-attribute a span's status shows as (when it is not UNSET)."""

_TIMINGS: Final = frozenset({A.RETRY_WAIT})
_TRANSITION_KEYS: Final = frozenset(
    {
        A.TRANSITION_FROM,
        A.TRANSITION_TO,
        A.TRANSITION_TRIGGER,
        A.TRANSITION_INDEX,
        A.TRANSITION_GUARDS,
        A.TRANSITION_REASON,
        A.TRANSITION_ERROR,
        A.ESTIMATE,
        A.ESTIMATE_SOURCE,
    }
)


class _Ledger(SpanProcessor):
    """Remembers every span that started, in order, and which ones ended."""

    def __init__(self) -> None:
        self.started: list[Span] = []
        self.ended: set[int] = set()

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        self.started.append(span)

    def on_end(self, span: ReadableSpan) -> None:
        assert span.context is not None
        self.ended.add(span.context.span_id)


@attrs.define(eq=False)
class Traced:
    """A `TracingHook` on in-memory providers, and what it exported."""

    hook: TracingHook
    exporter: InMemorySpanExporter
    reader: InMemoryMetricReader
    ledger: _Ledger

    @classmethod
    def create(cls, *, capture_content: bool | None = None) -> Traced:
        exporter = InMemorySpanExporter()
        ledger = _Ledger()
        tracer_provider = TracerProvider()
        tracer_provider.add_span_processor(ledger)
        tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
        reader = InMemoryMetricReader()
        meter_provider = MeterProvider(metric_readers=[reader])
        hook = TracingHook(
            tracer_provider=tracer_provider,
            meter_provider=meter_provider,
            capture_content=capture_content,
        )
        return cls(hook, exporter, reader, ledger)

    @property
    def spans(self) -> tuple[ReadableSpan, ...]:
        """Every exported span, in the order they started."""
        order = {_id(s): i for i, s in enumerate(self.ledger.started)}
        return tuple(
            sorted(self.exporter.get_finished_spans(), key=lambda s: order[_id(s)])
        )

    def unended(self) -> list[str]:
        """The names of the spans that started and never ended."""
        return [s.name for s in self.ledger.started if _id(s) not in self.ledger.ended]

    def tree(self, masks: Mapping[str, str] | None = None) -> list[Node]:
        """Render every trace: one node per root span, in the order they started."""
        assert self.unended() == []
        spans = self.spans
        assert len(spans) == len(self.ledger.started)  # every span was exported
        children: dict[int | None, list[ReadableSpan]] = {}
        for span in spans:
            parent = span.parent.span_id if span.parent is not None else None
            children.setdefault(parent, []).append(span)
        masks = dict(masks or {})
        roots = children.get(None, [])
        for root in roots:
            trace_id = _trace(root)
            assert all(_trace(s) == trace_id for s in _descendants(root, children))
        return [_node(r, children, masks) for r in roots]

    def metric(
        self, name: str, *, field: Literal["sum", "count"] = "sum"
    ) -> dict[frozenset[tuple[str, Any]], float]:
        """A metric's points: attributes -> its sum (or a histogram's count)."""
        data = self.reader.get_metrics_data()
        points: dict[frozenset[tuple[str, Any]], float] = {}
        if data is None:
            return points
        for resource in data.resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name != name:
                        continue
                    for point in metric.data.data_points:
                        key = frozenset((point.attributes or {}).items())
                        if isinstance(point, HistogramDataPoint):
                            points[key] = getattr(point, field)
                        else:
                            assert isinstance(point, NumberDataPoint)
                            points[key] = point.value
        return points


def _id(span: ReadableSpan) -> int:
    assert span.context is not None
    return int(span.context.span_id)


def _trace(span: ReadableSpan) -> int:
    assert span.context is not None
    return int(span.context.trace_id)


def _descendants(
    span: ReadableSpan, children: Mapping[int | None, list[ReadableSpan]]
) -> Iterable[ReadableSpan]:
    for child in children.get(_id(span), []):
        yield child
        yield from _descendants(child, children)


def _node(
    span: ReadableSpan,
    children: Mapping[int | None, list[ReadableSpan]],
    masks: Mapping[str, str],
) -> Node:
    attributes: dict[str, Any] = {}
    for key, value in (span.attributes or {}).items():
        if key in _TIMINGS:
            assert isinstance(value, float)
            assert value >= 0
            attributes[key] = "<seconds>"
        elif isinstance(value, str) and value in masks:
            attributes[key] = masks[value]
        else:
            attributes[key] = value
    status = span.status
    if status.status_code is not StatusCode.UNSET:
        described = f": {status.description}" if status.description else ""
        attributes[STATUS] = f"{status.status_code.name}{described}"
    events: list[Any] = [_event(e.name, dict(e.attributes or {})) for e in span.events]
    kids = _in_call_order(children.get(_id(span), []))
    return (
        span.name,
        span.kind.name,
        attributes,
        events + [_node(c, children, masks) for c in kids],
    )


def _in_call_order(spans: list[ReadableSpan]) -> list[ReadableSpan]:
    """`spans` in start order, each batch of tool calls sorted by call id."""
    out: list[ReadableSpan] = []
    batch: list[ReadableSpan] = []
    for span in [*spans, None]:
        if span is not None and span.name.startswith(A.OP_EXECUTE_TOOL):
            batch.append(span)
            continue
        out.extend(
            sorted(batch, key=lambda s: str((s.attributes or {})[A.TOOL_CALL_ID]))
        )
        batch = []
        if span is not None:
            out.append(span)
    return out


def _event(name: str, attributes: dict[str, Any]) -> object:
    if name == A.EVENT_TRANSITION:
        assert set(attributes) <= _TRANSITION_KEYS, set(attributes) - _TRANSITION_KEYS
        text = (
            f"{attributes[A.TRANSITION_TRIGGER]}: {attributes[A.TRANSITION_FROM]} -> "
            f"{attributes[A.TRANSITION_TO]} #{attributes[A.TRANSITION_INDEX]}"
        )
        guards = attributes[A.TRANSITION_GUARDS]
        if guards:
            text += f" [{', '.join(guards)}]"
        for key, label in (
            (A.TRANSITION_REASON, "reason"),
            (A.TRANSITION_ERROR, "error"),
            (A.ESTIMATE, "estimate"),
        ):
            if key in attributes:
                text += f" {label}={attributes[key]}"
        # Where the estimate came from, when it is not turnfsm's own count.
        source = attributes.get(A.ESTIMATE_SOURCE, "estimated")
        if source != "estimated":
            text += f" ({source})"
        return text
    if name == "exception":
        kind = str(attributes["exception.type"]).rsplit(".", 1)[-1]
        return f"exception {kind}: {attributes['exception.message']}"
    return (name, attributes)


def transitions(span: ReadableSpan) -> list[dict[str, Any]]:
    """The attributes of the span's transition events, in order."""
    return [
        dict(e.attributes or {}) for e in span.events if e.name == A.EVENT_TRANSITION
    ]


def file_transitions(path: Path) -> list[dict[str, Any]]:
    """The ``[[transitions]]`` tables of a machine file, as written."""
    with path.open("rb") as file:
        return list(tomllib.load(file)["transitions"])


@attrs.define(eq=False)
class Named:
    """A model client with a name and a provider, as the real ones have.

    Replies come from `inner` (a scripted model); each says which model
    answered (the name asked for, plus a version).
    """

    inner: ModelClient
    model: str = "gpt-test"
    provider_name: str = "openai"

    async def complete(self, request: ModelRequest) -> ModelResponse:
        response = await self.inner.complete(request)
        return attrs.evolve(response, model=f"{self.model}-0613")


def said(
    text: str = "", *calls: ToolCallPart, usage: Sequence[int] = (0, 0)
) -> ModelResponse:
    """A reply with `text` and tool `calls` that reports (input, output) `usage`."""
    message: Message = reply(text, *calls)
    return ModelResponse(
        message=message, usage=Usage(input_tokens=usage[0], output_tokens=usage[1])
    )


# -- runs and what their spans say --------------------------------------------
DIGEST = machine_digest(default_machine())


def echo(text: str) -> str:
    """Echo the text back.

    Args:
        text: what to echo.
    """
    return text


def boom() -> str:
    """Fail."""
    raise ValueError("disk on fire")


def history(pairs: int, size: int) -> list[Message]:
    """`pairs` user/assistant exchanges of about `size` characters each."""
    out: list[Message] = []
    for i in range(pairs):
        out.append(Message.user(f"question {i} " + "q" * size))
        out.append(Message.assistant(f"answer {i} " + "a" * size))
    return out


def manager(window: int, threshold: int = 80) -> ContextManager:
    return ContextManager(
        TruncatingCompactor(),
        context_window=window,
        threshold=threshold,
        counter=HeuristicTokenCounter(),
    )


def traced_driver(traced: Traced, model: ModelClient, **options: Any) -> Driver:
    return Driver(
        model=Named(model),
        hooks=[traced.hook],
        strict_hooks=True,
        name="assistant",
        **options,
    )


def masks(result: RunResult) -> dict[str, str]:
    return {result.session_id: "<session>", result.run_id: "<run>", DIGEST: "<digest>"}


def agent(
    *,
    outcome: str = "done",
    turns: int = 1,
    phase: str = "done",
    usage: Sequence[int] = (0, 0),
    window: int = 200_000,
    lines: Sequence[int] = (160_000, 190_000),
) -> dict[str, Any]:
    """The root span's attributes (a run of the stock machine on `Named`)."""
    return {
        A.OPERATION_NAME: "invoke_agent",
        A.AGENT_NAME: "assistant",
        A.CONVERSATION_ID: "<session>",
        A.RUN_ID: "<run>",
        A.MACHINE_NAME: "turn",
        A.MACHINE_DIGEST: "<digest>",
        A.RUN_RESUMED: False,
        A.PROVIDER_NAME: "openai",
        A.REQUEST_MODEL: "gpt-test",
        A.WINDOW: window,
        A.THRESHOLD_LINE: lines[0],
        A.EMERGENCY_LINE: lines[1],
        A.RUN_OUTCOME: outcome,
        A.RUN_TURNS: turns,
        A.PHASE: phase,
        A.TOTAL_INPUT_TOKENS: usage[0],
        A.TOTAL_OUTPUT_TOKENS: usage[1],
    } | ({STATUS: "OK"} if outcome in ("done", "paused") else {})


def chat(*, attempt: int = 1, usage: Sequence[int] | None = None) -> dict[str, Any]:
    """A ``chat gpt-test`` span's attributes; `usage` only for a reply."""
    out: dict[str, Any] = {
        A.OPERATION_NAME: "chat",
        A.CONVERSATION_ID: "<session>",
        A.ATTEMPT: attempt,
        A.PURPOSE: "turn",
        A.PROVIDER_NAME: "openai",
        A.REQUEST_MODEL: "gpt-test",
    }
    if usage is not None:
        out[A.RESPONSE_MODEL] = "gpt-test-0613"
        out[A.USAGE_INPUT_TOKENS] = usage[0]
        out[A.USAGE_OUTPUT_TOKENS] = usage[1]
    return out


def tool(name: str, call_id: str) -> dict[str, Any]:
    return {
        A.OPERATION_NAME: "execute_tool",
        A.TOOL_NAME: name,
        A.TOOL_CALL_ID: call_id,
        A.TOOL_TYPE: "function",
        A.CONVERSATION_ID: "<session>",
    }


def turn(
    number: int,
    phase: str,
    estimate: int,
    *,
    usage: Sequence[int] | None = None,
    source: str = "estimated",
) -> dict[str, Any]:
    """A turn span's attributes; `usage` is its reply's (as the run log has it).

    `source` is where its estimate came from (``turnfsm.estimate.source``).
    """
    out: dict[str, Any] = {A.TURN_NUMBER: number}
    if usage is not None:
        out[A.TOTAL_INPUT_TOKENS] = usage[0]
        out[A.TOTAL_OUTPUT_TOKENS] = usage[1]
    return out | {A.PHASE: phase, A.ESTIMATE: estimate, A.ESTIMATE_SOURCE: source}


def compaction(
    reason: str,
    before: int,
    after: int,
    *,
    strategy: str = "TruncatingCompactor",
    cache: tuple[int, int] | None = None,
) -> dict[str, Any]:
    """A pass's span attributes; `cache`: (invalidated, rewritten) tokens."""
    out: dict[str, Any] = {
        A.COMPACTION_REASON: reason,
        A.COMPACTION_STRATEGY: strategy,
        A.COMPACTION_OUTCOME: "compacted",
        A.TOKENS_BEFORE: before,
        A.TOKENS_AFTER: after,
        A.TOKENS_SAVED: before - after,
        A.TOKENS_SOURCE: "estimated",
    }
    if cache is not None:
        out |= {
            A.CACHE_INVALIDATED: cache[0],
            A.CACHE_REWRITTEN: cache[1],
            A.CACHE_DECLINED: False,
        }
    return out


STARTED = "run_started: start -> start #0"
COMPACTED = {A.CONVERSATION_COMPACTED: True}
