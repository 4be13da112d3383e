"""``turnfsm sessions list | show | export | import | rm``: the stored sessions.

Each reads the store named by ``--store`` (else ``TURNFSM_STORE``, else the
default file). ``export`` writes the log itself (JSON lines, which
``import`` and ``turnfsm replay`` read, or one JSON document), so a session
moves between stores and machines without loss.
"""

from __future__ import annotations

import contextlib
import difflib
import json
import os
import shlex
import sys
import time
from collections.abc import Sequence
from typing import Final, TextIO, final

import anyio
import anyio.to_thread
import attrs

from turnfsm._files import write_text
from turnfsm._json import escape_surrogates
from turnfsm.cli._agents import load_agents
from turnfsm.cli._children import show_links
from turnfsm.cli._errors import (
    check_writable,
    count_option,
    explain,
    stop_signals,
    terminal_text,
    write_utf8,
)
from turnfsm.cli._run import (
    AgentOptions,
    answer_hint,
    call_text,
    open_run_only,
    open_run_words,
    run_async,
    subagent_answer_hint,
    waiting_for,
)
from turnfsm.cli._stores import (
    close_store,
    is_store_file,
    not_a_log,
    open_cli_store,
    unchecked_log_note,
    where,
)
from turnfsm.context import ContextManager
from turnfsm.driver import Driver, rebuild
from turnfsm.errors import (
    ConfigError,
    CorruptRecord,
    ReplayError,
    SessionBusy,
    SessionConflict,
    SessionNotFound,
    StoreError,
    SubagentWaiting,
    busy_words,
)
from turnfsm.messages import ImagePart, Message
from turnfsm.persistence import (
    CompactionRecord,
    LeasingStore,
    RunRecord,
    Session,
    SessionInfo,
    SessionStore,
    SummaryRecorded,
    Verdict,
    descendants,
    holder_of,
    load_session,
    session_lines,
)
from turnfsm.providers import ModelRequest, ModelResponse

__all__ = ["LIST_LIMIT", "SessionsCommand", "not_found", "run_sessions"]

LIST_LIMIT = 100
"""How many sessions ``turnfsm sessions list`` lists unless told (the newest)."""

_READING: Final = frozenset(("list", "show", "export"))
"""The actions that only read the store (it is opened to read only)."""


@final
@attrs.frozen(kw_only=True)
class SessionsCommand:
    """What ``turnfsm sessions`` was asked to do (its parsed arguments)."""

    action: str
    store: str | None = None
    session_id: str | None = None
    format: str = "jsonl"
    out: str | None = None
    file: str | None = None
    yes: bool = False
    force: bool = False
    agent: str | None = None
    limit: str | None = None


def run_sessions(command: SessionsCommand, *, out: TextIO | None = None) -> int:
    """Carry out `command`; return 0, or 2 with a one-line error on stderr.

    ``rm`` without ``--yes`` asks on stdin and returns 1 unless told ``y``.
    """
    stream = out or sys.stdout
    try:
        if command.action == "export" and command.out:  # before the store opens
            check_writable("-o", command.out)
        return run_async(_run, command, stream)
    except BrokenPipeError:  # the reader went (`| head`): `main` ends quietly
        raise
    except (StoreError, ConfigError, OSError, ImportError) as exc:
        print(f"turnfsm sessions {command.action}: {explain(exc)}", file=sys.stderr)
        return 2


async def _run(command: SessionsCommand, out: TextIO) -> int:
    limit = count_option("--limit", command.limit, LIST_LIMIT, low=1, what="sessions")
    log: bytes | str | None = None
    if command.action == "import":
        # The log is read and checked before the store opens: a refused
        # file leaves no store behind (a mistyped --store, a new file).
        read = await _checked_log(str(command.file))
        if isinstance(read, int):
            return read
        log = read
    store = open_cli_store(
        command.store,
        existing=command.action != "import",
        read_only=command.action in _READING,
    )
    try:
        if command.action == "list":
            return await _list(store, out, limit)
        if command.action == "import":
            assert log is not None
            return await _import(store, str(command.file), log, out)
        if command.action == "rm":
            return await _remove(
                store,
                str(command.session_id),
                yes=command.yes,
                force=command.force,
                out=out,
            )
        session = await _session(store, str(command.session_id))
        # What the commands it prints repeat (a password shown as PASSWORD).
        flags = AgentOptions(store=command.store).store_flags()
        if command.action == "compact":
            return await _compact(
                session, command.agent, out, force=command.force, flags=flags
            )
        if command.action == "show":
            held = await holder_of(session, store)
            code = _show(session, store, out, held=held, flags=flags)
            try:
                await show_links(session, store, out)
            except CorruptRecord as exc:  # the session itself is shown
                print(f"\nsub-agent sessions: one cannot be read: {exc}", file=out)
                return 1
            return code
        if command.action == "export":
            code = _export(session, command.format, command.out, out)
            await _left_out(session, store, flags, out if command.out else sys.stderr)
            return code
        return await _reset_breaker(store, session, out, flags)
    finally:
        await close_store(store)


