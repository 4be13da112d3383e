"""Messages: frozen values with a role, parts and a stable id.

A `Message` has a `Role` and a tuple of parts: `TextPart`, `ToolCallPart`,
`ToolResultPart` and `ImagePart`. Tool calls live on assistant messages; tool
results live on tool messages and name the call they answer by `call_id`.
Every message carries a stable `id`, unique in its conversation (used for
caching token counts and for the audit trail; `require_new_ids` refuses a
message whose id the conversation already holds) and free-form string
`metadata`; what a model client sends of it (keys starting `SENT`, such as a
reply's thinking) is priced by the token counters. `Message.pin` marks a
message (`PINNED`) that every compaction pass keeps word for word.

`MessageLog` is the append-only sequence the brain keeps its buffers in:
immutable to its readers, O(1) to append, so a long run does not copy its
history on every turn.
"""

from __future__ import annotations

from turnfsm.messages._call_ids import unique_call_ids
from turnfsm.messages._ids import require_new_ids
from turnfsm.messages._log import Joined, MessageLog, as_sequence
from turnfsm.messages._open_calls import OpenCalls, check_history
from turnfsm.messages._values import (
    PINNED,
    SENT,
    SUMMARY_COVERS,
    ImagePart,
    JSONValue,
    Message,
    Part,
    Role,
    TextPart,
    ToolCallPart,
    ToolResultPart,
    as_messages,
    new_message_id,
    part_from_dict,
    part_to_dict,
)

__all__ = [
    "PINNED",
    "SENT",
    "SUMMARY_COVERS",
    "ImagePart",
    "JSONValue",
    "Joined",
    "Message",
    "MessageLog",
    "OpenCalls",
    "Part",
    "Role",
    "TextPart",
    "ToolCallPart",
    "ToolResultPart",
    "as_messages",
    "as_sequence",
    "check_history",
    "new_message_id",
    "part_from_dict",
    "part_to_dict",
    "require_new_ids",
    "unique_call_ids",
]
