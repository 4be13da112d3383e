"""`configure`: OpenTelemetry's SDK set up for turnfsm runs (arguments or OTEL_*)."""

from __future__ import annotations

import atexit
import functools
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Final, final
from urllib.parse import urlsplit

from opentelemetry import metrics, trace
from opentelemetry.context import Context
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import (
    ReadableSpan,
    SpanLimits,
    SpanProcessor,
    TracerProvider,
)
from opentelemetry.sdk.trace import Span as SDKSpan
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SpanExporter,
    SpanExportResult,
)

from turnfsm._checks import boolean, check, string
from turnfsm.errors import ConfigError
from turnfsm.tracing import attributes as A
from turnfsm.tracing._hook import TracingHook
from turnfsm.tracing._otlp import (
    _ENDPOINT_VARS,
    _PROTOCOLS,
    Protocol,
    _check_endpoint,
    _check_environment,
    _env_flag,
    _env_list,
    _env_protocol,
    _otlp_metrics,
    _otlp_spans,
)

__all__ = ["Tracing", "configure", "global_hook", "is_configured"]

logger = logging.getLogger("turnfsm.tracing")


@final
class Tracing:
    """What `configure` set up: its providers, the hook runs use, and its end.

    Attributes:
        tracer_provider: The SDK tracer provider spans go to (None when the
            SDK is disabled by ``OTEL_SDK_DISABLED``).
        meter_provider: The SDK meter provider, when metrics are exported.
        hook: The `TracingHook` every `Driver` adds to its runs.
        endpoint: Where OTLP goes (None: no OTLP exporter).
        protocol: The OTLP transport.
    """

    _otlp: _Counted | None = None
    # The processors that do not send over OTLP (a file, exporters given):
    # a receiver that is down or hangs must not cost them their spans.
    _local: tuple[SpanProcessor, ...] = ()
    # The flush still going (its thread, and what each part of it said).
    _flushing: tuple[threading.Thread, list[bool]] | None = None

    def __init__(
        self,
        tracer_provider: TracerProvider | None,
        meter_provider: MeterProvider | None,
        *,
        endpoint: str | None,
        protocol: Protocol,
    ) -> None:
        self.tracer_provider = tracer_provider
        self.meter_provider = meter_provider
        self.endpoint = endpoint
        self.protocol = protocol
        self.hook = TracingHook(
            tracer_provider=tracer_provider, meter_provider=meter_provider
        )
        self._closed = False

    @property
    def undelivered(self) -> int:
        """Batches of spans (or parts of one) the OTLP receiver did not take.

        Refused or unreached: a server that answers an export with an error
        (an HTTP 404: not an OTLP receiver, or not at that path) takes none
        of its spans.
        """
        return self._otlp.failed if self._otlp is not None else 0

    def force_flush(self, timeout: float = 5.0) -> bool:
        """Export what is buffered, waiting at most `timeout` seconds.

        It waits as `shutdown` does: the exporters work in daemon threads, so
        a receiver that is down or hangs holds only them, and the caller not
        at all when nothing listens at the endpoint. A flush asked for while
        an earlier one still waits on the receiver waits on that one.

        Returns whether everything went within `timeout`: False too when the
        receiver refused a batch meanwhile (see `undelivered`).
        """
        providers = [p for p in (self.tracer_provider, self.meter_provider) if p]
        if not providers:
            return True
        refused = self.undelivered
        going = self._flushing
        local: list[threading.Thread] = []
        if going is not None and going[0].is_alive():
            worker, flushed = going
            started = time.monotonic()
            if not _nothing_listens(self.endpoint, timeout):
                worker.join(max(0.0, timeout - (time.monotonic() - started)))
        else:
            millis = int(timeout * 1000)
            flushed = []

            def flush(target: TracerProvider | MeterProvider | SpanProcessor) -> None:
                flushed.append(target.force_flush(millis))

            local, worker, _ = _in_turn(
                [functools.partial(flush, p) for p in self._local],
                [functools.partial(flush, p) for p in providers],
                timeout,
                endpoint=self.endpoint,
            )
            self._flushing = (worker, flushed)
        if worker.is_alive() or any(w.is_alive() for w in local):
            return False
        return all(flushed) and self.undelivered == refused

    def shutdown(self, timeout: float = 5.0) -> bool:
        """Flush and stop, waiting at most `timeout` seconds; never blocks longer.

        From then on, runs are no longer traced through it.

        A receiver that is down must not hold a process at its exit: the
        exporters' retries go on in a daemon thread that is left behind.
        Returns whether everything was flushed and stopped in time.
        """
        global _current
        if self._closed:
            return True
        self._closed = True
        with _lock:
            if _current is self:  # runs from now on are not traced by it
                _current = None
        providers = [p for p in (self.tracer_provider, self.meter_provider) if p]
        if not providers:
            return True
        local, worker, unreachable = _in_turn(
            [p.shutdown for p in self._local],
            [p.shutdown for p in providers],
            timeout,
            endpoint=self.endpoint,
        )
        if any(w.is_alive() for w in local):
            stuck = {
                type(_exporter_of(p)).__name__
                for p, w in zip(self._local, local, strict=True)
                if w.is_alive()
            }
            logger.warning(
                "tracing: spans not all written within %ss by: %s",
                timeout,
                ", ".join(sorted(stuck)),
            )
            return False
        if worker.is_alive():
            if unreachable:  # it did not wait: it said "within 0.0s"
                logger.warning(
                    "tracing: spans not delivered: nothing listens at %s "
                    "(is the receiver up?)",
                    self.endpoint,
                )
            else:
                logger.warning(
                    "tracing: spans not delivered within %ss "
                    "(is the receiver at %s up?)",
                    timeout,
                    self.endpoint,
                )
            return False
        return True


