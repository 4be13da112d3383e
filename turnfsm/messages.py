"""Messages: frozen values with a role, parts and a stable id.

A `Message` has a `Role` and a tuple of parts: `TextPart`, `ToolCallPart`,
`ToolResultPart` and `ImagePart`. Tool calls live on assistant messages; tool
results live on tool messages and name the call they answer by `call_id`.
Every message carries a stable `id` (used for caching token counts and for the
audit trail) and free-form string `metadata`.

`MessageLog` is the append-only sequence the brain keeps its buffers in:
immutable to its readers, O(1) to append, so a long run does not copy its
history on every turn.
"""

from __future__ import annotations

import bisect
import json
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from enum import StrEnum
from typing import Any, Final, TypeAlias, final, overload

import attrs

from turnfsm import _checks
from turnfsm.errors import InvalidMessage

__all__ = [
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
]

JSONValue: TypeAlias = (
    "str | int | float | bool | list[JSONValue] | dict[str, JSONValue] | None"
)
"""A value that JSON can carry (tool-call arguments)."""

SUMMARY_COVERS: Final = "turnfsm.summary.covers_up_to"
"""The metadata key that marks a message as a summary (seed 004).

Its value is the id of the last message the summary covers. A compactor
that summarises sets it on its summary message; when the pass is committed,
the session's log records the summary (`SummaryRecorded`), and the working
history is the latest summary plus the messages after it.
"""


class Role(StrEnum):
    """Who speaks a message."""

    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"


def new_message_id() -> str:
    """Return a fresh, globally unique message id (``msg_`` + 24 hex digits)."""
    return "msg_" + uuid.uuid4().hex[:24]


_ROLE_VALUES: Final = frozenset(r.value for r in Role)


def _to_role(value: object) -> Role:
    if isinstance(value, Role):
        return value
    if isinstance(value, str) and value in _ROLE_VALUES:
        return Role(value)
    allowed = ", ".join(r.value for r in Role)
    raise InvalidMessage("role", value, f"expected one of {allowed}")


def _require_str(field: str) -> Any:
    return _checks.string(field, error=InvalidMessage)


def _require_id(field: str) -> Any:
    return _checks.string(field, non_empty=True, error=InvalidMessage)


@final
@attrs.frozen(kw_only=True)
class TextPart:
    """Plain text."""

    text: str = attrs.field(validator=_require_str("text"))


@final
@attrs.frozen(kw_only=True)
class ToolCallPart:
    """A request from the model to run tool `name` with JSON `arguments`."""

    id: str = attrs.field(validator=_require_id("tool_call.id"))
    name: str = attrs.field(validator=_require_id("tool_call.name"))
    arguments: Mapping[str, JSONValue] = attrs.field(factory=dict, hash=False)

    @arguments.validator
    def _check_arguments(self, _attr: object, value: object) -> None:
        if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
            raise InvalidMessage(
                "tool_call.arguments", value, "expected a mapping with string keys"
            )
        try:
            json.dumps(value)
        except (TypeError, ValueError) as exc:
            raise InvalidMessage(
                "tool_call.arguments", value, f"expected JSON values ({exc})"
            ) from None

    def arguments_json(self) -> str:
        """Return the arguments as compact, key-sorted JSON."""
        return json.dumps(self.arguments, separators=(",", ":"), sort_keys=True)


@final
@attrs.frozen(kw_only=True)
class ToolResultPart:
    """The result of the tool call `call_id`; `is_error` marks a failed call."""

    call_id: str = attrs.field(validator=_require_id("tool_result.call_id"))
    content: str = attrs.field(validator=_require_str("tool_result.content"))
    is_error: bool = attrs.field(
        default=False,
        validator=_checks.boolean("tool_result.is_error", error=InvalidMessage),
    )


@final
@attrs.frozen(kw_only=True)
class ImagePart:
    """An image, by URL (``https:`` or ``data:``), with an optional media type."""

    url: str = attrs.field(validator=_require_id("image.url"))
    media_type: str | None = attrs.field(
        default=None,
        validator=_checks.string(
            "image.media_type", non_empty=True, optional=True, error=InvalidMessage
        ),
    )


