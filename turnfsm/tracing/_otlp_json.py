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
"""

from __future__ import annotations

import base64
import json
import math
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, TextIO, TypeAlias, final

import attrs
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from turnfsm.errors import ConfigError

__all__ = [
    "AttributeValue",
    "ExportedSpan",
    "OTLPJSONFileExporter",
    "SpanEvent",
    "encode_spans",
    "load_otlp_json",
    "parse_otlp_json",
]

AttributeValue: TypeAlias = (
    "str | bool | int | float | bytes"
    " | tuple[AttributeValue, ...] | Mapping[str, AttributeValue] | None"
)
"""An attribute's value as read back (an OTLP ``AnyValue``; arrays as tuples)."""

_NON_FINITE: Final = frozenset({"NaN", "Infinity", "-Infinity"})
_FORMAT: Final = "OTLP/JSON"


@final
@attrs.frozen(kw_only=True)
class SpanEvent:
    """A span event as read back: name, time and attributes."""

    name: str
    time_unix_nano: int
    attributes: Mapping[str, AttributeValue]


@final
@attrs.frozen(kw_only=True)
class ExportedSpan:
    """One span of a trace file, with the resource and scope it came under."""

    trace_id: str
    span_id: str
    parent_span_id: str | None
    name: str
    kind: int
    start_time_unix_nano: int
    end_time_unix_nano: int
    attributes: Mapping[str, AttributeValue]
    events: tuple[SpanEvent, ...] = ()
    status_code: int = 0
    status_message: str = ""
    resource: Mapping[str, AttributeValue] = attrs.field(factory=dict)
    scope: str = ""


# -- reading ---------------------------------------------------------------


def _bad(where: str, value: object, expected: str) -> ConfigError:
    return ConfigError(where, value, f"{expected} ({_FORMAT})")


def _field(obj: Mapping[str, Any], camel: str, default: Any = None) -> Any:
    """`obj`'s field `camel`, also accepted under its proto (snake_case) name."""
    if camel in obj:
        return obj[camel]
    snake = "".join(f"_{c.lower()}" if c.isupper() else c for c in camel)
    return obj.get(snake, default)


def _objects(obj: Mapping[str, Any], camel: str, where: str) -> list[Any]:
    items = _field(obj, camel, [])
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise _bad(f"{where}.{camel}", items, "a list of objects")
    return items


def _int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise _bad(where, value, "an integer (or one as a string)")
    try:
        return int(value)
    except ValueError:
        raise _bad(where, value, "an integer (or one as a string)") from None


def _hex_id(value: Any, digits: int, where: str) -> str:
    if not isinstance(value, str) or len(value) != digits:
        raise _bad(where, value, f"{digits} hex digits")
    try:
        int(value, 16)
    except ValueError:
        raise _bad(where, value, f"{digits} hex digits") from None
    return value.lower()


def _value(any_value: Mapping[str, Any], where: str) -> AttributeValue:
    """Decode an OTLP ``AnyValue`` (an empty one is None)."""
    if not isinstance(any_value, dict):
        raise _bad(where, any_value, "an AnyValue object")
    for key, raw in any_value.items():
        match key:
            case "stringValue" | "string_value" if isinstance(raw, str):
                return raw
            case "boolValue" | "bool_value" if isinstance(raw, bool):
                return raw
            case "intValue" | "int_value":
                return _int(raw, f"{where}.intValue")
            case "doubleValue" | "double_value" if isinstance(raw, int | float):
                return float(raw)
            case "doubleValue" | "double_value" if raw in _NON_FINITE:
                return float(raw)
            case "bytesValue" | "bytes_value" if isinstance(raw, str):
                return base64.b64decode(raw)
            case "arrayValue" | "array_value" if isinstance(raw, dict):
                items = _objects(raw, "values", where)
                return tuple(_value(v, f"{where}[{i}]") for i, v in enumerate(items))
            case "kvlistValue" | "kvlist_value" if isinstance(raw, dict):
                return _attributes(raw, "values", where)
        raise _bad(f"{where}.{key}", raw, "a value of its type")
    return None


def _attributes(
    obj: Mapping[str, Any], camel: str, where: str
) -> dict[str, AttributeValue]:
    out = {}
    for i, kv in enumerate(_objects(obj, camel, where)):
        key = kv.get("key")
        if not isinstance(key, str):
            raise _bad(f"{where}.{camel}[{i}].key", key, "a string")
        out[key] = _value(kv.get("value", {}), f"{where}.{camel}[{i}].value")
    return out


