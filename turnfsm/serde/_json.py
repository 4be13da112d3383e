"""The public conversions: records to JSON data and text, and back."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, TypeVar, overload

from turnfsm._json import escape_surrogates
from turnfsm.errors import CorruptRecord, TurnFSMError
from turnfsm.messages import JSONValue
from turnfsm.serde._converter import TAG, _converter, _name_of, _structure
from turnfsm.serde._tags import _ERRORS, _unknown_error, _unstructure_error

__all__ = [
    "dumps",
    "error_from_json",
    "error_to_json",
    "from_json",
    "loads",
    "to_json",
]

T = TypeVar("T")


def to_json(value: object) -> JSONValue:
    """Return `value` as plain JSON data (dicts, lists, strings, numbers, None).

    Args:
        value: A record: a message, an event, a decision, a snapshot, an
            error, any frozen attrs class of such values, or a collection of
            them.

    Raises:
        ConfigError: `value` is or holds an error that is not a class of
            `turnfsm.errors` with fields (``field`` is ``"error.type"``).
    """
    result: JSONValue = _converter.unstructure(value)
    return result


@overload
def from_json(cls: type[T], data: object) -> T: ...
@overload
def from_json(cls: object, data: object) -> Any: ...
def from_json(cls: object, data: object) -> Any:
    """Build a `cls` from its `to_json` form.

    Args:
        cls: The type to read: a class, or a union such as `Event`,
            `Decision` or ``TurnFSMError | None``.
        data: Parsed JSON.

    Raises:
        CorruptRecord: `data` is not a `cls` (a wrong type, a missing field, an
            unknown tag); `path` says where.
    """
    return _structure(cls, data)


def dumps(value: object) -> str:
    r"""Return `value` as compact JSON text with sorted keys (`loads` reverses it).

    The text encodes to UTF-8, whatever `value` holds: a lone surrogate (text
    decoded from bytes that were not UTF-8, such as a file name) is written
    as its JSON escape (``\udce9``), which reads back as the same text.

    Raises:
        ConfigError: as `to_json`.
        ValueError: `value` holds a float that JSON cannot carry (NaN, inf).
    """
    return escape_surrogates(
        json.dumps(
            to_json(value),
            separators=(",", ":"),
            sort_keys=True,
            ensure_ascii=False,
            allow_nan=False,
        )
    )


@overload
def loads(cls: type[T], text: str | bytes) -> T: ...
@overload
def loads(cls: object, text: str | bytes) -> Any: ...
def loads(cls: object, text: str | bytes) -> Any:
    """Build a `cls` from JSON text written by `dumps`.

    Raises:
        CorruptRecord: `text` is not JSON, or not a `cls` (as `from_json`).
    """
    try:
        data = json.loads(text)
    except ValueError as exc:  # JSONDecodeError and bad UTF-8
        raise CorruptRecord(
            type=_name_of(cls), path="", reason=f"not JSON ({exc})"
        ) from exc
    return _structure(cls, data)


def error_to_json(exc: TurnFSMError) -> dict[str, JSONValue]:
    """Return an error as a value: its class name under ``"type"`` and its fields.

    Raises:
        ConfigError: `exc` is not a class of `turnfsm.errors` with fields
            (``field`` is ``"error.type"``).
    """
    return _unstructure_error(exc)


def error_from_json(data: object) -> TurnFSMError:
    """Rebuild the error `error_to_json` described: the same class, the same fields.

    Raises:
        ConfigError: the ``"type"`` names no error class (``field`` is
            ``"error.type"``).
        CorruptRecord: a field is missing or of the wrong type.
    """
    if isinstance(data, Mapping):
        name = data.get(TAG)
        if not isinstance(name, str) or name not in _ERRORS:
            raise _unknown_error(name)
    error: TurnFSMError = _structure(TurnFSMError, data)
    return error
