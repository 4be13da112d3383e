"""Runs traced through OpenTelemetry's global provider, each test in a subprocess.

OpenTelemetry lets a process set its global tracer provider once, so these
run their scenarios in a fresh interpreter (``sys.executable -c``), keeping
the suite's own process clean. Each script prints what was exported as
JSON: per labelled run, the names of its trace's spans.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from typing import Any

from tests.helpers import REPO_ROOT

PRELUDE = """
import json
import anyio
import turnfsm
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from turnfsm.driver import Driver
from turnfsm.testing import ScriptedModel

exporter = InMemorySpanExporter()
runs = {}

def run(label, **options):
    driver = Driver(model=ScriptedModel.of("hi"), **options)
    runs[label] = anyio.run(driver.run, "hello").run_id

def report():
    spans = exporter.get_finished_spans()
    traces = {
        s.attributes["turnfsm.run.id"]: s.context.trace_id
        for s in spans if s.parent is None
    }
    roots = [s.attributes["turnfsm.run.id"] for s in spans if s.parent is None]
    print(json.dumps({
        "module": turnfsm.__file__,
        "roots": {label: roots.count(run_id) for label, run_id in runs.items()},
        "spans": {
            label: sorted(
                s.name for s in spans
                if run_id in traces and s.context.trace_id == traces[run_id]
            )
            for label, run_id in runs.items()
        },
    }))
"""

TRACED = ["chat", "invoke_agent turnfsm", "turnfsm.turn 1"]


def _run(script: str) -> dict[str, Any]:
    """Run `script` after the prelude in a fresh interpreter; its JSON report."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(script)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    assert report["module"] == str(REPO_ROOT / "turnfsm" / "__init__.py")
    return report


def test_runs_are_traced_once_an_sdk_provider_is_set_globally() -> None:
    report = _run(
        """
        run("before")                  # no provider yet: nothing to trace to
        run("forced early", tracing=True)  # a hook on the global proxy
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
        run("auto")                    # tracing=None: the SDK provider is seen
        run("forced", tracing=True)    # the proxy's hook now reaches the SDK
        run("off", tracing=False)
        from turnfsm.tracing import TracingHook
        run("own", hooks=[TracingHook(tracer_provider=provider)])  # replaces it
        report()
        """
    )
    assert report["spans"] == {
        "before": [],
        "forced early": [],
        "auto": TRACED,
        "forced": TRACED,
        "off": [],
        "own": TRACED,
    }
    # One root per traced run: a hook of one's own is not doubled by the driver.
    assert report["roots"] == {
        "before": 0,
        "forced early": 0,
        "auto": 1,
        "forced": 1,
        "off": 0,
        "own": 1,
    }


def test_configure_traces_every_run_through_its_exporters() -> None:
    report = _run(
        """
        import turnfsm.tracing
        tracing = turnfsm.tracing.configure(exporters=[exporter])
        assert turnfsm.tracing.is_configured()
        assert trace.get_tracer_provider() is tracing.tracer_provider
        run("configured")
        run("off", tracing=False)
        assert tracing.force_flush(timeout=5.0)  # a batch processor: flush it
        report()
        assert tracing.shutdown(timeout=5.0)
        """
    )
    assert report["spans"] == {"configured": TRACED, "off": []}
    assert report["roots"] == {"configured": 1, "off": 0}