def _in_turn(
    local: Sequence[Callable[[], object]],
    rest: Sequence[Callable[[], object]],
    timeout: float,
    *,
    endpoint: str | None,
) -> tuple[list[threading.Thread], threading.Thread, bool]:
    """Run each of `local`, then `rest`, in daemon threads; wait `timeout` at most.

    `local` (the spans bound for a file, or an exporter given) go first, each
    on its own: they wait on no receiver, so none that is down or hangs
    (OTLP, in `rest`) costs them. The wait on `rest` is skipped when nothing
    listens at `endpoint`: waiting on the exporters' retries would only hold
    the caller up. Returns the threads (alive: not done in time) and
    whether nothing listened.
    """
    started = time.monotonic()
    workers = [_in_background(call) for call in local]
    for worker in workers:
        worker.join(max(0.0, timeout - (time.monotonic() - started)))
    unreachable = _nothing_listens(endpoint, timeout - (time.monotonic() - started))
    worker = _in_background(*rest)
    worker.join(
        0.0 if unreachable else max(0.0, timeout - (time.monotonic() - started))
    )
    return workers, worker, unreachable


def _in_background(*calls: Callable[[], object]) -> threading.Thread:
    """A daemon thread making `calls` in turn (started): a hang holds only it."""

    def run() -> None:
        for each in calls:
            try:
                each()
            except Exception:  # an exporter's own failure: nothing to keep
                logger.debug("tracing: flush or shutdown failed", exc_info=True)

    worker = threading.Thread(target=run, name="turnfsm-tracing", daemon=True)
    worker.start()
    return worker


def _exporter_of(processor: SpanProcessor) -> object:
    return getattr(processor, "span_exporter", processor)


def _nothing_listens(endpoint: str | None, seconds: float) -> bool:
    """Whether `endpoint` is set and refuses connections (asked within `seconds`)."""
    return endpoint is not None and seconds > 0 and not _reachable(endpoint, seconds)


