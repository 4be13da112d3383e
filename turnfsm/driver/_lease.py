"""Holding a session's owner lease while a run works on it.

A run on a session in a store shared by several processes (SQLite,
PostgreSQL: a `LeasingStore`) holds the session's lease from its start to its
end and renews it in the background, every third of its time to live, so
that another process can tell a live owner (wait for it) from a dead one
(take its run over). A `MemoryStore` lives in one process: its sessions are
held by the process-local claim alone.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import AsyncIterator
from typing import Final, final

import anyio
import attrs

from turnfsm.driver._store_calls import read_session, store_call
from turnfsm.errors import LeaseLost, SessionBusy, SessionConflict
from turnfsm.persistence import (
    Lease,
    LeasingStore,
    MemoryStore,
    Session,
    store_label,
)

__all__ = ["confirm", "holding", "lease_owner", "owner_id", "worked_on_here"]

logger = logging.getLogger("turnfsm.driver")

_TOKEN: Final = uuid.uuid4().hex[:8]

_clock = time.monotonic  # when a lease was renewed, as this process counts


@attrs.define(eq=False)
class _Hold:
    """A run's hold on its session's lease, as this process last knew it."""

    store: LeasingStore
    owner: str
    ttl: float
    store_timeout: float | None
    renewed: float  # _clock() when the last renewal that held was sent
    done: anyio.Event = attrs.field(factory=anyio.Event)  # the run let go
    renewing: bool = False  # a renewal is under way


# The holds of the runs under way in this process, by their session view.
_HOLDS: Final[dict[int, _Hold]] = {}

# The sessions runs of this process work on now, whatever view each has, and
# how many: by (id of the MemoryStore, session id), or (the store's label,
# session id) for a store with leases. Two runs that found a lease free at
# the same moment both take it (it is this process's either way): the last
# of them to end lets it go.
_RUNNING: Final[dict[tuple[int | str, str], int]] = {}


async def confirm(session: Session) -> None:
    """Make sure `session`'s run still holds its lease before it writes.

    Free while the lease was renewed within half its time to live (the
    background renewal keeps it so). Past that (this process stalled: paused,
    swapped out, suspended), the lease may have expired and another process
    taken the session over: it is renewed first, so the run writes nothing
    into a session that is no longer its own.

    Raises:
        LeaseLost: another process took the session over; nothing is written.
    """
    hold = _HOLDS.get(id(session))
    if hold is None or _clock() - hold.renewed < hold.ttl / 2:
        return
    await _renew_once(session, hold)


def worked_on_here(session: Session) -> bool:
    """Whether a run of this process works on `session` now, through any view."""
    store = session.store
    held = isinstance(store, MemoryStore) or _leasing(session) is not None
    return held and _key(store, session.id) in _RUNNING


def _key(store: object, session_id: str) -> tuple[int | str, str]:
    """A session's key among the runs of this process (`_RUNNING`).

    A `MemoryStore`'s sessions by the store's identity, a shared store's by
    its label (one file or database, however many objects open it).
    """
    if isinstance(store, MemoryStore):
        return (id(store), session_id)
    return (store_label(store), session_id)


def owner_id() -> str:
    """This process's name as a lease owner: ``host:pid:token``."""
    return f"{socket.gethostname()}:{os.getpid()}:{_TOKEN}"


def _leasing(session: Session) -> LeasingStore | None:
    """`session`'s store, if its sessions have leases (None: a one-process store)."""
    store = session.store
    if isinstance(store, MemoryStore) or not isinstance(store, LeasingStore):
        return None
    return store


async def lease_owner(session: Session, store_timeout: float | None) -> str | None:
    """Return who holds `session`'s lease now (None: nobody, or no leases).

    The store may take `store_timeout` seconds (`store_call`).
    """
    store = _leasing(session)
    if store is None:
        return None
    lease = await store_call(
        store.lease_of(session.id),
        seconds=store_timeout,
        store=store,
        method="lease_of",
    )
    return lease.owner if lease is not None else None


