"""The TOML source map: the line of every key and array item of a document.

A hypothesis emitter writes random documents in every shape TOML allows
(dotted and quoted keys, tables, arrays of tables nested in one another,
inline tables, one-line and multi-line arrays, the four kinds of strings,
comments everywhere, no final newline) and records the line of each path as
it writes it; the map must say the same.
"""

from __future__ import annotations

import tomllib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers import REPO_ROOT
from tests.profiles import sized
from turnfsm.core._source_map import Path, line_of, source_map

SCALARS = [
    "1",
    "-2_000",
    "3.5e2",
    "0x1F",
    "true",
    "-inf",
    "1979-05-27T07:32:00Z",
    "1979-05-27 07:32:00",
    "07:32:00",
    '"a, # ] } = [ {"',
    "'a literal # ] }'",
    '"an \\" escaped \\\\ quote"',
    '"""two\nlines"""',
    '"""ends in quotes"" """',
    '""""quoted"""""',
    '"""\\\n   folded \\""" still"""',
    "'''raw\n'lines'\n'''",
    "'''a''''",
    '""',
    "''",
]
"""Raw values, each valid TOML; some span lines or hide delimiters."""


class Emitter:
    """Writes a random TOML document and the line of each path it writes."""

    def __init__(self, data: st.DataObject) -> None:
        self.draw = data.draw
        self.text = ""
        self.lines: dict[Path, int] = {}
        self.names = 0

    def at(self, path: Path) -> None:
        self.lines.setdefault(path, self.text.count("\n") + 1)

    def key(self) -> tuple[str, str]:
        """A fresh key: (as written, as read); fresh so no two ever clash."""
        self.names += 1
        n = self.names
        return self.draw(
            st.sampled_from(
                [
                    (f"k{n}", f"k{n}"),
                    (f"k-{n}_x", f"k-{n}_x"),
                    (f"{n}", f"{n}"),
                    (f'"k{n}"', f"k{n}"),
                    (f"'k {n}'", f"k {n}"),
                    (f'"k.{n}"', f"k.{n}"),
                    (f'"k\\"{n}"', f'k"{n}'),
                    (f"'k#{n}='", f"k#{n}="),
                ]
            )
        )

    def gap(self) -> None:
        """Nothing, a blank line, or a comment line, between entries."""
        self.text += self.draw(
            st.sampled_from(["", "\n", "# a comment [x] = 'y'\n", "  \t\n"])
        )

    def pair(self, prefix: Path, depth: int) -> None:
        keys = [self.key() for _ in range(self.draw(st.integers(1, 3)))]
        path = (*prefix, *(read for _, read in keys))
        for end in range(len(prefix) + 1, len(path) + 1):
            self.at(path[:end])
        dot = self.draw(st.sampled_from([".", " . "]))
        self.text += dot.join(raw for raw, _ in keys)
        self.text += self.draw(st.sampled_from([" = ", "=", "  =\t"]))
        self.value(path, depth)

    def value(self, path: Path, depth: int) -> None:
        kinds = ["scalar", "array", "table"] if depth < 3 else ["scalar"]
        kind = self.draw(st.sampled_from(kinds))
        if kind == "scalar":
            self.text += self.draw(st.sampled_from(SCALARS))
        elif kind == "array":
            self.array(path, depth)
        else:
            self.text += "{"
            for j in range(self.draw(st.integers(0, 3))):
                self.text += ", " if j else " "
                self.pair(path, depth + 1)
            self.text += " }"

    def array(self, path: Path, depth: int) -> None:
        is_multiline = self.draw(st.booleans())
        count = self.draw(st.integers(0, 3))
        self.text += "["
        for i in range(count):
            if is_multiline:
                self.text += self.draw(st.sampled_from(["\n  ", "\n  # note\n  "]))
            self.at((*path, i))
            self.value((*path, i), depth + 1)
            if i < count - 1 or (is_multiline and self.draw(st.booleans())):
                self.text += ","
                self.text += " # after a comma" if is_multiline else " "
        self.text += "\n]" if is_multiline else "]"

    def end_line(self) -> None:
        self.text += self.draw(st.sampled_from(["\n", "  # trailing\n", " \n"]))

    def pairs(self, prefix: Path) -> None:
        for _ in range(self.draw(st.integers(0, 3))):
            self.gap()
            self.pair(prefix, 0)
            self.end_line()

    def header(self, raw: str, path: Path, *, array: bool) -> None:
        for end in range(1, len(path) + 1):
            self.at(path[:end])
        spaced = self.draw(st.booleans())
        inner = f" {raw} " if spaced else raw
        self.text += f"[[{inner}]]" if array else f"[{inner}]"
        self.end_line()

    def document(self) -> str:
        self.pairs(())
        for _ in range(self.draw(st.integers(0, 3))):
            self.gap()
            raw, read = self.key()
            if self.draw(st.booleans()):  # a table, maybe with a sub-table
                self.header(raw, (read,), array=False)
                self.pairs((read,))
                if self.draw(st.booleans()):
                    sub_raw, sub = self.key()
                    self.header(f"{raw} . {sub_raw}", (read, sub), array=False)
                    self.pairs((read, sub))
                continue
            for i in range(self.draw(st.integers(1, 3))):  # an array of tables
                self.header(raw, (read, i), array=True)
                self.pairs((read, i))
                if self.draw(st.booleans()):  # nested in its latest element
                    sub_raw, sub = self.key()
                    for j in range(self.draw(st.integers(1, 2))):
                        self.header(f"{raw}.{sub_raw}", (read, i, sub, j), array=True)
                        self.pairs((read, i, sub, j))
        if self.draw(st.booleans()):  # no final newline
            self.text = self.text.rstrip("\n")
        return self.text


