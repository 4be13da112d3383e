"""A tool call's arguments checked against the tool's schema, and what is wrong.

The model reads the error result, so each problem names the field by its
path in the arguments (``items[2].name``), what was expected there and the
value given (shortened). Every problem is listed, not the first one only,
so that one retry can fix them all.
"""

from __future__ import annotations

import json
import re
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Final, final

import attrs
from cattrs.errors import (
    AttributeValidationNote,
    BaseValidationError,
    IterableValidationNote,
)
from jsonschema import (
    Draft7Validator,
    Draft201909Validator,
    Draft202012Validator,
    validators,
)
from jsonschema.exceptions import SchemaError, ValidationError
from jsonschema.protocols import Validator
from referencing import Registry, Resource
from referencing.exceptions import Unresolvable
from referencing.jsonschema import DRAFT202012

from turnfsm import _checks
from turnfsm._json import strict_loads
from turnfsm.errors import ConfigError

__all__ = [
    "ArgumentsCheck",
    "InvalidArguments",
    "Problem",
    "arguments_check",
    "check_arguments",
    "problems_of_structuring",
]

Path = tuple[str | int, ...]

MAX_PROBLEMS: Final = 20
"""Problems listed in one error result; the rest are counted."""
MAX_VALUE_CHARS: Final = 60
"""A value given is shown up to this many characters."""
MAX_REFUSAL_CHARS: Final = 1_000
"""A validator's refusal (its exception's message) is shown up to this many."""

_ROOT_FAILURES: Final = frozenset({"type", "enum", "const", None})
_JSON_TYPES: Final = (
    (bool, "boolean"),
    (int, "integer"),
    (float, "number"),
    (str, "string"),
    (list, "array"),
    (tuple, "array"),
    (Mapping, "object"),
)


class _Nothing:
    """No value given (a missing field)."""

    def __repr__(self) -> str:
        return "NOTHING"


NOTHING: Final = _Nothing()


@attrs.frozen
class Problem:
    """One thing wrong with a call's arguments: where, what was expected, the value."""

    path: Path
    expected: str
    got: object = NOTHING

    def __str__(self) -> str:
        where = format_path(self.path) or "(the arguments)"
        if self.got is NOTHING:
            return f"{where}: {self.expected}"
        return f"{where}: {self.expected}, got {_render(self.got)}"


class InvalidArguments(ValueError):
    """Raised when a call's arguments do not fit the tool; `problems` lists each."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        super().__init__(problems)
        self.problems = tuple(problems)

    def report(self, tool: str) -> str:
        """Return the error result's text: every problem, then what to do."""
        lines = [f"invalid arguments for tool {tool!r}; it did not run:"]
        lines += [f"- {p}" for p in self.problems[:MAX_PROBLEMS]]
        if len(self.problems) > MAX_PROBLEMS:
            lines.append(f"- ... and {len(self.problems) - MAX_PROBLEMS} more")
        lines.append(f"Call {tool!r} again with corrected arguments.")
        return "\n".join(lines)

    def __str__(self) -> str:
        return "; ".join(str(p) for p in self.problems)


# -- paths and values ----------------------------------------------------------

_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def format_path(path: Iterable[str | int]) -> str:
    """Return ``items[2].name`` for the path ``("items", 2, "name")``."""
    out = ""
    for step in path:
        if isinstance(step, int):
            out += f"[{step}]"
        elif _NAME.fullmatch(step):
            out += f".{step}" if out else step
        else:
            out += f"[{json.dumps(step, ensure_ascii=False)}]"
    return out


def _render(value: object) -> str:
    text = json.dumps(value, ensure_ascii=False, default=repr)
    if len(text) > MAX_VALUE_CHARS:
        text = text[: MAX_VALUE_CHARS - 3] + "..."
    kind = _json_kind(value)
    return f"{text} ({kind})" if kind else text


def _json_kind(value: object) -> str:
    if value is None:
        return ""
    return next((name for cls, name in _JSON_TYPES if isinstance(value, cls)), "")


def _values(values: Iterable[object]) -> str:
    shown = [json.dumps(v, ensure_ascii=False, default=repr) for v in values]
    return ", ".join(shown[:12]) + (", ..." if len(shown) > 12 else "")


# -- the validator ---------------------------------------------------------------


@final
@attrs.frozen
class ArgumentsCheck:
    """A schema ready to check arguments against: its validator, and a quick test.

    `quick` exists for the flat schemas most tools have (named fields of
    plain JSON types, required names, closed or open): it answers True only
    for arguments the validator would accept, in a fraction of its time.
    Anything else, and every False, goes to the validator, which lists what
    is wrong.
    """

    validator: Validator
    quick: Callable[[object], bool] | None
    takes_raw: bool = False
    """The schema names a ``_raw`` parameter: ``{"_raw": ...}`` is its argument."""


