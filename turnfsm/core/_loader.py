"""Loading a machine definition: every check, every problem reported at once.

Loading checks everything and raises one `DefinitionError` listing every
problem, each with its line and, for a misspelt name, the closest known one.
First each entry on its own: unknown names and keys, wrong types, reducers
used on events they cannot read, exits from terminal phases. Then the checks
of the graph (`_graph.py`) on the entries that resolved: unreachable phases,
dead ends, (phase, trigger) groups that can fall through, model calls and
compaction passes that skip their limits, phases `run_cancelled` cannot stop,
and cycles that neither a model call, a retry counter nor the no-progress
guard bounds (so every machine that loads terminates).

A misspelt name is reported once, with the known name closest to it, and the
checks after its own read it as that name (see `_problems.py`). A trigger or
phase with no close match leaves its transition out of the graph checks; a
guard or reducer with none stays in, as written. So a graph problem may be
one that fixing a name also fixes.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, Final, TypeAlias

import attrs

from turnfsm._identity import IdentityMap
from turnfsm.core._conversation_checks import check_conversation
from turnfsm.core._graph import check_graph
from turnfsm.core._limits import name_problem, shape_problems
from turnfsm.core._reducers import ACCEPTS, REDUCERS
from turnfsm.core._source_map import Path, field_name
from turnfsm.core._spec import (
    BUILTIN_TRIGGERS,
    DECISION_KINDS,
    MachineSpec,
    Resolve,
    StateSpec,
)
from turnfsm.core._subagent_specs import (
    check_subagent_phases,
    load_children,
    read_subagents,
)
from turnfsm.core._transition_reader import WILDCARD, TransitionReader

__all__ = ["load_spec", "validated"]

_TOP_KEYS: Final = frozenset(
    {"name", "initial", "terminal", "signals", "states", "transitions", "subagents"}
)
_STATE_KEYS: Final = frozenset({"decision", "effect", "subagent", "on_enter"})
_BUILTIN_STEPS: Final = frozenset({"measure", "call_llm", "run_tools", "compact"})
"""The decisions whose steps are effects of these names (``effects=`` replaces them)."""


def load_spec(
    data: Mapping[str, Any],
    source: str,
    lines: Mapping[Path, int] | None = None,
    resolve: Resolve | None = None,
    *,
    recorded: bool = False,
) -> MachineSpec:
    """Validate a parsed machine definition and return its `MachineSpec`.

    Args:
        data: the parsed file.
        source: the file's name, for messages.
        lines: the line of each path of `data` (`source_map` of its text);
            without it, problems carry no line.
        resolve: loads the machine files its sub-agents name; None: they
            are not loaded.
        recorded: `data` is a machine a session's log recorded (see
            `MachineSpec.from_dict`): the rules on what its runs keep are
            not checked, and the spec is not one a `Driver` takes as checked.

    Raises:
        DefinitionError: listing every problem found; only those of its shape
            (`shape_problems`) when `data` is no machine definition at all.
    """
    spec = _Loader(data, source, lines or {}, resolve, recorded=recorded).load()
    if not recorded:
        _PASSED.put(spec, True)
    return spec


_PASSED: Final[IdentityMap[MachineSpec, bool]] = IdentityMap()
"""The live specs that passed the checks (the loader made them)."""


def validated(spec: MachineSpec) -> MachineSpec:
    """Return `spec` once it passed the checks (see `MachineSpec.validated`)."""
    if _PASSED.get(spec) is None:
        load_spec(spec.to_dict(), f"<MachineSpec {spec.name!r}>")
        _PASSED.put(spec, True)
    return spec


class _Loader(TransitionReader):
    """Checks one machine definition, collecting every problem."""

    def __init__(
        self,
        data: Mapping[str, Any],
        source: str,
        lines: Mapping[Path, int],
        resolve: Resolve | None,
        *,
        recorded: bool = False,
    ) -> None:
        super().__init__(source, lines)
        self.data = data
        self.resolve = resolve
        self.recorded = recorded
        self.untyped: set[str] = set()
        """States that are not tables: named, but of no kind."""
        self.kinds: dict[str, str | None] = {}
        """Each phase's decision, as read (see `resolved`)."""

    def load(self) -> MachineSpec:
        # What is no machine definition at all stops here: the checks below
        # read string keys, and print values, so they need a sane shape.
        for message, at, value in shape_problems(self.data, names=not self.recorded):
            self.problem(message, at, value)
        self.raise_any()
        for key in sorted(set(self.data) - _TOP_KEYS):
            self.problem(f"unknown key {key!r}", (key,), key, _TOP_KEYS)
        # A misspelt key (`signal = [...]`) is read as the one it is closest
        # to, as in a state or a transition: one typo is one problem.
        self.data = self.read_keys(self.data, _TOP_KEYS)
        name = self._str("name")
        self._printable(name, ("name",))
        initial = self._str("initial")
        terminal = self._str_list(
            self.data.get("terminal", []), "terminal", ("terminal",)
        )
        signals = self._str_list(self.data.get("signals", []), "signals", ("signals",))
        states = self._states()
        names = {s.name for s in states}
        initial, ends = self._initial_and_terminal(initial, terminal, names)
        for i, signal in enumerate(signals):
            self._printable(signal, ("signals", i))
            if not signal.strip():  # no `Signal` carries a blank name
                self.problem(
                    f"signal {signal!r}: a signal needs a non-empty name",
                    ("signals", i),
                    signal,
                )
            elif signal in BUILTIN_TRIGGERS:
                self.problem(
                    f"signal {signal!r} shadows the built-in trigger", ("signals", i)
                )
        states = self._check_state_kinds(states, set(ends))
        # A phase that ends the run but is left out of `terminal` is reported
        # once, above; the checks after read it as terminal, as it is meant.
        ends += tuple(
            s.name
            for s in states
            if s.decision in ("finish", "fail") and s.name not in ends
        )
        self.kinds = {s.name: s.decision for s in states}
        transitions = self._transitions(names, set(ends), set(signals))
        subagents = read_subagents(self.data, self.problem)
        table = self.data.get("subagents")
        check_subagent_phases(
            states,
            subagents,
            transitions,
            set(signals),
            self.problem,
            set(table) if isinstance(table, dict) else (),
        )
        children = (
            load_children(subagents, self.resolve, self.problem)
            if self.resolve is not None and not self.problems
            else {}
        )
        spec = MachineSpec(
            name=name,
            initial=initial,
            terminal=ends,
            states=tuple(states),
            transitions=tuple(transitions),
            signals=tuple(signals),
            source=self.source,
            subagents=tuple(subagents),
            children=children,
        )
        self.start_graph()
        check_graph(spec, self.report, recorded=self.recorded)
        if not self.recorded:
            check_conversation(spec, self.report, guessed=self.guessed)
        self.raise_any()
        return spec

    def _initial_and_terminal(
        self, initial: str, terminal: list[str], names: set[str]
    ) -> tuple[str, tuple[str, ...]]:
        """Check the phases `initial` and `terminal` name; return them as read."""
        named: list[tuple[Path, str]] = [(("initial",), initial)] if initial else []
        named += [(("terminal", i), phase) for i, phase in enumerate(terminal)]
        for at, phase in named:
            if phase not in names:
                self.problem(
                    f"unknown phase {phase!r} named by initial/terminal",
                    at,
                    phase,
                    names,
                )
        ends = dict.fromkeys(
            p for p in self.read_as(tuple(terminal), names) if p in names
        )
        return self.resolved(initial, names) or "", tuple(ends)

    def _printable(self, name: str, at: Path) -> None:
        """Report `name` (read at `at`) if it holds a control character."""
        message = name_problem(field_name(at), name)
        if message is not None and not self.recorded:  # a log's: read as it ran
            self.problem(message, at, name)

    def _str(self, key: str) -> str:
        value = self.data.get(key)
        if not isinstance(value, str) or not value:
            self.problem(
                f"{key!r} must be a non-empty string, got {value!r}", (key,), value
            )
            return ""
        return value

    def _states(self) -> list[StateSpec]:
        table = self.data.get("states")
        if not isinstance(table, dict) or not table:
            self.problem("'states' must be a non-empty table", ("states",), table)
            return []
        states = []
        for name, body in table.items():
            at = ("states", name)
            if not name.strip() or name == WILDCARD:
                # An empty name is no phase a run can be in; "*" is every phase.
                self.problem(
                    f"state {name!r}: a phase needs a name (not blank, not"
                    f" {WILDCARD!r}, which a source reads as every phase)",
                    at,
                    name,
                )
            if not isinstance(body, dict):
                self.problem(f"state {name!r} must be a table", at, body)
                self.untyped.add(name)
                states.append(StateSpec(name=name))
                continue
            for key in sorted(set(body) - _STATE_KEYS):
                self.problem(
                    f"state {name!r}: unknown key {key!r}", (*at, key), key, _STATE_KEYS
                )
            body = self.read_keys(body, _STATE_KEYS, at)
            on_enter = tuple(
                self._str_list(
                    body.get("on_enter", []), f"{name}.on_enter", (*at, "on_enter")
                )
            )
            for i, reducer in enumerate(on_enter):
                where = (*at, "on_enter", i)
                if reducer not in REDUCERS:
                    self.problem(
                        f"state {name!r}: unknown reducer {reducer!r}",
                        where,
                        reducer,
                        REDUCERS,
                    )
                elif ACCEPTS.get(reducer) is not None:
                    self.problem(
                        f"state {name!r}: {reducer!r} needs a specific event and "
                        "cannot run on entry",
                        where,
                        reducer,
                    )
            decision, effect = body.get("decision"), body.get("effect")
            subagent = body.get("subagent")
            for key, value in (
                ("decision", decision),
                ("effect", effect),
                ("subagent", subagent),
            ):
                if value is not None and not isinstance(value, str):
                    self.problem(_not_one_name(name, key, value), (*at, key), value)
                    self.untyped.add(name)  # its kind is not known: not checked
            if name in self.untyped:
                decision = decision if isinstance(decision, str) else None
                effect = effect if isinstance(effect, str) else None
                subagent = subagent if isinstance(subagent, str) else None
            if isinstance(effect, str):
                self._printable(effect, (*at, "effect"))
            if isinstance(effect, str) and not effect.strip():  # no effect's name
                self.problem(
                    f"state {name!r}: effect must be a non-empty name, got {effect!r}",
                    (*at, "effect"),
                    effect,
                )
            elif effect in _BUILTIN_STEPS and not self.recorded:
                # The driver keys effects by name: the phase would run the
                # built-in step's effect (or your replacement of it) on a
                # decision that is not that step's.
                self.problem(
                    f"state {name!r}: effect {effect!r} is a built-in step's "
                    f"name: give your effect another name, or write decision = "
                    f"{effect!r} for the built-in step",
                    (*at, "effect"),
                    effect,
                )
            if isinstance(subagent, str) and effect is None:
                effect = subagent  # the phase's effect runs the sub-agent
            elif subagent is not None:
                self.problem(
                    f"state {name!r}: give exactly one of decision / effect / subagent",
                    at,
                )
                subagent = None
            states.append(
                StateSpec(
                    name=name,
                    decision=decision,
                    effect=effect,
                    on_enter=self.read_as(on_enter, REDUCERS),
                    subagent=subagent,
                )
            )
        return states

    def _decision(self, decision: str | None) -> str | None:
        """`decision` as read: a misspelt one as the known one closest to it."""
        if decision is not None and decision not in DECISION_KINDS:
            return self.resolved(decision, DECISION_KINDS) or decision
        return decision

    def _check_state_kinds(
        self, states: list[StateSpec], terminal: set[str]
    ) -> list[StateSpec]:
        """Check each phase's kind; return the phases with decisions as read."""
        out = []
        for s in states:
            at = ("states", s.name)
            decision = self._decision(s.decision)
            out.append(attrs.evolve(s, decision=decision))
            if s.name in self.untyped:
                continue
            if (s.decision is None) == (s.effect is None):
                self.problem(
                    f"state {s.name!r}: give exactly one of decision / effect"
                    " / subagent",
                    at,
                )
            elif s.decision is not None and s.decision not in DECISION_KINDS:
                known = ", ".join(sorted(DECISION_KINDS))
                self.problem(
                    f"state {s.name!r}: unknown decision {s.decision!r}"
                    f" (known: {known};"
                    " use effect = NAME for a custom one)",
                    (*at, "decision"),
                    s.decision,
                    DECISION_KINDS,
                )
            is_end = decision in ("finish", "fail")
            if s.name in terminal and not is_end:
                self.problem(
                    f"terminal phase {s.name!r} must emit finish or fail: give it"
                    ' decision = "finish" or "fail", or take it out of terminal',
                    at,
                    s.name,
                )
            if s.name not in terminal and is_end:
                self.problem(
                    f"phase {s.name!r} emits {decision} but is not terminal:"
                    f" add it to terminal ({_terminal_list(states, self._decision)})",
                    at,
                    s.name,
                )
        return out


