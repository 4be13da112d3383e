"""A trace explains a run at a glance: numbered turns with the log's tokens,
the run's status, a failing tool's exception with its traceback (and the same
at DEBUG in the ``turnfsm.tools`` log), no `transitions` chatter at INFO, and
each agent's runs in a service / project named after it.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)
from opentelemetry.trace import StatusCode

from tests.tracing._spans import Traced, boom, echo, said, traced_driver
from turnfsm import Driver
from turnfsm.cli._demo import TASK, build_demo_agent
from turnfsm.core import Measured, ModelReplied
from turnfsm.driver import Session
from turnfsm.persistence import RunRecord
from turnfsm.providers import ModelResponse
from turnfsm.testing import ScriptedModel, reply, tool_call
from turnfsm.tracing import TracingHook, configure, is_configured
from turnfsm.tracing import attributes as A
from turnfsm.values import Usage

pytestmark = pytest.mark.anyio


def _turns(spans: tuple[ReadableSpan, ...]) -> list[ReadableSpan]:
    return [s for s in spans if s.name.startswith(f"{A.SPAN_TURN} ")]


def _logged(run: RunRecord) -> list[dict[str, int]]:
    """Each turn's figures as the run log has them: estimate sent, usage."""
    estimates: list[int] = []
    measured = 0
    for event in run.events:
        if isinstance(event, Measured):
            measured = event.estimate
        elif isinstance(event, ModelReplied):
            estimates.append(measured)  # the request this reply answers
    out = []
    for estimate, turn in zip(estimates, run.turns, strict=True):
        assert turn.usage is not None
        out.append(
            {
                A.ESTIMATE: estimate,
                A.TOTAL_INPUT_TOKENS: turn.usage.input_tokens,
                A.TOTAL_OUTPUT_TOKENS: turn.usage.output_tokens,
            }
        )
    return out


def _figures(span: ReadableSpan) -> dict[str, Any]:
    a = span.attributes or {}
    keys = (A.ESTIMATE, A.TOTAL_INPUT_TOKENS, A.TOTAL_OUTPUT_TOKENS)
    return {k: a[k] for k in keys}


# -- turns -------------------------------------------------------------------
async def test_each_turn_span_is_numbered_and_carries_the_logs_tokens() -> None:
    traced = Traced.create()
    model = ScriptedModel.of(
        said("", tool_call("echo", "c1", text="hi"), usage=(50, 7)),
        said("", tool_call("echo", "c2", text="again"), usage=(90, 4)),
        said("done", usage=(120, 2)),
    )
    session = Session()
    await traced_driver(traced, model, tools=[echo]).run("go", session=session)
    turns = _turns(traced.spans)
    assert [t.name for t in turns] == [
        "turnfsm.turn 1",
        "turnfsm.turn 2",
        "turnfsm.turn 3",
    ]
    assert [(t.attributes or {})[A.TURN_NUMBER] for t in turns] == [1, 2, 3]
    run = session.runs[-1]
    assert [_figures(t) for t in turns] == _logged(run)
    assert [_figures(t)[A.TOTAL_INPUT_TOKENS] for t in turns] == [50, 90, 120]


async def test_the_cache_s_counts_are_on_the_turn_call_and_run_spans() -> None:
    traced = Traced.create()
    cached = Usage(
        input_tokens=900, output_tokens=5, cache_read_tokens=700, cache_write_tokens=150
    )
    model = ScriptedModel.of(ModelResponse(message=reply("done"), usage=cached))
    session = Session()
    await traced_driver(traced, model, tools=[echo]).run("go", session=session)
    assert session.runs[-1].usage == cached
    chat = [s for s in traced.spans if s.name.startswith("chat")]
    (root,) = [s for s in traced.spans if s.parent is None]
    for span in chat:  # the call's own, as the conventions name them
        a = span.attributes or {}
        assert a[A.USAGE_CACHE_READ_TOKENS] == 700, span.name
        assert a[A.USAGE_CACHE_WRITE_TOKENS] == 150, span.name
    for span in (*_turns(traced.spans), root):  # the calls under it, summed
        a = span.attributes or {}
        assert a[A.TOTAL_CACHE_READ_TOKENS] == 700, span.name
        assert a[A.TOTAL_CACHE_WRITE_TOKENS] == 150, span.name
        assert A.USAGE_CACHE_READ_TOKENS not in a, span.name
    assert chat


def test_the_demo_trace_has_numbered_turns_with_the_logs_nonzero_tokens() -> None:
    traced = Traced.create()
    agent = build_demo_agent(io.StringIO())

    async def go() -> None:
        result = await agent.driver.run(
            TASK, session=agent.session, hooks=[traced.hook]
        )
        assert result.ok, result.error

    anyio.run(go)
    turns = _turns(traced.spans)
    assert [t.name for t in turns] == [f"turnfsm.turn {n}" for n in range(1, 7)]
    run = agent.session.runs[-1]
    logged = _logged(run)
    assert [_figures(t) for t in turns] == logged
    assert all(
        f[A.TOTAL_INPUT_TOKENS] > 0 and f[A.TOTAL_OUTPUT_TOKENS] > 0 for f in logged
    )
    (root,) = [s for s in traced.spans if s.parent is None]
    assert root.status.status_code is StatusCode.OK
    a = root.attributes or {}
    assert a[A.TOTAL_INPUT_TOKENS] == run.usage.input_tokens > 0
    assert a[A.TOTAL_OUTPUT_TOKENS] == run.usage.output_tokens > 0


