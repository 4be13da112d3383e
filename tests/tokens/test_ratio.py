from __future__ import annotations

import math
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from turnfsm.errors import ConfigError
from turnfsm.messages import ImagePart, Message, Role
from turnfsm.tokens import IncrementalCounter, RatioTokenCounter


@pytest.mark.parametrize(
    ("counter", "expected"),
    [
        (RatioTokenCounter.openai(), 4.3),
        (RatioTokenCounter.anthropic(), 3.6),
        (RatioTokenCounter.gemini(), 4.05),
        (RatioTokenCounter.local(), 3.8),
    ],
    ids=["openai", "anthropic", "gemini", "local"],
)
def test_presets(counter: RatioTokenCounter, expected: float) -> None:
    assert counter.chars_per_token == expected


def test_rounds_up_exactly() -> None:
    counter = RatioTokenCounter.openai()

    assert counter.count_text("x" * 43) == 10  # not 11: 43 / 4.3 is exactly 10
    assert counter.count_text("x" * 44) == 11
    assert counter.count_text("x") == 1
    assert counter.count_text("") == 0


def test_rounds_once_over_the_request() -> None:
    counter = RatioTokenCounter(chars_per_token=4)
    messages = [Message.user("a"), Message.user("b")]

    assert counter.count(messages[:1]) == 1
    assert counter.count(messages) == 1  # ceil(2 / 4), not 1 + 1


def test_counts_rendered_chars() -> None:
    counter = RatioTokenCounter(chars_per_token=2)
    image = Message(role=Role.USER, parts=[ImagePart(url="data:,")])

    assert counter.units(image) == 256
    assert counter.count([image, Message.user("abcd")]) == 130


def test_is_incremental_and_a_value() -> None:
    counter = RatioTokenCounter(chars_per_token=4.3)

    assert isinstance(counter, IncrementalCounter)
    assert counter == RatioTokenCounter.openai()
    assert hash(counter) == hash(RatioTokenCounter.openai())
    assert repr(counter) == "RatioTokenCounter(chars_per_token=4.3)"


@pytest.mark.parametrize(
    "value",
    [0, -1, -0.5, math.inf, -math.inf, math.nan, True, "4", None],
    ids=repr,
)
def test_rejects_bad_ratio(value: object) -> None:
    with pytest.raises(ConfigError) as info:
        RatioTokenCounter(chars_per_token=value)  # type: ignore[arg-type]  # misuse on purpose

    assert info.value.field == "chars_per_token"
    assert info.value.value is value


@given(st.integers(min_value=0, max_value=10**9))
def test_tokens_is_exact_ceiling(units: int) -> None:
    for counter, num, den in [
        (RatioTokenCounter.openai(), 43, 10),
        (RatioTokenCounter.anthropic(), 36, 10),
        (RatioTokenCounter.gemini(), 405, 100),
        (RatioTokenCounter.local(), 38, 10),
    ]:
        assert counter.tokens(units) == math.ceil(Fraction(units * den, num))
