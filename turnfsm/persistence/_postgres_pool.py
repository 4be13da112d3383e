"""The PostgreSQL store's connections: one small pool per event loop.

psycopg's async connections belong to the event loop that opened them, and
`Agent.run_sync` runs each call on a loop of its own. So the store keeps a
pool per loop, opened by the loop's first use, and closed when the loop
ends: the pool registers an async generator with its loop, and asyncio
finalises every such generator when the loop shuts down (``asyncio.run``,
``anyio.run``), which closes the pool's idle connections. No
``release()`` is needed before the loop ends, and no connection outlives it.

The pool runs no task of its own (a background task would be cancelled at
the loop's end before the pool could be closed): a connection is opened
when an operation needs one and none is idle, and is kept idle after it
until the pool closes. At most `max_size` are in use at once; an operation
that finds none free within `timeout` seconds raises `StoreUnusable`.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Final, final

import anyio
import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.pq import TransactionStatus

from turnfsm.errors import ConfigError, StoreUnusable
from turnfsm.persistence._postgres_append import _Conn

__all__ = [
    "LoopPool",
    "bound_statements",
    "discard",
    "loop_or_none",
    "running_loop",
    "server_of",
]


@final
class LoopPool:
    """The connections of one event loop (made and used on that loop)."""

    __slots__ = (
        "_connect",
        "_given_back",
        "_idle",
        "_keeper",
        "_lent",
        "_mutex",
        "_slots",
        "closed",
        "max_size",
        "ready",
        "server",
        "timeout",
    )

    def __init__(
        self,
        connect: Callable[[], Awaitable[_Conn]],
        *,
        max_size: int,
        timeout: float,
        server: str,
    ) -> None:
        """Start an empty pool; `start` ties it to the running loop."""
        self._connect = connect
        self.max_size = max_size
        self.timeout = timeout
        self.server = server
        self._idle: list[_Conn] = []
        self._slots = anyio.Semaphore(max_size)
        self._lent = 0  # connections in use now
        # Set when a connection is given back; made only while one waits.
        self._given_back: anyio.Event | None = None
        # Another thread's `PostgresStore.aclose` may close this pool.
        self._mutex = threading.Lock()
        self._keeper: contextlib.AbstractAsyncContextManager[None] | None = None
        self.closed = False
        self.ready = anyio.Lock()

    async def start(self) -> None:
        """Have the running loop close the pool when it ends."""
        keeper = _closed_at_loop_end(self)
        await keeper.__aenter__()
        self._keeper = keeper

    async def fill(self, size: int) -> None:
        """Open connections until `size` of them are idle."""
        while len(self._idle) < size:
            conn = await self._connect()
            self._put(conn)

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[_Conn]:
        """Lend a connection: an idle one, else a new one; give it back after."""
        try:
            # A free slot is taken without a checkpoint: the statement that
            # follows awaits the server, where cancellation lands.
            self._slots.acquire_nowait()
        except anyio.WouldBlock:
            with anyio.move_on_after(self.timeout) as waited:
                await self._slots.acquire()
            if waited.cancelled_caught:
                raise StoreUnusable(
                    self.server,
                    f"no connection was free within timeout={self.timeout} s "
                    f"(max_size={self.max_size} are in use)",
                ) from None
        try:
            conn = self._take() or await self._open()
            self._lent += 1
            try:
                yield conn
            finally:
                self._lent -= 1
                self._put(conn)
                given_back = self._given_back
                if given_back is not None:  # someone waits for it (`_open`)
                    self._given_back = None
                    given_back.set()
        finally:
            self._slots.release()

    async def _open(self) -> _Conn:
        """A new connection, or, if the server refuses one, the next given back.

        A server allows so many connections (``max_connections``, a role's
        ``CONNECTION LIMIT``), which processes sharing it may use up: while
        connections of this pool are in use, an operation the server refused
        a connection of its own waits for one of them, `timeout` seconds in
        all.
        """
        deadline = anyio.current_time() + self.timeout
        try:
            return await self._connect()
        except psycopg.OperationalError as exc:
            refused = exc
        with anyio.move_on_after(deadline - anyio.current_time()):
            while True:
                conn = self._take()
                if conn is not None:
                    return conn
                if not self._lent:  # none to wait for
                    break
                if self._given_back is None:
                    self._given_back = anyio.Event()
                await self._given_back.wait()
        raise refused

    def _take(self) -> _Conn | None:
        with self._mutex:
            while self._idle:
                conn = self._idle.pop()
                if not conn.closed:
                    return conn
        return None

    def _put(self, conn: _Conn) -> None:
        """Keep `conn` idle if it is sound and the pool open; else close it."""
        # The status as libpq has it (`conn.info` would make an object, and
        # an enum member, each time: a fifth of a pooled call's own cost).
        sound = (
            not conn.closed
            and not conn.broken
            and conn.pgconn.transaction_status == TransactionStatus.IDLE
        )
        with self._mutex:
            if sound and not self.closed:
                self._idle.append(conn)
                return
        discard(conn)

    def close_now(self) -> None:
        """Close the idle connections; one in use is closed when it is given back.

        Safe from any thread and any loop: closing a connection sends nothing
        and awaits nothing.
        """
        with self._mutex:
            self.closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            discard(conn)

    def loop_ended(self) -> None:
        """Close the pool as its loop ends, and let go of the loop.

        The keeper (an async generator of the loop) refers to the loop: kept,
        it would keep the ended loop, and this pool in the store's pools by
        loop, alive for as long as the store (one per `Agent.run_sync`).
        """
        self._keeper = None
        self.close_now()

    async def aclose(self) -> None:
        """Close the pool (on its own loop): its idle connections, and its keeper."""
        keeper, self._keeper = self._keeper, None
        self.close_now()
        if keeper is not None:
            await keeper.__aexit__(None, None, None)


def discard(conn: _Conn) -> None:
    """Close `conn` now (`AsyncConnection.close()` does only this, awaiting nothing)."""
    if not conn.closed:
        conn.pgconn.finish()


@contextlib.asynccontextmanager
async def _closed_at_loop_end(pool: LoopPool) -> AsyncIterator[None]:
    # An async generator first run on a loop is finalised by that loop's
    # shutdown (`loop.shutdown_asyncgens`): this `finally` is the hook.
    try:
        yield
    finally:
        pool.loop_ended()


def server_of(url: str) -> str:
    """Return `url` as ``postgresql://user@host:port/dbname``: no password."""
    try:
        params = conninfo_to_dict(url)
    except psycopg.ProgrammingError as exc:
        raise ConfigError(
            "url",
            "<not shown>",
            f"a PostgreSQL URL or conninfo string ({_unquoted(str(exc), url)})",
        ) from None
    host = str(params.get("host") or params.get("hostaddr") or "localhost")
    port = params.get("port") or 5432
    ports = [p.strip() for p in str(port).split(",")]  # an empty one: the default
    if any(p and not p.isdigit() for p in ports) or (
        _WITH_PASSWORD.match(url) is not None
        and ("@" in host or "@" in str(params.get("dbname") or ""))
    ):
        # A password with a '/' or an '@' written as it is: libpq read part
        # of it as the host, the port or the database, which an error and
        # the store's repr would show.
        raise ConfigError(
            "url",
            "<not shown>",
            "a PostgreSQL URL that reads as its user, host, port (a number) "
            "and database: a password holding a '/', an '@' or a ':' is "
            "written with %2F, %40 or %3A in their place (as it is, part of it "
            "is read as the host, the port or the database)",
        )
    user = f"{params['user']}@" if params.get("user") else ""
    server = f"postgresql://{user}{host}:{port}/{params.get('dbname') or ''}"
    # Stores on two schemas of one database (tenants) are told apart.
    found = _SEARCH_PATH.search(str(params.get("options") or ""))
    if found is None:
        return server
    return f"{server}?options=-csearch_path%3D{urllib.parse.quote(found[1], safe=',')}"