def holding(
    session: Session, *, ttl: float, store_timeout: float | None, force: bool = False
) -> contextlib.AbstractAsyncContextManager[Lease | None]:
    """Hold `session`'s lease while the body runs; yield the lease it replaced.

    The lease it replaced is the previous owner's (None: nobody held it, or
    this process did): expired, or taken over by `force`. Each call to the
    store may take `store_timeout` seconds (`store_call`).

    Raises:
        SessionBusy: another process holds a live lease (not with `force`),
            or a run of this process works on the session now (through
            another view; `force` or not).
        StoreUnusable: the store did not answer within `store_timeout`.
    """
    store = session.store
    if isinstance(store, MemoryStore):  # one process: the claim here is the hold
        return _HeldHere(_key(store, session.id))
    leasing = _leasing(session)
    if leasing is None:
        return _NOT_HELD
    return _holding(session, leasing, ttl, store_timeout, force)


@final
class _HeldHere:
    """`holding` for a `MemoryStore`: `_running_here` around the body, no lease.

    A class, not a generator: every run on an in-memory session enters it.
    """

    __slots__ = ("_here",)

    def __init__(self, key: tuple[int | str, str]) -> None:
        self._here = _running_here(key)

    async def __aenter__(self) -> None:
        self._here.__enter__()

    async def __aexit__(self, *_exc: object) -> None:
        self._here.__exit__()


_NOT_HELD: Final = contextlib.nullcontext(None)
"""`holding` for a store that is no `LeasingStore`: nothing to hold."""


@contextlib.asynccontextmanager
async def _holding(
    session: Session,
    store: LeasingStore,
    ttl: float,
    store_timeout: float | None,
    force: bool,
) -> AsyncIterator[Lease | None]:
    """`holding` for a `LeasingStore`: its lease, renewed while the body runs."""
    owner = owner_id()
    session_id = session.id
    previous = await store_call(
        store.lease_of(session_id),
        seconds=store_timeout,
        store=store,
        method="lease_of",
    )
    ours = previous is not None and previous.owner == owner
    key = _key(store, session_id)
    with _running_here(key, busy=ours):
        async with _held(session, store, key, owner, ttl, store_timeout, force):
            yield None if ours else previous


@final
class _running_here:
    """Count session `key` as worked on by a run of this process in the body.

    Raises:
        SessionBusy: `busy` and a run of this process works on it now,
            through another view (a second handler of a web process): the
            two would carry one run on twice, or each commit over the other.
            No `force` takes it over: this process is not gone.
    """

    __slots__ = ("_busy", "_key")

    def __init__(self, key: tuple[int | str, str], *, busy: bool = True) -> None:
        self._key = key
        self._busy = busy

    def __enter__(self) -> None:
        key = self._key
        if self._busy and key in _RUNNING:
            raise SessionBusy(key[1])
        _RUNNING[key] = _RUNNING.get(key, 0) + 1

    def __exit__(self, *_exc: object) -> None:
        key = self._key
        left = _RUNNING.pop(key) - 1
        if left:
            _RUNNING[key] = left


@contextlib.asynccontextmanager
async def _held(
    session: Session,
    store: LeasingStore,
    key: tuple[int | str, str],
    owner: str,
    ttl: float,
    store_timeout: float | None,
    force: bool,
) -> AsyncIterator[None]:
    """Hold `session`'s lease for `owner` while the body runs, renewing it.

    `key` is the session's among the runs of this process (`_running_here`,
    this run counted): the last of them to end lets the lease go.
    """
    session_id = session.id
    sent = _clock()
    await store_call(
        store.acquire_lease(session_id, owner, ttl=ttl, force=force),
        seconds=store_timeout,
        store=store,
        method="acquire_lease",
        writes=True,
    )
    session.hold_lost(None)
    hold = _Hold(store, owner, ttl, store_timeout, sent)
    _HOLDS[id(session)] = hold
    try:
        try:
            async with anyio.create_task_group() as group:
                group.start_soon(_renew, session, hold)
                try:
                    yield
                finally:
                    # The renewal ends on its own between two renewals: a
                    # cancelled task keeps its frame (the session and its
                    # store) in a reference cycle on asyncio, until the
                    # garbage collector's next full pass finds it.
                    hold.done.set()
                    if hold.renewing:
                        group.cancel_scope.cancel()
        except BaseExceptionGroup as raised:
            # One failure (the run's) surfaces as itself, as it would unleased;
            # so does a lost lease that the renewal and the run's own check
            # both found (one loss, told twice).
            first = raised.exceptions[0]
            if len(raised.exceptions) == 1 or all(
                isinstance(e, LeaseLost) for e in raised.exceptions
            ):
                raise first from None
            raise
    except SessionConflict as conflict:
        if _RUNNING[key] > 1:
            # Another run of this process, on another view of the session,
            # opened first: it is busy, not changed by someone else.
            raise SessionBusy(session_id) from conflict
        # Another process appended first: if it took the lease over (this
        # process stalled past its lease), the run lost the session. A log
        # found empty was removed (it says so itself).
        lost = (
            await _lost(session, store, owner, store_timeout)
            if conflict.actual
            else None
        )
        if lost is None:
            raise
        session.hold_lost(lost)
        logger.error("run stopped: %s", lost)
        raise lost from conflict
    finally:
        if _HOLDS.get(id(session)) is hold:
            del _HOLDS[id(session)]
        if _RUNNING[key] == 1:  # no other run of this process holds it
            with anyio.CancelScope(shield=True):
                try:
                    await store_call(
                        store.release_lease(session_id, owner),
                        seconds=store_timeout,
                        store=store,
                        method="release_lease",
                        writes=True,
                    )
                except Exception:  # the store is down: the lease expires by itself
                    logger.warning(
                        "could not release the lease on session %r (its store "
                        "failed): other processes find the session held by %r until "
                        "the lease runs out, %g s after its last renewal (lease_ttl)",
                        session_id,
                        owner,
                        ttl,
                    )


