"""The OTLP exporters `configure` builds, and the ``OTEL_*`` settings it reads."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any, Final, Literal
from urllib.parse import urlsplit

from opentelemetry.sdk.metrics.export import MetricExporter
from opentelemetry.sdk.trace.export import SpanExporter

from turnfsm.errors import ConfigError

__all__ = [
    "CAPTURE_CONTENT_ENV",
    "_ENDPOINT_VARS",
    "_PROTOCOLS",
    "Protocol",
    "_check_endpoint",
    "_check_environment",
    "_env_flag",
    "_env_list",
    "_env_protocol",
    "_otlp_metrics",
    "_otlp_spans",
]


Protocol = Literal["http/protobuf", "grpc"]
"""The OTLP transports: protobuf over HTTP (port 4318) or gRPC (port 4317)."""

_PROTOCOLS: Final = ("http/protobuf", "grpc")
_ENDPOINT_VARS: Final = (
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
)
_EXTRA: Final = "pip install 'turnfsm[otel]'"


def _env_protocol() -> Protocol:
    value = (
        os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    ).strip()
    if value not in _PROTOCOLS:
        raise ConfigError(
            "OTEL_EXPORTER_OTLP_PROTOCOL", value, "'http/protobuf' or 'grpc'"
        )
    return value  # type: ignore[return-value]


def _env_flag(name: str) -> bool:
    """Whether the on/off variable `name` is on (unset or blank: off).

    Raises:
        ConfigError: it is set to neither (named, with its value): read
            as off, a misspelt ``on`` would leave its switch off unsaid.
    """
    raw = os.environ.get(name, "")
    flag = raw.strip().lower()
    if flag and flag not in _ON and flag not in _OFF:
        raise ConfigError(name, raw, "true or false")
    return flag in _ON


_ON: Final = ("1", "true", "yes")
_OFF: Final = ("0", "false", "no")


def _env_list(name: str, default: str, known: tuple[str, ...]) -> list[str]:
    """The exporters the environment variable `name` lists (or `default`).

    A name this setup does not export to (a typo, or another SDK's
    exporter) is refused: ignored, it would leave the runs untraced.
    """
    raw = os.environ.get(name, default)
    names = [v.strip().lower() for v in raw.split(",") if v.strip()]
    if any(n not in known for n in names):
        listed = ", ".join(repr(k) for k in known)
        raise ConfigError(name, raw, f"a comma-separated list of {listed}")
    return names


def _check_endpoint(endpoint: object, field: str = "endpoint") -> None:
    try:
        parts = urlsplit(endpoint) if isinstance(endpoint, str) else None
        hostname = parts.hostname if parts is not None else None
    except ValueError:  # e.g. an unclosed "[" in the host
        parts = hostname = None
    if parts is None or parts.scheme not in ("http", "https") or not hostname:
        raise ConfigError(field, endpoint, "an http:// or https:// URL with a host")


def _http_url(endpoint: str | None, path: str) -> str | None:
    if endpoint is None:
        return None
    if urlsplit(endpoint).path in ("", "/"):
        return endpoint.rstrip("/") + path
    return endpoint


def _exporter_options(
    headers: Mapping[str, str] | None, timeout: float | None
) -> dict[str, Any]:
    """The keywords every OTLP exporter takes (what is not given: its env's)."""
    options: dict[str, Any] = {}
    if headers is not None:
        options["headers"] = dict(headers)
    if timeout is not None:
        options["timeout"] = timeout
    return options


def _otlp_spans(
    protocol: Protocol,
    endpoint: str | None,
    headers: Mapping[str, str] | None,
    timeout: float | None,
) -> tuple[SpanExporter, str]:
    options = _exporter_options(headers, timeout)
    try:
        if protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
                OTLPSpanExporter as GrpcSpanExporter,
            )

            grpc = GrpcSpanExporter(endpoint=endpoint, **options)
            return grpc, endpoint or _env_endpoint("http://localhost:4317", "")
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
            OTLPSpanExporter as HttpSpanExporter,
        )
    except ImportError as exc:
        raise ImportError(f"OTLP over {protocol} needs its exporter: {_EXTRA}") from exc
    url = _http_url(endpoint, "/v1/traces")
    http = HttpSpanExporter(endpoint=url, **options)
    default = "http://localhost:4318/v1/traces"
    return http, url or _env_endpoint(default, "/v1/traces")


def _otlp_metrics(
    protocol: Protocol,
    endpoint: str | None,
    headers: Mapping[str, str] | None,
    timeout: float | None,
) -> MetricExporter:
    options = _exporter_options(headers, timeout)
    try:
        if protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (
                OTLPMetricExporter as GrpcMetricExporter,
            )

            return GrpcMetricExporter(endpoint=endpoint, **options)
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
            OTLPMetricExporter as HttpMetricExporter,
        )
    except ImportError as exc:
        raise ImportError(f"OTLP over {protocol} needs its exporter: {_EXTRA}") from exc
    return HttpMetricExporter(endpoint=_http_url(endpoint, "/v1/metrics"), **options)


def _env_endpoint(default: str, path: str) -> str:
    specific = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    if specific:
        return specific
    base = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    return (base.rstrip("/") + path) if base else default


