"""The test doubles refuse a script or a handler's reply that is no reply, naming it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from turnfsm import Agent
from turnfsm.errors import ConfigError
from turnfsm.messages import Message
from turnfsm.testing import FakeModelClient, ScriptedModel, reply, tool_call
from turnfsm.values import Usage


def test_a_string_for_the_script_is_refused_not_played_letter_by_letter() -> None:
    # ScriptedModel("Hello.") answered "H", then "e", ...
    with pytest.raises(ConfigError) as caught:
        ScriptedModel("Hello.")  # type: ignore[arg-type]
    assert str(caught.value) == (
        "invalid script='Hello.': expected a list of replies, not one "
        "(ScriptedModel.of(reply) plays it as one)"
    )
    with pytest.raises(ConfigError, match="invalid script=5: expected a list"):
        ScriptedModel(5)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("items", "message"),
    [
        ((5,), "invalid script[0]=5: expected a ModelResponse, an assistant "),
        (("ok", None), "invalid script[1]=None: expected a ModelResponse"),
        ((ValueError,), "invalid script[0]=<class 'ValueError'>: expected"),
        ((Message.user("hi"),), "expected a reply: an assistant Message"),
    ],
    ids=["int", "None", "exception class", "user message"],
)
def test_an_item_that_is_no_reply_is_refused_when_scripted(
    items: tuple[Any, ...], message: str
) -> None:
    # Each was taken, and failed the run's model call instead.
    with pytest.raises(ConfigError) as caught:
        ScriptedModel.of(*items)
    assert message in str(caught.value)


def test_replies_and_exceptions_are_still_played_in_order() -> None:
    model = ScriptedModel.of(reply("one"), "two", ValueError("three"))
    agent = Agent(model=model)
    assert agent.run_sync("a").text == "one"
    assert agent.run_sync("b").text == "two"
    with pytest.raises(ValueError, match="three"):
        agent.run_sync("c")


def test_a_handler_reply_that_is_no_reply_names_the_handler() -> None:
    agent = Agent(model=FakeModelClient(lambda request: 5))
    with pytest.raises(ConfigError) as caught:
        agent.run_sync("hi")
    assert str(caught.value) == (
        "invalid handler(request)=5: expected a ModelResponse, an assistant "
        "Message or a string"
    )


def test_a_reply_with_tool_calls_only_shows_the_empty_text_first() -> None:
    # It said "invalid message text=ToolCallPart(...): expected a string".
    call = tool_call("read", "c1", path="a")
    with pytest.raises(ConfigError) as caught:
        reply(call)  # type: ignore[arg-type]
    assert str(caught.value) == (
        f"invalid text={call!r}: expected a string, the reply's text, before "
        "its tool calls: reply('', tool_call(...)) for calls with no text"
    )


def test_a_list_of_replies_given_to_of_shows_both_ways() -> None:
    with pytest.raises(ConfigError) as caught:
        ScriptedModel.of(["a", "b"])  # type: ignore[arg-type]
    assert str(caught.value) == (
        "invalid script[0]=['a', 'b']: expected a ModelResponse, an assistant "
        "Message or a string, or an exception to raise (replies go one by one "
        "into ScriptedModel.of(...), or as a list into ScriptedModel([...]))"
    )


def test_a_fake_client_given_no_function_is_refused_when_made() -> None:
    # FakeModelClient([reply("ok")]) was made, then the run crashed on
    # "TypeError: 'list' object is not callable" at its first model call.
    with pytest.raises(ConfigError) as caught:
        FakeModelClient([reply("ok")])  # type: ignore[arg-type]
    assert caught.value.field == "handler"
    assert str(caught.value).endswith(
        "expected a function of the request returning a ModelResponse, an "
        "assistant Message or a string (replies given in order go to "
        "ScriptedModel([...]))"
    )
    with pytest.raises(ConfigError, match=r"handler='ok': expected a function"):
        FakeModelClient("ok")  # type: ignore[arg-type]


def test_a_handler_that_cannot_take_the_request_is_refused_when_made() -> None:
    # It was made, then the run crashed on "TypeError: <lambda>() takes 0
    # positional arguments but 1 was given" at its first model call.
    with pytest.raises(ConfigError, match=r"too many positional arguments"):
        FakeModelClient(lambda: "x")  # type: ignore[arg-type,misc]
    with pytest.raises(ConfigError, match=r"missing a required argument: 'b'"):
        FakeModelClient(lambda a, b: "x")  # type: ignore[arg-type,misc]

    def replies(request: object) -> Iterator[str]:
        yield "x"

    with pytest.raises(ConfigError, match=r"not a generator"):
        FakeModelClient(replies)  # type: ignore[arg-type]
    assert FakeModelClient(lambda request, extra=1: "x").requests == []


def test_a_static_method_in_a_class_body_is_a_handler() -> None:
    class Scripted:
        @staticmethod
        def answer(request: object) -> str:
            return "ok"

        model = FakeModelClient(answer)  # type: ignore[arg-type]

    assert Scripted.model.requests == []


@pytest.mark.parametrize(
    "usage", [5, "x", {"input_tokens": 3}, (3, 1)], ids=["int", "str", "dict", "tuple"]
)
def test_a_usage_that_is_no_usage_is_refused_when_scripted(usage: Any) -> None:
    # It was kept, and failed only at the first model call.
    with pytest.raises(ConfigError) as caught:
        ScriptedModel(["hi"], usage=usage)
    assert (caught.value.field, caught.value.value) == ("usage", usage)
    assert "a Usage" in str(caught.value)


def test_a_usage_or_none_is_taken() -> None:
    used = Usage(input_tokens=3, output_tokens=1)
    assert ScriptedModel(["hi"], usage=used).usage == used
    assert ScriptedModel(["hi"], usage=None).usage is None
