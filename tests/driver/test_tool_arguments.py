"""Tool arguments validated against the tool's schema; the schema from annotations."""

from __future__ import annotations

import dataclasses
import enum
import functools
from collections.abc import Callable, Sequence
from typing import Annotated, Any, Literal, NotRequired, TypedDict

import annotated_types
import attrs
import pydantic
import pytest

from turnfsm.driver import Tool
from turnfsm.driver._tools import run_tool_call, tools_by_name
from turnfsm.errors import ConfigError, ToolError
from turnfsm.messages import ToolCallPart


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


@attrs.frozen
class Item:
    """One line of an order.

    Attributes:
        name: what to order.
    """

    name: str
    qty: int = 1


@dataclasses.dataclass
class Point:
    x: float
    y: float = 0.0


class Filters(TypedDict):
    tag: str
    since: NotRequired[int]


@attrs.frozen
class Node:
    children: list[Node]


# -- the schema from annotations -------------------------------------------------

OBJECT_OF_ITEM = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "description": "what to order."},
        "qty": {"type": "integer"},
    },
    "required": ["name"],
    "additionalProperties": False,
}

SCHEMAS: list[tuple[str, object, dict[str, Any]]] = [
    ("int", int, {"type": "integer"}),
    ("float", float, {"type": "number"}),
    ("bool", bool, {"type": "boolean"}),
    ("str", str, {"type": "string"}),
    ("None", None, {"type": "null"}),
    ("optional", int | None, {"anyOf": [{"type": "integer"}, {"type": "null"}]}),
    (
        "union",
        int | str | None,
        {"anyOf": [{"type": "integer"}, {"type": "string"}, {"type": "null"}]},
    ),
    ("literal", Literal["a", "b"], {"enum": ["a", "b"]}),
    ("enum", Color, {"enum": ["red", "blue"]}),
    ("int-enum", Level, {"enum": [1, 2]}),
    ("list", list[int], {"type": "array", "items": {"type": "integer"}}),
    # OpenAI refuses an array schema without "items" (HTTP 400: "array schema
    # missing items"), and reads no "prefixItems".
    ("bare-list", list, {"type": "array", "items": {}}),
    ("sequence", Sequence[str], {"type": "array", "items": {"type": "string"}}),
    ("set", set[str], {"type": "array", "items": {"type": "string"}}),
    ("tuple-of", tuple[int, ...], {"type": "array", "items": {"type": "integer"}}),
    (
        "tuple",
        tuple[int, str],
        {
            "type": "array",
            "prefixItems": [{"type": "integer"}, {"type": "string"}],
            "items": {"anyOf": [{"type": "integer"}, {"type": "string"}]},
            "minItems": 2,
            "maxItems": 2,
        },
    ),
    (
        "tuple-of-one-type",
        tuple[int, int],
        {
            "type": "array",
            "prefixItems": [{"type": "integer"}, {"type": "integer"}],
            "items": {"type": "integer"},
            "minItems": 2,
            "maxItems": 2,
        },
    ),
    ("bare-tuple", tuple, {"type": "array", "items": {}}),
    ("empty-tuple", tuple[()], {"type": "array", "items": {}, "maxItems": 0}),
    (
        "dict",
        dict[str, int],
        {"type": "object", "additionalProperties": {"type": "integer"}},
    ),
    ("bare-dict", dict, {"type": "object"}),
    ("any", Any, {}),
    (
        "annotated",
        Annotated[int, "how many"],
        {"type": "integer", "description": "how many"},
    ),
    (
        "annotated-bounds",
        Annotated[int, annotated_types.Ge(1), annotated_types.Lt(10)],
        {"type": "integer", "minimum": 1, "exclusiveMaximum": 10},
    ),
    (
        "annotated-interval",
        Annotated[float, annotated_types.Interval(gt=0, le=1)],
        {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
    ),
    (
        "annotated-length",
        Annotated[str, annotated_types.Len(1, 20)],
        {"type": "string", "minLength": 1, "maxLength": 20},
    ),
    (
        "annotated-items",
        Annotated[list[int], annotated_types.MinLen(2)],
        {"type": "array", "items": {"type": "integer"}, "minItems": 2},
    ),
    (
        "annotated-field",
        Annotated[int, pydantic.Field(ge=0, multiple_of=5, description="minutes")],
        {"type": "integer", "minimum": 0, "multipleOf": 5, "description": "minutes"},
    ),
    ("attrs", Item, OBJECT_OF_ITEM),
    ("list-of-attrs", list[Item], {"type": "array", "items": OBJECT_OF_ITEM}),
    (
        "dataclass",
        Point,
        {
            "type": "object",
            "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
            "required": ["x"],
            "additionalProperties": False,
        },
    ),
    (
        "typeddict",
        Filters,
        {
            "type": "object",
            "properties": {"tag": {"type": "string"}, "since": {"type": "integer"}},
            "required": ["tag"],
            "additionalProperties": False,
        },
    ),
]


@pytest.mark.parametrize(
    ("annotation", "expected"),
    [(a, e) for _, a, e in SCHEMAS],
    ids=[i for i, _, _ in SCHEMAS],
)
def test_each_annotation_has_its_json_schema(
    annotation: object, expected: dict[str, Any]
) -> None:
    def f(value: Any, other: int = 0) -> str:
        return "ok"

    f.__annotations__ = {"value": annotation, "other": int, "return": str}
    params = Tool.from_function(f).parameters
    assert params["properties"]["value"] == expected
    assert params["required"] == ["value"]  # `other` has a default


class NoMembers(enum.Enum):
    """An enum with nothing in it (a base for others)."""


@dataclasses.dataclass
class Broken:
    """A class whose field names a type that does not exist (a NameError)."""

    part: NoSuchPart  # type: ignore[name-defined]  # noqa: F821


class BrokenKeys(TypedDict):
    part: NoSuchPart  # type: ignore[name-defined]  # noqa: F821


@pytest.mark.parametrize(
    ("annotation", "reason"),
    [
        (object, "unsupported annotation"),
        (dict[int, str], "keys are strings"),
        (Node, "contains itself"),
        (list[Callable[[], None]], "unsupported annotation"),
        (NoMembers, "NoMembers has no members: no value can be given"),
        (Broken, "Broken.part: annotation 'NoSuchPart' cannot be resolved"),
        (list[Broken], "Broken.part: annotation 'NoSuchPart' cannot be resolved"),
        (BrokenKeys, "BrokenKeys.part: annotation 'NoSuchPart' cannot be resolved"),
    ],
    ids=[
        "object",
        "int-keys",
        "recursive",
        "callable",
        "empty-enum",
        "unresolved",
        "unresolved-inside",
        "unresolved-key",
    ],
)
def test_annotations_without_a_json_form_are_refused_when_the_tool_is_built(
    annotation: object, reason: str
) -> None:
    def f(value: Any) -> str:
        return ""

    f.__annotations__ = {"value": annotation, "return": str}
    with pytest.raises(ToolError, match=reason):
        Tool.from_function(f)


# -- validation ----------------------------------------------------------------


class Recorder:
    """A tool body that records every call it gets."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def __call__(self, **kwargs: Any) -> str:
        self.calls.append(kwargs)
        return "ran"


def order(
    items: list[Item],
    mode: Literal["fast", "cheap"] = "fast",
    color: Color = Color.RED,
    count: int = 1,
    weight: float = 1.0,
    gift: bool = False,
    note: str | None = None,
    where: Point | None = None,
    pair: tuple[int, str] = (0, ""),
    extras: dict[str, int] | None = None,
) -> str:
    """Place an order."""
    return "placed"


def recording(fn: Callable[..., Any]) -> tuple[Tool, Recorder]:
    recorder = Recorder()
    tool = Tool.from_function(fn)
    return attrs.evolve(tool, fn=recorder), recorder


async def run(tool: Tool, **arguments: Any) -> tuple[str, bool]:
    part = ToolCallPart(id="c1", name=tool.name, arguments=arguments)
    result = (await run_tool_call(part, {tool.name: tool}, limit=5)).tool_results[0]
    return result.content, result.is_error


def problems(content: str) -> list[str]:
    return [line[2:] for line in content.splitlines() if line.startswith("- ")]


BAD_ARGUMENTS = [
    (
        "int-gets-a-word",
        {"count": "three"},
        'count: expected integer, got "three" (string)',
    ),
    ("int-gets-a-numeral", {"count": "3"}, 'count: expected integer, got "3" (string)'),
    ("int-gets-true", {"count": True}, "count: expected integer, got true (boolean)"),
    (
        "int-gets-a-fraction",
        {"count": 2.5},
        "count: expected integer, got 2.5 (number)",
    ),
    (
        "float-gets-a-numeral",
        {"weight": "1.5"},
        'weight: expected number, got "1.5" (string)',
    ),
    (
        "float-gets-false",
        {"weight": False},
        "weight: expected number, got false (boolean)",
    ),
    ("bool-gets-1", {"gift": 1}, "gift: expected boolean, got 1 (integer)"),
    (
        "bool-gets-a-word",
        {"gift": "true"},
        'gift: expected boolean, got "true" (string)',
    ),
    (
        "literal",
        {"mode": "zzz"},
        'mode: expected one of "fast", "cheap", got "zzz" (string)',
    ),
    (
        "enum",
        {"color": "green"},
        'color: expected one of "red", "blue", got "green" (string)',
    ),
    ("optional", {"note": 5}, "note: expected string or null, got 5 (integer)"),
    (
        "nested-type",
        {"where": {"x": "north"}},
        'where.x: expected number, got "north" (string)',
    ),
    ("nested-missing", {"where": {"y": 1}}, "where.x: missing (required)"),
    (
        "nested-unknown",
        {"where": {"x": 1, "z": 2}},
        "where.z: unexpected (not a field here)",
    ),
    (
        "array-item",
        {"items": [{"name": "a"}, {"name": "b"}, {"name": 3}]},
        "items[2].name: expected string, got 3 (integer)",
    ),
    (
        "array-not-array",
        {"items": {"name": "a"}},
        'items: expected array, got {"name": "a"} (object)',
    ),
    (
        "tuple-too-long",
        {"pair": [1, "a", 2]},
        'pair: expected at most 2 items, got [1, "a", 2] (array)',
    ),
    (
        "tuple-too-short",
        {"pair": [1]},
        "pair: expected at least 2 items, got [1] (array)",
    ),
    ("tuple-item", {"pair": ["1", "a"]}, 'pair[0]: expected integer, got "1" (string)'),
    (
        "dict-value",
        {"extras": {"a b": "1"}},
        'extras["a b"]: expected integer, got "1" (string)',
    ),
    ("unknown", {"colour": "red"}, "colour: unexpected (not a parameter of this tool)"),
]


@pytest.mark.parametrize(
    ("arguments", "problem"),
    [(a, p) for _, a, p in BAD_ARGUMENTS],
    ids=[i for i, _, _ in BAD_ARGUMENTS],
)
@pytest.mark.anyio
async def test_a_bad_field_is_named_and_the_tool_does_not_run(
    arguments: dict[str, Any], problem: str
) -> None:
    tool, recorder = recording(order)
    content, is_error = await run(tool, **({"items": []} | arguments))
    assert is_error
    assert problems(content) == [problem]
    assert content.startswith("invalid arguments for tool 'order'; it did not run:\n")
    assert content.endswith("\nCall 'order' again with corrected arguments.")
    assert recorder.calls == []


@pytest.mark.anyio
async def test_arguments_that_were_not_json_are_named_as_such() -> None:
    """A reply cut off at its token limit, or malformed, leaves the call's
    arguments as the text it sent (``{"_raw": ...}``): the model is told the
    text is no JSON object, not that ``_raw`` is an unknown parameter."""
    tool, recorder = recording(order)
    content, is_error = await run(tool, _raw='{"items": [{"name": "te')
    assert is_error
    assert problems(content) == [
        "(the arguments): expected a JSON object of the arguments (the text "
        "sent is not valid JSON; it may have been cut off), "
        'got "{\\"items\\": [{\\"name\\": \\"te" (string)'
    ]
    assert recorder.calls == []


@pytest.mark.parametrize(
    ("raw", "kind"),
    [("[1, 2]", "an array"), ('"Paris"', "a string"), ("7", "a number")],
)
@pytest.mark.anyio
async def test_arguments_that_are_json_but_no_object_are_named_as_such(
    raw: str, kind: str
) -> None:
    """They were said to be no valid JSON, maybe cut off: the model was sent
    looking for a cut where there was none."""
    tool, recorder = recording(order)
    content, is_error = await run(tool, _raw=raw)
    assert is_error
    shown = raw.replace('"', '\\"')
    assert problems(content) == [
        "(the arguments): expected a JSON object of the arguments, one field "
        f"per parameter (the text sent is valid JSON, but {kind}, not an "
        f'object), got "{shown}" (string)'
    ]
    assert recorder.calls == []


@pytest.mark.parametrize("raw", ['{"a": NaN, "b": 1}', "NaN", "-Infinity"])
@pytest.mark.anyio
async def test_arguments_with_nan_or_infinity_are_named_no_json(raw: str) -> None:
    """The clients read them as no JSON; Python's reader took them for JSON,
    so the model was told its object was nested too deeply, or that its
    valid JSON was a number."""
    tool, recorder = recording(order)
    content, is_error = await run(tool, _raw=raw)
    assert is_error
    shown = raw.replace('"', '\\"')
    assert problems(content) == [
        "(the arguments): expected a JSON object of the arguments (the text "
        f'sent is not valid JSON; it may have been cut off), got "{shown}" (string)'
    ]
    assert recorder.calls == []


@pytest.mark.anyio
async def test_arguments_not_json_do_not_run_a_tool_whose_schema_is_open() -> None:
    """A schema that allows unknown names (one given by hand, or a pydantic
    model's without ``extra="forbid"``) would let ``{"_raw": ...}`` through:
    the tool would run on its defaults, or get ``_raw``, for a call the model
    never finished."""
    seen: list[dict[str, Any]] = []

    def lookup(**kwargs: Any) -> str:
        seen.append(kwargs)
        return "ran"

    tool = Tool(
        name="lookup",
        description="Look up.",
        parameters={"type": "object", "properties": {"q": {"type": "string"}}},
        fn=lookup,
    )
    content, is_error = await run(tool, _raw='{"q": "te')
    assert is_error
    assert problems(content) == [
        "(the arguments): expected a JSON object of the arguments (the text "
        "sent is not valid JSON; it may have been cut off), "
        'got "{\\"q\\": \\"te" (string)'
    ]
    assert seen == []


@pytest.mark.anyio
async def test_a_parameter_named_raw_is_an_argument_like_any_other() -> None:
    def echo(_raw: str) -> str:
        return _raw

    content, is_error = await run(Tool.from_function(echo), _raw="text")
    assert (content, is_error) == ("text", False)


@pytest.mark.anyio
async def test_a_constraint_in_annotated_is_checked_before_the_tool_runs() -> None:
    # Ge(1) and Field(le=...) were dropped from the schema: the tool ran with
    # 0 and -5.
    seen: list[tuple[int, int]] = []

    def wait(
        minutes: Annotated[int, annotated_types.Ge(1)],
        tries: Annotated[int, pydantic.Field(le=3)] = 1,
    ) -> str:
        seen.append((minutes, tries))
        return "ok"

    content, is_error = await run(Tool.from_function(wait), minutes=0, tries=5)
    assert is_error
    assert problems(content) == [
        "minutes: expected at least 1, got 0 (integer)",
        "tries: expected at most 3, got 5 (integer)",
    ]
    assert seen == []


@pytest.mark.anyio
async def test_every_bad_field_is_listed_at_once() -> None:
    tool, recorder = recording(order)
    content, is_error = await run(
        tool,
        items=[{"name": "a", "qty": "2"}, {}],
        mode="zzz",
        count=True,
        sneaky=1,
    )
    assert is_error
    assert problems(content) == [
        'items[0].qty: expected integer, got "2" (string)',
        "items[1].name: missing (required)",
        'mode: expected one of "fast", "cheap", got "zzz" (string)',
        "count: expected integer, got true (boolean)",
        "sneaky: unexpected (not a parameter of this tool)",
    ]
    assert recorder.calls == []


@pytest.mark.anyio
async def test_a_missing_required_argument_is_named() -> None:
    tool, recorder = recording(order)
    content, _ = await run(tool, mode="fast")
    assert problems(content) == ["items: missing (required)"]
    assert recorder.calls == []


@pytest.mark.anyio
async def test_a_long_value_is_shortened() -> None:
    tool, _ = recording(order)
    content, _ = await run(tool, items=[], count="x" * 500)
    assert problems(content) == [
        'count: expected integer, got "' + "x" * 56 + "... (string)"
    ]


@pytest.mark.anyio
async def test_valid_arguments_reach_the_tool_as_values_of_their_annotations() -> None:
    seen: list[dict[str, Any]] = []

    def place(
        items: list[Item],
        color: Color,
        level: Level,
        where: Point,
        pair: tuple[int, str],
        filters: Filters,
        weight: float,
        count: int,
        note: str | None = None,
    ) -> str:
        """Place an order."""
        seen.append(
            {
                "items": items,
                "color": color,
                "level": level,
                "where": where,
                "pair": pair,
                "filters": filters,
                "weight": weight,
                "count": count,
                "note": note,
            }
        )
        return "ok"

    tools = tools_by_name([place])
    arguments = {
        "items": [{"name": "tea", "qty": 2}, {"name": "milk"}],
        "color": "blue",
        "level": 2,
        "where": {"x": 1, "y": 2.5},
        "pair": [1, "a"],
        "filters": {"tag": "x"},
        "weight": 3,
        "count": 4.0,
    }
    part = ToolCallPart(id="c1", name="place", arguments=arguments)
    result = (await run_tool_call(part, tools, limit=5)).tool_results[0]
    assert (result.content, result.is_error) == ("ok", False)
    assert seen == [
        {
            "items": [Item("tea", 2), Item("milk", 1)],
            "color": Color.BLUE,
            "level": Level.HIGH,
            "where": Point(1.0, 2.5),
            "pair": (1, "a"),
            "filters": {"tag": "x"},
            "weight": 3.0,
            "count": 4,
            "note": None,
        }
    ]
    # JSON has one number type: an int is a fine float, an integral float a fine int.
    assert type(seen[0]["weight"]) is float
    assert type(seen[0]["count"]) is int


@pytest.mark.anyio
async def test_a_union_reads_the_first_member_the_value_fits() -> None:
    seen: list[object] = []

    def pick(value: int | Point | list[str]) -> str:
        """Pick one."""
        seen.append(value)
        return "ok"

    tool = Tool.from_function(pick)
    for value in (3, {"x": 1}, ["a"]):
        assert await run(tool, value=value) == ("ok", False)
    assert seen == [3, Point(1.0, 0.0), ["a"]]
    content, _ = await run(tool, value="3")
    assert problems(content) == [
        'value: expected integer or object or array, got "3" (string)'
    ]


# -- refusals after the schema: validators of the parameters class ------------------


@attrs.frozen
class Positive:
    amount: int = attrs.field(validator=attrs.validators.gt(0))


@pytest.mark.anyio
async def test_a_class_validator_refusing_a_value_is_an_invalid_arguments_result() -> (
    None
):
    calls: list[Positive] = []

    def pay(first: Positive, second: Positive) -> str:
        """Pay twice."""
        calls.append(first)
        return "paid"

    tool = Tool.from_function(pay)
    content, is_error = await run(tool, first={"amount": 0}, second={"amount": 1})
    assert is_error
    # attrs checks in __init__: the class is named, the field in the message.
    assert problems(content) == ["first: refused: ValueError: 'amount' must be > 0: 0"]
    assert calls == []


# -- an explicit schema ------------------------------------------------------------


@pytest.mark.anyio
async def test_an_explicit_schema_is_enforced_as_given() -> None:
    recorder = Recorder()
    tool = Tool(
        name="resize",
        description="Resize an image.",
        parameters={
            "type": "object",
            "properties": {
                "width": {"type": "integer", "minimum": 1},
                "unit": {"const": "px"},
                "tags": {"type": "array", "maxItems": 2},
            },
            "required": ["width"],
        },
        fn=recorder,
    )
    content, is_error = await run(tool, width=0, unit="em", tags=[1, 2, 3], other=1)
    assert is_error
    assert problems(content) == [
        "width: expected at least 1, got 0 (integer)",
        'unit: expected "px", got "em" (string)',
        "tags: expected at most 2 items, got [1, 2, 3] (array)",
    ]
    assert await run(tool, width=3, other={"kept": True}) == ("ran", False)
    assert recorder.calls == [{"width": 3, "other": {"kept": True}}]


def _resize(width: int, unit: str = "px") -> str:
    return f"{width}{unit}"


def test_a_schema_naming_a_parameter_the_function_lacks_is_a_config_error() -> None:
    # Every call that gave it failed at run time: "tool 'resize' failed:
    # TypeError: _resize() got an unexpected keyword argument 'height'".
    with pytest.raises(ConfigError) as caught:
        Tool(
            name="resize",
            description="d",
            parameters={
                "type": "object",
                "properties": {"width": {"type": "integer"}, "height": {}},
            },
            fn=_resize,
        )
    assert caught.value.field == "Tool('resize').parameters.properties.height"
    assert str(caught.value) == (
        "invalid Tool('resize').parameters.properties.height={}: expected a "
        "parameter the function takes (_resize takes width, unit)"
    )


def test_a_required_name_the_function_lacks_is_a_config_error() -> None:
    # Every call failed: without it the schema refused the call, with it the
    # function did ("got an unexpected keyword argument 'height'").
    with pytest.raises(ConfigError) as caught:
        Tool(
            name="resize",
            description="d",
            parameters={
                "type": "object",
                "properties": {"width": {"type": "integer"}},
                "required": ["width", "height"],
            },
            fn=_resize,
        )
    assert caught.value.field == "Tool('resize').parameters.required"
    assert str(caught.value) == (
        "invalid Tool('resize').parameters.required=['width', 'height']: expected"
        " names of parameters the function takes (_resize takes width, unit; it"
        " does not take 'height')"
    )


def test_a_parameter_the_schema_leaves_out_is_a_config_error() -> None:
    # The model was never told of `width`, and every call failed with
    # "missing 1 required positional argument".
    with pytest.raises(ConfigError) as caught:
        Tool(name="resize", description="d", parameters={"type": "object"}, fn=_resize)
    assert str(caught.value) == (
        "invalid Tool('resize').parameters.properties={}: expected a property"
        " 'width': _resize takes it with no default"
    )


def test_a_schema_that_composes_its_properties_or_a_decorator_that_supplies_one() -> (
    None
):
    # Both were refused as "expected a property 'width'": the properties are
    # in allOf, and the decorator gives `db` itself.
    composed = {
        "type": "object",
        "allOf": [
            {"properties": {"width": {"type": "integer"}}, "required": ["width"]},
            {"properties": {"unit": {"type": "string"}}},
        ],
    }
    assert Tool(name="resize", description="d", fn=_resize, parameters=composed)

    def resize(db: object, width: int, unit: str = "px") -> str:
        return f"{width}{unit}"

    @functools.wraps(resize)
    def with_db(**arguments: Any) -> str:
        return resize(db="the database", **arguments)

    schema = {
        "type": "object",
        "properties": {"width": {"type": "integer"}, "unit": {"type": "string"}},
        "required": ["width"],
    }
    assert Tool(name="resize", description="d", fn=with_db, parameters=schema)


def test_a_default_that_is_no_value_of_its_parameter_is_a_tool_error() -> None:
    def pick(count: int = "all", mode: Literal["a", "b"] = "a") -> str:  # type: ignore[assignment]
        """Pick."""
        return f"{count}{mode}"

    def choose(mode: Literal["a", "b"] = "c", limit: int = None) -> str:  # type: ignore[assignment]  # noqa: RUF013
        """Choose."""
        return mode

    with pytest.raises(ToolError, match="parameter 'count' \\('all'\\) is no value"):
        Tool.from_function(pick)
    with pytest.raises(ToolError, match="parameter 'mode' \\('c'\\) is no value"):
        Tool.from_function(choose)


def test_a_default_of_none_is_taken_as_not_given() -> None:
    def page(limit: int = None, offset: float = 0) -> str:  # type: ignore[assignment]  # noqa: RUF013
        """Page."""
        return f"{limit}{offset}"

    assert Tool.from_function(page).name == "page"


def test_a_schema_the_function_takes_is_a_tool() -> None:
    Tool(
        name="resize",
        description="d",
        parameters={"type": "object", "properties": {"width": {"type": "integer"}}},
        fn=_resize,
    )
    Tool(name="any", description="d", parameters=_ANY_NAMES, fn=Recorder())


_ANY_NAMES: dict[str, Any] = {"type": "object", "properties": {"x": {}}}


def test_an_invalid_explicit_schema_is_a_config_error_naming_the_tool() -> None:
    with pytest.raises(ConfigError) as caught:
        Tool(
            name="resize",
            description="d",
            parameters={"type": "object", "properties": {"width": {"type": "integr"}}},
            fn=Recorder(),
        )
    assert caught.value.field == "Tool('resize').parameters.properties.width.type"
    assert caught.value.value == "integr"
    assert "a valid JSON schema" in str(caught.value)


@pytest.mark.parametrize(
    "ref", ["#/$defs/missing", "#/properties/nowhere", "https://example.com/size.json"]
)
def test_a_reference_the_schema_cannot_resolve_is_a_config_error(ref: str) -> None:
    with pytest.raises(ConfigError) as caught:
        Tool(
            name="resize",
            description="d",
            parameters={
                "type": "object",
                "$defs": {"size": {"type": "integer"}},
                "properties": {"width": {"$ref": "#/$defs/size"}, "h": {"$ref": ref}},
            },
            fn=Recorder(),
        )
    assert caught.value.field == "Tool('resize').parameters.properties.h.$ref"
    assert caught.value.value == ref


@pytest.mark.anyio
async def test_references_inside_the_schema_and_data_that_looks_like_one_are_kept() -> (
    None
):
    recorder = Recorder()
    tool = Tool(
        name="resize",
        description="d",
        parameters={
            "type": "object",
            "$defs": {"size": {"type": "integer", "minimum": 1}},
            "properties": {
                "width": {"$ref": "#/$defs/size"},
                "note": {"type": "object", "default": {"$ref": "not a reference"}},
            },
        },
        fn=recorder,
    )
    assert await run(tool, width=3) == ("ran", False)
    content, is_error = await run(tool, width=0)
    assert is_error
    assert "width" in content


def test_a_schema_that_is_not_an_object_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"Tool\('resize'\)\.parameters\.type"):
        Tool(
            name="resize", description="d", parameters={"type": "array"}, fn=Recorder()
        )


@pytest.mark.anyio
async def test_an_explicit_schema_of_another_draft_is_read_as_that_draft() -> None:
    # Draft 7's `items` as an array is a tuple; in 2020-12 it would be invalid.
    tool = Tool(
        name="pair",
        description="d",
        parameters={
            "$schema": "http://json-schema.org/draft-07/schema#",
            "type": "object",
            "properties": {"p": {"type": "array", "items": [{"type": "integer"}]}},
        },
        fn=Recorder(),
    )
    content, _ = await run(tool, p=["x"])
    assert problems(content) == ['p[0]: expected integer, got "x" (string)']


@pytest.mark.anyio
async def test_a_long_list_of_problems_is_cut_and_counted() -> None:
    tool, recorder = recording(order)
    content, _ = await run(tool, items=[], **{f"x{i:02}": i for i in range(25)})
    lines = problems(content)
    assert len(lines) == 21
    assert lines[0] == "x00: unexpected (not a parameter of this tool)"
    assert lines[-1] == "... and 5 more"
    assert recorder.calls == []


def test_a_schema_is_checked_once_and_each_tool_still_validates_its_calls() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    first = Tool(name="one", description="d", parameters=schema, fn=Recorder())
    # An equal schema, another dict, another tool: the checked validator is
    # reused, and it validates this tool's calls all the same.
    again = Tool(name="two", description="d", parameters=dict(schema), fn=Recorder())
    assert again._validator is first._validator
    assert not list(again._validator.validator.iter_errors({"n": 1}))
    assert [e.message for e in again._validator.validator.iter_errors({"n": "x"})] == [
        "'x' is not of type 'integer'"
    ]
    # A bad schema is never remembered: refused every time, naming its tool.
    bad = {"type": "object", "properties": {"n": {"type": "integr"}}}
    for name in ("three", "four"):
        with pytest.raises(ConfigError) as caught:
            Tool(name=name, description="d", parameters=bad, fn=Recorder())
        assert caught.value.field == f"Tool({name!r}).parameters.properties.n.type"