async def _lost(
    session: Session, store: LeasingStore, owner: str, store_timeout: float | None
) -> LeaseLost | None:
    """`LeaseLost` if `owner` holds `session`'s lease no more (None: it does).

    Another process appended to the session: one that holds the lease now
    took it over, and one that holds it no more (a forced `abandon`, which
    releases it when done) took it over and ended the run. The store being
    down is no news here: the caller's error stands.
    """
    with anyio.CancelScope(shield=True):
        try:
            lease = await store_call(
                store.lease_of(session.id),
                seconds=store_timeout,
                store=store,
                method="lease_of",
            )
        except Exception:
            return None
    if lease is not None and lease.owner == owner:
        return None
    return LeaseLost(session.id, owner, None if lease is None else lease.owner)


async def _renew_once(session: Session, hold: _Hold) -> None:
    """Renew the lease once; note when (see `confirm`).

    Raises:
        LeaseLost: another process took the session over (the view then
            refuses every append).
        Exception: the store failed (the caller decides).
    """
    sent = _clock()
    try:
        await store_call(
            hold.store.renew_lease(session.id, hold.owner, ttl=hold.ttl),
            seconds=hold.store_timeout,
            store=hold.store,
            method="renew_lease",
            writes=True,
        )
    except LeaseLost as lost:
        if lost.holder == hold.owner:
            # A store read who holds it after another call of this process
            # took it back: held, not lost.
            pass
        elif lost.holder is not None or not await _taken_back(session, hold):
            session.hold_lost(lost)
            logger.error("run stopped: %s", lost)
            raise
    hold.renewed = max(hold.renewed, sent)


async def _taken_back(session: Session, hold: _Hold) -> bool:
    """Take back a lease nobody holds, if the log is still where the run left it.

    While this process stalled past its lease, another may have asked for the
    session, taken the expired lease, been refused (the run is open) and let
    it go, writing nothing: the run goes on. If the log moved, another
    process carried the session on (or removed it): the run is over.

    Raises:
        Exception: the store failed (the caller decides).
    """
    try:
        await store_call(
            hold.store.acquire_lease(session.id, hold.owner, ttl=hold.ttl),
            seconds=hold.store_timeout,
            store=hold.store,
            method="acquire_lease",
            writes=True,
        )
    except SessionBusy:  # another process holds it now
        return False
    stored = await read_session(session.store, session.id, seconds=hold.store_timeout)
    return stored.version == session.version


async def _renew(session: Session, hold: _Hold) -> None:
    """Renew the lease every third of its time to live until the run lets go.

    Raises:
        LeaseLost: another process took the session over. The run stops
            (the error cancels it), and its session view writes nothing
            more: the other process carries the session on.
    """
    while True:
        with anyio.move_on_after(hold.ttl / 3):
            await hold.done.wait()
        if hold.done.is_set():
            return
        hold.renewing = True
        try:
            await _renew_once(session, hold)
        except LeaseLost:
            raise
        except Exception:  # the store is down for a moment: try again later
            logger.warning("could not renew the lease on %s", session.id)
        finally:
            hold.renewing = False
