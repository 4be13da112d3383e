"""Tool parameters: JSON schemas from annotations, and arguments read back.

One mechanism serves every way of declaring a tool's parameters. A plain
function's annotated parameters and the fields of an attrs class, a dataclass
or a `TypedDict` all go through `schema_of` (annotation to JSON Schema, Draft
2020-12), and the validated arguments are read back by one cattrs converter
(`structure_hook`) that follows the same annotations. A pydantic model
describes and reads itself (`model_json_schema`, `model_validate_json`); pydantic
is never imported here: a class is one of its models only if pydantic is
already loaded.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import inspect
import json
import re
import sys
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, Literal, Union, get_args, get_origin

import attrs
import cattrs
from jsonschema import Draft202012Validator

__all__ = [
    "Unsupported",
    "class_schema",
    "is_params_class",
    "parse_doc",
    "schema_of",
    "structure_hook",
    "unresolved",
]

JSONSchema = dict[str, Any]
_Hook = Callable[[Any, Any], Any]

_NONE: Final = type(None)
_SCALARS: Final[dict[Any, str]] = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    _NONE: "null",
}
_ARRAYS: Final = (
    list,
    set,
    frozenset,
    Sequence,
    typing.MutableSequence,
    typing.AbstractSet,
    typing.MutableSet,
)
_OBJECTS: Final = (dict, Mapping, typing.MutableMapping)
_ARG_LINE: Final = re.compile(r"^\s{2,}(\*{0,2}\w+)(?:\s*\([^)]*\))?:\s*(.*)$")
_SECTIONS: Final = {"Args:", "Arguments:", "Parameters:", "Attributes:"}
_NUMPY_SECTIONS: Final = {"Parameters", "Other Parameters", "Attributes"}
_NUMPY_RULE: Final = re.compile(r"-{3,}")
_REST_PARAM: Final = re.compile(
    r"^\s*:(?:param|parameter|arg|argument)\s+(?:[^:]*\s)?\*{0,2}(\w+):(.*)$"
)


class Unsupported(TypeError):
    """Raised when an annotation has no JSON schema; the caller names the tool."""


# -- docstrings ----------------------------------------------------------------


def parse_doc(doc: str) -> tuple[str, dict[str, str]]:
    """Return a docstring's summary and its argument descriptions.

    The ``Args:`` section of a function and the ``Attributes:`` section of a
    class are read alike: Google style, or, when there is none, NumPy style
    (a ``Parameters`` or ``Attributes`` heading underlined with dashes), or
    reST fields (``:param name: text``).
    """
    summary = doc.split("\n\n", 1)[0].replace("\n", " ").strip()
    args: dict[str, str] = {}
    in_args = False
    current: str | None = None
    for line in doc.splitlines():
        stripped = line.strip()
        if stripped in _SECTIONS:
            in_args = True
            continue
        if in_args and stripped.endswith(":") and not line.startswith(" "):
            break
        if not in_args:
            continue
        match = _ARG_LINE.match(line)
        if match and len(line) - len(line.lstrip()) <= 4:
            current = match.group(1).lstrip("*")
            args[current] = match.group(2).strip()
        elif current and stripped:
            args[current] = f"{args[current]} {stripped}".strip()
    return summary, args or _numpy_args(doc.splitlines()) or _rest_args(doc)


def _rest_args(doc: str) -> dict[str, str]:
    """A reST (Sphinx) docstring's ``:param name: text`` fields, by name.

    A field runs on over the more indented lines below it.
    """
    args: dict[str, str] = {}
    current: str | None = None
    for line in doc.splitlines():
        match = _REST_PARAM.match(line)
        if match:
            current = match.group(1)
            args[current] = match.group(2).strip()
        elif current and line[:1].isspace() and not line.lstrip().startswith(":"):
            args[current] = f"{args[current]} {line.strip()}".strip()
        else:
            current = None
    return args


def _numpy_args(lines: Sequence[str]) -> dict[str, str]:
    """A NumPy-style docstring's argument descriptions, by name.

    An entry is ``name : type`` (or ``a, b : type``, or a bare name) at the
    section's indentation; its description is the more indented lines below.
    """
    args: dict[str, str] = {}
    in_args = False
    indent: int | None = None
    current: list[str] = []
    for i, line in enumerate(lines):
        stripped = line.strip()
        if _NUMPY_RULE.fullmatch(stripped):
            continue
        if (
            stripped
            and i + 1 < len(lines)
            and _NUMPY_RULE.fullmatch(lines[i + 1].strip())
        ):
            in_args = stripped in _NUMPY_SECTIONS
            indent, current = None, []
            continue
        if not in_args or not stripped:
            continue
        depth = len(line) - len(line.lstrip())
        if indent is None:
            indent = depth
        if depth <= indent:
            names = [
                n.strip().lstrip("*") for n in stripped.split(":", 1)[0].split(",")
            ]
            current = [n for n in names if n.isidentifier()]
            args.update((name, "") for name in current)
        else:
            for name in current:
                args[name] = f"{args[name]} {stripped}".strip()
    return args


# -- annotations to schemas ----------------------------------------------------


def is_pydantic_model(tp: object) -> bool:
    """Tell whether `tp` is a pydantic model class (without importing pydantic)."""
    pydantic = sys.modules.get("pydantic")
    return (
        pydantic is not None
        and isinstance(tp, type)
        and issubclass(tp, pydantic.BaseModel)
    )


def is_params_class(tp: object) -> bool:
    """Tell whether `tp` is a class whose fields can be a tool's parameters."""
    return isinstance(tp, type) and (
        attrs.has(tp)
        or dataclasses.is_dataclass(tp)
        or typing.is_typeddict(tp)
        or is_pydantic_model(tp)
    )


