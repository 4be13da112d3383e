"""turnfsm messages to and from OpenAI chat-completions messages (pure functions).

The mapping, one message at a time:

- system / user with one text part: ``content: "text"``; with other parts:
  ``content: [...]`` of ``text`` and ``image_url`` parts;
- assistant: its text as ``content`` (None when it has none), its tool calls
  as ``tool_calls``, each call's arguments as a JSON string;
- tool: one ``role: "tool"`` message per result, with ``tool_call_id``;
- `ToolResultPart.is_error`: an ``"[error] "`` prefix on ``content``.

**is_error.** OpenAI's tool message has no error field, so an error result's
content gets the prefix `ERROR_PREFIX` (``"[error] "``), which also tells the
model the call failed. To keep the mapping lossless, a successful result whose
content already starts with ``"[error] "`` (after any number of backslashes)
gets one more leading backslash, which the reverse direction removes.

**Round trip.** `from_openai_messages(to_openai_messages(m))` equals `m` (roles
and parts; ids are not carried) for conversations OpenAI can express: an
assistant's text parts come before its tool calls, a tool message holds one
result, and an image's `media_type` is the one its ``data:`` URL names (None
for other URLs). Other conversations come back in that normal form.

**Replies.** Tool-call arguments that are not a JSON object (a model's
malformed output) become ``{"_raw": "<the text>"}`` instead of an error.
"""

from __future__ import annotations

import json
import re
import reprlib
from collections.abc import Iterable, Mapping
from typing import Final, cast

from turnfsm._checks import json_fault
from turnfsm._json import strict_loads
from turnfsm.errors import InvalidMessage
from turnfsm.messages import (
    ImagePart,
    JSONValue,
    Message,
    Part,
    Role,
    TextPart,
    ToolCallPart,
    ToolResultPart,
)
from turnfsm.providers._protocol import ToolSchema

__all__ = [
    "ERROR_PREFIX",
    "arguments_from_json",
    "arguments_of",
    "decode_tool_content",
    "encode_tool_content",
    "from_openai_messages",
    "split_data_url",
    "to_openai_messages",
    "to_openai_tools",
]

ERROR_PREFIX: Final = "[error] "
"""The prefix that marks an error tool result in an OpenAI tool message."""

_ESCAPED: Final = re.compile(r"\\*" + re.escape(ERROR_PREFIX))
_DATA_URL: Final = re.compile(r"data:([^;,]+);base64,(.*)", re.DOTALL)


def split_data_url(url: str) -> tuple[str, str] | None:
    """Return ``(media_type, base64_data)`` of a base64 ``data:`` URL, else None."""
    match = _DATA_URL.fullmatch(url)
    return (match[1], match[2]) if match else None


def encode_tool_content(content: str, *, is_error: bool) -> str:
    """Return a tool result's content with its `is_error` flag folded in."""
    if is_error:
        return ERROR_PREFIX + content
    if _ESCAPED.match(content):
        return "\\" + content
    return content


def decode_tool_content(text: str) -> tuple[str, bool]:
    """Reverse `encode_tool_content`: return ``(content, is_error)``."""
    if text.startswith(ERROR_PREFIX):
        return text[len(ERROR_PREFIX) :], True
    if text.startswith("\\") and _ESCAPED.match(text):
        return text[1:], False
    return text, False


def arguments_from_json(text: str) -> dict[str, JSONValue]:
    """Parse a model's tool-call arguments; keep malformed text as ``_raw``.

    Args:
        text: the JSON text the model wrote.

    Returns:
        The JSON object; ``{}`` for blank text or ``null`` (a call of a
        tool with no parameters, as some servers send it); ``{"_raw": text}``
        when the text is not a JSON object (``NaN`` and ``Infinity``, which
        Python reads, are no JSON) or one nested past what a call holds.
    """
    if not text.strip():
        return {}
    try:
        value = strict_loads(text)
    except (ValueError, RecursionError):
        return {"_raw": text}
    if value is None:
        return {}
    if isinstance(value, dict) and json_fault(value, finite=True) is None:
        return cast(dict[str, JSONValue], value)
    return {"_raw": text}  # not an object, or one nested past what a call holds


def arguments_of(value: object) -> dict[str, JSONValue]:
    """A model's tool-call arguments given as a value (not text), kept as ``_raw``.

    The object itself when a call can hold it; else ``{"_raw": "<its JSON>"}``
    (one that is no object, holds NaN or an infinity, or is nested past what
    a call holds), for the model to be told its arguments were no JSON object.
    """
    if isinstance(value, Mapping) and json_fault(value, finite=True) is None:
        return cast(dict[str, JSONValue], dict(value))
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        text = reprlib.repr(value)
    return {"_raw": text}


def to_openai_tools(tools: Iterable[ToolSchema]) -> list[dict[str, object]]:
    """Return OpenAI function-tool definitions for `tools`."""
    return [
        {
            "type": "function",
            "function": {
                "name": tool.name,
                "description": tool.description,
                "parameters": dict(tool.parameters),
            },
        }
        for tool in tools
    ]