# -- status ------------------------------------------------------------------
async def test_a_successful_run_is_ok_a_failed_one_an_error_with_its_exception() -> (
    None
):
    traced = Traced.create()
    ok = await traced_driver(traced, ScriptedModel.of(said("hi"))).run("hello")
    failing = ScriptedModel.of(said("", tool_call("echo", "c1", text="x")))
    failed = await traced_driver(traced, failing, tools=[echo], max_turns=1).run("go")
    assert ok.outcome == "done"
    assert failed.outcome == "failed"
    roots = {
        (s.attributes or {})[A.RUN_OUTCOME]: s for s in traced.spans if s.parent is None
    }
    assert roots["done"].status.status_code is StatusCode.OK
    bad = roots["failed"]
    assert bad.status.status_code is StatusCode.ERROR
    assert bad.status.description == str(failed.error)
    assert (bad.attributes or {})[A.ERROR_TYPE] == "MaxTurnsExceeded"
    [event] = [e for e in bad.events if e.name == "exception"]
    attributes = event.attributes or {}
    assert str(attributes["exception.type"]).endswith("MaxTurnsExceeded")
    assert attributes["exception.message"] == str(failed.error)


# -- a tool's exception ------------------------------------------------------
def divide(a: int, b: int) -> str:
    """Divide a by b.

    Args:
        a: the dividend.
        b: the divisor.
    """
    return str(a / b)


def _tool_span(traced: Traced) -> ReadableSpan:
    [span] = [s for s in traced.spans if s.name == "execute_tool divide"]
    return span


async def _divide_by_zero(traced: Traced) -> None:
    model = ScriptedModel.of(
        said("", tool_call("divide", "c1", a=1, b=0)), said("cannot divide")
    )
    result = await traced_driver(traced, model, tools=[divide]).run("1/0?")
    assert result.ok, result.error


@pytest.mark.parametrize("capture", [False, True])
async def test_a_tools_exception_is_on_its_span_with_its_traceback(
    capture: bool,
) -> None:
    traced = Traced.create(capture_content=capture)
    await _divide_by_zero(traced)
    span = _tool_span(traced)
    assert span.status.status_code is StatusCode.ERROR
    assert (span.attributes or {})[A.ERROR_TYPE] == "ZeroDivisionError"
    [event] = span.events
    assert event.name == "exception"
    a = event.attributes or {}
    assert a["exception.type"] == "ZeroDivisionError"
    stack = str(a["exception.stacktrace"])
    assert stack.startswith("Traceback (most recent call last):")
    assert "in divide\n    return str(a / b)" in stack  # the tool's own frame
    # Its message only with content captured (it may quote the arguments).
    said_ = "division by zero"
    assert (a["exception.message"] == said_) == capture
    assert stack.rstrip().endswith(
        f"ZeroDivisionError: {said_}" if capture else "ZeroDivisionError"
    )
    assert span.status.description == (
        "tool 'divide' failed: ZeroDivisionError: division by zero"
        if capture
        else "ZeroDivisionError"
    )


async def test_a_tools_exception_is_logged_at_debug_with_its_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="turnfsm")
    await _divide_by_zero(Traced.create())
    [record] = [r for r in caplog.records if r.name == "turnfsm.tools"]
    assert record.levelno == logging.DEBUG
    assert record.getMessage() == (
        "tool 'divide' failed: ZeroDivisionError: division by zero (call c1)"
    )
    assert record.exc_info is not None
    assert record.exc_info[0] is ZeroDivisionError
    assert "return str(a / b)" in caplog.text  # the traceback, printed


async def test_a_tool_that_returns_an_error_result_is_still_a_plain_tool_error() -> (
    None
):
    traced = Traced.create()
    model = ScriptedModel.of(said("", tool_call("nope", "c1")), said("ok"))
    await traced_driver(traced, model, tools=[boom]).run("go")
    [span] = [s for s in traced.spans if s.name == "execute_tool nope"]
    assert (span.attributes or {})[A.ERROR_TYPE] == "tool_error"
    assert span.events == ()


# -- the transitions library's logging ----------------------------------------
@pytest.fixture
def _transitions_levels() -> Iterator[None]:
    names = ("transitions", "transitions.core")
    kept = {n: logging.getLogger(n).level for n in names}
    for name in names:
        logging.getLogger(name).setLevel(logging.NOTSET)
    yield
    for name, level in kept.items():
        logging.getLogger(name).setLevel(level)