def _reachable(endpoint: str, seconds: float) -> bool:
    """Whether something takes TCP connections at `endpoint` (0.5 s at most)."""
    parts = urlsplit(endpoint if "//" in endpoint else f"//{endpoint}")
    host = parts.hostname or "localhost"
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((host, port), timeout=min(0.5, seconds)):
            return True
    except OSError:
        return False


_current: Tracing | None = None
_shared: TracingHook | None = None
_lock = threading.Lock()


def configure(
    *,
    endpoint: str | None = None,
    protocol: Protocol | None = None,
    headers: Mapping[str, str] | None = None,
    service_name: str | None = None,
    exporters: Sequence[SpanExporter] | None = None,
    file: str | os.PathLike[str] | None = None,
    otlp: bool | None = None,
    metrics_export: bool | None = None,
    timeout: float | None = None,
    set_global: bool = True,
) -> Tracing:
    """Set up OpenTelemetry so that every turnfsm run is traced.

    Everything not given is read from the standard environment:
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` (and its ``_TRACES_`` form),
    ``OTEL_EXPORTER_OTLP_PROTOCOL`` (``http/protobuf``, the default, or
    ``grpc``), ``OTEL_EXPORTER_OTLP_HEADERS``, ``OTEL_EXPORTER_OTLP_TIMEOUT``
    (seconds), ``OTEL_SERVICE_NAME`` / ``OTEL_RESOURCE_ATTRIBUTES``,
    ``OTEL_TRACES_SAMPLER`` (+ ``_ARG``), ``OTEL_TRACES_EXPORTER`` (``otlp``,
    ``console``, ``none``), ``OTEL_METRICS_EXPORTER`` (``otlp``, ``none``),
    ``OTEL_BSP_*`` and ``OTEL_SDK_DISABLED``.

    Spans are exported in the background (a batch processor): a receiver
    that is slow or down never holds up a run, and `Tracing.shutdown` (also
    run at exit) waits a bounded time.

    Args:
        endpoint: The OTLP receiver, e.g. ``http://localhost:4318`` (HTTP;
            ``/v1/traces`` is added when no path is given) or
            ``http://localhost:4317`` (gRPC).
        protocol: The OTLP transport.
        headers: Sent with every export (e.g. an API key).
        service_name: The ``service.name`` resource attribute, and so the
            Jaeger service and (unless ``openinference.project.name`` is
            set) the Phoenix project every run lands in. Default:
            ``OTEL_SERVICE_NAME`` (or ``service.name`` in
            ``OTEL_RESOURCE_ATTRIBUTES``); else each run lands in a service
            and a project named after its agent (`Agent`'s ``name``,
            ``turnfsm`` unless set).
        exporters: Span exporters to use instead of OTLP (e.g. the SDK's
            ``InMemorySpanExporter``), each behind a batch processor.
        file: Also write the spans as OTLP/JSON lines to this file (what
            ``turnfsm diagram --trace`` reads).
        otlp: Export over OTLP (default: unless `exporters` or `file` are
            given, or when an endpoint is given or set in the environment).
        metrics_export: Export metrics over OTLP too (default: only when
            ``OTEL_METRICS_EXPORTER=otlp``; Jaeger takes no metrics).
        timeout: Seconds each export may take (default: the environment's,
            else 10).
        set_global: Also make it OpenTelemetry's global provider (the first
            time only, as OpenTelemetry allows), so that other libraries'
            spans join the same traces.

    Returns:
        The `Tracing`; call its `shutdown()` when done (it also runs at exit).

    Raises:
        ConfigError: a bad argument (protocol, endpoint, timeout, headers,
            service name, exporters, file), an exporter the environment
            names that this setup cannot export to, or a malformed
            ``OTEL_*`` variable (endpoint, timeout, headers, resource
            attributes, sampler and its ratio, ``OTEL_BSP_*``, limits),
            named with its value.
        ImportError: OTLP is asked for without the exporters
            (``pip install 'turnfsm[otel]'``).
    """
    if protocol is not None and protocol not in _PROTOCOLS:
        raise ConfigError("protocol", protocol, "'http/protobuf' or 'grpc'")
    if timeout is not None and (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not 0 < timeout < float("inf")
    ):
        raise ConfigError("timeout", timeout, "a finite number of seconds > 0")
    check(set_global, "set_global", boolean())
    chosen: Protocol = protocol or _env_protocol()
    if _env_flag("OTEL_SDK_DISABLED"):
        tracing = Tracing(None, None, endpoint=None, protocol=chosen)
        _install(tracing, set_global=False)
        return tracing
    _check_environment()
    if endpoint is not None:
        _check_endpoint(endpoint)
    _check_arguments(headers, service_name, exporters, file, otlp, metrics_export)
    resource, named = _resource(service_name)
    provider = TracerProvider(
        resource=resource, shutdown_on_exit=False, span_limits=_span_limits()
    )
    wanted = _env_list("OTEL_TRACES_EXPORTER", "otlp", ("otlp", "console", "none"))
    used: list[SpanExporter] = list(exporters or ())
    target: str | None = None
    if otlp is None:
        otlp = (exporters is None and file is None) or endpoint is not None
        otlp = otlp or any(os.environ.get(v) for v in _ENDPOINT_VARS)
        otlp = otlp and "otlp" in wanted
    counted: _Counted | None = None
    if otlp:
        exporter, target = _otlp_spans(chosen, endpoint, headers, timeout)
        counted = _Counted(exporter)
        used.append(counted)
    if exporters is None and file is None and "console" in wanted:
        used.append(ConsoleSpanExporter())
    if file is not None:
        used.append(_file_exporter(Path(file)))
    processors = [BatchSpanProcessor(exporter) for exporter in used]
    for processor in processors:
        provider.add_span_processor(processor)
    meter_provider = None
    if metrics_export is None:
        exported = _env_list("OTEL_METRICS_EXPORTER", "none", ("otlp", "none"))
        metrics_export = "otlp" in exported
    if metrics_export:
        meter_provider = MeterProvider(
            resource=resource,
            metric_readers=[
                PeriodicExportingMetricReader(
                    _otlp_metrics(chosen, endpoint, headers, timeout)
                )
            ],
            shutdown_on_exit=False,
        )
    tracing = Tracing(provider, meter_provider, endpoint=target, protocol=chosen)
    tracing._otlp = counted
    tracing._local = tuple(
        p for p, e in zip(processors, used, strict=True) if e is not counted
    )
    if not named:
        tracing.hook._trace_agents_apart(_AgentProviders(resource, processors).tracer)
    _install(tracing, set_global=set_global)
    return tracing