def to_openai_messages(messages: Iterable[Message]) -> list[dict[str, object]]:
    """Return `messages` as OpenAI chat-completions messages.

    Args:
        messages: the conversation.

    Returns:
        JSON-ready message dicts; a tool message with several results becomes
        several ``role: "tool"`` messages.
    """
    out: list[dict[str, object]] = []
    for message in messages:
        match message.role:
            case Role.SYSTEM | Role.USER:
                content = _content(message.parts)
                out.append({"role": message.role.value, "content": content})
            case Role.ASSISTANT:
                out.append(_assistant(message.parts))
            case Role.TOOL:
                out.extend(
                    {
                        "role": "tool",
                        "tool_call_id": part.call_id,
                        "content": encode_tool_content(
                            part.content, is_error=part.is_error
                        ),
                    }
                    for part in message.tool_results
                )
    return out


def _content(parts: Iterable[Part]) -> str | list[dict[str, object]]:
    items = list(parts)
    if len(items) == 1 and isinstance(items[0], TextPart):
        return items[0].text
    return [_content_part(part) for part in items]


def _content_part(part: Part) -> dict[str, object]:
    match part:
        case TextPart(text=text):
            return {"type": "text", "text": text}
        case ImagePart(url=url):
            return {"type": "image_url", "image_url": {"url": url}}
        case _:  # the Message validators keep calls and results out of here
            raise InvalidMessage("parts", part, "not allowed in this message")


def _assistant(parts: tuple[Part, ...]) -> dict[str, object]:
    calls = [p for p in parts if isinstance(p, ToolCallPart)]
    rest = [p for p in parts if not isinstance(p, ToolCallPart)]
    out: dict[str, object] = {
        "role": "assistant",
        "content": _content(rest) if rest else None,
    }
    if calls:
        out["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {
                    "name": call.name,
                    "arguments": json.dumps(
                        dict(call.arguments), ensure_ascii=False, separators=(",", ":")
                    ),
                },
            }
            for call in calls
        ]
    return out


def from_openai_messages(data: Iterable[Mapping[str, object]]) -> list[Message]:
    """Build turnfsm messages from OpenAI chat-completions messages.

    Accepts what `to_openai_messages` writes and what OpenAI-compatible
    servers reply: ``developer`` reads as system, ``refusal`` as text, and
    malformed tool-call arguments as ``{"_raw": text}``.

    Raises:
        InvalidMessage: a message has an unknown role, a missing field or an
            unsupported content part (audio, files).
    """
    return [_message(item) for item in data]


def _message(data: Mapping[str, object]) -> Message:
    role = data.get("role")
    match role:
        case "system" | "developer":
            return Message(role=Role.SYSTEM, parts=_parts(data.get("content")))
        case "user":
            return Message(role=Role.USER, parts=_parts(data.get("content")))
        case "assistant":
            parts = _parts(data.get("content"))
            refusal = data.get("refusal")
            if isinstance(refusal, str) and refusal:
                parts.append(TextPart(text=refusal))
            parts.extend(_tool_call(call) for call in _list(data, "tool_calls"))
            return Message(role=Role.ASSISTANT, parts=parts)
        case "tool":
            raw = data.get("content")
            text = raw if isinstance(raw, str) else "".join(_texts(raw))
            content, is_error = decode_tool_content(text)
            part = ToolResultPart(
                call_id=_str(data, "tool_call_id"), content=content, is_error=is_error
            )
            return Message(role=Role.TOOL, parts=(part,))
        case _:
            raise InvalidMessage(
                "role", role, "expected system, developer, user, assistant or tool"
            )


def _parts(content: object) -> list[Part]:
    if content is None:
        return []
    if isinstance(content, str):
        return [TextPart(text=content)]
    if not isinstance(content, list):
        raise InvalidMessage("content", content, "expected a string or a list")
    return [_part(item) for item in content]


def _part(item: object) -> Part:
    if not isinstance(item, Mapping):
        raise InvalidMessage("content", item, "expected a content part object")
    kind = item.get("type")
    if kind == "text":
        return TextPart(text=_str(item, "text"))
    if kind == "refusal":
        return TextPart(text=_str(item, "refusal"))
    if kind == "image_url":
        image = item.get("image_url")
        url = _str(image, "url") if isinstance(image, Mapping) else image
        if not isinstance(url, str):
            raise InvalidMessage("image_url", image, "expected a URL")
        parsed = split_data_url(url)
        return ImagePart(url=url, media_type=parsed[0] if parsed else None)
    raise InvalidMessage("content.type", kind, "expected text, refusal or image_url")


def _texts(content: object) -> list[str]:
    return [p.text for p in _parts(content) if isinstance(p, TextPart)]


def _tool_call(item: object) -> ToolCallPart:
    if not isinstance(item, Mapping) or item.get("type", "function") != "function":
        raise InvalidMessage("tool_calls", item, "expected a function tool call")
    function = item.get("function")
    if not isinstance(function, Mapping):
        raise InvalidMessage("tool_calls.function", function, "expected an object")
    raw = function.get("arguments")
    if isinstance(raw, str):
        arguments = arguments_from_json(raw)
    elif raw is None:
        arguments = {}
    else:  # some servers send an object, not a string
        arguments = arguments_of(raw)
    return ToolCallPart(
        id=_str(item, "id"), name=_str(function, "name"), arguments=arguments
    )


def _list(data: Mapping[str, object], key: str) -> list[object]:
    value = data.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidMessage(key, value, "expected a list")
    return value


def _str(data: Mapping[str, object], key: str) -> str:
    value = data.get(key)
    if not isinstance(value, str):
        raise InvalidMessage(key, value, "expected a string")
    return value