_SAMPLERS: Final = (
    "always_on",
    "always_off",
    "traceidratio",
    "parentbased_always_on",
    "parentbased_always_off",
    "parentbased_traceidratio",
)
_COUNTS: Final = (
    "OTEL_BSP_SCHEDULE_DELAY",
    "OTEL_BSP_EXPORT_TIMEOUT",
    "OTEL_BSP_MAX_QUEUE_SIZE",
    "OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
)
_LIMITS: Final = (
    "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT",
    "OTEL_ATTRIBUTE_COUNT_LIMIT",
    "OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT",
    "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT",
    "OTEL_SPAN_EVENT_COUNT_LIMIT",
    "OTEL_SPAN_LINK_COUNT_LIMIT",
    "OTEL_EVENT_ATTRIBUTE_COUNT_LIMIT",
    "OTEL_LINK_ATTRIBUTE_COUNT_LIMIT",
)


def _check_environment() -> None:
    """Refuse an ``OTEL_*`` setting the SDK would ignore, misread or crash on.

    Left to the SDK, a malformed endpoint, timeout, header list, sampler or
    batch setting leaves the runs untraced (with a log line at best), or
    fails later with a bare ``ValueError`` naming no variable.
    """
    env = {k: v for k, v in os.environ.items() if k.startswith("OTEL_") and v.strip()}
    for name in (*_ENDPOINT_VARS, "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"):
        if name in env:
            _check_endpoint(env[name].strip(), name)
    for name in _TIMEOUTS:
        if name in env:
            _env_number(name, env[name], "a finite number of seconds > 0", above=0)
    for name in _HEADERS:
        if name in env:
            _check_pairs(name, env[name], "key1=value1,key2=value2", secret=True)
    if "OTEL_RESOURCE_ATTRIBUTES" in env:
        _check_pairs(
            "OTEL_RESOURCE_ATTRIBUTES",
            env["OTEL_RESOURCE_ATTRIBUTES"],
            "key1=value1,key2=value2",
        )
    for name in ("OTEL_SDK_DISABLED", CAPTURE_CONTENT_ENV):
        _env_flag(name)
    sampler = env.get("OTEL_TRACES_SAMPLER", "").strip().lower()
    if sampler and sampler not in _SAMPLERS:
        listed = ", ".join(repr(s) for s in _SAMPLERS)
        raise ConfigError(
            "OTEL_TRACES_SAMPLER", env["OTEL_TRACES_SAMPLER"], f"one of {listed}"
        )
    if sampler.endswith("traceidratio") and "OTEL_TRACES_SAMPLER_ARG" in env:
        ratio = _env_number(
            "OTEL_TRACES_SAMPLER_ARG",
            env["OTEL_TRACES_SAMPLER_ARG"],
            "a ratio from 0 to 1",
            low=0,
        )
        if ratio > 1:
            raise ConfigError(
                "OTEL_TRACES_SAMPLER_ARG",
                env["OTEL_TRACES_SAMPLER_ARG"],
                "a ratio from 0 to 1",
            )
    for name in _COUNTS:
        if name in env:
            _env_integer(name, env[name], low=1)
    for name in _LIMITS:
        if name in env:
            _env_integer(name, env[name], low=0)
    if "OTEL_BSP_MAX_EXPORT_BATCH_SIZE" in env:
        batch = int(env["OTEL_BSP_MAX_EXPORT_BATCH_SIZE"])
        queue = int(env.get("OTEL_BSP_MAX_QUEUE_SIZE", "2048"))
        if batch > queue:
            raise ConfigError(
                "OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
                env["OTEL_BSP_MAX_EXPORT_BATCH_SIZE"],
                f"a whole number no larger than OTEL_BSP_MAX_QUEUE_SIZE ({queue})",
            )


CAPTURE_CONTENT_ENV: Final = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
"""The standard switch for GenAI message content in telemetry (off by default)."""
_TIMEOUTS: Final = ("OTEL_EXPORTER_OTLP_TIMEOUT", "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT")
_HEADERS: Final = ("OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS")


def _env_number(
    name: str,
    raw: str,
    expected: str,
    *,
    low: float | None = None,
    above: float | None = None,
) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(name, raw, expected) from None
    if (
        not math.isfinite(value)
        or (low is not None and value < low)
        or (above is not None and value <= above)
    ):
        raise ConfigError(name, raw, expected)
    return value


def _env_integer(name: str, raw: str, *, low: int) -> int:
    expected = f"a whole number >= {low}"
    try:
        value = int(raw.strip())
    except ValueError:
        raise ConfigError(name, raw, expected) from None
    if value < low:
        raise ConfigError(name, raw, expected)
    return value


def _check_pairs(name: str, raw: str, expected: str, *, secret: bool = False) -> None:
    """Refuse `raw` unless it is ``key=value`` items, comma-separated.

    Headers often carry an API key: a `secret` value is not repeated in the
    error (which goes to a terminal or a log), only its length.
    """
    for item in raw.split(","):
        if not item.strip():
            continue
        key, equals, _ = item.partition("=")
        if not equals or not key.strip():
            shown = f"<{len(raw)} characters, not shown>" if secret else raw
            raise ConfigError(name, shown, expected)
