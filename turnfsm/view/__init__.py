"""See a stored session: its runs, their paths, turns and compaction passes.

`render_report` writes a session as one self-contained HTML page (no
network: its style and script are inline); `ViewServer` serves the same
view live on 127.0.0.1, behind a random token, with approve / reject
buttons on a paused run. ``turnfsm report`` and ``turnfsm view`` are the
command-line faces of both.

Each run shows the machine's diagram with the path the run took, a plot
of the tokens sent per model call against the window and its two lines
(compaction passes marked), what the model saw on every turn and its
reply, and each pass as a diff of what it covered and what replaced it.
A run that handed work to sub-agents lists the sessions its tool calls
started, each linked to its own page: a section further down the report,
or a page of the live server.
Everything taken from the log is escaped: a message holding HTML or a
script is shown as text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from turnfsm import _checks
from turnfsm.persistence import Session
from turnfsm.view._html import command_words, page
from turnfsm.view._server import Answer, ViewServer

__all__ = [
    "REPORT_SUB_AGENTS",
    "REPORT_TURNS",
    "Answer",
    "ViewServer",
    "render_report",
]


REPORT_TURNS: Final = 200
"""How many of each run's last turns a report holds by default (with their passes)."""

REPORT_SUB_AGENTS: Final = 20
"""How many sub-agent sessions a report holds the pages of by default."""


def render_report(
    session: Session,
    *,
    where: str = "",
    turns: int | None = REPORT_TURNS,
    sub_agents: Sequence[Session] = (),
    sub_agent_pages: int | None = REPORT_SUB_AGENTS,
    commands: Sequence[str] = (),
) -> str:
    """Return `session` as one self-contained HTML page.

    Args:
        session: The session (`Session.load` reads a stored one).
        where: Where it is stored, for the page's header.
        turns: How many of each run's last turns the page holds with their
            details, with the compaction passes made during them (None: all
            of them). A run with more says how many it left out; its plot
            still shows every model call and pass.
        sub_agents: The sessions below `session`, each before its own
            (`turnfsm.persistence.descendants` reads them from the store):
            each run lists the ones its tool calls started, with how each
            ended, its turns and its usage.
        sub_agent_pages: How many of `sub_agents`, in that order, the page
            holds as pages of their own, each a section further down that
            its row links to (None: all of them). The page says how many it
            left out.
        commands: The options that the commands the page gives (approve,
            resume, abandon a run) take after the ids, as a command line
            spells them: those that find the session's store
            (``["--store", "s.db"]``).

    The page needs no network: its style, script and diagrams are inline.
    A turn's details are folded.

    Raises:
        ConfigError: `session` is not a `Session`, `where` not a string,
            `sub_agents` not a sequence of sessions, `turns` not a whole
            number from 1 up (or None), or `sub_agent_pages` not one from 0
            up (or None).
    """
    _checks.check(session, "session", _checks.instance(Session, "a Session"))
    _checks.check(where, "where", _checks.string())
    below = _checks.as_tuple(sub_agents, "sub_agents", "sessions")
    _checks.check(below, "sub_agents", _checks.each(Session, "a Session"))
    _checks.check(turns, "turns", _checks.integer(low=1, optional=True))
    _checks.check(
        sub_agent_pages, "sub_agent_pages", _checks.integer(low=0, optional=True)
    )
    return page(
        session,
        where=where,
        recent=turns,
        sub_agents=below,
        sub_agent_pages=sub_agent_pages,
        commands=command_words(commands),
    )