def schema_of(tp: Any, defs: dict[str, JSONSchema]) -> JSONSchema:
    """Return the JSON schema of values of the annotation `tp`.

    `defs` collects the ``$defs`` a pydantic model's schema refers to; the
    caller puts them at the root of the tool's schema.

    Raises:
        Unsupported: `tp` has no JSON form (``object``, a set of classes, a
            mapping with non-string keys, a class that contains itself).
    """
    return _schema(tp, defs, ())


def _schema(tp: Any, defs: dict[str, JSONSchema], seen: tuple[type, ...]) -> JSONSchema:
    if get_origin(tp) is typing.Annotated:
        inner, *extras = get_args(tp)
        described = _schema(inner, defs, seen)
        described = {**described, **_constraints(extras, described.get("type"))}
        notes = [e for e in extras if isinstance(e, str)]
        return {**described, "description": " ".join(notes)} if notes else described
    if tp is Any:
        return {}
    if tp in _SCALARS:
        return {"type": _SCALARS[tp]}
    origin, args = get_origin(tp), get_args(tp)
    if origin is Literal:
        return {"enum": _json_scalars(list(args), tp)}
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        if not len(tp):
            raise Unsupported(f"{tp.__name__} has no members: no value can be given")
        return {"enum": _json_scalars([m.value for m in tp], tp)}
    if origin in (Union, types.UnionType):
        options = [a for a in args if a is not _NONE]
        if len(options) == 1:  # Optional[X]
            return {"anyOf": [_schema(options[0], defs, seen), {"type": "null"}]}
        return {"anyOf": [_schema(a, defs, seen) for a in args]}
    if origin is tuple or tp is tuple:
        # `tuple[()]` has no args either (3.11), but it is not the bare `tuple`.
        if not args and tp not in (tuple, typing.Tuple):  # noqa: UP006
            return {"type": "array", "items": {}, "maxItems": 0}
        return _tuple_schema(args, defs, seen)
    if origin in _ARRAYS or tp in _ARRAYS:
        # Always with "items": OpenAI refuses an array schema without it.
        items = _schema(args[0], defs, seen) if args else {}
        return {"type": "array", "items": items}
    if origin in _OBJECTS or tp in _OBJECTS:
        return _mapping_schema(tp, args, defs, seen)
    if is_params_class(tp):
        if tp in seen:
            raise Unsupported(f"{tp.__name__} contains itself; it cannot be described")
        return class_schema(tp, defs, (*seen, tp))
    raise Unsupported(f"unsupported annotation {tp!r}")


_BOUNDS: Final = {
    "gt": "exclusiveMinimum",
    "ge": "minimum",
    "lt": "exclusiveMaximum",
    "le": "maximum",
    "multiple_of": "multipleOf",
}
_LENGTHS: Final = {
    "string": ("minLength", "maxLength"),
    "array": ("minItems", "maxItems"),
    "object": ("minProperties", "maxProperties"),
}


