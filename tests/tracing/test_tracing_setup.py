"""`turnfsm.tracing.configure`: exporters chosen from arguments or OTEL_*, real
OTLP over HTTP and gRPC, bounded shutdown, and the CLI's `--trace`.

`configure(set_global=False)` keeps OpenTelemetry's once-only global provider
untouched in this process; what the global path does is run in subprocesses.
"""

from __future__ import annotations

import contextlib
import http.server
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import anyio
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)

from tests.helpers import http_server
from turnfsm import Driver
from turnfsm.agent import Agent
from turnfsm.errors import ConfigError, ProviderError
from turnfsm.messages import Message
from turnfsm.providers import ModelRequest, ModelResponse
from turnfsm.testing import FakeModelClient, ScriptedModel, reply, tool_call
from turnfsm.tracing import configure, global_hook, is_configured
from turnfsm.tracing._setup import ATTRIBUTE_LENGTH_LIMIT

from .otlp_receivers import grpc_receiver, http_receiver

_OTEL_VARS = (
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_SERVICE_NAME",
    "OTEL_SDK_DISABLED",
    "OTEL_TRACES_EXPORTER",
    "OTEL_METRICS_EXPORTER",
    "OTEL_EXPORTER_OTLP_TIMEOUT",
)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in (*_OTEL_VARS, *(n for n in os.environ if n.startswith("OTEL_"))):
        monkeypatch.delenv(name, raising=False)
    yield
    assert not is_configured(), "a test left tracing configured"


def _run_once(hook: object) -> None:
    driver = Driver(
        model=ScriptedModel([Message.assistant("hi")]),
        hooks=[hook],  # type: ignore[list-item]
        strict_hooks=True,
    )
    result = anyio.run(driver.run, "hello")
    assert result.ok


def test_configure_sends_runs_to_its_exporters_with_the_service_name() -> None:
    exporter = InMemorySpanExporter()
    tracing = configure(exporters=[exporter], service_name="svc", set_global=False)
    try:
        assert is_configured()
        assert global_hook() is tracing.hook
        # Any driver now traces its runs with the configured hook.
        driver = Driver(model=ScriptedModel([Message.assistant("hi")]))
        assert anyio.run(driver.run, "hello").ok
        assert tracing.force_flush()
    finally:
        assert tracing.shutdown()
    names = sorted(s.name for s in exporter.get_finished_spans())
    assert names == ["chat", "invoke_agent turnfsm", "turnfsm.turn 1"]
    (root,) = [s for s in exporter.get_finished_spans() if s.parent is None]
    assert root.resource.attributes["service.name"] == "svc"
    # After shutdown, runs are no longer traced through it.
    assert global_hook() is None


def test_driver_tracing_false_opts_a_driver_out() -> None:
    exporter = InMemorySpanExporter()
    tracing = configure(exporters=[exporter], set_global=False)
    try:
        driver = Driver(model=ScriptedModel([Message.assistant("hi")]), tracing=False)
        assert anyio.run(driver.run, "hello").ok
        tracing.force_flush()
    finally:
        tracing.shutdown()
    assert exporter.get_finished_spans() == ()


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"protocol": "http"}, "protocol"),
        ({"endpoint": "localhost:4318"}, "endpoint"),
        ({"endpoint": "ftp://collector:21"}, "endpoint"),
        ({"endpoint": 4318}, "endpoint"),
        ({"timeout": 0}, "timeout"),
        ({"timeout": float("nan")}, "timeout"),
        ({"timeout": float("inf")}, "timeout"),
        ({"timeout": True}, "timeout"),
    ],
)
def test_bad_settings_fail_naming_the_field(
    kwargs: dict[str, object], field: str
) -> None:
    with pytest.raises(ConfigError) as error:
        configure(set_global=False, **kwargs)  # type: ignore[arg-type]
    assert error.value.field == field
    assert not is_configured()


