from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.providers.conversations import canonical, conversations, shape
from turnfsm.errors import ConfigError, InvalidMessage
from turnfsm.messages import (
    ImagePart,
    Joined,
    Message,
    MessageLog,
    Role,
    TextPart,
    ToolCallPart,
    ToolResultPart,
)
from turnfsm.providers import ModelRequest
from turnfsm.providers._convert_anthropic import (
    from_anthropic_messages,
    to_anthropic_messages,
)
from turnfsm.providers._convert_openai import (
    arguments_from_json,
    decode_tool_content,
    encode_tool_content,
    from_openai_messages,
    to_openai_messages,
)

# -- round trips ------------------------------------------------------------------


@given(canonical())
def test_openai_round_trip_is_lossless(messages: list[Message]) -> None:
    wire = to_openai_messages(messages)
    json.dumps(wire)  # JSON-ready
    assert shape(from_openai_messages(wire)) == shape(messages)


@given(canonical())
def test_anthropic_round_trip_is_lossless(messages: list[Message]) -> None:
    system, wire = to_anthropic_messages(messages)
    json.dumps([system, wire])
    assert shape(from_anthropic_messages(wire, system=system)) == shape(messages)


@given(conversations())
def test_openai_normal_form_is_stable(messages: list[Message]) -> None:
    wire = to_openai_messages(messages)
    assert to_openai_messages(from_openai_messages(wire)) == wire


@given(conversations())
def test_anthropic_normal_form_is_stable(messages: list[Message]) -> None:
    system, wire = to_anthropic_messages(messages)
    again = from_anthropic_messages(wire, system=system)
    assert to_anthropic_messages(again) == (system, wire)


@given(st.text(), st.booleans())
def test_the_is_error_prefix_is_lossless(content: str, is_error: bool) -> None:
    assert decode_tool_content(encode_tool_content(content, is_error=is_error)) == (
        content,
        is_error,
    )


ESCAPES = {
    "error": ("boom", True, "[error] boom"),
    "plain": ("fine", False, "fine"),
    "looks like an error": ("[error] not really", False, "\\[error] not really"),
    "already escaped": ("\\[error] x", False, "\\\\[error] x"),
    "error that looks escaped": ("\\[error] x", True, "[error] \\[error] x"),
    "backslash alone": ("\\x", False, "\\x"),
}


@pytest.mark.parametrize(
    ("content", "is_error", "wire"), ESCAPES.values(), ids=ESCAPES.keys()
)
def test_the_is_error_prefix_examples(content: str, is_error: bool, wire: str) -> None:
    assert encode_tool_content(content, is_error=is_error) == wire
    assert decode_tool_content(wire) == (content, is_error)


# -- OpenAI examples ------------------------------------------------------------


def test_openai_parallel_calls_and_results_keep_ids() -> None:
    messages = [
        Message.assistant(
            tool_calls=[
                ToolCallPart(id="call_1", name="a", arguments={"x": [1, 2.5, None]}),
                ToolCallPart(id="call_2", name="b", arguments={}),
            ]
        ),
        Message(
            role=Role.TOOL,
            parts=[
                ToolResultPart(call_id="call_1", content="one"),
                ToolResultPart(call_id="call_2", content="two", is_error=True),
            ],
        ),
    ]
    assert to_openai_messages(messages) == [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "a", "arguments": '{"x":[1,2.5,null]}'},
                },
                {
                    "id": "call_2",
                    "type": "function",
                    "function": {"name": "b", "arguments": "{}"},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "one"},
        {"role": "tool", "tool_call_id": "call_2", "content": "[error] two"},
    ]


def test_openai_images_read_their_media_type_from_a_data_url() -> None:
    wire = [
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": "data:image/gif;base64,R0"}},
                {"type": "image_url", "image_url": {"url": "https://x.test/a"}},
            ],
        }
    ]
    [message] = from_openai_messages(wire)
    assert message.parts == (
        ImagePart(url="data:image/gif;base64,R0", media_type="image/gif"),
        ImagePart(url="https://x.test/a"),
    )


