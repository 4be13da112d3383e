"""Sessions linked as parent and child: a sub-agent's run and the call that made it."""

from __future__ import annotations

from turnfsm.persistence._parent_link import ParentLink
from turnfsm.persistence._records import EventRecorded, event_messages
from turnfsm.persistence._session import Session
from turnfsm.persistence._store import SessionStore

__all__ = ["child_sessions", "parent_of"]


def parent_of(session: Session) -> ParentLink | None:
    """Return the link to the run that started `session`'s first run (None: none)."""
    runs = session.runs
    return runs[0].opened.parent if runs else None


async def child_sessions(store: SessionStore, session_id: str) -> list[Session]:
    """Return the sessions whose first run a run of `session_id` delegated to.

    In the order the parent's log made their calls (calls made in one batch:
    in the order the model asked for them), then by when they opened.
    Reads every session of `store` (a store keeps no index of children).
    """
    children: list[tuple[ParentLink, float, Session]] = []
    for info in await store.list_sessions():
        if info.id == session_id or info.problem is not None:
            continue
        session = await Session.load(store, info.id)
        link = parent_of(session)
        if link is not None and link.session_id == session_id:
            children.append((link, session.runs[0].opened.at, session))
    if not children:
        return []
    order: dict[str, int] = {}
    for entry in (await Session.load(store, session_id)).entries:
        if isinstance(entry, EventRecorded):
            for message in event_messages(entry.event):
                for call in message.tool_calls:
                    order.setdefault(call.id, len(order))
    late = len(order)
    children.sort(key=lambda c: (order.get(c[0].call_id, late), c[1]))
    return [session for _link, _at, session in children]