def test_a_bad_protocol_in_the_environment_is_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "thrift")
    with pytest.raises(ConfigError) as error:
        configure(set_global=False)
    assert error.value.field == "OTEL_EXPORTER_OTLP_PROTOCOL"
    assert error.value.value == "thrift"


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("OTEL_TRACES_EXPORTER", "otpl"),  # a typo would leave runs untraced
        ("OTEL_TRACES_EXPORTER", "otlp,zipkin"),  # an exporter this cannot use
        ("OTEL_METRICS_EXPORTER", "prometheus"),
    ],
)
def test_an_exporter_the_environment_names_that_cannot_be_used_is_named(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as error:
        configure(set_global=False)
    assert error.value.field == name
    assert error.value.value == value
    assert "'otlp'" in str(error.value)
    assert not is_configured()


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "localhost:4318"),  # no scheme: not sent
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "ftp://collector:21"),
        ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "not a url"),
        ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://[::1"),
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "abc"),
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "-1"),
        ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "nan"),
        ("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment"),
        ("OTEL_TRACES_SAMPLER", "sometimes"),
        ("OTEL_BSP_MAX_QUEUE_SIZE", "abc"),
        ("OTEL_BSP_SCHEDULE_DELAY", "-5"),
        ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "0"),
        ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "4096"),  # above the queue's 2048
        ("OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT", "abc"),
        ("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "-1"),
        # read as false, so content was silently not recorded
        ("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "on"),
        ("OTEL_SDK_DISABLED", "on"),  # read as false: tracing stayed on
    ],
)
def test_a_malformed_otel_variable_fails_naming_it(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    # Left to the SDK, each left the runs untraced with a log line, or
    # failed with a bare ValueError naming no variable.
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as error:
        configure(set_global=False, exporters=[])
    assert (error.value.field, error.value.value) == (name, value)
    assert not is_configured()


@pytest.mark.parametrize(
    "name", ["OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS"]
)
def test_malformed_headers_fail_without_repeating_them(
    monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    # Headers carry API keys: the error names the variable, not the key.
    monkeypatch.setenv(name, "Bearer sk-secret-123")  # "authorization=" forgotten
    with pytest.raises(ConfigError) as error:
        configure(set_global=False, exporters=[])
    assert error.value.field == name
    assert "sk-secret-123" not in str(error.value)
    assert "20 characters" in str(error.value)


@pytest.mark.parametrize("ratio", ["abc", "5", "-0.5"])
def test_a_sampler_ratio_outside_0_to_1_fails_naming_it(
    monkeypatch: pytest.MonkeyPatch, ratio: str
) -> None:
    # The SDK logged "Using default rate 1.0" and kept every run.
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", ratio)
    with pytest.raises(ConfigError) as error:
        configure(set_global=False, exporters=[])
    assert (error.value.field, error.value.value) == ("OTEL_TRACES_SAMPLER_ARG", ratio)


def test_well_formed_otel_variables_are_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in [
        ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "https://collector:4318/v1/traces"),
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "2.5"),
        ("OTEL_EXPORTER_OTLP_HEADERS", "api-key=abc, x-team=core,"),
        ("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=dev"),
        ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
        ("OTEL_TRACES_SAMPLER_ARG", "0.25"),
        ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "256"),
        ("OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT", "0"),
    ]:
        monkeypatch.setenv(name, value)
    configure(set_global=False, exporters=[]).shutdown()


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"headers": "api-key=abc"}, "headers"),
        ({"headers": {"api-key": 123}}, "headers['api-key']"),
        ({"service_name": 5}, "service_name"),
        ({"service_name": " "}, "service_name"),
        ({"exporters": InMemorySpanExporter()}, "exporters"),
        ({"exporters": [InMemorySpanExporter(), "console"]}, "exporters[1]"),
        ({"file": 5}, "file"),
        ({"otlp": "no"}, "otlp"),
        ({"metrics_export": "yes"}, "metrics_export"),
        ({"set_global": None}, "set_global"),
    ],
)
def test_bad_arguments_fail_naming_them(kwargs: dict[str, object], field: str) -> None:
    # Before, each was taken: a run went on untraced, or failed later
    # inside the exporter with a TypeError naming no argument.
    kwargs.setdefault("set_global", False)
    with pytest.raises(ConfigError) as error:
        configure(**kwargs)  # type: ignore[arg-type]
    assert error.value.field == field
    assert "api-key=abc" not in str(error.value)  # a header's value is not shown
    assert not is_configured()


