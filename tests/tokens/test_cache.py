"""Caching: each counter measures a message once; a re-count costs new messages."""

from __future__ import annotations

import copy
import gc
import json
import pickle
import weakref
from collections.abc import Callable

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from turnfsm.messages import PINNED, SENT, Message, MessageLog, ToolCallPart
from turnfsm.tokens import (
    ConservativeTokenCounter,
    HeuristicTokenCounter,
    IncrementalCounter,
    Meter,
    RatioTokenCounter,
    TiktokenCounter,
    _conservative,
    _render,
    _tiktoken,
)
from turnfsm.tokens._cache import UnitCache


def history(n: int, start: int = 0) -> list[Message]:
    return [Message.user(f"message number {i}: some words") for i in range(start, n)]


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record every call of the text-measuring functions the counters use."""
    seen: list[str] = []

    def spy(module: object, name: str) -> None:
        original: Callable[..., int] = getattr(module, name)

        def counting(*args: object) -> int:
            seen.append(name)
            return original(*args)

        monkeypatch.setattr(module, name, counting)

    spy(_render, "rendered_chars")  # heuristic, ratio
    spy(_conservative, "_message_units")  # conservative
    spy(_tiktoken, "_count")  # tiktoken
    return seen


COUNTERS: list[Callable[[], IncrementalCounter]] = [
    HeuristicTokenCounter,
    RatioTokenCounter.openai,
    ConservativeTokenCounter,
    TiktokenCounter,
]
IDS = ["heuristic", "ratio", "conservative", "tiktoken"]


@pytest.mark.parametrize("make", COUNTERS, ids=IDS)
def test_recount_after_append_measures_only_new_messages(
    make: Callable[[], IncrementalCounter], calls: list[str]
) -> None:
    counter = make()
    messages = history(200)
    first = counter.count(messages)
    assert len(calls) == 200

    calls.clear()
    grown = [*messages, *history(203, start=200)]
    second = counter.count(grown)

    assert len(calls) == 3
    assert second > first
    assert counter.count(grown) == second
    assert len(calls) == 3


@pytest.mark.parametrize("make", COUNTERS, ids=IDS)
def test_cache_is_not_part_of_the_value(make: Callable[[], IncrementalCounter]) -> None:
    warm, cold = make(), make()
    warm.count(history(5))

    assert warm == cold
    assert hash(warm) == hash(cold)
    assert repr(warm) == repr(cold)
    assert "cache" not in repr(warm)


@pytest.mark.parametrize("make", COUNTERS, ids=IDS)
def test_counters_are_frozen(make: Callable[[], IncrementalCounter]) -> None:
    counter = make()

    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        # A frozen counter refuses every assignment, private fields included.
        counter._cache = None  # type: ignore[attr-defined]


@pytest.mark.parametrize("make", COUNTERS, ids=IDS)
def test_reused_id_with_other_content_is_measured_again(
    make: Callable[[], IncrementalCounter],
) -> None:
    counter = make()
    short = Message.user("hi", id="m0")
    long = Message.user("a much longer message than the first one " * 10, id="m0")

    assert counter.count([short]) < counter.count([long])
    assert counter.count([short]) == make().count([short])


def test_equal_message_reuses_the_entry(calls: list[str]) -> None:
    counter = HeuristicTokenCounter()
    original = Message.user("same text", id="m1")
    counter.count([original])

    counter.count([Message.from_dict(original.to_dict())])

    assert calls == ["rendered_chars"]


def test_cache_drops_the_least_recently_used_beyond_its_size() -> None:
    cache = UnitCache(size=3)
    messages = history(4)
    measured: list[str] = []

    def measure(message: Message) -> int:
        measured.append(message.id)
        return len(message.text)

    for message in messages[:3]:
        cache.units(message, measure)
    cache.units(messages[0], measure)  # now the most recently used
    cache.units(messages[3], measure)  # evicts messages[1]

    assert len(cache) == 3
    measured.clear()
    for message in (messages[0], messages[2], messages[3], messages[1]):
        cache.units(message, measure)
    assert measured == [messages[1].id]


def test_a_message_in_every_count_is_never_dropped() -> None:
    # A system prompt, say, while the cache fills and overflows many times.
    cache = UnitCache(size=10)
    system, *rest = history(60)
    measured: list[str] = []

    def measure(message: Message) -> int:
        measured.append(message.id)
        return len(message.text)

    for message in rest:
        cache.total((system, message), measure)

    assert measured.count(system.id) == 1
    assert len(cache) == 10


def test_a_count_that_fails_midway_leaves_the_cache_within_its_size() -> None:
    cache = UnitCache(size=2)
    messages = history(4)

    def measure(message: Message) -> int:
        if message is messages[3]:
            raise RuntimeError("cannot price it")
        return len(message.text)

    with pytest.raises(RuntimeError):
        cache.total(messages, measure)
    assert len(cache) == 2


def test_cache_does_not_keep_messages_alive() -> None:
    cache = UnitCache()
    message = Message.user("temporary")
    cache.units(message, lambda m: 1)
    ref = weakref.ref(message)

    del message

    assert ref() is None
    assert len(cache) == 1


def test_entries_of_dropped_conversations_are_swept_out() -> None:
    # A server: each request prices a short conversation, then drops it.
    cache = UnitCache()
    kept = history(10, start=100_000)  # a conversation still going on
    cache.total(kept, lambda m: 1)
    for request in range(1000):
        cache.total(history(5, start=request * 5), lambda m: 1)
    gc.collect()

    assert len(cache) <= 2048  # of the 5,010 priced
    measured: list[str] = []
    cache.total(kept, lambda m: measured.append(m.id) or 1)
    assert measured == []  # the live conversation's entries stay


@pytest.mark.parametrize("make", COUNTERS, ids=IDS)
@given(
    warm=st.lists(
        st.tuples(st.sampled_from("abc"), st.text("xy é\n", min_size=1, max_size=9)),
        max_size=6,
    ),
    asked=st.lists(
        st.tuples(st.sampled_from("abc"), st.text("xy é\n", min_size=1, max_size=9)),
        max_size=8,
    ),
)
def test_a_count_over_cached_reused_and_new_ids_equals_a_fresh_count(
    make: Callable[[], IncrementalCounter],
    warm: list[tuple[str, str]],
    asked: list[tuple[str, str]],
) -> None:
    # Ids repeat within and across the lists with other texts: a cached
    # entry counts only for the message it was measured on.
    counter = make()
    counter.count([Message.user(f"<{text}>", id=key) for key, text in warm])
    messages = [Message.user(f"<{text}>", id=key) for key, text in asked]

    assert counter.count(messages) == make().count(messages)
    assert counter.count(messages) == make().count(messages)  # now all cached


@pytest.mark.parametrize("make", COUNTERS, ids=IDS)
def test_an_equal_counter_made_later_finds_the_messages_priced(
    make: Callable[[], IncrementalCounter], calls: list[str]
) -> None:
    # A driver or agent made per request brings a new counter equal to the
    # last one's: the session's messages are not priced again.
    messages = history(50)
    first = make()
    total = first.count(messages)
    calls.clear()
    later = make()
    assert later.count(messages) == total
    assert calls == []


def test_counters_of_another_value_price_apart_and_the_cache_goes_with_them(
    calls: list[str],
) -> None:
    messages = history(20)
    low, high = (
        RatioTokenCounter(chars_per_token=3.0),
        RatioTokenCounter(chars_per_token=5.0),
    )
    assert low.count(messages) > high.count(messages)
    assert len(calls) == 40  # each value priced every message
    cache = weakref.ref(low._cache)  # type: ignore[attr-defined]
    del low
    gc.collect()
    assert cache() is None  # no counter of that value is left


@pytest.mark.parametrize("make", COUNTERS, ids=IDS)
def test_a_counter_that_has_counted_copies_and_pickles(
    make: Callable[[], IncrementalCounter],
) -> None:
    counter = make()
    messages = history(5)
    counted = counter.count(messages)

    for copied in (copy.deepcopy(counter), pickle.loads(pickle.dumps(counter))):
        assert copied == counter
        assert copied.count(messages) == counted


THOUGHT = json.dumps(
    [{"at": 0, "block": {"type": "thinking", "thinking": "Let me think. " * 200}}]
)


def thinking_reply(metadata: dict[str, str], *, id: str = "r1") -> Message:
    call = ToolCallPart(id="c1", name="look", arguments={"q": "x"})
    return Message.assistant("", tool_calls=[call], id=id, metadata=metadata)


@pytest.mark.parametrize("make", COUNTERS, ids=IDS)
def test_metadata_a_model_client_sends_is_counted_by_every_counter(
    make: Callable[[], IncrementalCounter],
) -> None:
    # A reply's thinking rides every later request (Anthropic needs it back
    # with the results of the reply's calls); no counter counted it, so a
    # request could be thousands of tokens over what the window check saw.
    counter = make()
    plain = thinking_reply({}, id="r0")
    thought = thinking_reply({f"{SENT}anthropic.thinking": THOUGHT})
    other = thinking_reply({"mine": THOUGHT, PINNED: "true"}, id="r2")
    # (less 1: a ratio rounds up once over the request)
    at_least = counter.count_text(THOUGHT) - counter.count_text("") - 1
    assert counter.count([thought]) >= counter.count([plain]) + at_least
    # Metadata no client sends costs nothing.
    assert counter.count([other]) == counter.count([plain])
    # So does the meter, incrementally, log or list.
    log = MessageLog([Message.user("look"), thought])
    meter = Meter(counter)
    assert meter.measure(log) == meter.measure(list(log)) == counter.count(log)


@pytest.mark.parametrize("make", COUNTERS, ids=IDS)
def test_a_message_given_sent_metadata_under_its_id_is_measured_again(
    make: Callable[[], IncrementalCounter],
) -> None:
    # Metadata is not part of a message's `==`: a reply re-made with its
    # thinking under the same id got the price of the one without.
    counter = make()
    bare = thinking_reply({})
    counter.count([bare])
    thought = thinking_reply({f"{SENT}anthropic.thinking": THOUGHT})
    assert counter.count([thought]) > counter.count([bare])


def test_a_sent_value_that_is_not_text_is_priced_as_its_json() -> None:
    value = {"blocks": [1, 2, "é"]}
    message = Message.assistant("x", metadata={f"{SENT}mine": value, "other": "y"})
    assert message.sent_texts == ('{"blocks":[1,2,"é"]}',)
    assert Message.assistant("x").sent_texts == ()
