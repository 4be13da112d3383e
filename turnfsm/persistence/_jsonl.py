"""A session's log as JSON lines: one header line, then one entry per line.

Each entry line is `turnfsm.serde.envelope(entry)`: versioned, tagged with
the entry's class, in the one JSON form every record has. The file can be
read back into any store (`load_session`), replayed (`turnfsm replay FILE`),
or read by other tools. The same log as one JSON document (the header's
keys, plus ``entries``: the list of entries) reads back too.

Reading a log checks all of it before anything is written: each line, then
the session it projects to (every entry of an opened run, every committed
message brought in by an event, every committed history a whole
conversation). A log that fails a check is refused whole, naming the line
(or the entry of a document) and the field. Each entry line carries the
digest of each of its fields: a field changed since the log was written is
refused by name.

Each entry line also carries its position in the log (``seq``: 1, 2, ...),
and the header the number of entries (``entry_count``): a line deleted,
repeated or moved, a line added, and a file cut short after a whole line
are refused, naming the line. The header's ``log_version`` says so (2); a
log written before lines carried their positions has none, and reads as
it did (what was not written cannot be checked).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Iterator
from typing import Any, Final, TypeGuard

import attrs

from turnfsm import serde
from turnfsm._files import write_text
from turnfsm.errors import (
    ConfigError,
    CorruptRecord,
    DuplicateRecord,
    InvalidMessage,
    SessionConflict,
)
from turnfsm.messages import OpenCalls
from turnfsm.persistence._commits import unbrought, unopened
from turnfsm.persistence._records import Committed, Entry, RunEnded, RunOpened
from turnfsm.persistence._rows import field_digests
from turnfsm.persistence._run_record import GOES_ON
from turnfsm.persistence._session import Session
from turnfsm.persistence._store import SessionStore, check_session_id, check_store

__all__ = ["dump_session", "load_session", "session_lines"]

FORMAT: Final = "turnfsm-session-log"

DIGESTS: Final = "digests"
"""The key of an entry line's field digests (logs written before have none)."""

LOG_VERSION: Final = 2
"""The header's ``log_version``: 2, entry lines carry ``seq`` and ``digests``
and the header ``entry_count``; a header without one (or with 1) is of a log
written before, whose lines are read without those checks."""

SEQ: Final = "seq"
"""The key of an entry line's position in the log (1 for the first entry)."""

COUNT: Final = "entry_count"
"""The header's key of the number of entries the log holds."""

_LOG: Final = "session log"
"""What a `CorruptRecord` of the file itself (not of one entry) names."""


def session_lines(session: Session) -> Iterator[str]:
    """Yield the JSON lines of `session`'s log: a header, then every entry.

    The header counts the entries (``"entry_count"``), each entry line
    carries its position in the log (``"seq"``, from 1) and the digest of
    each of its entry's fields (``"digests"``): reading the log back refuses
    a field changed since, a line deleted, repeated, moved or added, and a
    file cut short, naming the line.

    Each line encodes to UTF-8: a lone surrogate (text decoded from bytes
    that were not UTF-8, such as a file name) is written as its JSON escape,
    which reads back as the same text.
    """
    entries = session.entries
    header = {
        "format": FORMAT,
        "v": serde.SCHEMA_VERSION,
        "session_id": session.id,
        "log_version": LOG_VERSION,
        COUNT: len(entries),
    }
    yield json.dumps(header, sort_keys=True)
    for seq, entry in enumerate(entries, start=1):
        line = serde.envelope(entry)
        data = line["data"]
        assert isinstance(data, dict)  # an entry's JSON is an object
        line[DIGESTS] = field_digests(data)  # type: ignore[assignment]
        line[SEQ] = seq
        yield serde.dumps(line)


def dump_session(session: Session, path: str) -> int:
    """Write `session`'s log to `path` as JSON lines; return the entry count.

    Raises:
        ConfigError: `session` is not a `Session` (nothing is written).
        OSError: `path` cannot be written (a file it began is removed).
    """
    if not isinstance(session, Session):
        raise ConfigError("session", session, "a Session (Session.load, agent.session)")
    write_text(path, (line + "\n" for line in session_lines(session)))
    return session.version


