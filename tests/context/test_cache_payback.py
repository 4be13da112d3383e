"""The prompt cache's economics: each pass's cost against its saving, and declines.

Sizes come from a counter that reads a message's text as its size ("2000"
is 2,000 tokens), so every figure below is worked out by hand.
"""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal

import anyio
import pytest

from turnfsm.context import (
    CACHE_RULES,
    CacheRules,
    CompactionContext,
    CompactionProposal,
    CompactionRequest,
    ContextManager,
    Invalidates,
    PinRules,
    cache_rules_for,
    first_change,
    pass_payback,
)
from turnfsm.core import CompactionNoop, CompactionResult, CompactReason, PassEvent
from turnfsm.errors import ConfigError
from turnfsm.messages import Message
from turnfsm.persistence import CompactionRecord
from turnfsm.providers import ModelPrices, known_prices
from turnfsm.serde import from_json, to_json
from turnfsm.values import PassPayback, Usage


class SizeCounter:
    """A message's text is its size in tokens (any other text: 1)."""

    def count(self, messages: Sequence[Message]) -> int:
        return sum(int(m.text) if m.text.isdigit() else 1 for m in messages)

    def count_text(self, text: str) -> int:
        return int(text) if text.isdigit() else 0


COUNTER = SizeCounter()


def msgs(*sizes: int, first: int = 0) -> list[Message]:
    return [Message.user(str(size), id=f"m{first + i}") for i, size in enumerate(sizes)]


# A conversation of 10,000 tokens; the pass keeps the first 4,000 and
# replaces the last 6,000 with a 1,000-token digest.
BEFORE = msgs(1000, 3000, 2000, 2000, 2000)
AFTER = [*BEFORE[:2], Message.user("1000", id="digest")]

# Round prices, per million tokens: input 10, cached 1, write 20, output 50.
PRICES = ModelPrices(
    model="round",
    input=Decimal(10),
    cached_input=Decimal(1),
    output=Decimal(50),
    cache_write=Decimal(20),
    provider="anthropic",
)


def priced(provider: str, *, cached_input: int) -> ModelPrices:
    """Prices with no catalogue write price: input 10, output 50."""
    return ModelPrices(
        model="m",
        input=Decimal(10),
        cached_input=Decimal(cached_input),
        output=Decimal(50),
        provider=provider,
    )


def dollars(tokens: int, price: float) -> float:
    return tokens * price / 1_000_000


@pytest.mark.parametrize(
    ("prices", "rules", "invalidated", "rewritten", "cost", "saving", "calls"),
    [
        # Anthropic: the write price the catalogue gives (20), reads at 1.
        # Cost: the 1,000 rewritten tokens at 20 - 1; saving: 6,000 cached
        # tokens no longer read, less 1,000 read again.
        (
            PRICES,
            CACHE_RULES["anthropic"],
            6000,
            1000,
            dollars(1000, 19),
            dollars(5000, 1),
            4,
        ),
        # Without a catalogue write price, Anthropic's rule: 1.25x input.
        (
            priced("anthropic", cached_input=1),
            None,
            6000,
            1000,
            dollars(1000, 11.5),
            dollars(5000, 1),
            3,
        ),
        # OpenAI: automatic caching, no write premium: a write costs the
        # input price.
        (
            priced("openai", cached_input=5),
            None,
            6000,
            1000,
            dollars(1000, 5),
            dollars(5000, 5),
            1,
        ),
        # OpenAI's rule without a cached price: reads at 0.5x input.
        (
            priced("openai", cached_input=10),
            None,
            6000,
            1000,
            dollars(1000, 5),
            dollars(5000, 5),
            1,
        ),
        # A provider with no rules: no cache, so rewriting costs nothing.
        (
            priced("elsewhere", cached_input=10),
            None,
            6000,
            1000,
            0.0,
            dollars(5000, 10),
            0,
        ),
        # Requests under the smallest cached prefix: nothing is cached.
        (
            PRICES,
            CacheRules(provider="anthropic", min_prefix_tokens=20_000),
            6000,
            1000,
            0.0,
            dollars(5000, 10),
            0,
        ),
        # A provider whose cache any change invalidates whole.
        (
            PRICES,
            CacheRules(provider="x", invalidates=Invalidates.ALL),
            10000,
            5000,
            dollars(5000, 19),
            dollars(5000, 1),
            19,
        ),
    ],
)
def test_the_cost_model_per_provider_rule(
    prices: ModelPrices,
    rules: CacheRules | None,
    invalidated: int,
    rewritten: int,
    cost: float,
    saving: float,
    calls: int,
) -> None:
    payback = pass_payback(
        BEFORE, AFTER, counter=COUNTER, reserved=0, prices=prices, rules=rules
    )

    assert payback.invalidated_tokens == invalidated
    assert payback.rewritten_tokens == rewritten
    assert payback.removed_tokens == 5000
    assert payback.cost == pytest.approx(cost)
    assert payback.saving == pytest.approx(saving)
    assert payback.payback_calls == calls


