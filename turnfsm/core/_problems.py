"""Collecting the problems of one machine file: line, field, value, suggestion.

The loader reports each problem with the path of the value at fault; the log
turns the path into the line it is written on (`_source_map.py`) and a field
name, suggests the known name closest to a misspelt one, and raises them all
at once, each pass's problems in the order of the file.

A misspelt name is *read* as its suggestion by every check after its own
(`resolved`), so that one typo is one problem, not one more for each check
the typo would break. A name with no close match is read as written, or, for
a trigger or a phase, leaves its transition out of the graph checks.
"""

from __future__ import annotations

import difflib
from collections.abc import Collection, Mapping
from typing import Any

from turnfsm.core._source_map import Path, line_of
from turnfsm.core._spec import TransitionSpec
from turnfsm.errors import DefinitionError, Problem

__all__ = ["ProblemLog", "closest", "read_as", "resolved"]


def closest(value: object, known: Collection[str]) -> str | None:
    """The known name closest to `value`, if `value` is a string and one is close."""
    if not isinstance(value, str):
        return None
    close = difflib.get_close_matches(value, sorted(known), n=1)
    return close[0] if close else None


def resolved(name: object, known: Collection[str]) -> str | None:
    """`name` if it is known, else the known name closest to it, if any."""
    if isinstance(name, str) and name in known:
        return name
    return closest(name, known)


def read_as(names: tuple[str, ...], known: Collection[str]) -> tuple[str, ...]:
    """Each of `names` as the later checks read it (unknown ones as written)."""
    return tuple(resolved(n, known) or n for n in names)


def _field(path: Path) -> str:
    out = ""
    for step in path:
        out += f"[{step}]" if isinstance(step, int) else f".{step}" if out else step
    return out


def _by_line(problem: Problem) -> int:
    return problem.line or 0


class ProblemLog:
    """The problems of one machine file, as they are found."""

    def __init__(self, source: str, lines: Mapping[Path, int]) -> None:
        self.source = source
        self.lines = lines
        self.problems: list[Problem] = []
        self.index_of: dict[int, int] = {}
        """Each `TransitionSpec` built (by `id`): its index in the file."""
        self.graph_starts = 0
        """How many problems the entries had when the graph checks began."""

    def problem(
        self,
        message: str,
        at: Path = (),
        value: Any = None,
        known: Collection[str] = (),
    ) -> None:
        """Report `message` about the value at path `at`; suggest from `known`."""
        if any(p.message == message for p in self.problems):
            return  # two transitions of one group, one fix
        self.problems.append(
            Problem(
                message=message,
                line=line_of(self.lines, at),
                field=_field(at),
                value=value,
                suggestion=closest(value, known),
            )
        )

    def report(self, message: str, subject: str | TransitionSpec) -> None:
        """Report a graph problem about a phase or a transition."""
        if isinstance(subject, str):
            self.problem(message, ("states", subject), subject)
        else:
            index = self.index_of[id(subject)]
            self.problem(message, ("transitions", index), subject.trigger)

    def start_graph(self) -> None:
        """Mark the end of the entries' problems: the graph checks begin."""
        self.graph_starts = len(self.problems)

    def raise_any(self) -> None:
        """Raise every problem found, if any, in one `DefinitionError`.

        The entries' problems come first and the graph's after them, each in
        the order of the file (those of the file as a whole first).
        """
        if self.problems:
            entries = self.problems[: self.graph_starts]
            graph = self.problems[self.graph_starts :]
            ordered = [*sorted(entries, key=_by_line), *sorted(graph, key=_by_line)]
            raise DefinitionError(self.source, ordered)
