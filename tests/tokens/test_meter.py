from __future__ import annotations

import gc
import math
import weakref
from collections.abc import Callable, Sequence

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.profiles import sized
from turnfsm.errors import ConfigError
from turnfsm.messages import Message, MessageLog
from turnfsm.tokens import (
    ConservativeTokenCounter,
    HeuristicTokenCounter,
    IncrementalCounter,
    Meter,
    RatioTokenCounter,
    TiktokenCounter,
    TokenCounter,
    _meter,
)

INCREMENTAL: list[IncrementalCounter] = [
    HeuristicTokenCounter(),
    RatioTokenCounter.anthropic(),
    ConservativeTokenCounter(),
    TiktokenCounter(),
]
IDS = ["heuristic", "ratio", "conservative", "tiktoken"]


@attrs.frozen
class PlainCounter:
    """A `TokenCounter` that is not incremental: one token per message word."""

    def count(self, messages: Sequence[Message]) -> int:
        return sum(len(m.text.split()) + 1 for m in messages)

    def count_text(self, text: str) -> int:
        return len(text.split()) + 1


@attrs.define
class CountingCounter:
    """Wraps an incremental counter and records each `units` call (unhashable)."""

    inner: IncrementalCounter = attrs.field(factory=HeuristicTokenCounter)
    calls: list[str] = attrs.field(factory=list)

    def count(self, messages: Sequence[Message]) -> int:
        return self.inner.count(messages)

    def count_text(self, text: str) -> int:
        return self.inner.count_text(text)

    def units(self, message: Message) -> int:
        self.calls.append(message.id)
        return self.inner.units(message)

    def text_units(self, text: str) -> int:
        return self.inner.text_units(text)

    def tokens(self, units: int) -> int:
        return self.inner.tokens(units)


@attrs.frozen
class HashableCountingCounter:
    """Like `CountingCounter`, but hashable, so `Meter` keeps prefix sums."""

    inner: IncrementalCounter
    calls: list[str] = attrs.field(factory=list, eq=False, hash=False)

    def count(self, messages: Sequence[Message]) -> int:
        return self.inner.count(messages)

    def count_text(self, text: str) -> int:
        return self.inner.count_text(text)

    def units(self, message: Message) -> int:
        self.calls.append(message.id)
        return self.inner.units(message)

    def text_units(self, text: str) -> int:
        return self.inner.text_units(text)

    def tokens(self, units: int) -> int:
        return self.inner.tokens(units)


def messages(n: int, tag: str = "m") -> list[Message]:
    return [Message.user(f"{tag} {i} " * (i % 5 + 1)) for i in range(n)]


def test_measure_of_one_message() -> None:
    meter = Meter(HeuristicTokenCounter())

    assert meter.measure([Message.user("Hello, world!")]) == 8
    assert meter.measure() == 0
    assert meter.measure(extras=["Hello, world!"]) == 8


def test_extras_ride_the_same_request_and_round_once() -> None:
    counter = HeuristicTokenCounter()
    log = MessageLog([Message.user("x")])
    # (1 + 20) + (1 + 20) = 42 chars -> 10 tokens; separately it would be 5 + 5.
    assert Meter(counter).measure(log, extras=["y"]) == 10


def test_plain_counter_adds_counts() -> None:
    meter = Meter(PlainCounter())
    history = messages(3)

    expected = PlainCounter().count(history) + 2 + 3
    assert meter.measure(history[:1], MessageLog(history[1:]), extras=["a", "b c"]) == (
        expected
    )


@pytest.mark.parametrize("counter", INCREMENTAL, ids=IDS)
def test_regrowing_log_costs_only_new_messages(counter: IncrementalCounter) -> None:
    spy = HashableCountingCounter(inner=counter)
    meter = Meter(spy)
    log = MessageLog(messages(100))
    assert meter.measure(log) == spy.count(list(log))
    assert len(spy.calls) == 100

    spy.calls.clear()
    grown = log.append(*messages(3, tag="new"))

    assert meter.measure(grown) == spy.count(list(grown))
    assert len(spy.calls) == 3
    spy.calls.clear()
    assert meter.measure(grown) == meter.measure(grown)
    assert meter.measure(log) == spy.count(list(log))  # a shorter view: no work
    assert spy.calls == []


