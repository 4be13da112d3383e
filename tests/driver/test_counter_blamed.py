"""A counter whose count no tokenizer could make is named in the run's error.

A run that cannot fit its window says what filled it (the pins, the largest
items). When the counter counts more tokens than the text has characters,
many times over, the counter is at fault, not the conversation: the error
names it, with what it counted.
"""

from __future__ import annotations

from collections.abc import Sequence

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.profiles import sized
from turnfsm.context import ContextManager, counter_at_fault
from turnfsm.driver import Driver, Session
from turnfsm.errors import CompactionStalled, ContextExceeded, PinnedTooLarge
from turnfsm.messages import Message, Role
from turnfsm.testing import FakeModelClient, reply, tool_call
from turnfsm.tokens import (
    ConservativeTokenCounter,
    HeuristicTokenCounter,
    TiktokenCounter,
)

pytestmark = pytest.mark.anyio

WINDOW = 100_000


class Huge:
    """Counts everything as `tokens` tokens: a valid int, an absurd count."""

    def __init__(self, tokens: int) -> None:
        self.tokens = tokens

    def count(self, messages: Sequence[Message]) -> int:
        return self.tokens * max(1, len(messages))

    def count_text(self, text: str) -> int:
        return self.tokens


class HugeOnToolResults:
    """Sane until a tool result arrives; then far past its text."""

    def count(self, messages: Sequence[Message]) -> int:
        if any(m.role is Role.TOOL for m in messages):
            return 10**9
        return sum(len(m.text) // 4 + 4 for m in messages)

    def count_text(self, text: str) -> int:
        return len(text) // 4 + 4


def agent(counter: object) -> Driver:
    def handle(request: object) -> object:
        return reply("", tool_call("look", "c1"))

    def look() -> str:
        """Look around."""
        return "a small result"

    return Driver(
        model=FakeModelClient(handle),  # type: ignore[arg-type]
        tools=[look],
        context=ContextManager(context_window=WINDOW, counter=counter),  # type: ignore[arg-type]
    )


@given(tokens=st.integers(WINDOW + 1, 10**15))
@settings(max_examples=sized(20), deadline=None)
def test_pins_over_the_window_by_an_absurd_count_name_the_counter(tokens: int) -> None:
    d = Driver(
        model=FakeModelClient(lambda r: reply("hi")),
        context=ContextManager(context_window=WINDOW, counter=Huge(tokens)),  # type: ignore[arg-type]
    )
    with pytest.raises(PinnedTooLarge) as raised:
        anyio.run(d.run, "hello")
    assert raised.value.counter.startswith(f"Huge counted {tokens} tokens for ")
    text = str(raised.value)
    assert "the token counter is at fault" in text
    assert "pin less" not in text


async def test_a_run_over_the_window_by_an_absurd_count_names_the_counter() -> None:
    result = await agent(HugeOnToolResults()).run("hello", session=Session())
    error = result.error
    assert isinstance(error, ContextExceeded), error
    assert error.counter.startswith("HugeOnToolResults counted 1000000000 tokens")
    assert "the token counter is at fault" in str(error)


async def test_pins_over_the_window_for_real_do_not_blame_the_counter() -> None:
    d = Driver(
        model=FakeModelClient(lambda r: reply("hi")),
        context=ContextManager(context_window=1_000),
    )
    with pytest.raises(PinnedTooLarge) as raised:
        await d.run("word " * 2_000)
    assert raised.value.counter == ""
    assert "pin less" in str(raised.value)


async def test_a_stall_on_a_real_count_does_not_blame_the_counter() -> None:
    d = Driver(
        model=FakeModelClient(lambda r: reply("hi")),
        context=ContextManager(context_window=2_000, auto_compact=False),
    )
    result = await d.run(
        [Message.user("x " * 100), Message.assistant("y " * 2_000), Message.user("z")]
    )
    assert isinstance(result.error, CompactionStalled | ContextExceeded)
    assert result.error.counter == ""


COUNTERS = [ConservativeTokenCounter(), HeuristicTokenCounter(), TiktokenCounter()]


@given(
    texts=st.lists(st.text(min_size=1, max_size=200), min_size=1, max_size=5),
    which=st.sampled_from(range(len(COUNTERS))),
)
@settings(max_examples=sized(200), deadline=None)
def test_a_shipped_counter_is_never_blamed(texts: list[str], which: int) -> None:
    """Whatever the text, a shipped counter's count is one a tokenizer makes."""
    counter = COUNTERS[which]
    messages = [Message.assistant(t) for t in texts]
    assert counter_at_fault(messages, counter) == ""
    tokens = sum(counter.count_text(t) for t in texts)
    assert counter_at_fault([], counter, extras=texts, tokens=tokens) == ""


async def test_a_run_with_no_context_manager_says_what_filled_its_window() -> None:
    # With context=None, a run a tool result pushed over the window failed
    # "compaction stalled: 9511 tokens ..." naming nothing: the largest
    # items were only listed when a context manager was there.
    def handle(request: object) -> object:
        return reply("", tool_call("dump", "c1"))

    def dump() -> str:
        """Dump everything."""
        return "word " * 5_000

    driver = Driver(
        model=FakeModelClient(handle),  # type: ignore[arg-type]
        tools=[dump],
        context=None,
        context_window=2_000,
    )
    result = await driver.run("dump it", session=Session())
    assert result.outcome == "failed"
    error = result.error
    assert isinstance(error, ContextExceeded)
    assert error.largest, str(error)
    assert error.largest[0].call_id == "c1"
    assert "largest: tool result of dump (call c1)" in str(error)
    # No pass could save anything: there was no compactor to run.
    assert "nothing was saved (a vetoing hook, no context manager, or" in str(error)


@pytest.mark.parametrize("price", [1_600, 3_800])
def test_images_priced_as_providers_price_them_do_not_blame_the_counter(
    price: int,
) -> None:
    # A counter charging a real image price (the default 1,600, or a small
    # model's 3,800) is no counter at fault: the images fill the window.
    from turnfsm.messages import ImagePart, TextPart

    photos = Message(
        role=Role.USER,
        parts=[TextPart(text="what differs?")]
        + [ImagePart(url=f"https://example.com/{n}.png") for n in range(3)],
    )
    counter = ConservativeTokenCounter(image_tokens=price)

    assert counter_at_fault([photos], counter) == ""
    assert counter_at_fault([photos], ConservativeTokenCounter(image_tokens=10**6))


def test_a_replys_thinking_counted_does_not_blame_the_counter() -> None:
    # The counter counts what a model client sends of a message's metadata
    # (a reply's thinking); judged against the parts' characters alone, a
    # short reply with long thinking made the counter look at fault.
    import json

    from turnfsm.messages import SENT

    thought = [{"at": 0, "block": {"type": "thinking", "thinking": "mm. " * 4_000}}]
    reply = Message.assistant("ok", metadata={f"{SENT}t": json.dumps(thought)})
    assert counter_at_fault([reply], ConservativeTokenCounter()) == ""
