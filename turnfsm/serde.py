"""One converter between turnfsm's records and plain JSON.

Every record that crosses a process boundary (a session log, a store, a
trace) goes through the one `cattrs.Converter` of this module, so each type
has exactly one JSON form:

- a `Message` is its `Message.to_dict` form; a `MessageLog` (or a `Joined`
  view) is a list of messages and reads back as a `MessageLog`;
- an event or a decision is an object tagged with its class name,
  ``{"type": "ModelReplied", "message": {...}, "usage": null}``;
- an error (any class of `turnfsm.errors`) is a value tagged the same way,
  ``{"type": "CompactionStalled", "used": 5, "limit": 9}``, and reads back as
  the same class with the same fields (an empty optional collection such as
  `ContextExceeded.largest` is left out, and reads back empty);
- a `Snapshot` is its `Snapshot.to_dict` form;
- any other frozen attrs class is an object of its fields (keyed by their
  ``__init__`` names, so a private ``_x`` field is ``"x"``); a union of several
  attrs classes is tagged with ``"type"`` like the events;
- a tagged class's own field named ``type`` (`RunCrashed.type`) is keyed
  ``"type_"`` (`ESCAPED_TAG`), so the tag stays unambiguous;
- enums are their values, mappings objects, tuples and sequences arrays.

Reading back is strict: a value of the wrong JSON type (``"5"`` for an int), a
missing field, an unknown tag or a malformed message raises one error,
`CorruptRecord`, naming what was read, where in the data (``path``) and why.

`envelope` wraps a top-level record with the schema version and its type
(``{"v": 1, "type": "Snapshot", "data": {...}}``); `open_envelope` rejects a
version it does not know.
"""

from __future__ import annotations

import json
import re
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from enum import Enum, IntEnum, StrEnum
from typing import Any, Final, TypeVar, overload

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
    IterableValidationNote,
)
from cattrs.gen import (
    make_dict_structure_fn,
    make_dict_unstructure_fn,
    override,
)

from turnfsm import errors as _errors
from turnfsm.core import (
    DECISION_TYPES,
    EVENT_TYPES,
    Budget,
    Decision,
    Event,
    Failure,
    Snapshot,
)
from turnfsm.errors import ConfigError, CorruptRecord, TurnFSMError
from turnfsm.messages import (
    ImagePart,
    Joined,
    JSONValue,
    Message,
    MessageLog,
    Part,
    TextPart,
    ToolCallPart,
    ToolResultPart,
)
from turnfsm.messages._values import _part_from_dict, _part_to_dict
from turnfsm.values import ErrorInfo, Usage

__all__ = [
    "ESCAPED_TAG",
    "SCHEMA_VERSION",
    "TAG",
    "dumps",
    "envelope",
    "error_from_json",
    "error_to_json",
    "from_json",
    "loads",
    "open_envelope",
    "to_json",
]

T = TypeVar("T")

SCHEMA_VERSION: Final = 1
"""The version `envelope` writes and the only one `open_envelope` reads."""

TAG: Final = "type"
"""The key naming the class of a tagged object (events, decisions, errors)."""

_TAGGED: Final[tuple[type, ...]] = (*EVENT_TYPES, *DECISION_TYPES)
"""Classes whose own JSON form carries their class name under `TAG`."""

_PARTS: Final[dict[type, str]] = {
    TextPart: "text",
    ToolCallPart: "tool_call",
    ToolResultPart: "tool_result",
    ImagePart: "image",
}
"""Message parts, tagged (by `Message.to_dict`) with their own short names."""

_UNION_NAMES: Final[dict[object, str]] = {
    Event: "Event",
    Decision: "Decision",
    Part: "Part",
}


def _has_fields(cls: type) -> bool:
    return bool(attrs.has(cls))


def _in_errors(cls: type) -> bool:
    """Whether `cls` is defined in `turnfsm.errors` (in one of its modules)."""
    module = cls.__module__
    return module == _errors.__name__ or module.startswith(f"{_errors.__name__}.")


def _error_classes() -> dict[str, type[TurnFSMError]]:
    found: dict[str, type[TurnFSMError]] = {}
    todo: list[type[TurnFSMError]] = [TurnFSMError]
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        # attrs rebuilds a slotted class: the class it replaced stays among
        # the subclasses until the garbage collector takes it, so only the
        # class the module names is the error.
        named = getattr(_errors, cls.__name__, None) is cls
        if named and _in_errors(cls) and _has_fields(cls):
            found[cls.__name__] = cls
    return dict(sorted(found.items()))