def test_the_first_change_is_where_the_shared_start_ends() -> None:
    assert first_change(BEFORE, AFTER) == 2
    assert first_change(BEFORE, BEFORE) == len(BEFORE)
    assert first_change(BEFORE[:3], BEFORE) == 3
    assert first_change([], BEFORE) == 0


def test_the_system_prompt_and_tools_stay_cached() -> None:
    # The reserved tokens sit before the messages: never invalidated, and
    # they count towards the smallest cached prefix.
    rules = CacheRules(provider="anthropic", min_prefix_tokens=12_000)
    alone = pass_payback(BEFORE, AFTER, counter=COUNTER, reserved=0, prices=PRICES)
    reserved = pass_payback(
        BEFORE, AFTER, counter=COUNTER, reserved=5000, prices=PRICES, rules=rules
    )
    assert reserved.invalidated_tokens == alone.invalidated_tokens == 6000
    # 15,000 tokens before, 10,000 after: only the request before is cached,
    # so the removed tokens were read at the cached price and the rewrite
    # is at the input price.
    assert reserved.saving == pytest.approx(dollars(6000, 1) - dollars(1000, 10))


def test_summary_calls_count_in_the_cost() -> None:
    used = Usage(input_tokens=8000, output_tokens=500)
    plain = pass_payback(BEFORE, AFTER, counter=COUNTER, reserved=0, prices=PRICES)
    summarised = pass_payback(
        BEFORE, AFTER, counter=COUNTER, reserved=0, prices=PRICES, summary=used
    )
    assert plain.cost is not None
    assert summarised.cost is not None
    extra = dollars(8000, 10) + dollars(500, 50)
    assert summarised.cost == pytest.approx(plain.cost + extra)
    assert summarised.payback_calls == 25  # (0.019 + 0.105) / 0.005 = 24.8


def test_a_pass_that_saves_nothing_never_pays_back() -> None:
    same_size = [*BEFORE[:2], Message.user("6000", id="big")]
    payback = pass_payback(
        BEFORE, same_size, counter=COUNTER, reserved=0, prices=PRICES
    )
    assert payback.saving == 0
    assert payback.payback_calls is None
    assert "never pays back" in payback.describe()


def test_without_prices_the_figures_are_tokens_only() -> None:
    payback = pass_payback(BEFORE, AFTER, counter=COUNTER, reserved=0, prices=None)
    assert payback == PassPayback(
        invalidated_tokens=6000, rewritten_tokens=1000, removed_tokens=5000
    )
    assert not payback.priced


def test_known_prices_carry_the_cache_write_price_and_provider() -> None:
    claude = known_prices("claude-sonnet-4-5")
    gpt = known_prices("gpt-4o")
    assert claude is not None
    assert gpt is not None
    assert (claude.provider, claude.cache_write) == ("anthropic", Decimal("3.75"))
    assert claude.rates(1000) == (Decimal(3), Decimal("0.3"), Decimal("3.75"))
    assert claude.rates(300_000)[2] == Decimal("7.5")  # the long-context tier
    assert (gpt.provider, gpt.cache_write) == ("openai", None)
    assert gpt.rates(1000) == (Decimal("2.5"), Decimal("1.25"), Decimal("2.5"))
    assert cache_rules_for(claude) is CACHE_RULES["anthropic"]
    assert cache_rules_for(gpt) is CACHE_RULES["openai"]
    # A call's uncached part written to the cache costs the write price.
    assert claude.cost(100_000, 0, 0, written_tokens=100_000) == Decimal("0.375")
    assert gpt.cost(100_000, 0, 0, written_tokens=100_000) == Decimal("0.25")


