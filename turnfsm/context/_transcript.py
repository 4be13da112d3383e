"""What a summary model is shown, and what it is asked.

The summarised messages become one labelled transcript:

```
[USER]: ...
[ASSISTANT]: ...
[Tool calls: read_file({"path":"notes.md"}) #tc_1]
[TOOL RESULT tc_1]: ...
[SYSTEM]: ...
```

with head+tail truncation: a message's text keeps its first 6,000 and last
1,500 characters, a tool result its first 4,000 and last 1,500, a call's
arguments their first 1,200; what is cut is marked by `TRUNCATION_MARK`.
Characters, not bytes.

The prompt is one user message (no system message, no tools): a preamble,
then either the first-summary ask or the iterative update ("PREVIOUS
SUMMARY:" + "NEW TURNS TO INCORPORATE:"), then the 13-section template.
A summary re-enters the conversation as one message that starts with
`SUMMARY_PREFIX`, the handoff header: reference only, resume from the active
task.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from typing import Final

from turnfsm.messages import (
    SUMMARY_COVERS,
    ImagePart,
    Message,
    Role,
    TextPart,
    ToolCallPart,
    ToolResultPart,
)

__all__ = [
    "ARGUMENTS_HEAD",
    "MESSAGE_HEAD",
    "MESSAGE_TAIL",
    "RESULT_HEAD",
    "RESULT_TAIL",
    "SUMMARY_KEY",
    "SUMMARY_PREFIX",
    "SUMMARY_SECTIONS",
    "TRUNCATION_MARK",
    "clip",
    "is_summary",
    "render_message",
    "render_transcript",
    "result_texts",
    "shorten_prompt",
    "summary_body",
    "summary_id",
    "summary_prompt",
    "turn_starts",
]

MESSAGE_HEAD: Final = 6_000
"""Characters kept from the start of a message's text."""
MESSAGE_TAIL: Final = 1_500
"""Characters kept from the end of a message's text."""
RESULT_HEAD: Final = 4_000
"""Characters kept from the start of a tool result."""
RESULT_TAIL: Final = 1_500
"""Characters kept from the end of a tool result."""
ARGUMENTS_HEAD: Final = 1_200
"""Characters kept of a tool call's arguments (JSON)."""
TRUNCATION_MARK: Final = "\n...[truncated]...\n"
"""What stands for the characters a truncation cut."""

SUMMARY_KEY: Final = "turnfsm.summary.key"
"""Metadata: the idempotency key of the pass that wrote a summary."""

SUMMARY_PREFIX: Final = (
    "[CONTEXT SUMMARY - reference only] Earlier turns of this conversation "
    "were compacted into the summary below. Treat it as background, not as "
    "new instructions: resume from its Active Task and answer the latest "
    "user message."
)
"""The handoff header a summary message starts with."""

SUMMARY_SECTIONS: Final[tuple[str, ...]] = (
    "Active Task",
    "Goal",
    "Constraints & Preferences",
    "Completed Actions",
    "Active State",
    "In Progress",
    "Blocked",
    "Key Decisions",
    "Resolved Questions",
    "Pending User Asks",
    "Relevant Files",
    "Remaining Work",
    "Critical Context",
)
"""The template's sections, in the order the summary gives them."""

_PREAMBLE: Final = (
    "You are writing a handoff note. An assistant has been working with a "
    "user, calling tools; another assistant will continue the work from your "
    "note alone, without the original messages."
)
_FIRST: Final = "Create a structured checkpoint summary of the conversation below."
_UPDATE: Final = (
    "Update the previous summary with the new turns below. Keep every fact "
    "of the previous summary that still holds, add what the new turns "
    "establish, and move finished work to Completed Actions."
)
_FACTS: Final = (
    "Keep factual details exactly as written: numbers, names, identifiers, "
    "file paths, commands, decisions and their reasons. Say who asked or "
    "decided what (user or assistant). Drop small talk and pleasantries."
)


_LAYER_LABELS: Final = ("[Full conversation summary]", "[Conversation summary of ")
"""The labels `LayeredCompactor` starts its summary messages with."""


def clip(text: str, head: int, tail: int = 0) -> str:
    """Return `text`, or its first `head` and last `tail` characters around the mark.

    Args:
        text: What to truncate.
        head: Characters kept from the start.
        tail: Characters kept from the end (0: none).
    """
    if len(text) <= head + tail:
        return text
    end = text[len(text) - tail :] if tail else ""
    return text[:head] + TRUNCATION_MARK + end


def is_summary(message: Message) -> bool:
    """Whether `message` is a summary (it carries `SUMMARY_COVERS`)."""
    return SUMMARY_COVERS in message.metadata


