"""Probe files (TOML, JSON), their refusals, and the present / absent check."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from turnfsm.errors import ConfigError
from turnfsm.evals import PROBE_KINDS, Probe, load_probes, present

TOML = """
[[probe]]
session = "support-42"
kind = "decision"
question = "Which database did we choose, and why?"
expect = ["PostgreSQL 16", "logical replication"]

[[probe]]
kind = "fact"
question = "What is the deploy code?"
expect = "7431"
"""


def test_a_toml_and_a_json_probe_file_read_the_same(tmp_path: Path) -> None:
    toml = tmp_path / "probes.toml"
    toml.write_text(TOML)
    rows = [
        {
            "session": "support-42",
            "kind": "decision",
            "question": "Which database did we choose, and why?",
            "expect": ["PostgreSQL 16", "logical replication"],
        },
        {"kind": "fact", "question": "What is the deploy code?", "expect": "7431"},
    ]
    js = tmp_path / "probes.json"
    js.write_text(json.dumps({"probe": rows}))
    expected = (
        Probe(
            kind="decision",
            question="Which database did we choose, and why?",
            expect=("PostgreSQL 16", "logical replication"),
            session="support-42",
        ),
        Probe(kind="fact", question="What is the deploy code?", expect=("7431",)),
    )
    assert load_probes(toml) == expected
    assert load_probes(js) == expected


@pytest.mark.parametrize(
    ("text", "field", "value"),
    [
        (
            '[[probe]]\nkind = "rumour"\nquestion = "q"\nexpect = "x"',
            "probe[0].kind",
            "rumour",
        ),
        (
            '[[probe]]\nkind = "fact"\nquestion = ""\nexpect = "x"',
            "probe[0].question",
            "",
        ),
        (
            '[[probe]]\nkind = "fact"\nquestion = "q"\nexpect = []',
            "probe[0].expect",
            (),
        ),
        (
            '[[probe]]\nkind = "fact"\nquestion = "q"\nexpect = [""]',
            "probe[0].expect",
            ("",),
        ),
        ('[[probe]]\nkind = "fact"\nquestion = "q"', "probe[0].expect", None),
        (
            '[[probe]]\nkind = "fact"\nquestion = "q"\nexpect = "x"\nanswer = 1',
            "probe[0].answer",
            1,
        ),
        ("title = 'no probes'", "probe", None),
        ("probe = [1]", "probe[0]", 1),
    ],
)
def test_a_bad_probe_is_refused_naming_the_field(
    tmp_path: Path, text: str, field: str, value: object
) -> None:
    path = tmp_path / "probes.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_probes(path)
    assert info.value.field == f"{path}: {field}"
    assert info.value.value == value


@pytest.mark.parametrize(
    ("text", "meant"),
    [
        ('[[probes]]\nkind = "fact"\nquestion = "q"\nexpect = "x"', "[[probes]]"),
        ('[[Probe]]\nkind = "fact"\nquestion = "q"\nexpect = "x"', "[[Probe]]"),
    ],
)
def test_a_misspelt_probe_table_is_named(tmp_path: Path, text: str, meant: str) -> None:
    # It said "probe=None: expected a list of probes", the probes in the
    # file not mentioned.
    path = tmp_path / "probes.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_probes(path)
    assert str(info.value).endswith(
        f"expected a list of probes ([[probe]] tables in TOML; the file has "
        f"{meant}: did you mean [[probe]]?)"
    )


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        ("probes.toml", "[[probe]\n", "a TOML probe file"),
        ("probes.json", "{", "a JSON probe file"),
        ("missing.toml", None, "a readable probe file"),
    ],
)
def test_an_unreadable_probe_file_is_refused(
    tmp_path: Path, name: str, text: str | None, expected: str
) -> None:
    path = tmp_path / name
    if text is not None:
        path.write_text(text)
    with pytest.raises(ConfigError, match=expected) as info:
        load_probes(path)
    assert info.value.field == "path"


PROBE = Probe(kind="decision", question="q", expect=("PostgreSQL 16", "replication"))


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ("we chose postgresql 16 for its logical Replication", True),
        ("we chose PostgreSQL 16", False),  # the reason is gone
        ("we chose PostgreSQL 160 for replication", False),  # not a whole word
        ("replication-lag on PostgreSQL 16", False),  # part of a longer word
        ("", False),
    ],
)
def test_a_probe_is_present_when_every_expected_string_is(
    text: str, found: bool
) -> None:
    assert present(PROBE, text) is found


def test_every_kind_is_a_probe_kind() -> None:
    assert PROBE_KINDS == ("fact", "artifact", "next_step", "decision")
    for kind in PROBE_KINDS:
        assert Probe(kind=kind, question="q", expect="x").kind == kind
