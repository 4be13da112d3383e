"""The PostgreSQL store's reads: a session's rows and the list of sessions, decoded."""

from __future__ import annotations

from typing import TypeAlias

from turnfsm.persistence._postgres_append import _Conn
from turnfsm.persistence._records import Entry, RunOpened
from turnfsm.persistence._rows import (
    column_value,
    counter_problem,
    decode_log,
    delegated_openings,
)
from turnfsm.persistence._store import SessionInfo

__all__ = [
    "Listed",
    "Log",
    "decode_read",
    "listed_infos",
    "read_delegated",
    "read_list",
    "read_log",
]

Log: TypeAlias = tuple[int | None, list[tuple[int, object]], dict[str, object]]
"""A session as stored: its counter (None: no row), its ``(seq, body)`` rows,
and its messages by digest."""

Listed: TypeAlias = tuple[str, int, "int | None", float]
"""A listed session as stored: its id column, its counter, its last row's
number, when it last grew (seconds since the epoch)."""


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
        " (SELECT max(e.seq) FROM turnfsm_entries e WHERE e.session_id = s.id),"
        " extract(epoch FROM s.updated_at)"
        " FROM turnfsm_sessions s"
    )
    return [
        (str(i), int(v), None if last is None else int(last), float(at))
        for i, v, last, at in await cur.fetchall()
    ]


async def read_delegated(conn: _Conn) -> dict[str, RunOpened]:
    """The openings of delegated first runs (see `PostgresStore.list_delegated`)."""
    cur = await conn.execute(
        "SELECT DISTINCT ON (session_id) session_id, body FROM turnfsm_entries"
        " WHERE kind = 'RunOpened' ORDER BY session_id, seq"
    )
    return delegated_openings((str(key), body) for key, body in await cur.fetchall())


def decode_read(session_id: str, log: Log) -> tuple[Entry, ...]:
    """The entries of `session_id` as `read_log` read them (empty if unknown)."""
    version, rows, messages = log
    if version is None and not rows:
        return ()
    return decode_log(
        session_id,
        [body for _, body in rows],
        messages,
        version=version or 0,
        seqs=[seq for seq, _ in rows],
    )


def listed_infos(listed: list[Listed]) -> tuple[SessionInfo, ...]:
    """The sessions `read_list` read, sorted by id (with a bad counter's problem)."""
    infos = [
        SessionInfo(
            id=column_value(key),
            version=version,
            problem=counter_problem(version, 0 if last is None else last + 1),
            updated_at=at,
        )
        for key, version, last, at in listed
        if version or last is not None
    ]
    return tuple(sorted(infos, key=lambda info: info.id))
