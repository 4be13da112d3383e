"""Message values: roles, parts and `Message`, with their dict form and stable ids."""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Iterable, Mapping
from enum import StrEnum
from typing import Any, ClassVar, Final, TypeAlias, final

import attrs

from turnfsm import _checks
from turnfsm._json import compact_encoder
from turnfsm.errors import InvalidMessage

__all__ = [
    "PINNED",
    "SENT",
    "SUMMARY_COVERS",
    "ImagePart",
    "JSONValue",
    "Message",
    "Part",
    "Role",
    "TextPart",
    "ToolCallPart",
    "ToolResultPart",
    "as_messages",
    "new_message_id",
    "part_from_dict",
    "part_to_dict",
]


JSONValue: TypeAlias = (
    "str | int | float | bool | list[JSONValue] | dict[str, JSONValue] | None"
)
"""A value that JSON can carry (tool-call arguments)."""

SUMMARY_COVERS: Final = "turnfsm.summary.covers_up_to"
"""The metadata key that marks a message as a summary.

Its value is the id of the last message the summary covers. A compactor
that summarises sets it on its summary message; when the pass is committed,
the session's log records the summary (`SummaryRecorded`), and the working
history is the latest summary plus the messages after it.
"""


PINNED: Final = "turnfsm.pinned"
"""The metadata key that pins a message (its value: ``"true"``).

A pinned message survives every compaction pass word for word and in its
place: no strategy drops, shortens or moves it, and the context manager
refuses a pass that does. `Message.pin` returns a pinned copy.
"""


SENT: Final = "turnfsm.sent."
"""The prefix of the metadata keys whose values a model client sends.

A value kept under such a key rides every request its message goes in, as a
reply's thinking does (`AnthropicModel` sends it back beside the results of
the reply's tool calls, as Anthropic requires): every shipped token counter
prices it as text (`Message.sent_texts`), and so must a counter of your own,
or a request can be bigger than the window check measured. It belongs to
its message: a compaction that summarises or drops the message drops it too.
A value that places blocks among the parts (JSON text of a list of
``{"at": n, ...}``, ``n`` the parts before each, as a reply's thinking is
kept) moves with the parts `turnfsm.context.keep_parts` keeps.
"""

_sent_json: Final = compact_encoder(sort_keys=False)


class Role(StrEnum):
    """Who speaks a message."""

    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"


def new_message_id() -> str:
    """Return a fresh, globally unique message id (``msg_`` + 24 hex digits).

    The first 16 digits are random, drawn once per process (and again in a
    forked child); the last 8 count the ids made since. A counter that runs
    out draws new random digits.
    """
    prefix, count = _ids
    n = next(count)
    if n > _LAST_COUNT:
        _new_id_source()
        prefix, count = _ids
        n = next(count)
    return f"{prefix}{n:08x}"


_LAST_COUNT: Final = 0xFFFFFFFF


def _new_id_source() -> None:
    # One tuple, replaced whole: a thread reads the prefix and its counter
    # together, so an id is never a new prefix with an old count.
    global _ids
    _ids = ("msg_" + os.urandom(8).hex(), itertools.count())


_ids: tuple[str, itertools.count[int]]
_new_id_source()
os.register_at_fork(after_in_child=_new_id_source)


_ROLE_VALUES: Final = frozenset(r.value for r in Role)


def _to_role(value: object) -> Role:
    if isinstance(value, Role):
        return value
    if isinstance(value, str) and value in _ROLE_VALUES:
        return Role(value)
    allowed = ", ".join(r.value for r in Role)
    raise InvalidMessage("role", value, f"expected one of {allowed}")


_USER_TEXT: Final = "a text that is not blank: a user message says something"


def _require_str(field: str) -> Any:
    return _checks.string(field, error=InvalidMessage)


def _require_id(field: str) -> Any:
    return _checks.string(field, non_empty=True, error=InvalidMessage)


_TEXT: Final = _require_str("text")
"""The check of a constructor's text (made once: a message is made per call)."""
_SAID: Final = _checks.string(non_empty=True, error=InvalidMessage, expected=_USER_TEXT)
"""The check of a user message's text."""


@final
@attrs.frozen(kw_only=True)
class TextPart:
    """Plain text."""

    text: str = attrs.field(validator=_require_str("text"))