def paths_of(value: Any, prefix: Path = ()) -> set[Path]:
    """Every path of a parsed document."""
    items: list[tuple[str | int, Any]] = []
    if isinstance(value, dict):
        items = list(value.items())
    elif isinstance(value, list):
        items = list(enumerate(value))
    out: set[Path] = set()
    for step, inner in items:
        out |= {(*prefix, step), *paths_of(inner, (*prefix, step))}
    return out


@settings(max_examples=sized(200))
@given(st.data())
def test_every_path_is_found_on_the_line_it_was_written(data: st.DataObject) -> None:
    emitter = Emitter(data)
    text = emitter.document()
    parsed = tomllib.loads(text)

    lines = source_map(text)

    assert set(emitter.lines) == paths_of(parsed)  # the emitter wrote it all
    assert lines == emitter.lines


def test_the_stock_machine_maps_its_states_and_transitions() -> None:
    text = (REPO_ROOT / "machines" / "turn.toml").read_text()
    numbered = text.splitlines()

    lines = source_map(text)

    assert numbered[lines[("states", "compact_and_retry")] - 1].startswith(
        "compact_and_retry"
    )
    assert numbered[lines[("transitions", 3)] - 1] == "[[transitions]]"
    assert numbered[lines[("transitions", 3, "conditions", 0)] - 1] == (
        'conditions = ["is_over_emergency_line"]'
    )
    assert set(lines) == paths_of(tomllib.loads(text))


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        (("t", 0, "conditions", 1), 4),
        (("t", 0, "conditions", 5), 2),
        (("t", 0, "dest"), 1),
        (("t", 2), 1),
        (("x",), None),
        ((), None),
    ],
    ids=["exact", "past-the-items", "missing-key", "missing-table", "absent", "root"],
)
def test_line_of_falls_back_to_the_nearest_enclosing_entry(
    path: Path, expected: int | None
) -> None:
    text = '[[t]]\nconditions = [\n  "a",\n  "b",\n]\n'

    assert line_of(source_map(text), path) == expected


def test_a_table_under_an_array_of_tables_is_mapped_into_its_last_item() -> None:
    # `[a.b]` after two `[[a]]` items names a table in the second item: its
    # keys are the second item's, on the lines written under that header.
    text = "[[a]]\nx = 1\n[[a]]\nx = 2\n[a.b]\ny = 3\n[[a.c]]\nz = 4\n"

    lines = source_map(text)

    assert lines[("a", 1, "b")] == 5
    assert lines[("a", 1, "b", "y")] == 6
    assert lines[("a", 1, "c", 0, "z")] == 8
    assert set(lines) == paths_of(tomllib.loads(text))
