"""The PostgreSQL store's reads: one session's rows, and the list of sessions."""

from __future__ import annotations

from typing import TypeAlias

from turnfsm.persistence._postgres_append import _Conn

__all__ = ["Listed", "Log", "read_list", "read_log"]

Log: TypeAlias = tuple[int | None, list[tuple[int, object]], dict[str, object]]
"""A session as stored: its counter (None: no row), its ``(seq, body)`` rows,
and its messages by digest."""

Listed: TypeAlias = tuple[str, int, "int | None"]
"""A listed session as stored: its id column, its counter, its last row's number."""


async def read_log(conn: _Conn, key: str) -> Log:
    """Read the counter, rows and messages of the session held under `key`."""
    async with conn.transaction():
        # One snapshot for the three reads.
        await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        cur = await conn.execute(
            "SELECT version FROM turnfsm_sessions WHERE id = %s", (key,)
        )
        found = await cur.fetchone()
        version = None if found is None else int(found[0])
        cur = await conn.execute(
            "SELECT seq, body FROM turnfsm_entries WHERE session_id = %s ORDER BY seq",
            (key,),
        )
        rows = [(int(seq), body) for seq, body in await cur.fetchall()]
        if not rows:
            return version, [], {}
        cur = await conn.execute(
            "SELECT digest, body FROM turnfsm_messages WHERE session_id = %s", (key,)
        )
        return version, rows, {str(d): t for d, t in await cur.fetchall()}


async def read_list(conn: _Conn) -> list[Listed]:
    """List every session row with its counter and its last entry's number."""
    # The last row's number comes from the primary key's index: cheap.
    cur = await conn.execute(
        "SELECT s.id, s.version,"
        " (SELECT max(e.seq) FROM turnfsm_entries e WHERE e.session_id = s.id)"
        " FROM turnfsm_sessions s"
    )
    return [
        (str(i), int(v), None if last is None else int(last))
        for i, v, last in await cur.fetchall()
    ]
