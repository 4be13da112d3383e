"""``turnfsm replay LOG | --session ID``: re-feed logged runs into a fresh brain."""

from __future__ import annotations

import os
import sys
from typing import TextIO

from turnfsm._resources import load_machine, machines_dir
from turnfsm.cli._errors import explain, terminal_text
from turnfsm.cli._run import machine_option, run_async
from turnfsm.cli._stores import is_store_file, not_a_log, unchecked_log_note
from turnfsm.core import MachineSpec
from turnfsm.driver import replay
from turnfsm.errors import (
    ConfigError,
    CorruptRecord,
    DefinitionError,
    SessionNotFound,
    StoreError,
)
from turnfsm.persistence import (
    RunRecord,
    Session,
    SessionStore,
    child_sessions,
    load_session,
)

__all__ = ["run_replay"]


def run_replay(
    path: str | None,
    *,
    run_id: str | None = None,
    machine: str | None = None,
    out: TextIO | None = None,
    store: str | None = None,
    session_id: str | None = None,
) -> int:
    """Replay the runs of the session log at `path`; print one line per run.

    With `session_id` instead of `path`, the session is read from `store`
    (a store spec; by default ``TURNFSM_STORE``, else the CLI's SQLite file).

    A stored session's sub-agent sessions (`child_sessions`, all the way
    down) replay too, each on its own log's machine, indented under it
    (not with `run_id`).

    Returns 0 when every run replays exactly, 1 when one diverges (the first
    diverging event is named), 2 when the log or the machine cannot be read.
    """
    stream = out or sys.stdout
    try:
        opened = _open(path, store, session_id)
        session, source, lines, children, unread, note = opened
        runs = [r for r in session.runs if run_id is None or r.run_id == run_id]
        if not runs:
            raise ConfigError("--run", run_id, f"a run of the log ({source})")
        specs = {r.run_id: _machine(session, r, machine) for r in runs}
        # A stored session's sub-agent sessions replay too, each on the
        # machine its own log keeps.
        theirs = [
            (depth, child, {r.run_id: _machine(child, r, None) for r in child.runs})
            for depth, child in children
            if run_id is None
        ]
    except (OSError, StoreError, ConfigError, DefinitionError, ImportError) as exc:
        said = explain(exc)
        if isinstance(exc, CorruptRecord) and path is not None:
            said = f"{path}: {said}"  # which file the line is of
        print(f"turnfsm replay: {said}", file=sys.stderr)
        return 2
    failed = _report(session, runs, specs, stream, lines)
    if note is not None:
        print(f"turnfsm replay: note: {note}", file=sys.stderr)
    for depth, child, child_specs in theirs:
        name = terminal_text(child.id)
        print(f"{'  ' * depth}sub-agent session {name}:", file=stream)
        failed |= _report(
            child, child.runs, child_specs, stream, None, indent="  " * (depth + 1)
        )
    if unread is not None and run_id is None:
        # The session and the sub-agents' sessions that read are replayed.
        print(
            f"turnfsm replay: a sub-agent session of {terminal_text(session.id)} "
            f"cannot be read, and was not replayed: {explain(unread)}",
            file=sys.stderr,
        )
        return 2
    return failed


Tree = list[tuple[int, Session]]
"""Sub-agent sessions, depth first, each with its depth (1: a child)."""