def test_a_file_in_a_missing_directory_fails_naming_it(tmp_path: Path) -> None:
    # Before, the run went on and its spans were dropped with a warning.
    path = tmp_path / "missing" / "spans.jsonl"
    with pytest.raises(ConfigError) as error:
        configure(set_global=False, file=path)
    assert (error.value.field, error.value.value) == ("file", str(path))


def _huge_run(exporter: InMemorySpanExporter) -> None:
    def dump(size: int) -> str:
        """Return a large text.

        Args:
            size: how many characters.
        """
        return "é" * size

    model = ScriptedModel.of(reply("", tool_call("dump", "c1", size=1_000_000)), "ok")
    tracing = configure(exporters=[exporter], set_global=False)
    try:
        Agent(model=model, tools=[dump]).run_sync("dump a lot").raise_for_failure()
    finally:
        tracing.shutdown()


def _longest(exporter: InMemorySpanExporter) -> int:
    values: list[object] = []
    for span in exporter.get_finished_spans():
        values.extend(span.attributes.values())
        for event in span.events:
            values.extend(event.attributes.values())
    return max(len(v) for v in values if isinstance(v, str))


def test_recorded_content_is_capped_so_that_no_span_is_megabytes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Before, a 1,000,000-character tool result was recorded whole (2 MB of
    # UTF-8 on one span): a batch holding it is refused by a receiver with a
    # 4 MiB message limit (Jaeger's gRPC), and the run's other spans with it.
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true")
    exporter = InMemorySpanExporter()
    _huge_run(exporter)
    assert _longest(exporter) == ATTRIBUTE_LENGTH_LIMIT


def test_a_huge_error_message_does_not_make_a_span_megabytes() -> None:
    # A span's status has no length limit of its own: a model client that
    # quoted a proxy's 3 MB error page made the run's span 3 MB, over what
    # Jaeger's gRPC port takes in one batch, which it refuses whole.
    page = "<html>" + "x" * 3_000_000 + "</html>"

    async def fail(request: ModelRequest) -> ModelResponse:
        raise ProviderError(page, retryable=False, kind="server")

    exporter = InMemorySpanExporter()
    tracing = configure(exporters=[exporter], set_global=False)
    try:
        result = Agent(model=FakeModelClient(fail)).run_sync("hi")
    finally:
        tracing.shutdown()
    assert result.outcome == "failed"
    spans = exporter.get_finished_spans()
    described = {s.name: s.status.description or "" for s in spans}
    assert described["invoke_agent turnfsm"].startswith("model provider error")
    assert described["chat"].startswith("<html>xxx")
    assert max(len(d) for d in described.values()) <= 1_000, {
        name: len(d) for name, d in described.items()
    }
    assert _longest(exporter) == ATTRIBUTE_LENGTH_LIMIT  # its exception's message


def test_a_tool_name_the_model_made_up_is_cut_in_its_span_name() -> None:
    # A span's name has no length limit either: a model that called a tool
    # of a 200,000-character name made a span named so, an operation Jaeger
    # lists by name.
    made_up = "e" * 200_000
    model = ScriptedModel.of(reply("", tool_call(made_up, "c1")), "ok")
    exporter = InMemorySpanExporter()
    tracing = configure(exporters=[exporter], set_global=False)
    try:
        Agent(model=model).run_sync("hi").raise_for_failure()
    finally:
        tracing.shutdown()
    (span,) = [
        s for s in exporter.get_finished_spans() if s.name.startswith("execute_tool")
    ]
    assert span.name == "execute_tool " + "e" * 125 + "..."
    assert (span.attributes or {})["gen_ai.tool.name"] == "e" * ATTRIBUTE_LENGTH_LIMIT


def test_the_attribute_length_limit_can_be_raised_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true")
    monkeypatch.setenv("OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT", "1000000")
    exporter = InMemorySpanExporter()
    _huge_run(exporter)
    assert _longest(exporter) == 1_000_000


def test_the_exporters_the_environment_lists_are_read_loosely(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", " None , ")
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "NONE")
    tracing = configure(set_global=False)
    assert tracing.endpoint is None  # nothing exported over OTLP
    assert tracing.meter_provider is None
    tracing.shutdown(timeout=0.1)


def test_the_sdk_disabled_by_the_environment_traces_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    tracing = configure(set_global=False)
    assert tracing.tracer_provider is None
    assert not is_configured()
    assert global_hook() is None
    assert tracing.shutdown()


def test_endpoints_and_protocols_from_arguments_and_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tracing = configure(endpoint="http://collector:4318", set_global=False)
    assert (tracing.protocol, tracing.endpoint) == (
        "http/protobuf",
        "http://collector:4318/v1/traces",
    )
    tracing.shutdown(timeout=0.1)
    tracing = configure(endpoint="http://collector:4318/custom", set_global=False)
    assert tracing.endpoint == "http://collector:4318/custom"
    tracing.shutdown(timeout=0.1)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317")
    tracing = configure(set_global=False)
    assert (tracing.protocol, tracing.endpoint) == ("grpc", "http://collector:4317")
    tracing.shutdown(timeout=0.1)


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_runs_reach_a_real_otlp_receiver(protocol: str) -> None:
    receiver = http_receiver() if protocol == "http/protobuf" else grpc_receiver()
    with receiver as (endpoint, received):
        tracing = configure(
            endpoint=endpoint,
            protocol=protocol,  # type: ignore[arg-type]
            headers={"x-team": "turnfsm"},
            set_global=False,
        )
        try:
            _run_once(tracing.hook)
        finally:
            assert tracing.shutdown(timeout=10)
        spans = received.spans()
    by_name = {s["name"]: s for s in spans}
    assert set(by_name) == {"invoke_agent turnfsm", "turnfsm.turn 1", "chat"}
    root, turn, chat = (
        by_name["invoke_agent turnfsm"],
        by_name["turnfsm.turn 1"],
        by_name["chat"],
    )
    assert root["parent_id"] == ""
    assert turn["parent_id"] == root["span_id"]
    assert chat["parent_id"] == turn["span_id"]
    assert {s["trace_id"] for s in spans} == {root["trace_id"]}
    assert root["attributes"]["gen_ai.operation.name"] == "invoke_agent"
    assert chat["attributes"]["gen_ai.operation.name"] == "chat"
    assert root["resource"]["service.name"] == "turnfsm"
    assert "turnfsm.transition" in root["events"]


class _Stuck(SpanExporter):
    """An exporter whose receiver never answers (it blocks until released)."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.release.wait(30)
        return SpanExportResult.FAILURE


def test_shutdown_waits_no_longer_than_its_timeout() -> None:
    stuck = _Stuck()
    tracing = configure(exporters=[stuck], set_global=False)
    try:
        _run_once(tracing.hook)
        started = time.monotonic()
        assert tracing.shutdown(timeout=0.3) is False
        assert time.monotonic() - started < 2.0
    finally:
        stuck.release.set()


def test_a_batch_over_a_receivers_size_limit_goes_in_parts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Each span is cut to size, but a batch of them was not: a run of 20
    # turns recording content made one 5 MB request, which a receiver taking
    # 4 MiB (gRPC's default: Jaeger's, a Collector's) refused whole.
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true")

    def dump(i: int) -> str:
        """Return a large text.

        Args:
            i: which one.
        """
        return f"{i} " + "é" * 70_000

    asked = iter(range(1, 100))

    def model(request: ModelRequest) -> ModelResponse:
        i = next(asked)
        if i < 20:
            return ModelResponse(message=reply("", tool_call("dump", f"c{i}", i=i)))
        return ModelResponse(message=reply("done"))

    with grpc_receiver() as (endpoint, received):
        tracing = configure(endpoint=endpoint, protocol="grpc", set_global=False)
        try:
            agent = Agent(
                model=FakeModelClient(model),
                tools=[dump],
                context_window=1_000_000,
                max_turns=30,
            )
            agent.run_sync("go").raise_for_failure()
            assert tracing.force_flush(timeout=30)
            assert tracing.undelivered == 0
        finally:
            tracing.shutdown(timeout=1)
        spans = received.spans()
        requests = len(received.requests)
    assert len([s for s in spans if s["name"] == "execute_tool dump"]) == 19
    assert len([s for s in spans if s["name"] == "invoke_agent turnfsm"]) == 1
    assert requests > 1


@pytest.mark.parametrize("receiver", ["down", "hung"])
def test_force_flush_waits_no_longer_than_its_timeout(receiver: str) -> None:
    # The SDK's batch processor flushes in the caller's thread whatever the
    # timeout: with the receiver down or hung, force_flush(1.0) held its
    # caller 20 to 30 seconds, then said True.
    with contextlib.ExitStack() as stack:
        if receiver == "down":
            endpoint = f"http://127.0.0.1:{_closed_port()}"
        else:
            endpoint = stack.enter_context(_hung_receiver())
        tracing = configure(endpoint=endpoint, timeout=60, set_global=False)
        try:
            _run_once(tracing.hook)
            started = time.monotonic()
            assert tracing.force_flush(timeout=0.3) is False
            assert time.monotonic() - started < 2.0
            started = time.monotonic()  # a second flush waits on the first's
            assert tracing.force_flush(timeout=0.3) is False
            assert time.monotonic() - started < 2.0
        finally:
            tracing.shutdown(timeout=0.1)


def test_force_flush_says_when_the_receiver_refused_the_spans() -> None:
    with http_server(_NotOTLP) as (endpoint, _):
        tracing = configure(endpoint=endpoint, set_global=False)
        try:
            _run_once(tracing.hook)
            assert tracing.force_flush(timeout=5.0) is False
            assert tracing.undelivered == 1
            assert tracing.force_flush(timeout=5.0) is True  # nothing left
        finally:
            tracing.shutdown(timeout=0.1)


def test_shutdown_with_no_receiver_says_nothing_listens(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # It said "spans not delivered within 0.0s": it had not waited at all.
    endpoint = f"http://127.0.0.1:{_closed_port()}"
    tracing = configure(endpoint=endpoint, set_global=False)
    _run_once(tracing.hook)
    with caplog.at_level("WARNING", logger="turnfsm.tracing"):
        assert tracing.shutdown(timeout=5.0) is False
    # The exporter's own retry warnings (its thread's) are not ours to check.
    ours = [r.getMessage() for r in caplog.records if r.name == "turnfsm.tracing"]
    assert ours == [
        f"tracing: spans not delivered: nothing listens at {endpoint}/v1/traces "
        "(is the receiver up?)"
    ]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cli(
    argv: list[str], env: dict[str, str], tmp_path: Path
) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    return subprocess.run(
        [sys.executable, "-m", "turnfsm", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env={**clean, "TURNFSM_STORE": "memory:", **env},
        cwd=tmp_path,
        check=False,
    )


def test_the_demo_exports_when_an_endpoint_is_set(tmp_path: Path) -> None:
    with http_receiver() as (endpoint, received):
        done = _cli(
            ["demo", "--quiet", "--strategy", "summarizing"],
            {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint},
            tmp_path,
        )
        assert done.returncode == 0, done.stderr
        spans = received.spans()
    names = [s["name"] for s in spans]
    assert names.count("invoke_agent turnfsm") == 1
    assert "chat simulated" in names
    assert any(n.startswith("execute_tool ") for n in names)
    assert "turnfsm.compaction" in names
    # Summed over what crossed the wire, gen_ai.usage counts each model call
    # once: the run's own calls and its passes' summary calls.
    (root,) = [s for s in spans if not s["parent_id"]]
    passes = [s for s in spans if s["name"] == "turnfsm.compaction"]
    for key in ("input_tokens", "output_tokens"):
        summed = sum(s["attributes"].get(f"gen_ai.usage.{key}", 0) for s in spans)
        own = root["attributes"][f"turnfsm.usage.{key}"]
        summaries = sum(s["attributes"].get(f"turnfsm.usage.{key}", 0) for s in passes)
        assert summaries > 0, key  # the demo's summary calls report usage
        assert summed == own + summaries, key


def test_no_receiver_never_holds_the_demo_up(tmp_path: Path) -> None:
    endpoint = f"http://127.0.0.1:{_closed_port()}"
    started = time.monotonic()
    untraced = _cli(["demo", "--quiet"], {}, tmp_path)
    baseline = time.monotonic() - started
    assert untraced.returncode == 0, untraced.stderr
    started = time.monotonic()
    done = _cli(
        ["demo", "--quiet", "--trace"],
        {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint},
        tmp_path,
    )
    elapsed = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    assert "final answer" in done.stdout
    assert "traces not delivered" in done.stderr
    # The SDK alone would block ~7 s flushing at exit; a closed port costs
    # none. Against the same demo untraced: the machine may be busy.
    assert elapsed - baseline < 4.0, (elapsed, baseline)


class _NotOTLP(http.server.BaseHTTPRequestHandler):
    """A web server that is no OTLP receiver: every export is a 404."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_error(404)

    def log_message(self, *_args: object) -> None:
        pass


def test_a_receiver_that_refuses_the_spans_is_not_said_to_have_them(
    tmp_path: Path,
) -> None:
    with http_server(_NotOTLP) as (endpoint, _):
        done = _cli(["demo"], {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint}, tmp_path)
    assert done.returncode == 0, done.stderr  # the run's own status
    assert "traces exported" not in done.stderr
    assert done.stderr.splitlines()[-1].startswith(
        f"turnfsm demo: traces not delivered to {endpoint}/v1/traces: it refused "
    )


def test_without_an_endpoint_the_demo_does_not_trace(tmp_path: Path) -> None:
    done = _cli(["demo", "--quiet"], {}, tmp_path)
    assert done.returncode == 0
    assert "traces" not in done.stderr


def test_content_cut_to_the_limit_is_not_a_warning_on_the_console(
    tmp_path: Path,
) -> None:
    # OpenTelemetry logs a warning for every value it cuts: `demo --quiet`
    # recording content printed ten "String attribute value exceeds max
    # length" lines, of a cut the tracing page describes.
    env = {
        "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "true",
        "OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT": "1000",
    }
    done = _cli(["demo", "--quiet", "--trace-file", "t.jsonl"], env, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert '"gen_ai.input.messages"' in (tmp_path / "t.jsonl").read_text()


def test_a_trace_file_draws_the_same_path_as_the_store(tmp_path: Path) -> None:
    """`demo --trace-file` writes OTLP/JSON; `diagram --trace` reads it back to
    the very path `diagram --run` replays from the session store."""
    store = str(tmp_path / "s.db")
    done = _cli(
        ["demo", "--quiet", "--store", store, "--trace-file", "t.jsonl"], {}, tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert "traces exported to t.jsonl" not in done.stderr  # --quiet
    listed = _cli(["sessions", "list", "--store", store], {}, tmp_path)
    session = listed.stdout.splitlines()[1].split()[0]
    from_store = _cli(
        ["diagram", "--run", session, "--store", store, "-o", "a.dot"], {}, tmp_path
    )
    from_trace = _cli(["diagram", "--trace", "t.jsonl", "-o", "b.dot"], {}, tmp_path)
    assert from_store.returncode == from_trace.returncode == 0, from_trace.stderr
    a = (tmp_path / "a.dot").read_text().replace(session, "SOURCE")
    b = (tmp_path / "b.dot").read_text().replace("t.jsonl", "SOURCE")
    assert a == b
    assert "penwidth" in a  # the path is drawn


def test_a_trace_file_that_is_a_directory_is_refused(tmp_path: Path) -> None:
    done = _cli(["demo", "--quiet", "--trace-file", str(tmp_path)], {}, tmp_path)
    assert done.returncode == 2
    assert "file" in done.stderr


def _run_roots(path: Path) -> list[dict[str, object]]:
    """The `invoke_agent` spans an OTLP/JSON lines file holds, attributes flat."""
    import json

    roots: list[dict[str, object]] = []
    for line in path.read_text().splitlines():
        for resource in json.loads(line)["resourceSpans"]:
            for scope in resource["scopeSpans"]:
                for span in scope["spans"]:
                    if span["name"].startswith("invoke_agent"):
                        flat = {
                            a["key"]: next(iter(a["value"].values()))
                            for a in span["attributes"]
                        }
                        roots.append(flat)
    return roots


@pytest.mark.parametrize("answer", ["approve", "reject"])
def test_the_rest_of_a_paused_run_is_traced_by_the_command_that_answers_it(
    tmp_path: Path, answer: str
) -> None:
    """`turnfsm run` traced the first part; the answer traces the rest."""
    store = str(tmp_path / "s.db")
    agent = ["--agent", "tests.cli.approval_agent:careful", "--store", store]
    env = {"PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    paused = _cli(
        ["run", "clean up", *agent, "--trace-file", "first.jsonl"], env, tmp_path
    )
    assert paused.returncode == 3, paused.stderr
    (first,) = _run_roots(tmp_path / "first.jsonl")
    assert first["turnfsm.run.outcome"] == "paused"
    listed = _cli(["sessions", "list", "--store", store], env, tmp_path)
    session = listed.stdout.splitlines()[1].split()[0]
    went_on = _cli(
        [answer, session, *agent, "--trace-file", "rest.jsonl"], env, tmp_path
    )
    assert went_on.returncode == 0, went_on.stderr
    assert "traces exported to rest.jsonl" in went_on.stderr
    (rest,) = _run_roots(tmp_path / "rest.jsonl")
    assert rest["turnfsm.run.id"] == first["turnfsm.run.id"]
    assert rest["turnfsm.run.resumed"] is True
    assert rest["turnfsm.run.outcome"] == "done"


@contextmanager
def _hung_receiver() -> Iterator[str]:
    """A port that takes connections and never answers: a receiver that hangs."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    taken: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                taken.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        thread.join()
        for conn in taken:
            conn.close()
        server.close()


@pytest.mark.parametrize("receiver", ["down", "hung"])
def test_a_receiver_down_or_hung_loses_nothing_of_the_trace_file(
    tmp_path: Path, receiver: str
) -> None:
    # The file's spans were queued behind the OTLP exporter's at shutdown:
    # with the receiver down (no wait) or hung (the wait ran out on it),
    # the file was never written.
    file = tmp_path / "spans.jsonl"
    with contextlib.ExitStack() as stack:
        if receiver == "hung":
            endpoint = stack.enter_context(_hung_receiver())
        else:
            endpoint = f"http://127.0.0.1:{_closed_port()}"
        tracing = configure(endpoint=endpoint, file=file, set_global=False)
        _run_once(tracing.hook)
        started = time.monotonic()
        assert tracing.shutdown(timeout=1.0) is False  # OTLP: not delivered
        assert time.monotonic() - started < 3.0
    assert "invoke_agent turnfsm" in file.read_text()


def test_the_view_s_approve_button_traces_the_rest_of_the_run(tmp_path: Path) -> None:
    """`turnfsm view --trace-file` traces what its Approve button carries on."""
    import re
    import signal
    import urllib.parse
    import urllib.request

    store = str(tmp_path / "s.db")
    agent = ["--agent", "tests.cli.approval_agent:careful", "--store", store]
    env = {"PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    assert _cli(["run", "clean up", *agent], env, tmp_path).returncode == 3
    listed = _cli(["sessions", "list", "--store", store], env, tmp_path)
    session = listed.stdout.splitlines()[1].split()[0]
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    argv = ["view", session, *agent, "--no-open", "--trace-file", "view.jsonl"]
    server = subprocess.Popen(
        [sys.executable, "-m", "turnfsm", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**clean, **env},
        cwd=tmp_path,
    )
    try:
        assert server.stdout is not None
        url = ""
        for line in server.stdout:
            found = re.search(r"at (http://127\.0\.0\.1:\d+/\?token=\S+)", line)
            if found:
                url = found.group(1)
                break
        assert url, server.stderr.read() if server.stderr else ""
        with urllib.request.urlopen(url, timeout=30) as page:
            form = page.read().decode()
        action = re.search(r'<form method="post" action="([^"]+)" class="answer"', form)
        assert action is not None, form
        fields = dict(re.findall(r'<input[^>]*name="([^"]+)" value="([^"]*)"', form))
        target = urllib.parse.urljoin(url, action.group(1).replace("&amp;", "&"))
        data = urllib.parse.urlencode({**fields, "action": "approve"}).encode()
        with contextlib.suppress(urllib.error.HTTPError):
            urllib.request.urlopen(target, data=data, timeout=60).close()
    finally:
        server.send_signal(signal.SIGINT)
        _, err = server.communicate(timeout=60)
    assert server.returncode == 0, err
    assert "traces exported to view.jsonl" in err
    (rest,) = _run_roots(tmp_path / "view.jsonl")
    assert rest["turnfsm.run.resumed"] is True
    assert rest["turnfsm.run.outcome"] == "done"
