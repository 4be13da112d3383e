"""turnfsm messages to and from Anthropic Messages API messages (pure functions).

The mapping:

- system messages: text blocks of the ``system`` parameter;
- user / assistant with one text part: ``content: "text"``;
- other user / assistant parts: ``content: [blocks]`` in order, ``text``,
  ``image`` and ``tool_use`` blocks (a tool call's ``input`` is its dict);
- an image with a base64 ``data:`` URL: ``source.type: "base64"``; with any
  other URL: ``source.type: "url"``;
- consecutive tool messages: one ``user`` message of ``tool_result`` blocks,
  ``is_error`` kept (written only when true);
- in a request that defines no tools (`tool_blocks` False), which Anthropic
  refuses tool blocks in, each tool call is a line of text in its assistant
  message and each result a user message of text;
- blank text (empty, or white space only) is left out of the system blocks
  and of an assistant message, and an assistant message left with nothing
  is left out: Anthropic refuses both (a model may end its turn saying
  nothing, and that reply is committed as it was).

Anthropic takes the system prompt apart from the messages, so system messages
are hoisted into the ``system`` blocks, in order, wherever they stood.

**Round trip.** `from_anthropic_messages(*to_anthropic_messages(m))` equals
`m` (roles and parts; ids are not carried) when `m` has at most one system
message, first, with text parts only; each tool message holds one result; no
system or assistant text is blank; and an image's `media_type` is the one its
``data:`` URL names (None for other URLs). Other conversations come back in
that normal form.

**Thinking.** A reply's ``thinking`` and ``redacted_thinking`` blocks are
no parts: they are kept, unchanged and with their places among the parts,
in the message's metadata (`THINKING`), and sent back where they stood.
Anthropic refuses the results of a reply's tool calls unless its thinking
comes back with them. Calls told as text (`tool_blocks` False) go without.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Final

from turnfsm.errors import InvalidMessage
from turnfsm.messages import (
    SENT,
    ImagePart,
    Message,
    Part,
    Role,
    TextPart,
    ToolCallPart,
    ToolResultPart,
)
from turnfsm.providers._convert_openai import (
    arguments_from_json,
    arguments_of,
    split_data_url,
)
from turnfsm.providers._protocol import ToolSchema

__all__ = ["from_anthropic_messages", "to_anthropic_messages", "to_anthropic_tools"]

_THOUGHT: Final = frozenset({"thinking", "redacted_thinking"})

THINKING: Final = f"{SENT}anthropic.thinking"
"""The metadata key of a reply's thinking blocks.

Its value is JSON text: a list of ``{"at": n, "block": {...}}``, each block
as the API sent it and ``n`` the number of the message's parts before it.
Its key starts with `SENT`: the token counters price it, as it is sent.
`keep_parts` moves the places with the parts it keeps.
"""


def to_anthropic_tools(tools: Iterable[ToolSchema]) -> list[dict[str, object]]:
    """Return Anthropic tool definitions for `tools`."""
    return [
        {
            "name": tool.name,
            "description": tool.description,
            "input_schema": dict(tool.parameters),
        }
        for tool in tools
    ]


def to_anthropic_messages(
    messages: Iterable[Message], *, tool_blocks: bool = True
) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    """Return `messages` as Anthropic ``(system_blocks, messages)``.

    Args:
        messages: the conversation.
        tool_blocks: whether tool calls and results go as ``tool_use`` and
            ``tool_result`` blocks. Anthropic refuses them in a request
            that defines no tools (an agent without tools continuing a
            conversation that used some, a hand-over to another agent):
            False sends each as a line of text saying what was called and
            what came back.

    Returns:
        The text blocks of every system message (for the ``system``
        parameter) and the user and assistant messages.

    Raises:
        InvalidMessage: a system message holds an image.
    """
    system: list[dict[str, object]] = []
    out: list[dict[str, object]] = []
    results: list[dict[str, object]] | None = None  # the open tool-result turn
    if not tool_blocks:
        messages = [_told(message) for message in messages]
    for message in messages:
        match message.role:
            case Role.SYSTEM:
                system.extend(
                    _system_block(part) for part in message.parts if _said(part)
                )
            case Role.TOOL:
                blocks = [_result_block(part) for part in message.tool_results]
                if results is None:
                    results = blocks
                    out.append({"role": "user", "content": results})
                else:
                    results.extend(blocks)
            case Role.USER:
                results = None
                out.append({"role": "user", "content": _content(message.parts)})
            case Role.ASSISTANT:
                # Anthropic refuses a blank text block, and a message with
                # no content: a reply that said nothing (a model may end its
                # turn so) is left out, not sent to be refused on every
                # later call.
                if not any(_said(part) for part in message.parts):
                    continue
                results = None
                content = _reply_content(message, thinking=tool_blocks)
                out.append({"role": "assistant", "content": content})
    return system, out


def _reply_content(
    message: Message, *, thinking: bool
) -> str | list[dict[str, object]]:
    """An assistant message's content: its parts said, its `thinking` in place."""
    thoughts = _thoughts(message) if thinking else []
    if not thoughts:
        return _content(tuple(part for part in message.parts if _said(part)))
    blocks: list[dict[str, object]] = []
    for at, part in enumerate((*message.parts, None)):
        blocks.extend(block for n, block in thoughts if n == at)
        if part is not None and _said(part):
            blocks.append(_block(part))
    # A place past the parts (a message changed since) is at the end.
    blocks.extend(block for n, block in thoughts if n > len(message.parts))
    return blocks


