"""The hook's metrics, as the SDK's in-memory reader sees them after four runs.

One hook serves every run: a run with a summary compaction and a tool, one
with an emergency compaction, one that fails on a provider error and one
whose pass is a no-op (no context manager). The sums are the runs' own.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.tracing._spans import (
    Named,
    Traced,
    echo,
    history,
    manager,
    said,
    traced_driver,
)
from turnfsm.context import ContextManager, PinRules, SummarizingCompactor
from turnfsm.driver import Driver
from turnfsm.errors import ProviderError
from turnfsm.testing import ExtractiveSummaryModel, ScriptedModel, tool_call
from turnfsm.tokens import HeuristicTokenCounter
from turnfsm.tracing import attributes as A

pytestmark = pytest.mark.anyio


def labels(**attributes: Any) -> frozenset[tuple[str, Any]]:
    """Metric attributes, written with the attribute module's names."""
    return frozenset((getattr(A, key), value) for key, value in attributes.items())


AGENT = {
    "OPERATION_NAME": "chat",
    "PROVIDER_NAME": "openai",
    "REQUEST_MODEL": "gpt-test",
}
ANSWERED = {**AGENT, "RESPONSE_MODEL": "gpt-test-0613"}
SUMMARIZER = {
    "OPERATION_NAME": "chat",
    "PROVIDER_NAME": "local",
    "REQUEST_MODEL": "summarizer",
    "RESPONSE_MODEL": "summarizer-0613",
}


async def _four_runs(traced: Traced) -> None:
    summaries = Named(
        ExtractiveSummaryModel(), model="summarizer", provider_name="local"
    )
    summarizing = ContextManager(
        SummarizingCompactor(model=summaries, keep_recent_turns=2),
        context_window=4_000,
        threshold=60,
        counter=HeuristicTokenCounter(),
        # The summary call is what is checked: the first user message goes
        # into it, so the rule that pins that message is off.
        pins=PinRules(first_user=False),
    )
    model = ScriptedModel.of(
        said("", tool_call("echo", "c1", text="x"), usage=(900, 5)),
        said("ok", usage=(950, 1)),
    )
    driver = traced_driver(traced, model, tools=[echo], context=summarizing)
    assert (await driver.run(history(10, 500))).ok
    model = ScriptedModel.of(said("ok", usage=(700, 2)))
    driver = traced_driver(traced, model, context=manager(4_000, threshold=60))
    assert (await driver.run(history(20, 500))).ok
    model = ScriptedModel.of(ProviderError("bad key", kind="auth", status=401))
    assert (await traced_driver(traced, model).run("hello")).outcome == "failed"
    driver = Driver(
        model=ScriptedModel.of(),
        context=None,
        context_window=100,
        hooks=[traced.hook],
        strict_hooks=True,
    )
    assert (await driver.run("x" * 1_000)).outcome == "failed"


async def test_metrics_count_tokens_compactions_savings_and_runs() -> None:
    traced = Traced.create()
    await _four_runs(traced)
    assert traced.metric(A.METRIC_TOKEN_USAGE) == {
        labels(**ANSWERED, TOKEN_TYPE="input"): 900 + 950 + 700,
        labels(**ANSWERED, TOKEN_TYPE="output"): 5 + 1 + 2,
        labels(**SUMMARIZER, TOKEN_TYPE="input"): 2_301,
        labels(**SUMMARIZER, TOKEN_TYPE="output"): 435,
    }
    assert traced.metric(A.METRIC_TOKEN_USAGE, field="count") == {
        labels(**ANSWERED, TOKEN_TYPE="input"): 3,
        labels(**ANSWERED, TOKEN_TYPE="output"): 3,
        labels(**SUMMARIZER, TOKEN_TYPE="input"): 1,
        labels(**SUMMARIZER, TOKEN_TYPE="output"): 1,
    }
    threshold = labels(
        COMPACTION_REASON="threshold_exceeded",
        COMPACTION_OUTCOME="compacted",
        COMPACTION_STRATEGY="SummarizingCompactor",
    )
    emergency = labels(
        COMPACTION_REASON="emergency",
        COMPACTION_OUTCOME="compacted",
        COMPACTION_STRATEGY="TruncatingCompactor",
    )
    noop = labels(
        COMPACTION_REASON="emergency", COMPACTION_OUTCOME="noop", COMPACTION_STRATEGY=""
    )
    assert traced.metric(A.METRIC_COMPACTIONS) == {threshold: 1, emergency: 1, noop: 1}
    assert traced.metric(A.METRIC_TOKENS_SAVED) == {
        threshold: 2_709 - 1_093,  # the summary and its recall note
        emergency: 5_305 - 663,
    }
    assert traced.metric(A.METRIC_RUNS) == {
        labels(RUN_OUTCOME="done"): 2,
        labels(RUN_OUTCOME="failed"): 2,
    }


async def test_durations_are_recorded_per_call_and_per_phase() -> None:
    traced = Traced.create()
    await _four_runs(traced)
    assert traced.metric(A.METRIC_OPERATION_DURATION, field="count") == {
        labels(**ANSWERED): 3,
        labels(**AGENT, ERROR_TYPE="auth"): 1,
        labels(**SUMMARIZER): 1,
        labels(OPERATION_NAME="execute_tool", TOOL_NAME="echo"): 1,
    }
    phases = traced.metric(A.METRIC_PHASE_DURATION, field="count")
    assert phases == {
        labels(PHASE="start"): 3 + 2 + 1 + 1,  # the measures
        labels(PHASE="call_llm"): 2 + 1 + 1,
        labels(PHASE="run_tools"): 1,
        labels(PHASE="compact"): 1 + 1 + 1,
    }
    assert all(s >= 0 for s in traced.metric(A.METRIC_PHASE_DURATION).values())
