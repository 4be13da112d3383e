"""A turnfsm run in a real trace receiver: `turnfsm demo` exports to Arize
Phoenix over OTLP/HTTP and over OTLP/gRPC (from the standard OTEL_* variables
alone), and the span tree read back through Phoenix's REST API is the one the
SDK's in-memory exporter sees for the same (deterministic) demo run.

Skipped when Phoenix is missing, unless TURNFSM_REQUIRE_PHOENIX=1 (CI).
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)

from tests.integration.phoenix import PROJECT_ATTRIBUTE, Phoenix, spans, unique_project
from turnfsm.cli._demo import TASK, build_demo_agent
from turnfsm.tracing import TracingHook

pytestmark = pytest.mark.timeout(300)  # the first test waits for Phoenix to start

Edge = tuple[str, str]  # (parent's name, child's name)


def _demo(phoenix: Phoenix, protocol: str, project: str, tmp_path: Path) -> str:
    """Run `turnfsm demo` exporting to Phoenix; return its stdout."""
    endpoint = (
        phoenix.url if protocol == "http/protobuf" else phoenix.otlp_grpc_endpoint
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(
        OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,
        OTEL_EXPORTER_OTLP_PROTOCOL=protocol,
        OTEL_RESOURCE_ATTRIBUTES=f"{PROJECT_ATTRIBUTE}={project}",
        OTEL_SERVICE_NAME="turnfsm-demo",
        TURNFSM_STORE="memory:",
    )
    done = subprocess.run(
        [sys.executable, "-m", "turnfsm", "demo"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "traces exported to" in done.stderr, done.stderr
    return done.stdout


def _edges(named: dict[str, str], parents: dict[str, str]) -> Counter[Edge]:
    """Count each (parent name, child name) pair: the tree, ids aside."""
    return Counter(
        (named.get(parents[span_id], "") if parents[span_id] else "", name)
        for span_id, name in named.items()
    )


def _expected() -> tuple[Counter[Edge], list[ReadableSpan]]:
    """The demo run's span tree as the SDK's in-memory exporter sees it."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    agent = build_demo_agent(io.StringIO())

    async def go() -> None:
        result = await agent.driver.run(
            TASK,
            session=agent.session,
            hooks=[TracingHook(tracer_provider=provider)],
        )
        assert result.ok, result.error

    anyio.run(go)
    found = list(exporter.get_finished_spans())
    named = {format(s.context.span_id, "016x"): s.name for s in found}
    parents = {
        format(s.context.span_id, "016x"): (
            format(s.parent.span_id, "016x") if s.parent is not None else ""
        )
        for s in found
    }
    return _edges(named, parents), found


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_a_demo_run_reaches_phoenix_with_its_whole_span_tree(
    phoenix: Phoenix, protocol: str, tmp_path: Path
) -> None:
    project = unique_project("demo")
    _demo(phoenix, protocol, project, tmp_path)
    expected, local = _expected()
    got = spans(phoenix, project, min_count=len(local), timeout=20)

    named = {s["span_id"]: s["name"] for s in got}
    parents = {s["span_id"]: s["parent_id"] or "" for s in got}
    assert _edges(named, parents) == expected
    assert len({s["trace_id"] for s in got}) == 1

    by_id = {s["span_id"]: s for s in got}
    (root,) = [s for s in got if not s["parent_id"]]
    attributes: dict[str, Any] = root["attributes"]
    assert root["name"] == "invoke_agent turnfsm"
    assert attributes["gen_ai.operation.name"] == "invoke_agent"
    assert attributes["gen_ai.provider.name"] == "turnfsm.demo"
    assert attributes["turnfsm.machine.name"] == "turn"
    assert attributes["turnfsm.run.outcome"] == "done"
    session = attributes["gen_ai.conversation.id"]
    for span in got:
        if span["name"].startswith("chat "):
            assert span["attributes"]["gen_ai.request.model"] == "simulated"
            assert span["attributes"]["gen_ai.conversation.id"] == session
        if span["name"].startswith("execute_tool "):
            assert span["attributes"]["gen_ai.tool.name"] == span["name"].split()[1]
            assert by_id[span["parent_id"]]["name"].startswith("turnfsm.turn ")
    compactions = [s for s in got if s["name"] == "turnfsm.compaction"]
    assert compactions
    for span in compactions:
        a = span["attributes"]
        assert a["turnfsm.compaction.outcome"] == "compacted"
        saved = a["turnfsm.compaction.tokens_saved"]
        assert (
            saved
            == a["turnfsm.compaction.tokens_before"]
            - a["turnfsm.compaction.tokens_after"]
        )
        assert saved > 0
    # The first call after a compaction says so.
    compacted = [s for s in got if s["attributes"].get("gen_ai.conversation.compacted")]
    assert len(compacted) == len(compactions)
    # Every transition is an event, in order, on the run's spans.
    transitions = [
        e
        for s in sorted(got, key=lambda s: s["start_time"])
        for e in s["events"]
        if e["name"] == "turnfsm.transition"
    ]
    local_events = [
        e for s in local for e in s.events if e.name == "turnfsm.transition"
    ]
    assert len(transitions) == len(local_events)
    triggers = {e["attributes"]["turnfsm.transition.trigger"] for e in transitions}
    assert {"run_started", "measured", "model_replied", "tools_finished"} <= triggers
    assert "compaction_result" in triggers
