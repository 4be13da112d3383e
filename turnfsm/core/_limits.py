"""The sizes a machine definition must keep: how deep it nests, how long its numbers.

A machine file nests four deep (``transitions[2].conditions[0]``) and holds
no number at all, so these limits refuse only what no machine needs, and do
so before anything that would fail on it: `tomllib` recurses once per
nested array or inline table, is quadratic in the parts of a dotted key, and
raises a bare `ValueError` on an integer too long for `int`; printing a value
nested thousands deep, or an integer of thousands of digits, fails too.

`text_problem` scans the text once, without recursion, before `tomllib`
reads it; `shape_problems` walks what was read (or what `from_dict` was
given), without recursion, before the loader looks at it: string keys, the
nesting, and integers in TOML's 64-bit range.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator, Mapping
from typing import Any, Final, TypeGuard

from turnfsm.core._source_map import Path, field_name
from turnfsm.errors import Problem

__all__ = [
    "MAX_DIGITS",
    "MAX_NESTING",
    "name_problem",
    "shape_problems",
    "text_problem",
]

MAX_NESTING: Final = 32
"""The deepest a machine definition may nest tables and arrays.

In a file this also bounds the arrays and inline tables nested in one value,
and the parts of one dotted key (``a.b.c`` has three).
"""

MAX_DIGITS: Final = 100
"""The most digits one number of a machine file may have (machine files hold none)."""

_INT64: Final = range(-(2**63), 2**63)
"""The integers TOML can hold: 64-bit, signed."""

# One token of a TOML text: a whole string (of any of the four kinds), a
# quote that opens no string (unterminated: `tomllib` says where), a comment,
# a number's digits (with its `_` separators), or one character of structure.
_TOKEN: Final = re.compile(
    r'"""(?:[^\\"]|\\[\s\S]|"(?!""))*"{3,5}'
    r"|'''(?:[^']|'(?!''))*'{3,5}"
    r'|"(?:[^\\"\n]|\\.)*"'
    r"|'[^'\n]*'"
    r"|[\"']"
    r"|#[^\n]*"
    r"|\d[\d_]*"
    r"|[\[\]{}=,.\n]"
)
_CLOSES: Final = {"]": "[", "}": "{"}


def text_problem(text: str) -> Problem | None:
    """The first place `text` nests too deep or writes too long a number, if any.

    The scan tells keys from values as TOML does (a key until ``=``, a value
    until the line ends outside every array and inline table), skips strings
    and comments, and stops at anything `tomllib` will refuse anyway.
    """
    opened: list[str] = []  # the arrays and inline tables open here
    is_key, parts = True, 1
    for token, at in _tokens(text):
        if token[0] in "\"'#":
            if token in ('"', "'"):
                return None  # an unterminated string: tomllib says where
            continue
        if is_key:
            if token == ".":
                parts += 1
                if parts > MAX_NESTING:
                    return _problem(
                        text, at, f"a dotted key of more than {MAX_NESTING} parts"
                    )
            elif token == "=":
                is_key = False
            elif token == "}" and opened[-1:] == ["{"]:  # an empty inline table
                opened.pop()
                is_key = False
            elif token == "\n" and not opened:
                parts = 1
            continue
        if token[0].isdigit():
            if len(token) - token.count("_") > MAX_DIGITS:
                digits = len(token) - token.count("_")
                return _problem(
                    text,
                    at,
                    f"a number of {digits:,} digits (a machine file's numbers "
                    f"have at most {MAX_DIGITS})",
                )
        elif token in "[{":
            opened.append(token)
            if len(opened) > MAX_NESTING:
                return _problem(
                    text,
                    at,
                    f"arrays and inline tables nested more than {MAX_NESTING} deep",
                )
            is_key, parts = token == "{", 1
        elif token in _CLOSES:
            if opened[-1:] == [_CLOSES[token]]:
                opened.pop()
        elif (token == "," and opened[-1:] == ["{"]) or (token == "\n" and not opened):
            is_key, parts = True, 1  # a key of an inline table, or of a line
    return None


def _tokens(text: str) -> Iterator[tuple[str, int]]:
    for match in _TOKEN.finditer(text):
        yield match.group(), match.start()


