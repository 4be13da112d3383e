"""``turnfsm report SESSION -o FILE`` and ``turnfsm view SESSION``: see a session.

``report`` writes the session's view as one self-contained HTML file (to
attach to a bug report); ``view`` serves it live on 127.0.0.1 behind a
random token, with approve / reject buttons on a paused run that do what
``turnfsm approve`` and ``turnfsm reject`` do.
"""

from __future__ import annotations

import contextlib
import errno
import io
import sys
import threading
import webbrowser
from collections.abc import Callable, Sequence
from typing import TextIO

import attrs

from turnfsm import _checks
from turnfsm._files import write_text
from turnfsm.cli._answer import AnswerCommand, run_answer
from turnfsm.cli._errors import (
    check_writable,
    count_option,
    explain,
    terminal_text,
    write_utf8,
)
from turnfsm.cli._run import AgentOptions, model_kind, open_driver, run_async
from turnfsm.cli._sessions import not_found
from turnfsm.cli._stores import close_store, open_cli_store, shown, where
from turnfsm.errors import ConfigError, CorruptRecord, SessionNotFound, StoreError
from turnfsm.persistence import RunRecord, Session, SessionStore, descendants
from turnfsm.view import REPORT_SUB_AGENTS, REPORT_TURNS, ViewServer, render_report

__all__ = ["run_report", "run_view"]


def run_report(
    session_id: str,
    output: str | None,
    *,
    store: str | None = None,
    turns: str | None = None,
    sub_agents: str | None = None,
) -> int:
    """Write the session's view to `output`; return 0, or 2 with the error printed.

    `turns` is ``--turns``: how many of each run's last turns and passes the
    report holds, or ``all`` (None: `REPORT_TURNS`). `sub_agents` is
    ``--sub-agents``: how many sub-agent sessions it holds the pages of, or
    ``all`` (None: `REPORT_SUB_AGENTS`).
    """
    try:
        if not output:
            raise ConfigError("-o", output, "the HTML file to write (e.g. run.html)")
        check_writable("-o", output)
        if output != "-" and not output.lower().endswith((".html", ".htm")):
            raise ConfigError(
                "-o", output, "an HTML file (ending .html or .htm), or - for stdout"
            )
        recent = _recent(turns)
        pages = count_option(
            "--sub-agents", sub_agents, REPORT_SUB_AGENTS, low=0, what="sessions"
        )
        session, place, below, unread = run_async(_load, store, session_id)
        text = render_report(
            session,
            where=place,
            turns=recent,
            sub_agents=below,
            sub_agent_pages=pages,
            # The commands the page gives find the store the report read.
            commands=["--store", shown(store)] if store else [],
        )
        if output == "-":
            write_utf8(sys.stdout, text, errors="backslashreplace")
        else:
            write_text(output, text, errors="backslashreplace")
    except BrokenPipeError:  # the reader went (`| head`): `main` ends quietly
        raise
    except (StoreError, ConfigError, OSError, ImportError) as exc:
        print(f"turnfsm report: {explain(exc)}", file=sys.stderr)
        return 2
    runs = session.runs
    held = "" if recent is None else _held(runs, recent)
    # Written to standard output, the page is alone there: this goes aside.
    said, told = (output, None)
    if output == "-":
        said, told = "the report to standard output", sys.stderr
    print(
        f"wrote {said} (session {terminal_text(session.id)}: {len(runs)} run(s), "
        f"{sum(len(r.turns) for r in runs)} turn(s), "
        f"{sum(len(r.compactions) for r in runs)} pass(es)){held}"
        + _sub_agents_held(len(below), pages),
        file=told,
    )
    if unread is not None:  # the session's own pages are written
        print(
            f"turnfsm report: a sub-agent session of {terminal_text(session.id)} "
            f"cannot be read, and is not in the report: {explain(unread)}",
            file=sys.stderr,
        )
        return 1
    return 0


def _sub_agents_held(count: int, pages: int | None) -> str:
    """What the report holds of the session's `count` sub-agent sessions."""
    if not count:
        return ""
    held = count if pages is None else min(count, pages)
    left = f", {count - held} left out (--sub-agents all)" if held < count else ""
    return f"; the pages of {held} of its {count} sub-agent session(s){left}"


def _recent(turns: str | None) -> int | None:
    """The number ``--turns`` gives (None: ``all``; not given: `REPORT_TURNS`).

    Raises:
        ConfigError: it is neither ``all`` nor a whole number from 1 up.
    """
    return count_option("--turns", turns, REPORT_TURNS, low=1, what="turns")


def _held(runs: Sequence[RunRecord], recent: int) -> str:
    """What the report left out, if anything (`recent` turns a run)."""
    turns = passes = 0
    for run in runs:
        first = max(0, len(run.turns) - recent)
        turns += first
        passes += sum(1 for r in run.compactions if r.turn < first)
    if not turns:
        return ""
    return (
        f"; it holds each run's last {recent} turns and their passes: {turns} "
        f"turn(s) and {passes} pass(es) left out (--turns all keeps every one)"
    )


