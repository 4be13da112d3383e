"""`turnfsm demo --strategy`: the demo compacts with the chosen compactor."""

from __future__ import annotations

import io
import re

import pytest

from turnfsm.cli import main
from turnfsm.cli._demo import (
    STRATEGIES,
    SimulatedModel,
    build_demo_agent,
    demo_compactor,
)
from turnfsm.context import (
    LayeredCompactor,
    SummarizingCompactor,
    TruncatingCompactor,
)
from turnfsm.errors import ConfigError
from turnfsm.messages import Message
from turnfsm.providers import ModelRequest

Capture = pytest.CaptureFixture[str]

CLASSES = {
    "truncating": TruncatingCompactor,
    "summarizing": SummarizingCompactor,
    "layered": LayeredCompactor,
}

COMPACTION = re.compile(
    r"^\[compaction\] (EMERGENCY )?reason=(\w+) \((\w+)\): (\d+) -> (\d+) tokens",
    re.MULTILINE,
)
SUMMARY = re.compile(r"The conversation summary covers (\d+) earlier log\(s\)")


def _demo(capsys: Capture, strategy: str) -> str:
    assert main(["demo", "--store", "memory:", "--strategy", strategy]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    return captured.out


def _answer(out: str) -> str:
    (line,) = [x for x in out.splitlines() if x.startswith("final answer")]
    return line


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_each_strategy_compacts_with_its_class_and_finishes(
    capsys: Capture, strategy: str
) -> None:
    out = _demo(capsys, strategy)
    name = CLASSES[strategy].__name__
    passes = COMPACTION.findall(out)
    assert passes, out
    # Every pass is reported with the chosen compactor's class name.
    assert {strategy_name for _, _, strategy_name, _, _ in passes} == {name}
    reasons = [reason for _, reason, _, _, _ in passes]
    assert "threshold_exceeded" in reasons
    assert "emergency" in reasons
    assert f"[compaction] reason=threshold_exceeded ({name}): " in out
    assert f"[compaction] EMERGENCY reason=emergency ({name}): " in out
    # Each pass shrinks the request.
    for _, _, _, before, after in passes:
        assert int(after) < int(before)
    assert "call_llm --model_replied--> done" in out
    assert "final answer (6 model calls): Audit done." in out


@pytest.mark.parametrize("strategy", ["summarizing", "layered"])
def test_summarising_strategies_answer_from_the_conversation_summary(
    capsys: Capture, strategy: str
) -> None:
    answer = _answer(_demo(capsys, strategy))
    found = SUMMARY.search(answer)
    assert found is not None, answer
    assert int(found.group(1)) >= 1
    assert "Older logs were compacted away" not in answer


def test_truncating_still_says_older_logs_were_compacted_away(
    capsys: Capture,
) -> None:
    answer = _answer(_demo(capsys, "truncating"))
    assert "Older logs were compacted away" in answer
    assert SUMMARY.search(answer) is None


def test_the_default_strategy_is_truncating(capsys: Capture) -> None:
    assert main(["demo", "--store", "memory:"]) == 0
    out = capsys.readouterr().out
    assert "(TruncatingCompactor)" in out
    assert "Older logs were compacted away" in _answer(out)


def test_quiet_prints_only_the_summary_backed_answer(capsys: Capture) -> None:
    args = ["demo", "--quiet", "--store", "memory:", "--strategy", "summarizing"]
    assert main(args) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("final answer")
    assert SUMMARY.search(lines[0]) is not None


def test_an_unknown_strategy_is_an_argparse_error(capsys: Capture) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["demo", "--store", "memory:", "--strategy", "nope"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "--strategy" in err
    assert "invalid choice: 'nope'" in err


def test_the_cli_offers_exactly_the_demo_strategies(capsys: Capture) -> None:
    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    help_text = capsys.readouterr().out
    assert "{" + ",".join(STRATEGIES) + "}" in help_text


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_demo_compactor_builds_each_strategy(strategy: str) -> None:
    assert type(demo_compactor(strategy)) is CLASSES[strategy]


def test_demo_compactor_hands_over_the_summary_model() -> None:
    model = SimulatedModel()
    summarizing = demo_compactor("summarizing", summary_model=model)
    layered = demo_compactor("layered", summary_model=model)
    assert isinstance(summarizing, SummarizingCompactor)
    assert isinstance(layered, LayeredCompactor)
    assert summarizing.model is model
    assert layered.model is model
    borrowing = demo_compactor("summarizing")
    assert isinstance(borrowing, SummarizingCompactor)
    assert borrowing.model is None  # the agent's own model


def test_demo_compactor_rejects_an_unknown_strategy() -> None:
    with pytest.raises(ConfigError) as raised:
        demo_compactor("nope")
    assert raised.value.field == "strategy"
    assert raised.value.value == "nope"
    assert "strategy" in str(raised.value)
    for strategy in STRATEGIES:
        assert strategy in str(raised.value)


def test_build_demo_agent_rejects_an_unknown_strategy() -> None:
    with pytest.raises(ConfigError, match="strategy"):
        build_demo_agent(io.StringIO(), strategy="nope")


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_build_demo_agent_uses_the_strategy(strategy: str) -> None:
    agent = build_demo_agent(io.StringIO(), strategy=strategy)
    context = agent.driver.context
    assert context is not None
    assert type(context.compactor) is CLASSES[strategy]


@pytest.mark.anyio
async def test_the_simulated_model_summarises_each_log() -> None:
    """A summary request (temperature set, no tools) gets a per-log summary."""
    model = SimulatedModel()
    log = "\n".join(
        f"2026-11-30T02:00:0{i}Z {level} db.log worker=1 req=12345 latency_ms=5"
        for i, level in enumerate(["INFO", "ERROR", "ERROR", "WARN"])
    )
    prompt = (
        f"Summarise this.\n- app.log: 40 lines, 7 ERROR\n[TOOL RESULT call_2]: {log}\n"
    )
    request = ModelRequest(messages=[Message.user(prompt)], temperature=0.3)
    response = await model.complete(request)
    text = response.message.text
    assert "## Active Task" in text
    assert "- app.log: 40 lines, 7 ERROR" in text  # an earlier summary's fact
    assert "- db.log: 4 lines, 2 ERROR" in text
    assert model.calls == 0  # a summary is not a step of the plan
