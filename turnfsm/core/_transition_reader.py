"""Loading a machine definition's ``[[transitions]]``: each entry checked on its own.

`TransitionReader` is the loader's base: it checks every transition's keys,
trigger, sources, dest, guard and reducer names, reason and error, and reads
each misspelt name as its suggestion (see `_loader.py` and `_problems.py`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any, Final

from turnfsm.core._guards import GUARDS
from turnfsm.core._lines import CompactReason
from turnfsm.core._problems import ProblemLog
from turnfsm.core._reducers import ACCEPTS, FAILURES, REDUCERS
from turnfsm.core._source_map import Path
from turnfsm.core._spec import BUILTIN_TRIGGERS, TransitionSpec

__all__ = ["WILDCARD", "TransitionReader"]


_TRANSITION_KEYS: Final = frozenset(
    {
        "trigger",
        "source",
        "dest",
        "conditions",
        "unless",
        "actions",
        "reason",
        "error",
        "message",
    }
)
_REASONS: Final = frozenset(r.value for r in CompactReason)
WILDCARD: Final = "*"
_UNREADABLE: Final = "<not a guard's name>"
"""The guard a transition's unreadable guards are read as (see `_names`)."""


_CANCELLED: Final = "cancelled"

_OWN_OUTCOMES: Final = BUILTIN_TRIGGERS - {
    "run_cancelled",
    "tool_calls_reviewed",
    "message_injected",
}
"""The built-in triggers that come from the run itself, not from outside it."""


class TransitionReader(ProblemLog):
    """Checks the transitions of one machine definition (the base of the loader)."""

    data: Mapping[str, Any]
    """The parsed file."""
    kinds: dict[str, str | None]
    """Each phase's decision, as read (see `resolved`); set before the transitions."""
    recorded: bool = False
    """A session log's record of a machine that ran: read as an earlier version
    wrote it (a name listed twice, refused in files now, is kept)."""

    def _str_list(self, value: Any, where: str, at: Path) -> list[str]:
        if isinstance(value, str):
            return [value]
        if (
            type(value) is list
            and all(type(v) is str for v in value)
            and len(set(value)) == len(value)
        ):
            return list(value)  # the usual list: distinct names
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            self.problem(
                f"{where} must be a string or a list of strings, got {value!r}",
                at,
                value,
            )
            return []
        seen: set[str] = set()
        for j, name in enumerate(value):
            # A name listed again is a slip, never a second meaning.
            if name in seen and not self.recorded:
                self.problem(
                    f"{where}: {name!r} is listed more than once", (*at, j), name
                )
            seen.add(name)
        return list(value)

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
        body = self.read_keys(body, _TRANSITION_KEYS, at)
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
        message = self._message(body, at, where, trigger, signals, dest)
        t = TransitionSpec(
            trigger=trigger or str(written),
            sources=sources,
            dest=dest,
            conditions=self.read_as(conditions, GUARDS),
            unless=self.read_as(unless, GUARDS),
            actions=self.read_as(actions, REDUCERS),
            reason=reason,
            error=error,
            is_wildcard=is_wildcard,
            message=message,
        )
        if written_dest is not None and written_dest != dest:
            self.guessed.add(id(t))  # its dest is a guess at a misspelt name
        return t, trigger is not None and has_dest and bool(sources)

    def _trigger(
        self, written: Any, where: str, at: Path, signals: set[str]
    ) -> str | None:
        """Check a transition's trigger; return it as read."""
        if written is None:
            self.problem(f"{where}: trigger is missing", at)
            return None
        if not isinstance(written, str):
            self.problem(
                f"{where}: trigger must be one trigger's name (a transition has"
                f" one; write one transition for each), got {written!r}",
                (*at, "trigger"),
                written,
            )
            return None
        if written in BUILTIN_TRIGGERS or written in signals:
            return written
        triggers = BUILTIN_TRIGGERS | signals
        self.problem(
            f"{where}: unknown trigger {written!r} (declare it in signals)",
            (*at, "trigger"),
            written,
            triggers,
        )
        return self.resolved(written, triggers)

    def _message(
        self,
        body: dict[str, Any],
        at: Path,
        where: str,
        trigger: str | None,
        signals: set[str],
        dest: str | None,
    ) -> str | None:
        """Check a transition's `message`: a data key of the signal it is on."""
        written = body.get("message")
        if written is None:
            return None
        place = (*at, "message")
        if not isinstance(written, str) or not written:
            self.problem(
                f"{where}: message must be the non-empty name of a key of the "
                f"signal's data, got {written!r}",
                place,
                written,
            )
            return None
        if trigger is not None and trigger not in signals:
            self.problem(
                f"{where}: message is only for transitions on a signal "
                "(declared in signals): a built-in event brings its own messages",
                place,
                written,
            )
            return None
        if dest is not None and self.kinds.get(dest) == "fail":
            self.problem(
                f"{where}: message on a transition into the fail phase {dest!r} "
                "would never reach the conversation (a failed run discards it)",
                place,
                written,
            )
            return None
        return written

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
        if error == _CANCELLED and trigger in _OWN_OUTCOMES and not self.recorded:
            # The run would end "cancelled" though no one stopped it.
            fits = [
                repr(name)
                for name in sorted(FAILURES)
                if name != _CANCELLED and trigger in ACCEPTS.get(name, (trigger,))
            ]
            named = (
                fits[0] if len(fits) == 1 else f"{', '.join(fits[:-1])} or {fits[-1]}"
            )
            self.problem(
                f"{where}: error {_CANCELLED!r} says the run was stopped from"
                " outside (its cancel(), a reviewer's answer or a signal), but"
                f" {trigger!r} is what the run's own step came to: name what went"
                f" wrong ({named})",
                (*at, "error"),
                error,
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
        live: dict[str, None] = {}  # in file order, each once
        for j, src in enumerate(written):
            if src == WILDCARD:
                self.problem(
                    f"{where}: {WILDCARD!r} (every phase) is a source on its own:"
                    f' write source = "{WILDCARD}", or list the phases',
                    (*at, "source", j),
                    src,
                )
                continue
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
            phase = self.resolved(src, names)
            if phase is not None and phase not in terminal:
                live.setdefault(phase)
        return tuple(live), is_wildcard

    def _dest(
        self, body: dict[str, Any], where: str, at: Path, names: set[str]
    ) -> tuple[str | None, bool]:
        """Check a transition's dest; return it as read, and whether it resolved."""
        written = body.get("dest")
        if written is None:
            return None, True  # an internal transition: it stays in its phase
        if not isinstance(written, str):
            self.problem(
                f"{where}: dest must be one phase's name (a transition goes to"
                f" one phase), got {written!r}",
                (*at, "dest"),
                written,
            )
            return None, False
        if written not in names:
            self.problem(
                f"{where}: unknown dest phase {written!r}",
                (*at, "dest"),
                written,
                names,
            )
        dest = self.resolved(written, names)
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
        if key not in body:
            return ()
        what = "reducer" if key == "actions" else "guard"
        value = body[key]
        written = tuple(self._str_list(value, f"{where} {key}", (*at, key)))
        if what == "guard" and value != [] and not written:
            # Guards that are not names (``conditions = 1``): read as none,
            # the transition would be taken on every event, and the checks
            # after would judge one not meant. Each is read as a guard no
            # check knows, as a misspelt one with no close match is.
            items = value if isinstance(value, list) else [value]
            return tuple(v if isinstance(v, str) else _UNREADABLE for v in items)
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
