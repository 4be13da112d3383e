"""The SQLite store's owner leases: one row per held session, on this host's clock.

Each operation is one ``BEGIN IMMEDIATE`` transaction: it holds the file's
write lock from its read to its write, so of several processes acquiring
one lease at once exactly one finds it free.
"""

from __future__ import annotations

import sqlite3
import time
from typing import Final

from turnfsm.persistence._lease import Lease, renewed, taken
from turnfsm.persistence._rows import column_text, column_value
from turnfsm.persistence._sqlite_open import LEASES_SINCE, SCHEMA_VERSION, _transaction

__all__ = ["acquire", "lease_of", "release", "renew"]

_GET: Final = "SELECT owner, since, expires_at FROM turnfsm_leases WHERE session_id = ?"
_PUT: Final = (
    "INSERT OR REPLACE INTO turnfsm_leases (session_id, owner, since, expires_at)"
    " VALUES (?, ?, ?, ?)"
)
_DROP: Final = "DELETE FROM turnfsm_leases WHERE session_id = ? AND owner = ?"


def _get(conn: sqlite3.Connection, session_id: str) -> Lease | None:
    row = conn.execute(_GET, (column_text(session_id),)).fetchone()
    if row is None:
        return None
    owner, since, expires_at = row
    return Lease(
        session_id=session_id,
        owner=column_value(owner),
        since=since,
        expires_at=expires_at,
    )


def _put(conn: sqlite3.Connection, lease: Lease) -> None:
    conn.execute(
        _PUT,
        (
            column_text(lease.session_id),
            column_text(lease.owner),
            lease.since,
            lease.expires_at,
        ),
    )


def acquire(
    conn: sqlite3.Connection, session_id: str, owner: str, ttl: float, force: bool
) -> Lease:
    """Take the lease (see `LeasingStore.acquire_lease`), in one transaction."""
    with _transaction(conn, "BEGIN IMMEDIATE"):
        lease = taken(
            _get(conn, session_id),
            session_id,
            owner,
            now=time.time(),
            ttl=ttl,
            force=force,
        )
        _put(conn, lease)
    return lease


def renew(conn: sqlite3.Connection, session_id: str, owner: str, ttl: float) -> Lease:
    """Extend the lease (see `LeasingStore.renew_lease`), in one transaction."""
    with _transaction(conn, "BEGIN IMMEDIATE"):
        lease = renewed(
            _get(conn, session_id), session_id, owner, now=time.time(), ttl=ttl
        )
        _put(conn, lease)
    return lease


def release(conn: sqlite3.Connection, session_id: str, owner: str) -> None:
    """Drop `owner`'s lease, if it holds it (see `LeasingStore.release_lease`)."""
    with _transaction(conn, "BEGIN IMMEDIATE"):
        conn.execute(_DROP, (column_text(session_id), column_text(owner)))


def lease_of(conn: sqlite3.Connection, session_id: str) -> Lease | None:
    """Return the stored lease (see `LeasingStore.lease_of`).

    A file of an older schema, read as it is, holds none.
    """
    if getattr(conn, "schema_version", SCHEMA_VERSION) < LEASES_SINCE:
        return None
    with _transaction(conn, "BEGIN"):
        return _get(conn, session_id)
