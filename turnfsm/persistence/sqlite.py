"""`SQLiteStore`: session logs in one SQLite file (the CLI's default store).

Theory of operation:

- One file, in WAL mode: readers never block the writer, and several
  processes (each with its own `SQLiteStore`) can share the file. A writer
  that finds the file locked waits up to `busy_timeout` seconds; calls
  queued behind one that waited that long in vain give up `busy_timeout`
  after they began, not one `busy_timeout` after another. The log is
  checkpointed every 4000 pages (16 MB; SQLite's default is 1000, and each
  checkpoint costs the commit that makes it), and cut back to 32 MiB once
  checkpointed (``journal_size_limit``): a long read elsewhere lets it
  grow, and it would otherwise keep that size.
- An append is one ``BEGIN IMMEDIATE`` transaction: it takes the write lock
  first, then moves the session's version only if it is the expected one
  (the check is the ``UPDATE ... WHERE version = ?`` itself). A log at
  another version raises `SessionConflict` and nothing is written, so two
  writers on one session can never interleave.
- Rows are `turnfsm.persistence._rows.encode`'s: an entry's body refers to
  its messages by digest, and each distinct message is stored once per
  session (``INSERT OR IGNORE``), however many events carry it again.
- The schema is versioned in ``turnfsm_meta`` and grows by migrations,
  applied in one transaction. A file that is not SQLite, another
  application's database or a newer schema raises `StoreUnusable` before
  anything is written to it.
- A store opened ``read_only`` only reads: its connection is SQLite's
  ``mode=ro`` beside a writer's log and index, an ordinary one that writes
  nothing where this process may write, ``immutable=1`` where it may not
  and nothing is beside the file, and a private copy of the file and its
  log where it may not and the log holds commits without its index
  (`turnfsm.persistence._sqlite_open._reading_mode` says when each is safe).
- No write ever waits on the event loop. A write first tries the file's
  lock without waiting (the connection's busy timeout is 0) and, when it is
  free, commits right away, inline: that costs less than handing the call
  to a thread. When another process holds the lock, the write is retried in
  a worker thread (`anyio.to_thread.run_sync`) that waits up to
  `busy_timeout`; reads always run there. Opening the file waits there too:
  the constructor opens it only if no other process holds it locked, and a
  store without a connection (not opened yet, closed, let go of the file)
  opens it in the worker thread. One connection serves the store;
  a `threading.Lock` keeps its calls one at a time (an anyio
  `CapacityLimiter` belongs to one event loop, and `Agent.run_sync` opens a
  new loop per call). Each call is a whole transaction, and the wait for a
  write is shielded (`turnfsm._threads.to_the_end`), from an anyio cancel
  scope and from asyncio's own ``task.cancel()`` alike: a cancelled caller
  never leaves a transaction half-done, and learns of an append that
  committed before its cancellation goes on.
- Owner leases (`LeasingStore`) live in ``turnfsm_leases``, one row per held
  session, timed by this host's clock; each operation is one
  ``BEGIN IMMEDIATE`` transaction (`turnfsm.persistence._sqlite_lease`).
- Ids are held as `turnfsm.persistence._rows.column_text` writes them, so
  that an id with a lone surrogate is stored and read back as it is.
- A file deleted or replaced while the store has it open is refused at the
  store's next call: SQLite in WAL mode would go on committing to the
  deleted file, which no one can open again. Each call first checks that
  the path still names the file the connection opened (one ``stat``); when
  it does not, the store closes its connection (SQLite then leaves the
  path's write-ahead log alone) and its next call opens the path anew.
  When another file stands at the path, the log left there is the old
  file's: it is moved aside (`_Handle.let_go`), or no opening could tell
  it from the new file's and not fold it in.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, TypeVar, final

import anyio
import anyio.to_thread
import attrs

from turnfsm import _checks, _deprecated
from turnfsm._threads import to_the_end
from turnfsm.errors import StoreUnusable
from turnfsm.persistence import _sqlite_lease, _sqlite_ops
from turnfsm.persistence._lease import Lease, check_lease
from turnfsm.persistence._open import names_memory
from turnfsm.persistence._records import Entry, RunOpened
from turnfsm.persistence._rows import (
    column_text,
    encode,
)
from turnfsm.persistence._sqlite_open import (
    SCHEMA_VERSION,
    _open,
    full_disk_reason,
    opened_if_free,
)
from turnfsm.persistence._store import SessionInfo, check_append, check_session_id

__all__ = ["SCHEMA_VERSION", "SQLiteStore"]

T = TypeVar("T")


def _to_path(value: Any) -> Any:
    """Return a str or str path-like `value` as a `Path`; anything else as it is.

    A leading ``~`` is the user's home, as a shell reads it (a path from an
    environment file or a config reaches here unexpanded). A blank one stays
    as it is (``Path("")`` would be the directory ``.``), and so does a name
    SQLite reads as a database in memory, for the validators to refuse.
    """
    text = os.fspath(value) if isinstance(value, str | os.PathLike) else None
    if isinstance(text, str) and text.strip() and not names_memory(text):
        path = Path(text)
        if text.startswith("~"):
            with contextlib.suppress(RuntimeError):  # no home to name
                path = path.expanduser()
        return path
    return value


def _usable_path(value: object) -> bool:
    text = os.fspath(value) if isinstance(value, Path) else ""
    return bool(text.strip()) and "\x00" not in text


_check_path = _checks.satisfies(
    _usable_path,
    "a file path (a str or os.PathLike, not blank, without NUL characters)",
    "path",
)


def _not_memory(value: object) -> bool:
    text = os.fspath(value) if isinstance(value, str | os.PathLike) else None
    return not (isinstance(text, str) and names_memory(text))


_check_not_memory = _checks.satisfies(
    _not_memory,
    "a file path (SQLite reads this name as a database in memory, which an "
    "SQLiteStore does not keep: use MemoryStore for sessions kept in memory)",
    "path",
)
_check_synchronous = _checks.one_of(("NORMAL", "FULL"), "synchronous")
# SQLite takes the wait in milliseconds as a 32-bit number: a longer one
# overflows, and the store would not wait at all.
_MAX_BUSY_TIMEOUT = 2_147_483
_check_timeout = _checks.number(
    "busy_timeout",
    low=0,
    high=_MAX_BUSY_TIMEOUT,
    expected=(
        f"a finite number of seconds >= 0 and <= {_MAX_BUSY_TIMEOUT} (about 24 "
        "days, the longest SQLite waits)"
    ),
)


@final
@_checks.keyword_checked
@attrs.define(eq=False)
class SQLiteStore:
    """Session logs in one SQLite file: embedded, WAL, safe across processes.

    Opening creates the file (and its schema) if it does not exist, and
    migrates an older turnfsm schema. Let go of the file with ``await
    store.aclose()`` or use the store as ``async with SQLiteStore(path) as
    store:``; a closed store opens the file again on next use, and a store
    dropped unclosed closes its connection when it is collected. It keeps
    owner leases too (a `LeasingStore`), on this host's clock.

    Example:
        ```python
        async def first() -> str:
            async with SQLiteStore("sessions.db") as store:
                agent = Agent(model=model, store=store)
                result = await agent.run("hello")
            return result.session_id

        async def later(session_id: str) -> Session:  # in any process
            async with SQLiteStore("sessions.db") as store:
                return await Session.load(store, session_id)
        ```

    Attributes:
        path: The database file. A path that begins with ``file:`` names
            the file of that name, not an SQLite URI (``file:s.db`` is the
            file ``file:s.db``). The names SQLite reads as a database in
            memory (``:memory:``, ``file::memory:``, ``file:x?mode=memory``)
            are refused: use `MemoryStore` for sessions kept in memory.
        synchronous: ``"NORMAL"`` (the default: a commit survives a crash of
            the process; a power cut may lose the last commits, never
            corrupt the file) or ``"FULL"`` (every commit is on disk).
        busy_timeout: Seconds a call waits for another writer's lock (calls
            queued behind one that waited that long in vain give up that
            long after they began); at most 2147483 (about 24 days).
        read_only: Only read the file: it must exist and hold a turnfsm
            store, which is never made, migrated or changed (an older schema
            is read as it is), and every write (an append, a lease, a
            deletion) raises `StoreUnusable`. It reads a file that cannot
            be written, in a directory that cannot be written (a copy for
            inspection, a read-only disk), and one a run in progress writes:
            the run's write-ahead log is never checkpointed or truncated by
            it. Without it, a file or directory that cannot be written is
            refused when the store opens, before a run begins.

    Raises:
        StoreUnusable: the file is not an SQLite database (or not a regular
            file: a FIFO, a directory), is another application's, or has a
            schema newer than this turnfsm knows; it was not changed. A file
            this process may not write (unless `read_only`), or that is
            missing or empty (with `read_only`). A file another process
            holds locked is opened by the store's first call instead, in a
            worker thread, which raises this if the lock outlasts
            `busy_timeout`.
        StoreDirectoryUnusable: the file's directory is missing, not a
            directory, or (unless `read_only`) cannot be written.
        ConfigError: a bad path (blank, with a NUL character, a name of
            SQLite's for a database in memory) or an option out of range.
    """

    path: Path = attrs.field(
        converter=_to_path, validator=[_check_not_memory, _check_path]
    )
    synchronous: Literal["NORMAL", "FULL"] = attrs.field(
        default="NORMAL", kw_only=True, validator=_check_synchronous
    )
    busy_timeout: float = attrs.field(
        default=5.0, kw_only=True, validator=_check_timeout
    )
    read_only: bool = attrs.field(
        default=False, kw_only=True, validator=_checks.boolean()
    )
    _handle: _Handle = attrs.field(init=False, repr=False, factory=lambda: _Handle())
    _lock: threading.Lock = attrs.field(init=False, repr=False, factory=threading.Lock)
    # Whether the last call that waited for the file's lock gave up (`_waiting`).
    _held_out: bool = attrs.field(init=False, repr=False, default=False)

    def __attrs_post_init__(self) -> None:
        # Made on the event loop thread, perhaps: the file is opened here
        # only if no other process holds it locked; else the first call
        # opens it in a worker thread, waiting `busy_timeout` for that lock.
        self._handle.open_if_free(self.path, self.synchronous, self.read_only)
        # A store dropped without aclose() still closes its connection.
        weakref.finalize(self, self._handle.close)

    def _conn(self, busy_timeout: float) -> sqlite3.Connection:
        """The connection, opened (waiting `busy_timeout`) if the store had none."""
        conn = self._handle.conn
        if conn is None:
            conn = self._handle.open(
                self.path, self.synchronous, busy_timeout, self.read_only
            )
        return conn

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
                writer for longer than `busy_timeout`, a full disk, deleted
                or replaced since the store opened it); nothing was written.
            ConfigError: `session_id` is not a usable id.
        """
        check_append(session_id, entries, expected_version)
        rows = [encode(entry) for entry in entries]
        key = column_text(session_id)
        return await self._write(
            self._on, _sqlite_ops.append, key, session_id, rows, expected_version
        )

    async def load(self, session_id: str) -> tuple[Entry, ...]:
        """Return every entry of `session_id`, oldest first (empty if unknown).

        Raises:
            CorruptRecord: a stored row does not read back as an entry, or
                the session's rows disagree with its version counter (its
                path names the session and the row).
        """
        check_session_id(session_id)
        return await self._read(self._on, _sqlite_ops.load, session_id)

    async def list_sessions(self) -> tuple[SessionInfo, ...]:
        """Return every session, sorted by id; a damaged one says its `problem`."""
        return await self._read(self._on, _sqlite_ops.list_sessions)

    async def list_delegated(self) -> dict[str, RunOpened]:
        """Return the sessions sub-agents ran in, with their first runs' openings.

        One query over the first runs' rows (see `LinkingStore`).
        """
        return await self._read(self._on, _sqlite_ops.list_delegated)

    # -- LeasingStore --------------------------------------------------
    async def acquire_lease(
        self, session_id: str, owner: str, *, ttl: float, force: bool = False
    ) -> Lease:
        """Take the lease on `session_id` for `owner` (see `LeasingStore`)."""
        check_session_id(session_id)
        check_lease(owner, ttl, force)
        return await self._write(
            self._on, _sqlite_lease.acquire, session_id, owner, ttl, force
        )

    async def renew_lease(self, session_id: str, owner: str, *, ttl: float) -> Lease:
        """Extend `owner`'s lease on `session_id` (see `LeasingStore`)."""
        check_session_id(session_id)
        check_lease(owner, ttl)
        return await self._write(self._on, _sqlite_lease.renew, session_id, owner, ttl)

    async def release_lease(self, session_id: str, owner: str) -> None:
        """Let go of `owner`'s lease on `session_id` (see `LeasingStore`)."""
        check_session_id(session_id)
        check_lease(owner)
        await self._write(self._on, _sqlite_lease.release, session_id, owner)

    async def lease_of(self, session_id: str) -> Lease | None:
        """Return the lease on `session_id`, or None (see `LeasingStore`)."""
        check_session_id(session_id)
        return await self._read(self._on, _sqlite_lease.lease_of, session_id)

    # -- beyond the protocol -------------------------------------------
    async def delete_session(self, session_id: str) -> bool:
        """Delete `session_id` and all its entries; return whether it existed.

        The log is otherwise never rewritten: this is for ``turnfsm sessions
        rm``, which asks first.
        """
        return await self._write(self._on, _sqlite_ops.delete, column_text(session_id))

    async def aclose(self) -> None:
        """Close the connection; the file stays, and the store reopens on next use.

        The last connection to close folds the write-ahead log back into the
        file, which takes a moment: it runs in a worker thread, shielded.
        """
        await to_the_end(self._close)

    async def close(self) -> None:
        """Close the connection (deprecated: use `aclose`)."""
        _deprecated.warn("SQLiteStore.close()", "SQLiteStore.aclose()")
        await self.aclose()

    def _close(self) -> None:
        with self._lock:
            self._handle.close()

    async def __aenter__(self) -> SQLiteStore:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # -- running the blocking calls ------------------------------------
    async def _write(self, fn: Callable[..., T], *args: object) -> T:
        # The fast path: nobody holds the file's write lock (the connection's
        # busy timeout is 0, so SQLite says so at once instead of waiting), and
        # the transaction runs right here: a hand-off to a worker thread costs
        # more than the whole commit (measured: ~130 us vs ~45 us). It has no
        # await, so it cannot be cancelled halfway. A store with no connection
        # (not opened yet, closed, let go of) opens the file in the worker
        # thread: the opening waits for another process's lock.
        if self.read_only:
            raise StoreUnusable(
                os.fspath(self.path),
                "this store was opened to read only (read_only=True): a run, a "
                "resume or an answer writes to the store; open it without "
                "read_only to write",
            )
        if self._lock.acquire(blocking=False):
            try:
                if self._handle.conn is not None:
                    return self._translate(fn, *args)
            except _Busy:
                pass  # rolled back: wait for the lock in a worker thread
            finally:
                self._lock.release()
        deadline = time.monotonic() + self.busy_timeout
        return await to_the_end(self._waiting, deadline, fn, *args)

    async def _read(self, fn: Callable[..., T], *args: object) -> T:
        deadline = time.monotonic() + self.busy_timeout
        return await anyio.to_thread.run_sync(self._waiting, deadline, fn, *args)

    def _waiting(self, deadline: float, fn: Callable[..., T], *args: object) -> T:
        # A call waits `busy_timeout` for the file's lock. When the call
        # before it gave up that wait, the lock is held still: the wait ends
        # `busy_timeout` after the call began, however long it queued behind
        # the others, so a server's concurrent requests are all told in
        # `busy_timeout`, not one after another. Queued behind this store's
        # own work (a long log decoding) it waits the whole `busy_timeout`.
        with self._lock:
            left = self.busy_timeout
            if self._held_out:
                left = max(0.0, deadline - time.monotonic())
            conn = self._conn(left)
            conn.execute(f"PRAGMA busy_timeout = {int(left * 1000)}")
            held_out = False
            try:
                return self._translate(fn, *args)
            except _Busy as busy:
                held_out = True
                raise StoreUnusable(
                    os.fspath(self.path),
                    f"another writer held it locked for longer than "
                    f"busy_timeout={self.busy_timeout} s ({busy.__cause__}); "
                    "try again once that writer is done",
                ) from None
            finally:
                self._held_out = held_out
                if self._handle.conn is conn:  # not let go of (`_on`)
                    conn.execute("PRAGMA busy_timeout = 0")

    def _translate(self, fn: Callable[..., T], *args: object) -> T:
        try:
            return fn(*args)
        except sqlite3.OperationalError as exc:
            if exc.sqlite_errorcode & 0xFF == sqlite3.SQLITE_BUSY:
                raise _Busy from exc
            reason = full_disk_reason(exc) or str(exc)
            raise StoreUnusable(os.fspath(self.path), reason) from None
        except sqlite3.DatabaseError as exc:
            raise StoreUnusable(os.fspath(self.path), str(exc)) from None

    def _on(self, fn: Callable[..., T], *args: object) -> T:
        conn = self._handle.conn
        assert conn is not None  # opened by `_waiting`, or `_write` checked
        handle = self._handle
        if not handle.still_there():
            moved = handle.let_go()
            raise StoreUnusable(
                os.fspath(self.path),
                "it was deleted or replaced while this store had it open; the "
                "store let go of it, and its next call opens the path again"
                + (
                    f" (the write-ahead log it left, with commits of the file "
                    f"that was there, was moved aside to {moved}, so that they "
                    "are not read as the new file's)"
                    if moved
                    else ""
                ),
            )
        result = fn(conn, *args)
        if handle.log is None:  # learned once its first write made it
            handle.log = _identity(_log_of(handle.file[0]))
        return result


class _Handle:
    """The store's one connection: None once closed, until the next use opens it.

    `file` is what the connection opened: the file's absolute path (SQLite
    keeps that, whatever the working directory becomes) and its identity.
    A reopening opens that path again: a relative path names the file it
    named when the store was made, wherever the process has gone since.
    """

    __slots__ = ("conn", "file", "log", "stale")

    def __init__(self) -> None:
        self.conn: sqlite3.Connection | None = None
        self.file: tuple[str, tuple[int, int] | None] = ("", None)
        self.log: tuple[int, int] | None = None
        """The identity of the connection's write-ahead log, once it has one."""
        self.stale: tuple[int, int] | None = None
        """The write-ahead log of a file replaced under the connection."""

    def open(
        self, path: Path, synchronous: str, busy_timeout: float, read_only: bool
    ) -> sqlite3.Connection:
        opened = self.file[0]
        where = opened or os.fspath(path.absolute())
        self._check_log(where)
        self.conn = _open(
            Path(opened) if opened else path,
            synchronous,
            busy_timeout,
            read_only=read_only,
        )
        self.file = (where, _identity(where))
        return self.conn

    def open_if_free(self, path: Path, synchronous: str, read_only: bool) -> None:
        """Open the file unless another process holds it locked (then stay closed).

        Either way its absolute path is kept, for the opening to come.
        """
        where = os.fspath(path.absolute())
        self._check_log(where)
        self.conn = opened_if_free(path, synchronous, read_only=read_only)
        self.file = (where, _identity(where) if self.conn is not None else None)

    def still_there(self) -> bool:
        """Whether the path still names the file the connection opened."""
        where, identity = self.file
        return _identity(where) == identity

    def close(self) -> None:
        conn, self.conn = self.conn, None
        self.log = None
        if conn is not None:
            conn.close()

    def let_go(self) -> str | None:
        """Close the connection to a file deleted or replaced under it.

        SQLite leaves that file's write-ahead log at the path (it holds the
        commits not yet folded into the file), where the next opening, by
        this process or another, would read it as the new file's and fold
        it in. When another file stands there, the log is moved aside (kept,
        beside the path), and its new name returned; if it cannot be, `open`
        refuses the path while it stays. A log left with no file is refused
        where it is, as any such log is.
        """
        path = _log_of(self.file[0])
        ours = self.log is not None and _identity(path) == self.log
        replaced = _identity(self.file[0]) is not None  # not deleted: another file
        self.close()
        if not (ours and replaced) or not os.path.exists(path):
            return None  # a log left alone is refused where it is (`_open`)
        aside = f"{path}.of-a-replaced-file-{time.strftime('%Y%m%dT%H%M%S')}"
        try:
            os.rename(path, aside)
        except OSError:
            self.stale = _identity(path)
            return None
        return aside

    def _check_log(self, where: str) -> None:
        """Refuse to open `where` beside the log of the file replaced there."""
        stale = self.stale
        if stale is None:
            return
        log = _log_of(where)
        try:
            found = os.stat(log)
        except OSError:
            found = None
        if found is None or (found.st_dev, found.st_ino) != stale or not found.st_size:
            self.stale = None  # moved away, or folded into its own file
            return
        raise StoreUnusable(
            where,
            f"the write-ahead log beside it ({log}) is the one of the file that "
            "was replaced there, and holds commits of that file: opening would "
            "write them into this one; move the log away (keep it with the old "
            "file, renamed to match it) and try again",
        )


def _log_of(where: str) -> str:
    """The write-ahead log SQLite keeps beside the file at `where`."""
    return f"{os.path.realpath(where)}-wal"


def _identity(where: str) -> tuple[int, int] | None:
    """The file at `where` as (device, inode); None: no file there."""
    try:
        found = os.stat(where)
    except OSError:
        return None
    return found.st_dev, found.st_ino


class _Busy(Exception):
    """Another connection holds the file's write lock (internal)."""
