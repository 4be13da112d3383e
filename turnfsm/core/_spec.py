"""MachineSpec: a machine file, parsed and validated.

A machine file (TOML) lists phases, the decision each emits, and the
transitions between them: trigger, source(s), destination, named guards
(`conditions` / `unless`), named reducers (`actions`), and for transitions into
a compact phase the `reason`, into a fail phase the `error`; a transition on
a signal may name the key of the signal's data that joins the conversation
(`message`). The checks live in `_loader.py`.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Callable, Mapping
from typing import Any, Final, TypeAlias, final

import attrs

from turnfsm import _checks
from turnfsm.core._events import EVENT_TYPES, Signal, trigger_name
from turnfsm.core._limits import text_problem
from turnfsm.core._lines import CompactReason
from turnfsm.core._source_map import source_map
from turnfsm.errors import DefinitionError, Problem

__all__ = [
    "BUILTIN_TRIGGERS",
    "DECISION_KINDS",
    "SUBAGENT_MAX_CHILDREN",
    "SUBAGENT_MAX_DEPTH",
    "TASK_FIELDS",
    "MachineSpec",
    "Resolve",
    "StateSpec",
    "SubagentSpec",
    "TransitionSpec",
]

SUBAGENT_MAX_DEPTH: Final = 3
"""How deep sub-agents nest by default (1: a child of a top-level run)."""

SUBAGENT_MAX_CHILDREN: Final = 16
"""How many sub-agents one run may start with one tool or phase, by default."""

TASK_FIELDS: Final = frozenset({"request", "reply"})
"""What a sub-agent phase's ``task`` may name: ``{request}``, the latest user
message; ``{reply}``, the model's latest answer."""

DECISION_KINDS: Final = frozenset(
    {"measure", "call_llm", "run_tools", "compact", "pause", "finish", "fail"}
)
"""The decisions a phase may emit (a custom phase names an `effect` instead).

A ``pause`` phase ends the run ``paused`` until one of its triggers is fed.
"""

BUILTIN_TRIGGERS: Final = frozenset(
    trigger_name(t) for t in EVENT_TYPES if t is not Signal
)
"""The triggers of the built-in events."""

_TEXT: Final = _checks.string(expected="the text of a machine file (a str)")
_AT_LINE: Final = re.compile(r"\(at line (\d+), column \d+\)$")


def _error_line(exc: tomllib.TOMLDecodeError, text: str) -> int:
    """The line `tomllib` names in its message; else it said "at end of document"."""
    found = _AT_LINE.search(str(exc))
    return int(found.group(1)) if found else max(1, len(text.splitlines()))


_BARE_KEY: Final = re.compile(r"[A-Za-z0-9_-]+")
"""What a TOML key may be written as without quotes."""


def _line_of(text: str, line: int) -> str:
    """The text of `line` (1-based); empty for one that is not the text's.

    TOML's own line count and Python's can differ (form feeds, line
    separators): a line past the text's is none of its lines.
    """
    lines = text.splitlines()
    return lines[line - 1] if 0 < line <= len(lines) else ""


def _bare_key_hint(written: str) -> str:
    """How to write the key of the line `written`, when it needs quotes and has none.

    A phase named ``revue_人間`` or ``hu man`` is a key TOML reads only
    quoted; its own message ("Expected '=' after a key") does not say so.
    """
    key, equals, _ = written.partition("=")
    key = key.strip()
    if not equals or not key or key[0] in "[#" or any(q in key for q in "\"'"):
        return ""
    if all(_BARE_KEY.fullmatch(part.strip()) for part in key.split(".")):
        return ""  # a bare or dotted key: the fault is elsewhere on the line
    return (
        "; a name with characters other than A-Z, a-z, 0-9, _ and - must be"
        f' quoted: "{key}" = ...'
    )


_AT_COLUMN: Final = re.compile(r"at line \d+, column (\d+)\)")
_BARE_WORD: Final = re.compile(r"\*|[A-Za-z_][A-Za-z0-9_.-]*")
"""A name written without quotes where TOML expects a value (``dest = done``)."""
_TOML_WORDS: Final = frozenset({"true", "false", "inf", "nan"})


