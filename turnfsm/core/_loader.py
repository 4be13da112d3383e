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

from collections.abc import Collection, Mapping
from typing import Any, Final

import attrs

from turnfsm.core._graph import check_graph
from turnfsm.core._guards import GUARDS
from turnfsm.core._lines import CompactReason
from turnfsm.core._problems import ProblemLog, read_as, resolved
from turnfsm.core._reducers import ACCEPTS, FAILURES, REDUCERS
from turnfsm.core._source_map import Path
from turnfsm.core._spec import (
    BUILTIN_TRIGGERS,
    DECISION_KINDS,
    MachineSpec,
    StateSpec,
    TransitionSpec,
)

__all__ = ["load_spec"]

_TOP_KEYS: Final = frozenset(
    {"name", "initial", "terminal", "signals", "states", "transitions"}
)
_STATE_KEYS: Final = frozenset({"decision", "effect", "on_enter"})
_TRANSITION_KEYS: Final = frozenset(
    {"trigger", "source", "dest", "conditions", "unless", "actions", "reason", "error"}
)
_REASONS: Final = frozenset(r.value for r in CompactReason)
WILDCARD: Final = "*"


def load_spec(
    data: Mapping[str, Any], source: str, lines: Mapping[Path, int] | None = None
) -> MachineSpec:
    """Validate a parsed machine definition and return its `MachineSpec`.

    Args:
        data: the parsed file.
        source: the file's name, for messages.
        lines: the line of each path of `data` (`source_map` of its text);
            without it, problems carry no line.

    Raises:
        DefinitionError: listing every problem found.
    """
    return _Loader(data, source, lines or {}).load()


