"""The ``turnfsm-tools`` prompt format: every message kept, choices as grammars.

Pure text: the format's rendering and grammars are checked here without
llama.cpp; tests/integration/test_local_demo.py runs them on the real server.
"""

from __future__ import annotations

import json

import pytest

from turnfsm.messages import Message, ToolCallPart
from turnfsm.providers import ToolSchema
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
OTHER = ToolSchema(name="other", description="Another tool.", parameters={})


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


class _Llama:
    """What `tool_chat_handler` asks of llama.cpp: each completion's prompt."""

    model_path = "m.gguf"

    def __init__(self) -> None:
        self.prompts: list[str] = []

    def create_completion(self, prompt: str, **options: object) -> dict[str, object]:
        self.prompts.append(prompt)
        # The arguments after a call's prefix, else the choice of read_log.
        called = prompt.endswith(call_prefix("read_log"))
        text = "{}" if called else "functions.read_log:"
        return {
            "choices": [{"text": text, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1},
        }


@pytest.mark.parametrize(
    ("tools", "tool_choice", "completions"),
    [
        # One tool and a call required: the only choice, made without the
        # model (it cost a grammar-constrained completion of ~8 tokens a turn).
        (TOOLS, "required", 1),
        (TOOLS, "auto", 2),
        (TOOLS + to_openai_tools([OTHER]), "required", 2),
    ],
)
def test_a_call_is_chosen_by_the_model_only_when_there_is_a_choice(
    monkeypatch: pytest.MonkeyPatch,
    tools: list[dict[str, object]],
    tool_choice: str,
    completions: int,
) -> None:
    from turnfsm.providers import _llama_serve

    monkeypatch.setattr(_llama_serve, "_grammar", lambda text: text)
    monkeypatch.setattr(_llama_serve, "_schema_grammar", lambda schema: schema)
    llama = _Llama()
    reply = _llama_serve.tool_chat_handler(
        llama, _conversation()[:2], tools=tools, tool_choice=tool_choice
    )
    call = reply["choices"][0]["message"]["tool_calls"][0]["function"]
    assert call == {"name": "read_log", "arguments": "{}"}
    assert len(llama.prompts) == completions
    assert llama.prompts[-1].endswith(call_prefix("read_log"))


class _Cut(_Llama):
    """A model whose reply its budget (or the window) cuts off; choices cost 2."""

    def __init__(self, choice: str) -> None:
        super().__init__()
        self.choice = choice

    def create_completion(self, prompt: str, **options: object) -> dict[str, object]:
        self.prompts.append(prompt)
        if options.get("max_tokens") == 16:  # the choice: a call, or a message
            text, tokens, finish = self.choice, 2, "stop"
        elif prompt.endswith(call_prefix("read_log")):
            text, tokens, finish = '{"path": "/var/lo', 6, "length"
        else:
            text, tokens, finish = "The log say", 6, "length"
        return {
            "choices": [{"text": text, "finish_reason": finish}],
            "usage": {"prompt_tokens": 50, "completion_tokens": tokens},
        }


@pytest.mark.parametrize(
    "choice", ["functions.read_log:", "message"], ids=["call", "text"]
)
def test_a_reply_cut_off_says_so_and_counts_only_its_own_tokens(
    monkeypatch: pytest.MonkeyPatch, choice: str
) -> None:
    # A call whose arguments broke off said "tool_calls", and the choice's
    # tokens were counted as the reply's: either hid a cut at the window.
    from turnfsm.providers import _llama_serve

    monkeypatch.setattr(_llama_serve, "_grammar", lambda text: text)
    monkeypatch.setattr(_llama_serve, "_schema_grammar", lambda schema: schema)
    llama = _Cut(choice)
    reply = _llama_serve.tool_chat_handler(
        llama, _conversation()[:2], tools=TOOLS, tool_choice="auto", max_tokens=6
    )
    assert len(llama.prompts) == 2  # the choice, then the reply
    assert reply["choices"][0]["finish_reason"] == "length"
    assert reply["usage"]["completion_tokens"] == 6
