"""Reading OTLP/JSON trace files into spans, with the standard library alone."""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Final, TypeAlias, final

import attrs

from turnfsm.errors import ConfigError

__all__ = [
    "AttributeValue",
    "ExportedSpan",
    "SpanEvent",
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
    given: object = text  # what the types allow, and what a caller gave
    if not isinstance(given, str):
        hint = " (decode it first: data.decode())" if isinstance(given, bytes) else ""
        raise ConfigError("text", given, f"OTLP/JSON text, a str{hint}")
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
        ConfigError: `path` is not a path (a str or a `Path`), or the file
            is not OTLP/JSON (text that is not UTF-8, a compressed file,
            say: names the line and the byte).
        OSError: the file cannot be read (`FileNotFoundError`: it does not
            exist); its `filename` is `path`.
    """
    given: object = path  # what the types allow, and what a caller gave
    if isinstance(given, bytes) or not isinstance(given, str | os.PathLike):
        raise ConfigError("path", given, "a path to an OTLP/JSON trace file")
    data = Path(path).read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        expected = "UTF-8 text; a compressed file (gzip, say) is decompressed first"
        raise _bad(f"line {line}", f"byte {data[exc.start]:#04x}", expected) from None
    return parse_otlp_json(text)