Part: TypeAlias = TextPart | ToolCallPart | ToolResultPart | ImagePart
"""Any message part."""

_PART_TYPES: Final = (TextPart, ToolCallPart, ToolResultPart, ImagePart)


def _to_parts(value: Iterable[Part] | str) -> tuple[Part, ...]:
    if isinstance(value, str):
        return (TextPart(text=value),)
    if isinstance(value, bytes | Mapping) or not _checks.is_iterable(value):
        raise InvalidMessage("parts", value, "expected a string or message parts")
    parts = tuple(value)
    for part in parts:
        if not isinstance(part, _PART_TYPES):
            raise InvalidMessage("parts", part, "expected a message part")
    return parts


@final
@attrs.frozen(kw_only=True)
class Message:
    """One message of a conversation.

    Build one with the constructors (`Message.user("hi")`,
    `Message.assistant("ok", tool_calls=[...])`, `Message.tool_result(...)`)
    or directly from a role and parts. Invalid combinations raise
    `InvalidMessage` naming the field: tool calls only on assistant messages,
    tool results only (and alone) on tool messages.
    """

    role: Role = attrs.field(converter=_to_role)
    parts: tuple[Part, ...] = attrs.field(converter=_to_parts)
    id: str = attrs.field(factory=new_message_id, validator=_require_id("id"))
    metadata: Mapping[str, str] = attrs.field(
        factory=dict,
        hash=False,
        eq=False,
        validator=_checks.string_mapping(
            "metadata", error=InvalidMessage, values=False
        ),
    )

    def __attrs_post_init__(self) -> None:
        for part in self.parts:
            if isinstance(part, ToolCallPart) and self.role is not Role.ASSISTANT:
                raise InvalidMessage(
                    "parts",
                    part,
                    f"a tool call needs role 'assistant', not {self.role.value!r}",
                )
            if isinstance(part, ToolResultPart) and self.role is not Role.TOOL:
                raise InvalidMessage(
                    "parts",
                    part,
                    f"a tool result needs role 'tool', not {self.role.value!r}",
                )
            if self.role is Role.TOOL and not isinstance(part, ToolResultPart):
                raise InvalidMessage(
                    "parts", part, "a tool message holds only tool results"
                )

    # -- constructors -------------------------------------------------
    @classmethod
    def system(cls, text: str, **kwargs: Any) -> Message:
        """Return a system message with `text`."""
        _checks.check(text, "text", _require_str("text"))
        return cls(role=Role.SYSTEM, parts=text, **kwargs)

    @classmethod
    def user(cls, text: str, **kwargs: Any) -> Message:
        """Return a user message with `text`."""
        _checks.check(text, "text", _require_str("text"))
        return cls(role=Role.USER, parts=text, **kwargs)

    @classmethod
    def assistant(
        cls,
        text: str = "",
        *,
        tool_calls: Iterable[ToolCallPart] = (),
        **kwargs: Any,
    ) -> Message:
        """Return an assistant message with `text` and optional `tool_calls`."""
        _checks.check(text, "text", _require_str("text"))
        parts: list[Part] = [TextPart(text=text)] if text else []
        calls = _checks.as_tuple(
            tool_calls, "tool_calls", "ToolCallPart", error=InvalidMessage
        )
        for i, call in enumerate(calls):
            if not isinstance(call, ToolCallPart):
                raise InvalidMessage(
                    f"tool_calls[{i}]", call, "expected a ToolCallPart"
                )
        parts.extend(calls)
        return cls(role=Role.ASSISTANT, parts=parts, **kwargs)

    @classmethod
    def tool_result(
        cls, call_id: str, content: str, *, is_error: bool = False, **kwargs: Any
    ) -> Message:
        """Return a tool message answering the call `call_id`."""
        part = ToolResultPart(call_id=call_id, content=content, is_error=is_error)
        return cls(role=Role.TOOL, parts=(part,), **kwargs)

    # -- views ---------------------------------------------------------
    @property
    def text(self) -> str:
        """The concatenated text parts."""
        return "".join(p.text for p in self.parts if isinstance(p, TextPart))

    @property
    def tool_calls(self) -> tuple[ToolCallPart, ...]:
        """The tool calls this message makes."""
        return tuple(p for p in self.parts if isinstance(p, ToolCallPart))

    @property
    def tool_results(self) -> tuple[ToolResultPart, ...]:
        """The tool results this message carries."""
        return tuple(p for p in self.parts if isinstance(p, ToolResultPart))

    # -- serialisation -------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-compatible dict; `Message.from_dict` reverses it."""
        return {
            "id": self.id,
            "role": self.role.value,
            "parts": [_part_to_dict(p) for p in self.parts],
            "metadata": dict(self.metadata),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Message:
        """Build a message from `to_dict` output; raises `InvalidMessage`."""
        if not isinstance(data, Mapping):
            raise InvalidMessage("message", data, "expected a mapping")
        try:
            raw = data["parts"]
            if not isinstance(raw, list | tuple):
                raise InvalidMessage("parts", raw, "expected a list of parts")
            parts = [_part_at(i, p) for i, p in enumerate(raw)]
            return cls(
                role=data["role"],
                parts=parts,
                id=data["id"],
                metadata=data.get("metadata", {}),
            )
        except KeyError as exc:
            raise InvalidMessage(str(exc.args[0]), None, "missing field") from None


def _part_to_dict(part: Part) -> dict[str, Any]:
    match part:
        case TextPart(text=text):
            return {"type": "text", "text": text}
        case ToolCallPart(id=id_, name=name, arguments=arguments):
            return {
                "type": "tool_call",
                "id": id_,
                "name": name,
                "arguments": dict(arguments),
            }
        case ToolResultPart(call_id=call_id, content=content, is_error=is_error):
            return {
                "type": "tool_result",
                "call_id": call_id,
                "content": content,
                "is_error": is_error,
            }
        case ImagePart(url=url, media_type=media_type):
            return {"type": "image", "url": url, "media_type": media_type}


def _part_at(index: int, data: Mapping[str, Any]) -> Part:
    """Read part `index`; an error names it (``parts[1].text``)."""
    try:
        return _part_from_dict(data)
    except KeyError as exc:
        name = f"parts[{index}].{exc.args[0]}"
        raise InvalidMessage(name, None, "missing field") from None
    except InvalidMessage as exc:
        inner = exc.field.removeprefix("parts").removeprefix(".")
        name = f"parts[{index}].{inner}" if inner else f"parts[{index}]"
        raise InvalidMessage(name, exc.value, exc.reason) from None


def _part_from_dict(data: Mapping[str, Any]) -> Part:
    if not isinstance(data, Mapping):
        raise InvalidMessage("parts", data, "expected a mapping per part")
    kind = data.get("type")
    if kind == "text":
        return TextPart(text=data["text"])
    if kind == "tool_call":
        return ToolCallPart(
            id=data["id"], name=data["name"], arguments=data["arguments"]
        )
    if kind == "tool_result":
        return ToolResultPart(
            call_id=data["call_id"],
            content=data["content"],
            is_error=data.get("is_error", False),
        )
    if kind == "image":
        return ImagePart(url=data["url"], media_type=data.get("media_type"))
    raise InvalidMessage(
        "parts.type", kind, "expected text, tool_call, tool_result or image"
    )


def as_messages(value: Iterable[Message]) -> tuple[Message, ...]:
    """Return `value` as a tuple of messages (an attrs converter with a type)."""
    return tuple(value)


def as_sequence(value: Iterable[Message]) -> Sequence[Message]:
    """Return `value` as an immutable sequence, without copying our own views."""
    if isinstance(value, tuple | MessageLog | Joined):
        return value
    return tuple(value)


def check_history(messages: Iterable[Message]) -> tuple[Message, ...]:
    """Validate a conversation given from outside and return it as a tuple.

    Every tool call must be answered by tool results before the next
    non-tool message (and before the end): a provider rejects a conversation
    with an orphaned half. The rules are `OpenCalls`'s.

    Raises:
        InvalidMessage: an item is not a `Message`; a tool result answers no
            earlier tool call (`field` is ``tool_result.call_id``); or a tool
            call has no result (`field` is ``tool_call.id``).
    """
    out = tuple(messages)
    OpenCalls().then(out).require_closed()
    return out


_OPEN_CALLS_MEMO: Final = "open_calls"


def _as_ids(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(value)


@final
@attrs.frozen(kw_only=True)
class OpenCalls:
    """The tool calls a valid conversation prefix leaves unanswered.

    The one checker of tool pairing: every tool result answers an open call
    of the same id, and every call is answered before the next non-tool
    message. Open calls can therefore only belong to the last assistant
    message. `OpenCalls()` is the state of an empty conversation;
    `state.then(messages)` checks the messages that follow it and returns the
    state after them, so a growing conversation is checked in O(new
    messages). `OpenCalls.of(log)` memoises the state of every checked
    `MessageLog` prefix on the log's backing list.

    Attributes:
        ids: the ids of the calls awaiting a result, in call order (an id
            called twice and answered once appears once).
    """

    ids: tuple[str, ...] = attrs.field(default=(), converter=_as_ids)

    @property
    def is_closed(self) -> bool:
        """Whether every call is answered (the prefix is a whole conversation)."""
        return not self.ids

    def then(self, messages: Iterable[Message]) -> OpenCalls:
        """Check `messages` as the continuation of this prefix; return the new state.

        Raises:
            InvalidMessage: an item is not a `Message` (`field` is
                ``messages``); a tool result answers no open call (`field` is
                ``tool_result.call_id``); or a non-tool message follows an
                unanswered call (`field` is ``tool_call.id``).
        """
        ids = self.ids
        for message in messages:
            ids = _step(ids, message)
        if ids is self.ids:
            return self
        if not ids:
            return _CLOSED
        # `OpenCalls(ids=...)` without the converter: `ids` is a tuple already.
        state = object.__new__(OpenCalls)
        object.__setattr__(state, "ids", ids)
        return state

    def require_closed(self) -> None:
        """Check that no call is left open (the conversation may end here).

        Raises:
            InvalidMessage: a call has no result (`field` is ``tool_call.id``,
                `value` its id).
        """
        if self.ids:
            raise InvalidMessage(
                "tool_call.id",
                self.ids[0],
                "a tool call with no result before the next message",
            )

    @classmethod
    def of(cls, messages: Iterable[Message]) -> OpenCalls:
        """Check `messages` as a conversation prefix; return the calls left open.

        For a `MessageLog` the state of each checked length is kept in its
        `memo`, so checking a log again after appending k messages costs O(k).

        Raises:
            InvalidMessage: as `then`.
        """
        if type(messages) is not MessageLog:
            return _CLOSED.then(messages)
        memo = messages._store.memo
        known: _Known | None = memo.get(_OPEN_CALLS_MEMO)
        if known is None:
            known = memo[_OPEN_CALLS_MEMO] = _Known()
        n = messages._len
        lengths = known.lengths
        if lengths[-1] <= n:  # the usual case: the log only grew
            at = len(lengths) - 1
        else:
            at = bisect.bisect_right(lengths, n) - 1
        length = lengths[at]
        state = known.states[at]
        if length == n:
            return state
        state = state.then(messages.items_from(length))
        lengths.insert(at + 1, n)
        known.states.insert(at + 1, state)
        return state


@final
class _Known:
    """The checked prefixes of one backing list: lengths (sorted), their states."""

    __slots__ = ("lengths", "states")

    def __init__(self) -> None:
        self.lengths: list[int] = [0]
        self.states: list[OpenCalls] = [_CLOSED]


_CLOSED: Final = OpenCalls()


def _step(open_ids: tuple[str, ...], message: object) -> tuple[str, ...]:
    """Return the open call ids after `message` (the checker's one rule)."""
    if type(message) is not Message:  # Message is final
        raise InvalidMessage("messages", message, "expected a Message")
    role = message.role
    if role is Role.TOOL:
        ids = list(open_ids)
        # A tool message holds only tool results (Message checks it).
        for part in message.parts:
            assert isinstance(part, ToolResultPart)
            if part.call_id not in ids:
                raise InvalidMessage(
                    "tool_result.call_id",
                    part.call_id,
                    "a tool result for no open tool call (no earlier call of "
                    "that id, already answered, or a message came between)",
                )
            ids.remove(part.call_id)
        return tuple(ids)
    if open_ids:
        raise InvalidMessage(
            "tool_call.id",
            open_ids[0],
            "a tool call with no result before the next message",
        )
    if role is not Role.ASSISTANT:  # only an assistant may call tools
        return open_ids
    calls = tuple(p.id for p in message.parts if type(p) is ToolCallPart)
    return calls or open_ids


class _Store:
    """The shared, append-only backing list of one or more `MessageLog`s."""

    __slots__ = ("items", "memo")

    def __init__(self, items: list[Message]) -> None:
        self.items = items
        # Per-store memo for incremental consumers (token prefix sums).
        self.memo: dict[object, Any] = {}


@final
class MessageLog(Sequence[Message]):
    """An immutable sequence of messages that appends in O(1).

    Logs share one append-only backing list: `log.append(m)` returns a new
    log viewing one more item, and extends the shared list in place only when
    `log` is its longest view, so no reader ever sees its items change.
    """

    __slots__ = ("_len", "_store")

    def __init__(self, messages: Iterable[Message] = ()) -> None:
        items = list(messages)
        self._store = _Store(items)
        self._len = len(items)

    def append(self, *messages: Message) -> MessageLog:
        """Return a log with `messages` appended; `self` is unchanged."""
        return self.extend(messages)

    def extend(self, messages: Iterable[Message]) -> MessageLog:
        """Return a log with `messages` appended; `self` is unchanged."""
        new = messages if type(messages) is tuple else list(messages)
        if not new:
            return self
        store = self._store
        items = store.items
        if len(items) != self._len:  # a longer view exists: branch off
            store = _Store(items[: self._len])
            items = store.items
        items.extend(new)
        log = MessageLog.__new__(MessageLog)
        log._store = store
        log._len = len(items)
        return log

    @property
    def store_key(self) -> tuple[object, int]:
        """Identity of the backing list and this view's length (for memos)."""
        return (self._store, self._len)

    @property
    def memo(self) -> dict[object, Any]:
        """A scratch dict shared by every view of the same backing list."""
        return self._store.memo

    def items_from(self, start: int) -> Iterator[Message]:
        """Iterate over the items from index `start` on, without copying."""
        items = self._store.items
        for i in range(start, self._len):
            yield items[i]

    def __len__(self) -> int:
        return self._len

    @overload
    def __getitem__(self, index: int) -> Message: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[Message, ...]: ...
    def __getitem__(self, index: int | slice) -> Message | tuple[Message, ...]:
        if isinstance(index, slice):
            return tuple(self._store.items[: self._len][index])
        if index < 0:
            index += self._len
        if not 0 <= index < self._len:
            raise IndexError("MessageLog index out of range")
        return self._store.items[index]

    def __iter__(self) -> Iterator[Message]:
        return self.items_from(0)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, MessageLog):
            return self._len == other._len and (
                self._store is other._store or list(self) == list(other)
            )
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(m.id for m in self))

    def __repr__(self) -> str:
        return f"MessageLog({list(self)!r})"


@final
class Joined(Sequence[Message]):
    """A read-only view of several message sequences as one, without copying."""

    __slots__ = ("_len", "_parts")

    def __init__(self, *parts: Sequence[Message]) -> None:
        self._parts = tuple(p for p in parts if len(p))
        self._len = sum(len(p) for p in self._parts)

    def __len__(self) -> int:
        return self._len

    @overload
    def __getitem__(self, index: int) -> Message: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[Message, ...]: ...
    def __getitem__(self, index: int | slice) -> Message | tuple[Message, ...]:
        if isinstance(index, slice):
            return tuple(self)[index]
        if index < 0:
            index += self._len
        if not 0 <= index < self._len:
            raise IndexError("Joined index out of range")
        for part in self._parts:
            if index < len(part):
                return part[index]
            index -= len(part)
        raise AssertionError("unreachable")  # pragma: no cover

    def __iter__(self) -> Iterator[Message]:
        for part in self._parts:
            yield from part

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence) and not isinstance(other, str):
            return len(self) == len(other) and all(
                a == b for a, b in zip(self, other, strict=True)
            )
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Joined({list(self)!r})"
