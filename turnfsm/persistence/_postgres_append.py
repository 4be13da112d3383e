"""One append to the PostgreSQL store in one statement, which checks the version."""

from __future__ import annotations

import struct
from collections.abc import Awaitable, Callable, Sequence
from typing import Final, TypeAlias, TypeVar

import attrs
import psycopg
from psycopg.adapt import AdaptersMap, Dumper
from psycopg.pq import Format
from psycopg.rows import TupleRow

from turnfsm.errors import DuplicateRecord, SessionConflict
from turnfsm.persistence._rows import Row, column_text, column_value

__all__ = [
    "ADAPTERS",
    "_T",
    "_Conn",
    "_Connection",
    "_Op",
    "_Step",
    "_append",
    "_check_keys",
]

_Conn: TypeAlias = "psycopg.AsyncConnection[TupleRow]"


class _Connection(psycopg.AsyncConnection[TupleRow]):
    """A connection of the store's pools: it keeps one cursor for its appends.

    ``conn.execute`` makes a cursor per call, and its making and dropping
    cost about a fifth of an append's own time on the client; a connection
    runs one operation at a time (it is lent to one), so one cursor serves
    all its appends.
    """

    __slots__ = ("appends",)

    appends: psycopg.AsyncCursor[TupleRow] | None


def _append_cursor(conn: _Conn) -> psycopg.AsyncCursor[TupleRow]:
    """The cursor `conn` runs appends on (a new one if it keeps none)."""
    if type(conn) is not _Connection:
        return conn.cursor()
    try:
        cursor = conn.appends
    except AttributeError:
        cursor = None
    if cursor is None or cursor.closed:
        cursor = conn.appends = conn.cursor()
    return cursor


@attrs.define
class _Step:
    """How far an operation got: past the point where a retry is safe?

    `committing`: what the operation sent may have been committed.
    `rerunnable`: the operation may run again all the same, since it
    recognises its own write when it finds one (an append does).
    `attempt`: 0 on the first run, then the retries so far.
    """

    committing: bool = False
    rerunnable: bool = False
    attempt: int = 0


_T = TypeVar("_T")
_Op: TypeAlias = Callable[[_Conn, _Step], Awaitable[_T]]


# An append's columns go as binary arrays. psycopg dumps a list element by
# element in Python, looking up each element's dumper: most of an append's
# time on the client. These two write PostgreSQL's binary array format
# directly: the header (dimensions, a null flag, the element type), the one
# dimension's length and lower bound, then each element's length and bytes.
_HEAD: Final = struct.Struct("!5i")
_EMPTY_HEAD: Final = struct.Struct("!3i")
_INT8_ITEM: Final = struct.Struct("!iq")
_TEXT: Final = psycopg.postgres.types["text"]
_INT8: Final = psycopg.postgres.types["int8"]


class _Texts(list[str]):
    """A ``text[]`` parameter of an append (no element is None)."""


class _Int8s(list[int]):
    """A ``bigint[]`` parameter of an append."""


class _TextsDumper(Dumper):
    format = Format.BINARY
    oid = _TEXT.array_oid

    def __init__(self, cls: type, context: psycopg.abc.AdaptContext | None = None):
        super().__init__(cls, context)
        conn = self.connection
        # The client's encoding, as psycopg's own text dumper uses it: UTF-8
        # where the database takes bytes as they come (SQL_ASCII).
        encoding = conn.info.encoding if conn is not None else "utf-8"
        self._encoding = "utf-8" if encoding == "ascii" else encoding

    def dump(self, obj: _Texts) -> bytes:
        if not obj:
            return _EMPTY_HEAD.pack(0, 0, _TEXT.oid)
        parts = [_HEAD.pack(1, 0, _TEXT.oid, len(obj), 1)]
        encoding = self._encoding
        for text in obj:
            data = text.encode(encoding)
            parts.append(len(data).to_bytes(4, "big"))
            parts.append(data)
        return b"".join(parts)


class _Int8sDumper(Dumper):
    format = Format.BINARY
    oid = _INT8.array_oid

    def dump(self, obj: _Int8s) -> bytes:
        if not obj:
            return _EMPTY_HEAD.pack(0, 0, _INT8.oid)
        head = _HEAD.pack(1, 0, _INT8.oid, len(obj), 1)
        return head + b"".join(_INT8_ITEM.pack(8, n) for n in obj)


ADAPTERS: Final = AdaptersMap(psycopg.adapters)
"""psycopg's adapters, with the append's array dumpers: every connection's."""
ADAPTERS.register_dumper(_Texts, _TextsDumper)
ADAPTERS.register_dumper(_Int8s, _Int8sDumper)


def _check_keys(session_id: str, rows: Sequence[Row]) -> None:
    seen: set[str] = set()
    for row in rows:
        if row.key is not None:
            if row.key in seen:
                raise DuplicateRecord(session_id, row.key)
            seen.add(row.key)