def test_openai_reads_what_servers_send() -> None:
    wire: list[dict[str, Any]] = [
        {"role": "developer", "content": "rules"},
        {"role": "assistant", "content": None, "refusal": "I can't."},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "a"},
                {"type": "refusal", "refusal": "b"},
            ],
            "tool_calls": [
                {
                    "id": "c",
                    "type": "function",
                    "function": {"name": "f", "arguments": {"k": 1}},
                }
            ],
        },
        {
            "role": "tool",
            "tool_call_id": "c",
            "content": [{"type": "text", "text": "ok"}],
        },
    ]
    assert shape(from_openai_messages(wire)) == [
        (Role.SYSTEM, (TextPart(text="rules"),)),
        (Role.ASSISTANT, (TextPart(text="I can't."),)),
        (
            Role.ASSISTANT,
            (
                TextPart(text="a"),
                TextPart(text="b"),
                ToolCallPart(id="c", name="f", arguments={"k": 1}),
            ),
        ),
        (Role.TOOL, (ToolResultPart(call_id="c", content="ok"),)),
    ]


ARGUMENTS = {
    "object": ('{"a": 1}', {"a": 1}),
    "blank": ("  ", {}),
    # A call of a tool with no parameters, as some servers (Cohere's) send
    # it: it was refused as "not valid JSON", and never ran.
    "null": (" null ", {}),
    "truncated": ('{"a": ', {"_raw": '{"a": '}),
    "not an object": ("[1, 2]", {"_raw": "[1, 2]"}),
    "prose": ("sure!", {"_raw": "sure!"}),
    "deep": ("[" * 100_000, {"_raw": "[" * 100_000}),
    # JSON, but nested deeper than a message holds: a call the model is told
    # of, not a reply the run fails on.
    "nested past the limit": (
        '{"a": ' + "[" * 150 + "]" * 150 + "}",
        {"_raw": '{"a": ' + "[" * 150 + "]" * 150 + "}"},
    ),
    # Python reads these, JSON has none: sent back in the history, they are
    # arguments a server that parses past calls' arguments cannot read.
    "nan": ('{"a": NaN}', {"_raw": '{"a": NaN}'}),
    "infinity": ('{"a": [-Infinity]}', {"_raw": '{"a": [-Infinity]}'}),
    # Python reads a number past a float's range as infinity.
    "past a float": ('{"a": 1e400}', {"_raw": '{"a": 1e400}'}),
}


@pytest.mark.parametrize(("text", "expected"), ARGUMENTS.values(), ids=ARGUMENTS.keys())
def test_arguments_from_json(text: str, expected: dict[str, Any]) -> None:
    assert arguments_from_json(text) == expected


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ({"a": 1}, {"a": 1}),
        (None, {}),
        ([1, 2], {"_raw": "[1, 2]"}),  # was {}: the tool ran on its defaults
        (7, {"_raw": "7"}),
        ({"a": float("nan")}, {"_raw": '{"a": NaN}'}),
    ],
    ids=["object", "none", "list", "number", "nan"],
)
def test_openai_arguments_sent_as_a_value(given: object, expected: object) -> None:
    call = {"id": "c", "function": {"name": "f", "arguments": given}}
    wire = {"role": "assistant", "content": None, "tool_calls": [call]}
    (message,) = from_openai_messages([wire])
    assert message.tool_calls[0].arguments == expected


def test_anthropic_tool_input_nested_past_the_limit_is_kept_as_its_text() -> None:
    # The reply was unreadable (InvalidMessage): the run failed on it.
    deep: Any = []
    for _ in range(150):
        deep = [deep]
    block = {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"a": deep}}
    (message,) = from_anthropic_messages([{"role": "assistant", "content": [block]}])
    (call,) = message.tool_calls
    assert call.arguments == {"_raw": json.dumps({"a": deep})}