def _thoughts(message: Message) -> list[tuple[int, dict[str, object]]]:
    """Return the thinking blocks `message` keeps, each with its place.

    Raises:
        InvalidMessage: its `THINKING` metadata is not such a list.
    """
    value = message.metadata.get(THINKING)
    if value is None:
        return []
    expected = (
        'JSON text of a list of {"at": <parts before it>, "block": <a thinking '
        "or redacted_thinking block>}, as a reply from Anthropic keeps them"
    )
    try:
        items = json.loads(value) if isinstance(value, str) else None
    except ValueError:
        items = None
    if not isinstance(items, list):
        raise InvalidMessage(f"metadata[{THINKING!r}]", value, expected)
    thoughts: list[tuple[int, dict[str, object]]] = []
    for item in items:
        at = item.get("at") if isinstance(item, dict) else None
        block = item.get("block") if isinstance(item, dict) else None
        if (
            not isinstance(at, int)
            or isinstance(at, bool)
            or at < 0
            or not isinstance(block, dict)
            or block.get("type") not in _THOUGHT
        ):
            raise InvalidMessage(f"metadata[{THINKING!r}]", value, expected)
        thoughts.append((at, block))
    return thoughts


def _told(message: Message) -> Message:
    """`message` with its tool calls and results as lines of text."""
    if message.role is Role.TOOL:
        lines = [
            f"[{'error from' if r.is_error else 'result of'} tool call "
            f"{r.call_id}: {r.content}]"
            for r in message.tool_results
        ]
        return Message.user("\n".join(lines), id=message.id)
    if not message.tool_calls:
        return message
    parts = [
        TextPart(text=f"[called tool {p.name} with {p.arguments_json()} (call {p.id})]")
        if isinstance(p, ToolCallPart)
        else p
        for p in message.parts
    ]
    return Message(role=message.role, parts=parts, id=message.id)


def _said(part: Part) -> bool:
    """Whether `part` holds something: no blank text."""
    return not isinstance(part, TextPart) or bool(part.text.strip())


def _system_block(part: Part) -> dict[str, object]:
    if not isinstance(part, TextPart):
        raise InvalidMessage("parts", part, "Anthropic system prompts are text only")
    return {"type": "text", "text": part.text}


def _result_block(part: ToolResultPart) -> dict[str, object]:
    block: dict[str, object] = {
        "type": "tool_result",
        "tool_use_id": part.call_id,
        "content": part.content,
    }
    if part.is_error:
        block["is_error"] = True
    return block


def _content(parts: tuple[Part, ...]) -> str | list[dict[str, object]]:
    if len(parts) == 1 and isinstance(parts[0], TextPart):
        return parts[0].text
    return [_block(part) for part in parts]


def _block(part: Part) -> dict[str, object]:
    match part:
        case TextPart(text=text):
            return {"type": "text", "text": text}
        case ImagePart(url=url):
            data = split_data_url(url)
            source: dict[str, object] = (
                {"type": "base64", "media_type": data[0], "data": data[1]}
                if data
                else {"type": "url", "url": url}
            )
            return {"type": "image", "source": source}
        case ToolCallPart(id=id_, name=name, arguments=arguments):
            return {
                "type": "tool_use",
                "id": id_,
                "name": name,
                "input": dict(arguments),
            }
        case _:  # the Message validators keep results out of user/assistant
            raise InvalidMessage("parts", part, "not allowed in this message")


