r"""`PostgresStore`: session logs in PostgreSQL, shared by processes and hosts.

The schema is the SQLite store's, table for table (one design, two engines):

| table | holds |
|---|---|
| ``turnfsm_meta`` | ``schema_version`` and the ``application`` marker |
| ``turnfsm_sessions`` | one row per session: its version (entry count) |
| ``turnfsm_entries`` | the log: ``(session_id, seq)`` -> kind, run, body |
| ``turnfsm_messages`` | message content, once per session and digest |
| ``turnfsm_compactions`` | each compaction's idempotency key (unique) |

The tables carry no foreign keys: an append inserts rows only for the
session's row it has just moved on (or made), so none can dangle, and checking
them cost the server about 15-20 µs an append. Deleting a session deletes
its rows itself.

Rows are `turnfsm.persistence._rows`'s: an entry's body is its versioned
JSON envelope with every message replaced by a reference to its digest.
Bodies are ``TEXT``, not ``JSONB``: the text is exactly what the codec wrote
(the digests are computed over it), it costs no parse on insert, and JSONB
rejects the NUL escape (``\u0000`` in JSON) that a tool result read from a
binary file may carry. Cast ``body::jsonb`` to query them.

An append is one transaction holding one statement: it moves the session's
row to its new version only if it is at the expected one (a first append
inserts it; two first appends serialise on its primary key), and inserts the
entries, messages and compaction keys only if it did. Two writers on one
session, in any processes, therefore cannot interleave: the second finds
the first's version and gets `SessionConflict`, with nothing written.

The tables live in the connection's current schema, so one database can
hold several stores (``options=-csearch_path=tenant_a`` in the URL).
Migrations run once per store object, in one transaction under an advisory
lock, so processes that start together do not race.

Owner leases (`LeasingStore`) live in ``turnfsm_leases``, timed by the
server's clock (`turnfsm.persistence._postgres_lease`). Ids are held as
`turnfsm.persistence._rows.column_text` writes them (an id with a NUL or a
lone surrogate is held as its JSON string literal).

Connections are pooled per event loop (`turnfsm.persistence._postgres_pool`):
one store serves any number of ``anyio.run`` calls, one after another, and
each loop's connections close when the loop ends. psycopg's async
connections run on asyncio only: use the store from
``anyio.run(..., backend="asyncio")`` (the default).
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import Sequence
from types import TracebackType
from typing import Final, final

try:
    import psycopg  # noqa: F401 - first, to name the extra when it is missing
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise ImportError(
        "turnfsm.persistence.postgres needs psycopg 3: "
        "install the extra with `pip install 'turnfsm[postgres]'`"
    ) from exc

import anyio

from turnfsm import _checks, _deprecated
from turnfsm.errors import StoreUnusable
from turnfsm.persistence import _postgres_lease, _postgres_run
from turnfsm.persistence._lease import Lease, check_lease
from turnfsm.persistence._postgres_append import (
    _T,
    ADAPTERS,
    _append,
    _check_keys,
    _Conn,
    _Connection,
    _Op,
    _Step,
)
from turnfsm.persistence._postgres_pool import (
    LoopPool,
    bound_statements,
    discard,
    loop_or_none,
    running_loop,
    server_of,
)
from turnfsm.persistence._postgres_read import (
    Listed,
    Log,
    decode_read,
    listed_infos,
    read_delegated,
    read_list,
    read_log,
)
from turnfsm.persistence._postgres_run import translate
from turnfsm.persistence._postgres_schema import SCHEMA_VERSION, migrate
from turnfsm.persistence._records import Entry, RunOpened
from turnfsm.persistence._rows import (
    column_text,
    encode,
)
from turnfsm.persistence._store import SessionInfo, check_append, check_session_id

__all__ = ["SCHEMA_VERSION", "PostgresStore"]

# What `delete_session` deletes after the session's row.
_DELETE_ROWS: Final = (
    "DELETE FROM turnfsm_entries WHERE session_id = %s",
    "DELETE FROM turnfsm_messages WHERE session_id = %s",
    "DELETE FROM turnfsm_compactions WHERE session_id = %s",
    "DELETE FROM turnfsm_leases WHERE session_id = %s",
)
_URL = _checks.string(non_empty=True, expected="a PostgreSQL URL or conninfo string")


@final
class PostgresStore:
    """Session logs in a PostgreSQL database, through connection pools.

    Several processes and hosts may share one database: appends to one
    session serialise on its row, and the loser of a race gets
    `SessionConflict`. It keeps owner leases too (a `LeasingStore`), on the
    server's clock.

    Connections open on first use (or `open`, or ``async with``), in a pool
    of the running event loop; they close when that loop ends, or at
    ``await store.aclose()``, after which the store opens again on next
    use. One store therefore serves consecutive ``anyio.run`` calls (as
    `Agent.run_sync` makes) with nothing to call in between.

    Example:
        ```python
        async def main() -> None:
            async with PostgresStore("postgresql://app@db/agents") as store:
                agent = Agent(model=model, store=store)
                await agent.run("hello")
        ```

    Attributes:
        server: Where the store is: its URL without the password
            (``postgresql://user@host:port/dbname``), as errors name it.

    Args:
        url: A ``postgresql://`` URL or a libpq conninfo string. Its password
            never appears in errors or in the store's repr.
        min_size: Connections `open` makes ready (idle connections stay
            open until their loop ends or the store is closed).
        max_size: The most connections in use at once, per event loop.
        timeout: Seconds to wait for a connection (to connect, or for a free
            one), and for the server's answer to each operation, before
            `StoreUnusable`. The server gives up a statement after as long
            (its ``statement_timeout``, unless the URL, the role or the
            database set one), so a statement given up on (waiting on a
            lock) does not go on, holding a connection, and commit later.

    Raises:
        ConfigError: a bad URL or pool size (no connection is attempted).
    """

    __slots__ = (
        "_migrated",
        "_mutex",
        "_pools",
        "_url",
        "max_size",
        "min_size",
        "server",
        "timeout",
    )

    def __init__(
        self, url: str, *, min_size: int = 1, max_size: int = 10, timeout: float = 10.0
    ) -> None:
        _checks.check(url, "url", _URL)
        _checks.check(min_size, "min_size", _checks.integer(low=0))
        _checks.check(max_size, "max_size", _checks.integer(low=max(min_size, 1)))
        _checks.check(timeout, "timeout", _checks.seconds(optional=False))
        self.server = server_of(url)
        self._url = url
        self.min_size = min_size
        self.max_size = max_size
        self.timeout = float(timeout)
        self._pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopPool] = (
            weakref.WeakKeyDictionary()
        )
        self._mutex = threading.Lock()
        self._migrated = False

    def __repr__(self) -> str:
        return f"PostgresStore({self.server!r})"

    # -- lifecycle -----------------------------------------------------
    async def open(self) -> PostgresStore:
        """Connect, create or migrate the schema, and ready `min_size` connections.

        Calling it again is a no-op. Returns the store itself.

        Raises:
            StoreUnusable: the server cannot be reached, the login fails, the
                tables belong to another application, or the schema is newer
                than this turnfsm (nothing is changed then).
        """
        pool = await self._get_pool()
        with translate(self.server, "connecting"):
            await pool.fill(self.min_size)
        return self

    async def aclose(self) -> None:
        """Close every connection the store holds; it opens again on next use.

        Connections in use (by another thread's event loop) close when they
        are given back.
        """
        loop = loop_or_none()
        with self._mutex:
            pools = list(self._pools.items())
            self._pools.clear()
        for owner, pool in pools:
            if owner is loop:
                with anyio.CancelScope(shield=True):
                    await pool.aclose()
            else:
                pool.close_now()

    async def close(self) -> None:
        """Close the store's connections (deprecated: use `aclose`)."""
        _deprecated.warn("PostgresStore.close()", "PostgresStore.aclose()")
        await self.aclose()

    async def release(self) -> None:
        """Close the store's connections (deprecated: nothing needs it now).

        Each event loop's connections close when the loop ends; `aclose`
        closes them all.
        """
        _deprecated.warn("PostgresStore.release()", "PostgresStore.aclose()")
        await self.aclose()

    async def __aenter__(self) -> PostgresStore:
        return await self.open()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def _get_pool(self) -> LoopPool:
        loop = running_loop()
        with self._mutex:
            pool = self._pools.get(loop)
            fresh = pool is None
            if pool is None:
                pool = self._pools[loop] = LoopPool(
                    self._connect,
                    max_size=self.max_size,
                    timeout=self.timeout,
                    server=self.server,
                )
        if fresh:
            await pool.start()
        if not self._migrated:
            async with pool.ready:
                if not self._migrated:
                    with translate(self.server, "connecting"):
                        async with pool.connection() as conn:
                            # Connected: a failure now is the tables'.
                            with translate(self.server, "setting up its tables"):
                                await migrate(conn, self.server)
                    self._migrated = True
        return pool

    async def _connect(self) -> _Conn:
        # UTF-8 on the wire whatever the database's encoding: a SQL_ASCII
        # database keeps the bytes as sent and gives them back the same, where
        # a client speaking its encoding read them back as bytes, not text.
        conn = await _Connection.connect(
            self._url,
            autocommit=True,
            connect_timeout=self._wait,
            context=ADAPTERS,
            client_encoding="UTF8",
        )
        try:
            with anyio.fail_after(self.timeout):
                await bound_statements(conn, self.timeout)
        except BaseException as exc:
            discard(conn)
            if isinstance(exc, TimeoutError):
                raise StoreUnusable(
                    self.server,
                    "connecting failed: the server did not answer within "
                    f"timeout={self.timeout} s",
                ) from None
            raise
        return conn

    @property
    def _wait(self) -> int:
        return max(1, round(self.timeout))

    async def _run(self, doing: str, op: _Op[_T]) -> _T:
        """Run `op` on a pooled connection, a dead one retried (`_postgres_run.run`)."""
        return await _postgres_run.run(
            self._get_pool, self.server, self.max_size, doing, op
        )

    # -- the SessionStore protocol -------------------------------------
    async def append(
        self, session_id: str, entries: Sequence[Entry], *, expected_version: int
    ) -> int:
        """Append `entries` if the log is at `expected_version` (see `SessionStore`).

        Raises:
            SessionConflict: the log is at another version; nothing written.
            DuplicateRecord: a compaction's idempotency key is already in the
                session (or twice in `entries`); nothing written.
            StoreUnusable: the server could not be reached. An append whose
                connection was lost before its answer runs again on another
                connection, which finds it if it was written; when no
                connection answers, the error's `in_doubt` is True: reload
                the session to see.
        """
        check_append(session_id, entries, expected_version)
        rows = [encode(entry) for entry in entries]
        _check_keys(session_id, rows)

        async def op(conn: _Conn, step: _Step) -> int:
            return await _append(conn, step, session_id, rows, expected_version)

        return await self._run(f"appending to session {session_id!r}", op)

    async def load(self, session_id: str) -> tuple[Entry, ...]:
        """Return every entry of `session_id`, oldest first (empty if unknown).

        Raises:
            CorruptRecord: a stored entry does not read back, or the
                session's rows disagree with its version counter (its path
                names the session and the row).
            StoreUnusable: the server could not be reached.
        """
        check_session_id(session_id)
        key = column_text(session_id)

        async def op(conn: _Conn, step: _Step) -> Log:
            return await read_log(conn, key)

        return decode_read(
            session_id, await self._run(f"loading session {session_id!r}", op)
        )

    async def list_sessions(self) -> tuple[SessionInfo, ...]:
        """Return every session with at least one entry, sorted by id.

        A session whose version counter disagrees with its rows is listed
        with its `problem`.

        Raises:
            StoreUnusable: the server could not be reached.
        """

        async def op(conn: _Conn, step: _Step) -> list[Listed]:
            return await read_list(conn)

        return listed_infos(await self._run("listing sessions", op))

    async def list_delegated(self) -> dict[str, RunOpened]:
        """Return the sessions sub-agents ran in, with their first runs' openings.

        One query over the first runs' rows (see `LinkingStore`).

        Raises:
            StoreUnusable: the server could not be reached.
        """

        async def op(conn: _Conn, step: _Step) -> dict[str, RunOpened]:
            return await read_delegated(conn)

        return await self._run("listing sub-agents' sessions", op)

    async def delete_session(self, session_id: str) -> bool:
        """Delete `session_id`, its entries and its lease; return whether it existed.

        The log is otherwise never rewritten: this is for ``turnfsm sessions
        rm``, which asks first.

        Raises:
            StoreUnusable: the server could not be reached.
        """
        key = column_text(session_id)

        async def op(conn: _Conn, step: _Step) -> bool:
            async with conn.transaction():
                # The session's row first: an append under way finishes
                # before it goes, and one after finds it gone and writes
                # nothing; each later statement sees every append committed.
                cur = await conn.execute(
                    "DELETE FROM turnfsm_sessions WHERE id = %s", (key,)
                )
                for statement in _DELETE_ROWS:
                    await conn.execute(statement, (key,))
                step.committing = True
                return cur.rowcount > 0

        return await self._run(f"deleting session {session_id!r}", op)

    # -- LeasingStore --------------------------------------------------
    async def acquire_lease(
        self, session_id: str, owner: str, *, ttl: float, force: bool = False
    ) -> Lease:
        """Take the lease on `session_id` for `owner` (see `LeasingStore`)."""
        check_session_id(session_id)
        check_lease(owner, ttl, force)

        async def op(conn: _Conn, step: _Step) -> Lease:
            return await _postgres_lease.acquire(
                conn, step, session_id, owner, ttl, force
            )

        return await self._run(f"taking the lease on session {session_id!r}", op)

    async def renew_lease(self, session_id: str, owner: str, *, ttl: float) -> Lease:
        """Extend `owner`'s lease on `session_id` (see `LeasingStore`)."""
        check_session_id(session_id)
        check_lease(owner, ttl)

        async def op(conn: _Conn, step: _Step) -> Lease:
            return await _postgres_lease.renew(conn, step, session_id, owner, ttl)

        return await self._run(f"renewing the lease on session {session_id!r}", op)

    async def release_lease(self, session_id: str, owner: str) -> None:
        """Let go of `owner`'s lease on `session_id` (see `LeasingStore`)."""
        check_session_id(session_id)
        check_lease(owner)

        async def op(conn: _Conn, step: _Step) -> None:
            await _postgres_lease.release(conn, step, session_id, owner)

        await self._run(f"releasing the lease on session {session_id!r}", op)

    async def lease_of(self, session_id: str) -> Lease | None:
        """Return the lease on `session_id`, or None (see `LeasingStore`)."""
        check_session_id(session_id)

        async def op(conn: _Conn, step: _Step) -> Lease | None:
            return await _postgres_lease.lease_of(conn, step, session_id)

        return await self._run(f"reading the lease on session {session_id!r}", op)
