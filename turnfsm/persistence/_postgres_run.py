"""One PostgreSQL store operation on a pooled connection, a dead one retried."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterator

import anyio
import psycopg

from turnfsm.errors import StoreUnusable
from turnfsm.persistence._postgres_append import _T, _Conn, _Op, _Step
from turnfsm.persistence._postgres_pool import LoopPool, discard

__all__ = ["refusal", "run", "translate"]


@contextlib.contextmanager
def translate(server: str, doing: str) -> Iterator[None]:
    """Turn psycopg's errors into `StoreUnusable` naming the server (once)."""
    try:
        yield
    except psycopg.Error as exc:
        raise StoreUnusable(server, f"{doing} failed: {_detail(exc)}") from exc


def _detail(exc: psycopg.Error) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else 'no detail'}"


async def refusal(
    conn: _Conn,
    server: str,
    exc: psycopg.errors.InsufficientPrivilege,
    *,
    creating: bool = False,
    doing: str = "",
) -> StoreUnusable:
    """The `StoreUnusable` for a right the user lacks: who, where, and the GRANT.

    `creating`: the tables were being created or migrated (CREATE is
    missing); else a table was read or written. `doing` names the operation
    that was refused, if not setting the tables up.
    """
    cur = await conn.execute("SELECT current_user, current_schema()")
    row = await cur.fetchone()
    user, schema = (str(row[0]), str(row[1])) if row else ("?", "?")
    detail = str(exc).strip().splitlines()[0]
    if creating:
        todo = (
            f"its tables must be created or migrated in schema {schema!r}, "
            f"and user {user!r} may not ({detail}): open it once as a user "
            f"who may (the schema's owner), or GRANT CREATE ON SCHEMA "
            f"{schema} TO {user}"
        )
    else:
        todo = (
            f"user {user!r} may not use its tables in schema {schema!r} "
            f"({detail}): GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES "
            f"IN SCHEMA {schema} TO {user}"
        )
    return StoreUnusable(server, f"{doing} failed: {todo}" if doing else todo)


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
    connection is gone), so `op` runs again on another connection. A
    connection lost while committing is reported, since what it sent may
    have been written, unless `op` recognises its own earlier write (an
    append): then it runs again.

    An operation the server does not answer within the pool's `timeout` (a
    server that hangs, a network that drops packets without a word) is
    given up, its connection closed, and reported: a run never waits on
    its store for ever.
    """
    with translate(server, doing):
        pool = await get_pool()
        doubt = False  # a connection was lost with a write sent
        for retries in range(max_size, -1, -1):
            step = _Step(attempt=max_size - retries)
            conn: _Conn | None = None
            try:
                async with pool.connection() as conn:
                    # `anyio.fail_after`, less its two generator-based context
                    # managers (a third of its cost): the scope's deadline,
                    # then TimeoutError if the deadline cancelled the call.
                    scope = anyio.CancelScope(
                        deadline=anyio.current_time() + pool.timeout
                    )
                    with scope:
                        try:
                            return await op(conn, step)
                        except psycopg.errors.InsufficientPrivilege as exc:
                            # A reader's role, on a write: say which GRANT.
                            raise await refusal(
                                conn, server, exc, doing=doing
                            ) from None
                    if scope.cancelled_caught and (
                        anyio.current_time() >= scope.deadline
                    ):
                        raise TimeoutError
            except TimeoutError:
                if conn is not None:
                    discard(conn)  # its answer may still come: never reused
                raise StoreUnusable(
                    server,
                    f"{doing} failed: the server did not answer within "
                    f"timeout={pool.timeout} s",
                    in_doubt=doubt or step.committing,
                ) from None
            except psycopg.OperationalError as exc:
                lost = conn is not None and conn.broken
                doubt = doubt or (lost and step.committing)
                safe = step.rerunnable or not step.committing
                if lost and retries and safe:
                    continue
                if doubt:
                    raise StoreUnusable(
                        server, f"{doing} failed: {_detail(exc)}", in_doubt=True
                    ) from exc
                raise
    raise AssertionError("unreachable")  # pragma: no cover
