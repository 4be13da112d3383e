"""Opening an SQLite store's file: the checks it must pass, its schema, migrations."""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import stat
import tempfile
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from turnfsm.errors import StoreDirectoryUnusable, StoreUnusable

__all__ = [
    "APPLICATION",
    "LEASES_SINCE",
    "SCHEMA_VERSION",
    "WAL_SIZE_LIMIT",
    "_open",
    "_roll_back",
    "_transaction",
    "full_disk_reason",
    "opened_if_free",
]


APPLICATION: Final = "turnfsm"
"""The marker ``turnfsm_meta`` holds under ``application``."""

_HEADER: Final = b"SQLite format 3\x00"

# Each step is applied, in order, to a file at the version before it; all the
# steps a file needs run in one transaction. Never edit a released step: add one.
_MIGRATIONS: Final[tuple[tuple[str, ...], ...]] = (
    (  # 1: the log, its messages (stored once) and the compaction keys
        "CREATE TABLE turnfsm_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
        "CREATE TABLE turnfsm_sessions ("
        " id TEXT PRIMARY KEY,"
        " version INTEGER NOT NULL,"
        " created_at REAL NOT NULL,"
        " updated_at REAL NOT NULL)",
        "CREATE TABLE turnfsm_entries ("
        " session_id TEXT NOT NULL"
        "  REFERENCES turnfsm_sessions (id) ON DELETE CASCADE,"
        " seq INTEGER NOT NULL,"
        " run_id TEXT NOT NULL,"
        " kind TEXT NOT NULL,"
        " body TEXT NOT NULL,"
        " PRIMARY KEY (session_id, seq))",
        "CREATE TABLE turnfsm_messages ("
        " session_id TEXT NOT NULL"
        "  REFERENCES turnfsm_sessions (id) ON DELETE CASCADE,"
        " digest TEXT NOT NULL,"
        " body TEXT NOT NULL,"
        " PRIMARY KEY (session_id, digest))",
        "CREATE TABLE turnfsm_compactions ("
        " session_id TEXT NOT NULL"
        "  REFERENCES turnfsm_sessions (id) ON DELETE CASCADE,"
        " key TEXT NOT NULL,"
        " seq INTEGER NOT NULL,"
        " UNIQUE (session_id, key))",
    ),
    (  # 2: owner leases (times in seconds since the epoch, this host's clock)
        "CREATE TABLE turnfsm_leases ("
        " session_id TEXT PRIMARY KEY,"
        " owner TEXT NOT NULL,"
        " since REAL NOT NULL,"
        " expires_at REAL NOT NULL)",
    ),
)

SCHEMA_VERSION: Final = len(_MIGRATIONS)
"""The schema version this turnfsm writes (and the newest it can open)."""

LEASES_SINCE: Final = 2
"""The first schema version with ``turnfsm_leases`` (an older file, read as
it is, holds no leases)."""

WAL_SIZE_LIMIT: Final = 8 * 1024 * 1024
"""The size, in bytes, the write-ahead log is cut back to once checkpointed.

SQLite checkpoints the log when it holds 1000 pages (about 4 MB of 4 KiB
pages) and then writes it again from its start, without making the file any
smaller. While another connection holds a long read, nothing can be
checkpointed and the log grows (tens of MB); without a limit it stays that
size for as long as a connection has the file open. Twice the size it
reaches between automatic checkpoints: a steady writer never cuts it and
grows it again, and a log grown past it is cut back to it at the first
commit after the checkpoint that follows the reader's end.
"""


@contextlib.contextmanager
def _transaction(conn: sqlite3.Connection, begin: str) -> Iterator[None]:
    """Run a block as one transaction: commit if it returns, else roll back."""
    conn.execute(begin)
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        _roll_back(conn)
        raise


def _roll_back(conn: sqlite3.Connection) -> None:
    """Roll back the open transaction, if SQLite has not already."""
    # SQLite rolls some failures back itself (a full disk); then there is
    # nothing left to roll back, and the original error must surface.
    if conn.in_transaction:
        conn.execute("ROLLBACK")


