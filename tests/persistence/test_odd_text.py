"""Any text round-trips through the database stores' one encoding: ids through
their column form, entries through their JSON rows, lone surrogates and NULs
included, and what is plain is stored as every earlier turnfsm stored it."""

from __future__ import annotations

import json
import re

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.profiles import sized
from turnfsm.core import RunStarted
from turnfsm.messages import Message
from turnfsm.persistence import EventRecorded
from turnfsm.persistence._rows import column_text, column_value, decode, encode

_PAIR = re.compile("[\ud800-\udbff][\udc00-\udfff]")

# Every code point, lone surrogates too, with more of what escapes are made of.
ODD = st.text(
    st.one_of(
        st.characters(exclude_categories=()),
        st.sampled_from(
            ['"', "\\", "u", "d", "c", "f", "0", "\x00", "\udcff", "\ud800"]
        ),
    ),
    max_size=40,
).filter(lambda text: _PAIR.search(text) is None)


def _storable(text: str) -> bool:
    return "\x00" not in text and re.search("[\ud800-\udfff]", text) is None


@settings(max_examples=sized(2_000))
@given(ODD)
def test_an_id_reads_back_from_its_column_form_which_any_database_holds(
    value: str,
) -> None:
    stored = column_text(value)
    assert column_value(stored) == value
    assert _storable(stored)
    stored.encode("utf-8")  # no lone surrogate left
    if _storable(value) and not value.startswith('"'):
        assert stored == value  # what earlier versions stored, unchanged


@settings(max_examples=sized(500))
@given(ODD, ODD)
def test_two_ids_never_share_a_column_form(a: str, b: str) -> None:
    assert (column_text(a) == column_text(b)) == (a == b)


@settings(max_examples=sized(500))
@given(ODD)
def test_an_entry_with_any_text_reads_back_from_rows_a_database_holds(
    text: str,
) -> None:
    said = text if text.strip() else "x"  # a user message says something
    message = Message.user(said, id="m1", metadata={"k": text})
    entry = EventRecorded(
        run_id="r",
        index=0,
        event=RunStarted(input=(message,)),
        phase="start",
        decision="measure",
        at=1.0,
    )
    row = encode(entry)
    for stored in (row.body, *row.messages.values()):
        stored.encode("utf-8")
        json.loads(stored)
    back = decode(row.body, row.messages)
    assert back == entry
    assert isinstance(back, EventRecorded)
    assert isinstance(back.event, RunStarted)
    assert back.event.input[0].text == said
    assert back.event.input[0].metadata == {"k": text}
