"""`ContextManager.force_compact`: the operator's ``/compact`` (seed 004)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from turnfsm.context import (
    CircuitOpen,
    Compacted,
    CompactionContext,
    CompactionOutcome,
    CompactorError,
    ContextManager,
    NoAction,
)
from turnfsm.core._lines import CompactReason
from turnfsm.errors import ConfigError
from turnfsm.messages import Message
from turnfsm.providers import ModelRequest, ModelResponse
from turnfsm.tokens import HeuristicTokenCounter

pytestmark = pytest.mark.anyio

COUNTER = HeuristicTokenCounter()


class KeepLast:
    """Keeps the last `k` messages; records every call."""

    def __init__(self, k: int = 2) -> None:
        self.k = k
        self.seen: list[tuple[tuple[Message, ...], int, CompactionContext]] = []

    async def compact(
        self, messages: Sequence[Message], target: int, ctx: CompactionContext
    ) -> CompactionOutcome:
        self.seen.append((tuple(messages), target, ctx))
        kept = messages[-self.k :]
        return CompactionOutcome.compacted(
            kept, ctx.tokens_before, ctx.counter.count(kept)
        )


class Failing:
    def __init__(self) -> None:
        self.calls = 0

    async def compact(
        self, messages: Sequence[Message], target: int, ctx: CompactionContext
    ) -> CompactionOutcome:
        self.calls += 1
        raise RuntimeError("summary model down")


def sized(n: int, chars: int = 400) -> list[Message]:
    return [Message.user(f"{i}:" + "x" * chars, id=f"m{i}") for i in range(n)]


def manager(compactor: object, **kwargs: object) -> ContextManager:
    return ContextManager(
        compactor,  # type: ignore[arg-type]
        context_window=200_000,
        counter=COUNTER,
        **kwargs,  # type: ignore[arg-type]
    )


async def test_an_ephemeral_session_never_compacts() -> None:
    compactor = KeepLast()
    mgr = manager(compactor)
    messages = sized(6)
    verdict = await mgr.force_compact(messages, turn=3, reserved=25, ephemeral=True)
    size = COUNTER.count(messages) + 25
    assert verdict == NoAction(
        tokens_before=size,
        tokens_after=size,
        reason=CompactReason.MANUAL,
        strategy="KeepLast",
    )
    assert compactor.seen == []


async def test_an_ephemeral_session_wins_over_an_open_breaker() -> None:
    compactor = KeepLast()
    verdict = await manager(compactor).force_compact(
        sized(6), turn=1, ephemeral=True, failures=3
    )
    assert isinstance(verdict, NoAction)
    assert verdict.reason is CompactReason.MANUAL
    assert compactor.seen == []


async def test_it_compacts_far_below_the_lines() -> None:
    compactor = KeepLast(2)
    mgr = manager(compactor)
    messages = sized(6)
    size = COUNTER.count(messages) + 10
    assert mgr.reason_for(size) is None  # ensure_context_fits would not act
    verdict = await mgr.force_compact(messages, turn=4, reserved=10)
    assert isinstance(verdict, Compacted)
    assert verdict.reason is CompactReason.MANUAL
    assert verdict.strategy == "KeepLast"
    assert list(verdict.messages) == messages[-2:]
    assert verdict.tokens_before == size
    assert verdict.tokens_after == COUNTER.count(messages[-2:]) + 10
    assert verdict.tokens_saved == verdict.tokens_before - verdict.tokens_after
    ((seen, target, ctx),) = compactor.seen
    assert list(seen) == messages
    assert target == mgr.target_tokens - 10
    assert ctx.reason is CompactReason.MANUAL
    assert ctx.turn == 4
    assert ctx.tokens_before == size - 10  # the compactor sees the messages alone
    assert ctx.allow_model


async def test_it_hands_the_session_over_to_the_compactor() -> None:
    compactor = KeepLast()

    async def call(request: ModelRequest, model: object) -> ModelResponse:
        raise AssertionError("not called")

    summaries = {"msg_s": "## Active Task\nearlier"}
    await manager(compactor).force_compact(
        sized(4),
        turn=2,
        failures=1,
        session_id="ses_abc",
        summaries=summaries,
        model_call=call,
    )
    ((_, _, ctx),) = compactor.seen
    assert ctx.session_id == "ses_abc"
    assert dict(ctx.summaries) == summaries
    assert ctx.model_call is call
    assert ctx.allow_model  # 1 failure < max_failures 3


@pytest.mark.parametrize("failures", [3, 4])
async def test_an_open_breaker_is_a_circuit_open_without_a_call(failures: int) -> None:
    compactor = KeepLast()
    verdict = await manager(compactor).force_compact(
        sized(4), turn=1, failures=failures
    )
    assert verdict == CircuitOpen(
        failures=failures, reason=CompactReason.MANUAL, strategy="KeepLast"
    )
    assert compactor.seen == []  # MANUAL is proactive: no deterministic fallback


async def test_the_breaker_opens_at_the_managers_max_failures() -> None:
    compactor = KeepLast()
    mgr = manager(compactor, max_failures=1)
    verdict = await mgr.force_compact(sized(4), turn=1, failures=1)
    assert isinstance(verdict, CircuitOpen)
    closed = await manager(compactor, max_failures=5).force_compact(
        sized(4), turn=1, failures=4
    )
    assert isinstance(closed, Compacted)


async def test_a_failing_compactor_is_a_compactor_error() -> None:
    compactor = Failing()
    verdict = await manager(compactor).force_compact(sized(4), turn=1)
    assert isinstance(verdict, CompactorError)
    assert verdict.reason is CompactReason.MANUAL
    assert "summary model down" in verdict.error
    assert compactor.calls == 1


async def test_nothing_to_compact_is_a_no_action() -> None:
    compactor = KeepLast()
    verdict = await manager(compactor).force_compact([], turn=1, reserved=7)
    assert verdict == NoAction(
        tokens_before=7,
        tokens_after=7,
        reason=CompactReason.MANUAL,
        strategy="KeepLast",
    )
    assert compactor.seen == []


@pytest.mark.parametrize("ephemeral", [False, True])
@pytest.mark.parametrize("reserved", [-1, 1.5, "10"])
async def test_a_bad_reserved_budget_is_a_config_error(
    ephemeral: bool, reserved: object
) -> None:
    with pytest.raises(ConfigError, match="reserved"):
        await manager(KeepLast()).force_compact(
            sized(2),
            turn=1,
            reserved=reserved,  # type: ignore[arg-type]
            ephemeral=ephemeral,
        )


async def test_a_bad_failure_count_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="failures"):
        await manager(KeepLast()).force_compact(sized(2), turn=1, failures=-1)


async def test_a_bad_failure_count_is_a_config_error_when_ephemeral_too() -> None:
    with pytest.raises(ConfigError, match="failures"):
        await manager(KeepLast()).force_compact(
            sized(2), turn=1, failures=-1, ephemeral=True
        )
