"""OTLP/JSON trace files: read them (standard library only) and write them.

A trace file holds OTLP ``ExportTraceServiceRequest`` objects in the JSON
encoding of the OpenTelemetry protocol (the protobuf JSON mapping, with the
trace and span ids as lowercase hex and 64-bit integers as strings): one
object, or one per line as the OpenTelemetry Collector's file exporter
writes them. `parse_otlp_json` and `load_otlp_json` read every span of one (the
parse needs nothing beyond the standard library); `OTLPJSONFileExporter` is an
OpenTelemetry SDK span exporter that writes such a file, so a trace can be
kept without running a collector.

See https://opentelemetry.io/docs/specs/otlp/#json-protobuf-encoding.

The reading half is `_otlp_json_read`, the writing half `_otlp_json_write`.
"""

from __future__ import annotations

from turnfsm.tracing._otlp_json_read import (
    AttributeValue,
    ExportedSpan,
    SpanEvent,
    load_otlp_json,
    parse_otlp_json,
)
from turnfsm.tracing._otlp_json_write import OTLPJSONFileExporter, encode_spans

__all__ = [
    "AttributeValue",
    "ExportedSpan",
    "OTLPJSONFileExporter",
    "SpanEvent",
    "encode_spans",
    "load_otlp_json",
    "parse_otlp_json",
]
