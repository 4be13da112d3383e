"""Owner leases: which process holds a session, and whether it is still alive.

A run's owner (one process) holds a lease on its session in the store and
renews it while it works; a process that dies stops renewing, and its lease
expires `ttl` seconds after the last renewal. Another process can then tell
a live owner (wait for it) from a dead one (take its run over). A store that
keeps leases is a `LeasingStore`; one that does not still works, with claims
that hold only inside one process.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Protocol, final, runtime_checkable

import attrs

from turnfsm import _checks
from turnfsm.errors import DURABLE_OWNER, LeaseLost, SessionBusy

if TYPE_CHECKING:
    from turnfsm.persistence._session import Session

__all__ = ["Lease", "LeasingStore", "check_lease", "holder_of", "renewed", "taken"]

_ID = _checks.identifier()
_TTL = _checks.seconds("ttl", optional=False)


@final
@attrs.frozen(kw_only=True)
class Lease:
    """One owner's hold on a session, until it expires.

    Times are seconds since the epoch on the store's clock: the database
    server's for PostgreSQL (so hosts whose clocks disagree still agree on
    who holds what), this process's for SQLite and memory.

    Attributes:
        session_id: The session held.
        owner: Who holds it: any string naming the process (host, pid, a
            random part), the same for all of its renewals.
        since: When this owner took the session.
        expires_at: When the lease ends unless the owner renews it first.
    """

    session_id: str = attrs.field(validator=_ID)
    owner: str = attrs.field(validator=_ID)
    since: float = attrs.field(validator=_checks.number())
    expires_at: float = attrs.field(validator=_checks.number())


@runtime_checkable
class LeasingStore(Protocol):
    """A `SessionStore` that also keeps owner leases (optional).

    Each operation is atomic across every process that shares the store:
    of several owners acquiring one session's lease at once, exactly one
    gets it. A lease that was not renewed for `ttl` seconds has expired, and
    the next owner to acquire it takes it over.
    """

    async def acquire_lease(
        self, session_id: str, owner: str, *, ttl: float, force: bool = False
    ) -> Lease:
        """Take the lease on `session_id` for `owner`, for `ttl` seconds.

        It succeeds when nobody holds the session, when its lease has
        expired (taken over), or when `owner` holds it already (renewed,
        `since` kept). `force=True` also takes a live lease over: only when
        its owner is known to be gone.

        Raises:
            SessionBusy: another owner holds a live lease; its `owner`,
                `alive` and `since` say who and since when.
            ConfigError: a bad id, owner or `ttl`.
        """
        ...

    async def renew_lease(self, session_id: str, owner: str, *, ttl: float) -> Lease:
        """Extend `owner`'s lease on `session_id` to `ttl` seconds from now.

        Raises:
            LeaseLost: the lease is no longer `owner`'s (it expired and
                another owner took it over, or it was released). Its
                ``holder`` is who holds it now, never `owner` itself: a
                lease `owner` took again meanwhile is renewed.
            ConfigError: a bad id, owner or `ttl`.
        """
        ...

    async def release_lease(self, session_id: str, owner: str) -> None:
        """Let go of `owner`'s lease on `session_id` (nothing if not held by it)."""
        ...

    async def lease_of(self, session_id: str) -> Lease | None:
        """Return the lease on `session_id` (perhaps expired), or None."""
        ...


_FORCE = _checks.boolean("force")


def check_lease(owner: object, ttl: object = 1.0, force: object = False) -> None:
    """Raise `ConfigError` unless a lease operation's owner and options are usable.

    (The session id is checked as every store checks it: `check_session_id`.)
    """
    _checks.check(owner, "owner", _ID)
    _checks.check(ttl, "ttl", _TTL)
    _checks.check(force, "force", _FORCE)


def taken(
    current: Lease | None,
    session_id: str,
    owner: str,
    *,
    now: float,
    ttl: float,
    force: bool,
) -> Lease:
    """Return the lease `owner` holds after acquiring it over `current`.

    The rule every store applies (PostgreSQL in its statement).

    Raises:
        SessionBusy: another owner's lease is live and `force` is False.
    """
    if current is not None and current.owner == owner:
        since = current.since
    elif current is None or current.expires_at <= now or force:
        since = now
    else:
        raise SessionBusy(
            session_id,
            owner=current.owner,
            alive=True,
            since=current.since,
            until=current.expires_at,
        )
    return Lease(session_id=session_id, owner=owner, since=since, expires_at=now + ttl)


def renewed(
    current: Lease | None, session_id: str, owner: str, *, now: float, ttl: float
) -> Lease:
    """Return `owner`'s lease renewed for `ttl` seconds from `now`.

    A lease that expired but that nobody took over is still its owner's.

    Raises:
        LeaseLost: `current` is not `owner`'s.
    """
    if current is None or current.owner != owner:
        raise LeaseLost(session_id, owner, None if current is None else current.owner)
    return attrs.evolve(current, expires_at=now + ttl)


async def holder_of(session: Session, store: object) -> SessionBusy | None:
    """Who holds `session` while a run of it is open: a live run, a workflow.

    None when no run is open, the store keeps no leases, no lease is held,
    or its holder's lease expired (resume and abandon take the run over);
    a durable run's workflow holds its session even past its lease.
    """
    if not session.open_runs() or not isinstance(store, LeasingStore):
        return None
    lease = await store.lease_of(session.id)
    if lease is None:
        return None
    alive = lease.expires_at > time.time()
    if not alive and not lease.owner.startswith(DURABLE_OWNER):
        return None  # its process is gone: resume and abandon take it over
    return SessionBusy(
        session.id,
        session.open_runs()[-1].run_id,
        owner=lease.owner,
        alive=True,
        since=lease.since,
        until=lease.expires_at,
    )
