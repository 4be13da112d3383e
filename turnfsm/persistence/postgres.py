r"""`PostgresStore`: session logs in PostgreSQL, shared by processes and hosts.

The schema is the SQLite store's, table for table (one design, two engines):

| table | holds |
|---|---|
| ``turnfsm_meta`` | ``schema_version`` and the ``application`` marker |
| ``turnfsm_sessions`` | one row per session: its version (entry count) |
| ``turnfsm_entries`` | the log: ``(session_id, seq)`` -> kind, run, body |
| ``turnfsm_messages`` | message content, once per session and digest |
| ``turnfsm_compactions`` | each compaction's idempotency key (unique) |

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

psycopg's async connections run on asyncio only: use the store from
``anyio.run(..., backend="asyncio")`` (the default).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator, Sequence
from types import TracebackType
from typing import final

try:
    import psycopg
    from psycopg.conninfo import conninfo_to_dict
    from psycopg_pool import AsyncConnectionPool
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise ImportError(
        "turnfsm.persistence.postgres needs psycopg 3 and psycopg-pool: "
        "install the extra with `pip install 'turnfsm[postgres]'`"
    ) from exc

import anyio

from turnfsm.errors import ConfigError, StoreUnusable
from turnfsm.persistence._postgres_append import (
    _T,
    _append,
    _check_keys,
    _Conn,
    _Op,
    _Step,
)
from turnfsm.persistence._postgres_schema import (
    _LOCK_CLASS,
    _MIGRATIONS,
    APPLICATION,
    SCHEMA_VERSION,
)
from turnfsm.persistence._records import Entry
from turnfsm.persistence._rows import decode, encode
from turnfsm.persistence._store import SessionInfo, check_session_id

__all__ = ["SCHEMA_VERSION", "PostgresStore"]


def _server(url: str) -> str:
    """Return `url` as ``postgresql://user@host:port/dbname``: no password."""
    try:
        params = conninfo_to_dict(url)
    except psycopg.ProgrammingError as exc:
        raise ConfigError(
            "url", "<not shown>", f"a PostgreSQL URL or conninfo string ({exc})"
        ) from None
    host = str(params.get("host") or params.get("hostaddr") or "localhost")
    port = params.get("port") or 5432
    user = f"{params['user']}@" if params.get("user") else ""
    return f"postgresql://{user}{host}:{port}/{params.get('dbname') or ''}"


def _running_loop() -> asyncio.AbstractEventLoop:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        raise ConfigError(
            "async backend",
            "not asyncio",
            "asyncio: psycopg's async connections run on asyncio only",
        ) from None