async def load_session(
    lines: Iterable[str] | str | bytes, store: SessionStore | None = None
) -> Session:
    """Read a log written by `dump_session` into `store` and open it.

    The whole log is checked first, in memory: a log that fails a check
    writes nothing. It is then written in one append.

    Args:
        lines: The log: its lines (an open text file works), or its whole
            text as `str` or UTF-8 `bytes`; JSON lines, or the one JSON
            document ``turnfsm sessions export --format json`` writes.
        store: Where to put the session (a new `MemoryStore` if None).

    Raises:
        CorruptRecord: the log cannot be read, naming the line (or the
            document's ``entries[i]``, with the line it begins on when the
            document spans lines) and the field: text that is not UTF-8
            (a compressed file is named as such) or not JSON, a missing or
            foreign header or version, a line that is not an entry (a second
            header), no entries at all, a line deleted, repeated, moved or
            added (its ``seq`` is not the next position), fewer entries than
            the header's ``entry_count`` (a file cut short after a whole
            line), a field changed or a line's ``digests`` removed, an entry
            of a run opened nowhere before it (or opened twice), an entry of
            a run after its final end (done, failed or cancelled), a
            compaction pass logged twice, a commit of messages no earlier
            event brought in, or a committed history that is not a whole
            conversation (a tool result without its call).
        SessionConflict: `store` already holds that session (nothing
            written); its message says how to go on.
        ConfigError: `lines` is none of those (a path: read the file first)
            or holds nothing but blank lines, or `store` is not a
            `SessionStore`.
    """
    if store is not None:
        check_store(store)
    session_id, located = _read(lines)
    session = await _project(session_id, located)
    if store is None:
        return session  # its own MemoryStore holds the checked log
    try:
        await store.append(session_id, session.entries, expected_version=0)
    except SessionConflict as exc:
        raise attrs.evolve(exc, loading=True) from None
    return await Session.load(store, session_id)


# -- reading the text ----------------------------------------------------------


def _read(source: Iterable[str] | str | bytes) -> tuple[str, list[tuple[str, Entry]]]:
    """The log's session id, and each entry with where it is in the file."""
    rows = _rows(source)
    if not any(row.strip() for row in rows):
        # Nothing to be corrupt: no log at all (an empty file, an empty pipe).
        raise ConfigError(
            "lines",
            source if isinstance(source, str | bytes) else "",
            "a session log, as dump_session or `turnfsm sessions export` writes "
            "it (this one is empty)",
        )
    # Blank lines before the header are passed over, as between entries.
    head = next(n for n, row in enumerate(rows) if row.strip())
    first = _json_or_none(rows[head])
    if first is not None and not isinstance(first, dict):
        raise CorruptRecord(_LOG, f"line {head + 1}", _NOT_A_HEADER)
    if first is not None and "entries" not in first:
        header = f"line {head + 1}"
        session_id, count = _header(header, first)
        last = len(rows)
        lines = [
            (f"line {number}", _json(number, row, last))
            for number, row in enumerate(rows[head + 1 :], start=head + 2)
            if row.strip()
        ]
        where = f"line {head + 2}"
    else:  # one JSON document, on one line or many
        document = _document(rows) if first is None else first
        entries = document.get("entries")
        header = ""
        session_id, count = _header(
            header, {k: v for k, v in document.items() if k != "entries"}
        )
        if not isinstance(entries, list):
            raise CorruptRecord(
                _LOG, "entries", f"expected a list of entries, got {_kind(entries)}"
            )
        # A document on many lines (as the export writes it): each entry
        # is named with the line it begins on, for an editor to go to.
        starts = _entry_lines("\n".join(rows)) if first is None else []
        if len(starts) != len(entries):  # a key given twice, say: none is sure
            starts = []
        named = [
            f"entries[{i}] (from line {starts[i]})"
            if i < len(starts)
            else f"entries[{i}]"
            for i in range(len(entries))
        ]
        lines = list(zip(named, entries, strict=True))
        where = "entries"
    if count is None:
        located = [(name, _entry(name, data, whole=False)) for name, data in lines]
        _refuse_positions_in_an_old_log(header, lines)
    else:
        places = _places(lines)
        located = []
        for expected, (name, data) in enumerate(lines, start=1):
            _check_position(name, data, expected, places, count)
            located.append((name, _entry(name, data, whole=True)))
    if not located:
        raise CorruptRecord(
            _LOG,
            where,
            "no entries after the header: a session's log holds at "
            "least the opening of its first run",
        )
    if count is not None and len(located) < count:
        # Every line read is in its place: the ones after the last are not.
        raise CorruptRecord(
            _LOG,
            located[-1][0],
            f"the log ends after this entry, the {_nth(len(located))} of the "
            f"{count} its header counts: the file was cut short after it (a "
            "copy or a download that stopped); export the session again, or "
            "copy the whole file",
        )
    return session_id, located