def _open(
    path: Path,
    synchronous: str,
    busy_timeout: float,
    *,
    wait: bool = True,
    read_only: bool = False,
) -> sqlite3.Connection:
    """Open the store's file: check it, set the connection up, migrate its schema.

    Another process's lock on the file (a transaction of its own, a
    migration under way) is waited for up to `busy_timeout` seconds; with
    ``wait=False`` it raises `_Held` instead of a refusal (`opened_if_free`).
    With `read_only` the file is only read (`_open_to_read`).
    """
    if read_only:
        return _open_to_read(path, busy_timeout, wait=wait)
    where = os.fspath(path)
    check_directory(path.absolute().parent, "the store's path")
    _check_kind(path, where)
    _check_log_alone(path, where)
    _check_writable(path, where)
    if _size(f"{os.path.realpath(path)}-wal"):
        # Its log holds commits: a connection that refused the file (another
        # application's, a newer schema) would fold that log into it as it
        # closed. A reader checks it first, and folds nothing.
        _open_to_read(path, busy_timeout, wait=wait, empty=True).close()
    try:
        # By its absolute path: SQLite reads a name that begins with "file:"
        # as a URI (in builds that take URIs everywhere, as Debian's does),
        # and ":memory:" as no file at all, not as the files they name.
        conn = sqlite3.connect(
            os.fspath(path.absolute()),
            timeout=busy_timeout,
            isolation_level=None,
            check_same_thread=False,
        )
    except sqlite3.Error as exc:
        raise StoreUnusable(where, f"it cannot be opened ({exc})") from None
    try:
        version = _schema_version(conn, where)
        # Only now, the file being ours (or empty), may anything change it.
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute(f"PRAGMA journal_size_limit = {WAL_SIZE_LIMIT}")
        conn.execute(f"PRAGMA synchronous = {synchronous}")
        conn.execute("PRAGMA foreign_keys = ON")
        if version < SCHEMA_VERSION:
            _migrate(conn, where)
        # From here on a write tries the lock without waiting (`_write`).
        conn.execute("PRAGMA busy_timeout = 0")
    except sqlite3.DatabaseError as exc:
        conn.close()
        if not wait and exc.sqlite_errorcode & 0xFF in _HELD:
            raise _Held from None
        raise _not_sqlite(path, where, exc) from None
    except BaseException:
        conn.close()
        raise
    return conn


def _open_to_read(
    path: Path, busy_timeout: float, *, wait: bool, empty: bool = False
) -> sqlite3.Connection:
    """Open the store's file to read it only: nothing in it is made or changed.

    The file must exist and hold a turnfsm store of this version or an older
    one (read as it is: never migrated), or (with `empty`) no table at all.
    How it is opened depends on what this process may do beside it
    (`_reading_mode`); a file that cannot be written, in a directory that
    cannot be written, is read as well as one that can. The connection
    refuses writes (``query_only``).
    """
    where = os.fspath(path)
    check_directory(path.absolute().parent, "the store's path", write=False)
    _check_kind(path, where)
    _check_log_alone(path, where)
    if not os.path.exists(path):
        raise StoreUnusable(
            where, "it does not exist, and a store opened to read only is never made"
        )
    mode = _reading_mode(path)
    copy = None
    try:
        # As a URI, with its name escaped (a "?" or "#" in it is the file's).
        if mode == "copy":
            copy, name = _copied(path, where)
            uri = f"{Path(name).as_uri()}?mode=rw"
        else:
            uri = f"{Path(os.path.abspath(path)).as_uri()}?{mode}"
        conn = sqlite3.connect(
            uri,
            timeout=busy_timeout,
            isolation_level=None,
            check_same_thread=False,
            uri=True,
            factory=_Reading,
        )
    except sqlite3.Error as exc:
        _remove(copy)
        raise StoreUnusable(where, f"it cannot be opened ({exc})") from None
    except BaseException:
        _remove(copy)
        raise
    assert isinstance(conn, _Reading)
    conn.keep_copy(copy)
    try:
        conn.execute("PRAGMA query_only = ON")
        version = _schema_version(conn, where)
        if version == 0 and not empty:
            raise StoreUnusable(
                where,
                "it holds no turnfsm store (an empty database), and a store "
                "opened to read only is never made",
            )
        conn.schema_version = version
        conn.execute("PRAGMA busy_timeout = 0")
    except sqlite3.DatabaseError as exc:
        conn.close()
        if not wait and exc.sqlite_errorcode & 0xFF in _HELD:
            raise _Held from None
        raise _not_readable(path, where, exc) from None
    except BaseException:
        conn.close()
        raise
    return conn


