"""The values crossing the core boundary: events, decisions, snapshots."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.helpers import calling, reply, result, user
from turnfsm.core import (
    EVENT_TYPES,
    Budget,
    CallLLM,
    Compact,
    CompactionCircuitOpened,
    CompactionNoop,
    CompactionOverflowed,
    CompactionResult,
    CompactorFailed,
    CompactReason,
    ContextOverflowed,
    ErrorInfo,
    Event,
    Failure,
    Measure,
    Measured,
    MessageInjected,
    ModelFailed,
    ModelReplied,
    OutputRejected,
    RunCancelled,
    RunStarted,
    Signal,
    Snapshot,
    ToolCallsReviewed,
    ToolsFinished,
    Usage,
    trigger_of,
)
from turnfsm.errors import (
    Cancelled,
    CompactionCircuitOpen,
    CompactionFailed,
    CompactionStalled,
    ConfigError,
    ContextExceeded,
    MaxTurnsExceeded,
    OutputInvalid,
    ProviderError,
    TurnFSMError,
)
from turnfsm.messages import MessageLog

H = user("earlier", id="h1")
P = reply("pending", id="p1")


@pytest.mark.parametrize(
    "decision",
    [
        Measure(history=MessageLog([H]), pending=MessageLog([P])),
        CallLLM(history=MessageLog([H]), pending=MessageLog([P]), turn=1),
        Compact(
            reason=CompactReason.MANUAL,
            history=MessageLog([H]),
            pending=MessageLog([P]),
        ),
    ],
    ids=["measure", "call_llm", "compact"],
)
def test_decision_messages_are_history_then_pending(
    decision: Measure | CallLLM | Compact,
) -> None:
    assert decision.messages == (H, P)


@pytest.mark.parametrize(
    "build",
    [
        lambda: Measured(estimate=-1),
        lambda: CompactionNoop(before=-1, after=0),
        lambda: CompactionResult(messages=[], before=0, after=-5),
        lambda: Usage(input_tokens=-1),
    ],
    ids=["measured", "noop-before", "result-after", "usage"],
)
def test_token_counts_cannot_be_negative(build: Callable[[], object]) -> None:
    with pytest.raises(ValueError, match=">= 0"):
        build()


def test_usage_adds_up() -> None:
    total = Usage(input_tokens=10, output_tokens=2) + Usage(
        input_tokens=5, output_tokens=1
    )

    assert total == Usage(input_tokens=15, output_tokens=3)


def test_error_info_describes_an_exception() -> None:
    info = ErrorInfo.from_exception(TimeoutError("read timed out"), retryable=True)

    assert info == ErrorInfo(
        type="TimeoutError", message="read timed out", retryable=True
    )


ERR = ErrorInfo(type="APIError", message="down")
ONE_OF_EACH: list[Event] = [
    RunStarted(input=[]),
    Measured(estimate=0),
    ModelReplied(message=reply()),
    OutputRejected(message=reply(), errors=["(the answer): expected integer"]),
    ModelFailed(error=ERR),
    ContextOverflowed(error=ERR),
    ToolsFinished(results=[]),
    ToolCallsReviewed(),
    CompactionResult(messages=[], before=1, after=0),
    CompactionNoop(before=1, after=0),
    CompactionOverflowed(used=0, limit=0),
    CompactorFailed(used=0, limit=0, error=ERR),
    CompactionCircuitOpened(failures=0),
    MessageInjected(message=user()),
    RunCancelled(),
    Signal(name="approved"),
]


def test_triggers_are_snake_case_class_names() -> None:
    assert [type(event) for event in ONE_OF_EACH] == list(EVENT_TYPES)
    assert [trigger_of(event) for event in ONE_OF_EACH] == [
        "run_started",
        "measured",
        "model_replied",
        "output_rejected",
        "model_failed",
        "context_overflowed",
        "tools_finished",
        "tool_calls_reviewed",
        "compaction_result",
        "compaction_noop",
        "compaction_overflowed",
        "compactor_failed",
        "compaction_circuit_opened",
        "message_injected",
        "run_cancelled",
        "approved",
    ]


@pytest.mark.parametrize(
    ("failure", "error"),
    [
        (
            Failure(kind="max_turns_exceeded", used=3, limit=3),
            MaxTurnsExceeded(max_turns=3),
        ),
        (
            Failure(kind="context_exceeded", used=9, limit=8),
            ContextExceeded(used=9, limit=8),
        ),
        (
            Failure(kind="compaction_stalled", used=8, limit=7),
            CompactionStalled(used=8, limit=7),
        ),
        (
            Failure(kind="compaction_failed", used=7, limit=8, detail="boom"),
            CompactionFailed(used=7, limit=8, cause="boom"),
        ),
        (
            Failure(kind="compaction_circuit_open", used=3),
            CompactionCircuitOpen(failures=3),
        ),
        (Failure(kind="cancelled", detail="bye"), Cancelled(reason="bye")),
        (
            Failure(kind="output_invalid", used=2, detail="a: bad\nb: worse"),
            OutputInvalid(errors=("a: bad", "b: worse"), retries=2),
        ),
        (
            Failure(
                kind="provider_error",
                detail="down",
                error_type="APIError",
                retryable=True,
            ),
            ProviderError(message="down", retryable=True, kind="APIError"),
        ),
    ],
    ids=lambda v: v.kind if isinstance(v, Failure) else "",
)
def test_failure_builds_its_typed_error(failure: Failure, error: TurnFSMError) -> None:
    actual = failure.to_error()

    assert (type(actual), actual.args) == (type(error), error.args)


def test_failure_rejects_an_unknown_kind() -> None:
    with pytest.raises(ValueError, match="kind"):
        Failure(kind="exploded")


def test_snapshot_with_every_field_round_trips() -> None:
    asks = calling("c1", id="a1")
    snapshot = Snapshot(
        phase="run_tools",
        history=[H],
        pending=[user(id="u1"), asks],
        inbox=[user("later", id="n1")],
        estimate=1_234,
        turns=2,
        overflow_retries=1,
        compact_reason=CompactReason.OVERFLOW,
        last_reply=asks,
        failure=Failure(kind="cancelled", detail="x"),
        is_started=True,
    )

    assert Snapshot.from_dict(snapshot.to_dict()) == snapshot
    assert snapshot.to_dict()["pending"][1]["parts"][0] == {
        "type": "tool_call",
        "id": "c1",
        "name": "lookup",
        "arguments": {},
    }


def test_snapshot_keeps_a_message_log_it_is_given() -> None:
    log = MessageLog([H, result("c9", id="r1")])

    assert Snapshot(phase="start", history=log).history is log


def test_a_snapshot_written_with_retriable_reads_as_retryable() -> None:
    """Snapshots written before the field was renamed still read."""
    failure = Failure(kind="provider_error", detail="slow down", retryable=True)
    snapshot = Snapshot(phase="failed", budget=Budget(), failure=failure)
    data = snapshot.to_dict()
    assert data["failure"]["retryable"] is True
    data["failure"]["retriable"] = data["failure"].pop("retryable")
    assert Snapshot.from_dict(data).failure == failure


def test_a_snapshot_refuses_a_log_holding_something_else_than_messages() -> None:
    # Each item of a log is checked once, by the first snapshot that holds
    # it: one appended later is checked by the next, wherever it sits.
    log = MessageLog([user("a"), reply("b")])
    assert Snapshot(phase="start", history=log).history is log
    grown = log.append("not a message")  # type: ignore[arg-type]
    with pytest.raises(ConfigError) as caught:
        Snapshot(phase="start", history=grown)
    assert caught.value.field == "history[2]"
    with pytest.raises(ConfigError) as caught:
        Snapshot(phase="start", pending=MessageLog([user("a"), 7]))  # type: ignore[list-item]
    assert caught.value.field == "pending[1]"
    assert Snapshot(phase="start", history=log).history is log  # still fine
