"""Messages and snapshots on the converter: records with a dict form of their own."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from turnfsm import errors as _errors
from turnfsm.core import Snapshot
from turnfsm.errors import ConfigError
from turnfsm.messages import (
    ImagePart,
    Joined,
    Message,
    MessageLog,
    Part,
    TextPart,
    ToolCallPart,
    ToolResultPart,
    part_from_dict,
    part_to_dict,
)
from turnfsm.serde._converter import (
    TAG,
    _converter,
    _enum_value,
    _Invalid,
    _json_kind,
    _object,
)

__all__ = ["_PARTS"]


_PARTS: Final[dict[type, str]] = {
    TextPart: "text",
    ToolCallPart: "tool_call",
    ToolResultPart: "tool_result",
    ImagePart: "image",
}
"""Message parts, tagged (by `Message.to_dict`) with their own short names."""


# -- messages ----------------------------------------------------------------


def _structure_message(value: object, _: Any) -> Message:
    data = _object(value)
    parts = data.get("parts")
    if not isinstance(parts, list | tuple):
        raise _Invalid(("parts",), f"expected an array, got {_json_kind(parts)}")
    for index, part in enumerate(parts):
        if not isinstance(part, Mapping):
            raise _Invalid(
                ("parts", index), f"expected an object, got {_json_kind(part)}"
            )
    try:
        return Message.from_dict(data)
    except _errors.InvalidMessage as exc:
        raise _Invalid((exc.field,), str(exc)) from exc


def _structure_log(value: object, _: Any) -> MessageLog:
    return MessageLog(_converter.structure(value, tuple[Message, ...]))


def _unstructure_messages(value: Sequence[Message]) -> list[dict[str, Any]]:
    return [m.to_dict() for m in value]


def _structure_part(value: object, cls: Any) -> Part:
    data = _object(value)
    try:
        part = part_from_dict(data)
    except KeyError as exc:
        raise _Invalid((str(exc.args[0]),), "missing") from exc
    except _errors.InvalidMessage as exc:
        raise _Invalid((TAG,), str(exc)) from exc
    if isinstance(cls, type) and not isinstance(part, cls):
        raise _Invalid((TAG,), f"expected {_PARTS[cls]!r}, got {data.get(TAG)!r}")
    return part


_converter.register_unstructure_hook(Message, Message.to_dict)
_converter.register_structure_hook(Message, _structure_message)
_converter.register_unstructure_hook(MessageLog, _unstructure_messages)
_converter.register_unstructure_hook(Joined, _unstructure_messages)
_converter.register_structure_hook(MessageLog, _structure_log)
for _part in _PARTS:
    _converter.register_unstructure_hook(_part, part_to_dict)
    _converter.register_structure_hook(_part, _structure_part)


# -- snapshots ---------------------------------------------------------------


def _unstructure_snapshot(snapshot: Snapshot) -> dict[str, Any]:
    return {k: _enum_value(v) for k, v in snapshot.to_dict().items()}


def _structure_snapshot(value: object, _: Any) -> Snapshot:
    data = _object(value)
    try:
        return Snapshot.from_dict(data)
    except ConfigError as exc:
        where = () if exc.field == "snapshot" else (exc.field,)
        raise _Invalid(where, str(exc)) from exc
    except AttributeError as exc:  # a part or a budget that is not an object
        raise _Invalid((), f"a malformed snapshot ({exc})") from exc


_converter.register_unstructure_hook(Snapshot, _unstructure_snapshot)
_converter.register_structure_hook(Snapshot, _structure_snapshot)