def _terminal_list(states: list[StateSpec], resolved: Resolved) -> str:
    """The `terminal` line that names every phase ending the run, to suggest."""
    ends = [s.name for s in states if resolved(s.decision) in ("finish", "fail")]
    return "terminal = [" + ", ".join(_toml_string(e) for e in ends) + "]"


def _toml_string(text: str) -> str:
    """`text` as a TOML basic string (a JSON string is one)."""
    return json.dumps(text, ensure_ascii=False)


Resolved: TypeAlias = Callable[[str | None], str | None]
"""A phase's decision as the checks read it (a misspelt one as the closest)."""


def _not_one_name(state: str, key: str, value: object) -> str:
    """The problem of a phase's `key` given `value`, which is not one name."""
    kind = (
        "a list"
        if isinstance(value, list)
        else "a table"
        if isinstance(value, dict)
        else "a boolean"
        if isinstance(value, bool)
        else "a number"
        if isinstance(value, int | float)
        else f"a value of type {type(value).__name__}"
    )
    example = "NAME"
    if isinstance(value, list) and value and isinstance(value[0], str):
        example = value[0]  # the name meant, most likely
    return (
        f"state {state!r}: {key} must be one name, a string "
        f'({key} = "{example}"), not {kind}: got {value!r}'
    )
