"""The SQLite store's blocking operations: its statements and the rows they move.

Each function runs on the store's connection, in a worker thread or inline
(`SQLiteStore._write`), as one transaction.
"""

from __future__ import annotations

import sqlite3
import time
from typing import Final

from turnfsm.errors import DuplicateRecord, SessionConflict
from turnfsm.persistence._records import Entry, RunOpened
from turnfsm.persistence._rows import (
    Row,
    column_text,
    column_value,
    counter_problem,
    decode_log,
    delegated_openings,
)
from turnfsm.persistence._sqlite_open import _roll_back, _transaction
from turnfsm.persistence._store import SessionInfo

__all__ = ["append", "delete", "list_delegated", "list_sessions", "load"]


def append(
    conn: sqlite3.Connection, key: str, session_id: str, rows: list[Row], expected: int
) -> int:
    """Append `rows` to the session held under `key` (see `SQLiteStore.append`)."""
    if not rows:
        # Nothing to write: the version is checked, and no row is made.
        found = conn.execute(_VERSION, (key,)).fetchone()
        actual = 0 if found is None else found[0]
        if actual != expected:
            raise SessionConflict(session_id, expected, actual)
        return expected
    version, now = expected + len(rows), time.time()
    conn.execute("BEGIN IMMEDIATE")
    try:
        # The version check is the write itself: the row moves to the new
        # version only if it is at the expected one.
        if conn.execute(_ADVANCE, (version, now, key, expected)).rowcount:
            pass
        elif (
            expected != 0
            or not conn.execute(_CREATE, (key, version, now, now)).rowcount
        ):
            found = conn.execute(_VERSION, (key,)).fetchone()
            raise SessionConflict(
                session_id=session_id,
                expected=expected,
                actual=0 if found is None else found[0],
            )
        conn.executemany(
            _ENTRY,
            [
                (key, expected + n, column_text(row.run_id), row.kind, row.body)
                for n, row in enumerate(rows)
            ],
        )
        messages = [
            (key, digest, body) for row in rows for digest, body in row.messages.items()
        ]
        if messages:
            conn.executemany(_MESSAGE, messages)
        for n, row in enumerate(rows):
            if row.key is not None:
                _insert_key(conn, key, session_id, row.key, expected + n)
        conn.execute("COMMIT")
    except BaseException:
        _roll_back(conn)
        raise
    return version


def load(conn: sqlite3.Connection, session_id: str) -> tuple[Entry, ...]:
    """Read and check the log of `session_id` (see `SQLiteStore.load`)."""
    key = column_text(session_id)
    # One read transaction: the counter, the entries and their messages
    # are one snapshot.
    with _transaction(conn, "BEGIN"):
        found = conn.execute(_VERSION, (key,)).fetchone()
        rows = conn.execute(_ENTRIES, (key,)).fetchall()
        messages = dict(conn.execute(_MESSAGES, (key,)).fetchall())
    if found is None and not rows:
        return ()
    # Decoded here, in the worker thread: a long log takes a while.
    return decode_log(
        session_id,
        [body for _, body in rows],
        messages,
        version=0 if found is None else found[0],
        seqs=[seq for seq, _ in rows],
    )


def list_sessions(conn: sqlite3.Connection) -> tuple[SessionInfo, ...]:
    """List the sessions, each with its problem if it has one."""
    infos = [
        SessionInfo(
            id=column_value(key),
            version=version,
            problem=counter_problem(version, 0 if last is None else last + 1),
            updated_at=updated,
        )
        for key, version, last, updated in conn.execute(_LIST)
        if version or last is not None
    ]
    return tuple(sorted(infos, key=lambda info: info.id))


def list_delegated(conn: sqlite3.Connection) -> dict[str, RunOpened]:
    """The openings of delegated first runs (see `SQLiteStore.list_delegated`)."""
    rows = conn.execute(_FIRST_RUNS).fetchall()
    return delegated_openings((key, body) for key, body, _seq in rows)


def delete(conn: sqlite3.Connection, key: str) -> bool:
    """Delete the session held under `key`, its rows and its lease."""
    with _transaction(conn, "BEGIN IMMEDIATE"):
        conn.execute(_DELETE_LEASE, (key,))
        cursor = conn.execute(_DELETE, (key,))
        return cursor.rowcount > 0


_VERSION: Final = "SELECT version FROM turnfsm_sessions WHERE id = ?"
# A first append (expected version 0) creates the session's row; a row that
# is there already at version 0 (an empty append of an older turnfsm made it)
# is advanced instead.
_CREATE: Final = (
    "INSERT OR IGNORE INTO turnfsm_sessions (id, version, created_at, updated_at)"
    " VALUES (?, ?, ?, ?)"
)
_ADVANCE: Final = (
    "UPDATE turnfsm_sessions SET version = ?, updated_at = ?"
    " WHERE id = ? AND version = ?"
)
_ENTRY: Final = (
    "INSERT INTO turnfsm_entries (session_id, seq, run_id, kind, body)"
    " VALUES (?, ?, ?, ?, ?)"
)
_MESSAGE: Final = (
    "INSERT OR IGNORE INTO turnfsm_messages (session_id, digest, body) VALUES (?, ?, ?)"
)
_KEY: Final = "INSERT INTO turnfsm_compactions (session_id, key, seq) VALUES (?, ?, ?)"
_ENTRIES: Final = (
    "SELECT seq, body FROM turnfsm_entries WHERE session_id = ? ORDER BY seq"
)
_MESSAGES: Final = "SELECT digest, body FROM turnfsm_messages WHERE session_id = ?"
# The last row's number comes from the primary key's index: listing stays
# cheap, and a counter that disagrees with the rows shows.
_LIST: Final = (
    "SELECT id, version,"
    " (SELECT max(seq) FROM turnfsm_entries e WHERE e.session_id = s.id),"
    " updated_at FROM turnfsm_sessions s"
)
# Each session's first run's opening: SQLite takes the bare column `body` from
# the row that holds the least `seq`.
_FIRST_RUNS: Final = (
    "SELECT session_id, body, min(seq) FROM turnfsm_entries"
    " WHERE kind = 'RunOpened' GROUP BY session_id"
)
_DELETE: Final = "DELETE FROM turnfsm_sessions WHERE id = ?"
_DELETE_LEASE: Final = "DELETE FROM turnfsm_leases WHERE session_id = ?"


def _insert_key(
    conn: sqlite3.Connection, key: str, session_id: str, record: str, seq: int
) -> None:
    try:
        conn.execute(_KEY, (key, column_text(record), seq))
    except sqlite3.IntegrityError:
        raise DuplicateRecord(session_id=session_id, key=record) from None
