"""One PostgreSQL store operation on a pooled connection, a dead one retried."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterator

import psycopg

from turnfsm.errors import StoreUnusable
from turnfsm.persistence._postgres_append import _T, _Conn, _Op, _Step
from turnfsm.persistence._postgres_pool import LoopPool

__all__ = ["run", "translate"]


@contextlib.contextmanager
def translate(server: str, doing: str) -> Iterator[None]:
    """Turn psycopg's errors into `StoreUnusable` naming the server (once)."""
    try:
        yield
    except psycopg.Error as exc:
        lines = str(exc).strip().splitlines()
        detail = lines[0] if lines else "no detail"
        raise StoreUnusable(
            server, f"{doing} failed: {type(exc).__name__}: {detail}"
        ) from exc


async def run(
    get_pool: Callable[[], Awaitable[LoopPool]],
    server: str,
    max_size: int,
    doing: str,
    op: _Op[_T],
) -> _T:
    """Run `op` on a pooled connection; retry it if the connection was dead.

    A pooled connection the server dropped while it was idle (a restart,
    `pg_terminate_backend`) fails at its next statement. Until COMMIT is
    sent nothing is written (the server rolls back a transaction whose
    connection is gone), so `op` runs again on another connection; a
    connection lost while committing is reported, since the append may
    have been written.
    """
    with translate(server, doing):
        pool = await get_pool()
        for retries in range(max_size, -1, -1):
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