class _Fixed(dict[str, Any]):
    """A dict that does not change, as the value holding it does not.

    A message once said is in the log as it was: a plug-in that changed its
    metadata or a call's arguments in place (a compactor, a hook, a tool)
    would change the conversation behind the log's back, with a value that
    was never checked, and under the size counted for it. The lists and
    objects inside do not change either. `attrs.evolve` makes a new value.
    """

    __slots__ = ()
    _field: ClassVar[str] = ""
    _evolve: ClassVar[str] = ""

    def _refuse(self, *args: object, **kwargs: object) -> Any:
        raise InvalidMessage(
            self._field,
            dict(self),
            f"{self._field} does not change; make a new one with {self._evolve}",
        )

    __setitem__ = __delitem__ = __ior__ = _refuse
    clear = pop = popitem = setdefault = update = _refuse

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (dict(self),))


class _FixedList(list[Any]):
    """A list inside a `_Fixed` value, which does not change either."""

    __slots__ = ()
    _owner: ClassVar[type[_Fixed]] = _Fixed

    def _refuse(self, *args: object, **kwargs: object) -> Any:
        owner = self._owner
        raise InvalidMessage(
            owner._field,
            list(self),
            f"{owner._field} does not change; make a new one with {owner._evolve}",
        )

    __setitem__ = __delitem__ = __iadd__ = __imul__ = _refuse
    append = extend = insert = pop = remove = clear = sort = reverse = _refuse

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (list(self),))


@final
class _Metadata(_Fixed):
    __slots__ = ()
    _field = "metadata"
    _evolve = "attrs.evolve(message, metadata={...})"


@final
class _MetadataList(_FixedList):
    __slots__ = ()
    _owner = _Metadata


@final
class _Arguments(_Fixed):
    __slots__ = ()
    _field = "tool_call.arguments"
    _evolve = "attrs.evolve(call, arguments={...})"


@final
class _ArgumentsList(_FixedList):
    __slots__ = ()
    _owner = _Arguments


_NO_METADATA: Final = _Metadata()
_NO_ARGUMENTS: Final = _Arguments()
_SCALARS: Final = frozenset({str, int, float, bool, type(None)})


def _fixed(
    value: object, kind: type[_Fixed], kind_list: type[_FixedList], empty: _Fixed
) -> object:
    """`value` as a `kind` that does not change (the validator checks the rest)."""
    if type(value) is kind:
        return value
    if isinstance(value, Mapping):
        if not value:
            return empty
        if all(type(v) in _SCALARS for v in value.values()):  # nothing inside
            return kind(value)
        return _inner(value, kind, kind_list, 0)
    return value


def _inner(
    value: object, kind: type[_Fixed], kind_list: type[_FixedList], depth: int
) -> object:
    """`value` with its mappings as `kind` and its lists as `kind_list`.

    A copy, so that neither the caller nor a plug-in changes it in place.
    Past the deepest JSON nesting (or in a value that holds itself) it
    stops: the validator refuses that value.
    """
    if depth > _checks.MAX_JSON_DEPTH:
        return value
    if isinstance(value, Mapping):
        return kind(
            {k: _inner(v, kind, kind_list, depth + 1) for k, v in value.items()}
        )
    if isinstance(value, list):
        return kind_list([_inner(v, kind, kind_list, depth + 1) for v in value])
    if isinstance(value, tuple):
        return tuple(_inner(v, kind, kind_list, depth + 1) for v in value)
    return value


def _to_metadata(value: object) -> object:
    return _fixed(value, _Metadata, _MetadataList, _NO_METADATA)


def _to_arguments(value: object) -> object:
    return _fixed(value, _Arguments, _ArgumentsList, _NO_ARGUMENTS)