# -- the manager: cache_payback_calls ------------------------------------------


class Digest:
    """A compactor that keeps the first two messages and digests the rest."""

    async def compact(
        self, messages: Sequence[Message], target: int, ctx: CompactionContext
    ) -> CompactionProposal:
        kept = [*messages[:2], Message.user("1000", id="digest")]
        return CompactionProposal.compacted(kept, ctx.tokens_before, 1)


# Digest drops the latest user request on purpose (a plain keep-and-replace):
# the rules that would pin it are off, so the figures are the digest's.
NO_USER_PINS = PinRules(first_user=False, latest_user=False)


def manager(calls: int | None, **kwargs: object) -> ContextManager:
    return ContextManager(
        Digest(),
        pins=NO_USER_PINS,
        counter=COUNTER,
        context_window=100_000,
        prices=PRICES,
        cache_payback_calls=calls,
        **kwargs,  # type: ignore[arg-type]  # checked at run time
    )


def run(mgr: ContextManager, reason: CompactReason) -> PassEvent:
    async def go() -> PassEvent:
        return await mgr.compact(
            CompactionRequest(messages=BEFORE, turn=3, reason=reason)
        )

    return anyio.run(go)


def test_a_soft_line_pass_that_pays_back_in_time_is_kept() -> None:
    event = run(manager(4), CompactReason.THRESHOLD_EXCEEDED)
    assert isinstance(event, CompactionResult)
    assert event.payback is not None
    assert event.payback.payback_calls == 4
    assert not event.payback.declined


@pytest.mark.parametrize(
    "reason", [CompactReason.THRESHOLD_EXCEEDED, CompactReason.MESSAGE_COUNT]
)
def test_a_soft_line_pass_that_pays_back_too_late_is_declined(
    reason: CompactReason,
) -> None:
    event = run(manager(3), reason)
    # Nothing changes: the brain reads a pass that saved nothing.
    assert isinstance(event, CompactionNoop)
    assert event.before == event.after == 10_000
    assert event.payback is not None
    assert event.payback.declined
    assert event.payback.payback_calls == 4
    assert event.payback.note == (
        "declined: it would pay back after 4 calls, more than cache_payback_calls=3"
    )


@pytest.mark.parametrize(
    "reason",
    [CompactReason.EMERGENCY, CompactReason.OVERFLOW, CompactReason.MANUAL],
)
def test_the_emergency_line_an_overflow_and_a_manual_pass_always_compact(
    reason: CompactReason,
) -> None:
    event = run(manager(1), reason)
    assert isinstance(event, CompactionResult)
    assert event.payback is not None
    assert event.payback.payback_calls == 4


def test_without_the_setting_every_pass_carries_its_figures() -> None:
    event = run(manager(None), CompactReason.THRESHOLD_EXCEEDED)
    assert isinstance(event, CompactionResult)
    assert event.payback is not None
    assert event.payback.priced


@pytest.mark.parametrize("given", [None, 12_345])
def test_a_pass_carries_the_figures_pass_payback_works_out(given: int | None) -> None:
    # The manager reuses the sizes it measured: the figures are those of
    # `pass_payback` on the same two conversations, whatever size the caller
    # gave for the request (a calibrated one, say).
    mgr = manager(None)

    async def go() -> PassEvent:
        return await mgr.compact(
            CompactionRequest(
                messages=BEFORE,
                turn=3,
                reason=CompactReason.MANUAL,
                reserved=100,
                tokens_before=given,
            )
        )

    event = anyio.run(go)
    assert isinstance(event, CompactionResult)
    expected = pass_payback(
        BEFORE, event.messages, counter=COUNTER, reserved=100, prices=PRICES
    )
    assert event.payback == expected
    assert mgr.payback(BEFORE, event.messages, 100) == expected