ATTRIBUTE_LENGTH_LIMIT: Final = 65_536
"""Characters an attribute value keeps unless the environment sets a limit.

Recorded content (a long conversation, a large tool result) and error
messages are cut there, so that no span runs to megabytes: a batch that
large is refused by receivers that cap a request (Jaeger's gRPC takes
4 MiB), and the run's other spans with it.
"""


def _span_limits() -> SpanLimits:
    """The SDK's limits, with `ATTRIBUTE_LENGTH_LIMIT` unless a variable sets one."""
    given = any(
        os.environ.get(name, "").strip()
        for name in (
            "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT",
            "OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT",
        )
    )
    return SpanLimits(max_attribute_length=None if given else ATTRIBUTE_LENGTH_LIMIT)


def _check_arguments(
    headers: object,
    service_name: object,
    exporters: object,
    file: object,
    otlp: object,
    metrics_export: object,
) -> None:
    if headers is not None:  # they carry API keys: their values are not shown
        if not isinstance(headers, Mapping):
            shown = f"<a {type(headers).__name__}, not shown>"
            raise ConfigError("headers", shown, "a mapping of strings to strings")
        for key, value in headers.items():
            if not isinstance(key, str) or not isinstance(value, str):
                shown = f"<a {type(value).__name__}, not shown>"
                raise ConfigError(f"headers[{key!r}]", shown, "a string key and value")
    check(service_name, "service_name", string(non_empty=True, optional=True))
    if exporters is not None:
        if isinstance(exporters, str | bytes) or not isinstance(exporters, Sequence):
            raise ConfigError("exporters", exporters, "a sequence of SpanExporters")
        for i, exporter in enumerate(exporters):
            if not callable(getattr(exporter, "export", None)):
                raise ConfigError(f"exporters[{i}]", exporter, "a SpanExporter")
    if file is not None and not isinstance(file, str | os.PathLike):
        raise ConfigError("file", file, "a path to write OTLP/JSON lines to")
    check(otlp, "otlp", boolean(optional=True))
    check(metrics_export, "metrics_export", boolean(optional=True))


