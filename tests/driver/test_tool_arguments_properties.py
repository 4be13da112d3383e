"""Properties of argument validation over generated schemas and arguments.

Schemas are objects of typed properties (integer, number, string, boolean,
null, enums), nested objects, arrays and nullable members, with a random
subset required and closed or open to unknown keys. For each, a valid
argument object reaches the tool unchanged; one mutation of it (a value of
the wrong type, a required key dropped, an unknown key added) is refused
with exactly that field named, and the tool does not run.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from typing import Any

import anyio
from hypothesis import event, given
from hypothesis import strategies as st

from turnfsm.driver import Tool
from turnfsm.driver._arguments import arguments_check
from turnfsm.driver._tools import run_tool_call
from turnfsm.messages import ToolCallPart

Schema = dict[str, Any]
Path = tuple[str | int, ...]

UNKNOWN = "zz_unknown"  # generated keys start with a-y: never a property
NOT_A_MEMBER = "not-a-member"  # enum strings are at most 5 characters

keys = st.from_regex(r"[a-y][a-y0-9_]{0,4}", fullmatch=True) | st.sampled_from(
    ["a b", "x-y", "ü", "0n"]
)
enum_values = st.one_of(
    st.text(max_size=5), st.integers(-3, 3), st.booleans(), st.none()
)
NON_NULL = ["integer", "number", "string", "boolean"]
scalars = st.sampled_from([*NON_NULL, "null"]).map(lambda kind: {"type": kind})
non_null_scalars = st.sampled_from(NON_NULL).map(lambda kind: {"type": kind})
enums = st.lists(enum_values, min_size=1, max_size=4, unique_by=json.dumps).map(
    lambda values: {"enum": values}
)


def objects_of(
    children: st.SearchStrategy[Schema], min_size: int = 0
) -> st.SearchStrategy[Schema]:
    @st.composite
    def build(draw: st.DrawFn) -> Schema:
        properties = draw(
            st.dictionaries(keys, children, min_size=min_size, max_size=4)
        )
        required = [k for k in properties if draw(st.booleans())]
        schema: Schema = {
            "type": "object",
            "properties": properties,
            "required": required,
        }
        if draw(st.booleans()):
            schema["additionalProperties"] = False
        return schema

    return build()


def extend(children: st.SearchStrategy[Schema]) -> st.SearchStrategy[Schema]:
    arrays = children.map(lambda items: {"type": "array", "items": items})
    objects = objects_of(children)
    nullable = (arrays | objects | non_null_scalars | enums).map(
        lambda inner: {"anyOf": [inner, {"type": "null"}]}
    )
    return arrays | objects | nullable


nodes = st.recursive(scalars | enums, extend, max_leaves=8)
root_schemas = objects_of(nodes, min_size=1)


# -- valid values ----------------------------------------------------------------

numbers = st.integers(-(10**6), 10**6) | st.floats(
    allow_nan=False, allow_infinity=False
)
json_values = st.recursive(
    st.none() | st.booleans() | numbers | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=2) | st.dictionaries(keys, inner, max_size=2)
    ),
    max_leaves=4,
)


def values_for(schema: Schema) -> st.SearchStrategy[Any]:
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    if "anyOf" in schema:
        return st.none() | values_for(schema["anyOf"][0])
    kind = schema["type"]
    if kind == "object":
        properties = schema["properties"]
        required = {k: values_for(properties[k]) for k in schema["required"]}
        optional = {
            k: values_for(s) for k, s in properties.items() if k not in required
        }
        objects = st.fixed_dictionaries(required, optional=optional)
        if schema.get("additionalProperties") is False:
            return objects
        extra = st.dictionaries(st.just(UNKNOWN), json_values, max_size=1)
        return st.builds(lambda o, e: {**o, **e}, objects, extra)
    if kind == "array":
        return st.lists(values_for(schema["items"]), max_size=3)
    return {
        "integer": st.integers(-(10**6), 10**6),
        "number": numbers,
        "string": st.text(max_size=8),
        "boolean": st.booleans(),
        "null": st.none(),
    }[kind]


# -- mutations ---------------------------------------------------------------------


def locations(
    schema: Schema, value: Any, path: Path = ()
) -> Iterator[tuple[Path, Schema, Any]]:
    """Yield every (path, schema, value) of the argument object, root included."""
    yield path, schema, value
    if "anyOf" in schema:
        if value is None:
            return
        yield from locations(schema["anyOf"][0], value, path)
        return
    if schema.get("type") == "object":
        for key, sub in schema["properties"].items():
            if key in value:
                yield from locations(sub, value[key], (*path, key))
    elif schema.get("type") == "array":
        for index, item in enumerate(value):
            yield from locations(schema["items"], item, (*path, index))


def wrong_values(schema: Schema) -> list[Any]:
    """Values that fail `schema` at its root (their type, or not a member)."""
    if "enum" in schema:
        return [NOT_A_MEMBER]
    if "anyOf" in schema:
        return [v for v in wrong_values(schema["anyOf"][0]) if v is not None]
    return {
        "integer": ["3", True, 1.5, None, [], {}],
        "number": ["1.5", True, None, [1], {}],
        "string": [3, False, None, ["a"], {"a": "b"}],
        "boolean": [1, "true", None, [], {}],
        "null": [0, "", False, [], {}],
        "array": ["x", 1, {}, None],
        "object": ["x", 1, [], None],
    }[schema["type"]]


def at(root: dict[str, Any], path: Path) -> Any:
    node: Any = root
    for step in path:
        node = node[step]
    return node


@st.composite
def mutations(
    draw: st.DrawFn, schema: Schema, args: dict[str, Any]
) -> tuple[dict[str, Any], Path, str] | None:
    """Return (mutated arguments, the path of the bad field, its problem) or None."""
    options: list[tuple[str, Path, Schema]] = []
    wrong_at: set[Path] = set()
    for path, sub, value in locations(schema, args):
        if path and path not in wrong_at:  # a nullable first, not its inner node
            wrong_at.add(path)
            options.append(("wrong", path, sub))
        if sub.get("type") == "object" and isinstance(value, dict):
            options += [("drop", (*path, k), sub) for k in sub["required"]]
            if sub.get("additionalProperties") is False:
                options.append(("extra", (*path, UNKNOWN), sub))
    if not options:
        return None
    kind, path, sub = draw(st.sampled_from(options))
    mutated = copy.deepcopy(args)
    parent, last = at(mutated, path[:-1]), path[-1]
    if kind == "wrong":
        parent[last] = draw(st.sampled_from(wrong_values(sub)))
        return mutated, path, "expected "
    if kind == "drop":
        del parent[last]
        return mutated, path, "missing (required)"
    parent[last] = 1
    return mutated, path, "unexpected ("


def expected_path(path: Path) -> str:
    out = ""
    for step in path:
        if isinstance(step, int):
            out += f"[{step}]"
        elif re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", step):
            out += f".{step}" if out else step
        else:
            out += f"[{json.dumps(step, ensure_ascii=False)}]"
    return out


# -- the property --------------------------------------------------------------------


def call(
    schema: Schema, args: dict[str, Any]
) -> tuple[str, bool, list[dict[str, Any]]]:
    received: list[dict[str, Any]] = []

    async def record(**kwargs: Any) -> str:
        received.append(kwargs)
        return "ran"

    tool = Tool(name="t", description="generated", parameters=schema, fn=record)

    async def main() -> tuple[str, bool]:
        part = ToolCallPart(id="c1", name="t", arguments=args)
        result = (await run_tool_call(part, {"t": tool}, limit=None)).tool_results[0]
        return result.content, result.is_error

    content, is_error = anyio.run(main)
    return content, is_error, received


@given(st.data())
def test_valid_arguments_pass_unchanged_and_one_bad_field_is_named(
    data: st.DataObject,
) -> None:
    schema = data.draw(root_schemas, label="schema")
    args = data.draw(values_for(schema), label="arguments")

    content, is_error, received = call(schema, args)
    assert (content, is_error) == ("ran", False)
    # Unchanged: the same keys and values, and the same JSON types (1 is not 1.0).
    assert received == [args]
    assert json.dumps(received[0], sort_keys=True) == json.dumps(args, sort_keys=True)

    mutation = data.draw(mutations(schema, args), label="mutation")
    if mutation is None:
        event("no mutation")
        return
    bad, path, problem = mutation
    event(f"mutation: {problem.strip(' (')}, depth {min(len(path), 3)}")
    content, is_error, received = call(schema, bad)
    assert is_error
    assert received == []
    lines = [line for line in content.splitlines() if line.startswith("- ")]
    assert len(lines) == 1, content
    assert lines[0].startswith(f"- {expected_path(path)}: {problem}"), content


# -- the quick test of flat schemas ----------------------------------------------

TYPE_NAMES = ["integer", "number", "string", "boolean", "null"]
flat_fields = st.one_of(
    st.sampled_from(TYPE_NAMES).map(lambda kind: {"type": kind}),
    st.lists(st.sampled_from(TYPE_NAMES), min_size=1, max_size=3, unique=True).map(
        lambda kinds: {"type": kinds}
    ),
    st.just({}),
    st.just({"description": "any value"}),
)
flat_schemas = objects_of(flat_fields)
tricky_values = json_values | st.sampled_from([1.0, -0.0, True, False, 2**70, 1e300])


@given(
    schema=flat_schemas,
    arguments=st.dictionaries(keys | st.just(UNKNOWN), tricky_values, max_size=5)
    | tricky_values,
)
def test_the_quick_test_of_a_flat_schema_accepts_only_what_the_validator_accepts(
    schema: Schema, arguments: Any
) -> None:
    check = arguments_check("t", schema)
    assert check.quick is not None, "a flat schema gets a quick test"
    valid = not list(check.validator.iter_errors(arguments))
    quick = check.quick(arguments)
    event(f"quick {quick}, valid {valid}")
    assert valid or not quick
    # And the quick test is no mere `False`: exact JSON types it decides alone.
    if valid and _exact(arguments):
        assert quick
    if isinstance(arguments, dict):
        # As a model's reply brings them: a call's read-only arguments.
        called = ToolCallPart(id="c", name="t", arguments=arguments).arguments
        assert check.quick(called) == quick


def _exact(arguments: Any) -> bool:
    """Whether every value is of a type the quick test knows exactly (no 1.0)."""
    return type(arguments) is dict and all(
        type(v) in (str, int, bool, type(None))
        or (type(v) is float and not v.is_integer())
        for v in arguments.values()
    )


@given(schema=root_schemas)
def test_only_flat_schemas_get_a_quick_test(schema: Schema) -> None:
    flat = all(
        not ({"items", "properties", "enum", "anyOf"} & set(field))
        for field in schema["properties"].values()
    )
    assert (arguments_check("t", schema).quick is not None) == flat
