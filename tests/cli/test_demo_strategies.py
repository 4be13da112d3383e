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
from turnfsm.cli._demo_model import PLAN, read_log
from turnfsm.context import (
    LayeredCompactor,
    SummarizingCompactor,
    TruncatingCompactor,
)
from turnfsm.driver import Tool
from turnfsm.errors import ConfigError
from turnfsm.messages import Message, ToolCallPart
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
    assert "final answer (6 model calls): Audit done: " in out


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
    log += "\n-- end of db.log: 4 lines --"
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


@pytest.mark.anyio
async def test_a_summary_leaves_out_a_log_cut_short() -> None:
    """A log without its end line, or shorter than it says, is not counted."""
    model = SimulatedModel()
    whole = read_log("app.log")
    lines = whole.splitlines()
    cut = "\n".join(lines[:10])  # a capped result: no end line
    short = "\n".join([*lines[:10], lines[-1]])  # an end line that overstates
    prompt = (
        f"[TOOL RESULT call_1]: {cut}\n[TOOL RESULT call_2]: {short}\n"
        "[TOOL RESULT call_3]: [read_log] (name=db.log) returned 3900 chars\n"
    )
    request = ModelRequest(messages=[Message.user(prompt)], temperature=0.3)
    text = (await model.complete(request)).message.text
    assert "app.log:" not in text
    assert "db.log:" not in text
    assert "## Critical Context\nNone" in text


ANSWER = re.compile(r"Audit done: (\d+) ERROR lines in (\d+) log\(s\) \(([^)]*)\)\.")
AWAY = re.compile(r"Older logs were compacted away \(([^)]*)\)")


def _errors_in_the_logs() -> dict[str, int]:
    """Each log's ERROR lines, counted from the log the demo's tool returns."""
    return {
        name: sum(
            line.split()[1:2] == ["ERROR"]
            for line in read_log(name).splitlines()
            if not line.startswith("--")
        )
        for name, _ in PLAN
    }


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_each_strategys_answer_counts_the_logs_right(
    capsys: Capture, strategy: str
) -> None:
    """Every count the answer gives is the logs' own; no log goes unmentioned.

    Truncating drops the old logs with no summary: its answer counts the log
    still in context and names the others as compacted away. The summarising
    strategies know every log, through their summaries.
    """
    truth = _errors_in_the_logs()
    answer = _answer(_demo(capsys, strategy))
    found = ANSWER.search(answer)
    assert found is not None, answer
    claimed = {
        name: int(count)
        for name, count in (item.rsplit(" ", 1) for item in found[3].split(", "))
    }
    assert claimed == {name: truth[name] for name in claimed}, answer
    assert int(found[1]) == sum(claimed.values())
    assert int(found[2]) == len(claimed)
    away = AWAY.search(answer)
    named_away = set(away[1].split(", ")) if away else set()
    assert named_away == set(truth) - set(claimed), answer
    if strategy == "truncating":
        assert claimed == {"kernel.log": truth["kernel.log"]}
    else:
        assert claimed == truth
        assert int(found[1]) == sum(truth.values())


def _transcript(contents: dict[str, str]) -> list[Message]:
    """The plan's five reads, call_1..call_5, with these results by log."""
    messages = [Message.user("Audit the logs.")]
    for step, (name, _) in enumerate(PLAN, start=1):
        call = ToolCallPart(
            id=f"call_{step}", name="read_log", arguments={"name": name}
        )
        messages.append(Message.assistant(f"Reading {name}.", tool_calls=[call]))
        messages.append(Message.tool_result(f"call_{step}", contents[name]))
    return messages


@pytest.mark.anyio
async def test_a_log_left_only_as_a_digest_is_read_again_once() -> None:
    """The answer never counts a one-line digest as a log."""
    model = SimulatedModel()
    contents = {name: read_log(name) for name, _ in PLAN}
    contents["metrics.log"] = "[read_log] (name=metrics.log) returned 3900 chars"
    messages = _transcript(contents)
    tools = (Tool.from_function(read_log).schema,)
    reply = (await model.complete(ModelRequest(messages=messages, tools=tools))).message
    (call,) = reply.tool_calls
    assert (call.id, call.arguments) == ("call_6", {"name": "metrics.log"})

    # The second copy is whole: every log is counted.
    messages += [reply, Message.tool_result("call_6", read_log("metrics.log"))]
    request = ModelRequest(messages=messages, tools=tools)
    text = (await model.complete(request)).message.text
    truth = _errors_in_the_logs()
    assert f"Audit done: {sum(truth.values())} ERROR lines in 5 log(s)" in text

    # The second copy is cut short too: named so, not read a third time.
    messages[-1] = Message.tool_result("call_6", "[read_log] (name=metrics.log) ...")
    reply = (await model.complete(ModelRequest(messages=messages, tools=tools))).message
    assert reply.tool_calls == ()
    assert "Only cut-short copies of metrics.log are left" in reply.text
    assert (
        f"{sum(truth.values()) - truth['metrics.log']} ERROR lines in 4" in reply.text
    )
