"""A machine file's sub-agents: ``[subagents.NAME]`` and the phases running them.

A declaration names the child's machine file, the signal its phase ends with
(and, optionally, the one it ends with when the child does not answer), the
task, and the limits. The checks, all at load:

- each entry's keys, types and ranges, its signals declared in ``signals``,
  its task naming only ``{request}`` and ``{reply}``;
- each ``subagent = NAME`` phase names a declared sub-agent, and leaves on
  its signals (a transition from the phase on each); each declared one is
  run by some phase;
- with a `Resolve` (`load_machine` gives one), each child's machine file is
  loaded and checked as a machine of its own (so it terminates), a file that
  runs its own caller is refused (no recursion without a bound), and every
  sub-agent below is within its `max_depth` counted from this file.

The loader's termination proof then covers the phase like any other: a
cycle through it must pass a model call, a retry counter or the no-progress
guard, and `max_children` bounds how often one run runs the child.
"""

from __future__ import annotations

import string
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, Final, TypeAlias

from turnfsm import _checks
from turnfsm.core._problems import _closest
from turnfsm.core._source_map import Path
from turnfsm.core._spec import (
    DECISION_KINDS,
    TASK_FIELDS,
    MachineSpec,
    Resolve,
    StateSpec,
    SubagentSpec,
    TransitionSpec,
)
from turnfsm.errors import DefinitionError

__all__ = ["check_subagent_phases", "load_children", "read_subagents"]

Report: TypeAlias = Callable[[str, Path, Any, Collection[str]], None]
"""The loader's `problem`: a message, where, the value, the names it may mean."""

_KEYS: Final = frozenset(
    {
        "machine",
        "signal",
        "on_failure",
        "key",
        "task",
        "max_depth",
        "max_children",
        "routes",
    }
)
_TEXTS: Final = ("machine", "signal", "on_failure", "key", "task")
_COUNTS: Final = ("max_depth", "max_children")


def read_subagents(data: Mapping[str, Any], problem: Report) -> list[SubagentSpec]:
    """The ``subagents`` table's declarations, each checked on its own."""
    table = data.get("subagents", {})
    if not isinstance(table, dict):
        problem("'subagents' must be a table", ("subagents",), table, ())
        return []
    out = []
    for name, body in table.items():
        at: Path = ("subagents", name)
        if not name.strip() or name in DECISION_KINDS:
            problem(
                f"sub-agent {name!r}: a sub-agent needs a name of its own (not"
                " empty, not a decision's: its effect would replace the"
                " built-in one)",
                at,
                name,
                (),
            )
            continue
        if not isinstance(body, dict):
            problem(f"sub-agent {name!r} must be a table", at, body, ())
            continue
        for key in sorted(set(body) - _KEYS):
            problem(f"sub-agent {name!r}: unknown key {key!r}", (*at, key), key, _KEYS)
        fields: dict[str, Any] = {}
        for key in _TEXTS:
            value = body.get(key)
            if value is None:
                if key in ("machine", "signal"):
                    problem(f"sub-agent {name!r}: {key} is missing", at, None, ())
                continue
            if not isinstance(value, str) or not value.strip():
                problem(
                    f"sub-agent {name!r}: {key} must be a non-empty string,"
                    f" got {value!r}",
                    (*at, key),
                    value,
                    (),
                )
                continue
            fields[key] = value
        for key in _COUNTS:
            value = body.get(key)
            if value is None:
                continue
            if (
                not isinstance(value, int)
                or isinstance(value, bool)
                or not 1 <= value <= _checks.MAX_COUNT
            ):
                problem(
                    f"sub-agent {name!r}: {key} must be an integer from 1 to"
                    f" {_checks.MAX_COUNT:,}, got {value!r}",
                    (*at, key),
                    value,
                    (),
                )
                continue
            fields[key] = value
        routes = body.get("routes")
        if routes is not None:
            fields["routes"] = _routes(routes, name, (*at, "routes"), problem)
        task = fields.get("task")
        if task is not None and not _task_ok(task, name, (*at, "task"), problem):
            del fields["task"]
        if "machine" in fields and "signal" in fields:
            out.append(SubagentSpec(name=name, **fields))
    return out