def _reading_mode(path: Path) -> str:
    """How to open `path` to read it, creating and changing nothing beside it.

    - ``mode=ro``: its write-ahead log (``-wal``) and index (``-shm``) are
      there, which a reader needs and would otherwise make: a writer at work
      on the file (a run in progress) keeps them. Reading alongside it is
      safe, and a reader never checkpoints or truncates its log: SQLite
      opened the file to read only.
    - ``mode=ro`` too where this process may write the file and its
      directory and the log holds commits without its index (a writer
      ended without closing, the index deleted): SQLite makes the index,
      with the file's permissions, and leaves it; the log is read, never
      folded into the file.
    - ``mode=rw``: this process may write the file and its directory, and
      no log holds anything beside it. SQLite makes the log and index a
      reader needs, and the last connection to close deletes them, as every
      store does (a writer that began meanwhile keeps its log: the reader's
      close folds into the file only what a writer that ended meanwhile
      committed, never while one has the file open). The connection writes
      nothing itself.
    - ``mode=ro&immutable=1``: it cannot be written here (a read-only
      directory or file, a read-only disk, a copy for inspection) and no
      log or rollback journal holds anything beside it: all it holds is in
      the file. A reader could neither make an index here nor should it (a
      read-only one, left behind, would stop the next writer). No WAL
      writer is at work on it: one keeps its log. It is not safe if one
      with the right to write the file starts writing it while it is read:
      SQLite then reads pages as they change, and the read may fail as a
      damaged record; nothing is written either way.
    - ``copy``: it cannot be written here, and its log (or rollback journal)
      holds commits not yet in the file, without the index a reader needs:
      both are copied to a private directory and read there (`_copied`).
      No writer is at work on it: one keeps its index.
    """
    real = os.path.realpath(path)
    wal, shm = f"{real}-wal", f"{real}-shm"
    if os.path.exists(wal) and os.access(shm, os.R_OK):
        return "mode=ro"
    directory = os.path.dirname(real)
    if os.access(real, os.W_OK) and os.access(directory, os.W_OK | os.X_OK):
        return "mode=ro" if _size(wal) else "mode=rw"
    if not _size(wal) and not _size(f"{real}-journal"):
        return "mode=ro&immutable=1"
    return "copy"


def _size(name: str) -> int:
    """The size of the file `name` (0: none there)."""
    try:
        return os.stat(name).st_size
    except OSError:
        return 0


def _copied(path: Path, where: str) -> tuple[str, str]:
    """Copy the file and its log (or journal) to a private directory; return both.

    The copy is checked against the files as they were before it: one that
    changed while it was copied is copied again (three times at most). The
    file's lock is not needed: no writer is at work on it (`_reading_mode`),
    and no connection of this process holds one on it, which closing the
    descriptors read here would drop.
    """
    real = os.path.realpath(path)
    directory = tempfile.mkdtemp(prefix="turnfsm-read-")
    name = os.path.join(directory, "store.db")
    try:
        for _ in range(3):
            before = _states(real)
            shutil.copyfile(real, name)
            for side in ("-wal", "-journal"):
                if _size(f"{real}{side}"):
                    shutil.copyfile(f"{real}{side}", f"{name}{side}")
            if _states(real) == before:
                return directory, name
    except OSError as exc:
        _remove(directory)
        raise StoreUnusable(
            where, f"it cannot be read ({exc.strerror or exc})"
        ) from None
    _remove(directory)
    raise StoreUnusable(
        where,
        "it changed each time it was copied to be read (a writer is at work on "
        "it, from a directory this user cannot write); try again once it is done",
    )


def _states(real: str) -> tuple[tuple[int, int, int] | None, ...]:
    """The file and the files beside it, as (inode, size, modified) or None."""
    found: list[tuple[int, int, int] | None] = []
    for side in ("", "-wal", "-shm", "-journal"):
        try:
            at = os.stat(f"{real}{side}")
        except OSError:
            found.append(None)
        else:
            found.append((at.st_ino, at.st_size, at.st_mtime_ns))
    return tuple(found)


def _remove(directory: str | None) -> None:
    if directory is not None:
        shutil.rmtree(directory, ignore_errors=True)


class _Reading(sqlite3.Connection):
    """A connection that only reads; its private copy is deleted when it closes.

    `schema_version` is the file's (an older one is read as it is).
    """

    schema_version: int = SCHEMA_VERSION
    _dropped: weakref.finalize[[str | None], _Reading] | None = None

    def keep_copy(self, directory: str | None) -> None:
        """Delete `directory` (the copy this reads) once closed or collected."""
        if directory is not None:
            self._dropped = weakref.finalize(self, _remove, directory)

    def close(self) -> None:
        try:
            super().close()
        finally:
            if self._dropped is not None:
                self._dropped()