class _Loader(ProblemLog):
    """Checks one machine definition, collecting every problem."""

    def __init__(
        self, data: Mapping[str, Any], source: str, lines: Mapping[Path, int]
    ) -> None:
        super().__init__(source, lines)
        self.data = data
        self.untyped: set[str] = set()
        """States that are not tables: named, but of no kind."""
        self.kinds: dict[str, str | None] = {}
        """Each phase's decision, as read (see `resolved`)."""

    def load(self) -> MachineSpec:
        for key in sorted(set(self.data) - _TOP_KEYS):
            self.problem(f"unknown key {key!r}", (key,), key, _TOP_KEYS)
        name = self._str("name")
        initial = self._str("initial")
        terminal = self._str_list(
            self.data.get("terminal", []), "terminal", ("terminal",)
        )
        signals = self._str_list(self.data.get("signals", []), "signals", ("signals",))
        states = self._states()
        names = {s.name for s in states}
        initial, ends = self._initial_and_terminal(initial, terminal, names)
        for i, signal in enumerate(signals):
            if signal in BUILTIN_TRIGGERS:
                self.problem(
                    f"signal {signal!r} shadows the built-in trigger", ("signals", i)
                )
        states = self._check_state_kinds(states, set(ends))
        self.kinds = {s.name: s.decision for s in states}
        transitions = self._transitions(names, set(ends), set(signals))
        spec = MachineSpec(
            name=name,
            initial=initial,
            terminal=ends,
            states=tuple(states),
            transitions=tuple(transitions),
            signals=tuple(signals),
            source=self.source,
        )
        self.start_graph()
        check_graph(spec, self.report)
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
        ends = dict.fromkeys(p for p in read_as(tuple(terminal), names) if p in names)
        return resolved(initial, names) or "", tuple(ends)

    def _str(self, key: str) -> str:
        value = self.data.get(key)
        if not isinstance(value, str) or not value:
            self.problem(
                f"{key!r} must be a non-empty string, got {value!r}", (key,), value
            )
            return ""
        return value

    def _str_list(self, value: Any, where: str, at: Path) -> list[str]:
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            self.problem(
                f"{where} must be a string or a list of strings, got {value!r}",
                at,
                value,
            )
            return []
        return list(value)

    def _states(self) -> list[StateSpec]:
        table = self.data.get("states")
        if not isinstance(table, dict) or not table:
            self.problem("'states' must be a non-empty table", ("states",), table)
            return []
        states = []
        for name, body in table.items():
            at = ("states", name)
            if not isinstance(body, dict):
                self.problem(f"state {name!r} must be a table", at, body)
                self.untyped.add(name)
                states.append(StateSpec(name=name))
                continue
            for key in sorted(set(body) - _STATE_KEYS):
                self.problem(
                    f"state {name!r}: unknown key {key!r}", (*at, key), key, _STATE_KEYS
                )
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
            if decision is not None and not isinstance(decision, str):
                decision = repr(decision)  # reported as an unknown decision
            if effect is not None and not isinstance(effect, str):
                self.problem(
                    f"state {name!r}: effect must be a string, got {effect!r}",
                    (*at, "effect"),
                    effect,
                )
            states.append(
                StateSpec(
                    name=name, decision=decision, effect=effect, on_enter=on_enter
                )
            )
        return states

    def _check_state_kinds(
        self, states: list[StateSpec], terminal: set[str]
    ) -> list[StateSpec]:
        """Check each phase's kind; return the phases with decisions as read."""
        out = []
        for s in states:
            at = ("states", s.name)
            decision = s.decision
            if decision is not None and decision not in DECISION_KINDS:
                decision = resolved(decision, DECISION_KINDS) or decision
            out.append(attrs.evolve(s, decision=decision))
            if s.name in self.untyped:
                continue
            if (s.decision is None) == (s.effect is None):
                self.problem(
                    f"state {s.name!r}: give exactly one of decision / effect", at
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
                    f"terminal phase {s.name!r} must emit finish or fail", at, s.name
                )
            if s.name not in terminal and is_end:
                self.problem(
                    f"phase {s.name!r} emits {decision} but is not terminal",
                    at,
                    s.name,
                )
        return out

    def _transitions(
        self, names: set[str], terminal: set[str], signals: set[str]
    ) -> list[TransitionSpec]:
        """Check every transition; return those the graph checks can read."""
        items = self.data.get("transitions", [])
        if not isinstance(items, list) or not items:
            self.problem(
                "'transitions' must be a non-empty array of tables",
                ("transitions",),
                items,
            )
            return []
        out = []
        for i, body in enumerate(items):
            if not isinstance(body, dict):
                self.problem(f"transition #{i + 1} must be a table", ("transitions", i))
                continue
            t, is_resolved = self._transition(i, body, names, terminal, signals)
            self.index_of[id(t)] = i
            if is_resolved:
                out.append(t)
        return out

    def _transition(
        self,
        i: int,
        body: dict[str, Any],
        names: set[str],
        terminal: set[str],
        signals: set[str],
    ) -> tuple[TransitionSpec, bool]:
        """Check one transition; return it, and whether the graph checks can read it.

        The transition returned holds each name as the later checks read it
        (a misspelt one as its suggestion) and only its live sources; the
        graph checks can read it if it has one, and a known trigger and dest.
        """
        at: Path = ("transitions", i)
        where = f"transition #{i + 1}"
        for key in sorted(set(body) - _TRANSITION_KEYS):
            self.problem(
                f"{where}: unknown key {key!r}", (*at, key), key, _TRANSITION_KEYS
            )
        written = body.get("trigger")
        trigger = self._trigger(written, where, at, signals)
        where = f"{where} ({written})"
        sources, is_wildcard = self._sources(body, where, at, names, terminal)
        dest, has_dest = self._dest(body, where, at, names)
        conditions, unless, actions = (
            self._names(body, key, where, at, table)
            for key, table in (
                ("conditions", GUARDS),
                ("unless", GUARDS),
                ("actions", REDUCERS),
            )
        )
        # What hangs on another name is judged once that name is right: a
        # reason or an error on the kind of the dest, and a reducer or an
        # error that reads one event on the trigger.
        written_dest = body.get("dest")
        if written_dest is None or written_dest == dest:
            reason, error = self._reason_and_error(at, where, body, dest)
        else:
            reason, error = None, None
        if trigger is not None and written == trigger:
            self._check_events(at, where, trigger, actions, error)
        t = TransitionSpec(
            trigger=trigger or str(written),
            sources=sources,
            dest=dest,
            conditions=read_as(conditions, GUARDS),
            unless=read_as(unless, GUARDS),
            actions=read_as(actions, REDUCERS),
            reason=reason,
            error=error,
            is_wildcard=is_wildcard,
        )
        return t, trigger is not None and has_dest and bool(sources)

    def _trigger(
        self, written: Any, where: str, at: Path, signals: set[str]
    ) -> str | None:
        """Check a transition's trigger; return it as read."""
        triggers = BUILTIN_TRIGGERS | signals
        if not isinstance(written, str) or written not in triggers:
            self.problem(
                f"{where}: unknown trigger {written!r} (declare it in signals)",
                (*at, "trigger"),
                written,
                triggers,
            )
        return resolved(written, triggers)

    def _check_events(
        self,
        at: Path,
        where: str,
        trigger: str,
        actions: tuple[str, ...],
        error: str | None,
    ) -> None:
        """Check that the reducers and the error that read one event get it."""
        applied = [((*at, "actions", j), r) for j, r in enumerate(actions)]
        applied += [((*at, "error"), error)] if error else []
        for place, name in applied:
            accepted = ACCEPTS.get(name)
            if accepted is not None and trigger not in accepted:
                self.problem(
                    f"{where}: {name!r} only applies to {', '.join(sorted(accepted))}",
                    place,
                    name,
                )

    def _sources(
        self,
        body: dict[str, Any],
        where: str,
        at: Path,
        names: set[str],
        terminal: set[str],
    ) -> tuple[tuple[str, ...], bool]:
        """Check a transition's sources; return the live ones, and if it is `*`."""
        written = self._str_list(
            body.get("source", []), f"{where} source", (*at, "source")
        )
        is_wildcard = written == [WILDCARD]
        if is_wildcard:
            written = sorted(names - terminal)
        if not written:
            self.problem(f"{where}: no source phase", (*at, "source"))
        live: list[str] = []
        for j, src in enumerate(written):
            if src not in names:
                self.problem(
                    f"{where}: unknown source phase {src!r}",
                    (*at, "source", j),
                    src,
                    names,
                )
            elif src in terminal:
                self.problem(
                    f"{where}: terminal phase {src!r} cannot have exits",
                    (*at, "source", j),
                    src,
                )
            phase = resolved(src, names)
            if phase is not None and phase not in terminal and phase not in live:
                live.append(phase)
        return tuple(live), is_wildcard

    def _dest(
        self, body: dict[str, Any], where: str, at: Path, names: set[str]
    ) -> tuple[str | None, bool]:
        """Check a transition's dest; return it as read, and whether it resolved."""
        written = body.get("dest")
        if written is None:
            return None, True  # an internal transition: it stays in its phase
        if not isinstance(written, str) or written not in names:
            self.problem(
                f"{where}: unknown dest phase {written!r}",
                (*at, "dest"),
                written,
                names,
            )
        dest = resolved(written, names)
        return dest, dest is not None

    def _names(
        self,
        body: dict[str, Any],
        key: str,
        where: str,
        at: Path,
        table: Collection[str],
    ) -> tuple[str, ...]:
        """Check a list of guard or reducer names; return them as written."""
        what = "reducer" if key == "actions" else "guard"
        written = tuple(self._str_list(body.get(key, []), f"{where} {key}", (*at, key)))
        for j, name in enumerate(written):
            if name not in table:
                self.problem(
                    f"{where}: unknown {what} {name!r}", (*at, key, j), name, table
                )
        return written

    def _reason_and_error(
        self, at: Path, where: str, body: dict[str, Any], dest: str | None
    ) -> tuple[CompactReason | None, str | None]:
        kind = self.kinds.get(dest) if dest is not None else None
        raw_reason, error = body.get("reason"), body.get("error")
        reason = None
        if kind == "compact":
            try:
                reason = CompactReason(str(raw_reason))
            except ValueError:
                known = ", ".join(r.value for r in CompactReason)
                self.problem(
                    f"{where}: into {dest!r} needs a reason ({known}), "
                    f"got {raw_reason!r}",
                    (*at, "reason"),
                    raw_reason,
                    _REASONS,
                )
        elif raw_reason is not None:
            self.problem(
                f"{where}: reason is only for transitions into a compact phase",
                (*at, "reason"),
                raw_reason,
            )
        if kind == "fail":
            if not isinstance(error, str) or error not in FAILURES:
                known = ", ".join(sorted(FAILURES))
                self.problem(
                    f"{where}: into {dest!r} needs an error ({known}), got {error!r}",
                    (*at, "error"),
                    error,
                    FAILURES,
                )
        elif error is not None:
            self.problem(
                f"{where}: error is only for transitions into a fail phase",
                (*at, "error"),
                error,
            )
        is_error = kind == "fail" and isinstance(error, str) and error in FAILURES
        return reason, (error if is_error else None)
