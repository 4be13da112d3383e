"""The bytes a database store writes for an entry do not change.

A row written by one version is read by the next, and a message already
stored is found again by its digest: every speed-up of the row encoder must
write exactly the text a plain path writes (the envelope as compact JSON
with sorted keys, each message swapped for a reference to its own text).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import attrs
from hypothesis import given, settings

from tests.persistence.test_store import entries
from tests.profiles import sized
from turnfsm import serde
from turnfsm.core import ModelReplied, ToolsFinished
from turnfsm.messages import Message
from turnfsm.persistence import EventRecorded, TurnRecord
from turnfsm.persistence._rows import encode
from turnfsm.testing import reply, sample_entries, tool_call
from turnfsm.values import Usage

_KEYS = {"id", "role", "parts", "metadata"}


def _text(value: object) -> str:
    text = json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
    return "".join(f"\\u{ord(c):04x}" if "\ud800" <= c <= "\udfff" else c for c in text)


def _reference(entry: Any) -> tuple[str, str, str, dict[str, str], str | None]:
    """The row by the plain path: one walk, `json.dumps` with its options."""
    messages: dict[str, str] = {}

    def walk(value: Any) -> Any:
        if isinstance(value, dict):
            if value.keys() == _KEYS and isinstance(value["parts"], list):
                text = _text(value)
                digest = hashlib.sha256(text.encode()).hexdigest()[:32]
                messages[digest] = text
                return {"$msg": digest}
            return {k: walk(v) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v) for v in value]
        return value

    body = _text(walk(serde.envelope(entry)))
    return (
        type(entry).__name__,
        entry.run_id,
        body,
        messages,
        getattr(entry, "key", None),
    )


def _row(entry: Any) -> tuple[str, str, str, dict[str, str], str | None]:
    row = encode(entry)
    return (row.kind, row.run_id, row.body, dict(row.messages), row.key)


@settings(max_examples=sized(300), deadline=None)
@given(entry=entries())
def test_every_entry_is_written_as_the_plain_path_writes_it(entry: Any) -> None:
    assert _row(entry) == _reference(entry)


def _varied() -> list[Any]:
    call = tool_call("grep", "c1", pattern="héllo ☃ \udcff", n=2**80, opts={"z": [1.5]})
    asked = attrs.evolve(reply("thinking…", call), id="msg_a")
    answer = attrs.evolve(
        Message.tool_result("c1", "found \x00 and 𝄞", is_error=False),
        id="msg_b",
        metadata={"ünï": [2**70, None, True]},
    )
    usage = Usage(input_tokens=10**12, output_tokens=3)
    return [
        EventRecorded(
            run_id="run_1",
            index=3,
            event=ModelReplied(message=asked, usage=usage),
            phase="run_tools",
            decision="run_tools:c1",
            at=1796557606.3331435,
        ),
        EventRecorded(
            run_id="run_1",
            index=4,
            event=ToolsFinished(results=(answer, answer)),
            phase="start",
            decision="measure",
            at=0.1,
        ),
        TurnRecord(
            run_id="run_1",
            turn=2**40,
            keep=0,
            added=(asked.id, "ünï"),
            output=asked.id,
            usage=usage,
        ),
    ]


def test_sample_entries_are_written_as_the_plain_path_writes_them() -> None:
    for entry in sample_entries():
        assert _row(entry) == _reference(entry)


def test_varied_entries_keep_the_bytes_earlier_versions_wrote() -> None:
    # The digest of the rows of `_varied()` as this version writes them:
    # a change of the encoder that changes a byte of them fails here.
    written = hashlib.sha256()
    for entry in _varied():
        row = _row(entry)
        assert row == _reference(entry)
        written.update(repr(row).encode("utf-8", "surrogatepass"))
    assert written.hexdigest() == GOLDEN


GOLDEN = "7dc45ee481d51f084948e471abe883373987186eff8fd6045215f3e71383ef62"
