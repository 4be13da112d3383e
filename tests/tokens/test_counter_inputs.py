"""A counter given what it does not count says so: a `ConfigError` naming it.

`count` takes a sequence of messages, `count_text` a string and `tokens` a
sum of units (an int >= 0). Anything else was an `AttributeError` or a
`TypeError` from inside the counter, or worse a number: the characters of
a byte string, the items of a list, None counted as the empty text, a
negative or fractional token count. A counter of yours built on the
shipped base (`UnitsCounter`) keeps working, and a bug of its own still
raises as it did.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from turnfsm.context import ContextManager
from turnfsm.errors import ConfigError
from turnfsm.messages import Message
from turnfsm.tokens import (
    ConservativeTokenCounter,
    HeuristicTokenCounter,
    RatioTokenCounter,
    TiktokenCounter,
)
from turnfsm.tokens._base import UnitsCounter
from turnfsm.tokens._cache import UnitCache

COUNTERS: dict[str, Callable[[], UnitsCounter]] = {
    "conservative": ConservativeTokenCounter,
    "heuristic": HeuristicTokenCounter,
    "ratio": RatioTokenCounter.openai,
    "tiktoken": TiktokenCounter,
}
NAMES = sorted(COUNTERS)

NOT_MESSAGES: list[object] = [
    "hi",
    "",
    b"hi",
    {},
    {"role": "user"},
    None,
    5,
    Message.user("one message, not in a list"),
]
NOT_MESSAGES_IDS = [
    "str",
    "empty-str",
    "bytes",
    "empty-dict",
    "dict",
    "none",
    "int",
    "message",
]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("messages", NOT_MESSAGES, ids=NOT_MESSAGES_IDS)
def test_count_refuses_what_is_not_a_sequence_of_messages(
    name: str, messages: object
) -> None:
    with pytest.raises(ConfigError) as info:
        COUNTERS[name]().count(messages)  # type: ignore[arg-type]  # misuse on purpose

    assert info.value.field == "messages"
    assert info.value.value is messages
    assert info.value.__suppress_context__  # the error of the wrong count is not shown


@pytest.mark.parametrize("name", NAMES)
def test_count_names_the_item_that_is_not_a_message(name: str) -> None:
    messages = [Message.user("fine"), "not a message"]

    with pytest.raises(ConfigError) as info:
        COUNTERS[name]().count(messages)  # type: ignore[arg-type]  # misuse on purpose

    assert info.value.field == "messages[1]"
    assert info.value.value == "not a message"


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize(
    "text", [5, None, b"x", ["a"], 2.5], ids=["int", "none", "bytes", "list", "float"]
)
def test_count_text_refuses_what_is_not_a_string(name: str, text: object) -> None:
    with pytest.raises(ConfigError) as info:
        COUNTERS[name]().count_text(text)  # type: ignore[arg-type]  # misuse on purpose

    assert info.value.field == "text"
    assert info.value.value is text


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize(
    "units",
    [-5, 2.5, True, None, "4"],
    ids=["negative", "float", "bool", "none", "str"],
)
def test_tokens_refuses_what_is_not_a_sum_of_units(name: str, units: object) -> None:
    with pytest.raises(ConfigError) as info:
        COUNTERS[name]().tokens(units)  # type: ignore[arg-type]  # misuse on purpose

    assert info.value.field == "units"
    assert info.value.value is units


class _Str(str):
    __slots__ = ()


class _Int(int):
    pass


@pytest.mark.parametrize("name", NAMES)
def test_subclasses_of_str_and_int_count_as_the_plain_values(name: str) -> None:
    counter = COUNTERS[name]()

    assert counter.count_text(_Str("hello world")) == counter.count_text("hello world")
    assert counter.tokens(_Int(100)) == counter.tokens(100)
    assert type(counter.tokens(_Int(100))) is int
    messages = (Message.user("hello"), Message.assistant("hi"))  # a tuple, not a list
    assert counter.count(messages) == counter.count(list(messages))
    assert counter.count([]) == 0


def test_the_context_manager_s_count_is_refused_the_same() -> None:
    with pytest.raises(ConfigError) as info:
        ContextManager().count("hi")  # type: ignore[arg-type]  # misuse on purpose

    assert info.value.field == "messages"


class _Words(UnitsCounter):
    """A counter of your own on the shipped base: a token per word."""

    _cache = UnitCache()

    def _measure(self, message: Message) -> int:
        return len(message.text.split())

    def units(self, message: Message) -> int:
        return self._cache.units(message, self._measure)

    def text_units(self, text: str) -> int:
        return len(text.split())

    def tokens(self, units: int) -> int:
        return units


class _Broken(_Words):
    def _measure(self, message: Message) -> int:
        raise TypeError("a bug of the counter's own")


def test_a_counter_of_your_own_keeps_counting_and_is_checked_too() -> None:
    counter = _Words()

    assert (
        counter.count([Message.user("two words"), Message.user("three more words")])
        == 5
    )
    assert counter.count_text("four words in all") == 4
    with pytest.raises(ConfigError) as info:
        counter.count("hi")  # type: ignore[arg-type]  # misuse on purpose
    assert info.value.field == "messages"
    with pytest.raises(ConfigError) as info:
        counter.count_text(None)  # type: ignore[arg-type]  # misuse on purpose
    assert info.value.field == "text"


def test_a_bug_of_the_counter_s_own_is_not_blamed_on_the_messages() -> None:
    with pytest.raises(TypeError, match="a bug of the counter's own"):
        _Broken().count([Message.user("fine")])