BAD_OPENAI = {
    "unknown role": {"role": "function", "content": "x"},
    "audio part": {"role": "user", "content": [{"type": "input_audio"}]},
    "tool without id": {"role": "tool", "content": "x"},
    "custom tool call": {
        "role": "assistant",
        "tool_calls": [{"id": "c", "type": "custom", "custom": {}}],
    },
}


@pytest.mark.parametrize("data", BAD_OPENAI.values(), ids=BAD_OPENAI.keys())
def test_openai_rejects_what_it_cannot_read(data: dict[str, Any]) -> None:
    with pytest.raises(InvalidMessage):
        from_openai_messages([data])


# -- Anthropic examples -----------------------------------------------------------


def test_anthropic_splits_a_user_turn_into_results_and_text() -> None:
    wire: list[dict[str, Any]] = [
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": "a"},
                {
                    "type": "tool_result",
                    "tool_use_id": "t2",
                    "content": [
                        {"type": "text", "text": "b"},
                        {"type": "text", "text": "c"},
                    ],
                    "is_error": True,
                },
                {"type": "tool_result", "tool_use_id": "t3"},
                {"type": "text", "text": "and now?"},
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "hmm", "signature": "s"},
                {"type": "text", "text": "done"},
            ],
        },
    ]
    assert shape(from_anthropic_messages(wire, system="sys")) == [
        (Role.SYSTEM, (TextPart(text="sys"),)),
        (Role.TOOL, (ToolResultPart(call_id="t1", content="a"),)),
        (Role.TOOL, (ToolResultPart(call_id="t2", content="b\nc", is_error=True),)),
        (Role.TOOL, (ToolResultPart(call_id="t3", content=""),)),
        (Role.USER, (TextPart(text="and now?"),)),
        (Role.ASSISTANT, (TextPart(text="done"),)),
    ]


THINKING = {"type": "thinking", "thinking": "hmm", "signature": "c2ln"}
REDACTED = {"type": "redacted_thinking", "data": "b3BhcXVl"}


@pytest.mark.parametrize(
    "content",
    [
        [THINKING, {"type": "tool_use", "id": "t1", "name": "look", "input": {}}],
        [
            THINKING,
            {"type": "text", "text": "let me look"},
            REDACTED,
            {"type": "tool_use", "id": "t1", "name": "look", "input": {"q": 1}},
            {"type": "tool_use", "id": "t2", "name": "look", "input": {}},
        ],
        [REDACTED, {"type": "text", "text": "done"}],
    ],
    ids=["before a call", "between text and calls", "before the answer"],
)
def test_anthropic_sends_a_replys_thinking_back_where_it_stood(
    content: list[dict[str, Any]],
) -> None:
    # Anthropic refuses the results of a call whose turn thought unless
    # that turn's thinking blocks come back unchanged: they were dropped,
    # and the run's next call failed.
    (reply,) = from_anthropic_messages([{"role": "assistant", "content": content}])
    stored = Message.from_dict(json.loads(json.dumps(reply.to_dict())))
    _, wire = to_anthropic_messages([Message.user("look"), stored])
    assert wire[1] == {"role": "assistant", "content": content}


def test_anthropic_thinking_keeps_its_place_when_blank_text_is_left_out() -> None:
    content = [THINKING, {"type": "text", "text": " "}, REDACTED]
    content += [{"type": "tool_use", "id": "t1", "name": "look", "input": {}}]
    (reply,) = from_anthropic_messages([{"role": "assistant", "content": content}])
    _, wire = to_anthropic_messages([Message.user("look"), reply])
    assert wire[1]["content"] == [THINKING, REDACTED, content[-1]]


def test_anthropic_thinking_is_not_sent_with_calls_told_as_text() -> None:
    content = [THINKING, {"type": "tool_use", "id": "t1", "name": "look", "input": {}}]
    (reply,) = from_anthropic_messages([{"role": "assistant", "content": content}])
    answer = Message.tool_result("t1", "found")
    _, wire = to_anthropic_messages(
        [Message.user("look"), reply, answer], tool_blocks=False
    )
    assert wire[1] == {
        "role": "assistant",
        "content": "[called tool look with {} (call t1)]",
    }