def _not_readable(path: Path, where: str, exc: sqlite3.DatabaseError) -> StoreUnusable:
    """The refusal of a file opened to read that SQLite could not read."""
    if exc.sqlite_errorcode & 0xFF in _UNWRITABLE:
        return StoreUnusable(where, f"it cannot be read ({exc})")
    return _not_sqlite(path, where, exc)


def opened_if_free(
    path: Path, synchronous: str, *, read_only: bool = False
) -> sqlite3.Connection | None:
    """Open the store's file without waiting: None if another process holds it locked.

    Any other refusal is raised, as `_open` raises it.
    """
    try:
        return _open(path, synchronous, 0, wait=False, read_only=read_only)
    except _Held:
        return None


def check_directory(directory: Path, setting: str, *, write: bool = True) -> None:
    """Refuse a store file whose directory is missing or (to `write`) cannot be written.

    Before the file is opened (and made): nothing is written.

    Raises:
        StoreDirectoryUnusable: naming the directory and `setting`, what
            chose it.
    """
    reason = None
    if not directory.exists():
        reason = "it does not exist"
    elif not directory.is_dir():
        reason = "it is not a directory"
    elif write and not os.access(directory, os.W_OK | os.X_OK):
        reason = f"it cannot be written ({_unwritable(directory)})"
    if reason is not None:
        raise StoreDirectoryUnusable(os.fspath(directory), reason, setting)


def _unwritable(where: str | Path) -> str:
    """Why this process may not write `where`: a read-only disk, or its permissions."""
    try:
        if os.statvfs(where).f_flag & os.ST_RDONLY:
            return "a read-only file system"
    except (AttributeError, OSError):  # no statvfs (Windows)
        pass
    return "read-only for this user"


def _check_writable(path: Path, where: str) -> None:
    """Refuse a store file (or its log, its index) this process may not write.

    SQLite would open it to read only, without a word, and make the index
    (``-shm``) read-only too, which would stop the writers that come after
    it; the first write would fail, after the run began. An empty log or
    index is not refused: SQLite gives it the file's permissions when it
    opens it. Only the files' status is read.
    """
    real = os.path.realpath(path)
    for name in (real, f"{real}-wal", f"{real}-shm"):
        if name != real and not _size(name):
            continue
        if os.path.exists(name) and not os.access(name, os.W_OK):
            which = "it" if name == real else f"its file {name}"
            raise StoreUnusable(
                where,
                f"{which} cannot be written ({_unwritable(name)}); a run, a "
                "resume or an answer writes to the store: make it writable, or "
                "use another store (a command that only reads, such as "
                "`turnfsm sessions list`, still reads it)",
            )


def _check_kind(path: Path, where: str) -> None:
    """Refuse what is not a regular file (a FIFO would block a read forever).

    Only the path's status is read: no descriptor of the file is opened
    here. Closing one would drop every lock this process holds on the file
    (POSIX locks belong to the process), and with them the lock another
    store's open connection to it keeps: another process would then take
    the file for its own and delete the write-ahead log those commits are
    still in. SQLite itself reads the file, and `_not_sqlite` words a
    refusal.
    """
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise StoreUnusable(where, f"it cannot be read ({exc.strerror})") from None
    kind = _KINDS.get(stat.S_IFMT(mode), "not a regular file")
    if kind:
        raise StoreUnusable(
            where, f"it is {kind}, not a regular file", names_no_store=True
        )
    if not os.access(path, os.R_OK):
        raise StoreUnusable(where, "it cannot be read (Permission denied)")


def _check_log_alone(path: Path, where: str) -> None:
    """Refuse a missing file whose write-ahead log is there without it.

    The file was moved or deleted, and its last commits are still in that
    log, named after this path: SQLite would make a new file here, and the
    last connection to close it would delete the log, and those commits.
    A symlink's file is the one it points to: SQLite names the log after
    that file, beside it.
    """
    real = os.path.realpath(path)
    log = f"{real}-wal"
    try:
        if os.path.lexists(real) or not os.path.getsize(log):
            return
    except OSError:  # no log
        return
    alone = "it" if real == os.path.abspath(path) else f"the file {real} it links to"
    raise StoreUnusable(
        where,
        f"its write-ahead log {log} is there without {alone}: the file was moved "
        "or deleted, its last commits still in that log; put the file back "
        "beside it (or the log beside the file), or move the log away to start "
        "anew",
    )