def _rows(source: Iterable[str] | str | bytes) -> list[str]:
    """The log's lines, its text checked to be UTF-8."""
    if isinstance(source, os.PathLike):
        raise ConfigError(
            "lines",
            source,
            "the log's text, bytes or lines, not its path: read the file"
            " (load_session(path.read_text()), or an open text file)",
        )
    if isinstance(source, str):
        text = source.removeprefix("\ufeff").strip()
        if text and "\n" not in text and not text.startswith(("{", "[")):
            # One line of no JSON is no log at all: most likely a file's name.
            raise ConfigError(
                "lines",
                source,
                "the log's text (a header line and its entries, or one JSON"
                " document), not a file's name: read the file"
                " (load_session(Path(name).read_text()))",
            )
    if isinstance(source, bytearray | memoryview):
        source = bytes(source)
    if isinstance(source, bytes):
        data = source
        _refuse_compressed(data)
        try:
            source = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            line = data.count(b"\n", 0, exc.start) + 1
            raise _not_utf8(line, data[exc.start]) from None
    if isinstance(source, str):
        return source.removeprefix("\ufeff").split("\n")
    if not isinstance(source, Iterable):
        raise ConfigError("lines", source, "the log's text, bytes or lines")
    rows: list[str] = []
    try:
        rows.extend(source)
    except UnicodeDecodeError as exc:  # a file opened as UTF-8 that is not
        raise _not_utf8(len(rows) + 1, exc.object[exc.start]) from None
    if rows and all(isinstance(row, bytes) for row in rows):  # a binary file
        return _rows(b"".join(rows))  # type: ignore[arg-type]
    for i, row in enumerate(rows):
        if not isinstance(row, str):
            raise ConfigError(f"lines[{i}]", row, "a line of text (str)")
    if rows:
        rows[0] = rows[0].removeprefix("\ufeff")
    return rows


_COMPRESSED: Final = {
    b"\x1f\x8b": ("gzip", "gunzip"),
    b"\x28\xb5\x2f\xfd": ("zstd", "unzstd"),
    b"\xfd7zXZ\x00": ("xz", "unxz"),
    b"BZh": ("bzip2", "bunzip2"),
    b"PK\x03\x04": ("zip", "unzip"),
}
"""A compressed file's first bytes: its format, and the tool that decompresses it."""


def compressed(data: bytes) -> str | None:
    """What to do with `data` if it is compressed (by its first bytes), else None.

    ``gzip-compressed data, not a log's text: decompress it first (gunzip
    FILE)``.
    """
    for magic, (kind, how) in _COMPRESSED.items():
        if data.startswith(magic):
            return (
                f"{kind}-compressed data, not a log's text: decompress it first "
                f"({how} FILE)"
            )
    return None


def _refuse_compressed(data: bytes) -> None:
    """Refuse a compressed log by its format (it read as text that is not UTF-8)."""
    said = compressed(data)
    if said is not None:
        raise CorruptRecord(_LOG, "line 1", said)


def _not_utf8(line: int, byte: int) -> CorruptRecord:
    return CorruptRecord(
        _LOG,
        f"line {line}",
        f"not UTF-8 text (byte {byte:#04x}); a session log is UTF-8: write it "
        "again in that encoding",
    )


