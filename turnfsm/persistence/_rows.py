r"""Log entries as database rows, with message content stored once.

Every database store writes the same rows: an entry becomes its versioned
JSON envelope (`turnfsm.serde.envelope`) in which every message is replaced
by a reference to its content (``{"$msg": DIGEST}``), and the contents go to
a table of their own, keyed by the digest of their JSON. A message carried by
many events (a compaction keeps most of the conversation) is stored once.

Text a database cannot hold as UTF-8 (a lone surrogate, such as the
``"\udcff"`` an `os.listdir` name with undecodable bytes carries; a NUL on
PostgreSQL) is written as a JSON escape, the one mechanism of every database
store: inside a JSON body a lone surrogate is its ``\udcff`` escape (which
``json.loads`` reads back as the same character), and an id column (a
session's, a run's, a lease owner's) that would hold such text holds the id's
JSON string literal instead (`column_text`).
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import json
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Final, NamedTuple

from turnfsm import serde
from turnfsm._json import compact_encoder, escape_surrogates
from turnfsm.errors import CorruptRecord
from turnfsm.persistence._records import Entry, RunOpened

__all__ = [
    "MESSAGE_REF",
    "Row",
    "column_text",
    "column_value",
    "counter_problem",
    "decode",
    "decode_log",
    "delegated_openings",
    "encode",
    "entry_kind",
    "field_digests",
]

MESSAGE_REF: Final = "$msg"
"""The key of a message reference inside a stored entry."""

_MESSAGE_KEYS: Final = frozenset({"id", "role", "parts", "metadata"})


class Row(NamedTuple):
    """One entry ready for a database: its kind, run, body and message contents.

    A named tuple: one is made per entry appended, and a tuple is made in
    one step where a frozen attrs class sets its fields one by one.

    Attributes:
        kind: The entry's class name (``EventRecorded``, ...).
        run_id: The run the entry belongs to.
        body: The envelope's JSON text, messages replaced by references.
        messages: Digest -> JSON text of each message the entry carries.
        key: The idempotency key of a compaction record, else None.
    """

    kind: str
    run_id: str
    body: str
    messages: Mapping[str, str]
    key: str | None = None


_plain_dumps: Final = compact_encoder(sort_keys=True)
"""`json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)`."""

_SURROGATE: Final = re.compile("[\ud800-\udfff]")


def _dumps(value: object) -> str:
    """Return `value`'s stored JSON text: compact, sorted keys, UTF-8 safe."""
    return escape_surrogates(_plain_dumps(value))


def _storable(value: str) -> bool:
    """Whether every database can hold `value` as it is in a text column."""
    if value.isascii():
        return "\x00" not in value
    return "\x00" not in value and _SURROGATE.search(value) is None


def _quoted(text: str) -> bool:
    """Whether `text` is what `column_text` writes for an id it quoted.

    That is a JSON string literal, exactly as `column_text` would write it,
    of an id that had to be quoted: one no database can hold as it is, or
    one that is itself such a literal (quoted again, so that no id is
    mistaken for another).
    """
    if not text.startswith('"'):
        return False
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return False
    return (
        isinstance(value, str)
        and escape_surrogates(json.dumps(value, ensure_ascii=False)) == text
        and (not _storable(value) or _quoted(value))
    )


def column_text(value: str) -> str:
    r"""Return the text an id column holds for the id `value`.

    An id every database can hold (no NUL, no lone surrogate) is held as it
    is, as every earlier turnfsm wrote it; any other id is held as its JSON
    string literal, quotes included (``"a\udcff"``). An id that happens to
    be such a literal already is quoted once more, so `column_value` reads
    every stored id back as exactly the id that was written.
    """
    if _storable(value) and not _quoted(value):
        return value
    return escape_surrogates(json.dumps(value, ensure_ascii=False))


def column_value(text: str) -> str:
    """Return the id an id column's `text` holds (the inverse of `column_text`)."""
    if _quoted(text):
        value: str = json.loads(text)
        return value
    return text


def _digest(text: str) -> str:
    """Return the key a message's stored JSON `text` is kept under."""
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def field_digests(data: Mapping[str, Any]) -> dict[str, str]:
    """Return the digest of each field of a record's JSON `data`, by name.

    The digest a store keeps a message's content under, of the field's JSON
    text as stored: written beside a record, it says whether the record was
    changed since.
    """
    return {name: _digest(_dumps(value)) for name, value in data.items()}


def _reference(value: dict[str, Any], out: dict[str, str]) -> dict[str, str]:
    text = _dumps(value)
    digest = _digest(text)
    out[digest] = text
    return {MESSAGE_REF: digest}


_LEAVES: Final = frozenset({str, int, float, bool, type(None)})
"""The exact types of JSON's leaves: nothing `_strip` looks for is inside one."""