def _routes(
    routes: object, name: str, at: Path, problem: Report
) -> tuple[tuple[str, str], ...]:
    """The ``routes`` table's (signal, prefix) pairs, each a non-empty text."""
    if not isinstance(routes, dict):
        problem(
            f"sub-agent {name!r}: routes must be a table of signal = prefix,"
            f" got {routes!r}",
            at,
            routes,
            (),
        )
        return ()
    out = []
    for signal, prefix in routes.items():
        if not isinstance(prefix, str) or not prefix.strip():
            problem(
                f"sub-agent {name!r}: route {signal!r} must be a non-empty text"
                f" (how the answer begins), got {prefix!r}",
                (*at, signal),
                prefix,
                (),
            )
            continue
        out.append((signal, prefix))
    return tuple(out)


def _task_ok(task: str, name: str, at: Path, problem: Report) -> bool:
    """Whether `task` names only the fields a task may name."""
    try:
        named = [f for _, f, _, _ in string.Formatter().parse(task) if f is not None]
    except ValueError as exc:
        problem(
            f"sub-agent {name!r}: task is no template ({exc}; write {{{{ and }}}}"
            " for a brace)",
            at,
            task,
            (),
        )
        return False
    try:
        shaped = [
            f"{{{f}{'!' + c if c else ''}{':' + spec if spec else ''}}}"
            for _, f, spec, c in string.Formatter().parse(task)
            if f is not None and (spec or c)
        ]
    except ValueError:  # pragma: no cover - parsed above
        shaped = []
    for field in shaped:
        problem(
            f"sub-agent {name!r}: task writes {field}: a field is only"
            " {request} or {reply}, with no conversion or format",
            at,
            field,
            (),
        )
    if shaped:
        return False
    unknown = [f for f in named if f not in TASK_FIELDS]
    for field in unknown:
        known = ", ".join(f"{{{k}}}" for k in sorted(TASK_FIELDS))
        problem(
            f"sub-agent {name!r}: task names {{{field}}}, which is none of {known}",
            at,
            field,
            TASK_FIELDS,
        )
    return not unknown


def check_subagent_phases(
    states: Sequence[StateSpec],
    subagents: Sequence[SubagentSpec],
    transitions: Sequence[TransitionSpec],
    signals: Collection[str],
    problem: Report,
    named: Collection[str] = (),
) -> None:
    """Each sub-agent phase names a declared one and leaves on its signals.

    `named`: every name the ``subagents`` table holds, its entries with
    problems of their own too (a phase naming one of those is not reported
    again).
    """
    declared = {s.name: s for s in subagents}
    run: set[str] = set(named) - set(declared)
    for state in states:
        if state.subagent is None:
            if state.effect in declared:
                problem(
                    f"state {state.name!r}: effect {state.effect!r} is the name of"
                    f" a sub-agent: write subagent = {state.effect!r} to run it",
                    ("states", state.name, "effect"),
                    state.effect,
                    (),
                )
            continue
        if state.subagent in run and state.subagent not in declared:
            continue  # its entry's own problems are reported
        at: Path = ("states", state.name, "subagent")
        spec = declared.get(state.subagent)
        if spec is None:
            problem(
                f"state {state.name!r}: unknown sub-agent {state.subagent!r}"
                " (declare it under [subagents])",
                at,
                state.subagent,
                declared,
            )
            # Read as the name it is closest to: reported once, not twice.
            run.add(_closest(state.subagent, declared) or "")
            continue
        run.add(spec.name)
        leaves = {
            t.trigger for t in transitions if t.is_wildcard or state.name in t.sources
        }
        ends: list[tuple[Path, str | None]] = [
            (("subagents", spec.name, "signal"), spec.signal),
            (("subagents", spec.name, "on_failure"), spec.on_failure),
        ]
        ends += [(("subagents", spec.name, "routes", s), s) for s, _ in spec.routes]
        for where, signal in ends:
            if signal is None:
                continue
            key = str(where[2])
            if signal not in signals:
                problem(
                    f"sub-agent {spec.name!r}: {key} {signal!r} is not one of the"
                    " machine's signals",
                    where,
                    signal,
                    signals,
                )
            elif signal not in leaves:
                problem(
                    f"state {state.name!r} runs sub-agent {spec.name!r}, which ends"
                    f" with {signal!r}, but no transition from {state.name!r}"
                    f" takes {signal!r}",
                    at,
                    signal,
                    (),
                )
        _check_keys(state.name, spec, transitions, problem)
    for spec in subagents:
        if spec.name not in run:
            problem(
                f"sub-agent {spec.name!r} is declared but no phase runs it"
                f" (subagent = {spec.name!r})",
                ("subagents", spec.name),
                spec.name,
                (),
            )


