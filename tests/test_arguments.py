"""A wrong argument to a settings class is refused typed, like a wrong value.

A misspelt keyword (`ContextManager(context_windw=8000)`), a positional
argument where only keywords are taken, or a missing required one raises a
`ConfigError` naming the argument (and the real one it is closest to),
never Python's bare `TypeError`.
"""

from __future__ import annotations

import importlib
from typing import Any

import attrs
import pytest

from turnfsm import _checks
from turnfsm.context import ContextManager
from turnfsm.driver import RetryPolicy, Tool
from turnfsm.errors import ConfigError
from turnfsm.persistence import MemoryStore

# Each class a user builds by hand.
CLASSES = [
    ("turnfsm.context", "ContextManager"),
    ("turnfsm.context", "MaskingCompactor"),
    ("turnfsm.context", "TruncatingCompactor"),
    ("turnfsm.context", "SummarizingCompactor"),
    ("turnfsm.context", "LayeredCompactor"),
    ("turnfsm.context", "TokenSplitter"),
    ("turnfsm.context", "ToolResultDigest"),
    ("turnfsm.core", "Budget"),
    ("turnfsm.driver", "Driver"),
    ("turnfsm.driver", "RetryPolicy"),
    ("turnfsm.driver", "Tool"),
    ("turnfsm.tokens", "RatioTokenCounter"),
    ("turnfsm.tokens", "ConservativeTokenCounter"),
    ("turnfsm.tokens", "TiktokenCounter"),
    ("turnfsm.persistence", "SQLiteStore"),
    ("turnfsm.providers", "OutputSpec"),
    ("turnfsm.providers", "ModelPrices"),
    ("turnfsm.providers", "OpenAIModel"),
    ("turnfsm.providers", "AnthropicModel"),
    ("turnfsm.providers", "LlamaServer"),
    ("turnfsm.context", "CacheRules"),
    ("turnfsm.context", "PinRules"),
    ("turnfsm.hooks", "PreCompact"),
    ("turnfsm.providers", "ModelResponse"),
    ("turnfsm.providers", "TextDelta"),
    ("turnfsm.providers", "StreamDone"),
    ("turnfsm.testing", "ScriptedModel"),
    ("turnfsm.testing", "FakeModelClient"),
    ("turnfsm.testing", "ExtractiveSummaryModel"),
    ("turnfsm.evals", "Probe"),
]


def _class(module: str, name: str) -> Any:
    try:
        return getattr(importlib.import_module(module), name)
    except ImportError as missing:  # an extra not installed
        pytest.skip(str(missing))


@pytest.mark.parametrize(("module", "name"), CLASSES)
def test_a_misspelt_setting_names_the_one_it_is_close_to(
    module: str, name: str
) -> None:
    cls = _class(module, name)
    setting = max((a.alias or a.name for a in attrs.fields(cls) if a.init), key=len)
    misspelt = setting[:-1]  # its last letter left off
    with pytest.raises(ConfigError) as caught:
        cls(**{misspelt: 1})
    assert (caught.value.field, caught.value.value) == (misspelt, 1)
    assert str(caught.value) == (
        f"invalid {misspelt}=1: expected a known {name} setting "
        f"(did you mean {setting!r}?)"
    )


def test_an_unknown_setting_far_from_any_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError) as caught:
        ContextManager(some_unknown_kwarg=1)  # type: ignore[call-arg]
    error = caught.value
    assert (error.field, error.value) == ("some_unknown_kwarg", 1)
    assert str(error).startswith(
        "invalid some_unknown_kwarg=1: expected a known ContextManager setting "
        "(one of auto_compact, cache_payback_calls, "
    )
    assert "context_window" in str(error)


def test_a_positional_argument_where_keywords_are_taken_is_refused() -> None:
    with pytest.raises(ConfigError) as caught:
        RetryPolicy(3)  # type: ignore[misc]
    assert (caught.value.field, caught.value.value) == ("RetryPolicy", 3)
    assert str(caught.value) == (
        "invalid RetryPolicy=3: expected keyword arguments "
        "(RetryPolicy(max_attempts=...)): RetryPolicy takes none by position"
    )
    with pytest.raises(ConfigError, match=r"expected no arguments \(MemoryStore\(\)\)"):
        MemoryStore(1)  # type: ignore[call-arg]


@pytest.mark.parametrize(
    ("module", "name"),
    [("turnfsm.driver", "RunControl"), ("turnfsm.tokens", "HeuristicTokenCounter")],
)
def test_a_setting_of_a_class_that_takes_none_is_refused(
    module: str, name: str
) -> None:
    cls = _class(module, name)
    with pytest.raises(ConfigError) as caught:
        cls(timeout=5)
    assert str(caught.value) == (
        f"invalid timeout=5: expected a known {name} setting ({name} takes none)"
    )
    with pytest.raises(ConfigError) as caught:
        cls(5)
    assert str(caught.value) == f"invalid {name}=5: expected no arguments ({name}())"


def test_a_missing_required_setting_is_named() -> None:
    with pytest.raises(ConfigError) as caught:
        Tool(description="d", parameters={}, fn=print)  # type: ignore[call-arg]
    error = caught.value
    assert (error.field, error.missing) == ("name", True)
    assert str(error) == "missing name: expected a value (Tool(name=...) is required)"


def test_a_type_error_of_good_arguments_is_left_as_it_is() -> None:
    # The arguments fit: a TypeError raised while they are read is the
    # class's own (here, the summary model's), not a wrong argument.
    @_checks.keyword_checked
    @attrs.frozen(kw_only=True)
    class Reads:
        value: int = attrs.field(converter=int)

    with pytest.raises(TypeError, match="int\\(\\) argument must be"):
        Reads(value=[1])
    assert Reads(value="2").value == 2


@pytest.mark.parametrize("owner", ["Agent", "Driver"])
def test_a_context_setting_given_to_an_agent_or_driver_says_where_it_goes(
    owner: str,
) -> None:
    from turnfsm import Agent, Driver
    from turnfsm.testing import ScriptedModel

    cls = {"Agent": Agent, "Driver": Driver}[owner]
    with pytest.raises(ConfigError) as caught:
        cls(model=ScriptedModel.of("hi"), threshold=70)
    assert str(caught.value) == (
        f"invalid threshold=70: expected a known {owner} setting (it is a "
        "ContextManager setting: context=ContextManager(threshold=70))"
    )


def test_a_positional_argument_past_those_taken_by_position_is_refused() -> None:
    from turnfsm.testing import FakeModelClient

    with pytest.raises(ConfigError) as caught:
        FakeModelClient(print, 2)  # type: ignore[call-arg]
    assert str(caught.value) == "invalid FakeModelClient=2: expected at most 1 argument"
    model = _class("turnfsm.providers", "OpenAIModel")
    with pytest.raises(ConfigError) as caught:
        model("gpt-4o", "http://127.0.0.1:8080/v1", "key")
    assert str(caught.value) == (
        "invalid OpenAIModel='http://127.0.0.1:8080/v1': expected keyword "
        "arguments (OpenAIModel(base_url=...)): OpenAIModel takes 1 by position"
    )
