"""How counters see a message: its parts flattened to text, and fixed costs.

Every shipped counter measures the same pieces of a message: the text of its
text parts, each tool call's name and compact JSON arguments, each tool
result's content, a fixed cost per image, and the metadata a model client
sends with it (`Message.sent_texts`, e.g. a reply's thinking). This module
renders those pieces once, so the counters differ only in how they price them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final

import attrs

from turnfsm._json import compact_encoder
from turnfsm.errors import ConfigError
from turnfsm.messages import (
    ImagePart,
    Message,
    TextPart,
    ToolCallPart,
    ToolResultPart,
)

__all__ = [
    "IMAGE_CHARS",
    "IMAGE_TOKENS",
    "MESSAGE_TOKENS",
    "TOOL_CALL_TOKENS",
    "arguments_json",
    "check_tokens",
    "compact_json",
    "rendered_chars",
    "texts",
]

IMAGE_CHARS: Final = 256
"""Characters the character-based counters charge for one image."""

MESSAGE_TOKENS: Final = 4
"""Default framing tokens of a message: OpenAI's chat format uses 3, the role 1."""

TOOL_CALL_TOKENS: Final = 3
"""Framing tokens of one tool call, on top of its name and arguments."""

IMAGE_TOKENS: Final = 1_600
"""Default tokens of one image: what the largest costs on Anthropic's models.

Images are sent at full detail, and priced by their size: up to about
1,600 tokens on Anthropic (width x height / 750, at most 1.15 megapixels),
1,445 on OpenAI's gpt-4o (85 per image, 170 per 512-pixel tile). OpenAI's
low-detail price is 85; its patch-priced small models charge up to about
3,800.
"""


def arguments_json(part: ToolCallPart) -> str:
    """Return a tool call's arguments as compact JSON, non-ASCII kept as is.

    The classic rule: `json.dumps(args, separators=(",", ":"), ensure_ascii=False)`.
    Keys keep their order (sorting would not change the length).
    """
    arguments = part.arguments
    if not isinstance(arguments, dict):
        arguments = dict(arguments)
    return compact_json(arguments)


compact_json: Final = compact_encoder(sort_keys=False)
"""Compact JSON, keys in their order, non-ASCII kept: one encoder for every call
(`json.dumps` with options builds a new one each time)."""


def texts(message: Message) -> Iterator[str | None]:
    """Yield the text of each piece of `message`; `None` stands for an image.

    A tool call yields its name, then its JSON arguments; the metadata a
    model client sends with the message (`Message.sent_texts`) comes last.
    """
    for part in message.parts:
        match part:
            case TextPart(text=text):
                yield text
            case ToolCallPart(name=name):
                yield name
                yield arguments_json(part)
            case ToolResultPart(content=content):
                yield content
            case ImagePart():
                yield None
    if message.metadata:  # most messages have none
        yield from message.sent_texts


def rendered_chars(message: Message) -> int:
    """Return the classic rendered length of `message`, without its overhead.

    Text chars of text parts, `IMAGE_CHARS` per image, `len(name)` plus the
    length of the compact JSON arguments per tool call, the content length
    of each tool result, and the length of each metadata text a model client
    sends with the message.
    """
    return sum(IMAGE_CHARS if text is None else len(text) for text in texts(message))


def check_tokens(_inst: object, attr: attrs.Attribute[int], value: object) -> None:
    """Validate a token-count setting: an int >= 0, else `ConfigError`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(attr.name, value, "an int >= 0")
