"""The sizes a machine definition keeps, and machines of thousands of phases.

A text that nests deeper than `MAX_NESTING` or writes a number longer than
`MAX_DIGITS` is refused before `tomllib` reads it (which would recurse, go
quadratic, or raise a bare `ValueError`); a parsed definition that is not a
mapping with string keys, nests too deep, holds itself or an integer out of
TOML's range is refused before the loader reads it. Every refusal is one
`DefinitionError` naming the line (in a file) or the field (in a dict). The
graph checks are iterative and linear enough for thousands of phases.
"""

from __future__ import annotations

import tomllib
import unicodedata
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.core.test_source_map import Emitter
from tests.helpers import turn_toml_text
from tests.profiles import sized
from turnfsm.core import MachineSpec
from turnfsm.core._limits import (
    MAX_DIGITS,
    MAX_NESTING,
    shape_problems,
    text_problem,
)
from turnfsm.core._problems import SUGGESTION_BUDGET
from turnfsm.errors import ConfigError, DefinitionError, Problem

STOCK = turn_toml_text()
DEEP = MAX_NESTING + 1


def nested(depth: int, inner: str = "1") -> str:
    return "[" * depth + inner + "]" * depth


def tables(depth: int) -> str:
    return "{a = " * depth + "1" + "}" * depth


def dotted(parts: int) -> str:
    return ".".join(["k"] * parts)


def problem(line: int, message: str) -> Problem:
    return Problem(message=message, line=line)


NESTED = f"arrays and inline tables nested more than {MAX_NESTING} deep"
KEY = f"a dotted key of more than {MAX_NESTING} parts"


def number(digits: int) -> str:
    return f"a number of {digits:,} digits (a machine file's numbers have at most 100)"


# -- the text: nesting, dotted keys, long numbers -------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (STOCK, None),
        (f"x = {nested(MAX_NESTING)}\n", None),
        (f"a = 1\nx = {nested(DEEP)}\n", problem(2, NESTED)),
        (f"x = {tables(MAX_NESTING)}\n", None),
        (f"x = [\n  1,\n  {tables(DEEP)},\n]\n", problem(3, NESTED)),
        (f"x = [{{a = {nested(MAX_NESTING - 2)}}}]\n", None),
        (f"x = [{{a = {nested(MAX_NESTING - 2)}}}, {{b = {{}}}}]\n", None),
        (f"x = [{{}}, {{a = {nested(MAX_NESTING - 1)}}}]\n", problem(1, NESTED)),
        (f"{dotted(MAX_NESTING)} = 1\n", None),
        (f"\n{dotted(DEEP)} = 1\n", problem(2, KEY)),
        (f"{dotted(20)} = 1\n{dotted(20)}.j = 2\n", None),
        (f"[{dotted(DEEP)}]\n", problem(1, KEY)),
        (f"[[{dotted(DEEP)}]]\n", problem(1, KEY)),
        (f"x = {{ {dotted(DEEP)} = 1 }}\n", problem(1, KEY)),
        (f"x = {{ a = 1, {dotted(DEEP)} = 1 }}\n", problem(1, KEY)),
        (f"x = 1.5\n{dotted(MAX_NESTING)} = 1.25\n", None),
        (f"x = {'1' * MAX_DIGITS}\n", None),
        (f"x = {'1' * (MAX_DIGITS + 1)}\n", problem(1, number(MAX_DIGITS + 1))),
        (f"x = [\n 1,\n {'9' * 5001}\n]\n", problem(3, number(5001))),
        (f"x = {'1_' * MAX_DIGITS}1\n", problem(1, number(MAX_DIGITS + 1))),
        (f"x = {{ a = {'1' * 5001} }}\n", problem(1, number(5001))),
        (f"{'1' * 5001} = 1\n", None),  # a bare key, not a number
        (f'x = "{nested(DEEP)} {"1" * 5001}"\n', None),
        (f"x = '{nested(DEEP)}'\n", None),
        (f'x = """\n{nested(DEEP)}\n"""\n', None),
        (f"x = '''\n{tables(DEEP)}'''\n", None),
        (f'"{dotted(DEEP)}" = 1\n', None),
        (f"# {nested(DEEP)}\nx = 1 # {dotted(DEEP)}\n", None),
        (f'x = "an \\" escape {nested(DEEP)}"\n', None),
        (f'x = "unterminated {nested(DEEP)}\n', None),
        (f"x = [}}{nested(MAX_NESTING - 1)}]\n", None),
    ],
    ids=[
        "the-stock-machine",
        "arrays-at-the-limit",
        "arrays-past-it",
        "inline-tables-at-the-limit",
        "inline-tables-past-it-in-a-multiline-array",
        "mixed-at-the-limit",
        "an-empty-inline-table-closes",
        "an-empty-inline-table-then-past-it",
        "a-dotted-key-at-the-limit",
        "a-dotted-key-past-it",
        "each-line-its-own-key",
        "a-table-header",
        "an-array-of-tables-header",
        "a-key-in-an-inline-table",
        "the-second-key-of-an-inline-table",
        "floats-are-no-keys",
        "a-number-at-the-limit",
        "a-number-past-it",
        "a-number-in-an-array",
        "underscores-are-no-digits",
        "a-number-in-an-inline-table",
        "digits-as-a-bare-key",
        "inside-a-basic-string",
        "inside-a-literal-string",
        "inside-a-multiline-string",
        "inside-a-multiline-literal-string",
        "inside-a-quoted-key",
        "inside-comments",
        "after-an-escaped-quote",
        "an-unterminated-string-is-tomllibs-to-report",
        "a-mismatched-bracket-is-tomllibs-to-report",
    ],
)
def test_the_text_is_scanned_for_depth_and_long_numbers(
    text: str, expected: Problem | None
) -> None:
    assert text_problem(text) == expected