def _document(rows: list[str]) -> dict[str, Any]:
    """The log as one JSON document (an export in ``--format json``)."""
    try:
        data = json.loads("\n".join(rows))
    except json.JSONDecodeError as exc:
        raise CorruptRecord(
            _LOG, f"line {exc.lineno}", f"not JSON: {exc.msg} (column {exc.colno})"
        ) from None
    except RecursionError:
        raise CorruptRecord(_LOG, "", _TOO_DEEP) from None
    if not isinstance(data, dict):
        raise CorruptRecord(_LOG, "line 1", _NOT_A_HEADER)
    return data


_WHITESPACE: Final = re.compile(r"[ \t\n\r]*")


def _space(text: str, at: int) -> int:
    """Where the JSON whitespace from `at` on ends."""
    found = _WHITESPACE.match(text, at)
    assert found is not None  # it matches the empty string too
    return found.end()


def _entry_lines(text: str) -> list[int]:
    """The line each entry of a JSON document's ``entries`` begins on.

    Empty when the text is not the one object holding that list (the
    document was read already: this only locates its entries).
    """
    decode = json.JSONDecoder().raw_decode
    at = _space(text, int(text.startswith("\ufeff")))
    if not text.startswith("{", at):
        return []
    at += 1
    try:
        while True:
            at = _space(text, at)
            key, at = decode(text, at)
            at = _space(text, at) + 1  # past the colon
            at = _space(text, at)
            if key != "entries":
                _, at = decode(text, at)
                at = _space(text, at) + 1  # past a comma
                continue
            lines: list[int] = []
            line, counted = 1, 0
            at = _space(text, at + 1)  # past the bracket
            while not text.startswith("]", at):
                line += text.count("\n", counted, at)
                counted = at
                lines.append(line)
                _, at = decode(text, at)
                at = _space(text, at)
                if text.startswith(",", at):
                    at = _space(text, at + 1)
            return lines
    except (ValueError, RecursionError):
        return []


_NOT_A_HEADER: Final = (
    f'not a session log header (a JSON object with "format": "{FORMAT}", '
    '"v" and "session_id")'
)
_TOO_DEEP: Final = "nested deeper than any session log is"


def _header(where: str, data: dict[str, Any]) -> tuple[str, int | None]:
    """Check the header; return the session id it names, and its entry count.

    The count is None for a log written before lines carried their positions.
    """
    if data.get("format") != FORMAT:
        raise CorruptRecord(_LOG, where or "format", _NOT_A_HEADER)
    _check_keys(where, data, _HEADER_KEYS)
    if "v" not in data:
        raise CorruptRecord(
            _LOG, _at(where, "v"), "missing: the header names the log's version"
        )
    if data["v"] != serde.SCHEMA_VERSION:
        raise CorruptRecord(
            _LOG,
            _at(where, "v"),
            f"unknown version {data['v']!r}; this turnfsm reads version "
            f"{serde.SCHEMA_VERSION}",
        )
    try:
        session_id = check_session_id(data.get("session_id"))
    except ConfigError as exc:
        raise CorruptRecord(
            _LOG,
            _at(where, "session_id"),
            f"{exc.value!r} is not a session id (expected {exc.expected})",
        ) from None
    layout = data.get("log_version", 1)
    if layout == 1 and not isinstance(layout, bool):
        return session_id, None  # written before lines carried their positions
    if layout != LOG_VERSION or isinstance(layout, bool):
        raise CorruptRecord(
            _LOG,
            _at(where, "log_version"),
            f"unknown log version {layout!r}; this turnfsm reads logs of version "
            f"{LOG_VERSION} and those written before, of version 1 or none (a "
            "newer turnfsm wrote this one: read it with that version)",
        )
    count = data.get(COUNT)
    if not _is_count(count) or count < 0:
        raise CorruptRecord(
            _LOG,
            _at(where, COUNT),
            "missing: the header counts the log's entries"
            if count is None
            else f"expected the number of entries the log holds, got {count!r}",
        )
    return session_id, count


