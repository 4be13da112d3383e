"""Sessions linked as parent and child: a sub-agent's run and the call that made it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, runtime_checkable

from turnfsm import _checks
from turnfsm.persistence._parent_link import ParentLink
from turnfsm.persistence._records import EventRecorded, RunOpened, event_messages
from turnfsm.persistence._session import Session
from turnfsm.persistence._store import SessionStore

__all__ = ["LinkingStore", "child_sessions", "descendants", "parent_of"]


@runtime_checkable
class LinkingStore(Protocol):
    """A `SessionStore` that also lists sub-agents' sessions at once (optional).

    `descendants` (and so ``turnfsm view`` and ``turnfsm sessions show``)
    asks such a store which sessions sub-agents ran in, then reads only the
    sessions below the one asked about; of any other store it reads every
    session. Every shipped store is one.
    """

    async def list_delegated(self) -> Mapping[str, RunOpened]:
        """Return the sessions whose first run a sub-agent's caller delegated.

        By session id: each one's first `RunOpened` entry, the one whose
        `parent` names the calling session, run and call. A session whose
        first run was not delegated is not in it, nor one whose opening
        does not read back.
        """
        ...


def parent_of(session: Session) -> ParentLink | None:
    """Return the link to the run that started `session`'s first run (None: none)."""
    runs = session.runs
    return runs[0].opened.parent if runs else None


async def child_sessions(store: SessionStore, session_id: str) -> list[Session]:
    """Return the sessions whose first run a run of `session_id` delegated to.

    In the order the parent's log made their calls (calls made in one batch:
    in the order the model asked for them), then by when they opened.
    Reads the sessions below `session_id` of a `LinkingStore`, every
    session of any other store.
    """
    return await descendants(store, session_id, depth=1)


async def descendants(
    store: SessionStore, session_id: str, *, depth: int | None = None
) -> list[Session]:
    """Return the sessions that descend from `session_id`: children, theirs, ...

    Each session comes before its own children, and the children of one
    session in the order `child_sessions` gives. `parent_of` tells which
    session, run and call each one answered. Of a `LinkingStore` (every
    shipped store), reads only the sessions of the tree; of any other store,
    every session once, however deep the tree.

    Args:
        store: The store that holds them (a sub-agent's session is kept in
            its parent's store).
        session_id: The session whose descendants are wanted.
        depth: How many levels down (1: its children only; None: all).

    Raises:
        ConfigError: `depth` is not a whole number from 1 up (or None).
    """
    _checks.check(depth, "depth", _checks.integer(low=1, optional=True))
    return await read_descendants(store, session_id, {}, depth=depth)


async def read_descendants(
    store: SessionStore,
    session_id: str,
    known: dict[str, Session],
    *,
    depth: int | None = None,
) -> list[Session]:
    """`descendants`, reusing the sessions of `known` the store still holds as read.

    `known` (by id) is brought up to date: a session listed at another
    version is read again, one no longer listed dropped. A page that reads
    a store's sessions again and again reads only those that changed. Of a
    `LinkingStore`, only the sessions below `session_id` (and their
    callers) are read.
    """
    listed = {info.id: info for info in await store.list_sessions()}
    for gone in known.keys() - listed.keys():
        del known[gone]

    async def read(sid: str) -> Session:
        info = listed.get(sid)
        session = known.get(sid)
        if session is None or info is None or session.version != info.version:
            session = await Session.load(store, sid)
            if info is not None:
                known[sid] = session
        return session

    linked: dict[str, list[tuple[ParentLink, float, str]]] = {}
    if isinstance(store, LinkingStore):
        openings = await store.list_delegated()
        for sid, opened in openings.items():
            info = listed.get(sid)
            if opened.parent is None or info is None or info.problem is not None:
                continue
            if sid != session_id:
                found = (opened.parent, opened.at, sid)
                linked.setdefault(opened.parent.session_id, []).append(found)
    else:
        for info in listed.values():
            if info.id == session_id or info.problem is not None:
                continue
            session = await read(info.id)
            parent = parent_of(session)
            if parent is not None:
                at = session.runs[0].opened.at
                linked.setdefault(parent.session_id, []).append((parent, at, info.id))
    out: list[Session] = []
    seen = {session_id}
    level = [session_id]
    while level and (depth is None or depth > 0):
        below: list[str] = []
        for parent_id in level:
            children = linked.get(parent_id, [])
            if not children:
                continue
            caller = await read(parent_id)
            for child_id in _in_call_order(caller, children):
                if child_id not in seen:  # a damaged store's loop: listed once
                    seen.add(child_id)
                    out.append(await read(child_id))
                    below.append(child_id)
        level = below
        depth = None if depth is None else depth - 1
    return _preorder(session_id, out)


def _in_call_order(
    parent: Session, children: list[tuple[ParentLink, float, str]]
) -> list[str]:
    """`children` in the order `parent`'s log made their calls, then by opening."""
    order: dict[str, int] = {}
    for entry in parent.entries:
        if isinstance(entry, EventRecorded):
            for message in event_messages(entry.event):
                for call in message.tool_calls:
                    order.setdefault(call.id, len(order))
    late = len(order)
    ranked = sorted(children, key=lambda c: (order.get(c[0].call_id, late), c[1]))
    return [child_id for _link, _at, child_id in ranked]


def _preorder(root: str, found: list[Session]) -> list[Session]:
    """`found` (listed level by level) with each session before its children."""
    below: dict[str, list[Session]] = {}
    for session in found:
        link = parent_of(session)
        assert link is not None
        below.setdefault(link.session_id, []).append(session)
    out: list[Session] = []
    stack = list(reversed(below.get(root, [])))
    while stack:
        session = stack.pop()
        out.append(session)
        stack += reversed(below.get(session.id, []))
    return out
