"""Content as the JSON a span records: messages, tool arguments (when captured)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

__all__ = ["messages_json", "to_json"]


def messages_json(messages: Any) -> str:
    return to_json([m.to_dict() for m in messages])


def to_json(value: object) -> str:
    if isinstance(value, Mapping):
        value = dict(value)
    return json.dumps(value, default=str, ensure_ascii=False)
