"""The sub-agents of a session's runs, as the view shows them.

Each run that handed work to sub-agents lists the sessions its tool calls
started (`sub_agent_list`); each sub-agent's own page says which call made
it (`delegated_by`). The sessions come from the caller, who holds the store
(`turnfsm.persistence.descendants` reads them): the view reads no store.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence

from turnfsm.persistence import RunRecord, Session, parent_of
from turnfsm.values import Usage

__all__ = ["below", "children_of", "delegated_by", "sub_agent_list"]


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def below(session_id: str, sessions: Sequence[Session]) -> list[Session]:
    """The sessions of `sessions` that descend from `session_id`, in their order.

    Each must come after its parent (as `descendants` lists them).
    """
    held = {session_id}
    out = []
    for session in sessions:
        link = parent_of(session)
        if link is not None and link.session_id in held and session.id not in held:
            held.add(session.id)
            out.append(session)
    return out


def children_of(
    sessions: Sequence[Session], session_id: str, run_id: str | None = None
) -> list[Session]:
    """The sessions of `sessions` that `session_id` (its run `run_id`) started."""
    out = []
    for child in sessions:
        link = parent_of(child)
        if (
            link is not None
            and link.session_id == session_id
            and run_id in (None, link.run_id)
        ):
            out.append(child)
    return out


def sub_agent_list(
    session: Session,
    run: RunRecord,
    n: int,
    sessions: Sequence[Session],
    page_of: Callable[[str], str | None],
) -> list[str]:
    """The `n`-th run's "Sub-agents" section: one row per session it started.

    A row names the call, the session (linked to its page when `page_of`
    gives an address), how its first run ended, its turns and usage. A run
    that started none has no section.
    """
    children = children_of(sessions, session.id, run.run_id)
    if not children:
        return []
    out = [
        f'<section class="sub-agents" id="sub-agents-{n}"><h3>Sub-agents '
        f'({len(children)})</h3><table class="sub-agents"><tr><th>call</th>'
        "<th>session</th><th>outcome</th><th>turns</th><th>usage</th></tr>",
    ]
    for child in children:
        link = parent_of(child)
        assert link is not None
        usage = sum((r.usage for r in child.runs), start=Usage())
        outcome = child.runs[0].outcome
        name = f"<code>{_e(child.id)}</code>"
        address = page_of(child.id)
        if address is not None:
            name = f'<a href="{_e(address)}">{name}</a>'
        out.append(
            f'<tr class="sub-agent" id="sub-{_e(child.id)}">'
            f"<td><code>{_e(link.call_id)}</code></td><td>{name}</td>"
            f'<td><span class="outcome {_e(outcome)}">{_e(outcome)}</span></td>'
            f"<td>{sum(len(r.turns) for r in child.runs)}</td>"
            f"<td>{_usage_cell(child.runs, usage)}</td></tr>"
        )
    out.append("</table></section>")
    return out


def delegated_by(session: Session, page_of: Callable[[str], str | None]) -> str:
    """The line that names the call `session`'s first run answered ("": none)."""
    link = parent_of(session)
    if link is None:
        return ""
    parent = f"session <code>{_e(link.session_id)}</code>"
    address = page_of(link.session_id)
    if address is not None:
        parent = f'<a href="{_e(address)}">{parent}</a>'
    return (
        f'<p class="delegated">A sub-agent: it answered call <code>'
        f"{_e(link.call_id)}</code> of run <code>{_e(link.run_id)}</code> of "
        f"{parent} (depth {link.depth}).</p>"
    )


def _usage_cell(runs: Sequence[RunRecord], usage: Usage) -> str:
    """The tokens a sub-agent's runs used, or that its provider reported none."""
    if any(r.turns for r in runs) and not any(r.reported_calls for r in runs):
        return "not reported"
    return usage.describe()
