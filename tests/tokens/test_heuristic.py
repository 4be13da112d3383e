from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from turnfsm.messages import (
    ImagePart,
    JSONValue,
    Message,
    Role,
    TextPart,
    ToolCallPart,
)
from turnfsm.tokens import HeuristicTokenCounter, IncrementalCounter, TokenCounter

COUNTER = HeuristicTokenCounter()


def test_hello_world_is_eight() -> None:
    assert COUNTER.count([Message.user("Hello, world!")]) == 8


def test_is_an_incremental_counter() -> None:
    assert isinstance(COUNTER, TokenCounter)
    assert isinstance(COUNTER, IncrementalCounter)


def test_empty_request_is_zero() -> None:
    assert COUNTER.count([]) == 0


def test_floor_is_taken_once_over_the_sum() -> None:
    # Each message alone is (1 + 20) // 4 = 5; four of them are 84 // 4 = 21.
    messages = [Message.user("x") for _ in range(4)]

    assert [COUNTER.count([m]) for m in messages] == [5, 5, 5, 5]
    assert COUNTER.count(messages) == 21


def test_image_renders_as_256_chars() -> None:
    image = ImagePart(url="https://example.com/cat.png", media_type="image/png")
    message = Message(role=Role.USER, parts=[TextPart(text="look"), image])

    assert COUNTER.count([message]) == (4 + 256 + 20) // 4


def test_tool_call_renders_name_and_compact_json() -> None:
    call = ToolCallPart(id="call_1", name="search", arguments={"q": "café", "n": 3})
    message = Message.assistant("ok", tool_calls=[call])
    # Compact separators, non-ASCII kept: 18 chars, not 23 for "caf\u00e9".
    arguments = '{"q":"café","n":3}'

    assert COUNTER.units(message) == len("ok") + len("search") + len(arguments) + 20
    assert COUNTER.count([message]) == (2 + 6 + 18 + 20) // 4


def test_tool_call_with_nested_arguments() -> None:
    arguments: dict[str, JSONValue] = {
        "filter": {"tags": ["a", "b"], "limit": None},
        "deep": [[1, 2.5]],
    }
    call = ToolCallPart(id="c", name="find", arguments=arguments)
    message = Message.assistant(tool_calls=[call])
    rendered = json.dumps(arguments, separators=(",", ":"), ensure_ascii=False)

    assert COUNTER.units(message) == len("find") + len(rendered) + 20


def test_tool_result_renders_its_content() -> None:
    message = Message.tool_result("call_1", "42 degrees", is_error=True)

    assert COUNTER.units(message) == len("42 degrees") + 20
    assert COUNTER.count([message]) == 30 // 4


def test_count_text_counts_like_a_message() -> None:
    assert COUNTER.count_text("Hello, world!") == 8
    assert COUNTER.text_units("abc") == 23
    assert COUNTER.count_text("") == 5


@given(st.lists(st.text(), max_size=8), st.lists(st.text(), max_size=3))
def test_formula(texts: list[str], extras: list[str]) -> None:
    messages = [Message.system(t) for t in texts]  # any text, blank too
    chars = sum(len(t) + 20 for t in texts) + sum(len(e) + 20 for e in extras)
    units = sum(COUNTER.units(m) for m in messages)
    units += sum(COUNTER.text_units(e) for e in extras)

    assert COUNTER.count(messages) == sum(len(t) + 20 for t in texts) // 4
    assert COUNTER.tokens(units) == chars // 4