def _is_count(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _nth(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10)
    return f"{n}{suffix or 'th'}"


def _places(lines: list[tuple[str, Any]]) -> dict[int, str]:
    """Where the first line of each position (``seq``) in the log is."""
    places: dict[int, str] = {}
    for name, data in lines:
        seq = data.get(SEQ) if isinstance(data, dict) else None
        if _is_count(seq):
            places.setdefault(seq, name)
    return places


def _check_position(
    where: str, data: Any, expected: int, places: dict[int, str], count: int
) -> None:
    """Refuse an entry line that is not the `expected`-th entry of the log."""
    if not isinstance(data, dict) or data.get("format") == FORMAT:
        return  # reading the entry names what it is instead
    field = _at(where, SEQ)
    if SEQ not in data:
        raise CorruptRecord(
            _LOG,
            field,
            "missing: each entry line of this log carries its position in "
            "the log (1 for the first entry)",
        )
    seq = data[SEQ]
    if not _is_count(seq) or seq < 1:
        raise CorruptRecord(
            _LOG,
            field,
            f"expected the entry's position in the log (1, 2, ...), got {seq!r}",
        )
    if seq > count:
        reason = (
            f"the {_nth(seq)} entry of a log whose header counts {count}: "
            "a line was added"
        )
    elif seq == expected:
        return
    elif seq < expected:
        reason = (
            f"the {_nth(seq)} entry again ({places[seq]} holds it too): "
            "a line was repeated"
        )
    elif expected in places:
        reason = (
            f"the {_nth(seq)} entry where the {_nth(expected)} belongs "
            f"({places[expected]} holds it): the lines are out of order"
        )
    else:
        missing = seq - expected
        what = {
            1: f"the {_nth(expected)} entry is",
            2: f"the {_nth(expected)} and {_nth(seq - 1)} entries are",
        }.get(missing, f"the {_nth(expected)} to {_nth(seq - 1)} entries are")
        reason = (
            f"the {_nth(seq)} entry, but {what} nowhere in the file: "
            f"{'a line was' if missing == 1 else 'lines were'} deleted before it"
        )
    raise CorruptRecord(_LOG, field, reason)


def _refuse_positions_in_an_old_log(header: str, lines: list[tuple[str, Any]]) -> None:
    """Refuse entry lines carrying positions under a header that lost its version."""
    for name, data in lines:
        if isinstance(data, dict) and SEQ in data:
            raise CorruptRecord(
                _LOG,
                _at(header, "log_version"),
                f"missing, yet {name} carries its position in the log ({SEQ}), "
                f"as a log of version {LOG_VERSION} does: the header was changed "
                "since the log was written",
            )


def _entry(where: str, data: Any, *, whole: bool) -> Entry:
    """Read one entry line; `whole`: the log's lines all carry their digests."""
    if isinstance(data, dict) and data.get("format") == FORMAT:
        raise CorruptRecord(
            _LOG, where, "a second header: a log has one, on its first line"
        )
    if isinstance(data, dict):
        _check_keys(where, data, _LINE_KEYS)
    if isinstance(data, dict) and (DIGESTS in data or whole):
        _check_digests(where, data)
    try:
        return serde.open_envelope(data, Entry)  # type: ignore[no-any-return]
    except CorruptRecord as exc:
        # A line of no known entry type is named as the log's, not by the
        # union of every type it could have been.
        kind = _LOG if " | " in exc.type else exc.type
        raise CorruptRecord(kind, _at(where, exc.path), exc.reason) from None
    except RecursionError:
        raise CorruptRecord(_LOG, where, _TOO_DEEP) from None


_HEADER_KEYS: Final = frozenset({"format", "v", "session_id", "log_version", COUNT})
_LINE_KEYS: Final = frozenset({"v", "type", "data", DIGESTS, SEQ})


def _check_keys(where: str, line: dict[str, Any], known: frozenset[str]) -> None:
    """Refuse a key no reader knows: read and written back, it would be lost."""
    unknown = sorted(set(line) - known)
    if unknown:
        raise CorruptRecord(
            _LOG,
            _at(where, unknown[0]),
            "not a field of a session log line",
        )


def _check_digests(where: str, line: dict[str, Any]) -> None:
    """Refuse an entry line whose fields are not the ones its digests were made of.

    A log written before lines carried digests has none, and is read as it is.
    """
    kind = line.get("type")
    kind = kind if isinstance(kind, str) else _LOG
    digests, data = line.get(DIGESTS), line.get("data")
    if not isinstance(data, dict):
        return  # reading the entry names its missing or malformed data
    if digests is None:
        raise CorruptRecord(
            kind,
            _at(where, DIGESTS),
            "missing: each entry line of this log carries its fields' digests, "
            "and this one's were removed (so an edit of it cannot be told)",
        )
    if not isinstance(digests, dict):
        raise CorruptRecord(
            kind, _at(where, DIGESTS), "expected an object of the entry's field digests"
        )
    made = field_digests(data)
    for name in sorted(made.keys() | digests.keys()):
        if name not in digests:
            reason = "a field added since the log was written"
        elif name not in made:
            reason = "missing: the field was removed since the log was written"
        elif made[name] != digests[name]:
            reason = (
                "changed since the log was written (its content no longer has "
                "the digest written beside it)"
            )
        else:
            continue
        raise CorruptRecord(kind, _at(where, f"data.{name}"), reason)


def _json(number: int, line: str, last: int) -> Any:
    try:
        return json.loads(line)
    except json.JSONDecodeError as exc:
        reason = f"not JSON: {exc.msg} (column {exc.colno})"
        if number == last and not line.endswith("\n"):
            # The file stops inside its last line: a write or a copy cut short.
            reason = f"cut short, the file ends inside it ({reason})"
        raise CorruptRecord(_LOG, f"line {number}", reason) from None
    except RecursionError:
        raise CorruptRecord(_LOG, f"line {number}", _TOO_DEEP) from None


def _json_or_none(line: str) -> Any:
    try:
        return json.loads(line)
    except (json.JSONDecodeError, RecursionError):
        return None


def _at(where: str, field: str) -> str:
    return f"{where}: {field}" if where and field else where or field


def _kind(value: object) -> str:
    names = {dict: "an object", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number")


# -- checking the session it projects to -------------------------------------


async def _project(session_id: str, located: list[tuple[str, Entry]]) -> Session:
    """The session the entries project to, in memory, every check passed."""
    session = Session(session_id)
    for where, entry in located:
        if isinstance(entry, RunOpened) and session.has_run(entry.run_id):
            raise CorruptRecord(
                "RunOpened",
                _at(where, "data.run_id"),
                f"run {entry.run_id!r} was opened before; a run opens once",
            )
        run_id = getattr(entry, "run_id", "")
        if run_id and not isinstance(entry, RunOpened) and session.has_run(run_id):
            ended = session.run(run_id).outcome
            if ended != "running" and ended not in GOES_ON:
                said = (
                    "a run ends once"
                    if isinstance(entry, RunEnded)
                    else "no entry of a run comes after its end"
                )
                raise CorruptRecord(
                    type(entry).__name__,
                    _at(where, "data.run_id"),
                    f"run {run_id!r} ended before ({ended}); {said}",
                )
        if isinstance(entry, Committed):
            size = len(session.history)
            if not 0 <= entry.keep <= size:
                raise CorruptRecord(
                    "Committed",
                    _at(where, "data.keep"),
                    f"keeps {entry.keep} messages of a history of {size}",
                )
        try:
            await session.append(entry)
        except ConfigError as exc:
            if exc.field.endswith(".run_id"):  # an entry of a run never opened
                raise CorruptRecord(
                    type(entry).__name__,
                    _at(where, ""),
                    unopened(entry.run_id),
                ) from None
            # a commit of messages no event brought
            raise CorruptRecord(
                "Committed", _at(where, "data.messages"), unbrought(exc.value)
            ) from None
        except DuplicateRecord as exc:  # a pass's line repeated
            raise CorruptRecord(
                "CompactionRecord",
                _at(where, "data.key"),
                f"the pass {exc.key!r} is logged on an earlier line too; "
                "a pass is logged once",
            ) from None
        except CorruptRecord as exc:
            # The session names the entry's position; the file names its line.
            field = exc.path.partition("]")[2].lstrip(".")
            raise CorruptRecord(
                exc.type, _at(where, f"data.{field}" if field else ""), exc.reason
            ) from None
        if isinstance(entry, Committed):
            try:
                OpenCalls.of(session.history).require_closed()
            except InvalidMessage as exc:
                raise CorruptRecord(
                    "Committed",
                    _at(where, "data.messages"),
                    f"the committed history is not a whole conversation: {exc}",
                ) from None
    return session