def _unquoted(detail: str, url: str) -> str:
    """The complaint libpq made of `url`, on one line, with no password in it.

    libpq quotes the text it could not read: the whole URL, or the
    password itself. A quoted piece that holds a password, or is part of
    one, is not shown.
    """
    secrets = [found for found in _PASSWORDS.findall(url) if found]
    userinfo = _USERINFO.match(url)
    if userinfo is not None and ":" in userinfo[1]:
        secrets.append(userinfo[1].partition(":")[2])

    def hide(quoted: re.Match[str]) -> str:
        text = quoted[1]
        if any(secret in text or (text and text in secret) for secret in secrets):
            return '"<not shown>"'
        return quoted[0]

    shown = _QUOTED.sub(hide, " ".join(detail.split()))
    for secret in secrets:
        shown = shown.replace(secret, "<not shown>")
    return shown


async def bound_statements(conn: _Conn, seconds: float) -> None:
    """Have the server end `conn`'s statements after `seconds`.

    The store stops waiting for an answer then; without it, the server would
    run on a statement the store gave up on (one waiting on a lock), holding
    its connection, and commit it later. A ``statement_timeout`` set already
    (by the URL's ``options``, the role or the database) is kept. Set by a
    statement, not at connecting: a pooler such as PgBouncer refuses
    ``options`` at connecting.
    """
    await conn.execute(
        "SELECT set_config('statement_timeout', %s, false)"
        " WHERE current_setting('statement_timeout') = '0'",
        (f"{max(1, round(seconds * 1000))}ms",),
    )


_SEARCH_PATH: Final = re.compile(r"(?:-c\s*|--)search_path=(\S+)")
_USERINFO: Final = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://([^/?#]*)@")
_WITH_PASSWORD: Final = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^@]*:[^@]*@")
"""A URL with a password before its first '@' (which may hold a '/' or an '@')."""
_PASSWORDS: Final = re.compile(r"password\s*=\s*'?((?:[^'\\\s&]|\\.)*)")
_QUOTED: Final = re.compile(r'"([^"]*)"')


def loop_or_none() -> asyncio.AbstractEventLoop | None:
    """Return the running asyncio loop, or None (no loop, or not asyncio)."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def running_loop() -> asyncio.AbstractEventLoop:
    """Return the running asyncio loop; raise `ConfigError` on another backend."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        raise ConfigError(
            "async backend",
            "not asyncio",
            "asyncio: psycopg's async connections run on asyncio only",
        ) from None