# One statement writes a whole append: the session's row moves to its new
# version only if it is at the expected one (`s` holds it then, else nothing),
# and every insert takes its rows from `s`, so a stale append writes nothing.
# A first append (expected 0) creates the row, or advances one an empty
# append left at version 0; a racing first append waits on the primary key
# until this transaction ends, then finds the row at another version.
_ADVANCE: Final = (
    "UPDATE turnfsm_sessions SET version = %(version)s, updated_at = now()"
    " WHERE id = %(session)s AND version = %(expected)s RETURNING id"
)
_CREATE: Final = (
    "INSERT INTO turnfsm_sessions AS t (id, version) VALUES (%(session)s, %(version)s)"
    " ON CONFLICT (id) DO UPDATE SET version = excluded.version, updated_at = now()"
    " WHERE t.version = 0 RETURNING id"
)
_WRITE: Final = """
WITH s AS ({advance}),
e AS (
    INSERT INTO turnfsm_entries (session_id, seq, run_id, kind, body)
    SELECT s.id, %(expected)s::bigint + u.n - 1, u.run_id, u.kind, u.body
    FROM s, unnest(%(run_ids)b::text[], %(kinds)b::text[], %(bodies)b::text[])
        WITH ORDINALITY AS u (run_id, kind, body, n)
),
m AS (
    INSERT INTO turnfsm_messages (session_id, digest, body)
    SELECT s.id, x.digest, x.body
    FROM s, unnest(%(digests)b::text[], %(texts)b::text[]) AS x (digest, body)
    ON CONFLICT DO NOTHING
),
k AS (
    INSERT INTO turnfsm_compactions (session_id, key, seq)
    SELECT s.id, y.key, y.seq
    FROM s, unnest(%(keys)b::text[], %(key_seqs)b::bigint[]) AS y (key, seq)
)
SELECT count(*) FROM s"""
_APPEND: Final = _WRITE.format(advance=_ADVANCE)
_APPEND_FIRST: Final = _WRITE.format(advance=_CREATE)


async def _append(
    conn: _Conn,
    step: _Step,
    session_id: str,
    rows: Sequence[Row],
    expected: int,
) -> int:
    """Write one append in one round trip: one statement, committed as it ends.

    The connection is in autocommit mode, so the statement is its own
    transaction: all of it is written, or none. A connection lost before
    the answer leaves the append in doubt; it runs again on another
    connection (`rerunnable`), and a run that finds the session moved on
    checks whether the rows there are its own: then the earlier run wrote
    them. An empty append writes nothing: it checks the version, so that
    it creates no session.
    """
    key = column_text(session_id)
    if not rows:
        actual = await _version(conn, key)
        if actual != expected:
            raise SessionConflict(session_id, expected, actual)
        return expected
    version = expected + len(rows)
    messages = {d: t for row in rows for d, t in row.messages.items()}
    keyed = [
        (column_text(r.key), expected + i)
        for i, r in enumerate(rows)
        if r.key is not None
    ]
    run_ids = _Texts(column_text(r.run_id) for r in rows)
    params = {
        "session": key,
        "version": version,
        "expected": expected,
        "run_ids": run_ids,
        "kinds": _Texts(r.kind for r in rows),
        "bodies": _Texts(r.body for r in rows),
        "digests": _Texts(messages),
        "texts": _Texts(messages.values()),
        "keys": _Texts(k for k, _ in keyed),
        "key_seqs": _Int8s(n for _, n in keyed),
    }
    write = _APPEND_FIRST if expected == 0 else _APPEND
    step.committing = step.rerunnable = True
    try:
        cur = _append_cursor(conn)
        await cur.execute(write, params)
        found = await cur.fetchone()
    except psycopg.errors.UniqueViolation as exc:
        if exc.diag.table_name != "turnfsm_compactions":
            raise
        if step.attempt and await _written(conn, key, rows, run_ids, expected):
            return version
        await _refuse_known_keys(conn, session_id, rows)
        raise
    if found and found[0]:
        return version
    # Nothing was written; a retry may find its own earlier write there.
    if step.attempt and await _written(conn, key, rows, run_ids, expected):
        return version
    raise SessionConflict(
        session_id=session_id,
        expected=expected,
        actual=await _version(conn, key),
    )


async def _written(
    conn: _Conn, key: str, rows: Sequence[Row], run_ids: list[str], expected: int
) -> bool:
    """Are `rows` the session's entries from `expected` on (an earlier run's)?"""
    cur = await conn.execute(
        "SELECT run_id, kind, body FROM turnfsm_entries"
        " WHERE session_id = %s AND seq >= %s AND seq < %s ORDER BY seq",
        (key, expected, expected + len(rows)),
    )
    stored = await cur.fetchall()
    mine = [(r, row.kind, row.body) for r, row in zip(run_ids, rows, strict=True)]
    return [tuple(found) for found in stored] == mine


async def _version(conn: _Conn, key: str) -> int:
    cur = await conn.execute(
        "SELECT version FROM turnfsm_sessions WHERE id = %s", (key,)
    )
    row = await cur.fetchone()
    return 0 if row is None else int(row[0])


async def _refuse_known_keys(conn: _Conn, session_id: str, rows: Sequence[Row]) -> None:
    keys = [column_text(row.key) for row in rows if row.key is not None]
    if not keys:
        return
    # Keys are never removed: the one the write met is still there.
    cur = await conn.execute(
        "SELECT key FROM turnfsm_compactions"
        " WHERE session_id = %s AND key = ANY(%s) ORDER BY key LIMIT 1",
        (column_text(session_id), keys),
    )
    found = await cur.fetchone()
    if found is not None:
        raise DuplicateRecord(session_id, column_value(str(found[0])))