@final
class PostgresStore:
    """Session logs in a PostgreSQL database, through a connection pool.

    Several processes and hosts may share one database: appends to one
    session serialise on its row, and the loser of a race gets
    `SessionConflict`. The pool opens on first use (or `open`, or ``async
    with``); `close` closes it.

    Example:
        ```python
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
        min_size: Connections the pool keeps open.
        max_size: The most connections the pool opens.
        timeout: Seconds to wait for a connection (to connect, or for a free
            one) before `StoreUnusable`.

    Raises:
        ConfigError: a bad URL or pool size (no connection is attempted).
    """

    __slots__ = (
        "_lock",
        "_loop",
        "_pool",
        "_url",
        "max_size",
        "min_size",
        "server",
        "timeout",
    )

    def __init__(
        self, url: str, *, min_size: int = 1, max_size: int = 10, timeout: float = 10.0
    ) -> None:
        if not isinstance(url, str) or not url:
            raise ConfigError("url", url, "a PostgreSQL URL or conninfo string")
        if not isinstance(min_size, int) or min_size < 0:
            raise ConfigError("min_size", min_size, "an int >= 0")
        if not isinstance(max_size, int) or max_size < max(min_size, 1):
            raise ConfigError("max_size", max_size, f"an int >= {max(min_size, 1)}")
        if not isinstance(timeout, int | float) or timeout <= 0:
            raise ConfigError("timeout", timeout, "a number of seconds > 0")
        self.server = _server(url)
        self._url = url
        self.min_size = min_size
        self.max_size = max_size
        self.timeout = float(timeout)
        self._pool: AsyncConnectionPool[_Conn] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = anyio.Lock()

    def __repr__(self) -> str:
        return f"PostgresStore({self.server!r})"

    # -- lifecycle -----------------------------------------------------
    async def open(self) -> PostgresStore:
        """Connect, create or migrate the schema, and open the pool.

        Calling it again is a no-op. Returns the store itself.

        Raises:
            StoreUnusable: the server cannot be reached, the login fails, the
                tables belong to another application, or the schema is newer
                than this turnfsm (nothing is changed then).
        """
        await self._get_pool()
        return self

    async def close(self) -> None:
        """Close the pool's connections (the store opens again on next use).

        A pool opened on an event loop that has ended since (`Agent.run_sync`
        runs each call on its own loop) is dropped: its loop took its tasks.
        """
        pool, self._pool = self._pool, None
        if pool is not None and self._loop is _running_loop():
            with anyio.CancelScope(shield=True):
                await pool.close()

    async def release(self) -> None:
        """Close the pool before its event loop ends; it reopens on next use.

        `Agent.run_sync` calls this at the end of each call, whose event loop
        ends with it, so no pool task is left behind on a dead loop.
        """
        await self.close()

    async def __aenter__(self) -> PostgresStore:
        return await self.open()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def _get_pool(self) -> AsyncConnectionPool[_Conn]:
        loop = _running_loop()
        if self._loop is not loop:
            # A pool belongs to the event loop that opened it, and
            # `Agent.run_sync` runs each call on a new loop: the old loop is
            # gone with its pool's tasks, so start over on this one.
            self._loop, self._pool, self._lock = loop, None, anyio.Lock()
        if self._pool is not None:
            return self._pool
        async with self._lock:
            if self._pool is None:
                with self._translate("connecting"):
                    # One direct connection first: a refused connection or a
                    # failed login is reported now, not after a pool timeout.
                    conn = await psycopg.AsyncConnection.connect(
                        self._url, autocommit=True, connect_timeout=self._wait
                    )
                    async with conn:
                        await self._migrate(conn)
                    pool = AsyncConnectionPool(
                        self._url,
                        min_size=self.min_size,
                        max_size=self.max_size,
                        kwargs={"autocommit": True},
                        timeout=self.timeout,
                        open=False,
                        name=self.server,
                    )
                    await pool.open(wait=False)
                    self._pool = pool
        return self._pool

    @property
    def _wait(self) -> int:
        return max(1, round(self.timeout))

    async def _migrate(self, conn: _Conn) -> None:
        async with conn.transaction():
            await conn.execute(
                "SELECT pg_advisory_xact_lock(%s, hashtext(current_schema()))",
                (_LOCK_CLASS,),
            )
            await conn.execute(
                "CREATE TABLE IF NOT EXISTS turnfsm_meta"
                " (key TEXT PRIMARY KEY, value TEXT NOT NULL)"
            )
            cur = await conn.execute("SELECT key, value FROM turnfsm_meta")
            meta = {str(k): str(v) for k, v in await cur.fetchall()}
            if meta and meta.get("application") != APPLICATION:
                raise StoreUnusable(
                    self.server,
                    "its turnfsm_meta table belongs to another application"
                    f" ({meta.get('application')!r}); use another database or schema",
                )
            version = int(meta.get("schema_version", "0"))
            if version > SCHEMA_VERSION:
                raise StoreUnusable(
                    self.server,
                    f"its schema version {version} is newer than this turnfsm"
                    f" knows ({SCHEMA_VERSION}); upgrade turnfsm to use it",
                )
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

    @contextlib.contextmanager
    def _translate(self, doing: str) -> Iterator[None]:
        """Turn psycopg's errors into `StoreUnusable` naming the server (once)."""
        try:
            yield
        except psycopg.Error as exc:
            lines = str(exc).strip().splitlines()
            detail = lines[0] if lines else "no detail"
            raise StoreUnusable(
                self.server, f"{doing} failed: {type(exc).__name__}: {detail}"
            ) from exc

    async def _run(self, doing: str, op: _Op[_T]) -> _T:
        """Run `op` on a pooled connection; retry it if the connection was dead.

        A pooled connection the server dropped while it was idle (a restart,
        `pg_terminate_backend`) fails at its next statement. Until COMMIT is
        sent nothing is written (the server rolls back a transaction whose
        connection is gone), so `op` runs again on another connection; a
        connection lost while committing is reported, since the append may
        have been written.
        """
        with self._translate(doing):
            pool = await self._get_pool()
            for retries in range(self.max_size, -1, -1):
                step = _Step()
                conn: _Conn | None = None
                try:
                    async with pool.connection() as conn:
                        return await op(conn, step)
                except psycopg.OperationalError:
                    lost = conn is not None and conn.broken
                    if not (lost and retries and not step.committing):
                        raise
        raise AssertionError("unreachable")  # pragma: no cover

    # -- the SessionStore protocol -------------------------------------
    async def append(
        self, session_id: str, entries: Sequence[Entry], *, expected_version: int
    ) -> int:
        """Append `entries` if the log is at `expected_version` (see `SessionStore`).

        Raises:
            SessionConflict: the log is at another version; nothing written.
            DuplicateRecord: a compaction's idempotency key is already in the
                session (or twice in `entries`); nothing written.
            StoreUnusable: the server could not be reached or the connection
                was lost. A connection lost while committing may or may not
                have written the append: reload the session to see.
        """
        check_session_id(session_id)
        rows = [encode(entry) for entry in entries]
        _check_keys(session_id, rows)

        async def op(conn: _Conn, step: _Step) -> int:
            return await _append(conn, step, session_id, rows, expected_version)

        return await self._run(f"appending to session {session_id!r}", op)

    async def load(self, session_id: str) -> tuple[Entry, ...]:
        """Return every entry of `session_id`, oldest first (empty if unknown).

        Raises:
            CorruptRecord: a stored entry does not read back.
            StoreUnusable: the server could not be reached.
        """

        async def op(conn: _Conn, step: _Step) -> tuple[list[str], dict[str, str]]:
            async with conn.transaction():
                # One snapshot for both reads.
                await conn.execute(
                    "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY"
                )
                cur = await conn.execute(
                    "SELECT body FROM turnfsm_entries WHERE session_id = %s"
                    " ORDER BY seq",
                    (session_id,),
                )
                bodies = [str(body) for (body,) in await cur.fetchall()]
                if not bodies:
                    return [], {}
                cur = await conn.execute(
                    "SELECT digest, body FROM turnfsm_messages WHERE session_id = %s",
                    (session_id,),
                )
                return bodies, {str(d): str(t) for d, t in await cur.fetchall()}

        bodies, messages = await self._run(f"loading session {session_id!r}", op)
        return tuple(decode(body, messages) for body in bodies)

    async def list_sessions(self) -> tuple[SessionInfo, ...]:
        """Return every session with at least one entry, sorted by id.

        Raises:
            StoreUnusable: the server could not be reached.
        """

        async def op(conn: _Conn, step: _Step) -> tuple[SessionInfo, ...]:
            # COLLATE "C": code point order, as Python sorts strings.
            cur = await conn.execute(
                "SELECT id, version FROM turnfsm_sessions WHERE version > 0"
                ' ORDER BY id COLLATE "C"'
            )
            return tuple(
                SessionInfo(id=str(i), version=int(v)) for i, v in await cur.fetchall()
            )

        return await self._run("listing sessions", op)
