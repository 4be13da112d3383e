"""A real OTLP receiver: the plain OpenTelemetry SDK exports to Phoenix over
OTLP/HTTP and OTLP/gRPC, and the span tree comes back through its REST API.

This proves the receiver side (tests/integration/phoenix.py) that turnfsm's
own tracing tests build on. Skipped when Phoenix or the OTLP exporters are
missing, unless TURNFSM_REQUIRE_PHOENIX=1 (CI sets it): then it fails.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode

from tests.integration.phoenix import (
    PROJECT_ATTRIBUTE,
    Phoenix,
    by_name,
    spans,
    unique_project,
)

EXPORTERS = {
    "http": "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "grpc": "opentelemetry.exporter.otlp.proto.grpc.trace_exporter",
}

pytestmark = pytest.mark.timeout(240)  # the first test waits for Phoenix to start

PARENT_ATTRIBUTES: dict[str, Any] = {
    "gen_ai.operation.name": "invoke_agent",
    "gen_ai.agent.name": "smoke",
}
CHILD_ATTRIBUTES: dict[str, Any] = {
    "gen_ai.operation.name": "chat",
    "gen_ai.request.model": "tiny",
    "gen_ai.usage.input_tokens": 12,
    "turnfsm.turn": 1,
    "turnfsm.flag": True,
    "turnfsm.tags": ["a", "b"],
}


def picked(attributes: dict[str, Any], expected: dict[str, Any]) -> dict[str, Any]:
    """The entries of `attributes` under the keys of `expected`."""
    return {key: attributes.get(key) for key in expected}


def exporter(phoenix: Phoenix, protocol: str) -> SpanExporter:
    if os.environ.get("TURNFSM_REQUIRE_PHOENIX") == "1":
        module = importlib.import_module(EXPORTERS[protocol])
    else:
        module = pytest.importorskip(EXPORTERS[protocol])
    if protocol == "http":
        return module.OTLPSpanExporter(endpoint=phoenix.otlp_http_endpoint, timeout=10)  # type: ignore[no-any-return]
    return module.OTLPSpanExporter(  # type: ignore[no-any-return]
        endpoint=phoenix.otlp_grpc_endpoint, insecure=True, timeout=10
    )


def export_tree(phoenix: Phoenix, protocol: str, project: str) -> tuple[str, str, str]:
    """Export a parent INTERNAL span with a CLIENT child; return the hex ids
    (trace, parent, child)."""
    provider = TracerProvider(
        resource=Resource.create(
            {"service.name": "turnfsm-smoke", PROJECT_ATTRIBUTE: project}
        )
    )
    provider.add_span_processor(BatchSpanProcessor(exporter(phoenix, protocol)))
    tracer = provider.get_tracer("tests.integration.phoenix")
    try:
        with tracer.start_as_current_span("invoke_agent smoke") as parent:
            parent.set_attributes(PARENT_ATTRIBUTES)
            with tracer.start_as_current_span(
                "chat tiny", kind=SpanKind.CLIENT, attributes=CHILD_ATTRIBUTES
            ) as child:
                child.add_event(
                    "turnfsm.compacted",
                    {"turnfsm.tokens_before": 1200, "turnfsm.reason": "threshold"},
                )
                child.set_status(Status(StatusCode.ERROR, "context_length_exceeded"))
            parent.set_status(Status(StatusCode.OK))
        assert provider.force_flush(10_000)
    finally:
        provider.shutdown()
    return (
        format(parent.get_span_context().trace_id, "032x"),
        format(parent.get_span_context().span_id, "016x"),
        format(child.get_span_context().span_id, "016x"),
    )


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_exported_span_tree_comes_back_from_phoenix(
    phoenix: Phoenix, protocol: str
) -> None:
    project = unique_project(f"smoke-{protocol}")
    trace_id, parent_id, child_id = export_tree(phoenix, protocol, project)

    found = spans(phoenix, project, min_count=2)
    assert [span["name"] for span in found] == ["invoke_agent smoke", "chat tiny"]
    parent, child = by_name(found).values()
    assert {parent["trace_id"], child["trace_id"]} == {trace_id}
    assert (parent["span_id"], parent["parent_id"]) == (parent_id, None)
    assert (child["span_id"], child["parent_id"]) == (child_id, parent_id)
    # Phoenix adds the attributes it derives from gen_ai.* (llm.model_name...).
    assert picked(parent["attributes"], PARENT_ATTRIBUTES) == PARENT_ATTRIBUTES
    assert picked(child["attributes"], CHILD_ATTRIBUTES) == CHILD_ATTRIBUTES
    assert child["kind"] == "LLM"  # OpenInference's kind, from gen_ai.request.model
    [event] = child["events"]
    assert event["name"] == "turnfsm.compacted"
    assert event["attributes"] == {
        "turnfsm.tokens_before": 1200,
        "turnfsm.reason": "threshold",
    }
    assert parent["status"] == {"code": "OK", "message": ""}
    assert child["status"] == {"code": "ERROR", "message": "context_length_exceeded"}


def test_spans_filter_by_trace_and_project(phoenix: Phoenix) -> None:
    project = unique_project("smoke-filter")
    first, _, _ = export_tree(phoenix, "http", project)
    second, _, _ = export_tree(phoenix, "http", project)
    export_tree(phoenix, "http", unique_project("smoke-other"))

    assert len(spans(phoenix, project, min_count=4)) == 4
    only = spans(phoenix, project, trace_id=second, min_count=2)
    assert {span["trace_id"] for span in only} == {second} != {first}
    with pytest.raises(AssertionError, match="expected at least 1"):
        spans(phoenix, unique_project("smoke-empty"), timeout=0.2)


def listening_ports(table: Path) -> dict[int, set[str]]:
    """Map each listening TCP port in a /proc/net/tcp{,6} table to its addresses."""
    out: dict[int, set[str]] = {}
    for line in table.read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        if state == "0A":  # LISTEN
            address, port = local.split(":")
            out.setdefault(int(port, 16), set()).add(address)
    return out


def test_phoenix_is_reachable_on_loopback_only(phoenix: Phoenix) -> None:
    # Phoenix runs in a network namespace of its own whose only device is lo
    # (its gRPC server listens on [::] in there)...
    own = Path(f"/proc/{phoenix.pid}")
    assert (own / "ns/net").readlink() != Path("/proc/self/ns/net").readlink()
    table = (own / "net/dev").read_text().splitlines()[2:]
    assert [line.split(":")[0].strip() for line in table] == ["lo"]
    # ...and is reached through listeners on 127.0.0.1 of ours.
    ports = {
        int(url.rsplit(":", 1)[1].split("/")[0])
        for url in (phoenix.url, phoenix.otlp_grpc_endpoint)
    }
    tcp = listening_ports(Path("/proc/self/net/tcp"))
    tcp6 = listening_ports(Path("/proc/self/net/tcp6"))
    loopback = "0100007F"  # 127.0.0.1
    assert {port: tcp.get(port) for port in ports} == {p: {loopback} for p in ports}
    assert not ports & tcp6.keys()