@settings(max_examples=sized(200))
@given(data=st.data(), depth=st.integers(1, 2 * MAX_NESTING), inline=st.booleans())
def test_any_document_is_read_as_deep_as_it_is(
    data: st.DataObject, depth: int, inline: bool
) -> None:
    """No string, comment or key of a valid document fools the scan."""
    document = Emitter(data).document()
    assert text_problem(document) is None
    line = document.count("\n") + 2
    value = tables(depth) if inline else nested(depth)
    text = f"{document}\nz_deep = {value}\n"

    found = text_problem(text)

    assert found == (problem(line, NESTED) if depth > MAX_NESTING else None)
    if found is None:
        tomllib.loads(text)  # what the scan lets through, tomllib reads


@pytest.mark.parametrize(
    ("extra", "line", "message"),
    [
        (f"x = {nested(10_000)}", 271, NESTED),
        (f"x = {tables(10_000)}", 271, NESTED),
        (f"x = {'1' * 5001}", 271, number(5001)),
        (f"x{'.a' * 10_000} = 1", 271, KEY),
        (f"[x{'.a' * 10_000}]", 271, KEY),
    ],
    ids=["arrays", "inline-tables", "a-long-integer", "a-dotted-key", "a-header"],
)
def test_a_file_past_the_limits_is_one_problem_on_its_line(
    extra: str, line: int, message: str
) -> None:
    text = f"{STOCK}\n{extra}\n"
    assert text.count("\n") == line

    with pytest.raises(DefinitionError) as raised:
        MachineSpec.from_toml(text, source="m.toml")

    assert raised.value.problems == (problem(line, message),)
    assert str(raised.value) == f"m.toml:{line}: {message}"


# -- the parsed definition: a mapping with string keys, bounded ------------------

BASE: dict[str, Any] = tomllib.loads(STOCK)


def with_items(items: dict[Any, Any]) -> dict[Any, Any]:
    """The stock definition with `items` added (keys of any type)."""
    out: dict[Any, Any] = dict(BASE)
    out.update(items)
    return out


def self_holding() -> list[Any]:
    loop: list[Any] = []
    loop.append(loop)
    return loop


