"""DESIGN §2.1: the threshold and emergency lines, through the real machine."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.helpers import (
    calling,
    machine_at,
    results_for,
    run_script,
    start_machine,
    user,
)
from turnfsm import default_machine
from turnfsm.core import (
    Budget,
    CallLLM,
    Compact,
    CompactReason,
    Decision,
    Fail,
    Measure,
    Measured,
    ModelReplied,
    RunStarted,
    RunTools,
    ToolsFinished,
    TurnMachine,
    emergency_line,
    line_reason,
    threshold_line,
)
from turnfsm.errors import ConfigError, MaxTurnsExceeded
from turnfsm.messages import Message, MessageLog

EMERGENCY = CompactReason.EMERGENCY
THRESHOLD = CompactReason.THRESHOLD_EXCEEDED
INPUT = user("summarise the logs", id="u1")

# (window, threshold, auto_compact, estimate, reason or None for "call the model")
WORKED_EXAMPLE = [
    (8_000, 80, True, 5_500, None),
    (8_000, 80, True, 6_400, None),
    (8_000, 80, True, 6_401, THRESHOLD),
    (8_000, 80, True, 7_599, THRESHOLD),
    (8_000, 80, True, 7_600, EMERGENCY),
    (8_000, 80, False, 6_500, None),
    (8_000, 80, False, 7_599, None),
    (8_000, 80, False, 7_700, EMERGENCY),
    (0, 80, True, 10**9, None),
    (0, 80, False, 10**9, None),
    (8_000, 0, True, 7_599, None),
    (8_000, 0, True, 7_600, EMERGENCY),
    (8_000, 100, True, 7_999, EMERGENCY),
]
WORKED_IDS = [
    "5500-calls",
    "6400-on-threshold-line-calls",
    "6401-threshold",
    "7599-threshold",
    "7600-on-emergency-line",
    "auto-off-6500-calls",
    "auto-off-7599-calls",
    "auto-off-7700-emergency",
    "window-0-disables-both",
    "window-0-auto-off",
    "threshold-0-7599-calls",
    "threshold-0-keeps-emergency",
    "threshold-100-emergency-still-first",
]


def expected_before_call(reason: CompactReason | None) -> Decision:
    pending = MessageLog([INPUT])
    if reason is None:
        return CallLLM(history=MessageLog(), pending=pending, turn=1)
    return Compact(reason=reason, history=MessageLog(), pending=pending)


def test_lines_of_the_worked_example() -> None:
    assert (threshold_line(8_000, 80), emergency_line(8_000)) == (6_400, 7_600)


@pytest.mark.parametrize(
    ("window", "threshold", "auto_compact", "estimate", "reason"),
    WORKED_EXAMPLE,
    ids=WORKED_IDS,
)
def test_machine_before_a_model_call(
    window: int,
    threshold: int,
    auto_compact: bool,
    estimate: int,
    reason: CompactReason | None,
) -> None:
    budget = Budget(
        context_window=window, threshold=threshold, auto_compact=auto_compact
    )
    machine = start_machine(budget=budget)
    machine.handle(RunStarted(input=[INPUT]))

    decision = machine.handle(Measured(estimate=estimate))

    assert decision == expected_before_call(reason)
    assert machine.snapshot.estimate == estimate


@pytest.mark.parametrize(
    ("window", "threshold", "auto_compact", "estimate", "reason"),
    WORKED_EXAMPLE,
    ids=WORKED_IDS,
)
def test_line_reason_agrees_with_the_machine(
    window: int,
    threshold: int,
    auto_compact: bool,
    estimate: int,
    reason: CompactReason | None,
) -> None:
    actual = line_reason(estimate, window, threshold, auto_compact=auto_compact)

    assert actual == reason


@given(
    window=st.integers(0, 300_000),
    threshold=st.integers(0, 100),
    auto_compact=st.booleans(),
    estimate=st.integers(0, 400_000),
)
def test_machine_and_line_reason_agree_everywhere(
    window: int, threshold: int, auto_compact: bool, estimate: int
) -> None:
    budget = Budget(
        context_window=window, threshold=threshold, auto_compact=auto_compact
    )
    machine = start_machine(budget=budget)
    machine.handle(RunStarted(input=[INPUT]))

    decision = machine.handle(Measured(estimate=estimate))

    reason = line_reason(estimate, window, threshold, auto_compact=auto_compact)
    assert decision == expected_before_call(reason)


def test_turn_limit_wins_over_the_emergency_line() -> None:
    budget = Budget(context_window=8_000, threshold=80, max_turns=3)
    machine = machine_at("start", budget=budget, turns=3)

    decision = machine.handle(Measured(estimate=7_700))

    assert (decision, machine.phase) == (
        Fail(error=MaxTurnsExceeded(max_turns=3)),
        "failed",
    )


def test_turn_limit_counts_model_calls_of_the_run() -> None:
    budget = Budget(context_window=8_000, threshold=80, max_turns=1)
    machine = start_machine(budget=budget)
    asks = calling("c1", id="a1")

    decisions = run_script(
        machine,
        [
            RunStarted(input=[INPUT]),
            Measured(estimate=100),
            ModelReplied(message=asks),
            ToolsFinished(results=results_for(asks)),
            Measured(estimate=7_700),
        ],
    )

    pending = MessageLog([INPUT])
    assert decisions == [
        Measure(history=MessageLog(), pending=pending),
        CallLLM(history=MessageLog(), pending=pending, turn=1),
        RunTools(calls=asks.tool_calls),
        Measure(
            history=MessageLog(), pending=MessageLog([INPUT, asks, *results_for(asks)])
        ),
        Fail(error=MaxTurnsExceeded(max_turns=1)),
    ]
    assert machine.snapshot.pending == MessageLog()


@pytest.mark.parametrize(
    ("estimate", "reason"),
    [
        (5_000, None),
        (5_001, CompactReason.THRESHOLD_EXCEEDED),
        (7_599, CompactReason.THRESHOLD_EXCEEDED),
        (7_600, CompactReason.EMERGENCY),
    ],
)
def test_an_absolute_threshold_line_replaces_the_percentage(
    estimate: int, reason: CompactReason | None
) -> None:
    """Window 8,000: an absolute line at 5,000 tokens, the emergency at 7,600."""
    assert line_reason(estimate, 8_000, 80, auto_compact=True, tokens=5_000) is reason
    assert threshold_line(8_000, 80, 5_000) == 5_000
    assert threshold_line(8_000, 80) == 6_400


def test_an_absolute_line_works_with_the_percentage_off() -> None:
    assert line_reason(4_001, 8_000, 0, auto_compact=True, tokens=4_000) is (
        CompactReason.THRESHOLD_EXCEEDED
    )
    assert line_reason(4_001, 8_000, 0, auto_compact=True) is None
    assert line_reason(4_001, 8_000, 80, auto_compact=False, tokens=4_000) is None


def test_the_brain_compacts_at_the_absolute_line() -> None:
    spec = default_machine()
    budget = Budget(context_window=8_000, threshold=80, threshold_tokens=5_000)
    over = TurnMachine.start(spec, budget=budget)
    over.handle(RunStarted(input=[Message.user("hi")]))
    assert isinstance(over.handle(Measured(estimate=5_001)), Compact)
    under = TurnMachine.start(spec, budget=budget)
    under.handle(RunStarted(input=[Message.user("hi")]))
    assert isinstance(under.handle(Measured(estimate=5_000)), CallLLM)


@pytest.mark.parametrize("tokens", [0, 8_001, 1.5, "5000"])
def test_an_absolute_line_outside_the_window_is_refused(tokens: object) -> None:
    with pytest.raises(ConfigError, match="threshold_tokens"):
        Budget(context_window=8_000, threshold_tokens=tokens)  # type: ignore[arg-type]