_ERRORS: Final = _error_classes()
"""Every error class of `turnfsm.errors` with fields, by class name."""


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
    """Return a short name of a type or union (``Event``, ``tuple[Message, ...]``)."""
    name = _UNION_NAMES.get(cls) if _is_hashable(cls) else None
    if name is not None:
        return name
    if isinstance(cls, type):
        return cls.__name__
    return _QUALIFIED.sub(r"\1", repr(cls))


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


def _attrs_structure_factory(cls: Any) -> Callable[[object, Any], Any]:
    base = _converter.gen_structure_attrs_fromdict(cls)

    def structure(value: object, _: Any) -> Any:
        return base(_object(value), cls)

    return structure


_converter.register_structure_hook_factory(attrs.has, _attrs_structure_factory)


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
        part = _part_from_dict(data)
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
    _converter.register_unstructure_hook(_part, _part_to_dict)
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


# -- tagged classes: events, decisions and errors ----------------------------

ESCAPED_TAG: Final = f"{TAG}_"
"""The key of a tagged class's own field named like `TAG` (`RunCrashed.type`)."""


def _check_untagged_fields(cls: type) -> None:
    for field in attrs.fields(cls):
        if TAG in (field.name, field.alias):
            raise _SchemaError(
                f"{cls.__name__}.{field.name} clashes with the {TAG!r} tag of "
                "the union it is in; rename it"
            )


def _escapes(cls: type) -> dict[str, Any]:
    """Return the override that moves a field keyed `TAG` to `ESCAPED_TAG`."""
    keys = {f.alias: f.name for f in attrs.fields(cls)}
    if TAG not in keys:
        return {}
    if ESCAPED_TAG in keys:
        raise _SchemaError(
            f"{cls.__name__} has fields keyed both {TAG!r} and {ESCAPED_TAG!r}"
        )
    return {keys[TAG]: override(rename=ESCAPED_TAG)}


_BODY_UNSTRUCTURE: Final[dict[type, Callable[[Any], dict[str, Any]]]] = {}
_BODY_STRUCTURE: Final[dict[type, Callable[[Mapping[str, Any], Any], Any]]] = {}


def _body_unstructure(cls: type) -> Callable[[Any], dict[str, Any]]:
    """Return the hook writing a tagged class's fields (made on first use)."""
    hook = _BODY_UNSTRUCTURE.get(cls)
    if hook is None:
        attrs.resolve_types(cls)
        hook = make_dict_unstructure_fn(cls, _converter, **_escapes(cls))
        _BODY_UNSTRUCTURE[cls] = hook
    return hook


def _body_structure(cls: type) -> Callable[[Mapping[str, Any], Any], Any]:
    """Return the hook reading a tagged class's fields (made on first use)."""
    hook = _BODY_STRUCTURE.get(cls)
    if hook is None:
        attrs.resolve_types(cls)
        hook = make_dict_structure_fn(cls, _converter, **_escapes(cls))
        _BODY_STRUCTURE[cls] = hook
    return hook


def _untagged(data: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if k != TAG}


def _tagged_unstructure(cls: type) -> Callable[[Any], dict[str, Any]]:
    name = cls.__name__

    def unstructure(value: Any) -> dict[str, Any]:
        return {TAG: name, **_body_unstructure(cls)(value)}

    return unstructure


def _tagged_structure(cls: type) -> Callable[[object, Any], Any]:
    name = cls.__name__

    def structure(value: object, _: Any) -> Any:
        data = _object(value)
        tag = data.get(TAG)
        if tag != name:
            got = "no tag" if tag is None else repr(tag)
            raise _Invalid((TAG,), f"expected {name!r}, got {got}")
        return _body_structure(cls)(_untagged(data), cls)

    return structure


for _cls in _TAGGED:
    _converter.register_unstructure_hook(_cls, _tagged_unstructure(_cls))
    _converter.register_structure_hook(_cls, _tagged_structure(_cls))


def _is_error_class(cls: object) -> bool:
    return isinstance(cls, type) and issubclass(cls, TurnFSMError)


def _unknown_error(name: object) -> ConfigError:
    return ConfigError("error.type", name, f"one of {', '.join(_ERRORS)}")


def _optional_collections(cls: type) -> list[str]:
    """Return the keys of `cls`'s fields that default to an empty tuple."""
    return [f.alias for f in attrs.fields(cls) if f.default == ()]