@pytest.mark.usefixtures("_transitions_levels")
@pytest.mark.parametrize(
    ("chosen", "level", "expected"),
    [
        (None, None, logging.WARNING),  # nothing chosen: kept out of INFO
        ("transitions.core", logging.DEBUG, logging.DEBUG),  # the user's wins
        ("transitions", logging.INFO, logging.NOTSET),  # inherits the user's
    ],
)
def test_transitions_steps_stay_out_of_info_unless_the_user_chose(
    chosen: str | None, level: int | None, expected: int
) -> None:
    if chosen is not None and level is not None:
        logging.getLogger(chosen).setLevel(level)
    Driver(model=ScriptedModel.of(said("hi")))
    assert logging.getLogger("transitions.core").level == expected


@pytest.mark.usefixtures("_transitions_levels")
def test_an_info_log_has_no_transitions_lines(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    driver = Driver(model=ScriptedModel.of(said("hi")))
    assert anyio.run(driver.run, "hello").ok
    assert [r for r in caplog.records if r.name.startswith("transitions")] == []
    # Set after, the user's level wins.
    logging.getLogger("transitions.core").setLevel(logging.INFO)
    driver = Driver(model=ScriptedModel.of(said("hi")))
    assert anyio.run(driver.run, "hello").ok
    assert [r for r in caplog.records if r.name == "transitions.core"] != []


# -- service and project -----------------------------------------------------
@pytest.fixture
def _no_otel_names(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in ("OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES"):
        monkeypatch.delenv(name, raising=False)
    yield
    assert not is_configured()


def _resources(
    env: dict[str, str], service_name: str | None, monkeypatch: pytest.MonkeyPatch
) -> dict[str, tuple[str, str]]:
    """Agent name -> (service.name, project) its run's spans carry."""
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    exporter = InMemorySpanExporter()
    tracing = configure(
        exporters=[exporter], service_name=service_name, set_global=False
    )
    try:
        for name in ("support", "billing"):
            driver = Driver(
                model=ScriptedModel.of(said("hi")), name=name, hooks=[tracing.hook]
            )
            assert anyio.run(driver.run, "hello").ok
        assert tracing.force_flush()
    finally:
        assert tracing.shutdown()
    out: dict[str, tuple[str, str]] = {}
    for span in exporter.get_finished_spans():
        agent = str((span.attributes or {}).get(A.AGENT_NAME, ""))
        r = span.resource.attributes
        got = (str(r[A.SERVICE_NAME]), str(r[A.PROJECT_NAME]))
        if agent:
            out[agent] = got
    return out


@pytest.mark.usefixtures("_no_otel_names")
@pytest.mark.parametrize(
    ("env", "service_name", "expected"),
    [
        # Unnamed: each agent's runs in a service and a project of its name.
        (
            {},
            None,
            {"support": ("support", "support"), "billing": ("billing", "billing")},
        ),
        # Named, by argument or environment: every run there, project too.
        ({}, "shop", {"support": ("shop", "shop"), "billing": ("shop", "shop")}),
        (
            {"OTEL_SERVICE_NAME": "shop"},
            None,
            {"support": ("shop", "shop"), "billing": ("shop", "shop")},
        ),
        # A project set in the environment wins over the agent's name.
        (
            {"OTEL_RESOURCE_ATTRIBUTES": "openinference.project.name=evals"},
            None,
            {"support": ("support", "evals"), "billing": ("billing", "evals")},
        ),
    ],
)
def test_runs_land_in_a_service_and_project_named_after_the_agent(
    env: dict[str, str],
    service_name: str | None,
    expected: dict[str, tuple[str, str]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert _resources(env, service_name, monkeypatch) == expected


@pytest.mark.usefixtures("_no_otel_names")
def test_every_span_of_a_run_shares_its_agents_resource() -> None:
    exporter = InMemorySpanExporter()
    tracing = configure(exporters=[exporter], set_global=False)
    try:
        model = ScriptedModel.of(
            said("", tool_call("echo", "c1", text="x")), said("done")
        )
        driver = Driver(model=model, tools=[echo], name="support", hooks=[tracing.hook])
        assert anyio.run(driver.run, "hello").ok
        assert tracing.force_flush()
    finally:
        assert tracing.shutdown()
    spans = exporter.get_finished_spans()
    assert len(spans) == 6  # the run, two turns, two chats and a tool: all
    assert {s.resource.attributes[A.SERVICE_NAME] for s in spans} == {"support"}


def test_a_hook_of_its_own_keeps_its_providers_resource() -> None:
    """A `TracingHook` an application made keeps its provider's resource."""
    traced = Traced.create()
    driver = Driver(
        model=ScriptedModel.of(said("hi")), name="support", hooks=[traced.hook]
    )
    assert anyio.run(driver.run, "hello").ok
    assert isinstance(traced.hook, TracingHook)
    names = {s.resource.attributes.get(A.SERVICE_NAME) for s in traced.spans}
    assert names != {"support"}
