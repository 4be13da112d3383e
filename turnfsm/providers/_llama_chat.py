"""The local server's prompt format for tools: pure text, no llama.cpp import.

The bundled Gemma 3 270M is a base model with no chat template, and
llama.cpp's ``gemma`` format drops the system prompt and the tools. The
``turnfsm-tools`` format (served by `turnfsm.providers._llama_serve`) keeps
both: Gemma's turn markers around every message, the system prompt first,
the tools listed after it, tool results as ``tool`` turns. With tools, a
reply is generated in two constrained steps: a grammar picks
``functions.NAME:`` (one of the tools) or ``message:``, then the arguments
are generated under the tool's JSON-schema grammar, so even a tiny base
model emits a valid call.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Final

__all__ = [
    "CHAT_FORMAT",
    "STOP",
    "call_prefix",
    "choice_grammar",
    "chosen_tool",
    "message_prefix",
    "render_prompt",
    "tool_names",
]

CHAT_FORMAT: Final = "turnfsm-tools"
"""The name the server knows the format by (``--chat_format``)."""

STOP: Final = "<end_of_turn>"
"""The end of a turn: generation stops there."""

_CALL: Final = "functions."
_MESSAGE: Final = "message:"


def _text(content: object) -> str:
    """A message's content as text: a string, or the text of its parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        return "".join(
            str(part.get("text", ""))
            for part in content
            if isinstance(part, Mapping) and part.get("type") == "text"
        )
    return ""


def _function(tool: Mapping[str, object]) -> Mapping[str, object]:
    function = tool.get("function")
    return function if isinstance(function, Mapping) else {}


def tool_names(tools: Sequence[Mapping[str, object]]) -> list[str]:
    """The names of OpenAI function tools, in order."""
    return [str(_function(tool).get("name", "")) for tool in tools]


def _tools_block(tools: Sequence[Mapping[str, object]]) -> str:
    lines = ["", "", "Tools you can call:"]
    for tool in tools:
        function = _function(tool)
        parameters = json.dumps(function.get("parameters", {}), sort_keys=True)
        lines.append(
            f"{_CALL}{function.get('name', '')}: {function.get('description', '')}"
            f" Arguments: {parameters}"
        )
    # The worked example matters: without it the base model answers in words.
    example = tool_names(tools)[0]
    lines += [
        "",
        f"Call a tool when you need its result: answer `{_CALL}NAME:` then its "
        f"JSON arguments on the next line, e.g.\n{_CALL}{example}:\n{{...}}\n"
        f"When you have what you need, answer `{_MESSAGE}` then your answer.",
    ]
    return "\n".join(lines)


def _turn(role: str, text: str) -> str:
    return f"<start_of_turn>{role}\n{text}{STOP}\n"


def render_prompt(
    messages: Sequence[Mapping[str, object]],
    tools: Sequence[Mapping[str, object]] | None,
) -> str:
    """Return the prompt for OpenAI chat `messages`, ready for the model's turn.

    Every message is kept: the system prompt (with `tools` listed after it;
    a system turn is added for them when there is none), user turns, the
    assistant's text and tool calls (as ``message:`` and ``functions.NAME:``
    lines when tools are offered), and tool results as ``tool`` turns. The
    prompt ends with the model's open turn.
    """
    block = _tools_block(tools) if tools else ""
    out: list[str] = []
    if block and not any(m.get("role") == "system" for m in messages):
        out.append(_turn("system", block.lstrip()))
    for message in messages:
        role = str(message.get("role", "user"))
        text = _text(message.get("content"))
        if role == "system":
            out.append(_turn("system", text + block))
        elif role == "assistant":
            out.append(_turn("model", _assistant(message, text, bool(tools))))
        elif role == "tool":
            call_id = message.get("tool_call_id", "")
            out.append(_turn("tool", f"[result of {call_id}]\n{text}"))
        else:
            out.append(_turn("user", text))
    return "".join(out) + "<start_of_turn>model\n"


def _assistant(message: Mapping[str, object], text: str, with_tools: bool) -> str:
    parts = [f"{_MESSAGE}\n{text}" if with_tools else text] if text else []
    calls = message.get("tool_calls")
    for call in calls if isinstance(calls, Sequence) else ():
        function = _function(call) if isinstance(call, Mapping) else {}
        parts.append(
            f"{_CALL}{function.get('name', '')}:\n{function.get('arguments', '{}')}"
        )
    return "\n".join(parts)


def choice_grammar(names: Sequence[str], *, allow_message: bool) -> str:
    """A GBNF grammar that picks a tool (``functions.NAME:``) or ``message:``."""
    options = [json.dumps(f"{_CALL}{name}:") for name in names]
    if allow_message:
        options.append(json.dumps(_MESSAGE))
    return f"root ::= {' | '.join(options)}\n"


def chosen_tool(text: str) -> str | None:
    """The tool a choice names (``functions.NAME:``), or None for a message."""
    if text.startswith(_CALL) and text.endswith(":"):
        return text[len(_CALL) : -1]
    return None


def call_prefix(name: str) -> str:
    """What the prompt gets before a call's arguments are generated."""
    return f"{_CALL}{name}:\n"


def message_prefix() -> str:
    """What the prompt gets before a text answer is generated."""
    return f"{_MESSAGE}\n"
