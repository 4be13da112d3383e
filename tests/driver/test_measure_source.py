"""A measurement says where its count came from: estimated, calibrated or reported.

The same word on the `Measured` event in the log, the turn span's
``turnfsm.estimate.source``, the console's ``[measure]`` lines; a pass's
sizes are turnfsm's estimates, and the console's ``[compaction]`` lines say
so.
"""

from __future__ import annotations

import io
import re

import pytest

from tests.tracing._spans import Traced
from turnfsm import ContextManager, Driver
from turnfsm.cli._demo import TASK, build_demo_agent
from turnfsm.core import Measured
from turnfsm.driver import Session
from turnfsm.errors import ConfigError
from turnfsm.hooks import ConsoleHook
from turnfsm.messages import Message
from turnfsm.persistence import EventRecorded, MemoryStore
from turnfsm.providers import ModelRequest, ModelResponse
from turnfsm.serde import from_json, to_json
from turnfsm.testing import FakeModelClient
from turnfsm.tokens import HeuristicTokenCounter
from turnfsm.tracing import attributes as A
from turnfsm.values import Usage

pytestmark = pytest.mark.anyio


def _reporting(request: ModelRequest) -> ModelResponse:
    """Answers "ok", reporting half the characters as input tokens."""
    chars = sum(len(m.text) for m in request.messages)
    return ModelResponse(
        message=Message.assistant("ok"),
        usage=Usage(input_tokens=max(1, chars // 2), output_tokens=1),
    )


def _manager(setting: str) -> ContextManager:
    options = {"calibrate": setting == "calibrate"}
    options["use_reported_usage"] = setting == "use_reported_usage"
    return ContextManager(
        context_window=100_000, counter=HeuristicTokenCounter(), **options
    )


# Per setting: the source of each of three runs' measurements (one call each,
# in one session): the first knows no report yet.
CASES = [
    ("default", ["estimated", "estimated", "estimated"]),
    ("calibrate", ["estimated", "calibrated", "calibrated"]),
    ("use_reported_usage", ["estimated", "reported", "reported"]),
]


@pytest.mark.parametrize(("setting", "sources"), CASES)
async def test_each_measurement_names_its_source_in_log_console_and_trace(
    setting: str, sources: list[str]
) -> None:
    out = io.StringIO()
    traced = Traced.create()
    driver = Driver(
        model=FakeModelClient(_reporting),
        context=_manager(setting),
        hooks=[ConsoleHook(out), traced.hook],
        strict_hooks=True,
    )
    session = Session("s1", store=MemoryStore())
    for text in ("Hello there, " * 20, "And again, " * 30, "Once more. " * 40):
        assert (await driver.run(text, session=session)).ok
    # The log: each run's last measurement before its call.
    logged = [
        [e.source for e in run.events if isinstance(e, Measured)][-1]
        for run in session.runs
    ]
    assert logged == sources
    # The console: "[measure] request = N tokens (SOURCE), threshold line ...".
    shown = re.findall(
        r"^\[measure\] request = \d+ tokens \((\w+)\), threshold line \d+, "
        r"emergency line \d+, window 100000$",
        out.getvalue(),
        re.M,
    )
    assert shown[-1] == sources[-1]
    assert set(shown) == set(sources)
    # The trace: each turn's estimate with its source.
    turns = [s for s in traced.spans if s.name.startswith(f"{A.SPAN_TURN} ")]
    assert [(t.attributes or {})[A.ESTIMATE_SOURCE] for t in turns] == sources


async def test_a_measurement_keeps_its_source_through_the_log() -> None:
    event = Measured(estimate=120, source="calibrated")
    assert from_json(Measured, to_json(event)) == event
    assert "source" not in to_json(Measured(estimate=120))  # the default: unwritten
    assert Measured(120).source == "estimated"  # logs written before load as such
    recorded = EventRecorded(
        run_id="r", index=0, event=event, phase="measure", decision="x", at=1.0
    )
    assert recorded.event == event
    with pytest.raises(ConfigError, match="source"):
        Measured(estimate=1, source="guessed")


async def test_the_demos_compaction_lines_say_the_sizes_are_estimated() -> None:
    out = io.StringIO()
    agent = build_demo_agent(out)
    assert (await agent.run(TASK)).ok
    lines = [line for line in out.getvalue().splitlines() if "[compaction]" in line]
    assert len(lines) == 2
    for line in lines:
        assert re.fullmatch(
            r"\[compaction\] (EMERGENCY )?reason=\w+ \(TruncatingCompactor\): "
            r"\d+ -> \d+ tokens \(estimated\), \d+ -> \d+ messages",
            line,
        ), line


async def test_a_summary_models_usage_is_marked_reported() -> None:
    out = io.StringIO()
    agent = build_demo_agent(out, strategy="summarizing")
    assert (await agent.run(TASK)).ok
    summarised = [
        line for line in out.getvalue().splitlines() if "summary model" in line
    ]
    assert summarised
    for line in summarised:
        assert re.search(
            r"tokens \(estimated\), \d+ -> \d+ messages, summary model \d+ in / "
            r"\d+ out \(reported\)$",
            line,
        ), line
