"""A manual pass: the operator's ``/compact``, whatever the lines say."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from turnfsm.context import (
    CompactionContext,
    CompactionProposal,
    CompactionRequest,
    ContextManager,
    PinRules,
)
from turnfsm.core import (
    CompactionCircuitOpened,
    CompactionNoop,
    CompactionResult,
    CompactorFailed,
    CompactReason,
    PassEvent,
)
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
    ) -> CompactionProposal:
        self.seen.append((tuple(messages), target, ctx))
        kept = messages[-self.k :]
        return CompactionProposal.compacted(
            kept, ctx.tokens_before, ctx.counter.count(kept)
        )


class Failing:
    def __init__(self) -> None:
        self.calls = 0

    async def compact(
        self, messages: Sequence[Message], target: int, ctx: CompactionContext
    ) -> CompactionProposal:
        self.calls += 1
        raise RuntimeError("summary model down")


def sized(n: int, chars: int = 400) -> list[Message]:
    return [Message.user(f"{i}:" + "x" * chars, id=f"m{i}") for i in range(n)]


async def manual(
    mgr: ContextManager, messages: Sequence[Message], **fields: object
) -> PassEvent:
    return await mgr.compact(
        CompactionRequest(messages=messages, reason=CompactReason.MANUAL, **fields)  # type: ignore[arg-type]
    )


def manager(compactor: object, **kwargs: object) -> ContextManager:
    return ContextManager(
        compactor,  # type: ignore[arg-type]
        context_window=200_000,
        counter=COUNTER,
        # KeepLast drops messages at will: no rule pins (see test_pins.py).
        pins=PinRules(system_prompt=False, first_user=False, latest_user=False),
        **kwargs,  # type: ignore[arg-type]
    )


async def test_the_old_force_compact_keeps_an_ephemeral_session_as_it_is() -> None:
    compactor = KeepLast()
    mgr = manager(compactor)
    messages = sized(6)
    with pytest.warns(DeprecationWarning, match="force_compact"):
        verdict = await mgr.force_compact(messages, turn=3, reserved=25, ephemeral=True)
    size = COUNTER.count(messages) + 25
    assert (verdict.tokens_before, verdict.tokens_after) == (size, size)  # type: ignore[union-attr]
    assert verdict.reason is CompactReason.MANUAL
    assert compactor.seen == []


async def test_an_ephemeral_session_wins_over_an_open_breaker() -> None:
    compactor = KeepLast()
    with pytest.warns(DeprecationWarning, match="force_compact"):
        verdict = await manager(compactor).force_compact(
            sized(6), turn=1, ephemeral=True, failures=3
        )
    assert type(verdict).__name__ == "NoAction"
    assert verdict.reason is CompactReason.MANUAL
    assert compactor.seen == []


async def test_it_compacts_far_below_the_lines() -> None:
    compactor = KeepLast(2)
    mgr = manager(compactor)
    messages = sized(6)
    size = COUNTER.count(messages) + 10
    assert mgr.reason_for(size) is None  # a pass with no reason would not act
    verdict = await manual(mgr, messages, turn=4, reserved=10)
    assert isinstance(verdict, CompactionResult)
    assert list(verdict.messages) == messages[-2:]
    assert verdict.before == size
    assert verdict.after == COUNTER.count(messages[-2:]) + 10
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
    await manual(
        manager(compactor),
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
    verdict = await manual(manager(compactor), sized(4), turn=1, failures=failures)
    assert verdict == CompactionCircuitOpened(failures=failures)
    assert compactor.seen == []  # MANUAL is proactive: no deterministic fallback


async def test_the_breaker_opens_at_the_managers_max_failures() -> None:
    compactor = KeepLast()
    mgr = manager(compactor, max_failures=1)
    verdict = await manual(mgr, sized(4), turn=1, failures=1)
    assert isinstance(verdict, CompactionCircuitOpened)
    closed = await manual(
        manager(compactor, max_failures=5), sized(4), turn=1, failures=4
    )
    assert isinstance(closed, CompactionResult)


async def test_a_failing_compactor_is_a_compactor_error() -> None:
    compactor = Failing()
    verdict = await manual(manager(compactor), sized(4), turn=1)
    assert isinstance(verdict, CompactorFailed)
    assert "summary model down" in verdict.error.message
    assert compactor.calls == 1


async def test_nothing_to_compact_is_a_no_action() -> None:
    compactor = KeepLast()
    verdict = await manual(manager(compactor), [], turn=1, reserved=7)
    assert verdict == CompactionNoop(before=7, after=7)
    assert compactor.seen == []


@pytest.mark.parametrize("reserved", [-1, 1.5, "10"])
def test_a_bad_reserved_budget_is_a_config_error(reserved: object) -> None:
    with pytest.raises(ConfigError, match="reserved"):
        CompactionRequest(messages=sized(2), reserved=reserved)  # type: ignore[arg-type]


@pytest.mark.parametrize("failures", [-1, 1.5, True])
def test_a_bad_failure_count_is_a_config_error(failures: object) -> None:
    with pytest.raises(ConfigError, match="failures"):
        CompactionRequest(messages=sized(2), failures=failures)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("messages", ["hi"]),
        ("reason", "threshold"),
        ("turn", -1),
        ("tokens_before", 3),  # under the reserved budget of 5
        ("session_id", 7),
        ("model_call", "not callable"),
        ("target_tokens", -1),
    ],
)
def test_every_bad_field_is_a_config_error_naming_it(field: str, value: object) -> None:
    with pytest.raises(ConfigError, match=field):
        CompactionRequest(**{"messages": sized(2), "reserved": 5, field: value})  # type: ignore[arg-type]


async def test_the_manager_takes_nothing_but_a_request() -> None:
    with pytest.raises(ConfigError, match="request"):
        await manager(KeepLast()).compact(sized(2))  # type: ignore[arg-type]