async def _compact(
    session: Session,
    agent: str | None,
    out: TextIO,
    *,
    force: bool,
    flags: Sequence[str],
) -> int:
    """One manual pass over the session, by the agent's context manager."""
    driver = load_agents(agent)[0].driver if agent else _compacting_driver()
    try:
        result = await driver.compact(session, force=force)
    except SessionBusy as exc:
        said = (
            open_run_words(exc, flags, "then compact it")
            if open_run_only(exc)
            else busy_words(exc, "--force")
        )
        print(f"turnfsm sessions compact: {said}", file=sys.stderr)
        return 2
    record = next(iter(session.runs[-1].compactions), None)
    if record is None:  # ended before its pass (cancelled)
        name = terminal_text(session.id)
        print(f"session {name}: not compacted ({result.outcome})", file=out)
        return 1
    summaries = sum(
        1
        for e in session.entries
        if isinstance(e, SummaryRecorded) and e.run_id == result.run_id
    )
    if record.verdict is Verdict.CIRCUIT_OPEN:  # refused before it measured
        what = (
            "refused, as the compaction circuit breaker is open; "
            f"{len(record.covers)} messages kept"
        )
    else:
        what = (
            f"{record.tokens_before} -> {record.tokens_after} tokens (estimated), "
            + _replaced(record)
            + (f", {summaries} summary written" if summaries else "")
        )
    print(
        f"session {terminal_text(session.id)}: {record.verdict} by {record.strategy} "
        f"({record.reason.value}): {what}",
        file=out,
    )
    if not result.ok:
        print(f"turnfsm sessions compact: {result.error}", file=sys.stderr)
        return 1
    return 0


def _compacting_driver() -> Driver:
    """The default context manager's driver (its `MaskingCompactor` calls no model)."""
    return Driver(model=_NoModel(), context=ContextManager())


class _NoModel:
    """A model for a compaction that must not call one (no ``--agent`` given)."""

    async def complete(self, request: ModelRequest) -> ModelResponse:
        raise ConfigError(
            "--agent",
            None,
            "an agent (MODULE:ATTR) whose model can write the summary",
            missing=True,
        )


async def _reset_breaker(
    store: SessionStore, session: Session, out: TextIO, flags: Sequence[str]
) -> int:
    leasing = store if isinstance(store, LeasingStore) else None
    if leasing is not None:
        # Taken for the reset: appended under a live run, the reset would
        # stop that run at its next write (another writer appended first).
        try:
            await leasing.acquire_lease(session.id, _RESETTER, ttl=_RESETTER_TTL)
        except SessionBusy as busy:
            command = terminal_text(shlex.join([session.id, *flags]))
            said = busy_words(busy, f"turnfsm resume|abandon {command} --force")
            print(f"turnfsm sessions reset-breaker: {said}", file=sys.stderr)
            return 2
    try:
        session = await _session(store, session.id)  # as the lease found it
        failures = session.compaction_failures
        await session.reset_breaker(at=time.time())
    finally:
        if leasing is not None:
            await leasing.release_lease(session.id, _RESETTER)
    print(
        f"session {terminal_text(session.id)}: compaction circuit breaker reset "
        f"({failures} consecutive failure(s) cleared)",
        file=out,
    )
    return 0


async def _session(store: SessionStore, session_id: str) -> Session:
    try:
        return await Session.load(store, session_id)
    except SessionNotFound as exc:
        raise await not_found(exc, store) from None