def _unstructure_error(exc: TurnFSMError) -> dict[str, Any]:
    cls = type(exc)
    if _ERRORS.get(cls.__name__) is not cls:
        raise _unknown_error(cls.__name__)
    body = _body_unstructure(cls)(exc)
    # An empty optional collection (`ContextExceeded.largest`) is left out, so
    # such an error keeps the form records written before the field have.
    for key in _optional_collections(cls):
        if body.get(key) == []:
            del body[key]
    return {TAG: cls.__name__, **body}


def _error_structure_factory(declared: type) -> Callable[[object, Any], Any]:
    def structure(value: object, _: Any) -> TurnFSMError:
        data = _object(value)
        name = data.get(TAG)
        cls = _ERRORS.get(name) if isinstance(name, str) else None
        if cls is None:
            raise _Invalid((TAG,), str(_unknown_error(name)))
        if not issubclass(cls, declared):
            raise _Invalid((TAG,), f"expected a {declared.__name__}, got {name!r}")
        result: TurnFSMError = _body_structure(cls)(_untagged(data), cls)
        return result

    return structure


_converter.register_unstructure_hook_factory(
    _is_error_class, lambda _cls: _unstructure_error
)
_converter.register_structure_hook_factory(_is_error_class, _error_structure_factory)


# -- unions of records -----------------------------------------------------------


def _is_union(cls: object) -> bool:
    return typing.get_origin(cls) in (typing.Union, types.UnionType)


def _union_members(cls: object) -> tuple[Any, ...] | None:
    """Return the members of a union of two or more record classes, else None."""
    if not _is_union(cls):
        return None
    members = tuple(m for m in typing.get_args(cls) if m is not type(None))
    if len(members) < 2 or not all(
        isinstance(m, type) and (attrs.has(m) or _is_error_class(m)) for m in members
    ):
        return None
    return members


def _self_tagged(cls: type) -> bool:
    return cls in _TAGGED or cls in _PARTS or _is_error_class(cls)


def _union_tags(members: tuple[type, ...]) -> dict[str, type]:
    """Map every tag the union accepts to the member that reads it."""
    tags: dict[str, type] = {}
    for member in members:
        if _is_error_class(member):
            names = [n for n, c in _ERRORS.items() if issubclass(c, member)]
        elif member in _PARTS:
            names = [_PARTS[member]]
        else:
            if member not in _TAGGED:
                _check_untagged_fields(member)
            names = [member.__name__]
        for name in names:
            if tags.setdefault(name, member) is not member:
                raise _SchemaError(f"two members of the union are tagged {name!r}")
    return tags


def _union_unstructure_factory(cls: Any) -> Callable[[Any], Any]:
    members = _union_members(cls)
    assert members is not None
    _union_tags(members)  # check the tags once, when the hook is made
    plain = {m: _converter.get_unstructure_hook(m) for m in members}

    def unstructure(value: Any) -> Any:
        if value is None:
            return None
        kind = type(value)
        if kind in plain and not _self_tagged(kind):
            return {TAG: kind.__name__, **plain[kind](value)}
        return _converter.unstructure(value)

    return unstructure


def _union_structure_factory(cls: Any) -> Callable[[object, Any], Any]:
    members = _union_members(cls)
    assert members is not None
    tags = _union_tags(members)
    optional = type(None) in typing.get_args(cls)
    hooks = {m: _converter.get_structure_hook(m) for m in members}

    def structure(value: object, _: Any) -> Any:
        if value is None and optional:
            return None
        data = _object(value)
        tag = data.get(TAG)
        member = tags.get(tag) if isinstance(tag, str) else None
        if member is None:
            got = "no tag" if tag is None else f"{tag!r}"
            expected = ", ".join(tags)
            raise _Invalid((TAG,), f"unknown type {got}; expected one of {expected}")
        if _self_tagged(member):
            return hooks[member](data, member)
        return hooks[member](_untagged(data), member)

    return structure


def _is_record_union(cls: object) -> bool:
    return _union_members(cls) is not None


_converter.register_unstructure_hook_factory(
    _is_record_union, _union_unstructure_factory
)
_converter.register_structure_hook_factory(_is_record_union, _union_structure_factory)


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


# -- the public functions ----------------------------------------------------------


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
    """Return `value` as compact JSON text with sorted keys (`loads` reverses it).

    Raises:
        ConfigError: as `to_json`.
        ValueError: `value` holds a float that JSON cannot carry (NaN, inf).
    """
    return json.dumps(
        to_json(value),
        separators=(",", ":"),
        sort_keys=True,
        ensure_ascii=False,
        allow_nan=False,
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
    candidates = _envelope_types(cls)
    member = _envelope_member(name, candidates) if isinstance(name, str) else None
    if member is None:
        known = ", ".join(c.__name__ for c in candidates)
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