_CHECKED: Final[dict[str, ArgumentsCheck]] = {}
"""Checks by schema text: a schema is checked once per process, however
many tools (and agents built per request) describe their calls by it."""

_CHECKED_MAX: Final = 4096
"""How many schemas `_CHECKED` keeps (the oldest go first)."""


def arguments_check(
    tool: str, parameters: Mapping[str, Any], *, field: str | None = None
) -> ArgumentsCheck:
    """Return the check of a tool's parameters schema, built once.

    The schema's ``$schema`` picks the draft; without one it is Draft 2020-12.
    A schema equal to one already checked reuses its check. `field` is what
    a refusal names the schema as (default: the tool's ``parameters``).

    Raises:
        ConfigError: the schema is not a valid JSON schema, or does not
            describe an object (a call's arguments are always one).
    """
    try:
        key = json.dumps(parameters, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError):
        key = None  # not JSON: checked, and refused, below
    if key is not None and (known := _CHECKED.get(key)) is not None:
        return known
    validator = _checked(field or f"Tool({tool!r}).parameters", parameters)
    properties = parameters.get("properties")
    takes_raw = isinstance(properties, Mapping) and "_raw" in properties
    check = ArgumentsCheck(validator, _quick(type(validator), parameters), takes_raw)
    if key is not None:
        if len(_CHECKED) >= _CHECKED_MAX:
            del _CHECKED[next(iter(_CHECKED))]
        _CHECKED[key] = check
    return check


def _checked(field: str, parameters: Mapping[str, Any]) -> Validator:
    cls = validators.validator_for(parameters, default=Draft202012Validator)
    try:
        cls.check_schema(dict(parameters))
    except SchemaError as exc:
        at = format_path(exc.absolute_path)
        raise ConfigError(
            f"{field}.{at}" if at else field,
            exc.instance,
            f"a valid JSON schema ({exc.message})",
        ) from None
    if parameters.get("type") != "object":
        raise ConfigError(
            f"{field}.type", parameters.get("type"), '"object" (arguments are one)'
        )
    _check_refs(field, parameters)
    validator: Validator = cls(parameters)
    return validator


# Keywords whose values are data, not schemas: a "$ref" in them is no reference.
_DATA_KEYWORDS: Final = frozenset({"const", "default", "enum", "examples"})


