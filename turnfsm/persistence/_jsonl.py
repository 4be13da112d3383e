"""A session's log as JSON lines: one header line, then one entry per line.

Each entry line is `turnfsm.serde.envelope(entry)`: versioned, tagged with
the entry's class, in the one JSON form every record has. The file can be
read back into any store (`load_session`), replayed (`turnfsm replay FILE`),
or read by other tools.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any, Final

from turnfsm import serde
from turnfsm.errors import CorruptRecord
from turnfsm.persistence._records import Entry
from turnfsm.persistence._session import Session
from turnfsm.persistence._store import MemoryStore, SessionStore

__all__ = ["dump_session", "load_session", "session_lines"]

FORMAT: Final = "turnfsm-session-log"


def session_lines(session: Session) -> Iterator[str]:
    """Yield the JSON lines of `session`'s log: a header, then every entry."""
    header = {"format": FORMAT, "v": serde.SCHEMA_VERSION, "session_id": session.id}
    yield json.dumps(header, sort_keys=True)
    for entry in session.entries:
        yield serde.dumps(serde.envelope(entry))


def dump_session(session: Session, path: str) -> int:
    """Write `session`'s log to `path` as JSON lines; return the entry count."""
    with open(path, "w", encoding="utf-8") as out:
        for line in session_lines(session):
            out.write(line + "\n")
    return session.version


async def load_session(
    lines: Iterable[str], store: SessionStore | None = None
) -> Session:
    """Read a log written by `dump_session` into `store` and open it.

    Args:
        lines: The file's lines (an open file works).
        store: Where to put the session (a new `MemoryStore` if None).

    Raises:
        CorruptRecord: a line is not JSON or not an entry (its number is
            named), or the header is missing or of another version.
        SessionConflict: `store` already holds that session.
    """
    rows = iter(enumerate(lines, start=1))
    header = _header(next(rows, (1, "")))
    entries: list[Entry] = []
    for number, line in rows:
        if line.strip():
            entries.append(_entry(number, line))
    target = store if store is not None else MemoryStore()
    await target.append(header["session_id"], entries, expected_version=0)
    return await Session.load(target, header["session_id"])


def _header(row: tuple[int, str]) -> dict[str, Any]:
    number, line = row
    data = _json(number, line)
    ok = (
        isinstance(data, dict)
        and data.get("format") == FORMAT
        and isinstance(data.get("session_id"), str)
    )
    if not ok:
        raise CorruptRecord("session log", f"line {number}", "not a session log header")
    if data["v"] != serde.SCHEMA_VERSION:
        raise CorruptRecord("session log", "v", f"unknown version {data['v']!r}")
    return data  # type: ignore[no-any-return]


def _entry(number: int, line: str) -> Entry:
    try:
        return serde.open_envelope(_json(number, line), Entry)  # type: ignore[no-any-return]
    except CorruptRecord as exc:
        raise CorruptRecord(
            exc.type, f"line {number}: {exc.path}".rstrip(": "), exc.reason
        ) from None


def _json(number: int, line: str) -> Any:
    try:
        return json.loads(line)
    except json.JSONDecodeError as exc:
        raise CorruptRecord(
            "session log", f"line {number}", f"not JSON: {exc}"
        ) from None