def _event(obj: Mapping[str, Any], where: str) -> SpanEvent:
    return SpanEvent(
        name=str(obj.get("name", "")),
        time_unix_nano=_int(_field(obj, "timeUnixNano", 0), f"{where}.timeUnixNano"),
        attributes=_attributes(obj, "attributes", where),
    )


def _span(
    obj: Mapping[str, Any],
    resource: Mapping[str, AttributeValue],
    scope: str,
    where: str,
) -> ExportedSpan:
    parent = _field(obj, "parentSpanId", "")
    status = _field(obj, "status", {})
    if not isinstance(status, dict):
        raise _bad(f"{where}.status", status, "an object")
    events = _objects(obj, "events", where)
    return ExportedSpan(
        trace_id=_hex_id(_field(obj, "traceId"), 32, f"{where}.traceId"),
        span_id=_hex_id(_field(obj, "spanId"), 16, f"{where}.spanId"),
        parent_span_id=_hex_id(parent, 16, f"{where}.parentSpanId") if parent else None,
        name=str(obj.get("name", "")),
        kind=_int(obj.get("kind", 0), f"{where}.kind"),
        start_time_unix_nano=_int(
            _field(obj, "startTimeUnixNano", 0), f"{where}.start"
        ),
        end_time_unix_nano=_int(_field(obj, "endTimeUnixNano", 0), f"{where}.end"),
        attributes=_attributes(obj, "attributes", where),
        events=tuple(_event(e, f"{where}.events[{i}]") for i, e in enumerate(events)),
        status_code=_int(status.get("code", 0), f"{where}.status.code"),
        status_message=str(status.get("message", "")),
        resource=resource,
        scope=scope,
    )


def _documents(text: str) -> Iterator[tuple[int, Any]]:
    """Each JSON value in `text` (one, or one per line), with its line number."""
    decoder = json.JSONDecoder()
    at = 0
    while True:
        while at < len(text) and text[at].isspace():
            at += 1
        if at == len(text):
            return
        line = text.count("\n", 0, at) + 1
        try:
            document, at = decoder.raw_decode(text, at)
        except json.JSONDecodeError as exc:
            raise _bad(
                f"line {exc.lineno}", text[at : at + 40], f"JSON: {exc.msg}"
            ) from None
        yield line, document


def parse_otlp_json(text: str) -> tuple[ExportedSpan, ...]:
    """Return every span in `text`, in file order.

    Args:
        text: One OTLP/JSON ``ExportTraceServiceRequest`` object, or several
            (JSON Lines, as the OpenTelemetry Collector's file exporter
            writes). Field names may be lowerCamelCase or snake_case.

    Raises:
        ConfigError: `text` is not OTLP/JSON; names the line and the field.
    """
    spans = []
    for line, document in _documents(text):
        if not isinstance(document, dict):
            raise _bad(f"line {line}", document, "an ExportTraceServiceRequest object")
        for r, rs in enumerate(_objects(document, "resourceSpans", f"line {line}")):
            where = f"line {line}: resourceSpans[{r}]"
            resource = _attributes(_field(rs, "resource", {}), "attributes", where)
            for s, ss in enumerate(_objects(rs, "scopeSpans", where)):
                scope = str(_field(ss, "scope", {}).get("name", ""))
                found = _objects(ss, "spans", f"{where}.scopeSpans[{s}]")
                for n, span in enumerate(found):
                    at = f"{where}.scopeSpans[{s}].spans[{n}]"
                    spans.append(_span(span, resource, scope, at))
    return tuple(spans)


def load_otlp_json(path: str | os.PathLike[str]) -> tuple[ExportedSpan, ...]:
    """Return every span in the trace file at `path` (see `parse_otlp_json`).

    Raises:
        ConfigError: the file is not OTLP/JSON.
        OSError: the file cannot be read.
    """
    return parse_otlp_json(Path(path).read_text(encoding="utf-8"))


# -- writing ---------------------------------------------------------------


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
        """Write to the file at `path` (created on the first export, appended to)."""
        self.path = Path(path)
        self._lock = threading.Lock()
        self._file: TextIO | None = None
        self._is_shut_down = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Append `spans` to the file as one line; FAILURE if it cannot be written."""
        line = json.dumps(encode_spans(spans), separators=(",", ":"))
        with self._lock:
            if self._is_shut_down:
                return SpanExportResult.FAILURE
            try:
                if self._file is None:
                    self._file = self.path.open("a", encoding="utf-8")
                self._file.write(line + "\n")
                self._file.flush()
            except OSError:
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
