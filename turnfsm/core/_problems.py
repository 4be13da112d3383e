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
from typing import Any, Final

from turnfsm.core._source_map import Path, field_name, line_of
from turnfsm.core._spec import TransitionSpec
from turnfsm.errors import DefinitionError, Problem

__all__ = ["SUGGESTION_BUDGET", "ProblemLog"]


def _closest(value: str, known: Collection[str]) -> str | None:
    close = difflib.get_close_matches(value, sorted(known), n=1)
    return close[0] if close else None


SUGGESTION_BUDGET: Final = 100_000
"""How many known names the suggestions of one file may compare a name with.

A suggestion compares a misspelt name with every known one; past this
budget a misspelt name gets none (and is read as written), so a generated
file of thousands of misspelt names over thousands of phases is still
refused in seconds. A hand-written file never comes near it.
"""


def _by_line(problem: Problem) -> int:
    return problem.line or 0


class ProblemLog:
    """The problems of one machine file, as they are found."""

    def __init__(self, source: str, lines: Mapping[Path, int]) -> None:
        self.source = source
        self.lines = lines
        self.problems: list[Problem] = []
        self.messages: set[str] = set()
        """The messages of `problems`, to report each once."""
        self.index_of: dict[int, int] = {}
        """Each `TransitionSpec` built (by `id`): its index in the file."""
        self.graph_starts = 0
        """How many problems the entries had when the graph checks began."""
        self.guesses: set[Path] = set()
        """The paths of the keys read under a guess at a misspelt one (`read_keys`)."""
        self.guessed: set[int] = set()
        """The transitions (by `id`) whose misspelt dest was read as a guess."""
        self.suggested: dict[tuple[str, int], tuple[str | None, Collection[str]]] = {}
        """Each suggestion made, by misspelt name and the (id of the) known names."""
        self.budget = SUGGESTION_BUDGET
        """How many more known names the suggestions may compare with."""

    def closest(self, value: object, known: Collection[str]) -> str | None:
        """The known name closest to `value`, if `value` is a string and one is close.

        Each is looked up once; none past the `SUGGESTION_BUDGET`.
        """
        if not isinstance(value, str) or not known:
            return None
        key = (value, id(known))
        if key not in self.suggested:
            self.budget -= len(known)
            found = _closest(value, known) if self.budget >= 0 else None
            # Holding `known` keeps its id from naming another collection.
            self.suggested[key] = (found, known)
        return self.suggested[key][0]

    def resolved(self, name: object, known: Collection[str]) -> str | None:
        """`name` if it is known, else the known name closest to it, if any."""
        if isinstance(name, str) and name in known:
            return name
        return self.closest(name, known)

    def read_keys(
        self, body: Mapping[str, Any], known: Collection[str], at: Path = ()
    ) -> dict[str, Any]:
        """`body` (at `at`), each unknown key also read as the known one closest.

        Only when that key is not given too: ``on_entre = [...]`` is read as
        ``on_enter``, so the later checks see what it holds. What is wrong
        with it there is not reported: the file never wrote that key (one
        typo, one problem: the unknown key, with its suggestion).
        """
        read = dict(body)
        for key in body:
            if key not in known:
                close = self.closest(key, known)
                if close is not None and close not in body:
                    read[close] = body[key]
                    self.guesses.add((*at, close))
        return read

    def read_as(
        self, names: tuple[str, ...], known: Collection[str]
    ) -> tuple[str, ...]:
        """Each of `names` as the later checks read it (unknown ones as written)."""
        return tuple(self.resolved(n, known) or n for n in names)

    def problem(
        self,
        message: str,
        at: Path = (),
        value: Any = None,
        known: Collection[str] = (),
    ) -> None:
        """Report `message` about the value at path `at`; suggest from `known`."""
        if message in self.messages:
            return  # two transitions of one group, one fix
        if any(at[: len(g)] == g for g in self.guesses):
            return  # a key the file misspelt: its unknown key is the problem
        self.messages.add(message)
        self.problems.append(
            Problem(
                message=message,
                line=line_of(self.lines, at),
                field=field_name(at),
                value=value,
                suggestion=self.closest(value, known),
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
