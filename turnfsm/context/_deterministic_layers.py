"""The layers with no model call: budget, trim, microcompact (tool results only)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final, TypeAlias

import attrs

from turnfsm.context._transcript import turn_starts
from turnfsm.messages import Message, Role, ToolResultPart
from turnfsm.tokens import TokenCounter

__all__ = [
    "MAX_TOOL_RESULT_CHARS",
    "TRIM_TURN_THRESHOLD",
    "TRUNCATION_SUFFIX",
    "Layer",
    "cap_results",
    "first_fit",
    "map_results",
    "microcompact",
    "trim_results",
]

MAX_TOOL_RESULT_CHARS: Final = 4_000
"""Layer 1: the most characters a tool result keeps."""
TRUNCATION_SUFFIX: Final = "... [truncated]"
"""Layer 1: appended to a tool result it cut."""
TRIM_TURN_THRESHOLD: Final = 20
"""Layer 2: the newest exchanges whose tool results are kept."""

Layer: TypeAlias = Callable[[Sequence[Message]], tuple[Message, ...]]
"""A deterministic layer: the messages in, the messages out (the same if unchanged)."""


def cap_results(messages: Sequence[Message], cap: int) -> tuple[Message, ...]:
    """Layer 1: cap each tool result at `cap` characters."""

    def cut(part: ToolResultPart) -> ToolResultPart:
        content = part.content
        if len(content) <= cap or (
            len(content) == cap + len(TRUNCATION_SUFFIX)
            and content.endswith(TRUNCATION_SUFFIX)
        ):  # short enough, or cut already
            return part
        return attrs.evolve(part, content=content[:cap] + TRUNCATION_SUFFIX)

    return tuple(_map_results(m, cut) for m in messages)


def trim_results(messages: Sequence[Message], keep_turns: int) -> tuple[Message, ...]:
    """Layer 2: empty the tool results of all but the newest `keep_turns` exchanges.

    An exchange starts at each user message (not a summary); messages before
    the first belong to the oldest.
    """
    starts = turn_starts(messages)
    if len(starts) <= keep_turns:
        return tuple(messages)
    boundary = starts[-keep_turns]
    return tuple(
        _map_results(m, _emptied) if i < boundary else m for i, m in enumerate(messages)
    )


def microcompact(messages: Sequence[Message]) -> tuple[Message, ...]:
    """Layer 3: per tool call id, only the last result keeps its content."""
    tool = Role.TOOL
    answered = [
        part.call_id
        for m in messages
        if m.role is tool
        for part in m.parts
        if isinstance(part, ToolResultPart)
    ]
    if len(set(answered)) == len(answered):  # no call answered twice: nothing to empty
        return tuple(messages)
    last: dict[str, tuple[int, int]] = {}
    for i, m in enumerate(messages):
        if m.role is not tool:
            continue
        for j, part in enumerate(m.parts):
            if isinstance(part, ToolResultPart):
                last[part.call_id] = (i, j)
    out: list[Message] = []
    for i, m in enumerate(messages):
        if m.role is not Role.TOOL:
            out.append(m)
            continue
        parts = tuple(
            _emptied(p)
            if isinstance(p, ToolResultPart) and last[p.call_id] != (i, j)
            else p
            for j, p in enumerate(m.parts)
        )
        changed = any(a is not b for a, b in zip(parts, m.parts, strict=True))
        out.append(attrs.evolve(m, parts=parts) if changed else m)
    return tuple(out)


def first_fit(
    layers: Sequence[tuple[str, Layer]],
    messages: Sequence[Message],
    target: int,
    counter: TokenCounter,
) -> tuple[tuple[Message, ...], list[str], bool]:
    """Run `layers` in order until the result fits `target`.

    Returns:
        The result, the names of the layers that changed something, and
        whether it fits.
    """
    current = tuple(messages)
    applied: list[str] = []
    for name, layer in layers:
        new = layer(current)
        if any(a is not b for a, b in zip(new, current, strict=True)):
            applied.append(name)
            current = new
        if counter.count(current) <= target:
            return current, applied, True
    return current, applied, False


def map_results(
    messages: Sequence[Message], change: Callable[[ToolResultPart], ToolResultPart]
) -> tuple[Message, ...]:
    """Apply `change` to every tool result; unchanged messages stay the same objects."""
    tool = Role.TOOL
    return tuple(
        [m if m.role is not tool else _map_results(m, change) for m in messages]
    )


def _emptied(part: ToolResultPart) -> ToolResultPart:
    return part if not part.content else attrs.evolve(part, content="")


def _map_results(
    message: Message, change: Callable[[ToolResultPart], ToolResultPart]
) -> Message:
    """Return `message` with `change` applied to its tool results (or itself)."""
    if message.role is not Role.TOOL:
        return message
    parts = message.parts
    for at, part in enumerate(parts):
        if isinstance(part, ToolResultPart):
            new = change(part)
            if new is not part:  # the first change: the rest is built from here
                rest = (
                    change(p) if isinstance(p, ToolResultPart) else p
                    for p in parts[at + 1 :]
                )
                return attrs.evolve(message, parts=(*parts[:at], new, *rest))
    return message