async def not_found(exc: SessionNotFound, store: SessionStore) -> SessionNotFound:
    """`exc`, saying which store and the stored ids closest to the one asked for."""
    try:
        ids = [info.id for info in await store.list_sessions()]
    except StoreError:  # the store cannot list: say no more than the id
        ids = []
    close = difflib.get_close_matches(exc.session_id, ids, n=3, cutoff=0.8)
    return attrs.evolve(
        exc,
        store=where(store),
        suggestions=list(dict.fromkeys([*_started_by(exc.session_id, ids), *close]))[
            :3
        ],
    )


def _started_by(asked: str, ids: Sequence[str]) -> list[str]:
    """The ids that `asked` begins, as a shortened id does (``ses_1a97``, ``1a97``).

    Four characters at least (past the ``ses_`` every generated id has), so
    that a short typo does not name every session.
    """
    given = asked.removeprefix("ses_")
    if len(given) < 4 or asked in ids:
        return []
    return [i for i in ids if i != asked and i.removeprefix("ses_").startswith(given)]


_NO_TIME = "-"


def _when(at: float | None) -> str:
    """Local wall-clock time, to the second ("-" when unknown)."""
    if not at:
        return _NO_TIME
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))
    except (OverflowError, ValueError, OSError):  # NaN, or past any calendar
        return _NO_TIME


def _times(session: Session) -> tuple[float | None, float | None]:
    """When the session's first run began, and its log's latest entry's time."""
    stamps = [at for e in session.entries if (at := getattr(e, "at", 0.0))]
    started = [run.opened.at for run in session.runs]
    return (min(started) if started else None, max(stamps) if stamps else None)


async def _list(store: SessionStore, out: TextIO, limit: int | None) -> int:
    infos = await store.list_sessions()
    if not infos:
        print(f"no sessions in {where(store)}", file=out)
        return 0
    # A store of one's own may list objects of its own: what they lack is None.
    sound = [info for info in infos if getattr(info, "problem", None) is None]
    read: Sequence[SessionInfo] = infos
    times = [getattr(info, "updated_at", None) for info in sound]
    if limit and len(sound) > limit and None not in times:
        # The store says when each grew: only the newest are read.
        newest = sorted(sound, key=lambda i: -(i.updated_at or 0.0))[:limit]
        chosen = {info.id for info in newest}
        sound_ids = {info.id for info in sound}
        read = [i for i in infos if i.id in chosen or i.id not in sound_ids]
    header = ("ID", "STARTED", "LAST ACTIVITY", "ENTRIES", "RUNS", "LAST OUTCOME")
    listed: list[tuple[float, tuple[str, ...]]] = []
    damaged: list[tuple[str, ...]] = []
    for info in read:
        # One damaged session is reported on its line, never hides the others.
        problem = getattr(info, "problem", None)
        session: Session | None = None
        if problem is None:
            try:
                session = await Session.load(store, info.id)
            except CorruptRecord as exc:
                problem = str(exc)
        if session is None:
            bad = (terminal_text(info.id), _NO_TIME, _NO_TIME, str(info.version), "-")
            damaged.append((*bad, f"damaged: {problem}"))
            continue
        runs = session.runs
        started, last = _times(session)
        outcome = _state(runs)
        cells = (terminal_text(info.id), _when(started), _when(last), str(info.version))
        listed.append((last or 0.0, (*cells, str(len(runs)), outcome)))
    # Newest first: the latest activity on top (damaged sessions at the end).
    shown = sorted(listed, key=lambda r: -r[0])[: limit or None]
    rows: list[tuple[str, ...]] = [header, *[row for _, row in shown], *damaged]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header) - 1)]
    for row in rows:
        padded = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        print("  ".join([*padded, row[-1]]), file=out)
    count = len(shown) + len(damaged)
    of = f"{count} of {len(infos)}" if count < len(infos) else f"{len(infos)}"
    more = " (--limit all lists every one)" if count < len(infos) else ""
    print(f"{of} session(s) in {where(store)}, newest first{more}", file=out)
    if damaged:
        print(
            f"{len(damaged)} damaged session(s): `turnfsm sessions rm ID` removes one",
            file=out,
        )
        return 1
    return 0


