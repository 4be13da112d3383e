"""The PostgreSQL store's owner leases, timed by the server's clock (``now()``).

Acquiring is one statement: an upsert that takes the row only when it is
free, expired, already the owner's, or forced. When it does not, the row
stays locked by it until the transaction ends, so the holder read next in
the same transaction is the one that refused it. Hosts whose clocks
disagree still agree on who holds what: only the server's clock counts.
"""

from __future__ import annotations

from typing import Final

from turnfsm.errors import LeaseLost, SessionBusy
from turnfsm.persistence._lease import Lease
from turnfsm.persistence._postgres_append import _Conn, _Step
from turnfsm.persistence._rows import column_text, column_value

__all__ = ["acquire", "lease_of", "release", "renew"]

_EPOCHS: Final = (
    "extract(epoch FROM since)::float8, extract(epoch FROM expires_at)::float8"
)
_ACQUIRE: Final = f"""
INSERT INTO turnfsm_leases AS l (session_id, owner, since, expires_at)
VALUES (%(session)s, %(owner)s, now(), now() + make_interval(secs => %(ttl)s))
ON CONFLICT (session_id) DO UPDATE SET
    owner = excluded.owner,
    since = CASE WHEN l.owner = excluded.owner THEN l.since ELSE excluded.since END,
    expires_at = excluded.expires_at
WHERE l.owner = excluded.owner OR l.expires_at <= now() OR %(force)s
RETURNING {_EPOCHS}"""
_HOLDER: Final = (
    "SELECT owner, extract(epoch FROM since)::float8, expires_at > now(),"
    " extract(epoch FROM expires_at)::float8"
    " FROM turnfsm_leases WHERE session_id = %s"
)
_RENEW: Final = f"""
UPDATE turnfsm_leases SET expires_at = now() + make_interval(secs => %(ttl)s)
WHERE session_id = %(session)s AND owner = %(owner)s
RETURNING {_EPOCHS}"""
_RELEASE: Final = "DELETE FROM turnfsm_leases WHERE session_id = %s AND owner = %s"
_GET: Final = f"SELECT owner, {_EPOCHS} FROM turnfsm_leases WHERE session_id = %s"


async def acquire(
    conn: _Conn, step: _Step, session_id: str, owner: str, ttl: float, force: bool
) -> Lease:
    """Take the lease (see `LeasingStore.acquire_lease`), in one transaction."""
    params = {
        "session": column_text(session_id),
        "owner": column_text(owner),
        "ttl": float(ttl),
        "force": force,
    }
    async with conn.transaction():
        cur = await conn.execute(_ACQUIRE, params)
        row = await cur.fetchone()
        if row is None:
            cur = await conn.execute(_HOLDER, (params["session"],))
            holder = await cur.fetchone()
            if holder is not None:
                raise SessionBusy(
                    session_id,
                    owner=column_value(str(holder[0])),
                    alive=bool(holder[2]),
                    since=float(holder[1]),
                    until=float(holder[3]),
                )
            raise AssertionError("a refused lease has a holder")  # pragma: no cover
        step.committing = True
    return Lease(session_id=session_id, owner=owner, since=row[0], expires_at=row[1])


async def renew(
    conn: _Conn, step: _Step, session_id: str, owner: str, ttl: float
) -> Lease:
    """Extend the lease (see `LeasingStore.renew_lease`), in one transaction."""
    params = {
        "session": column_text(session_id),
        "owner": column_text(owner),
        "ttl": float(ttl),
    }
    async with conn.transaction():
        cur = await conn.execute(_RENEW, params)
        row = await cur.fetchone()
        if row is None:
            cur = await conn.execute(_HOLDER, (params["session"],))
            holder = await cur.fetchone()
            taker = None if holder is None else column_value(str(holder[0]))
            if taker == owner:
                # The owner took the lease again meanwhile (another of its
                # calls, committed between the two statements): renew that.
                cur = await conn.execute(_RENEW, params)
                row = await cur.fetchone()
            if row is None:  # and let go again since: nobody holds it
                raise LeaseLost(session_id, owner, None if taker == owner else taker)
        step.committing = True
    return Lease(session_id=session_id, owner=owner, since=row[0], expires_at=row[1])


async def release(conn: _Conn, step: _Step, session_id: str, owner: str) -> None:
    """Drop `owner`'s lease, if it holds it (see `LeasingStore.release_lease`)."""
    await conn.execute(_RELEASE, (column_text(session_id), column_text(owner)))


async def lease_of(conn: _Conn, step: _Step, session_id: str) -> Lease | None:
    """Return the stored lease (see `LeasingStore.lease_of`)."""
    cur = await conn.execute(_GET, (column_text(session_id),))
    row = await cur.fetchone()
    if row is None:
        return None
    return Lease(
        session_id=session_id,
        owner=column_value(str(row[0])),
        since=row[1],
        expires_at=row[2],
    )
