"""The converter: one `cattrs.Converter`, its strict hooks, and its one error.

The hooks here read and write plain values (scalars, collections, JSON
values, enums and attrs classes); `_records` and `_tags` register the hooks
of turnfsm's own records on the same converter. A structuring failure becomes
one `CorruptRecord` (`_structure`), naming where in the data it is.
"""

from __future__ import annotations

import re
import typing
from collections.abc import Callable, Mapping, Sequence
from enum import Enum, IntEnum, StrEnum
from typing import Any, Final

import attrs
import cattrs
from cattrs.cols import (
    homogenous_tuple_structure_factory,
    is_mapping,
    is_mutable_sequence,
    is_sequence,
    list_structure_factory,
)
from cattrs.errors import (
    AttributeValidationNote,
    BaseValidationError,
    CattrsError,
    ForbiddenExtraKeysError,
    IterableValidationNote,
)
from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn, override

from turnfsm.core import OMITTED_IF_DEFAULT, Decision, Event
from turnfsm.errors import CorruptRecord
from turnfsm.messages import JSONValue, Part, ToolCallPart

__all__ = [
    "STORED_AS",
    "TAG",
    "_FAILURES",
    "_Invalid",
    "_SchemaError",
    "_converter",
    "_corrupt",
    "_enum_value",
    "_format_path",
    "_json_kind",
    "_name_of",
    "_object",
    "_structure",
    "stored_keys",
]


TAG: Final = "type"
"""The key naming the class of a tagged object (events, decisions, errors)."""


_UNION_NAMES: Final[dict[object, str]] = {
    Event: "Event",
    Decision: "Decision",
    Part: "Part",
}


class _SchemaError(TypeError):
    """Raised when a type cannot have a JSON form (a bug, never bad data)."""


class _Invalid(Exception):
    """A structuring failure found by one of our hooks, `path` below its value."""

    def __init__(self, path: tuple[str | int, ...], reason: str) -> None:
        super().__init__(path, reason)
        self.path = path
        self.reason = reason


# -- naming ------------------------------------------------------------------

_QUALIFIED = re.compile(r"\b(?:[A-Za-z_][\w]*\.)+([A-Za-z_]\w*)")


def _name_of(cls: object) -> str:
    """Return a short name of a type or union (``Event``, ``tuple[Message, ...]``).

    A union's name is worked out once (every record read asks for it).
    """
    hashable = _is_hashable(cls)
    name = _UNION_NAMES.get(cls) if hashable else None
    if name is not None:
        return name
    if isinstance(cls, type):
        return cls.__name__
    name = _QUALIFIED.sub(r"\1", repr(cls))
    if hashable:
        _UNION_NAMES[cls] = name
    return name


def _is_hashable(value: object) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


def _json_kind(value: object) -> str:
    match value:
        case None:
            return "null"
        case bool():
            return "a boolean"
        case int() | float():
            return "a number"
        case str():
            return "a string"
        case Mapping():
            return "an object"
        case list() | tuple():
            return "an array"
        case _:
            return type(value).__name__


def _format_path(path: Sequence[str | int]) -> str:
    out = ""
    for step in path:
        if isinstance(step, int):
            out += f"[{step}]"
        elif not step:
            continue
        elif step.startswith("["):
            out += step
        elif step.isidentifier() or "." in step:
            out += f".{step}" if out else step
        else:
            out += f"[{step!r}]"
    return out


# -- the converter -----------------------------------------------------------

_converter: Final = cattrs.Converter(
    use_alias=True,
    unstruct_collection_overrides={Sequence: list, Mapping: dict},
)


