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
from collections.abc import Mapping
from typing import Any, Final, final

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
    "MachineSpec",
    "StateSpec",
    "TransitionSpec",
]

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


@final
@attrs.frozen(kw_only=True)
class StateSpec:
    """One phase: the decision (or custom effect) it emits and its entry reducers."""

    name: str
    decision: str | None = None
    effect: str | None = None
    on_enter: tuple[str, ...] = ()


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
@attrs.frozen(kw_only=True)
class MachineSpec:
    """A validated machine definition; build one with `from_toml`."""

    name: str
    initial: str
    terminal: tuple[str, ...]
    states: tuple[StateSpec, ...]
    transitions: tuple[TransitionSpec, ...]
    signals: tuple[str, ...] = ()
    source: str = "<string>"
    _by_name: dict[str, StateSpec] = attrs.field(
        init=False, eq=False, repr=False, hash=False
    )

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "_by_name", {s.name: s for s in self.states})

    @classmethod
    def from_toml(cls, text: str, *, source: str = "<string>") -> MachineSpec:
        """Parse and validate a machine file's text.

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
            problem = Problem(
                message=f"not valid TOML: {exc}", line=_error_line(exc, text)
            )
            raise DefinitionError(source, (problem,)) from None
        from turnfsm.core._loader import load_spec  # see from_dict

        return load_spec(data, source, source_map(text))

    @classmethod
    def from_dict(
        cls, data: Mapping[str, Any], *, source: str = "<dict>"
    ) -> MachineSpec:
        """Validate an already-parsed machine definition.

        Raises:
            DefinitionError: listing every problem found (with no lines: use
                `from_toml` for those), also when `data` is not a mapping with
                string keys, nests deeper than 32 levels or holds an integer
                out of TOML's 64-bit range.
            ConfigError: `source` is not a string.
        """
        _checks.check(source, "source", _checks.string())
        # The loader builds MachineSpecs, so it imports this module; import it
        # here, at call time, to keep the two modules free of an import cycle.
        from turnfsm.core._loader import load_spec

        return load_spec(data, source)

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
            if state.effect is not None:
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
        return data

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
        return frozenset(t.trigger for t in self.transitions)