def _state(runs: Sequence[RunRecord]) -> str:
    """The LAST OUTCOME a session is listed with: how its last run ended.

    A run still open (paused, interrupted, or with no end in its log) comes
    first, though a manual compaction ended after it: the session takes no
    new task until that run is answered, carried on or abandoned.
    """
    unfinished = [run for run in runs if run.is_open]
    if unfinished:
        return unfinished[-1].outcome
    return runs[-1].outcome if runs else "-"


def _in_flight(session: Session, run_id: str, out: TextIO) -> None:
    """Print what the unfinished run `run_id` holds beyond the history.

    Its input, replies and tool results are in its log, and join the
    history if it finishes: without this, a run stopped by Ctrl-C showed an
    empty history, as if what was said were lost.
    """
    record = session.run(run_id)
    spec = session.machine(record.opened.digest)
    if spec is None:
        return
    try:
        snapshot = rebuild(spec, session, run_id, check=False).snapshot
    except (ReplayError, ConfigError):
        return  # `turnfsm replay --session` names what is wrong with the log
    known = {m.id for m in session.history}
    held = [m for m in (*snapshot.history, *snapshot.pending) if m.id not in known]
    if not held:
        return
    print(
        f"\n{len(held)} more in its unfinished run {terminal_text(run_id)} (kept "
        "in its log; the history takes them if the run finishes):",
        file=out,
    )
    for message in held:
        print(f"  {message.role.value:<9} {_first_line(message)}", file=out)


def _show(
    session: Session,
    store: SessionStore,
    out: TextIO,
    *,
    held: SessionBusy | None = None,
    flags: Sequence[str] = (),
) -> int:
    """Print the session; the commands it gives carry `flags` (``--store``)."""
    runs = session.runs
    print(
        f"session {terminal_text(session.id)}: {session.version} entries, "
        f"{len(runs)} run(s), in {where(store)}",
        file=out,
    )
    print(f"\nhistory ({len(session.history)} messages):", file=out)
    for message in session.history:
        print(f"  {message.role.value:<9} {_first_line(message)}", file=out)
    unfinished = [run for run in runs if run.is_open]
    if unfinished:  # a manual compaction may come after it
        _in_flight(session, unfinished[-1].run_id, out)
    if session.breaker_open:
        print(
            f"\ncompaction circuit breaker: open after {session.compaction_failures} "
            "failure(s) in a row: passes make no model call "
            "(`turnfsm sessions reset-breaker` closes it)",
            file=out,
        )
    elif session.compaction_failures:
        print(
            f"\ncompaction circuit breaker: closed, {session.compaction_failures} "
            "failure(s) in a row (`turnfsm sessions reset-breaker` clears them)",
            file=out,
        )
    ratio = session.reported_ratio
    if ratio is not None:
        both = sum(1 for run in runs for t in run.turns if t.reported_ratio)
        print(
            f"\ntoken counts: the provider reported up to {ratio:.2f} times "
            f"turnfsm's estimate ({both} call(s) with both)",
            file=out,
        )
    print(f"\nruns ({len(runs)}):", file=out)
    for run in runs:
        usage = run.usage
        said = (
            _no_reply(run)
            if not run.turns
            else "usage not reported"
            if run.usage_unreported
            else f"usage {usage.describe()} (reported)"
        )
        name = terminal_text(run.run_id)
        line = f"  {name}  {run.outcome}  {len(run.turns)} turn(s)  {said}"
        error = "" if run.error is None else str(run.error)
        if error:
            line += f"  error: {_clip(error)}"
        print(line, file=out)
        if _clip(error) != error:
            # Why it ended, and what would help, are at the end of the text.
            print(f"    error in full: {terminal_text(error)}", file=out)
        if run.continued:
            print(
                f"    its durable run's workflow continued as new {run.continued} "
                "time(s) "
                "(a fresh Temporal history each time; the run went on)",
                file=out,
            )
        if run.is_open and held is not None and run.run_id == held.run_id:
            # Its process or workflow is live: the commands below would be
            # refused.
            take_over = (
                "turnfsm resume|abandon "
                f"{terminal_text(shlex.join([session.id, *flags]))} --force"
            )
            print(f"    {busy_words(held, take_over)}", file=out)
        elif run.outcome == "paused" and run.waiting is not None:
            calls = run.waiting.calls
            waits = waiting_for(run.waiting)
            print(f"    paused in {run.waiting.phase}, {waits}", file=out)
            for call in calls:
                print(
                    terminal_text(
                        f"    {call.id}  {call_text(call.name, call.arguments)}"
                    ),
                    file=out,
                )
            words = terminal_text(shlex.join([session.id, *flags]))
            print(f"    answer it: {answer_hint(run.waiting, words)}", file=out)
        elif run.is_open and isinstance(run.error, SubagentWaiting):
            # Its sub-agent is answered, not this run resumed (resume refuses).
            words = terminal_text(shlex.join([session.id, *flags]))
            print(f"    answer it: {subagent_answer_hint(words)}", file=out)
        elif run.outcome in ("interrupted", "running"):
            target = terminal_text(shlex.join([session.id, run.run_id, *flags]))
            # The log does not say which agent ran it: resume is given its
            # options, as `turnfsm run` was.
            print(
                f"    carry it on: turnfsm resume {target} with the options that "
                "built its agent (--agent MODULE:ATTR, or --model ...), or end "
                f"it: turnfsm abandon {target}",
                file=out,
            )
    passes = [(run.run_id, c) for run in runs for c in run.compactions]
    print(f"\ncompactions ({len(passes)}):", file=out)
    for run_id, c in passes:
        count = _replaced(c)
        print(
            f"  {terminal_text(run_id)} turn {c.turn}  {c.reason.value}  {c.verdict}  "
            f"{c.tokens_before} -> {c.tokens_after} tokens (estimated)  "
            f"({count}, {c.strategy or 'no compactor'})",
            file=out,
        )
    return 0