def _strict(
    base: type, kind: str, ok: Callable[[object], bool]
) -> Callable[[object, Any], Any]:
    def structure(value: object, cls: Any) -> Any:
        if not ok(value):
            raise _Invalid((), f"expected {kind}, got {_json_kind(value)}")
        # A subclass (a StrEnum such as Role) is built from the plain value.
        return value if cls is base else cls(value)

    return structure


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _structure_float(value: object, _: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _Invalid((), f"expected a number, got {_json_kind(value)}")
    return float(value)


def _is_str(value: object) -> bool:
    return isinstance(value, str)


def _is_bool(value: object) -> bool:
    return isinstance(value, bool)


_converter.register_structure_hook(str, _strict(str, "a string", _is_str))
_converter.register_structure_hook(int, _strict(int, "an integer", _is_int))
_converter.register_structure_hook(bool, _strict(bool, "a boolean", _is_bool))
_converter.register_structure_hook(float, _structure_float)


def _sequence_factory(cls: Any) -> Callable[[object, Any], Any]:
    if is_mutable_sequence(cls):
        base = list_structure_factory(cls, _converter)
    else:
        base = homogenous_tuple_structure_factory(cls, _converter)

    def structure(value: object, _: Any) -> Any:
        if not isinstance(value, list | tuple):
            raise _Invalid((), f"expected an array, got {_json_kind(value)}")
        return base(value, cls)

    return structure


def _mapping_factory(cls: Any) -> Callable[[object, Any], Any]:
    base = _converter.gen_structure_mapping(cls)

    def structure(value: object, _: Any) -> Any:
        if not isinstance(value, Mapping):
            raise _Invalid((), f"expected an object, got {_json_kind(value)}")
        return base(value, cls)

    return structure


_converter.register_structure_hook_factory(
    lambda t: is_sequence(t) and t is not str, _sequence_factory
)
_converter.register_structure_hook_factory(is_mapping, _mapping_factory)


def _json_value(value: object, _: Any) -> Any:
    return value  # tool-call arguments and the like: JSON already


# `JSONValue` is a recursive alias written as a string, which cattrs cannot
# follow; a field typed with it (once resolved) carries JSON as it is.
_JSON_FORMS: Final = (
    JSONValue,
    typing.get_args(typing.get_type_hints(ToolCallPart)["arguments"])[1],
)


def _is_json_value(cls: object) -> bool:
    return any(cls == form for form in _JSON_FORMS)


_converter.register_structure_hook_factory(_is_json_value, lambda _t: _json_value)
_converter.register_unstructure_hook_factory(
    _is_json_value, lambda _t: lambda value: value
)


def _enum_value(value: object) -> object:
    return value.value if isinstance(value, Enum) else value


# A StrEnum is a str too; its own hook makes it a plain str, not a member.
for _enum in (Enum, StrEnum, IntEnum):
    _converter.register_unstructure_hook(_enum, _enum_value)


def _object(value: object) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise _Invalid((), f"expected an object, got {_json_kind(value)}")
    return value


STORED_AS: Final = "turnfsm.stored_as"
"""A field's metadata: the JSON key it is stored under, when it was renamed.

``attrs.field(metadata={"turnfsm.stored_as": "retriable"})`` on a field now
named ``retryable``: records written before the rename keep reading, and new
ones keep their form.
"""


def stored_keys(cls: type) -> dict[str, Any]:
    """The cattrs overrides of `cls`'s fields stored under an old name."""
    return {
        f.name: override(rename=f.metadata[STORED_AS])
        for f in attrs.fields(cls)
        if STORED_AS in f.metadata
    }


def _attrs_structure_factory(cls: Any) -> Callable[[object, Any], Any]:
    # A key no field reads (a newer turnfsm's, a hand edit) is refused: read
    # and written back, the record would lose it without a word.
    base = make_dict_structure_fn(
        cls, _converter, _cattrs_forbid_extra_keys=True, **stored_keys(cls)
    )

    def structure(value: object, _: Any) -> Any:
        return base(_object(value), cls)

    return structure


def _written_keys(cls: type) -> dict[str, Any]:
    """`stored_keys`, and the fields left out while they have their default."""
    keys = stored_keys(cls)
    for f in attrs.fields(cls):
        if f.metadata.get(OMITTED_IF_DEFAULT):
            keys[f.name] = override(
                rename=f.metadata.get(STORED_AS), omit_if_default=True
            )
    return keys


_converter.register_structure_hook_factory(attrs.has, _attrs_structure_factory)
_converter.register_unstructure_hook_factory(
    lambda cls: attrs.has(cls) and bool(_written_keys(cls)),
    lambda cls: make_dict_unstructure_fn(cls, _converter, **_written_keys(cls)),
)


# -- translating failures ------------------------------------------------------------

_FAILURES: Final = (CattrsError, _Invalid, KeyError, TypeError, ValueError)
"""Everything structuring may raise on bad data; all become `CorruptRecord`."""


def _step_of(exc: BaseException) -> str | int | None:
    for note in getattr(exc, "__notes__", ()):
        if isinstance(note, AttributeValidationNote):
            return note.name
        if isinstance(note, IterableValidationNote):
            return note.index
    return None


def _corrupt(cls: object, exc: BaseException) -> CorruptRecord:
    """Translate a structuring failure into the one error, naming where it is.

    Raises:
        TypeError: the failure is a type with no JSON form (a bug).
    """
    path: list[str | int] = []
    others = 0
    while isinstance(exc, BaseValidationError) and exc.exceptions:
        others += len(exc.exceptions) - 1
        exc = exc.exceptions[0]
        step = _step_of(exc)
        if step is not None:
            path.append(step)
    if isinstance(exc, _SchemaError):
        raise exc
    if isinstance(exc, _Invalid):
        path.extend(exc.path)
        reason = exc.reason
    elif isinstance(exc, CorruptRecord):
        path.append(exc.path)
        reason = exc.reason
    elif isinstance(exc, ForbiddenExtraKeysError):
        path.append(sorted(exc.extra_fields)[0])
        reason = "not a field of this record"
    elif isinstance(exc, KeyError):
        key = exc.args[0] if exc.args else ""
        if not path or path[-1] != key:
            path.append(str(key))
        reason = "missing"
    else:
        reason = str(exc) or type(exc).__name__
    if others:
        reason += f" (and {others} more problem{'s' if others > 1 else ''})"
    return CorruptRecord(type=_name_of(cls), path=_format_path(path), reason=reason)


def _structure(cls: Any, data: object) -> Any:
    try:
        return _converter.structure(data, cls)
    except _FAILURES as exc:
        raise _corrupt(cls, exc) from exc
