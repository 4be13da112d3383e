"""Sessions linked as parent and child: a sub-agent's run and the call that made it."""

from __future__ import annotations

from turnfsm.persistence._parent_link import ParentLink
from turnfsm.persistence._session import Session
from turnfsm.persistence._store import SessionStore

__all__ = ["child_sessions", "parent_of"]


def parent_of(session: Session) -> ParentLink | None:
    """Return the link to the run that started `session`'s first run (None: none)."""
    runs = session.runs
    return runs[0].opened.parent if runs else None


async def child_sessions(store: SessionStore, session_id: str) -> list[Session]:
    """Return the sessions whose first run a run of `session_id` delegated to.

    In the order their parents' calls were made (the child's opening time).
    Reads every session of `store` (a store keeps no index of children).
    """
    children: list[tuple[float, Session]] = []
    for info in await store.list_sessions():
        if info.id == session_id or info.problem is not None:
            continue
        session = await Session.load(store, info.id)
        link = parent_of(session)
        if link is not None and link.session_id == session_id:
            children.append((session.runs[0].opened.at, session))
    return [s for _at, s in sorted(children, key=lambda pair: pair[0])]