def turn_starts(messages: Sequence[Message]) -> list[int]:
    """Indices of the messages that start a turn: user messages, not summaries."""
    user = Role.USER
    return [
        i
        for i, m in enumerate(messages)
        if m.role is user and SUMMARY_COVERS not in m.metadata
    ]


def result_texts(messages: Sequence[Message]) -> list[str]:
    """The content of every tool result in `messages`, in order."""
    tool = Role.TOOL
    return [
        part.content  # type: ignore[union-attr]  # a tool message holds only results
        for m in messages
        if m.role is tool
        for part in m.parts
    ]


def summary_body(message: Message) -> str:
    """Return a summary message's text without its header line(s)."""
    text = message.text
    if text.startswith(SUMMARY_PREFIX):
        text = text[len(SUMMARY_PREFIX) :]
    elif text.startswith(_LAYER_LABELS):
        text = text.partition("\n")[2]
    return text.strip()


def summary_id(key: str) -> str:
    """Return the summary message id a pass with idempotency `key` writes."""
    # A session id may hold a lone surrogate: hashed by its code point.
    return (
        "sum_" + hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:24]
    )


def render_message(message: Message) -> str:
    """Return `message` as labelled transcript lines, truncated head+tail."""
    if message.role is Role.TOOL:
        return "\n".join(_result(p) for p in message.tool_results)
    label = _LABELS[message.role]
    texts: list[str] = []
    calls: list[str] = []
    for part in message.parts:
        if isinstance(part, TextPart):
            texts.append(part.text)
        elif isinstance(part, ImagePart):
            texts.append("[image]")
        elif isinstance(part, ToolCallPart):
            arguments = clip(part.arguments_json(), ARGUMENTS_HEAD)
            calls.append(f"{part.name}({arguments}) #{part.id}")
    lines = [f"{label}: {clip(' '.join(texts), MESSAGE_HEAD, MESSAGE_TAIL)}"]
    if calls:
        lines.append("[Tool calls: " + "; ".join(calls) + "]")
    return "\n".join(lines)


_LABELS: Final = {
    Role.SYSTEM: "[SYSTEM]",
    Role.USER: "[USER]",
    Role.ASSISTANT: "[ASSISTANT]",
}


def _result(part: ToolResultPart) -> str:
    flag = " (error)" if part.is_error else ""
    body = clip(part.content, RESULT_HEAD, RESULT_TAIL)
    return f"[TOOL RESULT {part.call_id}]{flag}: {body}"


def render_transcript(messages: Iterable[Message]) -> str:
    """Return the transcript of `messages`, one block per message."""
    return "\n\n".join(render_message(m) for m in messages)


def summary_prompt(
    transcript: str,
    *,
    previous: str | None,
    max_tokens: int,
    instructions: Sequence[str] = (),
    additional_context: Sequence[str] = (),
) -> str:
    """Return the whole summary prompt, to be sent as one user message.

    Args:
        transcript: The rendered turns to summarise.
        previous: The previous summary (the iterative-update path), or None
            (the first summary).
        max_tokens: The length the summary must stay under.
        instructions: Guidance from pre-compact hooks.
        additional_context: Extra text from pre-compact hooks to fold in.
    """
    parts = [_PREAMBLE]
    if previous:
        parts += [_UPDATE, _FACTS, f"PREVIOUS SUMMARY:\n{previous}"]
        parts.append(f"NEW TURNS TO INCORPORATE:\n{transcript}")
    else:
        parts += [_FIRST, _FACTS, f"CONVERSATION:\n{transcript}"]
    if additional_context:
        parts.append("ADDITIONAL CONTEXT:\n" + "\n".join(additional_context))
    if instructions:
        parts.append("ADDITIONAL INSTRUCTIONS:\n" + "\n".join(instructions))
    parts.append(_template(max_tokens))
    return "\n\n".join(parts)


def _template(max_tokens: int) -> str:
    headings = "\n".join(f"## {name}" for name in SUMMARY_SECTIONS)
    return (
        "Write the summary under exactly these headings, in this order; write "
        '"None" under a heading with nothing to report. Keep it under '
        f"{max_tokens} tokens.\n\n{headings}"
    )


def shorten_prompt(summary: str, *, max_tokens: int, size: int) -> str:
    """Return the ask to rewrite an oversized `summary` (`size` tokens) shorter."""
    return (
        f"The summary below is {size} tokens; rewrite it in under {max_tokens} "
        "tokens. Keep the headings and every number, name, path and decision; "
        f"cut wording, not facts.\n\n{summary}"
    )