def test_unhashable_counter_is_measured_without_prefix_sums() -> None:
    spy = CountingCounter()
    log = MessageLog(messages(4))

    assert Meter(spy).measure(log) == HeuristicTokenCounter().count(list(log))
    assert Meter(spy).measure(log) == HeuristicTokenCounter().count(list(log))
    assert len(spy.calls) == 8


def test_branches_keep_their_own_sums() -> None:
    counter = HeuristicTokenCounter()
    meter = Meter(counter)
    base = MessageLog(messages(10))
    meter.measure(base)
    left = base.append(Message.user("left " * 50))
    right = base.append(Message.user("r"))

    assert meter.measure(left) == counter.count(list(left))
    assert meter.measure(right) == counter.count(list(right))
    assert meter.measure(left) == counter.count(list(left))
    assert meter.measure(base) == counter.count(list(base))


# A program of log operations: ("new", n) starts a log of n messages,
# ("append", i, n) appends n messages to the i-th log made so far (which
# branches when that log is not the longest view of its backing list).
OPERATIONS = st.lists(
    st.one_of(
        st.tuples(st.just("new"), st.integers(0, 4), st.just(0)),
        st.tuples(st.just("append"), st.integers(0, 20), st.integers(1, 3)),
    ),
    min_size=1,
    max_size=12,
)
TEXTS = st.text(max_size=40)


@settings(max_examples=sized(100), deadline=None)
@given(
    counter=st.sampled_from([*INCREMENTAL, PlainCounter()]),
    program=OPERATIONS,
    texts=st.lists(TEXTS, min_size=40, max_size=40),
    picks=st.lists(st.integers(0, 100), min_size=1, max_size=4),
    extras=st.lists(TEXTS, max_size=3),
    as_list=st.booleans(),
)
def test_meter_agrees_with_counting_the_concatenation(
    counter: TokenCounter,
    program: list[tuple[str, int, int]],
    texts: list[str],
    picks: list[int],
    extras: list[str],
    as_list: bool,
) -> None:
    fresh = iter(Message.system(t) for t in texts * 2)  # any text, blank too
    logs: list[MessageLog] = []
    meter = Meter(counter)
    for op, a, b in program:
        if op == "new" or not logs:
            logs.append(MessageLog([next(fresh) for _ in range(a)]))
        else:
            logs.append(logs[a % len(logs)].extend([next(fresh) for _ in range(b)]))
        meter.measure(logs[-1])  # measure as the log grows, like the driver
    parts: list[Sequence[Message]] = [logs[p % len(logs)] for p in picks]
    if as_list:
        parts[0] = list(parts[0])
    concatenation = [m for part in parts for m in part]

    measured = meter.measure(*parts, extras=extras)

    # One definition for every counter: the messages' count plus each extra's
    # own count (what the context manager's reserved budget adds up to).
    expected = counter.count(concatenation)
    assert measured == expected + sum(counter.count_text(e) for e in extras)
    assert meter.measure(*parts) == expected
    for log in logs:
        assert meter.measure(log) == counter.count(list(log))


def test_counter_cannot_be_swapped() -> None:
    meter = Meter(HeuristicTokenCounter())

    with pytest.raises(attrs.exceptions.FrozenAttributeError):
        meter.counter = ConservativeTokenCounter()