def _value_hint(exc: tomllib.TOMLDecodeError, written: str) -> str:
    """How to write the value TOML could not read on the line `written`, if clear.

    TOML says only "Invalid value" for a name written without its quotes
    (``dest = done``, ``conditions = [has_tool_calls]``, ``source = *``), and
    "Illegal character" for a string not closed on its line.
    """
    said = str(exc)
    column = _AT_COLUMN.search(said)
    if said.startswith("Invalid value") and column is not None:
        word = _BARE_WORD.match(written, int(column.group(1)) - 1)
        if word is not None and word.group() not in _TOML_WORDS:
            return f'; a name is written in quotes: "{word.group()}"'
    if said.startswith("Illegal character '\\n'") and "=" in written:
        return (
            "; a string ends on its line, with its closing quote (text over"
            ' several lines goes between """ and """)'
        )
    return ""


_KEY_AT: Final = re.compile(
    r"""(?:^|[{,])\s*("[^"\n]*"|'[^'\n]*'|[A-Za-z0-9_-]+)\s*="""
)
"""A key written on a line: at its start, or in an inline table."""
_HEADER: Final = re.compile(r"\s*(\[\[?)\s*([A-Za-z0-9_.-]+)\s*\]")


def _written_twice(text: str, line: int) -> tuple[str, str, str] | None:
    """The key that `line` writes a second time: (message, field, key).

    `tomllib` says only "Cannot overwrite a value" for a phase, or any key,
    written twice; this names the key and the table it is in (the table of
    the closest header above, ``[[transitions]]`` counted as an array).
    """
    lines = text.splitlines()
    said = lines[line - 1] if 0 < line <= len(lines) else ""  # else: none named
    keys = [k.strip("\"'") for k in _KEY_AT.findall(said)]
    table, start, entries = "", 0, 0
    for number, written in enumerate(lines[: line - 1]):
        header = _HEADER.match(written)
        if header is not None:
            table, start = header.group(2), number + 1
            entries += header.group(1) == "[[" and table == "transitions"
    before = {
        k.strip("\"'") for w in lines[start : line - 1] for k in _KEY_AT.findall(w)
    }
    inline = [k for i, k in enumerate(keys) if k in keys[:i]]
    twice = inline[:1] or [k for k in keys[:1] if k in before]
    if not twice:
        return None
    key = twice[0]
    where = f"{table}[{entries - 1}]" if table == "transitions" else table
    field = f"{where}.{key}" if where else key
    return (
        f"; {key!r} is written twice in {where or 'the file'}: write each key once",
        field,
        key,
    )


@final
@attrs.frozen(kw_only=True)
class StateSpec:
    """One phase: the decision (or custom effect) it emits and its entry reducers.

    A phase that runs a sub-agent (``subagent = NAME``) names it in
    `subagent`, and its `effect` is that name too.
    """

    name: str
    decision: str | None = None
    effect: str | None = None
    on_enter: tuple[str, ...] = ()
    subagent: str | None = None