def _first_line(message: Message) -> str:
    text = message.text.strip().splitlines()
    shown = _clip(text[0]) if text else ""
    images = sum(isinstance(part, ImagePart) for part in message.parts)
    if images:
        shown = f"{shown} [image{f' x{images}' if images > 1 else ''}]".strip()
    calls = [call.name for call in message.tool_calls]
    if calls:
        shown = f"{shown} [tool calls: {', '.join(calls)}]".strip()
    for result in message.tool_results:
        lines = result.content.strip().splitlines()
        first = _clip(lines[0]) if lines else ""
        error = " error" if result.is_error else ""
        shown = f"[{result.call_id}{error}] {first}".rstrip()
    return terminal_text(shown)  # a call's id is the model's too


def _clip(text: str, width: int = 72) -> str:
    """`text` cut to `width`, as a terminal shows it safely (see `_plain`)."""
    return terminal_text(text if len(text) <= width else text[: width - 3] + "...")


def _export(session: Session, fmt: str, path: str | None, out: TextIO) -> int:
    if fmt == "jsonl":
        text = "".join(line + "\n" for line in session_lines(session))
    else:
        header, *entries = map(json.loads, session_lines(session))
        document = {**header, "entries": entries}
        text = json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False)
        # A lone surrogate (text from bytes that were not UTF-8) is written as
        # its JSON escape, as in the JSON lines form: the same text reads back.
        text = escape_surrogates(text) + "\n"
    if path is None or path == "-":
        write_utf8(out, text)
        return 0
    write_text(path, text)
    print(
        f"session {terminal_text(session.id)}: {session.version} entries "
        f"written to {path}",
        file=out,
    )
    return 0


async def _left_out(
    session: Session, store: SessionStore, flags: list[str], out: TextIO
) -> None:
    """Say which sub-agents' sessions an export of `session` leaves out.

    Each sub-agent ran in a session of its own, which the log of `session`
    does not hold: imported alone, the session shows no sub-agent's work.
    """
    try:
        below = await descendants(store, session.id)
    except CorruptRecord as exc:  # the export itself is written and whole
        print(
            f"session {terminal_text(session.id)}'s sub-agents ran in sessions "
            f"of their own, not in this log, and one of them cannot be read "
            f"({exc}): export the others one by one (`turnfsm sessions show` "
            "of each names its sub-agents)",
            file=out,
        )
        return
    if not below:
        return
    print(
        f"session {terminal_text(session.id)}'s sub-agents ran in {len(below)} "
        "session(s) of their own, not in this log; export each to keep their "
        "work too:",
        file=out,
    )
    for child in below:
        command = ["turnfsm", "sessions", "export", child.id, *flags]
        said = shlex.join([*command, "-o", f"{child.id}.jsonl"])
        print(f"  {terminal_text(said)}", file=out)


