"""Shared hypothesis strategies for turnfsm's tests."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import strategies as st

from turnfsm.messages import (
    Message,
    Part,
    Role,
    TextPart,
    ToolCallPart,
    ToolResultPart,
)

__all__ = ["CALL_IDS", "histories", "tag_of"]

CALL_IDS = ("call_a", "call_b", "call_c")
"""The small pool tool-call ids are drawn from, so ids are often reused."""


def tag_of(part: Part) -> str:
    """Return the unique tag `histories()` gives every part it builds."""
    match part:
        case TextPart(text=text):
            return text
        case ToolCallPart(arguments=arguments):
            return str(arguments["tag"])
        case ToolResultPart(content=content):
            return content
        case _:
            raise AssertionError(f"histories() builds no {type(part).__name__}")


class _Builder:
    """Turns a byte string into a conversation; each byte pair is one message."""

    def __init__(self) -> None:
        self.parts = 0
        self.open_calls: list[str] = []  # ids of calls not answered yet
        self.messages: list[Message] = []

    def tag(self, prefix: str) -> str:
        self.parts += 1
        return f"{prefix}{self.parts}"

    def add(self, role: Role, parts: list[Part]) -> None:
        index = len(self.messages)
        self.messages.append(Message(role=role, parts=parts, id=f"m{index}"))

    def text(self, role: Role) -> None:
        self.add(role, [TextPart(text=self.tag("t"))])

    def calls(self, arg: int) -> None:
        parts: list[Part] = []
        if arg & 8:
            parts.append(TextPart(text=self.tag("t")))
        for k in range(1 + arg % 3):  # parallel calls: one to three
            call_id = CALL_IDS[((arg >> 4) + k) % len(CALL_IDS)]
            parts.append(
                ToolCallPart(id=call_id, name="tool", arguments={"tag": self.tag("c")})
            )
            self.open_calls.append(call_id)
        self.add(Role.ASSISTANT, parts)

    def results(self, arg: int) -> None:
        parts: list[Part] = []
        for k in range(1 + arg % 2):  # parallel results: one or two
            if self.open_calls and not (arg >> (2 + k)) & 1:
                # answer an open call: the latest one, or one a little earlier
                pick = len(self.open_calls) - 1 - (arg >> 4) % len(self.open_calls)
                call_id = self.open_calls.pop(pick)
            else:  # an orphan, or an id that answers nothing open
                call_id = CALL_IDS[(arg >> 5) % len(CALL_IDS)]
            parts.append(ToolResultPart(call_id=call_id, content=self.tag("r")))
        self.add(Role.TOOL, parts)

    def step(self, kind: int, arg: int) -> None:
        match kind % 8:
            case 0 | 1:
                self.text(Role.USER)
            case 2:
                self.text(Role.ASSISTANT)
            case 3 | 4:
                self.calls(arg)
            case 5 | 6:
                self.results(arg)
            case _:
                self.text(Role.SYSTEM)


def _build(data: bytes) -> list[Message]:
    builder = _Builder()
    for i in range(0, len(data) - 1, 2):
        builder.step(data[i], data[i + 1])
    return builder.messages


def histories(*, max_messages: int = 24) -> st.SearchStrategy[list[Message]]:
    """Conversations with tool traffic, built cheaply from a byte string.

    Every message is non-empty and has the id ``m<index>``; every part carries
    a unique tag (`tag_of`). Histories mix user, assistant and system text,
    parallel calls, reused call ids (from `CALL_IDS`), results that answer an
    open call (the latest or an earlier one), orphan results and calls still
    pending at the end.

    Args:
        max_messages: The longest history drawn (at least one message).
    """
    # Draw the length first, so long histories (the ones a cut applies to)
    # are as common as short ones.
    return (
        st.integers(1, max_messages)
        .flatmap(lambda n: st.binary(min_size=2 * n, max_size=2 * n))
        .map(_build)
    )


def valid(messages: Sequence[Message]) -> list[Message]:
    """Repair a generated history into one `check_history` accepts.

    Results that answer no open call are dropped, and calls still open when
    a non-tool message (or the end) comes are answered right there.
    """
    out: list[Message] = []
    open_ids: list[str] = []

    def close() -> None:
        for k, call_id in enumerate(open_ids):
            out.append(Message.tool_result(call_id, "late", id=f"fix{len(out)}-{k}"))
        open_ids.clear()

    for message in messages:
        if message.role is Role.TOOL:
            parts = []
            for part in message.tool_results:
                if part.call_id in open_ids:
                    open_ids.remove(part.call_id)
                    parts.append(part)
            if parts:
                out.append(Message(role=Role.TOOL, parts=parts, id=message.id))
            continue
        close()
        out.append(message)
        open_ids.extend(call.id for call in message.tool_calls)
    close()
    return out
