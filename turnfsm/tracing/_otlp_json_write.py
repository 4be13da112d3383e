"""Writing spans as OTLP/JSON: `encode_spans` and the `OTLPJSONFileExporter`."""

from __future__ import annotations

import base64
import json
import logging
import math
import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO, final

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from turnfsm.errors import ConfigError

logger = logging.getLogger("turnfsm.tracing")

__all__ = ["OTLPJSONFileExporter", "encode_spans", "writable_file"]


def _any_value(value: Any) -> dict[str, Any]:
    """Encode an attribute value as an OTLP/JSON ``AnyValue``."""
    if value is None:
        return {}
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, str):
        return {"stringValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        if math.isfinite(value):
            return {"doubleValue": value}
        # proto3 JSON spells the three non-finite doubles as strings.
        return {
            "doubleValue": "NaN" if math.isnan(value) else f"{value:+}"[0] + "Infinity"
        }
    if isinstance(value, bytes):
        return {"bytesValue": base64.b64encode(value).decode("ascii")}
    if isinstance(value, Mapping):
        return {"kvlistValue": {"values": _key_values(value)}}
    return {"arrayValue": {"values": [_any_value(v) for v in value]}}


def _key_values(attributes: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    return [
        {"key": str(k), "value": _any_value(v)} for k, v in (attributes or {}).items()
    ]


def _with(out: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    """`out` with `key` set, unless `value` is its type's default (proto3 JSON)."""
    if value:
        out[key] = value
    return out


def _flags(context: Any) -> int:
    # SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK, | IS_REMOTE for a remote parent.
    return 0x100 | (0x200 if context is not None and context.is_remote else 0)


def _encode_span(span: ReadableSpan) -> dict[str, Any]:
    context = span.get_span_context()
    assert context is not None  # an SDK span always has one
    out: dict[str, Any] = {
        "traceId": f"{context.trace_id:032x}",
        "spanId": f"{context.span_id:016x}",
    }
    _with(out, "traceState", context.trace_state.to_header())
    if span.parent is not None:
        out["parentSpanId"] = f"{span.parent.span_id:016x}"
    _with(out, "flags", _flags(span.parent))
    _with(out, "name", span.name)
    _with(out, "kind", span.kind.value + 1)  # the SDK's INTERNAL is 0, OTLP's 1
    _with(out, "startTimeUnixNano", str(span.start_time or 0))
    _with(out, "endTimeUnixNano", str(span.end_time or 0))
    _with(out, "attributes", _key_values(span.attributes))
    _with(out, "droppedAttributesCount", span.dropped_attributes)
    events = []
    for event in span.events:
        encoded = _with({"timeUnixNano": str(event.timestamp)}, "name", event.name)
        _with(encoded, "attributes", _key_values(event.attributes))
        events.append(
            _with(encoded, "droppedAttributesCount", event.dropped_attributes)
        )
    _with(out, "events", events)
    _with(out, "droppedEventsCount", span.dropped_events)
    links = []
    for link in span.links:
        encoded = {
            "traceId": f"{link.context.trace_id:032x}",
            "spanId": f"{link.context.span_id:016x}",
        }
        _with(encoded, "attributes", _key_values(link.attributes))
        _with(encoded, "droppedAttributesCount", link.dropped_attributes)
        links.append(_with(encoded, "flags", _flags(link.context)))
    _with(out, "links", links)
    _with(out, "droppedLinksCount", span.dropped_links)
    status: dict[str, Any] = {}
    _with(status, "message", span.status.description)
    out["status"] = _with(status, "code", span.status.status_code.value)
    return out


def encode_spans(spans: Sequence[ReadableSpan]) -> dict[str, Any]:
    """Return `spans` as one OTLP/JSON ``ExportTraceServiceRequest`` object.

    Spans are grouped by resource, then by instrumentation scope, as the
    OTLP exporters do; default values are left out (proto3 JSON).
    """
    grouped: dict[Any, dict[Any, list[dict[str, Any]]]] = {}
    for span in spans:
        by_scope = grouped.setdefault(span.resource, {})
        by_scope.setdefault(span.instrumentation_scope, []).append(_encode_span(span))
    resource_spans = []
    for resource, by_scope in grouped.items():
        scope_spans = []
        for scope, encoded in by_scope.items():
            described: dict[str, Any] = {}
            if scope is not None:
                _with(described, "name", scope.name)
                _with(described, "version", scope.version)
                _with(described, "attributes", _key_values(scope.attributes))
            entry = {"scope": described, "spans": encoded}
            if scope is not None:
                _with(entry, "schemaUrl", scope.schema_url)
            scope_spans.append(entry)
        entry = {"resource": _with({}, "attributes", _key_values(resource.attributes))}
        entry["scopeSpans"] = scope_spans
        resource_spans.append(_with(entry, "schemaUrl", resource.schema_url))
    return {"resourceSpans": resource_spans}


def writable_file(path: object, name: str) -> Path:
    """`path` as a `Path`, if it is a file to write, in a directory that exists.

    Raises:
        ConfigError: not a path, a directory, or in a directory that does
            not exist; names `name`.
    """
    if isinstance(path, bytes) or not isinstance(path, str | os.PathLike):
        raise ConfigError(name, path, "a path to write OTLP/JSON lines to")
    file = Path(path)
    if not os.fspath(path) or file.is_dir() or not file.absolute().parent.is_dir():
        raise ConfigError(
            name, os.fspath(path), "a file, in a directory that exists, to write to"
        )
    return file


@final
class OTLPJSONFileExporter(SpanExporter):
    """An OpenTelemetry SDK span exporter that appends OTLP/JSON lines to a file.

    Each `export` call writes one ``ExportTraceServiceRequest`` object as
    one line (JSON Lines, like the OpenTelemetry Collector's file exporter),
    so `load_otlp_json` and ``turnfsm diagram --trace`` read the file back.
    Use it with a ``BatchSpanProcessor`` (or ``SimpleSpanProcessor``)::

        provider.add_span_processor(
            BatchSpanProcessor(OTLPJSONFileExporter("trace.jsonl"))
        )
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        """Write to the file at `path` (created on the first export, appended to).

        Raises:
            ConfigError: `path` is not a path to a file in a directory that
                exists (it would fail every export).
        """
        self.path = writable_file(path, "path")
        self._lock = threading.Lock()
        self._file: TextIO | None = None
        self._is_shut_down = False
        self._told = False  # the first failed write is logged, not each one

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Append `spans` to the file as one line; FAILURE if it cannot be written.

        The first write that fails is logged as an error (``turnfsm.tracing``)
        naming the file, so spans are not lost without a word.
        """
        line = json.dumps(encode_spans(spans), separators=(",", ":"))
        with self._lock:
            if self._is_shut_down:
                return SpanExportResult.FAILURE
            try:
                if self._file is None:
                    self._file = self.path.open("a", encoding="utf-8")
                self._file.write(line + "\n")
                self._file.flush()
            except OSError as exc:
                if not self._told:
                    self._told = True
                    logger.error(
                        "tracing: spans cannot be written to %s: %s",
                        self.path,
                        exc.strerror or exc,
                    )
                return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Return True: every export is flushed as it is written."""
        return True

    def shutdown(self) -> None:
        """Close the file; later exports fail."""
        with self._lock:
            self._is_shut_down = True
            if self._file is not None:
                self._file.close()
                self._file = None
