"""The one set of attrs validators every public value type uses.

Each factory returns an attrs validator that raises a typed turnfsm error
naming the field and the value: `ConfigError` for settings, events and
records, `InvalidMessage` for messages and parts (``error=InvalidMessage``).
The same validators check plain values outside attrs through `check`.

Numbers are checked strictly: a `bool` is not an int, NaN and the infinities
are not finite numbers, and an int where a float is expected is fine.

The upper bounds of sizes live here, one constant each (`MAX_TOKENS`,
`MAX_COUNT`, `MAX_JSON_DEPTH`): a setting past them is a mistake (a window
of 10**40 tokens, 10**30 turns), refused when it is made rather than found
out in a run.

This module imports only `turnfsm.errors`, so the core may use it.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import math
from collections.abc import Callable, Collection, Mapping
from typing import Any, Final, TypeVar, overload

import attrs

from turnfsm.errors import ConfigError, InvalidMessage

__all__ = [
    "MAX_COUNT",
    "MAX_JSON_DEPTH",
    "MAX_TOKENS",
    "TOKENS_PER_CHAR",
    "TOKENS_PER_PIECE",
    "TOO_DEEP",
    "Check",
    "Hint",
    "Shape",
    "boolean",
    "callable_",
    "cannot_take",
    "check",
    "check_id",
    "clock_reading",
    "each",
    "identifier",
    "instance",
    "integer",
    "is_instance",
    "json_fault",
    "json_object",
    "keyword_checked",
    "message_of",
    "number",
    "one_of",
    "plain_method",
    "protocol_shapes",
    "satisfies",
    "seconds",
    "string",
    "string_mapping",
    "token_count",
    "tokens_beyond_text",
    "tuple_of",
    "unknown_argument",
]

MAX_TOKENS: Final = 100_000_000
"""The largest number of tokens a setting may give (a window, a reply budget).

A hundred million: ten times the largest windows models advertise.
"""

MAX_COUNT: Final = 1_000_000
"""The largest count a limit may set: turns, attempts, passes, retries, messages."""

MAX_SECONDS: Final = 1_000_000_000
"""The longest time a setting may give, in seconds: about 31 years.

