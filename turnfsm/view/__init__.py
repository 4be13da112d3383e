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
Everything taken from the log is escaped: a message holding HTML or a
script is shown as text.
"""

from __future__ import annotations

from typing import Final

from turnfsm import _checks
from turnfsm.persistence import Session
from turnfsm.view._html import page
from turnfsm.view._server import Answer, ViewServer

__all__ = ["REPORT_TURNS", "Answer", "ViewServer", "render_report"]


REPORT_TURNS: Final = 200
"""How many of each run's last turns a report holds by default (with their passes)."""


def render_report(
    session: Session, *, where: str = "", turns: int | None = REPORT_TURNS
) -> str:
    """Return `session` as one self-contained HTML page.

    Args:
        session: The session (`Session.load` reads a stored one).
        where: Where it is stored, for the page's header.
        turns: How many of each run's last turns the page holds with their
            details, with the compaction passes made during them (None: all
            of them). A run with more says how many it left out; its plot
            still shows every model call and pass.

    The page needs no network: its style, script and diagrams are inline.
    A turn's details are folded.

    Raises:
        ConfigError: `turns` is not a whole number from 1 up (or None).
    """
    _checks.check(turns, "turns", _checks.integer(low=1, optional=True))
    return page(session, where=where, recent=turns)
