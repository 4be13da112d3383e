"""User-facing text speaks the user's words: no internal documents.

What a user reads (the package's code, docstrings, messages and trace
attributes; the machine files; the docs, README.md and CHANGELOG.md) must
not refer to the project's internal documents: the design and style notes,
the seed specifications ("seed 000", "the seed's name", "the original
specification"), their section numbers, or issue numbers. Where a behaviour
comes from a known system, the text names the system or describes the
behaviour.

A random seed (a sampler's ``seed``, hypothesis' seed) is a different word
and is allowed.

Run it from the repository root (``scripts/check`` does)::

    python -m tests.user_words          # the repository
    python -m tests.user_words PATH...  # files or directories

It prints one line per finding, ``path:line: 'words' ...``, and exits 1 when
there is any.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

REPO_ROOT = Path(__file__).resolve().parent.parent

SCANNED = ("turnfsm", "machines", "docs", "diagrams", "README.md", "CHANGELOG.md")
"""What a user reads, relative to the repository root."""

SUFFIXES = frozenset({".py", ".toml", ".md", ".mmd", ".svg", ".txt", ".json"})
"""The text files scanned inside a directory."""

_SEED = r"seeds?"
RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    (
        "names an internal design or style document",
        re.compile(r"\b(?:DESIGN|STYLE|RECIPES)(?:\.md)?\b"),
    ),
    ("cites a section of an internal document", re.compile(r"§")),
    (
        "cites a section of an internal document",
        re.compile(r"\b(?:section\s+\d+(?:\.\d+)*|appendix\s+[A-Z]\b)", re.IGNORECASE),
    ),
    (
        "names a seed specification",
        re.compile(rf"\b{_SEED}\s+\d+(?:\s*(?:and|/|,)\s*\d+)*", re.IGNORECASE),
    ),
    (
        "names a seed specification",
        re.compile(r"\bseed(?:'s|s')", re.IGNORECASE),
    ),
    (
        "names a seed specification",
        re.compile(
            rf"\b(?:from|than|like|unlike|as in|in) the {_SEED}\b(?!\s*[=(])",
            re.IGNORECASE,
        ),
    ),
    (
        "names an internal specification",
        re.compile(r"\b(?:the|original)\s+specifications?\b", re.IGNORECASE),
    ),
    (
        "cites an issue number",
        re.compile(r"\b(?:issues?|PR|pull request)\s*#?\d+|\(#\d+\)", re.IGNORECASE),
    ),
)
"""(what is wrong, pattern): each pattern is a way of citing internal papers."""


class Finding(NamedTuple):
    """One reference to an internal document, on its line."""

    path: Path
    line: int
    words: str
    why: str

    def __str__(self) -> str:
        return (
            f"{self.path}:{self.line}: {self.words!r} {self.why}; say what it "
            "does in the user's words (or name the known system it comes from)"
        )


def findings_in_text(text: str, path: Path) -> Iterator[Finding]:
    """Yield every reference to an internal document in `text`."""
    for number, line in enumerate(text.splitlines(), start=1):
        for why, pattern in RULES:
            for match in pattern.finditer(line):
                yield Finding(path, number, match.group(0), why)


def files(paths: Iterable[Path]) -> Iterator[Path]:
    """Yield the text files named by `paths`, directories walked in order."""
    for path in paths:
        if path.is_dir():
            yield from sorted(
                p for p in path.rglob("*") if p.is_file() and p.suffix in SUFFIXES
            )
        elif path.is_file():
            yield path


def findings(paths: Iterable[Path]) -> list[Finding]:
    """Every reference to an internal document in the files under `paths`."""
    found: list[Finding] = []
    for path in files(paths):
        found.extend(findings_in_text(path.read_text(encoding="utf-8"), path))
    return found


def main(argv: Sequence[str] | None = None) -> int:
    """Print the findings under the paths given (default: the repository)."""
    args = sys.argv[1:] if argv is None else list(argv)
    paths = [Path(a) for a in args] or [REPO_ROOT / name for name in SCANNED]
    found = findings(paths)
    for finding in found:
        print(finding)
    if found:
        print(f"{len(found)} reference(s) to internal documents", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
