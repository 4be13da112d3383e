"""Log entries as database rows, with message content stored once.

Every database store writes the same rows: an entry becomes its versioned
JSON envelope (`turnfsm.serde.envelope`) in which every message is replaced
by a reference to its content (``{"$msg": DIGEST}``), and the contents go to
a table of their own, keyed by the digest of their JSON. A message carried by
many events (a compaction keeps most of the conversation) is stored once.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from typing import Any, Final, final

import attrs

from turnfsm import serde
from turnfsm.errors import CorruptRecord
from turnfsm.persistence._records import Entry

__all__ = ["MESSAGE_REF", "Row", "decode", "encode", "entry_kind"]

MESSAGE_REF: Final = "$msg"
"""The key of a message reference inside a stored entry."""

_MESSAGE_KEYS: Final = frozenset({"id", "role", "parts", "metadata"})


@final
@attrs.frozen(kw_only=True)
class Row:
    """One entry ready for a database: its kind, run, body and message contents.

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


_ENCODER: Final = json.JSONEncoder(
    separators=(",", ":"), sort_keys=True, ensure_ascii=False
)


def _c_encoder() -> Callable[[object], str] | None:
    """The C encoder `json.dumps` builds per call, built once (None if absent).

    Same function, same options (compact, sorted keys, no ASCII escaping,
    NaN allowed) as `_ENCODER`, minus the per-call set-up and the circular
    reference check (a record's JSON form cannot be circular).
    """
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # pragma: no cover - CPython always has it
        return None
    try:
        iterencode = make(
            None,
            _ENCODER.default,
            json.encoder.encode_basestring,
            None,
            _ENCODER.key_separator,
            _ENCODER.item_separator,
            True,  # sort_keys
            False,  # skipkeys
            True,  # allow_nan
        )
    except TypeError:  # pragma: no cover - another signature: use the slow path
        return None

    def dumps(value: object) -> str:
        if isinstance(value, str):
            return _ENCODER.encode(value)
        return "".join(iterencode(value, 0))

    sample = {"b": [1, 2.5, None, True], "a": {"é": "\u0000\n"}, "c": float("nan")}
    return dumps if dumps(sample) == _ENCODER.encode(sample) else None


_dumps: Final[Callable[[object], str]] = _c_encoder() or _ENCODER.encode
"""`json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)`."""


def _reference(value: dict[str, Any], out: dict[str, str]) -> dict[str, str]:
    text = _dumps(value)
    digest = hashlib.sha256(text.encode()).hexdigest()[:32]
    out[digest] = text
    return {MESSAGE_REF: digest}


def _swap(item: Any, out: dict[str, str]) -> Any:
    """Return `item` with the messages in it replaced by references."""
    if isinstance(item, dict):
        if item.keys() == _MESSAGE_KEYS and isinstance(item["parts"], list):
            return _reference(item, out)
        return _strip(item, out)
    if isinstance(item, list):
        return _strip(item, out)
    return item


def _strip(value: Any, out: dict[str, str]) -> Any:
    """Return the container `value` with every message in it replaced by a reference.

    Copy on write: a dict or list holding no message is returned as it is
    (nothing in it changes), so the walk allocates only along the paths
    that lead to a message.
    """
    pairs = value.items() if isinstance(value, dict) else enumerate(value)
    changed: Any = None
    for key, item in pairs:
        new = _swap(item, out)
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
    """
    messages: dict[str, str] = {}
    body = _strip(serde.envelope(entry), messages)
    return Row(
        kind=type(entry).__name__,
        run_id=entry.run_id,
        body=_dumps(body),
        messages=messages,
        key=getattr(entry, "key", None),
    )


def _fill(value: Any, messages: Mapping[str, Any]) -> Any:
    if isinstance(value, dict):
        if value.keys() == {MESSAGE_REF}:
            digest = value[MESSAGE_REF]
            try:
                found = messages[digest]
            except KeyError:
                raise CorruptRecord(
                    "Entry", MESSAGE_REF, f"message {digest!r} is missing"
                ) from None
            return json.loads(found) if isinstance(found, str) else found
        return {k: _fill(v, messages) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(v, messages) for v in value]
    return value


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
        try:
            body = json.loads(body)
        except json.JSONDecodeError as exc:
            raise CorruptRecord("Entry", "", f"not JSON: {exc}") from None
    return serde.open_envelope(_fill(body, messages), Entry)  # type: ignore[no-any-return]


def entry_kind(entry: Entry) -> str:
    """Return the kind a row of `entry` is stored under (its class name)."""
    return type(entry).__name__