async def _load(
    store: str | None, session_id: str
) -> tuple[Session, str, list[Session], CorruptRecord | None]:
    """The session, where it is kept, the sessions below it, why they do not read.

    A sub-agent's damaged session never hides the session asked for: the
    last item says why the sessions below could not be read (their list is
    then empty), else None.
    """
    sessions = open_cli_store(store, read_only=True)
    try:
        try:
            session = await Session.load(sessions, session_id)
        except SessionNotFound as exc:
            raise await not_found(exc, sessions) from None
        try:
            below = await descendants(sessions, session_id)
        except CorruptRecord as exc:
            return session, where(sessions), [], exc
        return session, where(sessions), below, None
    finally:
        await close_store(sessions)


def run_view(
    session_id: str,
    options: AgentOptions,
    *,
    port: int = 0,
    open_browser: bool = True,
    out: TextIO | None = None,
    stop: threading.Event | None = None,
) -> int:
    """Serve the session's view until interrupted (or `stop` is set).

    Returns 0 when stopped, 2 when the session or the store cannot be read.
    """
    stream = out or sys.stdout
    server: ViewServer | None = None
    try:
        _checks.check(port, "--port", _checks.integer(low=0, high=65_535))
        opener = _opener(options)
        server = ViewServer(
            opener,
            session_id,
            answer=_answerer(session_id, options),
            port=port,
            # The page's commands find the store and build the agent as here.
            commands=options.flags(),
        )
        name = terminal_text(session_id)
        print(f"reading session {name}", file=stream, flush=True)
        server.start()
    except SessionNotFound as exc:
        assert server is not None
        server.stop()
        exc = run_async(_not_found, exc, opener)
        print(f"turnfsm view: {explain(exc)}", file=sys.stderr)
        return 2
    except (StoreError, ConfigError, OSError, ImportError) as exc:
        if server is not None:
            server.stop()
        said = explain(exc)
        if isinstance(exc, OSError) and exc.errno == errno.EADDRINUSE:
            said = str(ConfigError("--port", port, "a port no other program uses"))
        print(f"turnfsm view: {said}", file=sys.stderr)
        return 2
    try:
        print(
            f"serving session {terminal_text(session_id)} at {server.url}", file=stream
        )
        print("(only this machine can reach it; Ctrl-C stops it)", file=stream)
        stream.flush()
        if open_browser:
            webbrowser.open(server.url)
        waiting = stop or threading.Event()
        with contextlib.suppress(KeyboardInterrupt):
            while not waiting.wait(0.5):
                pass
    finally:
        going = server.answering
        if going:
            print(
                f"waiting for the answer to run(s) {', '.join(going)} to end "
                "(Ctrl-C again stops at once: the run is left unfinished, "
                "and turnfsm resume carries it on)",
                file=stream,
                flush=True,
            )
        server.stop()
    print("stopped", file=stream)
    return 0


async def _not_found(
    exc: SessionNotFound, opener: Callable[[], SessionStore]
) -> SessionNotFound:
    """`exc`, naming the store and the stored ids closest to the one asked for."""
    sessions = opener()
    try:
        return await not_found(exc, sessions)
    finally:
        await close_store(sessions)


def _opener(options: AgentOptions) -> Callable[[], SessionStore]:
    """What opens the store the session is read from, as `turnfsm approve` finds it.

    ``--store``, else the ``--agent``'s own store when it keeps one, else the
    command line's. The agent is loaded now: one that does not load is
    refused before the page is served, not when its buttons are used.

    Raises:
        ConfigError: ``--agent`` names no agent, or comes with options it
            replaces (named with their values).
        ImportError: the module ``--agent`` names does not import.
    """
    if options.agent is not None:
        with open_driver(options, need_model=False) as (_driver, own):
            if options.store is None and own is not None:
                # A shipped store opens again on its next use once closed.
                return lambda: own
    elif options.model is not None:
        # The options the page's commands build the agent from, checked now:
        # the model's form only (it is not reached, nor started).
        model_kind(options.model)
        with open_driver(attrs.evolve(options, model=None), need_model=False):
            pass
    spec = options.store
    return lambda: open_cli_store(spec, read_only=True)


def _answerer(session_id: str, options: AgentOptions) -> Callable[[str, str], str]:
    """Approve or reject from the page: what ``turnfsm approve|reject`` does."""

    def answer(action: str, run_id: str) -> str:
        # The log says where a rejection came from (not "the command line").
        reason = "rejected in the view" if action == "reject" else None
        command = AnswerCommand(
            action=action, session_id=session_id, run_id=run_id, reason=reason
        )
        said = io.StringIO()
        errors = io.StringIO()  # its own: answers from two tabs may overlap
        status = run_answer(command, options, out=said, err=errors)
        return f"{said.getvalue()}{errors.getvalue()}(exit status {status})"

    return answer
