"""A model's prices are checked when they are made, not found out in a run."""

from __future__ import annotations

import math
from decimal import Decimal
from typing import Any

import pytest

from turnfsm.context import ContextManager
from turnfsm.errors import ConfigError
from turnfsm.providers import ModelPrices, known_prices
from turnfsm.values import Usage


def prices(**given: Any) -> ModelPrices:
    base: dict[str, Any] = {
        "model": "m",
        "input": Decimal(1),
        "cached_input": Decimal(0),
        "output": Decimal(2),
    }
    return ModelPrices(**(base | given))


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("input", "abc", "input"),
        ("input", math.nan, "input"),
        ("input", Decimal("NaN"), "input"),
        ("output", math.inf, "output"),
        ("input", Decimal(-1), "input"),
        ("cached_input", -0.5, "cached_input"),
        ("output", True, "output"),
        ("output", None, "output"),
        ("cache_write", "1", "cache_write"),
        ("cache_write", Decimal("-Infinity"), "cache_write"),
        ("tiers", ((10, "x"),), "tiers[0]"),
        ("tiers", ((10, 1, 1),), "tiers[0]"),
        ("tiers", ((10, 1, "x", 1),), "tiers[0]"),
        ("tiers", ((10, 1, 1, math.nan),), "tiers[0]"),
        ("tiers", (("10", 1, 1, 1),), "tiers[0] start"),
        ("tiers", ((-1, 1, 1, 1),), "tiers[0] start"),
        ("tiers", ((20, 1, 1, 1), (10, 2, 2, 2)), "tiers[1] start"),
        ("tiers", (5,), "tiers[0]"),
        ("tiers", "x", "tiers"),
        ("write_tiers", ((10, 1, 1),), "write_tiers[0]"),
        ("write_tiers", ((10, -1),), "write_tiers[0]"),
        ("model", 5, "model"),
        ("provider", None, "provider"),
    ],
    ids=repr,
)
def test_a_bad_price_is_refused_naming_its_field(
    field: str, value: object, named: str
) -> None:
    # Were taken: "abc" then failed a turn with a TypeError, NaN and a
    # negative price gave such costs, a short tier an IndexError.
    with pytest.raises(ConfigError) as caught:
        prices(**{field: value})
    assert caught.value.field == named


def test_prices_given_as_numbers_are_decimals() -> None:
    made = prices(
        input=3,
        cached_input=0.3,
        output=Decimal(15),
        cache_write=3.75,
        tiers=[[200_000, 6, 0.6, 22.5]],
        write_tiers=[(200_000, 7.5)],
    )
    assert made.input == Decimal(3)
    assert made.cached_input == Decimal("0.3")
    assert made.cache_write == Decimal("3.75")
    assert made.tiers == ((200_000, Decimal(6), Decimal("0.6"), Decimal("22.5")),)
    assert made.write_tiers == ((200_000, Decimal("7.5")),)
    assert made.usage_cost(Usage(input_tokens=1_000_000)) == Decimal(6)


@pytest.mark.parametrize("model", ["gpt-4o", "claude-sonnet-4-5"])
def test_known_prices_pass_the_checks(model: str) -> None:
    found = known_prices(model)
    assert found is not None
    assert found.cost(1_000_000, 0, 0) > 0


@pytest.mark.parametrize("other", [5, None, 1.5, "x"], ids=repr)
def test_usage_adds_only_usage(other: object) -> None:
    # Was an AttributeError from inside `__add__`.
    with pytest.raises(TypeError, match="unsupported operand"):
        Usage() + other
    with pytest.raises(TypeError):
        other + Usage()  # type: ignore[operator]


@pytest.mark.parametrize(
    ("given", "meant"),
    [("gpt-4o-mni", "gpt-4o-mini"), ("claude-sonet-4-5", "claude-sonnet-4-5")],
)
def test_a_misspelt_model_for_prices_is_told_the_close_one(
    given: str, meant: str
) -> None:
    # It listed two models, as if no other were known.
    with pytest.raises(ConfigError, match=f"did you mean '{meant}'") as caught:
        ContextManager(prices=given)
    assert (caught.value.field, caught.value.value) == ("prices", given)
    assert known_prices(meant) is not None  # the one suggested is priced


def test_a_model_like_none_for_prices_is_told_no_close_one() -> None:
    with pytest.raises(ConfigError) as caught:
        ContextManager(prices="gpt-5-turbo-max")
    assert "did you mean" not in str(caught.value)
    assert "for example gpt-4o" in str(caught.value)
