"""The PostgreSQL store's schema: its version, its marker and its migrations."""

from __future__ import annotations

from typing import Final

import psycopg

from turnfsm.errors import StoreUnusable
from turnfsm.persistence._postgres_append import _Conn
from turnfsm.persistence._postgres_run import refusal

__all__ = ["APPLICATION", "SCHEMA_VERSION", "_LOCK_CLASS", "_MIGRATIONS", "migrate"]


SCHEMA_VERSION: Final = 3
"""The schema version this turnfsm writes (and the newest it can read)."""

APPLICATION: Final = "turnfsm"
"""The value of the ``application`` marker in ``turnfsm_meta``."""

# pg_advisory_xact_lock(classid, objid): turnfsm's class, then the schema.
_LOCK_CLASS: Final = 0x7466736D  # "tfsm"

_MIGRATIONS: Final[dict[int, tuple[str, ...]]] = {
    1: (
        """CREATE TABLE turnfsm_sessions (
            id TEXT PRIMARY KEY,
            version BIGINT NOT NULL,
            created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
            updated_at TIMESTAMPTZ NOT NULL DEFAULT now())""",
        """CREATE TABLE turnfsm_entries (
            session_id TEXT NOT NULL REFERENCES turnfsm_sessions (id)
                ON DELETE CASCADE,
            seq BIGINT NOT NULL,
            run_id TEXT NOT NULL,
            kind TEXT NOT NULL,
            body TEXT NOT NULL,
            PRIMARY KEY (session_id, seq))""",
        """CREATE TABLE turnfsm_messages (
            session_id TEXT NOT NULL REFERENCES turnfsm_sessions (id)
                ON DELETE CASCADE,
            digest TEXT NOT NULL,
            body TEXT NOT NULL,
            PRIMARY KEY (session_id, digest))""",
        """CREATE TABLE turnfsm_compactions (
            session_id TEXT NOT NULL REFERENCES turnfsm_sessions (id)
                ON DELETE CASCADE,
            key TEXT NOT NULL,
            seq BIGINT NOT NULL,
            UNIQUE (session_id, key))""",
    ),
    2: (
        # Owner leases, timed by the server's clock. No reference to the
        # session: a run takes the lease before its first append creates it.
        """CREATE TABLE turnfsm_leases (
            session_id TEXT PRIMARY KEY,
            owner TEXT NOT NULL,
            since TIMESTAMPTZ NOT NULL,
            expires_at TIMESTAMPTZ NOT NULL)""",
    ),
    3: (
        # No foreign keys: an append inserts rows only for the session row
        # it has just moved on (or made), so they cannot dangle, and checking
        # them cost the server about 15-20 µs an append. Deleting
        # a session deletes its rows itself (`delete_session`).
        "ALTER TABLE turnfsm_entries"
        " DROP CONSTRAINT IF EXISTS turnfsm_entries_session_id_fkey",
        "ALTER TABLE turnfsm_messages"
        " DROP CONSTRAINT IF EXISTS turnfsm_messages_session_id_fkey",
        "ALTER TABLE turnfsm_compactions"
        " DROP CONSTRAINT IF EXISTS turnfsm_compactions_session_id_fkey",
    ),
}


async def migrate(conn: _Conn, server: str) -> None:
    """Create or migrate the schema, in one transaction under an advisory lock.

    A schema that is already current is only read: a user who may use the
    tables but not create any (the tables made by their owner) opens it.

    Raises:
        StoreUnusable: the tables are another application's, the schema is
            newer than this turnfsm, or the tables must be made (or
            migrated) and the user may not; nothing was changed.
    """
    creating: list[bool] = []  # set once it creates or alters a table
    try:
        async with conn.transaction():
            await _migrate(conn, server, creating)
    except psycopg.errors.InsufficientPrivilege as exc:
        raise await refusal(conn, server, exc, creating=bool(creating)) from None


async def _migrate(conn: _Conn, server: str, creating: list[bool]) -> None:
    await conn.execute(
        "SELECT pg_advisory_xact_lock(%s, hashtext(current_schema()))",
        (_LOCK_CLASS,),
    )
    cur = await conn.execute(
        "SELECT current_schema(), current_setting('search_path'),"
        " EXISTS (SELECT 1 FROM pg_tables"
        " WHERE schemaname = current_schema() AND tablename = 'turnfsm_meta')"
    )
    row = await cur.fetchone()
    if row is not None and row[0] is None:
        raise StoreUnusable(
            server,
            f"no schema its search_path names exists (search_path={row[1]!r}): "
            "create the schema (CREATE SCHEMA), or name an existing one in the "
            "URL (options=-csearch_path=SCHEMA)",
        )
    if not (row and row[2]):
        creating.append(True)
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS turnfsm_meta"
            " (key TEXT PRIMARY KEY, value TEXT NOT NULL)"
        )
    cur = await conn.execute("SELECT key, value FROM turnfsm_meta")
    meta = {str(k): str(v) for k, v in await cur.fetchall()}
    if meta and meta.get("application") != APPLICATION:
        raise StoreUnusable(
            server,
            "its turnfsm_meta table belongs to another application"
            f" ({meta.get('application')!r}); use another database or schema",
        )
    version = _version_of(meta, server)
    if version > SCHEMA_VERSION:
        raise StoreUnusable(
            server,
            f"its schema version {version} is newer than this turnfsm"
            f" knows ({SCHEMA_VERSION}); upgrade turnfsm to use it",
        )
    if version < SCHEMA_VERSION:
        creating.append(True)
    for step in range(version + 1, SCHEMA_VERSION + 1):
        for statement in _MIGRATIONS[step]:
            await conn.execute(statement)
    if version < SCHEMA_VERSION:
        await conn.execute(
            "INSERT INTO turnfsm_meta (key, value) VALUES"
            " ('application', %s), ('schema_version', %s)"
            " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (APPLICATION, str(SCHEMA_VERSION)),
        )


def _version_of(meta: dict[str, str], server: str) -> int:
    """The schema version `meta` holds (0: no table was made yet).

    Raises:
        StoreUnusable: turnfsm's marker is there but no version is, or one
            that is not a number.
    """
    if not meta:
        return 0
    found = meta.get("schema_version")
    if found is None:
        raise StoreUnusable(server, "its turnfsm_meta has no schema_version")
    try:
        return int(found)
    except ValueError:
        raise StoreUnusable(
            server,
            f"its turnfsm_meta has a schema_version that is not a number: {found!r}",
        ) from None
