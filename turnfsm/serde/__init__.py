"""One converter between turnfsm's records and plain JSON.

Every record that crosses a process boundary (a session log, a store, a
trace) goes through the one `cattrs.Converter` of this module, so each type
has exactly one JSON form:

- a `Message` is its `Message.to_dict` form; a `MessageLog` (or a `Joined`
  view) is a list of messages and reads back as a `MessageLog`;
- an event or a decision is an object tagged with its class name,
  ``{"type": "ModelReplied", "message": {...}, "usage": null}``;
- an error (any class of `turnfsm.errors`) is a value tagged the same way,
  ``{"type": "CompactionStalled", "used": 5, "limit": 9}``, and reads back as
  the same class with the same fields (an empty optional collection such as
  `ContextExceeded.largest` is left out, and reads back empty);
- a `Snapshot` is its `Snapshot.to_dict` form;
- any other frozen attrs class is an object of its fields (keyed by their
  ``__init__`` names, so a private ``_x`` field is ``"x"``); a union of several
  attrs classes is tagged with ``"type"`` like the events;
- a tagged class's own field named ``type`` (`RunCrashed.type`) is keyed
  ``"type_"`` (`ESCAPED_TAG`), so the tag stays unambiguous;
- enums are their values, mappings objects, tuples and sequences arrays.

Reading back is strict: a value of the wrong JSON type (``"5"`` for an int), a
missing field, an unknown tag or a malformed message raises one error,
`CorruptRecord`, naming what was read, where in the data (``path``) and why.

`envelope` wraps a top-level record with the schema version and its type
(``{"v": 1, "type": "Snapshot", "data": {...}}``); `open_envelope` rejects a
version it does not know.

The converter and its hooks live in private modules: `_converter` (plain
values and the one error), `_records` (messages, snapshots), `_tags` (events,
decisions, errors, unions), `_json` (the conversions) and `_envelope`.
"""

from __future__ import annotations

from turnfsm.serde._converter import TAG
from turnfsm.serde._envelope import SCHEMA_VERSION, envelope, open_envelope
from turnfsm.serde._json import (
    dumps,
    error_from_json,
    error_to_json,
    from_json,
    loads,
    to_json,
)
from turnfsm.serde._tags import ESCAPED_TAG

__all__ = [
    "ESCAPED_TAG",
    "SCHEMA_VERSION",
    "TAG",
    "dumps",
    "envelope",
    "error_from_json",
    "error_to_json",
    "from_json",
    "loads",
    "open_envelope",
    "to_json",
]