def _resource(service_name: str | None) -> tuple[Resource, bool]:
    """The resource, and whether the service was named (argument or environment).

    Unnamed, the service is ``turnfsm`` (each agent's runs then go to a
    service named after the agent: see `_AgentProviders`). Phoenix's project
    (``openinference.project.name``) is the service's name unless given.
    """
    resource = Resource.create(
        {"service.name": service_name} if service_name is not None else {}
    )
    name = str(resource.attributes.get("service.name", ""))
    named = bool(name) and not name.startswith("unknown_service")
    if not named:
        resource = resource.merge(Resource({"service.name": "turnfsm"}))
    return _with_project(resource), named


def _with_project(resource: Resource) -> Resource:
    """`resource`, with Phoenix's project named after its service unless set."""
    if A.PROJECT_NAME in resource.attributes:
        return resource
    name = resource.attributes["service.name"]
    return resource.merge(Resource({A.PROJECT_NAME: name}))


REQUEST_BYTES: Final = 3 * 2**20
"""The most bytes of spans one OTLP request carries (about).

Receivers cap a request: gRPC's default, Jaeger's and a Collector's, is
4 MiB, and a request over it is refused whole, with every span in it. Each
span is cut to size (`ATTRIBUTE_LENGTH_LIMIT`), but a batch of spans that
record content can still run to megabytes: it goes in parts.
"""


@final
class _Counted(SpanExporter):
    """Hands spans on to an exporter in requests of at most `REQUEST_BYTES`.

    It counts the requests the exporter did not deliver.
    """

    def __init__(self, exporter: SpanExporter) -> None:
        self._exporter = exporter
        self.failed = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        result = SpanExportResult.SUCCESS
        for part in _parts(spans, REQUEST_BYTES):
            if self._exporter.export(part) is not SpanExportResult.SUCCESS:
                self.failed += 1
                result = SpanExportResult.FAILURE
        return result

    def shutdown(self) -> None:
        self._exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._exporter.force_flush(timeout_millis)


def _parts(
    spans: Sequence[ReadableSpan], limit: int
) -> Iterator[Sequence[ReadableSpan]]:
    """`spans` in consecutive parts of about `limit` bytes at most (a span each)."""
    weights = [_size(span) for span in spans]
    if sum(weights) <= limit:  # the usual batch: as it is
        yield spans
        return
    part: list[ReadableSpan] = []
    size = 0
    for span, weight in zip(spans, weights, strict=True):
        if part and size + weight > limit:
            yield part
            part, size = [], 0
        part.append(span)
        size += weight
    yield part


def _size(span: ReadableSpan) -> int:
    """About how many bytes `span` takes in a request: its texts, and a margin."""
    total = 256 + len(span.name)
    for attributes in (span.attributes, *(e.attributes for e in span.events)):
        for key, value in (attributes or {}).items():
            total += 16 + len(key) + _value_size(value)
    return total


