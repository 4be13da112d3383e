"""Envelopes: a top-level record wrapped with the schema version and its type."""

from __future__ import annotations

import typing
from collections.abc import Mapping
from typing import Any, Final, TypeVar, overload

from turnfsm.core import Budget, Failure, Snapshot
from turnfsm.errors import CorruptRecord, TurnFSMError
from turnfsm.messages import JSONValue, Message, MessageLog
from turnfsm.serde._converter import (
    _FAILURES,
    TAG,
    _converter,
    _corrupt,
    _format_path,
    _json_kind,
    _name_of,
)
from turnfsm.serde._json import to_json
from turnfsm.serde._tags import _ERRORS, _TAGGED, _is_error_class, _is_union
from turnfsm.values import ErrorInfo, Usage

__all__ = ["SCHEMA_VERSION", "envelope", "open_envelope"]

T = TypeVar("T")


SCHEMA_VERSION: Final = 1
"""The version `envelope` writes and the only one `open_envelope` reads."""


_ENVELOPED: Final[tuple[type, ...]] = (
    *_TAGGED,
    Snapshot,
    Budget,
    Failure,
    Message,
    MessageLog,
    Usage,
    ErrorInfo,
    TurnFSMError,
)
"""What `open_envelope` reads when it is not told the type."""


def envelope(value: object) -> dict[str, JSONValue]:
    """Return `value` wrapped with the schema version and its class name.

    The form is ``{"v": SCHEMA_VERSION, "type": "<class name>", "data": ...}``,
    where ``data`` is `to_json(value)`.

    Raises:
        ConfigError: as `to_json`.
    """
    return {"v": SCHEMA_VERSION, TAG: type(value).__name__, "data": to_json(value)}


def _envelope_types(cls: object) -> tuple[type, ...]:
    if cls is None:
        return _ENVELOPED
    members = typing.get_args(cls) if _is_union(cls) else (cls,)
    return tuple(m for m in members if isinstance(m, type) and m is not type(None))


_MEMBERS: dict[tuple[object, str], type] = {}
"""(expected type, envelope's type name) -> the class it reads as: a long log
names a few types many times, and the search is the same each time."""


def _member_for(cls: object, name: str) -> type | None:
    try:
        return _MEMBERS[cls, name]
    except KeyError:
        pass
    except TypeError:  # an unhashable `cls`: no cache
        return _envelope_member(name, _envelope_types(cls))
    found = _envelope_member(name, _envelope_types(cls))
    if found is not None:  # only real classes: a bad name is not kept
        _MEMBERS[cls, name] = found
    return found


def _envelope_member(name: str, candidates: tuple[type, ...]) -> type | None:
    for cls in candidates:
        if cls.__name__ == name:
            return cls
        if _is_error_class(cls):
            error = _ERRORS.get(name)
            if error is not None and issubclass(error, cls):
                return error
    return None


@overload
def open_envelope(data: object) -> object: ...
@overload
def open_envelope(data: object, cls: type[T]) -> T: ...
@overload
def open_envelope(data: object, cls: object) -> Any: ...
def open_envelope(data: object, cls: object = None) -> Any:
    """Read a record `envelope` wrote.

    Args:
        data: Parsed JSON of an envelope.
        cls: The type expected: a class or a union whose members the
            envelope's ``"type"`` picks from. Without it, any event,
            decision, snapshot, budget, failure, message, message log, usage,
            error info or error.

    Raises:
        CorruptRecord: the version is not `SCHEMA_VERSION` (``path`` is
            ``"v"``), the type is not one expected (``path`` is ``"type"``), or
            the data is not a record of that type (``path`` under ``"data"``).
    """
    expected = "envelope" if cls is None else _name_of(cls)
    if not isinstance(data, Mapping):
        reason = f"expected an object, got {_json_kind(data)}"
        raise CorruptRecord(type=expected, path="", reason=reason)
    version = data.get("v")
    if version != SCHEMA_VERSION or isinstance(version, bool):
        raise CorruptRecord(
            type=expected,
            path="v",
            reason=f"unknown schema version {version!r}; "
            f"this turnfsm reads version {SCHEMA_VERSION}",
        )
    name = data.get(TAG)
    member = _member_for(cls, name) if isinstance(name, str) else None
    if member is None:
        known = ", ".join(c.__name__ for c in _envelope_types(cls))
        raise CorruptRecord(
            type=expected,
            path=TAG,
            reason=f"unknown record type {name!r}; expected one of {known}",
        )
    if "data" not in data:
        raise CorruptRecord(type=member.__name__, path="data", reason="missing")
    try:
        return _converter.structure(data["data"], member)
    except _FAILURES as exc:
        inner = _corrupt(member, exc)
        path = _format_path(["data", inner.path])
        raise CorruptRecord(type=inner.type, path=path, reason=inner.reason) from exc