async def _checked_log(path: str) -> bytes | str | int:
    """The log at `path` (``-``: standard input), read and checked; or 2, said why.

    Checked whole, in memory, as importing it would: nothing is written.
    """
    data: str | bytes
    if path == "-" and sys.stdin is None:  # closed: `<&-`
        data = ""
    elif path == "-":
        stdin = getattr(sys.stdin, "buffer", sys.stdin)  # bytes, unless replaced
        data = stdin.read()
    else:
        data = await anyio.Path(path).read_bytes()
    if not data.strip():
        name = "standard input" if path == "-" else path
        empty = "closed" if path == "-" and sys.stdin is None else "empty"
        print(
            f"turnfsm sessions import: {name} is {empty}: expected a session log, "
            "as `turnfsm sessions export` writes it",
            file=sys.stderr,
        )
        return 2
    if is_store_file(data):  # it would read as text that is not UTF-8
        name = "standard input" if path == "-" else path
        print(
            f"turnfsm sessions import: {name} is an SQLite store, not a session "
            "log: its sessions are read where they are (--store FILE), and "
            "`turnfsm sessions export` writes a session's log",
            file=sys.stderr,
        )
        return 2
    if (reason := not_a_log(data)) is not None:
        name = "standard input" if path == "-" else path
        print(
            f"turnfsm sessions import: {name} is not a session log ({reason}): "
            "expected one, as `turnfsm sessions export` writes it",
            file=sys.stderr,
        )
        return 2
    try:
        await load_session(data)
    except CorruptRecord as exc:
        name = "standard input" if path == "-" else path
        print(f"turnfsm sessions import: {name}: {exc}", file=sys.stderr)
        return 2
    return data


async def _import(
    store: SessionStore, path: str, data: str | bytes, out: TextIO
) -> int:
    try:
        session = await load_session(data, store)
    except SessionConflict as exc:
        name = "standard input" if path == "-" else path
        said = await _already_in(store, exc.session_id, await load_session(data), name)
        print(f"turnfsm sessions import: {said}", file=sys.stderr)
        return 2
    print(
        f"imported session {terminal_text(session.id)} ({session.version} "
        f"entries) into {where(store)}",
        file=out,
    )
    note = unchecked_log_note(data, "standard input" if path == "-" else path)
    if note is not None:
        print(f"turnfsm sessions import: note: {note}", file=sys.stderr)
    return 0


async def _already_in(
    store: SessionStore, session_id: str, log: Session, name: str
) -> str:
    """What the store holds under the id of the log `name` could not import.

    `turnfsm sessions rm` deletes the stored session: advised only when what
    it holds is the log itself, or the start of it.
    """
    place = f"session {terminal_text(session_id)} is already in {where(store)}"
    try:
        stored = (await Session.load(store, session_id)).entries
    except CorruptRecord as exc:
        return (
            f"{place}, damaged ({exc}): nothing imported; `turnfsm sessions rm` "
            "it first to import the log in its place"
        )
    mine = log.entries
    if stored == mine:
        return (
            f"{place}, the same log as {name} ({len(mine)} entries): nothing imported"
        )
    if stored == mine[: len(stored)]:
        return (
            f"{place}, an older copy of {name}'s log ({len(stored)} of its "
            f"{len(mine)} entries); `turnfsm sessions rm` it first to import "
            "the whole log"
        )
    if mine == stored[: len(mine)]:
        return (
            f"{place}, and has gone on since {name} was exported "
            f"({len(stored)} entries, the file's {len(mine)} and more): "
            "nothing imported"
        )
    differs = next(
        i for i, (a, b) in enumerate(zip(stored, mine, strict=False)) if a != b
    )
    return (
        f"{place}, another log under that id ({len(stored)} entries; its "
        f"entry {differs + 1} differs from {name}'s): nothing imported. `turnfsm "
        "sessions rm` would delete that session; import the file into another "
        "store (--store) to keep both"
    )


