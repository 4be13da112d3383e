"""Traces that explain a run, read back from a real receiver (Arize Phoenix).

`turnfsm demo`, exporting with nothing but an endpoint set, lands in the
Phoenix project named after its agent (``turnfsm``); its trace has numbered
turns whose tokens are the run log's (non-zero), and a run status OK. A run
whose tool raises lands in its own agent's project, and the tool's span
holds the exception with its traceback.

Skipped when Phoenix is missing, unless TURNFSM_REQUIRE_PHOENIX=1 (CI).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.integration.phoenix import Phoenix, spans, unique_project
from turnfsm import Driver
from turnfsm.core import Measured, ModelReplied
from turnfsm.persistence import RunRecord, Session
from turnfsm.persistence.sqlite import SQLiteStore
from turnfsm.providers import ModelResponse
from turnfsm.testing import ScriptedModel, reply, tool_call
from turnfsm.tracing import configure
from turnfsm.values import Usage

pytestmark = pytest.mark.timeout(300)  # the first test waits for Phoenix to start

TURN = re.compile(r"^turnfsm\.turn (\d+)$")


def _logged(run: RunRecord) -> list[dict[str, int]]:
    """Each turn's figures as the run log has them: estimate sent, usage."""
    estimates: list[int] = []
    measured = 0
    for event in run.events:
        if isinstance(event, Measured):
            measured = event.estimate
        elif isinstance(event, ModelReplied):
            estimates.append(measured)
    out = []
    for estimate, turn in zip(estimates, run.turns, strict=True):
        assert turn.usage is not None
        out.append(
            {
                "turnfsm.estimate": estimate,
                "turnfsm.usage.input_tokens": turn.usage.input_tokens,
                "turnfsm.usage.output_tokens": turn.usage.output_tokens,
            }
        )
    return out


def _run_of(found: list[dict[str, Any]], run_id: str) -> list[dict[str, Any]]:
    """The spans of the trace whose run span is `run_id`'s."""
    roots = [s for s in found if s["attributes"].get("turnfsm.run.id") == run_id]
    assert len(roots) == 1, [s["name"] for s in found if not s["parent_id"]]
    return [s for s in found if s["trace_id"] == roots[0]["trace_id"]]


def test_the_demo_trace_has_numbered_turns_with_the_logs_tokens_and_is_ok(
    phoenix: Phoenix, tmp_path: Path
) -> None:
    db = tmp_path / "sessions.db"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(OTEL_EXPORTER_OTLP_ENDPOINT=phoenix.url)  # nothing else named
    done = subprocess.run(
        [sys.executable, "-m", "turnfsm", "demo", "--store", str(db)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    session_id = re.search(r"session (ses_\w+) stored", done.stdout)
    assert session_id is not None, done.stdout

    async def read() -> RunRecord:
        async with SQLiteStore(db) as store:
            session = await Session.load(store, session_id[1])
        return session.runs[-1]

    run = anyio.run(read)
    # The demo's agent is called "turnfsm": so is its Phoenix project.
    found = _run_of(spans(phoenix, "turnfsm", min_count=20, timeout=20), run.run_id)
    (root,) = [s for s in found if not s["parent_id"]]
    assert root["status"]["code"] == "OK"
    assert root["attributes"]["turnfsm.usage.input_tokens"] == run.usage.input_tokens
    assert root["attributes"]["turnfsm.usage.output_tokens"] == run.usage.output_tokens
    turns = sorted(
        (s for s in found if TURN.match(s["name"])),
        key=lambda s: int(TURN.match(s["name"])[1]),  # type: ignore[index]
    )
    assert [s["name"] for s in turns] == [f"turnfsm.turn {n}" for n in range(1, 7)]
    assert [s["attributes"]["turnfsm.turn.number"] for s in turns] == list(range(1, 7))
    logged = _logged(run)
    assert [{k: s["attributes"][k] for k in logged[0]} for s in turns] == logged
    for figures in logged:
        assert all(value > 0 for value in figures.values()), figures


def divide(a: int, b: int) -> str:
    """Divide a by b.

    Args:
        a: the dividend.
        b: the divisor.
    """
    return str(a / b)


def test_a_failing_tools_span_holds_its_exception_with_its_traceback(
    phoenix: Phoenix,
) -> None:
    agent = unique_project("divider")  # the agent's name: its project's too
    usage = Usage(input_tokens=30, output_tokens=5)
    model = ScriptedModel.of(
        ModelResponse(
            message=reply("", tool_call("divide", "c1", a=1, b=0)), usage=usage
        ),
        ModelResponse(message=reply("cannot divide by zero"), usage=usage),
    )
    tracing = configure(endpoint=phoenix.url, set_global=False)
    try:
        driver = Driver(model=model, tools=[divide], name=agent, hooks=[tracing.hook])
        result = anyio.run(driver.run, "what is 1/0?")
        assert result.ok, result.error
        assert tracing.force_flush(timeout=10)
    finally:
        assert tracing.shutdown(timeout=10)
    found = spans(phoenix, agent, min_count=6, timeout=20)
    (tool,) = [s for s in found if s["name"] == "execute_tool divide"]
    assert tool["status"]["code"] == "ERROR"
    assert tool["attributes"]["error.type"] == "ZeroDivisionError"
    (event,) = [e for e in tool["events"] if e["name"] == "exception"]
    stack = event["attributes"]["exception.stacktrace"]
    assert stack.startswith("Traceback (most recent call last):")
    assert "in divide\n    return str(a / b)" in stack
    assert event["attributes"]["exception.type"] == "ZeroDivisionError"
    (root,) = [s for s in found if not s["parent_id"]]
    assert root["status"]["code"] == "OK"  # the run itself succeeded
