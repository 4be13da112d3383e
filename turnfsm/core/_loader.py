"""Loading a machine definition: every check, every problem reported at once.

Loading checks everything and raises one `DefinitionError` listing every
problem: unknown names and keys, reducers used on events they cannot read,
exits from terminal phases, and then the checks of the graph (`_graph.py`):
unreachable phases, dead ends, (phase, trigger) groups that can fall through,
model calls and compaction passes that skip their limits, phases
`run_cancelled` cannot stop, and cycles that neither a model call, a retry
counter nor the no-progress guard bounds (so every machine that loads
terminates).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from turnfsm.core._graph import check_graph
from turnfsm.core._guards import GUARDS
from turnfsm.core._lines import CompactReason
from turnfsm.core._reducers import ACCEPTS, FAILURES, REDUCERS
from turnfsm.core._spec import (
    BUILTIN_TRIGGERS,
    DECISION_KINDS,
    MachineSpec,
    StateSpec,
    TransitionSpec,
)
from turnfsm.errors import DefinitionError

__all__ = ["load_spec"]

_TOP_KEYS: Final = frozenset(
    {"name", "initial", "terminal", "signals", "states", "transitions"}
)
_STATE_KEYS: Final = frozenset({"decision", "effect", "on_enter"})
_TRANSITION_KEYS: Final = frozenset(
    {"trigger", "source", "dest", "conditions", "unless", "actions", "reason", "error"}
)
WILDCARD: Final = "*"


def load_spec(data: Mapping[str, Any], source: str) -> MachineSpec:
    """Validate a parsed machine definition and return its `MachineSpec`.

    Raises:
        DefinitionError: listing every problem found.
    """
    return _Loader(data, source).load()


class _Loader:
    """Collects every problem of one machine definition."""

    def __init__(self, data: Mapping[str, Any], source: str) -> None:
        self.data = data
        self.source = source
        self.problems: list[str] = []

    def problem(self, text: str) -> None:
        if text not in self.problems:  # two transitions of one group, one fix
            self.problems.append(text)

    def load(self) -> MachineSpec:
        for key in sorted(set(self.data) - _TOP_KEYS):
            self.problem(f"unknown key {key!r}")
        name = self._str("name")
        initial = self._str("initial")
        terminal = tuple(self._str_list(self.data.get("terminal", []), "terminal"))
        signals = tuple(self._str_list(self.data.get("signals", []), "signals"))
        states = self._states()
        names = {s.name for s in states}
        for phase in (initial, *terminal):
            if phase and phase not in names:
                self.problem(f"unknown phase {phase!r} named by initial/terminal")
        for signal in signals:
            if signal in BUILTIN_TRIGGERS:
                self.problem(f"signal {signal!r} shadows the built-in trigger")
        self._check_state_kinds(states, set(terminal))
        transitions = self._transitions(names, set(terminal), set(signals))
        if self.problems:
            raise DefinitionError(self.source, self.problems)
        spec = MachineSpec(
            name=name,
            initial=initial,
            terminal=terminal,
            states=tuple(states),
            transitions=tuple(transitions),
            signals=signals,
            source=self.source,
        )
        check_graph(spec, self.problem)
        if self.problems:
            raise DefinitionError(self.source, self.problems)
        return spec

    def _str(self, key: str) -> str:
        value = self.data.get(key)
        if not isinstance(value, str) or not value:
            self.problem(f"{key!r} must be a non-empty string, got {value!r}")
            return ""
        return value

    def _str_list(self, value: Any, where: str) -> list[str]:
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            self.problem(
                f"{where} must be a string or a list of strings, got {value!r}"
            )
            return []
        return list(value)

    def _states(self) -> list[StateSpec]:
        table = self.data.get("states")
        if not isinstance(table, dict) or not table:
            self.problem("'states' must be a non-empty table")
            return []
        states = []
        for name, body in table.items():
            if not isinstance(body, dict):
                self.problem(f"state {name!r} must be a table")
                continue
            for key in sorted(set(body) - _STATE_KEYS):
                self.problem(f"state {name!r}: unknown key {key!r}")
            on_enter = tuple(
                self._str_list(body.get("on_enter", []), f"{name}.on_enter")
            )
            for reducer in on_enter:
                if reducer not in REDUCERS:
                    self.problem(f"state {name!r}: unknown reducer {reducer!r}")
                elif ACCEPTS.get(reducer) is not None:
                    self.problem(
                        f"state {name!r}: {reducer!r} needs a specific event and "
                        "cannot run on entry"
                    )
            decision, effect = body.get("decision"), body.get("effect")
            if decision is not None and not isinstance(decision, str):
                decision = repr(decision)  # reported as an unknown decision
            if effect is not None and not isinstance(effect, str):
                self.problem(f"state {name!r}: effect must be a string, got {effect!r}")
            states.append(
                StateSpec(
                    name=name, decision=decision, effect=effect, on_enter=on_enter
                )
            )
        return states

    def _check_state_kinds(self, states: list[StateSpec], terminal: set[str]) -> None:
        for s in states:
            if (s.decision is None) == (s.effect is None):
                self.problem(f"state {s.name!r}: give exactly one of decision / effect")
            elif s.decision is not None and s.decision not in DECISION_KINDS:
                known = ", ".join(sorted(DECISION_KINDS))
                self.problem(
                    f"state {s.name!r}: unknown decision {s.decision!r}"
                    f" (known: {known};"
                    " use effect = NAME for a custom one)"
                )
            is_end = s.decision in ("finish", "fail")
            if s.name in terminal and not is_end:
                self.problem(f"terminal phase {s.name!r} must emit finish or fail")
            if s.name not in terminal and is_end:
                self.problem(f"phase {s.name!r} emits {s.decision} but is not terminal")

    def _transitions(
        self, names: set[str], terminal: set[str], signals: set[str]
    ) -> list[TransitionSpec]:
        items = self.data.get("transitions", [])
        if not isinstance(items, list) or not items:
            self.problem("'transitions' must be a non-empty array of tables")
            return []
        out = []
        for i, body in enumerate(items):
            where = f"transition #{i + 1}"
            if not isinstance(body, dict):
                self.problem(f"{where} must be a table")
                continue
            out.append(self._transition(where, body, names, terminal, signals))
        return out

    def _transition(
        self,
        where: str,
        body: dict[str, Any],
        names: set[str],
        terminal: set[str],
        signals: set[str],
    ) -> TransitionSpec:
        for key in sorted(set(body) - _TRANSITION_KEYS):
            self.problem(f"{where}: unknown key {key!r}")
        trigger = body.get("trigger")
        if not isinstance(trigger, str) or (
            trigger not in BUILTIN_TRIGGERS and trigger not in signals
        ):
            self.problem(
                f"{where}: unknown trigger {trigger!r} (declare it in signals)"
            )
        where = f"{where} ({trigger})"
        sources = self._str_list(body.get("source", []), f"{where} source")
        is_wildcard = sources == [WILDCARD]
        if is_wildcard:
            sources = sorted(names - terminal)
        if not sources:
            self.problem(f"{where}: no source phase")
        for src in sources:
            if src not in names:
                self.problem(f"{where}: unknown source phase {src!r}")
            elif src in terminal:
                self.problem(f"{where}: terminal phase {src!r} cannot have exits")
        dest = body.get("dest")
        if dest is not None and (not isinstance(dest, str) or dest not in names):
            self.problem(f"{where}: unknown dest phase {dest!r}")
        guards = {
            k: tuple(self._str_list(body.get(k, []), f"{where} {k}"))
            for k in ("conditions", "unless")
        }
        for guard in (*guards["conditions"], *guards["unless"]):
            if guard not in GUARDS:
                self.problem(f"{where}: unknown guard {guard!r}")
        actions = tuple(self._str_list(body.get("actions", []), f"{where} actions"))
        for reducer in actions:
            if reducer not in REDUCERS:
                self.problem(f"{where}: unknown reducer {reducer!r}")
        reason, error = self._reason_and_error(where, body, dest)
        for name in (*actions, *([error] if error else [])):
            accepted = ACCEPTS.get(name)
            if accepted is not None and trigger not in accepted:
                self.problem(
                    f"{where}: {name!r} only applies to {', '.join(sorted(accepted))}"
                )
        return TransitionSpec(
            trigger=str(trigger),
            sources=tuple(sources),
            dest=dest,
            conditions=guards["conditions"],
            unless=guards["unless"],
            actions=actions,
            reason=reason,
            error=error,
            is_wildcard=is_wildcard,
        )

    def _reason_and_error(
        self, where: str, body: dict[str, Any], dest: str | None
    ) -> tuple[CompactReason | None, str | None]:
        decisions = {}
        table = self.data.get("states")
        if isinstance(table, dict):
            decisions = {
                k: v.get("decision") for k, v in table.items() if isinstance(v, dict)
            }
        kind = decisions.get(dest) if isinstance(dest, str) else None
        raw_reason, error = body.get("reason"), body.get("error")
        reason = None
        if kind == "compact":
            try:
                reason = CompactReason(str(raw_reason))
            except ValueError:
                known = ", ".join(r.value for r in CompactReason)
                self.problem(
                    f"{where}: into {dest!r} needs a reason ({known}), "
                    f"got {raw_reason!r}"
                )
        elif raw_reason is not None:
            self.problem(
                f"{where}: reason is only for transitions into a compact phase"
            )
        if kind == "fail":
            if not isinstance(error, str) or error not in FAILURES:
                known = ", ".join(sorted(FAILURES))
                self.problem(
                    f"{where}: into {dest!r} needs an error ({known}), got {error!r}"
                )
        elif error is not None:
            self.problem(f"{where}: error is only for transitions into a fail phase")
        return reason, (error if kind == "fail" else None)