def _strip(value: Any, out: dict[str, str]) -> Any:
    """Return the container `value` with every message in it replaced by a reference.

    Copy on write: a dict or list holding no message is returned as it is
    (nothing in it changes), so the walk allocates only along the paths
    that lead to a message. A leaf (a string, a number) is passed over
    where it is met, by its exact type (a set lookup, where telling it from
    a dict and a list took two `isinstance` calls).
    """
    pairs = value.items() if isinstance(value, dict) else enumerate(value)
    changed: Any = None
    for key, item in pairs:
        kind = type(item)
        if kind in _LEAVES:
            continue
        if kind is dict or isinstance(item, dict):
            if item.keys() == _MESSAGE_KEYS and isinstance(item["parts"], list):
                new = _reference(item, out)
            else:
                new = _strip(item, out)
        elif kind is list or isinstance(item, list):
            new = _strip(item, out)
        else:
            continue
        if new is not item:
            if changed is None:
                changed = dict(value) if isinstance(value, dict) else list(value)
            changed[key] = new
    return value if changed is None else changed


def encode(entry: Entry) -> Row:
    """Return the row `entry` is stored as.

    One walk over the entry's envelope (`serde.envelope`) swaps each message
    for its reference as it meets it; the body and every message are then
    JSON text written by one prebuilt encoder (compact, sorted keys).

    The envelope around the data is the same text for every entry of a
    class (`_frame`): only the data (`serde.to_json`) is walked and
    written, between the two, which is the text the whole envelope would
    be written as. Data that is itself a message (no entry's is) takes the
    whole envelope's path, where it becomes a reference.
    """
    messages: dict[str, str] = {}
    data = serde.to_json(entry)
    try:
        frame = _FRAMES[type(entry)]
    except KeyError:
        frame = _frame(entry)
    if frame is None or type(data) is not dict or data.keys() == _MESSAGE_KEYS:
        body = _dumps(_strip(serde.envelope(entry), messages))
    else:
        body = frame[0] + _dumps(_strip(data, messages)) + frame[1]
    return Row(
        type(entry).__name__,
        entry.run_id,
        body,
        messages,
        getattr(entry, "key", None),
    )


_FRAMES: Final[dict[type, tuple[str, str] | None]] = {}
"""Entry class -> its envelope's text before and after the data (`_frame`)."""

_DATA: Final = "data"
"""The envelope's key of the record's data (`serde.envelope`)."""


def _frame(entry: Entry) -> tuple[str, str] | None:
    """The envelope's text around the data, for every entry of `entry`'s class.

    Taken from `serde.envelope` itself, its data put aside: the version and
    the class name around it do not change from one entry of a class to
    the next. None (the whole envelope written each time) if the envelope
    is not that.
    """
    wrapped = serde.envelope(entry)
    frame = None
    if _DATA in wrapped and len(wrapped) == 3:  # the version, the type, the data
        text = _dumps({**wrapped, _DATA: 0})
        before, found, after = text.partition(f'"{_DATA}":0')
        if found:
            frame = (f'{before}"{_DATA}":', after)
    _FRAMES[type(entry)] = frame
    return frame


def _filled(
    value: dict[str, Any], messages: Mapping[str, Any], checked: set[str]
) -> Any:
    """Return the message a reference `value` names, or `value` if it is none.

    A message's text is checked against the digest it is kept under (once
    per digest in `checked`): text that no longer has its digest was
    changed after it was written, and is refused rather than read.
    """
    if len(value) != 1 or MESSAGE_REF not in value:
        return value
    digest = value[MESSAGE_REF]
    try:
        found = messages[digest]
    except (KeyError, TypeError):  # TypeError: a digest that is no key (a list)
        raise CorruptRecord(
            "Entry", MESSAGE_REF, f"message {digest!r} is missing"
        ) from None
    if isinstance(found, str):
        if digest not in checked:
            if _digest(found) != digest:
                raise CorruptRecord(
                    "Entry",
                    MESSAGE_REF,
                    f"message {digest!r} does not hold the content it was "
                    f"stored with (its content's digest is {_digest(found)!r})",
                )
            checked.add(digest)
        return _loads(found, f"{MESSAGE_REF}[{digest!r}]")
    return found


def _fill(value: Any, messages: Mapping[str, Any], checked: set[str]) -> Any:
    """Return the parsed body `value` with its references filled (`_filled`)."""
    if isinstance(value, dict):
        if value.keys() == {MESSAGE_REF}:
            return _filled(value, messages, checked)
        return {k: _fill(v, messages, checked) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(v, messages, checked) for v in value]
    return value


def counter_problem(version: int, rows: int) -> str | None:
    """Say what is wrong when a session's counter is not its number of rows.

    Args:
        version: The session's version counter, as stored.
        rows: How many rows its log holds (or the last row's number + 1).
    """
    if version == rows:
        return None
    return f"its version counter says {version} entries, the log holds {rows}"