def from_anthropic_messages(
    messages: Iterable[Mapping[str, object]],
    *,
    system: str | Iterable[Mapping[str, object]] | None = None,
) -> list[Message]:
    """Build turnfsm messages from Anthropic messages and system prompt.

    A user message's ``tool_result`` blocks become one tool message each;
    its other blocks become user messages between them, in order.

    Args:
        messages: Anthropic ``user`` and ``assistant`` messages.
        system: the ``system`` parameter (a string or text blocks); it
            becomes one leading system message.

    Raises:
        InvalidMessage: an unknown role or block type, or a missing field.
    """
    out: list[Message] = []
    if isinstance(system, str):
        out.append(Message.system(system))
    elif system is not None:
        texts = [TextPart(text=_str(block, "text")) for block in system]
        if texts:
            out.append(Message(role=Role.SYSTEM, parts=texts))
    for message in messages:
        role = message.get("role")
        if role not in ("user", "assistant"):
            raise InvalidMessage("role", role, "expected user or assistant")
        out.extend(_messages(Role(role), message.get("content")))
    return out


def _messages(role: Role, content: object) -> list[Message]:
    if isinstance(content, str):
        return [Message(role=role, parts=content)]
    if not isinstance(content, list):
        raise InvalidMessage("content", content, "expected a string or a list")
    groups: list[tuple[Role, list[Part]]] = []
    parts: list[Part] | None = None  # the open run of non-result blocks
    thoughts: list[dict[str, object]] = []  # a reply's thinking, placed
    for block in content:
        if not isinstance(block, Mapping):
            raise InvalidMessage("content", block, "expected a content block")
        kind = block.get("type")
        if kind in _THOUGHT:
            if role is Role.ASSISTANT:
                thoughts.append({"at": len(parts or ()), "block": dict(block)})
            continue
        if kind == "tool_result" and role is Role.USER:
            parts = None
            groups.append((Role.TOOL, [_result(block)]))
            continue
        if parts is None:
            parts = []
            groups.append((role, parts))
        parts.append(_part(block))
    if not groups:  # no blocks (or only thinking): still one message
        groups.append((role, []))
    if thoughts:  # an assistant message is one group
        metadata = {THINKING: json.dumps(thoughts, ensure_ascii=False)}
        return [Message(role=role, parts=groups[0][1], metadata=metadata)]
    return [Message(role=r, parts=p) for r, p in groups]


def _part(block: Mapping[str, object]) -> Part:
    kind = block.get("type")
    if kind == "text":
        return TextPart(text=_str(block, "text"))
    if kind == "tool_use":
        return ToolCallPart(
            id=_str(block, "id"),
            name=_str(block, "name"),
            arguments=_input(block.get("input")),
        )
    if kind == "image":
        source = block.get("source")
        if not isinstance(source, Mapping):
            raise InvalidMessage("image.source", source, "expected an object")
        if source.get("type") == "base64":
            media_type = _str(source, "media_type")
            url = f"data:{media_type};base64,{_str(source, 'data')}"
            return ImagePart(url=url, media_type=media_type)
        if source.get("type") == "url":
            return ImagePart(url=_str(source, "url"))
        raise InvalidMessage("image.source.type", source.get("type"), "base64 or url")
    raise InvalidMessage(
        "content.type", kind, "expected text, image, tool_use or tool_result"
    )


def _input(value: object) -> Mapping[str, object]:
    """A ``tool_use`` block's input as a call's arguments.

    An object, as Anthropic sends it; none (left out, or null: a call of a
    tool with no parameters, from a compatible server) is no arguments, and
    text is read as the JSON of an OpenAI call's arguments is.
    """
    if value is None:
        return {}
    if isinstance(value, str):
        return arguments_from_json(value)
    return arguments_of(value)


def _result(block: Mapping[str, object]) -> ToolResultPart:
    raw = block.get("content")
    if raw is None:
        content = ""
    elif isinstance(raw, str):
        content = raw
    elif isinstance(raw, list):
        content = "\n".join(
            _str(item, "text")
            for item in raw
            if isinstance(item, Mapping) and item.get("type") == "text"
        )
    else:
        raise InvalidMessage("tool_result.content", raw, "expected text or blocks")
    return ToolResultPart(
        call_id=_str(block, "tool_use_id"),
        content=content,
        is_error=bool(block.get("is_error", False)),
    )


def _str(data: Mapping[str, object], key: str) -> str:
    value = data.get(key)
    if not isinstance(value, str):
        raise InvalidMessage(key, value, "expected a string")
    return value