def _refs(value: object, at: str) -> Iterator[tuple[str, str]]:
    """Each ``$ref`` of the schema `value` and where it is, outside nested ``$id``s."""
    if isinstance(value, Mapping):
        for key, item in value.items():
            if key == "$ref" and isinstance(item, str):
                yield f"{at}.$ref", item
            elif key not in _DATA_KEYWORDS and not (
                isinstance(item, Mapping) and "$id" in item
            ):
                yield from _refs(item, f"{at}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _refs(item, f"{at}[{i}]")


def _check_refs(field: str, parameters: Mapping[str, Any]) -> None:
    """Refuse a ``$ref`` the schema cannot resolve: every call would fail on it.

    A reference is looked up in the schema itself; nothing is fetched.
    """
    root = Resource.from_contents(dict(parameters), default_specification=DRAFT202012)
    resolver = Registry().resolver_with_root(root)
    for where, ref in _refs(parameters, field):
        try:
            resolver.lookup(ref)
        except Unresolvable:
            raise ConfigError(
                where, ref, "a reference to a part of the schema itself"
            ) from None


# The quick test. Types are tested exactly (`type(v) is ...`): a bool is no
# number, and what the test is unsure of (a subclass, 1.0 as an integer) it
# leaves to the validator. Keywords that only annotate are ignored.
_QUICK_TYPES: Final[Mapping[str, tuple[type, ...]]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "null": (type(None),),
}
_ANNOTATIONS: Final = frozenset(
    {"description", "title", "default", "examples", "deprecated", "$comment"}
)
_QUICK_OBJECT: Final = _ANNOTATIONS | {
    "type",
    "properties",
    "required",
    "additionalProperties",
    "$schema",
}
_QUICK_FIELD: Final = _ANNOTATIONS | {"type"}
_QUICK_DRAFTS: Final = (Draft7Validator, Draft201909Validator, Draft202012Validator)


def _quick(
    cls: type[Validator], schema: Mapping[str, Any]
) -> Callable[[object], bool] | None:
    """The quick test of a flat object schema, or None for any other schema."""
    if cls not in _QUICK_DRAFTS or not set(schema) <= _QUICK_OBJECT:
        return None
    properties = schema.get("properties", {})
    required = schema.get("required", [])
    is_open = schema.get("additionalProperties", True)
    if not isinstance(properties, Mapping) or not isinstance(is_open, bool):
        return None
    kinds: dict[str, tuple[type, ...] | None] = {}
    for name, field in properties.items():
        if not isinstance(field, Mapping) or not set(field) <= _QUICK_FIELD:
            return None
        kind = field.get("type")
        names = [kind] if isinstance(kind, str) else kind
        if kind is None:
            kinds[name] = None  # any value
        elif isinstance(names, list) and all(n in _QUICK_TYPES for n in names):
            kinds[name] = tuple(t for n in names for t in _QUICK_TYPES[n])
        else:
            return None
    needed = tuple(required)

    def quick(arguments: object) -> bool:
        # A dict, or a call's read-only arguments (a dict that refuses changes).
        if not isinstance(arguments, dict):
            return False
        for name in needed:
            if name not in arguments:
                return False
        for name, value in arguments.items():
            if name in kinds:
                allowed = kinds[name]
                if allowed is not None and type(value) not in allowed:
                    return False
            elif not is_open:
                return False
        return True

    return quick


def check_arguments(check: ArgumentsCheck, arguments: object) -> None:
    """Check `arguments` against the tool's schema.

    Raises:
        InvalidArguments: one or more fields do not fit; each is listed.
    """
    if (
        isinstance(arguments, dict)  # a call's arguments always are
        and isinstance(raw := arguments.get("_raw"), str)
        and len(arguments) == 1
        and not check.takes_raw
    ):
        # The clients keep arguments that are no JSON object (a reply cut off
        # at its token limit, a malformed one) as their text. Refused before
        # the schema is asked: one that allows unknown names would let the
        # tool run on its defaults for a call the model never finished.
        raise InvalidArguments([Problem((), _not_an_object(raw), raw)])
    quick = check.quick
    if quick is not None and quick(arguments):
        return
    errors = list(check.validator.iter_errors(typing.cast(Any, arguments)))
    if errors:
        raise InvalidArguments(_unique(p for e in errors for p in _problems(e)))


_NOT_JSON: Final = (
    "expected a JSON object of the arguments (the text sent is not valid JSON; "
    "it may have been cut off)"
)
_JSON_KINDS: Final = {list: "an array", str: "a string", bool: "a boolean"}


def _not_an_object(raw: str) -> str:
    """What is wrong with arguments kept as their text: not JSON, or not an object.

    Valid JSON of another kind (``[1, 2]``, ``"Paris"``) was no cut-off
    text: told that it was, a model sends it again as it was.
    """
    try:
        value = strict_loads(raw)  # NaN and Infinity are no JSON
    except (ValueError, RecursionError):
        return _NOT_JSON
    if isinstance(value, dict):  # an object nested deeper than a call holds
        return "expected a JSON object of the arguments nested less deeply"
    kind = _JSON_KINDS.get(type(value), "a number")
    return (
        f"expected a JSON object of the arguments, one field per parameter "
        f"(the text sent is valid JSON, but {kind}, not an object)"
    )


def _unique(problems: Iterable[Problem]) -> list[Problem]:
    # One `required` error per missing name each lists every missing name.
    seen: dict[str, Problem] = {}
    for problem in problems:
        seen.setdefault(str(problem), problem)
    return list(seen.values())


def _problems(error: ValidationError) -> Iterator[Problem]:
    path = tuple(error.absolute_path)
    # Typed loosely: a `false` schema's error has neither keyword nor value.
    keyword: Any = error.validator
    value: Any = error.validator_value
    instance: Any = error.instance
    if keyword == "required":
        for name in value:
            if isinstance(instance, Mapping) and name not in instance:
                yield Problem((*path, name), "missing (required)")
    elif keyword in ("additionalProperties", "unevaluatedProperties"):
        yield from _unexpected(error, path)
    elif keyword == "type":
        kinds = value if isinstance(value, list) else [value]
        yield Problem(path, f"expected {' or '.join(kinds)}", instance)
    elif keyword == "enum":
        yield Problem(path, f"expected one of {_values(value)}", instance)
    elif keyword == "const":
        yield Problem(path, f"expected {_values([value])}", instance)
    elif keyword in ("anyOf", "oneOf"):
        yield from _alternatives(error, path)
    elif keyword == "items" and value is False:
        yield Problem(path, f"expected at most {_prefix_length(error)} items", instance)
    elif keyword is None:  # a `false` schema: nothing is allowed here
        yield Problem(path, "unexpected (not allowed here)", instance)
    elif keyword in _BOUNDS:
        yield Problem(path, _BOUNDS[keyword].format(_values([value])), instance)
    else:  # pattern, format, ...
        yield Problem(path, f"expected {keyword} {_values([value])}", instance)


_BOUNDS: Final = {
    "minimum": "expected at least {}",
    "maximum": "expected at most {}",
    "exclusiveMinimum": "expected more than {}",
    "exclusiveMaximum": "expected less than {}",
    "multipleOf": "expected a multiple of {}",
    "minLength": "expected at least {} characters",
    "maxLength": "expected at most {} characters",
    "minItems": "expected at least {} items",
    "maxItems": "expected at most {} items",
    "minProperties": "expected at least {} fields",
    "maxProperties": "expected at most {} fields",
}
"""How a bound the value is outside of is said, in words."""


def _prefix_length(error: ValidationError) -> int:
    schema = error.schema
    prefix = schema.get("prefixItems", ()) if isinstance(schema, Mapping) else ()
    return len(prefix)


def _unexpected(error: ValidationError, path: Path) -> Iterator[Problem]:
    instance, schema = error.instance, error.schema
    if not isinstance(instance, Mapping) or not isinstance(schema, Mapping):
        yield Problem(path, str(error.message))
        return
    known = schema.get("properties", {})
    patterns = schema.get("patternProperties", {})
    what = "not a parameter of this tool" if not path else "not a field here"
    for key in instance:
        if key not in known and not any(re.search(p, key) for p in patterns):
            yield Problem((*path, key), f"unexpected ({what})")


def _alternatives(error: ValidationError, path: Path) -> Iterator[Problem]:
    """Report an ``anyOf`` miss inside the one alternative the value is shaped for.

    A value that is an object where the options are an object or null failed
    inside the object: its own fields are the problems. A value that fits the
    type of no option is reported as ``expected A or B``.
    """
    branches: dict[int, list[ValidationError]] = {}
    for sub in error.context or ():
        branches.setdefault(int(sub.schema_path[0]), []).append(sub)
    shaped = [errors for errors in branches.values() if not _misses_shape(errors)]
    if shaped:
        for sub in min(shaped, key=len):
            yield from _problems(sub)
        return
    options: Any = error.validator_value
    described = " or ".join(_describe(o) for o in options)
    yield Problem(path, f"expected {described}", error.instance)


def _misses_shape(errors: Iterable[ValidationError]) -> bool:
    """Tell whether an alternative refused the value itself (its type, its enum)."""
    return any(not e.relative_path and e.validator in _ROOT_FAILURES for e in errors)


def _describe(schema: object) -> str:
    if schema is True or schema == {}:
        return "anything"
    if not isinstance(schema, Mapping):
        return "nothing"
    if "enum" in schema:
        return f"one of {_values(schema['enum'])}"
    if "const" in schema:
        return _values([schema["const"]])
    if "type" in schema:
        kinds = schema["type"]
        return " or ".join(kinds) if isinstance(kinds, list) else str(kinds)
    if "$ref" in schema:
        return str(schema["$ref"]).rsplit("/", 1)[-1]
    options = schema.get("anyOf") or schema.get("oneOf")
    if isinstance(options, list):
        return " or ".join(_describe(o) for o in options)
    return "a value of another shape"


# -- failures of reading the valid arguments into values -----------------------


def problems_of_structuring(exc: BaseException) -> list[Problem]:
    """Translate a failure to build a parameters value into problems.

    A pydantic model's own validators, an attrs validator or converter, or a
    `__post_init__` may refuse values the schema let through.
    """
    errors = getattr(exc, "errors", None)
    if callable(errors) and type(exc).__module__.startswith("pydantic"):
        return [
            Problem(tuple(e["loc"]), str(e["msg"]), e.get("input", NOTHING))
            for e in errors()
        ]
    return list(_cattrs_problems(exc, ()))


def _cattrs_problems(exc: BaseException, path: Path) -> Iterator[Problem]:
    if isinstance(exc, BaseValidationError):
        for sub in exc.exceptions:
            yield from _cattrs_problems(sub, (*path, *_step(sub)))
        return
    if isinstance(exc, KeyError) and exc.args:
        key = str(exc.args[0])
        yield Problem(
            path if path[-1:] == (key,) else (*path, key), "missing (required)"
        )
        return
    if problems_of := getattr(exc, "problems", None):  # a nested InvalidArguments
        for problem in problems_of:
            yield attrs.evolve(problem, path=(*path, *problem.path))
        return
    # A validator's message, read even when its `__str__` raises, and cut:
    # a re-ask sends it to the model whole, pinned until the answer fits.
    text = _checks.message_of(exc)
    if len(text) > MAX_REFUSAL_CHARS:
        cut = len(text) - MAX_REFUSAL_CHARS
        text = f"{text[:MAX_REFUSAL_CHARS]}[... {cut} characters cut]"
    yield Problem(path, f"refused: {type(exc).__name__}: {text}")


def _step(exc: BaseException) -> Path:
    for note in getattr(exc, "__notes__", ()):
        if isinstance(note, AttributeValidationNote):
            return (note.name,)
        if isinstance(note, IterableValidationNote):
            return (note.index,)
    return ()