Past it a duration is no longer one every part can hold (Temporal's and
Python's `timedelta` overflow near 1e14 seconds), and no limit that long
bounds anything.
"""

MAX_JSON_DEPTH: Final = 100
"""The deepest a JSON value may nest: a tool's schema, a call's arguments, metadata."""

TOO_DEEP: Final = f"JSON nested at most {MAX_JSON_DEPTH} deep"
"""What a value nested past `MAX_JSON_DEPTH` was expected to be."""

_JSON_INT: Final = 10**4000
LONG_INT: Final = "an int of at most 4,000 digits"
"""What JSON values a turnfsm record holds say of a longer int."""
"""Integers JSON text can carry from Python are shorter than this (digits)."""

Check = Callable[[Any, Any, Any], None]
"""An attrs validator: ``check(instance, attribute, value)``."""

_Error = type[ConfigError] | type[InvalidMessage]

_Class = TypeVar("_Class", bound=type)


def _fail(error: _Error, name: str, value: object, expected: str) -> None:
    if error is InvalidMessage:
        raise InvalidMessage(name, value, f"expected {expected}")
    raise ConfigError(name, value, expected)


def _name(name: str | None, attr: Any) -> str:
    if name is not None:
        return name
    return str(getattr(attr, "alias", None) or getattr(attr, "name", "value"))


def _maybe(expected: str, optional: bool) -> str:
    """`expected`, saying None is taken too (unless it already says so)."""
    if not optional or "None" in expected:
        return expected
    return f"{expected}, or None"


def is_int(value: object) -> bool:
    """Return whether `value` is an int and not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_finite(value: object) -> bool:
    """Return whether `value` is a finite int or float (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an int past any float: no number a float reads
        return False


def integer(
    name: str | None = None,
    *,
    low: int | None = None,
    high: int | None = None,
    optional: bool = False,
    error: _Error = ConfigError,
    expected: str | None = None,
) -> Check:
    """Return a validator: an int (not a bool) in ``low..high``."""
    if expected is not None:
        text = expected
    elif low is not None and high is not None:
        text = _maybe(f"an int in {low:,}..{high:,}", optional)
    elif low is not None:
        text = _maybe(f"an int >= {low:,}", optional)
    else:
        text = _maybe("an int", optional)

    def validate(_inst: object, attr: object, value: object) -> None:
        if value is None and optional:
            return
        if (
            not isinstance(value, int)
            or isinstance(value, bool)
            or (low is not None and value < low)
            or (high is not None and value > high)
        ):
            _fail(error, _name(name, attr), value, text)

    return validate


def percentage(*, low: int, high: int) -> Check:
    """Return a validator: an int percentage in ``low..high``.

    A number that is a percentage written another way (0.8, 80.0) is
    refused showing the int (80); any other value only with the range.
    """
    text = f"an int percentage in {low}..{high}"
    plain = integer(low=low, high=high, expected=text)

    def validate(inst: object, attr: object, value: object) -> None:
        try:
            plain(inst, attr, value)
        except ConfigError:
            if isinstance(value, float) and 0 < value <= 1:
                meant = round(value * 100)
            elif isinstance(value, float) and value.is_integer():
                meant = int(value)
            else:
                raise
            if not low <= meant <= high:
                raise
        else:
            return
        # Out of the except block: one error, not the plain one's during it.
        _fail(ConfigError, _name(None, attr), value, f"{text} ({meant}, not {value})")

    return validate


def number(
    name: str | None = None,
    *,
    low: float | None = None,
    above: float | None = None,
    high: float | None = None,
    optional: bool = False,
    expected: str | None = None,
) -> Check:
    """Return a validator: a finite number, ``>= low``, ``> above``, ``<= high``."""
    bounds = [
        f">= {low}" if low is not None else "",
        f"> {above}" if above is not None else "",
        f"<= {high}" if high is not None else "",
    ]
    text = expected or _maybe(
        " ".join(["a finite number", *(b for b in bounds if b)]), optional
    )

    def validate(_inst: object, attr: object, value: object) -> None:
        if value is None and optional:
            return
        if (
            not is_finite(value)
            or (low is not None and value < low)  # type: ignore[operator]
            or (above is not None and value <= above)  # type: ignore[operator]
            or (high is not None and value > high)  # type: ignore[operator]
        ):
            raise ConfigError(_name(name, attr), value, text)

    return validate


def seconds(
    name: str | None = None, *, optional: bool = True, low: float | None = None
) -> Check:
    """Return a validator: a finite number of seconds > 0 (or None if optional).

    With `low`, ``>= low`` instead of ``> 0``. At most `MAX_SECONDS`.
    """
    positive = number(
        name,
        above=None if low is not None else 0,
        low=low,
        optional=optional,
        expected=_maybe(
            f"a finite number of seconds >= {low}"
            if low is not None
            else "a finite number of seconds > 0",
            optional,
        ),
    )

    def validate(inst: object, attr: object, value: object) -> None:
        positive(inst, attr, value)
        if value is not None and value > MAX_SECONDS:  # type: ignore[operator]
            raise ConfigError(
                _name(name, attr),
                value,
                f"a number of seconds <= {MAX_SECONDS:,} (about 31 years)",
            )

    return validate


def string(
    name: str | None = None,
    *,
    non_empty: bool = False,
    optional: bool = False,
    error: _Error = ConfigError,
    expected: str | None = None,
) -> Check:
    """Return a validator: a string (non-empty if asked; blank counts as empty)."""
    if expected is None:
        expected = _maybe("a non-empty string" if non_empty else "a string", optional)

    def validate(_inst: object, attr: object, value: object) -> None:
        if value is None and optional:
            return
        if not isinstance(value, str) or (non_empty and not value.strip()):
            _fail(error, _name(name, attr), value, expected)

    return validate


def boolean(
    name: str | None = None, *, optional: bool = False, error: _Error = ConfigError
) -> Check:
    """Return a validator: True or False (not 0, 1 or ``"no"``)."""
    expected = _maybe("True or False", optional)

    def validate(_inst: object, attr: object, value: object) -> None:
        if value is None and optional:
            return
        if not isinstance(value, bool):
            _fail(error, _name(name, attr), value, expected)

    return validate


def instance(
    types: type | tuple[type, ...],
    expected: str,
    name: str | None = None,
    *,
    optional: bool = False,
    error: _Error = ConfigError,
    awaited: tuple[str, ...] = (),
    called: tuple[str, ...] = (),
) -> Check:
    """Return a validator: an instance of `types` (described as `expected`).

    The methods named in `awaited` are awaited by whoever calls them: one
    written as a plain ``def`` (or as an async generator) is refused here,
    naming it, rather than failing at its first call with "can't be used in
    'await' expression". Those named in `called` are called without
    ``await``: one written ``async def`` is refused, rather than handing
    back a coroutine where its answer was expected. Each of them is called
    as the protocol among `types` declares it (its parameters without a
    default: positionally, then by keyword after ``*``): one whose own
    parameters cannot take that call is refused, rather than failing at its
    first call with a `TypeError`.
    """
    text = _maybe(expected, optional)
    kinds = types if isinstance(types, tuple) else (types,)
    if (
        not awaited
        and not called
        and not any(getattr(t, "_is_protocol", False) for t in kinds)
    ):
        # Plain classes: `isinstance` alone, on the hot path of every value.

        def validate_class(_inst: object, attr: object, value: object) -> None:
            if not isinstance(value, types) and not (value is None and optional):
                _fail(error, _name(name, attr), value, text)

        return validate_class

    shapes = protocol_shapes(kinds, (*awaited, *called))

    def validate(_inst: object, attr: object, value: object) -> None:
        if value is None and optional:
            return
        if isinstance(value, type) and is_instance(value, types):
            # A class has the protocol's methods too, unbound: each call fails.
            _fail(
                error,
                _name(name, attr),
                value,
                f"{text}: an instance, {value.__name__}(), not the class",
            )
        if not is_instance(value, types):
            _fail(error, _name(name, attr), value, text)
        for method in shapes:
            # Absent or None: the protocol's check says whether it may be. Only
            # a method the protocol declares: one of another protocol it may
            # also meet (a counter's `tokens`) may be an attribute of its own.
            member = getattr(value, method, None)
            if member is not None and not callable(member):
                kind = type(member).__name__
                article = "an" if kind[0] in "aeiouAEIOU" else "a"
                _fail(
                    error,
                    _name(name, attr),
                    value,
                    f"{text}; its {method} is {article} {kind}, not a method",
                )
        plain = plain_method(value, awaited)
        if plain is not None:
            if _is_async_generator(getattr(value, plain)):
                why = (
                    f"its {plain}() yields (an async generator), and it is "
                    "awaited: return the answer instead of yielding it"
                )
            else:
                why = (
                    f"its {plain}() is a plain def, and it is awaited: "
                    f"write it as `async def {plain}`"
                )
            _fail(error, _name(name, attr), value, f"{text}; {why}")
        for method in called:
            if _is_async_function(getattr(value, method, None)):
                _fail(
                    error,
                    _name(name, attr),
                    value,
                    f"{text}; its {method}() is an async def, and it is called "
                    f"without await: write it as a plain `def {method}`",
                )
        for method, shape in shapes.items():
            unfit = cannot_take(getattr(value, method, None), shape)
            if unfit is not None:
                _fail(
                    error,
                    _name(name, attr),
                    value,
                    f"{text}; its {method}() cannot be called as "
                    f"{method}({shape.spelled()}): {unfit}",
                )

    return validate


@attrs.frozen
class Shape:
    """How a method of a plug-in is called.

    The positional arguments `args` (their names, as the protocol says
    them), then the keyword arguments `keywords`.
    """

    args: tuple[str, ...] = ()
    keywords: tuple[str, ...] = ()

    def spelled(self) -> str:
        """The call's arguments as a person reads them: ``messages, target, ctx``."""
        return ", ".join([*self.args, *(f"{k}=..." for k in self.keywords)])


def protocol_shapes(
    kinds: tuple[type, ...], methods: tuple[str, ...]
) -> dict[str, Shape]:
    """How each of `methods` is called, as a protocol among `kinds` declares it.

    Its parameters without a default: positional ones positionally,
    keyword-only ones by keyword. A method no protocol declares is left out.
    """
    shapes: dict[str, Shape] = {}
    for method in methods:
        for kind in kinds:
            declared = getattr(kind, "__dict__", {}).get(method)
            if getattr(kind, "_is_protocol", False) and inspect.isfunction(declared):
                params = list(inspect.signature(declared).parameters.values())[1:]
                required = [p for p in params if p.default is p.empty]
                shapes[method] = Shape(
                    tuple(p.name for p in required if p.kind in _POSITIONAL),
                    tuple(p.name for p in required if p.kind is p.KEYWORD_ONLY),
                )
                break
    return shapes


_POSITIONAL: Final = (
    inspect.Parameter.POSITIONAL_ONLY,
    inspect.Parameter.POSITIONAL_OR_KEYWORD,
)


def cannot_take(method: object, shape: Shape) -> str | None:
    """Why `method` cannot be called as `shape` says (None: it can, or is not judged).

    Only a Python function or method is judged (through ``functools.wraps``,
    as its signature reads): a callable object, a partial or a mock is left
    to its call. Each function is judged once per shape.
    """
    fn = getattr(method, "__func__", None)
    bound = fn is not None and not isinstance(method, staticmethod)
    if fn is None:
        fn = method
    if not inspect.isfunction(fn):
        return None
    key = (fn, bound, shape)
    if key in _SHAPES:
        return _SHAPES[key]
    arguments = [None] * (len(shape.args) + bound)
    try:
        inspect.signature(fn).bind(*arguments, **dict.fromkeys(shape.keywords))
        why = None
    except TypeError as exc:
        why = str(exc)
    except ValueError:  # no signature to read: left to its call
        why = None
    if len(_SHAPES) >= _CONFORMING_MAX:
        _SHAPES.clear()
    _SHAPES[key] = why
    return why


_SHAPES: Final[dict[tuple[object, bool, Shape], str | None]] = {}
"""What `cannot_take` found, by function, boundness and shape."""


def _is_async_generator(value: object) -> bool:
    """Whether `value` is a Python function that is an async generator."""
    fn = getattr(value, "__func__", value)
    if not inspect.isfunction(fn):
        return False
    return any(inspect.isasyncgenfunction(f) for f in (fn, inspect.unwrap(fn)))


def _is_async_function(value: object) -> bool:
    """Whether `value` is a Python function written ``async def``.

    A coroutine function or an async generator, unwrapped through
    ``functools.wraps``.
    """
    fn = getattr(value, "__func__", value)
    if not inspect.isfunction(fn):
        return False
    return any(
        inspect.iscoroutinefunction(f) or inspect.isasyncgenfunction(f)
        for f in (fn, inspect.unwrap(fn))
    )


def plain_method(value: object, names: tuple[str, ...]) -> str | None:
    """Return the first of `names` that `value` has as a plain (not async) function.

    Only a Python function is judged, unwrapped through ``functools.wraps``:
    a callable object, a partial or a mock may return an awaitable, and is
    left to its call.
    """
    for method in names:
        if is_plain_function(getattr(value, method, None)):
            return method
    return None


def is_plain_function(value: object) -> bool:
    """Whether `value` is a Python function (or method) that is not ``async def``.

    Unwrapped through ``functools.wraps``; a callable object, a partial or a
    mock may return an awaitable, and is not judged (False).
    """
    fn = getattr(value, "__func__", value)
    if not inspect.isfunction(fn):
        return False
    return not any(inspect.iscoroutinefunction(f) for f in (fn, inspect.unwrap(fn)))


def is_instance(value: object, types: type | tuple[type, ...]) -> bool:
    """``isinstance(value, types)``, quick for runtime-checkable protocols.

    A protocol check looks up each of the protocol's members on the value,
    which takes microseconds, and every agent made per request checks its
    model client, counter and strategy. A class that has every member itself
    (not only its instances) passes for all of its instances: it is
    remembered, and its instances are not looked at again.
    """
    cls = type(value)
    key = (cls, types)
    if key in _CONFORMING:
        return True
    if not isinstance(value, types):
        return False
    kinds = types if isinstance(types, tuple) else (types,)
    protocols = [t for t in kinds if getattr(t, "_is_protocol", False)]
    if protocols and any(
        all(hasattr(cls, member) for member in _members(p)) for p in protocols
    ):
        if len(_CONFORMING) >= _CONFORMING_MAX:
            _CONFORMING.clear()
        _CONFORMING.add(key)
    return True


_CONFORMING: Final[set[tuple[type, type | tuple[type, ...]]]] = set()
"""(class, protocols) pairs whose every instance is known to pass."""

_CONFORMING_MAX: Final = 4096


def _members(protocol: type) -> frozenset[str]:
    """The names a runtime-checkable protocol asks for (methods and attributes)."""
    names: set[str] = set()
    for base in protocol.__mro__:
        if base is object or not getattr(base, "_is_protocol", False):
            continue
        names.update(n for n in vars(base) if not n.startswith("_"))
        names.update(getattr(base, "__annotations__", {}))
    return frozenset(names)


def callable_(name: str | None = None, *, optional: bool = False) -> Check:
    """Return a validator: a callable."""
    text = _maybe("a callable", optional)

    def validate(_inst: object, attr: object, value: object) -> None:
        if value is None and optional:
            return
        if not callable(value):
            raise ConfigError(_name(name, attr), value, text)

    return validate


class _OneOf:
    """An attrs validator: one of `options` (kept, as attrs' ``in_`` keeps them)."""

    __slots__ = ("_name", "_text", "optional", "options")

    def __init__(
        self,
        options: Collection[object],
        name: str | None = None,
        *,
        optional: bool = False,
    ) -> None:
        """Accept the values in `options` (and None if `optional`)."""
        self.options = options
        self.optional = optional
        self._name = name
        self._text = _maybe("one of " + ", ".join(repr(v) for v in options), optional)

    def __call__(self, _inst: object, attr: object, value: object) -> None:
        """Raise `ConfigError` unless `value` is one of the options."""
        if value is None and self.optional:
            return
        try:
            ok = value in self.options
        except TypeError:  # an unhashable value
            ok = False
        if ok and type(value) is float:  # 1.0 == 1: a number is of its option's type
            ok = any(type(o) is float and o == value for o in self.options)
        if not ok or isinstance(value, bool):
            raise ConfigError(_name(self._name, attr), value, self._text)


def one_of(
    options: Collection[object], name: str | None = None, *, optional: bool = False
) -> Check:
    """Return a validator: one of `options` (its ``options`` attribute keeps them)."""
    return _OneOf(options, name, optional=optional)


def each(
    types: type | tuple[type, ...],
    expected: str,
    name: str | None = None,
    *,
    error: _Error = ConfigError,
) -> Check:
    """Return a validator: a tuple whose every item is one of `types`.

    The error names the item (``tools[2]``).
    """

    def validate(_inst: object, attr: object, value: Any) -> None:
        if not isinstance(value, tuple):
            _fail(error, _name(name, attr), value, f"a sequence of {expected}")
        for i, item in enumerate(value):
            if not isinstance(item, types):
                _fail(error, f"{_name(name, attr)}[{i}]", item, expected)

    return validate


def satisfies(
    test: Callable[[Any], bool],
    expected: str,
    name: str | None = None,
    *,
    each: bool = False,
    optional: bool = False,
) -> Check:
    """Return a validator: `test(value)` holds (for every item, with `each`).

    For what no type names: "a Tool or a function", "a Hook". With `each`
    the value is a tuple and the error names the item (``hooks[1]``).
    """
    text = _maybe(expected, optional)

    def validate(_inst: object, attr: object, value: Any) -> None:
        if value is None and optional:
            return
        field = _name(name, attr)
        if not each:
            if not test(value):
                raise ConfigError(field, value, text)
            return
        for i, item in enumerate(value):
            if not test(item):
                raise ConfigError(f"{field}[{i}]", item, expected)

    return validate


def string_mapping(
    name: str | None = None, *, error: _Error = ConfigError, values: bool = True
) -> Check:
    """Return a validator: a mapping with string keys (and values, if `values`)."""

    def validate(_inst: object, attr: object, value: Any) -> None:
        field = _name(name, attr)
        if not isinstance(value, Mapping):
            _fail(error, field, value, "a mapping of strings to strings")
        for key, item in value.items():
            if not isinstance(key, str) or (values and not isinstance(item, str)):
                _fail(error, f"{field}[{key!r}]", item, "a string key and value")

    return validate


def json_object(
    name: str | None = None,
    *,
    error: _Error = ConfigError,
    expected: str = "a mapping of strings to JSON values",
    finite: bool = True,
) -> Check:
    """Return a validator: a mapping with string keys whose values JSON carries.

    Strings, ints, floats (finite unless not `finite`), booleans, None, and
    lists, tuples and mappings of them with string keys, nested at most
    `MAX_JSON_DEPTH` deep, none inside itself. The error names the value at
    fault inside (``metadata.a[2]``).
    """

    def validate(_inst: object, attr: object, value: object) -> None:
        field = _name(name, attr)
        if not isinstance(value, Mapping):
            _fail(error, field, value, expected)
        fault = json_fault(value, finite=finite)
        if fault is not None:
            where, bad, why = fault
            _fail(error, field + where, bad, why)

    return validate


def json_fault(value: object, *, finite: bool) -> tuple[str, object, str] | None:
    """The first value in `value` JSON cannot carry: (where, what, expected).

    None when JSON carries all of it (see `json_object` for what it checks).
    """
    if isinstance(value, dict) and not value:  # the usual metadata: nothing to walk
        return None
    stack: list[tuple[str, object, tuple[int, ...]]] = [("", value, ())]
    while stack:
        where, item, inside = stack.pop()
        if isinstance(item, Mapping | list | tuple):
            if len(inside) == MAX_JSON_DEPTH:
                return where, None, TOO_DEEP
            if id(item) in inside:
                return where, None, "a JSON value, not one that holds itself"
            inner = (*inside, id(item))
            if isinstance(item, Mapping):
                for key in item:
                    if not isinstance(key, str):
                        return where, key, "string keys (JSON objects have no others)"
                items = [(f"{where}.{k}", v, inner) for k, v in item.items()]
            else:
                items = [(f"{where}[{i}]", v, inner) for i, v in enumerate(item)]
            stack += reversed(items)
        elif is_int(item):
            if not -_JSON_INT < item < _JSON_INT:  # type: ignore[operator]
                return where, None, LONG_INT
        elif isinstance(item, float) and finite and not math.isfinite(item):
            return where, item, "a finite number (JSON has no NaN or infinity)"
        elif not (item is None or isinstance(item, str | bool | float)):
            return where, item, f"a JSON value, not of type {type(item).__name__}"
    return None


def identifier(name: str | None = None) -> Check:
    """Return a validator: a usable id (a session's, a run's).

    A non-empty string of at most 200 characters.
    """

    def validate(_inst: object, attr: object, value: object) -> None:
        if not isinstance(value, str) or not value or len(value) > 200:
            raise ConfigError(_name(name, attr), value, "a non-empty string (<= 200)")

    return validate


_ID: Final = identifier()


def check_id(name: str, value: object) -> str:
    """Return `value` if it is a usable id (see `identifier`); else raise.

    Raises:
        ConfigError: `value` is not a non-empty string of at most 200 characters.
    """
    check(value, name, _ID)
    return value  # type: ignore[return-value]


def message_of(exc: BaseException) -> str:
    """Return ``str(exc)``, or a note saying it could not be read.

    An exception raised by a plug-in (a tool, a compactor, a counter) is
    described to the model, the log and the caller by its message: one
    whose ``__str__`` raises is described all the same, by that note.
    """
    try:
        return str(exc)
    except Exception as failed:
        return f"(its message could not be read: str() raised {type(failed).__name__})"


def crash_named(exc: BaseException) -> tuple[str, str]:
    """Return the type name and message a crash on `exc` is told with.

    Its own, or, for an error standing in for one raised elsewhere (a
    durable run's step crashed on an exception in its worker), that
    exception's: the error's ``crashed_as``.
    """
    named = getattr(exc, "crashed_as", None)
    if isinstance(named, tuple) and len(named) == 2:
        return str(named[0]), str(named[1])
    return type(exc).__name__, message_of(exc)


def token_count(value: object, counter: object, method: str) -> int:
    """Return `value`, what `counter`'s `method` returned, if it is a token count.

    A count is an int >= 0, not a bool. Every number turnfsm reads from a
    counter passes here before it sizes a request or reaches a record, so a
    counter that returns a float, None or a negative number is named where
    it is read, not found out when the stored session no longer loads.

    Raises:
        ConfigError: `value` is not an int >= 0; names the counter's class
            and `method`.
    """
    if type(value) is int and value >= 0:  # the usual case, quickly
        return value
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return int(value)  # an int subclass, as a plain int
    raise ConfigError(
        "counter",
        value,
        f"a token count: an int >= 0 (from {type(counter).__name__}.{method})",
    )


TOKENS_PER_CHAR: Final = 8
"""More tokens than this per character of a text is no tokenizer's count.

BPE makes at most one token of each UTF-8 byte (4 a character); the
shipped counters read at most about 4 a character too.
"""

TOKENS_PER_PIECE: Final = 64
"""What a counter may add for each message or text on top (its framing)."""


def tokens_beyond_text(tokens: int, chars: int, pieces: int) -> bool:
    """Whether `tokens` is more than any tokenizer makes of the text counted.

    `chars` is the text's length (an image counting as more characters
    than any provider's price for it needs), `pieces` how many messages
    or texts it is made of. A counter whose count is past this is at fault,
    not the conversation it counted.
    """
    return tokens > TOKENS_PER_CHAR * chars + TOKENS_PER_PIECE * max(1, pieces)


def clock_reading(value: object, clock: object) -> float:
    """Return `value`, what `clock()` returned, as seconds, if it is a time.

    A time is a finite int or float, not a bool. Every reading of a run's
    clock passes here before it reaches a record.

    Raises:
        ConfigError: `value` is not a finite number; names the clock.
    """
    if type(value) is float and math.isfinite(value):  # the usual case
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        try:
            seconds = float(value)
        except OverflowError:  # an int past any float
            seconds = math.inf
        if math.isfinite(seconds):
            return seconds
    name = getattr(clock, "__qualname__", None) or type(clock).__name__
    raise ConfigError(
        "clock",
        value,
        f"a time in seconds: a finite int or float (from the clock {name})",
    )


def check(value: object, name: str, *validators: Check) -> None:
    """Run `validators` on a plain `value` named `name` (outside attrs)."""
    for validate in validators:
        validate(None, _Named(name), value)


class _Named:
    """A stand-in attrs attribute carrying only a name."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


def as_tuple(
    value: Any, name: str, expected: str, *, error: _Error = ConfigError
) -> tuple[Any, ...]:
    """Return `value` as a tuple: any iterable but a string or a mapping."""
    if type(value) is tuple:  # already one (`tuple(value)` is `value`)
        return value
    if isinstance(value, str | bytes | Mapping) or not is_iterable(value):
        _fail(error, name, value, _sequence_of(expected, name, value))
    return tuple(value)


def _sequence_of(expected: str, name: str, value: object) -> str:
    """What a sequence setting expects; a single item given is shown in a list."""
    if is_iterable(value):  # a string or a mapping
        return f"a sequence of {expected}"
    return f"a sequence of {expected} (one goes in a list: {name}=[...])"


def tuple_of(
    name: str, expected: str, *, error: _Error = ConfigError
) -> Callable[[Any], tuple[Any, ...]]:
    """Return an attrs converter: any iterable but a string or a mapping, as a tuple.

    The items are checked by the field's validator (`each`).
    """

    def convert(value: Any) -> tuple[Any, ...]:
        if type(value) is tuple:  # already one (`tuple(value)` is `value`)
            return value
        if isinstance(value, str | bytes | Mapping) or not is_iterable(value):
            _fail(error, name, value, _sequence_of(expected, name, value))
        return tuple(value)

    return convert


def is_iterable(value: object) -> bool:
    try:
        iter(value)  # type: ignore[call-overload]
    except TypeError:
        return False
    return True


def unknown_argument(
    owner: str,
    name: str,
    value: object,
    known: Collection[str],
    hint: str | None = None,
    *,
    fallback: str = "",
) -> ConfigError:
    """The refusal of argument `name` (given `value`), which `owner` does not take.

    It says `hint` (where the argument belongs) when there is one, else the
    closest of the `known` arguments when one is close enough to be a
    misspelling, else `fallback` (default: the known ones).
    """
    if hint is None:
        close = difflib.get_close_matches(name, list(known), n=1)
        if close:
            hint = f"did you mean {close[0]!r}?"
        elif fallback:
            hint = fallback
        elif known:
            hint = "one of " + ", ".join(sorted(known))
        else:
            hint = f"{owner} takes none"
    return ConfigError(name, value, f"a known {owner} setting ({hint})")


def compactor_of(value: object, within: str = "{}") -> str:
    """The ``compactor=...`` argument that does what a ``strategy=value`` meant.

    A compaction strategy is a context manager's compactor, an object: a
    strategy's name (the command line's ``--strategy layered``) is made
    into one by `turnfsm.context.strategy_named`. `within` is the call the
    argument goes in (``"context=ContextManager({})"``).
    """
    if isinstance(value, str):
        made = within.format(f"compactor=strategy_named({value!r})")
        return f"{made} (from turnfsm.context)"
    return within.format(f"compactor={type(value).__name__}(...)")


def strategy_hint(name: str, value: object) -> str | None:
    """Where a ``strategy=`` argument belongs (None: `name` is not one)."""
    if name != "strategy":
        return None
    made = compactor_of(value)
    return f"a compaction strategy is the context manager's compactor: {made}"


Hint = Callable[[str, Any], str | None]
"""Says where an argument a class does not take belongs (None: nowhere known)."""


@overload
def keyword_checked(cls: _Class, /) -> _Class: ...


@overload
def keyword_checked(*, hint: Hint) -> Callable[[_Class], _Class]: ...


def keyword_checked(
    cls: _Class | None = None, /, *, hint: Hint | None = None
) -> _Class | Callable[[_Class], _Class]:
    """Make the attrs class `cls` refuse a wrong argument with a `ConfigError`.

    An unknown keyword (named, with the known one it is closest to, or
    where `hint` says it belongs), a positional argument where only
    keywords are taken, or a missing required one is refused the way a bad
    value is, instead of Python's `TypeError`. Only a call that failed is
    looked at: a good one costs a function call more.
    """
    if cls is None:
        return functools.partial(_keyword_checked, hint=hint)
    return _keyword_checked(cls, hint=hint)


def _keyword_checked(cls: _Class, *, hint: Hint | None) -> _Class:
    init = vars(cls)["__init__"]  # the one attrs wrote

    @functools.wraps(init)
    def checked(self: Any, *args: Any, **kwargs: Any) -> None:
        try:
            init(self, *args, **kwargs)
        except TypeError:
            refusal = _argument_refusal(cls, args, kwargs, hint)
            if refusal is None:
                raise
            raise refusal from None

    cls.__init__ = checked  # type: ignore[misc]
    return cls


def _argument_refusal(
    cls: type, args: tuple[Any, ...], kwargs: Mapping[str, Any], hint: Hint | None
) -> ConfigError | None:
    """The refusal of `cls(*args, **kwargs)`'s arguments (None: they fit)."""
    owner = cls.__name__
    fields = [f for f in attrs.fields(cls) if f.init]
    names = [f.alias or f.name for f in fields]
    for name, value in kwargs.items():
        if name not in names:
            return unknown_argument(
                owner, name, value, names, hint(name, value) if hint else None
            )
    positional = [n for f, n in zip(fields, names, strict=True) if not f.kw_only]
    if len(args) > len(positional):
        keyword = next((n for n in names if n not in positional), None)
        count = len(positional)
        expected = (
            f"no arguments ({owner}())"
            if not names
            else f"keyword arguments ({owner}({keyword}=...)): "
            f"{owner} takes {count or 'none'} by position"
            if keyword is not None
            else f"at most {count} argument{'s' if count > 1 else ''}"
        )
        return ConfigError(owner, args[len(positional)], expected)
    given = {*positional[: len(args)], *kwargs}
    for field, name in zip(fields, names, strict=True):
        if field.default is attrs.NOTHING and name not in given:
            return ConfigError(
                name, None, f"a value ({owner}({name}=...) is required)", missing=True
            )
    return None