@final
@attrs.frozen(kw_only=True)
class ToolCallPart:
    """A request from the model to run tool `name` with JSON `arguments`."""

    id: str = attrs.field(validator=_require_id("tool_call.id"))
    name: str = attrs.field(validator=_require_id("tool_call.name"))
    # NaN stays: a client of your own may read a model's arguments with
    # `json.loads`, which reads it, and logs already written hold it (the
    # shipped clients read them strictly, keeping such text as `_raw`).
    arguments: Mapping[str, JSONValue] = attrs.field(
        default=_NO_ARGUMENTS,
        converter=_to_arguments,
        hash=False,
        validator=_checks.json_object(
            "tool_call.arguments",
            error=InvalidMessage,
            expected="a mapping with string keys of JSON values",
            finite=False,
        ),
    )

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
    if type(value) is tuple:  # the constructors' and `attrs.evolve`'s: no copy
        parts: tuple[Part, ...] = value
    elif isinstance(value, str):
        return (TextPart(text=value),)
    elif isinstance(value, bytes | Mapping) or not _checks.is_iterable(value):
        raise InvalidMessage("parts", value, "expected a string or message parts")
    else:
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
    tool results only (and alone) on tool messages; a part in every message
    but an assistant's (a model may reply with nothing: no text, no tool
    calls); no blank text in a user message; metadata that JSON carries
    (string keys; values, strings by convention, nested at most 100 deep).
    """

    role: Role = attrs.field(converter=_to_role)
    parts: tuple[Part, ...] = attrs.field(converter=_to_parts)
    id: str = attrs.field(factory=new_message_id, validator=_require_id("id"))
    # JSON values, not only strings: stored messages with numbers or lists in
    # their metadata (the row format allows them) must still load.
    metadata: Mapping[str, str] = attrs.field(
        default=_NO_METADATA,
        converter=_to_metadata,
        hash=False,
        eq=False,
        validator=_checks.json_object("metadata", error=InvalidMessage),
    )

    def __attrs_post_init__(self) -> None:
        if not self.parts and self.role is not Role.ASSISTANT:
            # A model may reply with nothing; nobody else may say nothing.
            raise InvalidMessage(
                "parts",
                self.parts,
                f"a {self.role.value} message needs a part (only a model's reply"
                " may be empty)",
            )
        if self.role is Role.USER:
            for i, part in enumerate(self.parts):
                if isinstance(part, TextPart) and not part.text.strip():
                    raise InvalidMessage(
                        f"parts[{i}].text", part.text, f"expected {_USER_TEXT}"
                    )
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
        _checks.check(text, "text", _TEXT)
        return cls(role=Role.SYSTEM, parts=text, **kwargs)

    @classmethod
    def user(cls, text: str, **kwargs: Any) -> Message:
        """Return a user message with `text`.

        Raises:
            InvalidMessage: `text` is not a string, or is blank (a user
                message says something).
        """
        _checks.check(text, "text", _SAID)
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
        _checks.check(text, "text", _TEXT)
        calls: tuple[Part, ...] = _checks.as_tuple(
            tool_calls, "tool_calls", "ToolCallPart", error=InvalidMessage
        )
        for i, call in enumerate(calls):
            if not isinstance(call, ToolCallPart):
                raise InvalidMessage(
                    f"tool_calls[{i}]", call, "expected a ToolCallPart"
                )
        parts = (TextPart(text=text), *calls) if text else calls
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

    # The two views below run a few times per tool turn (the brain's guards
    # and decisions, the driver): a plain loop over the few parts costs about
    # half a generator's tuple.
    @property
    def tool_calls(self) -> tuple[ToolCallPart, ...]:
        """The tool calls this message makes."""
        calls = []
        for part in self.parts:
            if isinstance(part, ToolCallPart):
                calls.append(part)
        return tuple(calls)

    @property
    def tool_results(self) -> tuple[ToolResultPart, ...]:
        """The tool results this message carries."""
        results = []
        for part in self.parts:
            if isinstance(part, ToolResultPart):
                results.append(part)
        return tuple(results)

    @property
    def sent_texts(self) -> tuple[str, ...]:
        """The metadata values a model client sends with this message, as text.

        The values under the keys that start with `SENT`: a string as it
        is, another JSON value as its compact JSON. Empty for a message
        with no such metadata (most messages).
        """
        metadata = self.metadata
        if not metadata:
            return ()
        return tuple(
            [
                value if isinstance(value, str) else _sent_json(value)
                for key, value in metadata.items()
                if key.startswith(SENT)
            ]
        )

    @property
    def pinned(self) -> bool:
        """Whether the message is pinned (its metadata carries `PINNED`)."""
        return self.metadata.get(PINNED) == "true"

    def pin(self) -> Message:
        """Return this message pinned: same id, role and parts, `PINNED` set.

        A pinned message is kept word for word by every compaction pass.
        Pinning a pinned message returns it as it is.
        """
        if self.pinned:
            return self
        return attrs.evolve(self, metadata={**self.metadata, PINNED: "true"})

    # -- serialisation -------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-compatible dict; `Message.from_dict` reverses it."""
        return {
            "id": self.id,
            "role": self.role.value,
            "parts": [part_to_dict(p) for p in self.parts],
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


def part_to_dict(part: Part) -> dict[str, Any]:
    """Return `part` as JSON (the form `Message.to_dict` and the session log use)."""
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
        return part_from_dict(data)
    except KeyError as exc:
        name = f"parts[{index}].{exc.args[0]}"
        raise InvalidMessage(name, None, "missing field") from None
    except InvalidMessage as exc:
        inner = exc.field.removeprefix("parts").removeprefix(".")
        name = f"parts[{index}].{inner}" if inner else f"parts[{index}]"
        raise InvalidMessage(name, exc.value, exc.reason) from None


def part_from_dict(data: Mapping[str, Any]) -> Part:
    """Return the part `part_to_dict` wrote; raises `InvalidMessage`."""
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