@pytest.mark.parametrize(
    ("kwargs", "field", "value"),
    [
        ({"cache_payback_calls": 3}, "prices", None),
        ({"cache_payback_calls": 0, "prices": "gpt-4o"}, "cache_payback_calls", 0),
        (
            {"cache_payback_calls": 2.5, "prices": "gpt-4o"},
            "cache_payback_calls",
            2.5,
        ),
        ({"prices": "gpt-nope"}, "prices", "gpt-nope"),
        ({"prices": 3}, "prices", 3),
        ({"cache_rules": "anthropic"}, "cache_rules", "anthropic"),
    ],
)
def test_bad_settings_raise_config_error_naming_the_field(
    kwargs: dict[str, object], field: str, value: object
) -> None:
    with pytest.raises(ConfigError) as caught:
        ContextManager(**kwargs)  # type: ignore[arg-type]  # wrong on purpose
    assert caught.value.field == field
    assert caught.value.value == value
    assert field in str(caught.value)


@pytest.mark.parametrize(
    ("arguments", "field", "value"),
    [
        (("log text", BEFORE), "before", "log text"),
        ((BEFORE, None), "after", None),
        ((BEFORE, [BEFORE[0], "x"]), "after[1]", "x"),
        ((BEFORE, BEFORE, -5), "reserved", -5),
        ((BEFORE, BEFORE, "5"), "reserved", "5"),
        ((BEFORE, BEFORE, 0, 12), "summary", 12),
    ],
)
def test_bad_payback_arguments_raise_config_error_naming_them(
    arguments: tuple[object, ...], field: str, value: object
) -> None:
    mgr = ContextManager(prices="gpt-4o")
    with pytest.raises(ConfigError) as caught:
        mgr.payback(*arguments)  # type: ignore[arg-type]  # wrong on purpose
    assert (caught.value.field, caught.value.value) == (field, value)


def test_a_known_models_name_gives_its_prices() -> None:
    mgr = ContextManager(prices="claude-sonnet-4-5", cache_payback_calls=5)
    assert mgr.prices == known_prices("claude-sonnet-4-5")


# -- old logs ----------------------------------------------------------------


def test_records_and_events_without_figures_load_as_before() -> None:
    record = CompactionRecord(
        run_id="run_1",
        turn=2,
        reason=CompactReason.THRESHOLD_EXCEEDED,
        strategy="MaskingCompactor",
        verdict="compacted",
        covers=("m0", "m1"),
        replacement=("m1",),
        tokens_before=900,
        tokens_after=400,
        key="k1",
    )
    data = to_json(record)
    assert isinstance(data, dict)
    old = {k: v for k, v in data.items() if k != "payback"}  # as logs were
    assert from_json(CompactionRecord, old) == record
    assert record.payback is None
    noop = to_json(CompactionNoop(before=5, after=5))
    assert isinstance(noop, dict)
    old_noop = {k: v for k, v in noop.items() if k != "payback"}
    assert from_json(CompactionNoop, old_noop) == CompactionNoop(before=5, after=5)


def test_figures_round_trip_through_the_log() -> None:
    payback = PassPayback(
        invalidated_tokens=6000,
        rewritten_tokens=1000,
        removed_tokens=5000,
        cost=0.019,
        saving=0.005,
        payback_calls=4,
        declined=True,
        note="declined: it would pay back after 4 calls",
    )
    event = CompactionNoop(before=5, after=5, payback=payback)
    assert from_json(CompactionNoop, to_json(event)) == event


# -- in a run ------------------------------------------------------------------


def test_a_declined_pass_lets_the_run_call_the_model_and_never_loops() -> None:
    from turnfsm import Agent
    from turnfsm.testing import ScriptedModel

    # 4,200 tokens of history in a 5,000-token window: over the threshold
    # line (4,000 at 80 %), under the emergency line (4,750).
    history = msgs(1000, 2000, 1000, 200)
    context = ContextManager(
        Digest(),
        pins=NO_USER_PINS,
        counter=COUNTER,
        context_window=5_000,
        max_messages=0,
        prices=PRICES,
        cache_payback_calls=1,
    )
    agent = Agent(
        model=ScriptedModel.of("first", "second"),
        context=context,
        store="memory:",
        max_output_tokens=None,
    )
    result = agent.run_sync(history)
    assert result.text == "first"
    (run,) = agent.session.runs
    (record,) = run.compactions  # one pass, declined: the line is spent
    assert str(record.verdict) == "noop"
    assert record.payback is not None
    assert record.payback.declined
    assert record.tokens_after == record.tokens_before
    assert len(run.turns) == 1
