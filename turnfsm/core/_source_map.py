"""Where each key and array item of a TOML document is written: its line.

`tomllib` gives values, not positions, so the loader scans the text once more
to say on which line a problem is. The scan reads only what TOML's structure
needs (keys, table headers, strings, arrays, inline tables) and skips every
other value, so it is short; it expects text `tomllib` has already parsed.

A path is the way into the parsed document, as the loader walks it: keys and
0-based array indexes, such as ``("transitions", 2, "conditions", 0)``. Its
line is where its key is written, where its array item starts, or for an
element of an array of tables where its ``[[...]]`` header is. A table only
ever implied (``[states.start]`` implies ``states``) takes the line that
first implied it.
"""

from __future__ import annotations

import bisect
import tomllib
from collections.abc import Mapping
from typing import Final, TypeAlias

__all__ = ["Path", "field_name", "line_of", "source_map"]

Path: TypeAlias = tuple[str | int, ...]
"""A way into a parsed document: keys and 0-based array indexes."""

_BARE: Final = frozenset(
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-"
)
_SCALAR_END: Final = frozenset(",]}#\r\n")


def source_map(text: str) -> dict[Path, int]:
    """Return the 1-based line of every key and array item of a TOML text.

    `text` must be valid TOML (parse it with `tomllib` first).
    """
    scanner = _Scanner(text)
    scanner.document()
    return scanner.lines


def field_name(path: Path) -> str:
    """`path` as a field's name: ``transitions[2].conditions[0]`` (``""`` for none)."""
    out = ""
    for step in path:
        out += f"[{step}]" if isinstance(step, int) else f".{step}" if out else step
    return out


def line_of(lines: Mapping[Path, int], path: Path) -> int | None:
    """Return the line of `path`, else of its nearest enclosing entry with one."""
    for end in range(len(path), 0, -1):
        line = lines.get(path[:end])
        if line is not None:
            return line
    return None


class _Scanner:
    """One pass over a valid TOML text, recording where each path starts."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.breaks = [i for i, c in enumerate(text) if c == "\n"]
        self.lines: dict[Path, int] = {}
        self.tables: dict[Path, int] = {}
        """Each array of tables (a ``[[...]]`` path): the index of its last one."""

    def record(self, path: Path, pos: int) -> None:
        self.lines.setdefault(path, bisect.bisect_left(self.breaks, pos) + 1)

    def peek(self, token: str) -> bool:
        return self.text.startswith(token, self.pos)

    def skip(self, *, newlines: bool) -> None:
        """Skip spaces and comments, and line breaks too with `newlines`."""
        text = self.text
        while self.pos < len(text):
            c = text[self.pos]
            if c in " \t" or (newlines and c in "\r\n"):
                self.pos += 1
            elif c == "#":
                end = text.find("\n", self.pos)
                self.pos = len(text) if end < 0 else end
            else:
                return

    def document(self) -> None:
        prefix: Path = ()
        while True:
            self.skip(newlines=True)
            if self.pos >= len(self.text):
                return
            start = self.pos
            if self.peek("[["):
                self.pos += 2
                keys = self.key()
                self.pos += 2  # "]]"
                array = (*self.resolve(keys[:-1]), keys[-1])
                index = self.tables.get(array, -1) + 1
                self.tables[array] = index
                prefix = (*array, index)
            elif self.peek("["):
                self.pos += 1
                prefix = self.resolve(self.key())
                self.pos += 1  # "]"
            else:
                self.pair(prefix)
                continue
            for end in range(1, len(prefix) + 1):
                self.record(prefix[:end], start)

    def resolve(self, keys: Path) -> Path:
        """The path of a header's keys: through the last table of each array."""
        path: Path = ()
        for key in keys:
            path = (*path, key)
            if path in self.tables:
                path = (*path, self.tables[path])
        return path

    def key(self) -> Path:
        """Read a (dotted) key, and the spaces around it."""
        keys: list[str | int] = []
        while True:
            self.skip(newlines=False)
            start = self.pos
            if self.peek('"') or self.peek("'"):
                self.string()
                raw = self.text[start : self.pos]
                keys.append(tomllib.loads(f"k = {raw}")["k"])
            else:
                while self.text[self.pos] in _BARE:
                    self.pos += 1
                keys.append(self.text[start : self.pos])
            self.skip(newlines=False)
            if not self.peek("."):
                return tuple(keys)
            self.pos += 1

    def pair(self, prefix: Path) -> None:
        """Read ``key = value`` under `prefix`."""
        start = self.pos
        path = (*prefix, *self.key())
        for end in range(len(prefix) + 1, len(path) + 1):
            self.record(path[:end], start)
        self.pos += 1  # "="
        self.skip(newlines=False)
        self.value(path)

    def value(self, path: Path) -> None:
        text = self.text
        if self.peek("["):
            self.pos += 1
            index = 0
            while True:
                self.skip(newlines=True)
                if self.peek("]"):
                    self.pos += 1
                    return
                self.record((*path, index), self.pos)
                self.value((*path, index))
                index += 1
                self.skip(newlines=True)
                if self.peek(","):
                    self.pos += 1
        elif self.peek("{"):
            self.pos += 1
            while True:
                self.skip(newlines=True)
                if self.peek("}"):
                    self.pos += 1
                    return
                self.pair(path)
                self.skip(newlines=True)
                if self.peek(","):
                    self.pos += 1
        elif self.peek('"') or self.peek("'"):
            self.string()
        else:  # a number, a boolean or a date: up to what follows any value
            while self.pos < len(text) and text[self.pos] not in _SCALAR_END:
                self.pos += 1

    def string(self) -> None:
        """Skip one string of any of TOML's four kinds."""
        text = self.text
        quote = text[self.pos]
        is_multiline = self.peek(quote * 3)
        self.pos += 3 if is_multiline else 1
        while True:
            c = text[self.pos]
            if c == "\\" and quote == '"':
                self.pos += 2
            elif c != quote:
                self.pos += 1
            elif not is_multiline:
                self.pos += 1
                return
            elif self.peek(quote * 3):
                # A multi-line string may end in one or two of its own quotes,
                # before its closing three: the run's last three close it.
                run = 3
                while run < 5 and self.peek(quote * (run + 1)):
                    run += 1
                self.pos += run
                return
            else:
                self.pos += 1
