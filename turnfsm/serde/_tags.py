"""Tagged records on the converter: events, decisions, errors and unions of records."""

from __future__ import annotations

import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, Final

import attrs
from cattrs.gen import (
    make_dict_structure_fn,
    make_dict_unstructure_fn,
    override,
)

from turnfsm import errors as _errors
from turnfsm.core import DECISION_TYPES, EVENT_TYPES, OMITTED_IF_DEFAULT
from turnfsm.errors import ConfigError, TurnFSMError
from turnfsm.serde._converter import (
    STORED_AS,
    TAG,
    _converter,
    _Invalid,
    _object,
    _SchemaError,
    stored_keys,
)
from turnfsm.serde._records import _PARTS

__all__ = [
    "ESCAPED_TAG",
    "_ERRORS",
    "_TAGGED",
    "_is_error_class",
    "_is_union",
    "_unknown_error",
    "_unstructure_error",
]


_TAGGED: Final[tuple[type, ...]] = (*EVENT_TYPES, *DECISION_TYPES)
"""Classes whose own JSON form carries their class name under `TAG`."""


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
    """Return the overrides of `cls`'s keys.

    A field stored under its old name (`STORED_AS`) is read and written
    there; a field keyed `TAG` moves to `ESCAPED_TAG`; a field marked
    `OMITTED_IF_DEFAULT` is left out while it has its default.
    """
    fields = attrs.fields(cls)
    renamed = stored_keys(cls)
    for f in fields:
        if f.metadata.get(OMITTED_IF_DEFAULT):
            renamed[f.name] = override(omit_if_default=True)
    keys = {f.metadata.get(STORED_AS, f.alias): f.name for f in fields}
    if TAG not in keys:
        return renamed
    if ESCAPED_TAG in keys:
        raise _SchemaError(
            f"{cls.__name__} has fields keyed both {TAG!r} and {ESCAPED_TAG!r}"
        )
    return {**renamed, keys[TAG]: override(rename=ESCAPED_TAG)}


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
        hook = make_dict_structure_fn(
            cls, _converter, _cattrs_forbid_extra_keys=True, **_escapes(cls)
        )
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
