"""The ``turnfsm-tools`` prompt format: every message kept, choices as grammars.

Pure text: the format's rendering and grammars are checked here without
llama.cpp; tests/integration/test_local_demo.py runs them on the real server.
"""

from __future__ import annotations

import json

import pytest

from turnfsm.messages import Message, ToolCallPart
from turnfsm.providers import ToolSchema, _llama_serve
from turnfsm.providers._convert_openai import to_openai_messages, to_openai_tools
from turnfsm.providers._llama_chat import (
    STOP,
    call_prefix,
    choice_grammar,
    chosen_tool,
    message_prefix,
    render_prompt,
    tool_names,
)

READ_LOG = ToolSchema(
    name="read_log",
    description="Read a log file.",
    parameters={
        "type": "object",
        "properties": {"name": {"enum": ["app.log", "db.log"]}},
        "required": ["name"],
    },
)
TOOLS = to_openai_tools([READ_LOG])


def _conversation() -> list[dict[str, object]]:
    call = ToolCallPart(id="c1", name="read_log", arguments={"name": "app.log"})
    return [
        {"role": "system", "content": "You are an SRE assistant."},
        *to_openai_messages(
            [
                Message.user("Audit app.log."),
                Message.assistant(tool_calls=[call]),
                Message.tool_result("c1", "2026 ERROR app.log boom"),
                Message.assistant("One ERROR line."),
            ]
        ),
    ]


def test_every_message_reaches_the_prompt_in_order() -> None:
    prompt = render_prompt(_conversation(), TOOLS)
    expected = [
        "<start_of_turn>system\nYou are an SRE assistant.",
        "functions.read_log: Read a log file. Arguments: ",
        "<start_of_turn>user\nAudit app.log." + STOP,
        '<start_of_turn>model\nfunctions.read_log:\n{"name":"app.log"}' + STOP,
        "<start_of_turn>tool\n[result of c1]\n2026 ERROR app.log boom" + STOP,
        "<start_of_turn>model\nmessage:\nOne ERROR line." + STOP,
    ]
    positions = [prompt.index(part) for part in expected]
    assert positions == sorted(positions)
    assert prompt.endswith("<start_of_turn>model\n")
    # The tool's schema is listed, so the model sees the log names.
    schema = json.dumps(READ_LOG.parameters, sort_keys=True)
    assert f"Arguments: {schema}" in prompt


def test_without_tools_the_prompt_is_plain_turns() -> None:
    prompt = render_prompt(_conversation(), None)
    assert "functions.read_log: Read" not in prompt
    assert "<start_of_turn>model\nOne ERROR line." + STOP in prompt
    assert "<start_of_turn>system\nYou are an SRE assistant." + STOP in prompt


def test_tools_without_a_system_prompt_get_a_system_turn() -> None:
    prompt = render_prompt([{"role": "user", "content": "hi"}], TOOLS)
    assert prompt.startswith("<start_of_turn>system\nTools you can call:")
    assert prompt.index("Tools you can call") < prompt.index("<start_of_turn>user")


def test_content_parts_are_joined_as_text() -> None:
    parts = [
        {"type": "text", "text": "a"},
        {"type": "image_url"},
        {"type": "text", "text": "b"},
    ]
    prompt = render_prompt([{"role": "user", "content": parts}], None)
    assert "<start_of_turn>user\nab" + STOP in prompt


@pytest.mark.parametrize(
    ("allow_message", "expected"),
    [
        (True, 'root ::= "functions.read_log:" | "functions.grep:" | "message:"\n'),
        (False, 'root ::= "functions.read_log:" | "functions.grep:"\n'),
    ],
)
def test_the_choice_grammar_lists_the_tools(allow_message: bool, expected: str) -> None:
    assert choice_grammar(["read_log", "grep"], allow_message=allow_message) == expected


@pytest.mark.parametrize(
    ("text", "tool"),
    [("functions.read_log:", "read_log"), ("message:", None), ("functions.x", None)],
)
def test_the_chosen_tool_is_read_back(text: str, tool: str | None) -> None:
    assert chosen_tool(text) == tool


def test_prefixes_match_what_the_prompt_shows_for_past_replies() -> None:
    prompt = render_prompt(_conversation(), TOOLS)
    assert call_prefix("read_log") in prompt
    assert message_prefix() in prompt
    assert tool_names(TOOLS) == ["read_log"]


# -- the handler, on a stand-in for llama.cpp --------------------------------

LOOKUP = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Look a city up.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


class _Llama:
    """Answers each completion from a script: (text, finish_reason)."""

    model_path = "gemma.gguf"

    def __init__(self, *outputs: tuple[str, str]) -> None:
        self.outputs = list(outputs)

    def create_completion(self, **_options: object) -> dict[str, object]:
        text, finish = self.outputs.pop(0)
        return {
            "choices": [{"text": text, "finish_reason": finish}],
            "usage": {"prompt_tokens": 50, "completion_tokens": 5},
        }


@pytest.fixture
def no_grammars(monkeypatch: pytest.MonkeyPatch) -> None:
    # Compiling a grammar would load llama.cpp into the test process.
    monkeypatch.setattr(_llama_serve, "_grammar", lambda text: text)
    monkeypatch.setattr(_llama_serve, "_schema_grammar", lambda schema: schema)


ASKED_AND_ANSWERED = [
    {"role": "user", "content": "Population of Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "lookup", "arguments": '{"city": "Paris"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "2,100,000"},
]


@pytest.mark.usefixtures("no_grammars")
def test_a_call_already_answered_becomes_a_text_answer() -> None:
    llama = _Llama(
        ("functions.lookup:", "stop"),
        ('{ "city":"Paris" }', "stop"),  # the same call, written otherwise
        ("About two million.", "stop"),
    )
    out = _llama_serve.tool_chat_handler(
        llama, ASKED_AND_ANSWERED, tools=[LOOKUP], tool_choice="auto"
    )
    [choice] = out["choices"]
    assert choice["message"] == {"role": "assistant", "content": "About two million."}
    assert choice["finish_reason"] == "stop"
    assert out["usage"]["completion_tokens"] == 15  # every token made counts


@pytest.mark.usefixtures("no_grammars")
def test_a_new_call_and_a_required_one_are_made() -> None:
    new = _Llama(("functions.lookup:", "stop"), ('{"city": "Rome"}', "stop"))
    out = _llama_serve.tool_chat_handler(
        new, ASKED_AND_ANSWERED, tools=[LOOKUP], tool_choice="auto"
    )
    assert out["choices"][0]["finish_reason"] == "tool_calls"
    again = _Llama(("functions.lookup:", "stop"), ('{"city": "Paris"}', "stop"))
    out = _llama_serve.tool_chat_handler(
        again, ASKED_AND_ANSWERED, tools=[LOOKUP], tool_choice="required"
    )
    [call] = out["choices"][0]["message"]["tool_calls"]
    assert call["function"]["arguments"] == '{"city": "Paris"}'


@pytest.mark.usefixtures("no_grammars")
def test_arguments_cut_off_by_max_tokens_finish_as_length() -> None:
    llama = _Llama(("functions.lookup:", "stop"), ('{"city": "Par', "length"))
    out = _llama_serve.tool_chat_handler(
        llama, ASKED_AND_ANSWERED[:1], tools=[LOOKUP], tool_choice="auto", max_tokens=4
    )
    assert out["choices"][0]["finish_reason"] == "length"
