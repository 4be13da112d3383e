"""Content as the JSON a span records: messages, tool arguments (when captured)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from turnfsm.tracing import attributes as A
from turnfsm.values import Usage

__all__ = ["messages_json", "to_json", "usage_attributes"]


def messages_json(messages: Any) -> str:
    return to_json([m.to_dict() for m in messages])


def to_json(value: object) -> str:
    if isinstance(value, Mapping):
        value = dict(value)
    return json.dumps(value, default=str, ensure_ascii=False)


def usage_attributes(usage: Usage) -> dict[str, int]:
    """A usage's span attributes: the cache's counts only when it has some."""
    said = {
        A.USAGE_INPUT_TOKENS: usage.input_tokens,
        A.USAGE_OUTPUT_TOKENS: usage.output_tokens,
    }
    if usage.cache_read_tokens:
        said[A.USAGE_CACHE_READ_TOKENS] = usage.cache_read_tokens
    if usage.cache_write_tokens:
        said[A.USAGE_CACHE_WRITE_TOKENS] = usage.cache_write_tokens
    return said
