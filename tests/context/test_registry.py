"""`STRATEGIES` and `strategy_named`: the shipped strategies, one list by name."""

from __future__ import annotations

import pytest

from turnfsm.context import (
    STRATEGIES,
    ContextCompactor,
    LayeredCompactor,
    MaskingCompactor,
    SummarizingCompactor,
    ToolResultDigest,
    TruncatingCompactor,
    strategy_named,
)
from turnfsm.errors import ConfigError
from turnfsm.testing import ExtractiveSummaryModel

# name, class, whether it summarises with a model
SHIPPED = [
    ("masking", MaskingCompactor, False),
    ("truncating", TruncatingCompactor, False),
    ("summarizing", SummarizingCompactor, True),
    ("layered", LayeredCompactor, True),
    ("digest", ToolResultDigest, False),
]


def test_the_registry_names_every_shipped_strategy_in_its_order() -> None:
    assert list(STRATEGIES.items()) == [(name, cls) for name, cls, _ in SHIPPED]


def test_the_registry_cannot_be_changed() -> None:
    with pytest.raises(TypeError):
        STRATEGIES["mine"] = MaskingCompactor  # type: ignore[index]


@pytest.mark.parametrize(("name", "cls", "summarises"), SHIPPED)
def test_every_name_builds_its_compactor_with_its_defaults(
    name: str, cls: type[ContextCompactor], summarises: bool
) -> None:
    made = strategy_named(name)
    assert type(made) is cls
    assert made == cls()
    assert isinstance(made, ContextCompactor)


@pytest.mark.parametrize(("name", "cls", "summarises"), SHIPPED)
def test_the_summary_model_goes_to_the_summarising_ones_only(
    name: str, cls: type[ContextCompactor], summarises: bool
) -> None:
    model = ExtractiveSummaryModel()
    made = strategy_named(name, summary_model=model)
    assert type(made) is cls
    if summarises:
        assert isinstance(made, SummarizingCompactor | LayeredCompactor)
        assert made.model is model
    else:
        assert made == cls()


@pytest.mark.parametrize(
    ("name", "settings"),
    [
        ("masking", {"preserve_recent": 2}),
        ("truncating", {"preserve_recent": 2, "min_messages": 3}),
        ("summarizing", {"keep_recent_turns": 1, "max_summary_tokens": 300}),
        ("layered", {"max_tool_result_chars": 16_000}),
        ("digest", {"keep_recent_turns": 1}),
    ],
)
def test_settings_are_the_compactors_own(name: str, settings: dict[str, int]) -> None:
    made = strategy_named(name, **settings)
    assert made == STRATEGIES[name](**settings)  # type: ignore[call-arg]


def test_a_setting_beside_the_summary_model_wins() -> None:
    mine, theirs = ExtractiveSummaryModel(), ExtractiveSummaryModel()
    made = strategy_named("layered", summary_model=theirs, model=mine)
    assert isinstance(made, LayeredCompactor)
    assert made.model is mine


@pytest.mark.parametrize("name", ["nope", "", "Layered", "digest ", 3, None])
def test_an_unknown_name_is_refused_with_the_known_ones(name: object) -> None:
    with pytest.raises(ConfigError) as raised:
        strategy_named(name)  # type: ignore[arg-type]
    assert raised.value.field == "strategy"
    assert raised.value.value == name
    assert (
        raised.value.expected == "masking | truncating | summarizing | layered | digest"
    )
    assert str(raised.value) == (
        f"invalid strategy={name!r}: expected "
        "masking | truncating | summarizing | layered | digest"
    )


def test_the_error_names_the_field_the_name_came_from() -> None:
    with pytest.raises(ConfigError) as raised:
        strategy_named("fast", field="--strategy")
    assert str(raised.value) == (
        "invalid --strategy='fast': expected "
        "masking | truncating | summarizing | layered | digest"
    )


def test_an_unknown_setting_is_refused_naming_it_and_the_known_ones() -> None:
    with pytest.raises(ConfigError) as raised:
        strategy_named("truncating", preserve=2)
    assert raised.value.field == "preserve"
    assert raised.value.value == 2
    assert raised.value.expected.startswith("a setting of TruncatingCompactor: ")
    assert "preserve_recent" in raised.value.expected


def test_a_setting_out_of_range_is_the_compactors_own_refusal() -> None:
    with pytest.raises(ConfigError) as raised:
        strategy_named("truncating", preserve_recent=-1)
    assert raised.value.field == "preserve_recent"