def deep_list(depth: int) -> list[Any]:
    out: list[Any] = [1]
    for _ in range(depth - 1):
        out = [out]
    return out


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ([], [("a machine definition is a table of keys and values, not a list", ())]),
        (None, [("a machine definition is a table of keys and values, not None", ())]),
        (with_items({5: 1}), [("the definition: key 5 is not a string", ())]),
        (
            {**BASE, "states": {**BASE["states"], 7: {"decision": "measure"}}},
            [("states: key 7 is not a string", ("states",))],
        ),
        (
            with_items({(1, 2): 1, None: 2, 1.5: 3}),
            [
                ("the definition: key of type tuple is not a string", ()),
                ("the definition: key None is not a string", ()),
                ("the definition: key 1.5 is not a string", ()),
            ],
        ),
        (
            with_items({10**5001: 1}),
            [("the definition: key of type int is not a string", ())],
        ),
        (
            {**BASE, "name": 10**5001},
            [
                (
                    "name: an integer of 16,613 bits is out of TOML's range (64 bits)",
                    ("name",),
                )
            ],
        ),
        (
            {**BASE, "terminal": ("done", 2**63)},
            [
                (
                    "terminal[1]: an integer of 64 bits is out of TOML's range"
                    " (64 bits)",
                    ("terminal", 1),
                )
            ],
        ),
        ({**BASE, "terminal": ["done", -(2**63), True]}, None),
        (
            {**BASE, "name": deep_list(MAX_NESTING + 5)},
            [
                (
                    "name"
                    + "[0]" * (MAX_NESTING - 1)
                    + f": nested more than {MAX_NESTING} deep",
                    ("name", *[0] * (MAX_NESTING - 1)),
                )
            ],
        ),
        ({**BASE, "name": self_holding()}, [("name[0]: holds itself", ("name", 0))]),
    ],
    ids=[
        "a-list",
        "none",
        "an-int-key",
        "an-int-state-name",
        "keys-of-other-types",
        "a-huge-int-key",
        "a-huge-int-value",
        "just-past-64-bits",
        "within-64-bits-is-the-loaders-to-judge",
        "too-deep",
        "holding-itself",
    ],
)
def test_a_definition_that_is_no_table_of_names_is_refused_first(
    data: Any, expected: list[tuple[str, tuple[Any, ...]]] | None
) -> None:
    found = [(message, at) for message, at, _ in shape_problems(data)]
    if expected is None:
        assert found == []
        with pytest.raises(DefinitionError) as raised:
            MachineSpec.from_dict(data)
        assert all("TOML's range" not in p.message for p in raised.value.problems)
        return
    assert found == expected

    with pytest.raises(DefinitionError) as raised:
        MachineSpec.from_dict(data, source="d")

    assert [p.message for p in raised.value.problems] == [m for m, _ in expected]
    assert all(p.line is None for p in raised.value.problems)


@given(name=st.text(max_size=8), nested=st.booleans())
def test_a_key_is_named_a_problem_only_for_a_control_or_invisible_character(
    name: str, nested: bool
) -> None:
    # The walk asks about a key only when it is not printable text: every
    # control and invisible (format) character is one that is not.
    data: dict[str, Any] = {"states": {name: 1}} if nested else {name: 1}
    # A control character is named first, then an invisible one.
    bad = [c for c in name if unicodedata.category(c) == "Cc"] + [
        c for c in name if unicodedata.category(c) == "Cf"
    ]

    found = shape_problems(data)

    assert len(found) == (1 if bad else 0)
    if bad:
        assert found[0][1] == ((("states",) if nested else ()) + (name,))
        assert repr(bad[0]) in found[0][0]


def test_a_deep_shape_in_a_file_names_the_line_of_its_entry() -> None:
    """Headers, dotted keys and values add up: each is in bounds, not the sum."""
    half = MAX_NESTING // 2
    text = f"{STOCK}\n[{dotted(half)}]\n{dotted(half)} = {nested(4)}\n"

    with pytest.raises(DefinitionError) as raised:
        MachineSpec.from_toml(text, source="m.toml")

    (only,) = raised.value.problems
    assert only.message.endswith(f": nested more than {MAX_NESTING} deep")
    assert only.line == text.count("\n")


# -- machines of thousands of phases ----------------------------------------------