def decode_log(
    session_id: str,
    bodies: Sequence[object],
    messages: Mapping[str, Any],
    *,
    version: int,
    seqs: Sequence[int] | None = None,
) -> tuple[Entry, ...]:
    """Rebuild the log of `session_id` from its rows, checking that it is whole.

    Args:
        session_id: The session (named in errors).
        bodies: The entries' bodies, in log order.
        messages: Digest -> message JSON for their references.
        version: The session's version counter, as stored.
        seqs: Each body's position, as stored (None: not checked).

    Raises:
        CorruptRecord: a row does not read back as an entry, a row is
            missing, or the version counter disagrees with the rows; its
            path names the session and the row
            (``sessions['s1'].entries[3]``).
    """
    where = f"sessions[{session_id!r}]"
    if seqs is not None:
        for index, seq in enumerate(seqs):
            if seq != index:
                raise CorruptRecord(
                    "Entry",
                    f"{where}.entries[{index}]",
                    f"the row stored there is numbered {seq}: rows are missing",
                )
    problem = counter_problem(version, len(bodies))
    if problem is not None:
        raise CorruptRecord("Session", f"{where}.version", problem)
    entries = []
    parser = _parser(messages)  # one for the log: its bodies share the messages
    with _collector_paused():
        for index, body in enumerate(bodies):
            try:
                if not isinstance(body, str):
                    kind = type(body).__name__
                    raise CorruptRecord(
                        "Entry", "", f"a {kind} where JSON text belongs"
                    )
                entries.append(_open(_parse(parser, body)))
            except CorruptRecord as exc:
                inner = f".{exc.path}" if exc.path else ""
                path = f"{where}.entries[{index}]{inner}"
                raise CorruptRecord(exc.type, path, exc.reason) from None
    return tuple(entries)


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector while a whole log is decoded.

    A log is read into many small objects, all of them kept: every
    collection their allocations set off walks again those made so far and
    finds no garbage (measured on a 42,000-entry log: about a sixth of its
    read, `bench/view_open.py`). The collector runs again after, however
    the decoding ended; if it was paused already, it is left paused.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def decode(body: str | Mapping[str, Any], messages: Mapping[str, Any]) -> Entry:
    """Rebuild the entry stored as `body`, with message contents from `messages`.

    Args:
        body: The stored envelope (JSON text or already parsed).
        messages: Digest -> message JSON (text or parsed) for its references.

    Raises:
        CorruptRecord: the body is not JSON, not an entry, or refers to a
            message that is not there.
    """
    if isinstance(body, str):
        return _open(_parse(_parser(messages), body))
    return _open(_fill(body, messages, set()))


def _open(filled: Any) -> Entry:
    return serde.open_envelope(filled, Entry)  # type: ignore[no-any-return]


_PLAIN: Final = json.JSONDecoder()


def _parser(messages: Mapping[str, Any]) -> json.JSONDecoder:
    """A JSON parser that fills the references to `messages` as it parses.

    Its object hook is called for each JSON object the parser builds, so a
    body is read in one pass (no second walk over it to fill references).
    """
    checked: set[str] = set()  # the digests whose text was checked
    return json.JSONDecoder(object_hook=lambda value: _filled(value, messages, checked))


def _parse(parser: json.JSONDecoder, body: str) -> Any:
    # A body that cannot hold a reference (no "$msg" in it, nor an escape
    # that could spell one) needs no hook: the plain parser is quicker.
    plain = MESSAGE_REF not in body and "\\u" not in body
    try:
        return _PLAIN.decode(body) if plain else parser.decode(body)
    except CorruptRecord:  # a reference the hook could not fill (a ValueError too)
        raise
    except (ValueError, RecursionError) as exc:
        raise CorruptRecord("Entry", "", f"not JSON: {exc}") from None


def _loads(text: str, path: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise CorruptRecord("Entry", path, f"not JSON: {exc}") from None


def delegated_openings(rows: Iterable[tuple[str, object]]) -> dict[str, RunOpened]:
    """The openings of delegated runs among `rows` (a session's key, a body).

    Each row is a session's first run's opening; the result is by session
    id, as `LinkingStore.list_delegated` returns it. Only a
    body that names a parent is decoded; one that does not read back is left
    out (loading its session says what is wrong with it).
    """
    found: dict[str, RunOpened] = {}
    for key, body in rows:
        if not isinstance(body, str) or '"parent"' not in body:
            continue
        try:
            entry = decode(body, {})
        except CorruptRecord:
            continue
        if isinstance(entry, RunOpened) and entry.parent is not None:
            found[column_value(key)] = entry
    return found


def entry_kind(entry: Entry) -> str:
    """Return the kind a row of `entry` is stored under (its class name)."""
    return type(entry).__name__
