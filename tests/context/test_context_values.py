from __future__ import annotations

import pytest

from turnfsm.context import CompactBase, CompactionContext, CompactionProposal

# The manager's old verdicts, kept one release (importing them from
# turnfsm.context warns).
from turnfsm.context._verdicts import CircuitOpen, CompactorError, ContextOverflow
from turnfsm.core._lines import CompactReason
from turnfsm.messages import Message
from turnfsm.tokens import HeuristicTokenCounter


def test_compact_base_values() -> None:
    assert [b.value for b in CompactBase] == ["threshold", "context"]


def test_outcome_constructors() -> None:
    messages = [Message.user("hi")]

    compacted = CompactionProposal.compacted(messages, 10, 4)
    unchanged = CompactionProposal.unchanged(messages, 10)
    failed = CompactionProposal.failed("model down", 10)

    assert compacted == CompactionProposal(
        messages=tuple(messages), tokens_before=10, tokens_after=4
    )
    assert (unchanged.tokens_before, unchanged.tokens_after) == (10, 10)
    assert not compacted.is_failed
    assert not unchanged.is_failed
    assert failed.is_failed
    assert (failed.messages, failed.error, failed.tokens_after) == (
        (),
        "model down",
        10,
    )


def test_context_defaults_and_tuples() -> None:
    ctx = CompactionContext(
        tokens_before=5,
        reason=CompactReason.MANUAL,
        context_window=100,
        turn=2,
        counter=HeuristicTokenCounter(),
        instructions=["keep numbers"],
    )

    assert ctx.instructions == ("keep numbers",)
    assert ctx.additional_context == ()


def overflow(used: int, window: int) -> ContextOverflow:
    return ContextOverflow(
        used=used,
        window=window,
        message_count=3,
        reason=CompactReason.EMERGENCY,
        strategy="TruncatingCompactor",
    )


def test_overflow_message() -> None:
    assert str(overflow(9_000, 8_000)) == (
        "context overflow: 9000 tokens used of 8000 window (3 messages, 1000 overflow)"
    )


@pytest.mark.parametrize(
    ("used", "window", "expected"),
    [(9_000, 8_000, 1.125), (4_000, 8_000, 0.5), (10, 0, 0.0)],
)
def test_overflow_utilization(used: int, window: int, expected: float) -> None:
    assert overflow(used, window).utilization == expected


def test_compactor_error_message() -> None:
    error = CompactorError(
        used=900,
        window=1_000,
        message_count=4,
        error="RuntimeError: summary model down",
        reason=CompactReason.THRESHOLD_EXCEEDED,
        strategy="SummarizingCompactor",
    )

    assert str(error) == (
        "compactor SummarizingCompactor failed: RuntimeError: summary model down"
    )


def test_circuit_open_message() -> None:
    verdict = CircuitOpen(
        failures=3, reason=CompactReason.EMERGENCY, strategy="LayeredCompactor"
    )

    assert str(verdict) == "compaction circuit open after 3 consecutive failures"