def _check_keys(
    phase: str,
    spec: SubagentSpec,
    transitions: Sequence[TransitionSpec],
    problem: Report,
) -> None:
    """A transition out of the phase that adds a message reads the answer's key."""
    for t in transitions:
        leaves = t.is_wildcard or phase in t.sources
        if leaves and t.message is not None and t.message != spec.key:
            problem(
                f"sub-agent {spec.name!r}: its answer is the signal's data"
                f"[{spec.key!r}], but the {t.trigger!r} transition from {phase!r}"
                f" adds data[{t.message!r}]: write key = {t.message!r}",
                ("subagents", spec.name),
                spec.key,
                (),
            )


def load_children(
    subagents: Sequence[SubagentSpec], resolve: Resolve, problem: Report
) -> dict[str, MachineSpec]:
    """Each sub-agent's machine, loaded by `resolve`; the nesting checked."""
    children: dict[str, MachineSpec] = {}
    for spec in subagents:
        at: Path = ("subagents", spec.name, "machine")
        try:
            child = resolve(spec.machine)
        except DefinitionError as exc:
            first = exc.problems[0] if exc.problems else None
            more = len(exc.problems) - 1
            detail = (
                f"{first.message}" + (f" (line {first.line})" if first.line else "")
                if first is not None
                else "invalid"
            )
            if more > 0:
                detail += f", and {more} more problem{'s' if more > 1 else ''}"
            problem(
                f"sub-agent {spec.name!r}: machine {spec.machine!r} ({exc.source}):"
                f" {detail}",
                at,
                spec.machine,
                (),
            )
            continue
        except OSError as exc:
            problem(
                f"sub-agent {spec.name!r}: machine {spec.machine!r} cannot be read:"
                f" {exc.strerror or exc}",
                at,
                spec.machine,
                (),
            )
            continue
        children[spec.name] = child
        # Its children run at depth 2 when this file's runs are top-level.
        deepest = _too_deep(child, 2, (spec.name,), {})
        if deepest is not None:
            chain, depth, limit = deepest
            problem(
                f"sub-agent {spec.name!r}: sub-agent {' > '.join(chain)} runs"
                f" {depth} deep, past its max_depth = {limit}",
                at,
                spec.machine,
                (),
            )
    return children


def _too_deep(
    spec: MachineSpec,
    depth: int,
    chain: tuple[str, ...],
    fine: dict[tuple[int, int], bool],
) -> tuple[tuple[str, ...], int, int] | None:
    """The first sub-agent below `spec` (at `depth`) past its own max_depth.

    `fine` remembers the (spec, depth) found within every limit: a file many
    others name is walked once per depth, not once per path to it.
    """
    if fine.get((id(spec), depth)):
        return None
    for sub in spec.subagents:
        child = spec.children.get(sub.name)
        here = (*chain, sub.name)
        if depth > sub.max_depth:
            return here, depth, sub.max_depth
        if child is not None:
            found = _too_deep(child, depth + 1, here, fine)
            if found is not None:
                return found
    fine[id(spec), depth] = True
    return None