@final
@attrs.frozen(kw_only=True)
class SubagentSpec:
    """A sub-agent a machine file declares (``[subagents.NAME]``), run by its phases.

    A phase with ``subagent = NAME`` runs the child on a task, in a session
    of its own linked to the phase, and ends with the signal `signal`, its
    data's `key` holding the child's answer.

    Attributes:
        name: The sub-agent's name; the driver is given its agent under it.
        machine: The child's machine file, as written: a path relative to
            the declaring file, or the name of a shipped machine file.
        signal: The signal the phase ends with when the child answers (and
            no route matches).
        routes: Signals chosen by the answer: (signal, prefix) pairs, tried
            in order; the first whose prefix starts the answer (case and
            surrounding blanks ignored) names the signal. A reviewer that
            answers "APPROVED" or a correction routes the run.
        on_failure: The signal it ends with when the child does not answer
            (its data's `key` says why); None: the run fails.
        key: The key of the answer in the signal's data.
        task: The child's task, a text in which ``{request}`` is the latest
            user message and ``{reply}`` the model's latest answer.
        max_depth: How deep sub-agents may nest, this one included.
        max_children: How many times one run may run this sub-agent.
    """

    name: str
    machine: str
    signal: str
    on_failure: str | None = None
    key: str = "answer"
    task: str = "{request}"
    max_depth: int = SUBAGENT_MAX_DEPTH
    max_children: int = SUBAGENT_MAX_CHILDREN
    routes: tuple[tuple[str, str], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """The declaration as a file writes it (the defaults left out)."""
        entry: dict[str, Any] = {"machine": self.machine, "signal": self.signal}
        for field in attrs.fields(SubagentSpec)[3:-1]:
            value = getattr(self, field.name)
            if value != field.default:
                entry[field.name] = value
        if self.routes:
            entry["routes"] = dict(self.routes)
        return entry

    def route(self, answer: str) -> str:
        """The signal the phase ends with for the child's `answer`."""
        head = answer.strip().casefold()
        for signal, prefix in self.routes:
            if head.startswith(prefix.strip().casefold()):
                return signal
        return self.signal


Resolve: TypeAlias = Callable[[str], "MachineSpec"]
"""Loads the machine file a sub-agent declaration names (`SubagentSpec.machine`).

Raises `DefinitionError` (the file is invalid, or runs its own caller) or
`OSError` (the file cannot be read)."""


@final
@attrs.frozen(kw_only=True)
class TransitionSpec:
    """One transition, as written in the file (sources expanded)."""

    trigger: str
    sources: tuple[str, ...]
    dest: str | None
    conditions: tuple[str, ...] = ()
    unless: tuple[str, ...] = ()
    actions: tuple[str, ...] = ()
    reason: CompactReason | None = None
    error: str | None = None
    is_wildcard: bool = False
    message: str | None = None
    """On a signal's transition: the key of the signal's data whose value joins
    the conversation as a user message (``message = "feedback"``)."""

    @property
    def is_guarded(self) -> bool:
        """Whether any condition may stop this transition."""
        return bool(self.conditions or self.unless)


def _transition_data(transition: TransitionSpec) -> dict[str, Any]:
    """One transition as a file writes it (a wildcard as its ``"*"``)."""
    entry: dict[str, Any] = {
        "trigger": transition.trigger,
        "source": ["*"] if transition.is_wildcard else list(transition.sources),
    }
    if transition.dest is not None:
        entry["dest"] = transition.dest
    for key in ("conditions", "unless", "actions"):
        names: tuple[str, ...] = getattr(transition, key)
        if names:
            entry[key] = list(names)
    if transition.reason is not None:
        entry["reason"] = transition.reason.value
    if transition.error is not None:
        entry["error"] = transition.error
    if transition.message is not None:
        entry["message"] = transition.message
    return entry


@final
@attrs.frozen(kw_only=True, cache_hash=True)
class MachineSpec:
    """A validated machine definition; build one with `from_toml`."""

    name: str
    initial: str
    terminal: tuple[str, ...]
    states: tuple[StateSpec, ...]
    transitions: tuple[TransitionSpec, ...]
    signals: tuple[str, ...] = ()
    source: str = "<string>"
    subagents: tuple[SubagentSpec, ...] = ()
    children: Mapping[str, MachineSpec] = attrs.field(
        factory=dict, eq=False, repr=False, hash=False
    )
    """Each sub-agent's machine, loaded with the file (`load_machine`); empty
    when the machine was read from text or data alone."""
    _by_name: dict[str, StateSpec] = attrs.field(
        init=False, eq=False, repr=False, hash=False
    )
    _accepts: dict[str, tuple[str, ...]] = attrs.field(
        init=False, eq=False, repr=False, hash=False
    )
    _triggers: frozenset[str] = attrs.field(
        init=False, eq=False, repr=False, hash=False
    )

    def __attrs_post_init__(self) -> None:
        # Read on every step of a run (which events a phase takes), so
        # worked out once, with the spec.
        object.__setattr__(self, "_by_name", {s.name: s for s in self.states})
        by_phase: dict[str, set[str]] = {}
        for t in self.transitions:
            for source in t.sources:
                by_phase.setdefault(source, set()).add(t.trigger)
        accepts = {phase: tuple(sorted(found)) for phase, found in by_phase.items()}
        object.__setattr__(self, "_accepts", accepts)
        triggers = frozenset(t.trigger for t in self.transitions)
        object.__setattr__(self, "_triggers", triggers)

    @classmethod
    def from_toml(
        cls, text: str, *, source: str = "<string>", resolve: Resolve | None = None
    ) -> MachineSpec:
        """Parse and validate a machine file's text.

        `resolve` loads the machine files its sub-agents name (`load_machine`
        gives one that reads them beside the file); without it they are not
        loaded, and not checked.

        Raises:
            DefinitionError: listing every problem found, each with its line;
                only the first for a text that is no TOML, or that nests too
                deep or writes too long a number for a machine file (32
                levels, 100 digits).
            ConfigError: `text` or `source` is not a string.
        """
        _checks.check(text, "text", _TEXT)
        _checks.check(source, "source", _checks.string())
        too_big = text_problem(text)
        if too_big is not None:
            raise DefinitionError(source, (too_big,))
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            line = _error_line(exc, text)
            twice = _written_twice(text, line) if "overwrite" in str(exc) else None
            written = _line_of(text, line)
            hint, field, key = twice or (
                _bare_key_hint(written) or _value_hint(exc, written),
                "",
                None,
            )
            problem = Problem(
                message=f"not valid TOML: {exc}{hint}",
                line=line,
                field=field,
                value=key,
            )
            raise DefinitionError(source, (problem,)) from None
        from turnfsm.core._loader import load_spec  # see from_dict

        return load_spec(data, source, source_map(text), resolve)

    @classmethod
    def from_dict(
        cls, data: Mapping[str, Any], *, source: str = "<dict>", recorded: bool = False
    ) -> MachineSpec:
        """Validate an already-parsed machine definition.

        Args:
            data: The machine as a file's data.
            source: The name its problems are reported under.
            recorded: `data` is the machine a session's log recorded for
                its runs (`MachineStored`): its entries and the bounds of its
                graph (termination, request sizes, limits, cancellation) are
                checked, not the rules on what a run keeps (which phases
                commit, record and answer each outcome), so that a run begun
                on a machine an earlier version accepted can still be
                resumed, abandoned and replayed on it. A `Driver` given such
                a spec checks it in full (`validated`).

        Raises:
            DefinitionError: listing every problem found (with no lines: use
                `from_toml` for those), also when `data` is not a mapping with
                string keys, nests deeper than 32 levels or holds an integer
                out of TOML's 64-bit range.
            ConfigError: `source` is not a string.
        """
        _checks.check(source, "source", _checks.string())
        _checks.check(recorded, "recorded", _checks.boolean())
        # The loader builds MachineSpecs, so it imports this module; import it
        # here, at call time, to keep the two modules free of an import cycle.
        from turnfsm.core._loader import load_spec

        return load_spec(data, source, recorded=recorded)

    def validated(self) -> MachineSpec:
        """Return this machine once it passes every check a machine file gets.

        A machine from `from_toml`, `from_dict` or `load_machine` passed them
        when it was made, and is returned as it is. One built or changed
        another way (``attrs.evolve(spec, transitions=...)``, the constructor)
        is checked now, once: a `Driver` runs no machine that a file could
        not load.

        Raises:
            DefinitionError: listing every problem found, as for a file.
        """
        from turnfsm.core._loader import validated  # see from_dict

        return validated(self)

    def to_dict(self) -> dict[str, Any]:
        """Return the machine as a file's data: `from_dict` reads it back.

        The machine read back is this one, with the same digest (the session
        log keeps it in this form, so a run resumes on the machine it began
        on without the file).
        """
        states: dict[str, dict[str, Any]] = {}
        for state in self.states:
            entry: dict[str, Any] = {}
            if state.decision is not None:
                entry["decision"] = state.decision
            if state.subagent is not None:
                entry["subagent"] = state.subagent
            elif state.effect is not None:
                entry["effect"] = state.effect
            if state.on_enter:
                entry["on_enter"] = list(state.on_enter)
            states[state.name] = entry
        data: dict[str, Any] = {
            "name": self.name,
            "initial": self.initial,
            "terminal": list(self.terminal),
            "states": states,
            "transitions": [_transition_data(t) for t in self.transitions],
        }
        if self.signals:
            data["signals"] = list(self.signals)
        if self.subagents:
            data["subagents"] = {s.name: s.to_dict() for s in self.subagents}
        return data

    def subagent(self, name: str) -> SubagentSpec:
        """Return the sub-agent declared as `name`."""
        return next(s for s in self.subagents if s.name == name)

    @property
    def phases(self) -> tuple[str, ...]:
        """Every phase, in file order."""
        return tuple(s.name for s in self.states)

    def state(self, name: str) -> StateSpec:
        """Return the phase called `name`."""
        return self._by_name[name]

    @property
    def triggers(self) -> frozenset[str]:
        """Every trigger some transition uses."""
        return self._triggers

    def accepts(self, phase: str) -> tuple[str, ...]:
        """Return the triggers some transition out of `phase` fires on, sorted."""
        return self._accepts.get(phase, ())
