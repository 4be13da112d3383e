"""Checkpoints of an SQLite store's write-ahead log, off the append path.

SQLite checkpoints the log itself (copies its pages back into the file and
syncs both) inside the commit that takes it past 1000 pages: that append,
on the event loop, waits for two syncs to disk, several milliseconds (on a
10,000-turn session about as much, per turn, as the commits themselves).
The store's own thread does it before then, on a connection of its own,
while the appends go on (a checkpoint and a writer do not wait for each
other in WAL mode). It is SQLite's ``PRAGMA wal_checkpoint(PASSIVE)``, the
same checkpoint the commit would run, with the store's `synchronous`: what
is durable when is unchanged. SQLite's own checkpoint in the commit stays
as it was, for a log the thread has not kept up with.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from turnfsm.persistence._rows import Row
from turnfsm.persistence._sqlite_open import file_identity

__all__ = ["EVERY", "Checkpointer", "pages"]

EVERY: Final = 400
"""The log pages (estimated, `pages`) the appends write between two checkpoints.

Well below the 1000 at which SQLite checkpoints in the commit itself: the
estimate is rough (a real turn's append writes about 1.6 times it).
"""

_PAGE: Final = 4096
_PAGES_PER_COMMIT: Final = 4
"""Pages every commit writes, however small: the session's row and the
leaf pages of the tables and indexes its rows go to."""


def pages(rows: Sequence[Row]) -> float:
    """An estimate of the log pages an append of `rows` writes (a lower bound).

    Each row's text is written twice (its table and its key's index hold
    parts of it; a long one spills over pages).
    """
    size = 0
    for row in rows:
        size += len(row.body)
        for text in row.messages.values():
            size += len(text)
    return _PAGES_PER_COMMIT + 2 * size / _PAGE


class Checkpointer:
    """A store file's checkpoints, run by a thread of their own.

    `wrote` counts the appends' pages and, every `EVERY`, wakes the thread
    (made at the first one); `close` stops it and closes its connection.
    The store calls both under its lock, one call at a time.
    """

    __slots__ = (
        "_conn",
        "_identity",
        "_path",
        "_pending",
        "_stop",
        "_synchronous",
        "_thread",
        "_wake",
    )

    def __init__(
        self, path: str, identity: tuple[int, int] | None, synchronous: str
    ) -> None:
        self._path = path
        self._identity = identity
        self._synchronous = synchronous
        self._pending = 0.0
        self._wake = threading.Event()
        self._stop = False
        self._thread: threading.Thread | None = None
        self._conn: sqlite3.Connection | None = None

    def wrote(self, rows: Sequence[Row]) -> None:
        """Count a committed append of `rows`; wake the thread every `EVERY` pages."""
        self._pending += pages(rows)
        if self._pending < EVERY:
            return
        self._pending = 0.0
        if self._stop:
            return
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="turnfsm-sqlite-checkpoint", daemon=True
            )
            self._thread.start()
        self._wake.set()

    def close(self) -> None:
        """Stop the thread (after the checkpoint under way) and close its connection.

        For good: a store that opens its file again makes a new one.
        """
        self._stop = True
        thread = self._thread
        if thread is None:
            return
        self._wake.set()
        if thread is not threading.current_thread():  # else it stops on return
            thread.join()

    def _run(self) -> None:
        try:
            while True:
                self._wake.wait()
                self._wake.clear()
                if self._stop:
                    return
                self._checkpoint()
        finally:
            conn, self._conn = self._conn, None
            if conn is not None:
                conn.close()

    def _checkpoint(self) -> None:
        # Any failure (the file gone, another process's checkpoint under
        # way) leaves the log to the next checkpoint, here or in a commit.
        try:
            if self._conn is None:
                if file_identity(self._path) != self._identity:
                    return  # not the file the store opened: the store says so
                self._conn = _connect(self._path, self._synchronous)
            self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        except sqlite3.Error:
            conn, self._conn = self._conn, None
            if conn is not None:
                with contextlib.suppress(sqlite3.Error):
                    conn.close()


def _connect(path: str, synchronous: str) -> sqlite3.Connection:
    """A connection to the store's file that never makes one (``mode=rw``).

    The file may have been deleted since the store opened it: a checkpoint
    must not leave an empty database in its place.
    """
    conn = sqlite3.connect(
        f"{Path(path).as_uri()}?mode=rw", isolation_level=None, uri=True, timeout=0
    )
    try:
        conn.execute(f"PRAGMA synchronous = {synchronous}")
    except BaseException:
        conn.close()
        raise
    return conn