def _constraints(extras: Sequence[object], kind: object) -> JSONSchema:
    """The JSON Schema keywords of an `Annotated`'s constraints, for `kind` values.

    The ``annotated_types`` constraints (``Ge(1)``, ``Interval(gt=0)``,
    ``Len(1, 20)``, ...) and a pydantic ``Field(...)``'s (its constraints,
    ``pattern`` and ``description``), read by their attributes: neither
    library is imported. Anything else is left to the tool.
    """
    out: JSONSchema = {}
    for extra in extras:
        module = type(extra).__module__
        if module == "pydantic.fields" and type(extra).__name__ == "FieldInfo":
            out.update(_constraints(getattr(extra, "metadata", ()), kind))
            description = getattr(extra, "description", None)
            if isinstance(description, str):
                out["description"] = description
            continue
        if module != "annotated_types" and not module.startswith("pydantic"):
            continue
        for name, keyword in _BOUNDS.items():
            value = getattr(extra, name, None)
            if isinstance(value, int | float) and not isinstance(value, bool):
                out[keyword] = value
        pattern = getattr(extra, "pattern", None)
        if isinstance(pattern, str):
            out["pattern"] = pattern
        lowest = getattr(extra, "min_length", None)
        highest = getattr(extra, "max_length", None)
        keywords = [_LENGTHS[kind]] if kind in _LENGTHS else list(_LENGTHS.values())
        for low, high in keywords:
            if isinstance(lowest, int) and lowest > 0:
                out[low] = lowest
            if isinstance(highest, int):
                out[high] = highest
    return out