def _value_size(value: object) -> int:
    if isinstance(value, str):
        return len(value) if value.isascii() else len(value.encode("utf-8", "replace"))
    if isinstance(value, tuple | list):
        return sum(_value_size(v) for v in value)
    return 16


@final
class _Forward(SpanProcessor):
    """Hands spans on to `configure`'s processors, which it does not own."""

    def __init__(self, processors: Sequence[SpanProcessor]) -> None:
        self._processors = tuple(processors)

    def on_start(self, span: SDKSpan, parent_context: Context | None = None) -> None:
        for processor in self._processors:
            processor.on_start(span, parent_context=parent_context)

    def on_end(self, span: ReadableSpan) -> None:
        for processor in self._processors:
            processor.on_end(span)

    def shutdown(self) -> None:
        """Nothing: the main provider shuts its processors down."""

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return all(p.force_flush(timeout_millis) for p in self._processors)


@final
class _AgentProviders:
    """One tracer provider per agent name, its resource named after the agent.

    So that a run lands in a Jaeger service (``service.name``) and a Phoenix
    project (``openinference.project.name``) named after its agent. They
    share `configure`'s processors (and so its exporters and batches).
    """

    def __init__(self, resource: Resource, processors: Sequence[SpanProcessor]):
        self._resource = resource
        self._forward = _Forward(processors)
        self._tracers: dict[str, trace.Tracer] = {}
        self._lock = threading.Lock()

    def tracer(self, agent: str) -> trace.Tracer:
        with self._lock:
            found = self._tracers.get(agent)
            if found is None:
                named = {"service.name": agent}
                if A.PROJECT_NAME not in _given_attributes():
                    named[A.PROJECT_NAME] = agent
                provider = TracerProvider(
                    resource=self._resource.merge(Resource(named)),
                    shutdown_on_exit=False,
                    span_limits=_span_limits(),
                )
                provider.add_span_processor(self._forward)
                found = self._tracers[agent] = provider.get_tracer(
                    "turnfsm", _version()
                )
            return found


def _given_attributes() -> Mapping[str, object]:
    """The resource attributes the environment sets (OTEL_RESOURCE_ATTRIBUTES)."""
    return Resource.create({}).attributes


def _version() -> str:
    from turnfsm import __version__

    return __version__


def _file_exporter(path: Path) -> SpanExporter:
    from turnfsm.tracing._otlp_json import OTLPJSONFileExporter
    from turnfsm.tracing._otlp_json_write import writable_file

    return OTLPJSONFileExporter(writable_file(path, "file"))


def _install(tracing: Tracing, *, set_global: bool) -> None:
    global _current
    with _lock:
        previous, _current = _current, tracing
    if previous is not None:
        previous.shutdown(timeout=2.0)
    if set_global and tracing.tracer_provider is not None:
        if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
            trace.set_tracer_provider(tracing.tracer_provider)
        if tracing.meter_provider is not None and _is_proxy_meter():
            metrics.set_meter_provider(tracing.meter_provider)
    atexit.register(tracing.shutdown, 3.0)


def _is_proxy_meter() -> bool:
    return type(metrics.get_meter_provider()).__name__.startswith("_Proxy")


def is_configured() -> bool:
    """Whether `configure` set tracing up in this process (and it is on)."""
    current = _current
    return current is not None and current.tracer_provider is not None


def global_hook(*, force: bool = False) -> TracingHook | None:
    """The hook a `Driver` adds to its runs, or None when nothing is set up.

    `configure`'s hook when it was called; else one on OpenTelemetry's
    global providers when the application set a tracer provider up (or
    `force`).
    """
    global _shared
    current = _current
    if current is not None:
        return current.hook if current.tracer_provider is not None else None
    provider = trace.get_tracer_provider()
    real = not isinstance(
        provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider
    )
    if not (real or force):
        return None
    with _lock:
        if _shared is None:
            _shared = TracingHook()
        return _shared
