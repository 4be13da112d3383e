"""Tracing: every run as OpenTelemetry spans, events and metrics (GenAI conventions).

Switch it on with one call, or with the standard ``OTEL_*`` environment
and `configure()` (the CLI calls it when an endpoint is set)::

    import turnfsm.tracing

    turnfsm.tracing.configure(endpoint="http://localhost:4318")  # Jaeger, Phoenix, ...

From then on every `Driver` run is traced through the `TracingHook` (see
`turnfsm.tracing.attributes` for every name it emits). An application that
sets up OpenTelemetry itself gets the same: a `Driver` traces its runs
whenever a tracer provider is set.

The OTLP exporters are an extra: ``pip install 'turnfsm[otel]'``.
"""

from __future__ import annotations

from turnfsm.tracing import attributes
from turnfsm.tracing._hook import CAPTURE_CONTENT_ENV, TracingHook
from turnfsm.tracing._otlp import Protocol
from turnfsm.tracing._otlp_json import (
    OTLPJSONFileExporter,
    load_otlp_json,
    parse_otlp_json,
)
from turnfsm.tracing._setup import (
    Tracing,
    configure,
    global_hook,
    is_configured,
)
from turnfsm.tracing._traced import TRANSITION_EVENT, TracedTransition, traced_runs

__all__ = [
    "CAPTURE_CONTENT_ENV",
    "TRANSITION_EVENT",
    "OTLPJSONFileExporter",
    "Protocol",
    "TracedTransition",
    "Tracing",
    "TracingHook",
    "attributes",
    "configure",
    "global_hook",
    "is_configured",
    "load_otlp_json",
    "parse_otlp_json",
    "traced_runs",
]