@pytest.mark.parametrize(
    "value", ["not json", '{"at": 0}', '[{"at": "0", "block": {}}]', '[{"at": 0}]']
)
def test_anthropic_thinking_metadata_that_is_not_blocks_is_refused(
    value: str,
) -> None:
    (reply,) = from_anthropic_messages(
        [{"role": "assistant", "content": [REDACTED, {"type": "text", "text": "x"}]}]
    )
    [key] = reply.metadata
    broken = Message.assistant("x", metadata={key: value})
    with pytest.raises(InvalidMessage, match=f"metadata\\[{key!r}\\]"):
        to_anthropic_messages([Message.user("look"), broken])


def test_anthropic_is_sent_no_blank_text_and_no_empty_reply() -> None:
    # A reply that said nothing (committed as it came) went out as
    # ``content: []``, and blank text as a blank block: Anthropic refuses
    # both, so every later call of the session failed.
    call = ToolCallPart(id="t1", name="look", arguments={})
    messages = [
        Message.system("rules"),
        Message.system(" "),
        Message.user("look it up"),
        Message.assistant("", tool_calls=[call]),
        Message.tool_result("t1", "found"),
        Message.assistant(""),
        Message(role=Role.ASSISTANT, parts=(TextPart(text="\n "),)),
        Message.user("and?"),
        Message(role=Role.ASSISTANT, parts=(TextPart(text=" "), TextPart(text="ok"))),
    ]
    system, wire = to_anthropic_messages(messages)
    assert system == [{"type": "text", "text": "rules"}]
    assert wire == [
        {"role": "user", "content": "look it up"},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "look", "input": {}}],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": "found"}
            ],
        },
        {"role": "user", "content": "and?"},
        {"role": "assistant", "content": "ok"},
    ]


def test_anthropic_merges_consecutive_results_only() -> None:
    messages = [
        Message.tool_result("t1", "a"),
        Message.tool_result("t2", "b", is_error=True),
        Message.user("next"),
        Message.tool_result("t3", "c"),
    ]
    system, wire = to_anthropic_messages(messages)
    assert system == []
    assert wire == [
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": "a"},
                {
                    "type": "tool_result",
                    "tool_use_id": "t2",
                    "content": "b",
                    "is_error": True,
                },
            ],
        },
        {"role": "user", "content": "next"},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "t3", "content": "c"}],
        },
    ]


def test_anthropic_system_prompts_are_text_only() -> None:
    message = Message(role=Role.SYSTEM, parts=[ImagePart(url="https://x.test/a")])
    with pytest.raises(InvalidMessage, match="text only"):
        to_anthropic_messages([message])


BAD_ANTHROPIC = {
    "system role": {"role": "system", "content": "x"},
    "unknown block": {"role": "assistant", "content": [{"type": "server_tool_use"}]},
    "file image": {
        "role": "user",
        "content": [{"type": "image", "source": {"type": "file", "file_id": "f"}}],
    },
    "content object": {"role": "user", "content": {"type": "text"}},
}


@pytest.mark.parametrize("data", BAD_ANTHROPIC.values(), ids=BAD_ANTHROPIC.keys())
def test_anthropic_rejects_what_it_cannot_read(data: dict[str, Any]) -> None:
    with pytest.raises(InvalidMessage):
        from_anthropic_messages([data])


def test_a_request_takes_the_brains_views_as_they_are_and_checks_the_rest() -> None:
    history = MessageLog([Message.user("hi")])
    joined = Joined(history, MessageLog([Message.assistant("ok")]))
    assert ModelRequest(messages=history).messages is history
    assert ModelRequest(messages=joined).messages is joined
    listed = [Message.user("hi")]
    assert ModelRequest(messages=listed).messages == tuple(listed)
    with pytest.raises(ConfigError) as caught:
        ModelRequest(messages=[Message.user("hi"), "hi"])  # type: ignore[list-item]
    assert caught.value.field == "messages[1]"