def _open(
    path: str | None, store: str | None, session_id: str | None
) -> tuple[Session, str, list[int] | None, Tree, CorruptRecord | None, str | None]:
    """The session, where it came from, each entry's file line, its sub-agents.

    Then why a sub-agent's session could not be read (None: all were), and
    what to say of a log file whose lines could not be checked whole.
    """
    if path is None and session_id is None:
        raise ConfigError(
            "LOG", None, "a session log file, or --session ID", missing=True
        )
    if path is not None and session_id is not None:
        raise ConfigError("--session", session_id, f"no --session with a LOG ({path})")
    if path is not None:
        if path == "-" and sys.stdin is None:  # closed: `<&-`
            data = b""
        elif path == "-":  # the log on standard input (`sessions export ID | ...`)
            data = sys.stdin.buffer.read()
        elif os.sep not in path and "." not in path and not os.path.lexists(path):
            # A bare name that is no file: likely the session meant.
            raise ConfigError(
                "LOG",
                path,
                "a session log file (there is none of that name; to replay "
                f"a stored session, give --session {path})",
            )
        else:
            with open(path, "rb") as file:
                data = file.read()
        if not data.strip():  # the library's error would name its argument
            raise ConfigError(
                "LOG",
                path,
                "a session log, as `turnfsm sessions export` writes it "
                + (
                    "(this file is empty)"
                    if path != "-"
                    else "(standard input is closed)"
                    if sys.stdin is None
                    else "(standard input gave nothing)"
                ),
            )
        if is_store_file(data):  # it would read as text that is not UTF-8
            raise ConfigError(
                "LOG",
                path,
                "a session log, as `turnfsm sessions export` writes it (this "
                f"file is an SQLite store: replay its sessions with --store {path}"
                " --session ID)",
            )
        if (reason := not_a_log(data)) is not None:
            raise ConfigError(
                "LOG",
                path,
                f"a session log, as `turnfsm sessions export` writes it ({reason})",
            )
        session = run_async(load_session, data)
        lines = _entry_lines(data, session.version)
        return session, path, lines, [], None, unchecked_log_note(data, path)
    return (*run_async(_load_stored, store, str(session_id)), None)


async def _load_stored(
    store: str | None, session_id: str
) -> tuple[Session, str, None, Tree, CorruptRecord | None]:
    from turnfsm.cli._sessions import not_found
    from turnfsm.cli._stores import close_store, open_cli_store, where

    sessions = open_cli_store(store, read_only=True)
    children: Tree = []
    unread: CorruptRecord | None = None
    try:
        session = await Session.load(sessions, session_id)
        try:
            await _descend(sessions, session_id, 1, {session_id}, children)
        except CorruptRecord as exc:  # never hides the session asked for
            unread = exc
    except SessionNotFound as exc:
        raise await not_found(exc, sessions) from None
    finally:
        await close_store(sessions)
    source = f"session {terminal_text(session_id)} in {where(sessions)}"
    return session, source, None, children, unread


async def _descend(
    store: SessionStore, session_id: str, depth: int, seen: set[str], out: Tree
) -> None:
    for child in await child_sessions(store, session_id):
        if child.id not in seen:  # a damaged store's loop: once
            seen.add(child.id)
            out.append((depth, child))
            await _descend(store, child.id, depth + 1, seen, out)


def _machine(session: Session, run: RunRecord, path: str | None) -> MachineSpec:
    """The machine to replay `run` on: the file given, else the log's, else shipped."""
    if path is not None:
        return machine_option(path)
    kept = session.machine(run.opened.digest)
    if kept is not None:
        return kept
    name = run.opened.machine
    shipped = machines_dir() / f"{name}.toml"
    if not shipped.is_file():
        raise ConfigError(
            "--machine",
            None,
            f"the machine file of {name!r} (not a shipped one)",
            missing=True,
        )
    return load_machine(shipped)


def _report(
    session: Session,
    runs: list[RunRecord],
    specs: dict[str, MachineSpec],
    out: TextIO,
    lines: list[int] | None,
    *,
    indent: str = "",
) -> int:
    failed = 0
    for run in runs:
        report = replay(specs[run.run_id], session, run.run_id)
        if report.ok:
            print(
                f"{indent}{terminal_text(run.run_id)}: {report.events} events "
                f"replayed exactly ({run.outcome})",
                file=out,
            )
            continue
        failed += 1
        divergence = report.divergence
        if divergence is not None:
            reason, at = str(divergence), _line(divergence.entry, lines)
        else:  # the events replay, but not to the history the log commits
            reason = (
                f"the replayed history differs from the log: "
                f"{report.history_difference}"
            )
            at = _line(report.commit, lines)
        print(f"{indent}{terminal_text(run.run_id)}: DIVERGES{at} - {reason}", file=out)
    return 1 if failed else 0


def _line(entry: int | None, lines: list[int] | None) -> str:
    """`` at line N`` of the log file of `entry`, if that is known."""
    if entry is None or lines is None:
        return ""
    return f" at line {lines[entry]}"


def _entry_lines(data: bytes, entries: int) -> list[int] | None:
    """The line of each entry of a JSON lines log (None: a JSON document)."""
    rows = data.split(b"\n")
    numbers = [n for n, row in enumerate(rows, start=1) if row.strip()]
    if len(numbers) != entries + 1 or rows[0].strip() == b"{":
        return None
    return numbers[1:]