def test_an_equal_counter_made_later_reuses_the_sums_after_the_first_is_gone() -> None:
    # A driver (or agent) made per request brings a counter equal to the
    # last one's: it finds the sums of the session's history, even though
    # the counter that made them is gone.
    log = MessageLog(messages(200))
    first = HashableCountingCounter(inner=HeuristicTokenCounter())
    expected = Meter(first).measure(log)
    assert len(first.calls) == 200
    del first
    gc.collect()

    later = HashableCountingCounter(inner=HeuristicTokenCounter())
    assert Meter(later).measure(log) == expected
    assert later.calls == []
    grown = log.append(*messages(2, tag="new"))
    assert Meter(later).measure(grown) == later.count(list(grown))
    assert len(later.calls) == 2


def test_a_counter_key_goes_with_the_last_log_and_meter_using_it() -> None:
    counter = HashableCountingCounter(inner=RatioTokenCounter(chars_per_token=3.21))
    log = MessageLog(messages(3))
    meter = Meter(counter)
    meter.measure(log)
    key = weakref.ref(meter._memo_key)  # type: ignore[arg-type]
    del meter, log
    gc.collect()
    assert key() is None
    assert counter not in _meter._KEYS


@attrs.frozen
class Returning:
    """An incremental counter whose `method` returns `value`; the rest are right."""

    method: str
    value: object
    inner: IncrementalCounter = attrs.field(factory=HeuristicTokenCounter)

    def _or(self, method: str, right: int) -> int:
        return self.value if method == self.method else right  # type: ignore[return-value]

    def count(self, messages: Sequence[Message]) -> int:
        return self._or("count", self.inner.count(messages))

    def count_text(self, text: str) -> int:
        return self._or("count_text", self.inner.count_text(text))

    def units(self, message: Message) -> int:
        return self._or("units", self.inner.units(message))

    def text_units(self, text: str) -> int:
        return self._or("text_units", self.inner.text_units(text))

    def tokens(self, units: int) -> int:
        return self._or("tokens", self.inner.tokens(units))


@attrs.frozen
class PlainReturning:
    """A counter that is not incremental, whose `method` returns `value`."""

    method: str
    value: object

    def count(self, messages: Sequence[Message]) -> int:
        right = PlainCounter().count(messages)
        return self.value if self.method == "count" else right  # type: ignore[return-value]

    def count_text(self, text: str) -> int:
        right = PlainCounter().count_text(text)
        return self.value if self.method == "count_text" else right  # type: ignore[return-value]


NOT_COUNTS = [2.5, 3.0, None, "12", True, -1, math.nan, math.inf]
NOT_COUNT_IDS = [
    "float",
    "whole-float",
    "none",
    "str",
    "bool",
    "negative",
    "nan",
    "inf",
]


@pytest.mark.parametrize("value", NOT_COUNTS, ids=NOT_COUNT_IDS)
@pytest.mark.parametrize(
    "counter",
    [
        lambda v: PlainReturning("count", v),
        lambda v: PlainReturning("count_text", v),
        lambda v: Returning("units", v),
        lambda v: Returning("text_units", v),
        lambda v: Returning("tokens", v),
    ],
    ids=["count", "count_text", "units", "text_units", "tokens"],
)
@pytest.mark.parametrize("log", [list, MessageLog], ids=["list", "log"])
def test_a_counter_that_returns_no_count_is_named_with_the_value(
    counter: Callable[[object], TokenCounter],
    value: object,
    log: Callable[[list[Message]], Sequence[Message]],
) -> None:
    bad = counter(value)
    method = bad.method  # type: ignore[attr-defined]

    with pytest.raises(ConfigError) as caught:
        Meter(bad).measure(log(messages(3)), extras=["system prompt"])

    assert caught.value.field == "counter"
    assert _same(caught.value.value, value)
    assert f"from {type(bad).__name__}.{method}" in str(caught.value)


def _same(a: object, b: object) -> bool:
    return a is b or a == b or (a != a and b != b)


def test_an_int_subclass_is_a_count() -> None:
    class Tokens(int):
        pass

    size = Meter(PlainReturning("count", Tokens(7))).measure(messages(2))

    assert (size, type(size)) == (7, int)
