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
from collections.abc import Mapping
from typing import Any, Final, final

import attrs

from turnfsm import serde
from turnfsm.errors import CorruptRecord
from turnfsm.persistence._records import Entry

__all__ = ["MESSAGE_REF", "Row", "decode", "encode", "entry_kind", "references"]

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


def _dumps(value: object) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)


def _is_message(value: Mapping[str, Any]) -> bool:
    return value.keys() == _MESSAGE_KEYS and isinstance(value.get("parts"), list)


def _strip(value: Any, out: dict[str, str]) -> Any:
    if isinstance(value, dict):
        if _is_message(value):
            text = _dumps(value)
            digest = hashlib.sha256(text.encode()).hexdigest()[:32]
            out[digest] = text
            return {MESSAGE_REF: digest}
        return {k: _strip(v, out) for k, v in value.items()}
    if isinstance(value, list):
        return [_strip(v, out) for v in value]
    return value


def encode(entry: Entry) -> Row:
    """Return the row `entry` is stored as."""
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


def references(body: str | Mapping[str, Any]) -> set[str]:
    """Return the message digests a stored body refers to."""
    found: set[str] = set()

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            if value.keys() == {MESSAGE_REF}:
                found.add(value[MESSAGE_REF])
            else:
                for v in value.values():
                    walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)

    walk(json.loads(body) if isinstance(body, str) else body)
    return found