async def _remove(
    store: SessionStore, session_id: str, *, yes: bool, force: bool, out: TextIO
) -> int:
    delete = getattr(store, "delete_session", None)
    if delete is None:
        raise ConfigError(
            "--store",
            where(store),
            "a store that can delete sessions (SQLite, PostgreSQL)",
        )
    try:
        session = await _session(store, session_id)
        what = f"{session.version} entries, {len(session.runs)} run(s)"
    except CorruptRecord as exc:
        what = f"damaged: {exc}"  # a damaged session can be removed all the same
    leasing = store if isinstance(store, LeasingStore) and not force else None
    if leasing is not None and not await _hold_to_remove(leasing, session_id):
        return 2
    if not yes:
        # Let go while a person answers: a Ctrl-C (or a kill) meant as "no"
        # would leave every run of the session refused for _REMOVER_TTL.
        if leasing is not None:
            await leasing.release_lease(session_id, _REMOVER)
        name = terminal_text(session_id)
        question = f"delete session {name} ({what}) from {where(store)}? [y/N] "
        answer = await _answer(question)
        if answer is None:
            print(f"\nnot deleted: {_NO_ANSWER}", file=out)
            return 1
        if answer.strip().lower() not in ("y", "yes"):
            print("not deleted", file=out)
            return 1
        if leasing is not None and not await _hold_to_remove(leasing, session_id):
            return 2
    try:
        await delete(session_id)
    except BaseException:
        if leasing is not None:  # nothing deleted (or not all): let it go
            with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
                await leasing.release_lease(session_id, _REMOVER)
        raise
    print(f"deleted session {terminal_text(session_id)} from {where(store)}", file=out)
    return 0


async def _hold_to_remove(store: LeasingStore, session_id: str) -> bool:
    """Take the session for its deletion; False (said) when a live run holds it.

    Taken, a live run's hold refuses the deletion atomically.
    """
    try:
        await store.acquire_lease(session_id, _REMOVER, ttl=_REMOVER_TTL)
    except SessionBusy as busy:
        print(
            f"turnfsm sessions rm: {busy_words(busy, '--force')}; stop that "
            "run first, or delete the session under it with --force",
            file=sys.stderr,
        )
        return False
    return True


_NO_ANSWER: Final = "no answer (standard input ended); --yes deletes without asking"


_REMOVER: Final = f"turnfsm sessions rm (pid {os.getpid()})"
"""The owner `sessions rm` holds a session's lease as while it deletes it."""

_RESETTER: Final = f"turnfsm sessions reset-breaker (pid {os.getpid()})"
"""The owner `sessions reset-breaker` holds a session's lease as while it appends."""

_RESETTER_TTL: Final = 60.0
"""Seconds that hold lasts: one load and one append."""

_REMOVER_TTL: Final = 600.0
"""Seconds that hold lasts: a large session takes a while to delete."""


async def _answer(question: str) -> str | None:
    """`_ask` `question` in a worker thread; a stopping signal meanwhile ends the wait.

    Ctrl-C, SIGTERM or SIGHUP while a person is asked raises
    `KeyboardInterrupt` (the program ends with status 130, not waiting for
    the thread, which is left to its read). A signal is delivered to any
    thread of the process: one that lands in the asking thread would not
    wake the event loop, which waits for the answer, so the signals are
    taken here, by the loop itself.
    """
    answer: list[str | None] = []
    stopped = False
    with anyio.open_signal_receiver(*stop_signals()) as signals:
        async with anyio.create_task_group() as group:

            async def ask() -> None:
                answer.append(
                    await anyio.to_thread.run_sync(
                        _ask, question, abandon_on_cancel=True
                    )
                )
                group.cancel_scope.cancel()

            group.start_soon(ask)
            async for _ in signals:
                stopped = True
                group.cancel_scope.cancel()
                break
    if stopped:
        raise KeyboardInterrupt
    return answer[0]


def _ask(question: str) -> str | None:
    """The answer typed to `question`; None when standard input ended or is closed."""
    if sys.stdin is None:  # closed (`<&-`): input() fails with "lost sys.stdin"
        print(question, end="", flush=True)
        return None
    try:
        return input(question)
    except EOFError:
        return None


def _no_reply(run: RunRecord) -> str:
    """What a run with no turn asked of its model: nothing, or calls with no reply."""
    failed = run.failed_calls
    if failed:
        return f"no model reply: {failed} call{'s' * (failed > 1)} failed"
    return "no model reply" if run.cut_short else "no model call"


def _replaced(record: CompactionRecord) -> str:
    """What a pass did to the messages it covered: only one that compacted replaced."""
    if record.compacted:
        return f"{len(record.covers)} -> {len(record.replacement)} messages"
    return f"{len(record.covers)} messages, none replaced"
