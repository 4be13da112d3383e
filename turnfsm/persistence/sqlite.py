"""`SQLiteStore`: session logs in one SQLite file (the CLI's default store).

Theory of operation:

- One file, in WAL mode: readers never block the writer, and several
  processes (each with its own `SQLiteStore`) can share the file. A writer
  that finds the file locked waits up to `busy_timeout` seconds.
- An append is one ``BEGIN IMMEDIATE`` transaction: it takes the write lock
  first, then moves the session's version only if it is the expected one
  (the check is the ``UPDATE ... WHERE version = ?`` itself). A log at
  another version raises `SessionConflict` and nothing is written, so two
  writers on one session can never interleave (DESIGN §4).
- Rows are `turnfsm.persistence._rows.encode`'s: an entry's body refers to
  its messages by digest, and each distinct message is stored once per
  session (``INSERT OR IGNORE``), however many events carry it again.
- The schema is versioned in ``turnfsm_meta`` and grows by migrations,
  applied in one transaction. A file that is not SQLite, another
  application's database or a newer schema raises `StoreUnusable` before
  anything is written to it.
- No write ever waits on the event loop. A write first tries the file's
  lock without waiting (the connection's busy timeout is 0) and, when it is
  free, commits right away, inline: that costs less than handing the call
  to a thread. When another process holds the lock, the write is retried in
  a worker thread (`anyio.to_thread.run_sync`) that waits up to
  `busy_timeout`; reads always run there. One connection serves the store;
  a `threading.Lock` keeps its calls one at a time (an anyio
  `CapacityLimiter` belongs to one event loop, and `Agent.run_sync` opens a
  new loop per call). Each call is a whole transaction, and the wait for a
  write is shielded: a cancelled caller never leaves a transaction
  half-done, and learns of an append that committed.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Final, Literal, TypeVar, final

import anyio
import anyio.to_thread
import attrs

from turnfsm import _checks
from turnfsm.errors import (
    ConfigError,
    DuplicateRecord,
    SessionConflict,
    StoreUnusable,
)
from turnfsm.persistence._records import Entry
from turnfsm.persistence._rows import Row, decode, encode
from turnfsm.persistence._sqlite_open import (
    SCHEMA_VERSION,
    _open,
    _roll_back,
    _transaction,
)
from turnfsm.persistence._store import SessionInfo, check_session_id

__all__ = ["SCHEMA_VERSION", "SQLiteStore"]

T = TypeVar("T")


def _to_path(value: object) -> Path:
    if isinstance(value, str | os.PathLike) and str(value).strip():
        return Path(value)
    raise ConfigError("path", value, "a file path (a str or os.PathLike)")


_check_synchronous = _checks.one_of(("NORMAL", "FULL"), "synchronous")
_check_timeout = _checks.number(
    "busy_timeout", low=0, expected="a finite number of seconds >= 0"
)


@final
@attrs.define(eq=False)
class SQLiteStore:
    """Session logs in one SQLite file: embedded, WAL, safe across processes.

    Opening creates the file (and its schema) if it does not exist, and
    migrates an older turnfsm schema. Close it with ``await store.close()``
    or use it as ``async with SQLiteStore(path) as store:``; a store dropped
    unclosed closes its connection when it is collected.

    Example:
        ```python
        async with SQLiteStore("sessions.db") as store:
            agent = Agent(model=model, store=store)
            result = await agent.run("hello")
        # later, in any process:
        session = await Session.load(SQLiteStore("sessions.db"), result.session_id)
        ```

    Attributes:
        path: The database file.
        synchronous: ``"NORMAL"`` (the default: a commit survives a crash of
            the process; a power cut may lose the last commits, never
            corrupt the file) or ``"FULL"`` (every commit is on disk).
        busy_timeout: Seconds to wait for another writer's lock.

    Raises:
        StoreUnusable: the file is not an SQLite database, is another
            application's, or has a schema newer than this turnfsm knows;
            it was not changed.
        ConfigError: an option is out of range.
    """

    path: Path = attrs.field(converter=_to_path)
    synchronous: Literal["NORMAL", "FULL"] = attrs.field(
        default="NORMAL", kw_only=True, validator=_check_synchronous
    )
    busy_timeout: float = attrs.field(
        default=5.0, kw_only=True, validator=_check_timeout
    )
    _conn: sqlite3.Connection = attrs.field(init=False, repr=False)
    _lock: threading.Lock = attrs.field(init=False, repr=False, factory=threading.Lock)

    def __attrs_post_init__(self) -> None:
        self._conn = _open(self.path, self.synchronous, self.busy_timeout)
        # A store dropped without close() still closes its connection.
        weakref.finalize(self, self._conn.close)

    # -- SessionStore --------------------------------------------------
    async def append(
        self, session_id: str, entries: Sequence[Entry], *, expected_version: int
    ) -> int:
        """Append `entries` if the log is at `expected_version` (see `SessionStore`).

        Raises:
            SessionConflict: the log is at another version; nothing was written.
            DuplicateRecord: a compaction record's key is already stored;
                nothing was written.
            StoreUnusable: the file could not be written (locked by another
                writer for longer than `busy_timeout`, a full disk); nothing
                was written.
            ConfigError: `session_id` is not a usable id.
        """
        check_session_id(session_id)
        rows = [encode(entry) for entry in entries]
        return await self._write(self._append, session_id, rows, expected_version)

    async def load(self, session_id: str) -> tuple[Entry, ...]:
        """Return every entry of `session_id`, oldest first (empty if unknown).

        Raises:
            CorruptRecord: a stored row does not read back as an entry.
        """
        return await self._read(self._load, session_id)

    async def list_sessions(self) -> tuple[SessionInfo, ...]:
        """Return every session, sorted by id."""
        return await self._read(self._list)

    # -- beyond the protocol -------------------------------------------
    async def delete_session(self, session_id: str) -> bool:
        """Delete `session_id` and all its entries; return whether it existed.

        The log is otherwise never rewritten: this is for ``turnfsm sessions
        rm``, which asks first.
        """
        return await self._write(self._delete, session_id)

    async def close(self) -> None:
        """Close the connection (the file stays; reopen it with a new store).

        The last connection to close folds the write-ahead log back into the
        file, which takes a moment: it runs in a worker thread, shielded.
        """
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(self._close)

    def _close(self) -> None:
        with self._lock:
            self._conn.close()

    async def __aenter__(self) -> SQLiteStore:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # -- running the blocking calls ------------------------------------
    async def _write(self, fn: Callable[..., T], *args: object) -> T:
        # The fast path: nobody holds the file's write lock (the connection's
        # busy timeout is 0, so SQLite says so at once instead of waiting), and
        # the transaction runs right here: a hand-off to a worker thread costs
        # more than the whole commit (measured: ~130 us vs ~45 us). It has no
        # await, so it cannot be cancelled halfway.
        if self._lock.acquire(blocking=False):
            try:
                return self._translate(fn, *args)
            except _Busy:
                pass  # rolled back: wait for the lock in a worker thread
            finally:
                self._lock.release()
        with anyio.CancelScope(shield=True):
            result = await anyio.to_thread.run_sync(self._waiting, fn, *args)
        return result

    async def _read(self, fn: Callable[..., T], *args: object) -> T:
        return await anyio.to_thread.run_sync(self._waiting, fn, *args)

    def _waiting(self, fn: Callable[..., T], *args: object) -> T:
        with self._lock:
            conn = self._conn
            conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout * 1000)}")
            try:
                return self._translate(fn, *args)
            except _Busy as busy:
                raise StoreUnusable(
                    os.fspath(self.path),
                    f"another writer held it locked for longer than "
                    f"busy_timeout={self.busy_timeout} s ({busy.__cause__})",
                ) from None
            finally:
                conn.execute("PRAGMA busy_timeout = 0")

    def _translate(self, fn: Callable[..., T], *args: object) -> T:
        try:
            return fn(*args)
        except sqlite3.OperationalError as exc:
            if exc.sqlite_errorcode & 0xFF == sqlite3.SQLITE_BUSY:
                raise _Busy from exc
            raise StoreUnusable(os.fspath(self.path), str(exc)) from None
        except sqlite3.DatabaseError as exc:
            raise StoreUnusable(os.fspath(self.path), str(exc)) from None

    def _append(self, session_id: str, rows: list[Row], expected: int) -> int:
        conn = self._conn
        version, now = expected + len(rows), time.time()
        conn.execute("BEGIN IMMEDIATE")
        try:
            # The version check is the write itself: the row moves to the new
            # version only if it is at the expected one.
            if conn.execute(_ADVANCE, (version, now, session_id, expected)).rowcount:
                pass
            elif (
                expected != 0
                or not conn.execute(_CREATE, (session_id, version, now, now)).rowcount
            ):
                found = conn.execute(_VERSION, (session_id,)).fetchone()
                raise SessionConflict(
                    session_id=session_id,
                    expected=expected,
                    actual=0 if found is None else found[0],
                )
            conn.executemany(
                _ENTRY,
                [
                    (session_id, expected + n, row.run_id, row.kind, row.body)
                    for n, row in enumerate(rows)
                ],
            )
            messages = [
                (session_id, digest, body)
                for row in rows
                for digest, body in row.messages.items()
            ]
            if messages:
                conn.executemany(_MESSAGE, messages)
            for n, row in enumerate(rows):
                if row.key is not None:
                    _insert_key(conn, session_id, row.key, expected + n)
            conn.execute("COMMIT")
        except BaseException:
            _roll_back(conn)
            raise
        return version

    def _load(self, session_id: str) -> tuple[Entry, ...]:
        conn = self._conn
        # One read transaction: the entries and their messages are one snapshot.
        with _transaction(conn, "BEGIN"):
            bodies = [b for (b,) in conn.execute(_ENTRIES, (session_id,))]
            messages = dict(conn.execute(_MESSAGES, (session_id,)).fetchall())
        # Decoded here, in the worker thread: a long log takes a while.
        return tuple(decode(body, messages) for body in bodies)

    def _list(self) -> tuple[SessionInfo, ...]:
        return tuple(
            SessionInfo(id=sid, version=version)
            for sid, version in self._conn.execute(_LIST)
        )

    def _delete(self, session_id: str) -> bool:
        with _transaction(self._conn, "BEGIN IMMEDIATE"):
            cursor = self._conn.execute(_DELETE, (session_id,))
            return cursor.rowcount > 0


_VERSION: Final = "SELECT version FROM turnfsm_sessions WHERE id = ?"
# A first append (expected version 0) creates the session's row; a row that
# is there already (at version 0: an empty append made it) is advanced instead.
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
_ENTRIES: Final = "SELECT body FROM turnfsm_entries WHERE session_id = ? ORDER BY seq"
_MESSAGES: Final = "SELECT digest, body FROM turnfsm_messages WHERE session_id = ?"
_LIST: Final = "SELECT id, version FROM turnfsm_sessions ORDER BY id"
_DELETE: Final = "DELETE FROM turnfsm_sessions WHERE id = ?"


def _insert_key(conn: sqlite3.Connection, session_id: str, key: str, seq: int) -> None:
    try:
        conn.execute(_KEY, (session_id, key, seq))
    except sqlite3.IntegrityError:
        raise DuplicateRecord(session_id=session_id, key=key) from None


class _Busy(Exception):
    """Another connection holds the file's write lock (internal)."""