def _not_sqlite(path: Path, where: str, exc: sqlite3.DatabaseError) -> StoreUnusable:
    """The refusal of a file SQLite could not read as a database.

    Its first bytes are read only when SQLite found no database there: no
    connection of this process can hold the file then, so closing the
    descriptor drops no lock.
    """
    code = exc.sqlite_errorcode & 0xFF  # the primary code of an extended one
    if code in _UNWRITABLE:  # the disk's failure, not the file's content
        return StoreUnusable(
            where, full_disk_reason(exc) or f"it cannot be written ({exc})"
        )
    if code in _HELD:
        return StoreUnusable(where, f"another process held it locked ({exc})")
    if exc.sqlite_errorcode != sqlite3.SQLITE_NOTADB:
        return StoreUnusable(
            where, f"it is not a usable SQLite database ({exc})", names_no_store=True
        )
    try:
        with open(path, "rb") as file:
            head = file.read(len(_HEADER))
    except OSError:
        head = _HEADER
    if head and head != _HEADER:
        return StoreUnusable(where, "it is not an SQLite database", names_no_store=True)
    return StoreUnusable(
        where, f"it is not a usable SQLite database ({exc})", names_no_store=True
    )


class _Held(Exception):
    """Another process held the file locked, and the opening was not to wait."""


def full_disk_reason(exc: sqlite3.Error) -> str | None:
    """Why a write failed and what to do, if the disk refused it; else None.

    A write past the disk's space (or a file size limit) is a full disk to
    SQLite, or a write's I/O error, depending on where it was refused.
    """
    code = getattr(exc, "sqlite_errorcode", 0)
    if code & 0xFF == sqlite3.SQLITE_FULL:
        full = "is full"
    elif code == sqlite3.SQLITE_IOERR_WRITE:
        full = "may be full, or failing"
    else:
        return None
    return (
        f"it cannot be written ({exc}): its disk {full}; free some space on it, "
        "or move the store to another disk"
    )


_HELD: Final = frozenset((sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED))
"""SQLite's codes for a file another connection holds locked."""

_UNWRITABLE: Final = frozenset(
    (
        sqlite3.SQLITE_FULL,
        sqlite3.SQLITE_IOERR,
        sqlite3.SQLITE_READONLY,
        sqlite3.SQLITE_CANTOPEN,
        sqlite3.SQLITE_PERM,
    )
)
"""SQLite's codes for a file the disk would not let it write (full, failing)."""

_KINDS: Final = {
    stat.S_IFREG: "",
    stat.S_IFIFO: "a FIFO (named pipe)",
    stat.S_IFDIR: "a directory",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
}


def _schema_version(conn: sqlite3.Connection, where: str) -> int:
    """Return the file's turnfsm schema version (0 for an empty database)."""
    with _transaction(conn, "BEGIN"):
        tables = {
            name
            for (name,) in conn.execute(
                "SELECT name FROM sqlite_master WHERE type IN ('table', 'view')"
                " AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\'"
            )
        }
        if not tables:
            return 0
        meta: dict[str, str] = {}
        if "turnfsm_meta" in tables:
            meta = dict(conn.execute("SELECT key, value FROM turnfsm_meta").fetchall())
    if meta.get("application") != APPLICATION:
        shown = ", ".join(sorted(tables)[:5])
        raise StoreUnusable(
            where,
            f"it is another application's SQLite database (tables: {shown})",
            names_no_store=True,
        )
    try:
        version = int(meta["schema_version"])
    except (KeyError, ValueError):
        raise StoreUnusable(where, "its turnfsm_meta has no schema_version") from None
    if version > SCHEMA_VERSION:
        raise StoreUnusable(
            where,
            f"its schema version {version} is newer than this turnfsm knows "
            f"({SCHEMA_VERSION}); upgrade turnfsm to open it",
        )
    return version


def _migrate(conn: sqlite3.Connection, where: str) -> None:
    with _transaction(conn, "BEGIN IMMEDIATE"):
        # Read again under the write lock: another process may have migrated.
        version = _schema_version_unlocked(conn, where)
        for step in _MIGRATIONS[version:]:
            for sql in step:
                conn.execute(sql)
        conn.executemany(
            "INSERT OR REPLACE INTO turnfsm_meta (key, value) VALUES (?, ?)",
            [("application", APPLICATION), ("schema_version", str(SCHEMA_VERSION))],
        )


def _schema_version_unlocked(conn: sqlite3.Connection, where: str) -> int:
    found = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'turnfsm_meta'"
    ).fetchone()
    if found is None:
        return 0
    row = conn.execute(
        "SELECT value FROM turnfsm_meta WHERE key = 'schema_version'"
    ).fetchone()
    return 0 if row is None else int(row[0])
