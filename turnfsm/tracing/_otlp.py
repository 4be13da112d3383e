"""The OTLP exporters `configure` builds, and the ``OTEL_*`` settings it reads."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Final, Literal
from urllib.parse import urlsplit

from opentelemetry.sdk.metrics.export import MetricExporter
from opentelemetry.sdk.trace.export import SpanExporter

from turnfsm.errors import ConfigError

__all__ = [
    "_ENDPOINT_VARS",
    "_PROTOCOLS",
    "Protocol",
    "_check_endpoint",
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
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes")


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


def _check_endpoint(endpoint: object) -> None:
    parts = urlsplit(endpoint) if isinstance(endpoint, str) else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(
            "endpoint", endpoint, "an http:// or https:// URL with a host"
        )


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
