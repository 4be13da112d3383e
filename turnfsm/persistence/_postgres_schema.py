"""The PostgreSQL store's schema: its version, its marker and its migrations."""

from __future__ import annotations

from typing import Final

__all__ = ["APPLICATION", "SCHEMA_VERSION", "_LOCK_CLASS", "_MIGRATIONS"]


SCHEMA_VERSION: Final = 1
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
}