def _with_items(schema: Any) -> Any:
    """`schema` with an ``items`` on each array schema (pydantic leaves some out).

    A tuple is described by ``prefixItems`` alone, which OpenAI does not read
    and refuses without ``items``: ``items`` says what any place holds, as
    `_tuple_schema` does. Values in a schema (defaults, examples) are data,
    left as they are.
    """
    if isinstance(schema, list):
        return [_with_items(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {
        key: value if key in _DATA else _with_items(value)
        for key, value in schema.items()
    }
    if "items" not in out and (out.get("type") == "array" or "prefixItems" in out):
        places = out.get("prefixItems")
        out["items"] = _any_place(places if isinstance(places, list) else [])
    return out


def _any_place(places: list[Any]) -> JSONSchema:
    """The schema of what any of a tuple's `places` holds (each kind once)."""
    kinds = [p for i, p in enumerate(places) if p not in places[:i]]
    if not kinds:
        return {}
    return kinds[0] if len(kinds) == 1 else {"anyOf": kinds}


_DATA: Final = frozenset({"default", "examples", "const", "enum"})


def _json_scalars(values: list[Any], tp: object) -> list[Any]:
    for value in values:
        if value is not None and not isinstance(value, str | int | float | bool):
            raise Unsupported(f"{tp!r}: {value!r} is not a JSON value")
    return values


def _tuple_schema(
    args: tuple[Any, ...], defs: dict[str, JSONSchema], seen: tuple[type, ...]
) -> JSONSchema:
    if not args:
        return {"type": "array", "items": {}}
    if len(args) == 2 and args[1] is Ellipsis:
        return {"type": "array", "items": _schema(args[0], defs, seen)}
    # Each place by "prefixItems", the length by minItems and maxItems, and
    # "items" what any place holds, for a reader of no "prefixItems" (OpenAI
    # refuses an array schema without "items").
    places = [_schema(a, defs, seen) for a in args]
    return {
        "type": "array",
        "prefixItems": places,
        "items": _any_place(places),
        "minItems": len(args),
        "maxItems": len(args),
    }


def _mapping_schema(
    tp: Any, args: tuple[Any, ...], defs: dict[str, JSONSchema], seen: tuple[type, ...]
) -> JSONSchema:
    if not args:
        return {"type": "object"}
    key, value = args
    if key not in (str, Any):
        raise Unsupported(f"{tp!r}: JSON object keys are strings")
    return {"type": "object", "additionalProperties": _schema(value, defs, seen)}


def class_schema(
    cls: type, defs: dict[str, JSONSchema], seen: tuple[type, ...] = ()
) -> JSONSchema:
    """Return the object schema of a parameters class (see `is_params_class`).

    An attrs class, a dataclass or a `TypedDict` is an object of its fields,
    described by the ``Attributes:`` section of the class's docstring (or an
    attrs field's ``metadata["description"]``); unknown keys are refused. A
    pydantic model's schema is its own `model_json_schema()`.

    Raises:
        Unsupported: a field has no annotation or an unsupported one.
    """
    if is_pydantic_model(cls):
        return _pydantic_schema(cls, defs)
    _, docs = parse_doc(inspect.getdoc(cls) or "")
    properties: dict[str, JSONSchema] = {}
    required: list[str] = []
    for key, tp, is_required, note in _fields(cls):
        try:
            schema = _schema(tp, defs, (*seen, cls))
        except Unsupported as exc:
            raise Unsupported(f"{cls.__name__}.{key}: {exc}") from None
        description = note or docs.get(key)
        if description:
            schema = {**schema, "description": description}
        properties[key] = schema
        if is_required:
            required.append(key)
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


def unresolved(
    annotations: Mapping[str, object],
    globalns: dict[str, Any],
    localns: Mapping[str, Any] | None = None,
) -> tuple[str, str] | None:
    """The first of `annotations` that does not resolve, if any, and why.

    `typing.get_type_hints` says what name is missing, not which annotation
    holds it: each is tried on its own, in the namespaces it is read in.
    Returns its name and ``"annotation 'X' cannot be resolved (...)"``.
    """
    for name, annotation in annotations.items():
        try:
            typing.get_type_hints(
                _Holder(name, annotation), globalns, localns, include_extras=True
            )
        except Exception as exc:
            shown = getattr(annotation, "__forward_arg__", annotation)  # a TypedDict's
            return name, f"annotation {shown!r} cannot be resolved ({exc})"
    return None


class _Holder:
    """One annotation, for `typing.get_type_hints` to resolve on its own."""

    def __init__(self, name: str, annotation: object) -> None:
        self.__annotations__ = {name: annotation}


def _class_hints(cls: type) -> dict[str, Any]:
    """The resolved annotations of `cls`'s fields, its bases' too.

    Raises:
        Unsupported: one names something that does not exist (the error
            names the class and the field).
    """
    try:
        return typing.get_type_hints(cls, include_extras=True)
    except Exception as exc:
        for base in reversed(cls.__mro__):
            module = sys.modules.get(base.__module__)
            found = unresolved(
                inspect.get_annotations(base),
                dict(vars(module)) if module is not None else {},
                dict(vars(base)),
            )
            if found is not None:
                name, why = found
                raise Unsupported(f"{cls.__name__}.{name}: {why}") from None
        raise Unsupported(
            f"{cls.__name__}: its annotations cannot be resolved ({exc})"
        ) from None


def _fields(cls: type) -> list[tuple[str, Any, bool, str | None]]:
    """Return (key, annotation, required, description) for each init field."""
    if attrs.has(cls):
        _class_hints(cls)  # first, to name a field that does not resolve
        attrs.resolve_types(cls)
        out = []
        for field in attrs.fields(cls):
            if not field.init:
                continue
            if field.type is None:
                raise Unsupported(f"{cls.__name__}.{field.name} needs an annotation")
            note = field.metadata.get("description")
            out.append(
                (
                    field.alias or field.name,
                    field.type,
                    field.default is attrs.NOTHING,
                    note if isinstance(note, str) else None,
                )
            )
        return out
    hints = _class_hints(cls)
    if dataclasses.is_dataclass(cls):
        return [
            (
                f.name,
                hints[f.name],
                f.default is dataclasses.MISSING
                and f.default_factory is dataclasses.MISSING,
                None,
            )
            for f in dataclasses.fields(cls)
            if f.init
        ]
    required_keys: frozenset[str] = getattr(cls, "__required_keys__", frozenset())
    return [
        (key, _strip_required(tp), _is_required_key(key, tp, required_keys), None)
        for key, tp in hints.items()
    ]


def _is_required_key(key: str, tp: Any, required_keys: frozenset[str]) -> bool:
    # Under `from __future__ import annotations` Python 3.11 cannot see a
    # `NotRequired[...]` when it fills `__required_keys__`: read the hint too.
    origin = get_origin(tp)
    if origin is typing.NotRequired:
        return False
    return origin is typing.Required or key in required_keys


def _strip_required(tp: Any) -> Any:
    """Drop `Required[...]` / `NotRequired[...]`, kept by ``include_extras``."""
    while get_origin(tp) in (typing.Required, typing.NotRequired):
        tp = get_args(tp)[0]
    return tp


_DEFS: Final = "#/$defs/"


def _pydantic_schema(cls: Any, defs: dict[str, JSONSchema]) -> JSONSchema:
    """A pydantic model's own schema, its definitions moved into `defs`.

    A model that contains itself describes itself by a reference into its
    definitions (``{"$ref": "#/$defs/Node"}``): the reference is followed,
    so the schema says what the value is (an object), and the definition
    stays in `defs` for the places inside that refer to it.
    """
    schema: JSONSchema = _with_items(cls.model_json_schema())
    for name, sub in schema.pop("$defs", {}).items():
        if defs.setdefault(name, sub) != sub:
            raise Unsupported(f"two different models are named {name!r}")
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith(_DEFS) and ref[len(_DEFS) :] in defs:
        rest = {k: v for k, v in schema.items() if k != "$ref"}
        schema = {**defs[ref[len(_DEFS) :]], **rest}
    return schema


# -- arguments back into values ------------------------------------------------

_converter: Final = cattrs.Converter(use_alias=True)


def _is_union(tp: object) -> bool:
    return get_origin(tp) in (Union, types.UnionType)


def _union_hook(tp: Any) -> _Hook:
    """Read a union as its schema does: the first member the value matches."""
    members = []
    for member in get_args(tp):
        defs: dict[str, JSONSchema] = {}
        schema = schema_of(member, defs)
        if defs:
            schema = {**schema, "$defs": defs}
        members.append((Draft202012Validator(schema), structure_hook(member)))

    def structure(value: object, _: object) -> Any:
        for validator, read in members:
            if validator.is_valid(value):
                return read(value)
        raise ValueError(f"{value!r} matches no member of {tp!r}")

    return structure


def _pydantic_hook(cls: Any) -> _Hook:
    def structure(value: object, _: object) -> Any:
        # Arguments are JSON, read as JSON: a strict model takes a date as
        # its ISO text and a tuple as a list, as its own schema says.
        return cls.model_validate_json(json.dumps(value))

    return structure


def _typeddict_hook(cls: Any) -> _Hook:
    # cattrs reads `__required_keys__`, wrong on 3.11 under PEP 563 (above);
    # the schema checked which keys are there, so read the keys given.
    hints = typing.get_type_hints(cls)
    readers = {key: structure_hook(tp) for key, tp in hints.items()}

    def structure(value: Mapping[str, Any], _: object) -> Any:
        return {key: readers[key](item) for key, item in value.items()}

    return structure


_converter.register_structure_hook(_NONE, lambda value, _: value)
_converter.register_structure_hook_factory(typing.is_typeddict, _typeddict_hook)
_converter.register_structure_hook_factory(_is_union, _union_hook)
_converter.register_structure_hook_factory(is_pydantic_model, _pydantic_hook)

_HOOK_TYPES: Final = 1024
"""How many types' hooks the converter keeps (the least recently used go).

A server that builds its tools per request from types made per request (a
``Literal`` of the user's files, a model made for the request) would keep
every such type alive in cattrs' unbounded cache, for as long as the process.
"""

_dispatch: Any = getattr(_converter, "_structure_func", None)
_uncached = getattr(_dispatch, "dispatch_without_caching", None)
if _uncached is not None:  # cattrs' own cache, bounded (a cattrs without it: as is)
    _dispatch.dispatch = functools.lru_cache(maxsize=_HOOK_TYPES)(_uncached)


def structure_hook(tp: Any) -> Callable[[Any], Any]:
    """Return the function that reads a valid JSON value of `tp` into a `tp`.

    Made once per annotation when a tool is built; the value it reads has
    passed the schema already, so it only converts (a list to a tuple, a
    string to an enum member, an object to an attrs instance).
    """
    if tp is Any:
        return _identity
    hook = _converter.get_structure_hook(tp)

    def read(value: Any) -> Any:
        return hook(value, tp)

    return read


def _identity(value: Any) -> Any:
    return value