def chain(
    phases: int, *, bounded: bool = True, calls_open: bool = False, last: str = ""
) -> str:
    """The stock machine with `phases` custom phases between the tools and the model.

    Each phase's effect feeds the signal ``stepped`` on to the next; the last
    goes back to ``start`` (a cycle through a model call: bounded) or, not
    `bounded`, to the first (a cycle of custom phases only). With
    `calls_open`, the phases stand between a reply's calls and ``run_tools``
    instead (a review pipeline: the calls are open in each), the last going
    into ``run_tools``. `last` names another phase for the last to go into.
    """
    source, dest = ("call_llm", "run_tools") if calls_open else ("run_tools", "start")
    text = STOCK.replace(
        'terminal = ["done", "failed"]\n',
        'terminal = ["done", "failed"]\nsignals = ["stepped"]\n',
    )
    states = "".join(f'p{i} = {{ effect = "step" }}\n' for i in range(phases))
    text = text.replace("done              = {", states + "done              = {")
    text = text.replace(
        f'source = "{source}"\ndest = "{dest}"', f'source = "{source}"\ndest = "p0"'
    )
    last = last or (dest if bounded else "p0")
    for i in range(phases):
        step_to = f"p{i + 1}" if i + 1 < phases else last
        text += (
            f'\n[[transitions]]\ntrigger = "stepped"\nsource = "p{i}"\n'
            f'dest = "{step_to}"\n'
        )
    return text


@pytest.mark.parametrize("phases", [1_000, 5_000])
def test_a_machine_of_thousands_of_phases_loads(phases: int) -> None:
    spec = MachineSpec.from_toml(chain(phases))

    assert len(spec.states) == phases + 7
    assert spec.state(f"p{phases - 1}").effect == "step"


@pytest.mark.parametrize("phases", [1_000, 5_000])
def test_an_unbounded_cycle_of_thousands_of_phases_is_named_briefly(
    phases: int,
) -> None:
    with pytest.raises(DefinitionError) as raised:
        MachineSpec.from_toml(chain(phases, bounded=False))

    steps = " ".join(f"p{i} -[stepped]->" for i in range(12))
    assert [p.message for p in raised.value.problems] == [
        f"cycle {steps} ... ({phases - 12} more steps) -> p0 is not bounded by a"
        " model call, a retry counter or the no-progress guard"
    ]


def test_thousands_of_misspelt_names_get_suggestions_until_the_budget_is_spent() -> (
    None
):
    phases = 2_000
    text = chain(phases)
    for i in range(phases - 1):
        text = text.replace(
            f'source = "p{i}"\ndest = "p{i + 1}"\n',
            f'source = "p{i}"\ndest = "p{i + 1}x"\n',
        )

    with pytest.raises(DefinitionError) as raised:
        MachineSpec.from_toml(text)

    typos = [p for p in raised.value.problems if "unknown dest phase" in p.message]
    assert len(typos) == phases - 1
    suggested = [p for p in typos if p.suggestion is not None]
    assert typos[0].suggestion == "p1"
    assert 0 < len(suggested) <= SUGGESTION_BUDGET // phases
    assert typos[: len(suggested)] == suggested  # the first ones, in file order


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda: MachineSpec.from_toml(None), "text"),  # type: ignore[arg-type]
        (lambda: MachineSpec.from_toml(STOCK.encode()), "text"),  # type: ignore[arg-type]
        (lambda: MachineSpec.from_toml(STOCK, source=None), "source"),  # type: ignore[arg-type]
        (lambda: MachineSpec.from_dict(BASE, source=5), "source"),  # type: ignore[arg-type]
    ],
    ids=["no-text", "bytes", "no-source", "a-number-as-source"],
)
def test_the_text_and_source_are_strings(call: Any, field: str) -> None:
    with pytest.raises(ConfigError) as raised:
        call()

    assert raised.value.field == field


@pytest.mark.parametrize("phases", [1_000, 5_000])
def test_thousands_of_phases_between_a_reply_and_its_tools_load(phases: int) -> None:
    # The check that a reply's calls reach a run_tools phase follows them
    # through every phase between (it was quadratic in their number).
    spec = MachineSpec.from_toml(chain(phases, calls_open=True))

    assert spec.state(f"p{phases - 1}").effect == "step"


def test_calls_that_skip_the_tools_after_thousands_of_phases_are_named_briefly() -> (
    None
):
    with pytest.raises(DefinitionError) as raised:
        MachineSpec.from_toml(chain(5_000, calls_open=True, last="start"))

    (message,) = [p.message for p in raised.value.problems if "unanswered" in p.message]
    way = " -> ".join(
        repr(phase) for phase in ["call_llm", *(f"p{i}" for i in range(11))]
    )
    assert f"({way} -> ... (4988 more) -> 'p4999')" in message
    assert len(message) < 1_000