def _problem(text: str, at: int, message: str) -> Problem:
    return Problem(message=message, line=text.count("\n", 0, at) + 1)


def shape_problems(data: object, *, names: bool = True) -> list[tuple[str, Path, Any]]:
    """What makes `data` no machine definition at all: (message, path, value).

    `data` must be a mapping; every key in it a string (with `names`, one
    without a control character, see `name_problem`); no table or array
    nested deeper than `MAX_NESTING`, or inside itself; every integer in
    TOML's 64-bit range. A text that passed `text_problem` can fail only the
    depth, where table headers, dotted keys and inline values add up.
    """
    if not isinstance(data, Mapping):
        kind = "None" if data is None else f"a {type(data).__name__}"
        message = f"a machine definition is a table of keys and values, not {kind}"
        return [(message, (), None)]
    out: list[tuple[str, Path, Any]] = []
    stack: list[tuple[Path, object, tuple[int, ...]]] = [((), data, ())]
    while stack:
        path, value, inside = stack.pop()
        if len(path) > MAX_NESTING:
            message = f"{field_name(path[:MAX_NESTING])}: nested more than "
            out.append((f"{message}{MAX_NESTING} deep", path[:MAX_NESTING], None))
        elif id(value) in inside:
            out.append((f"{_where(path)}: holds itself", path, None))
        elif isinstance(value, Mapping):
            for key in value:
                if type(key) is str and (not names or key.isprintable()):
                    continue  # the usual key: a name with nothing to say
                if not isinstance(key, str):
                    shown = (
                        repr(key) if _is_plain(key) else f"of type {type(key).__name__}"
                    )
                    message = f"{_where(path)}: key {shown} is not a string"
                    out.append((message, path, key if _is_plain(key) else None))
                elif names and (unprintable := name_problem(_where(path), key)):
                    out.append((unprintable, (*path, key), key))
            inner = (*inside, id(value))
            items = [
                ((*path, k), v, inner)
                for k, v in value.items()
                if isinstance(k, str) and type(v) not in _FINE
            ]
            stack += reversed(items)
        elif isinstance(value, list | tuple):
            inner = (*inside, id(value))
            stack += reversed(
                [
                    ((*path, i), v, inner)
                    for i, v in enumerate(value)
                    if type(v) not in _FINE
                ]
            )
        elif _is_int(value) and value not in _INT64:
            message = (
                f"{_where(path)}: an integer of {value.bit_length():,} bits is out of"
                " TOML's range (64 bits)"
            )
            out.append((message, path, None))
    return out


_FINE: Final = frozenset({str, float, bool, type(None)})
"""Values with nothing to check (an int is checked for its range)."""


def _where(path: Path) -> str:
    """`path` named in a problem (it is named only for one)."""
    return field_name(path) or "the definition"


def name_problem(where: str, name: str) -> str | None:
    """Why `name`, a name read at `where`, is none, or None if it is one.

    A name (a phase's, a signal's, an effect's, a key) is printed in
    problems, logs and diagrams: a control character (a line break, a tab,
    NUL) would break the line it is printed on, or Graphviz's input; an
    invisible one (a zero-width space, a direction mark) would make it look
    like another name, or turn the line around.
    """
    bad = next((c for c in name if unicodedata.category(c) == "Cc"), None)
    if bad is not None:
        return (
            f"{where}: the name {name!r} holds a control character ({bad!r}): a"
            " name is printable text (no line break, tab or NUL)"
        )
    # An invisible one makes two names look the same, and a direction mark
    # turns the rest of the line it is printed on around.
    hidden = next((c for c in name if unicodedata.category(c) == "Cf"), None)
    if hidden is None:
        return None
    return (
        f"{where}: the name {name!r} holds an invisible character ({hidden!r},"
        f" {unicodedata.name(hidden, 'a format character').lower()}): a name is"
        " text you can see (write it again without it)"
    )


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_plain(value: object) -> bool:
    """Whether `value` prints short: None, a bool, a float or a 64-bit int."""
    if value is None or isinstance(value, bool | float):
        return True
    # Only an int may ask the range: it would compare anything else one by one.
    return _is_int(value) and value in _INT64
