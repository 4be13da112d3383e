"""The committed diagrams are generated from machines/ and must not drift."""

from __future__ import annotations

from pathlib import Path

from turnfsm.cli._diagram import render_all

ROOT = Path(__file__).resolve().parents[1]


def test_committed_diagrams_are_fresh() -> None:
    rendered = render_all(ROOT / "machines")
    assert {"turn.mmd", "approval.mmd"} <= set(rendered), "shipped machines missing"
    for name, text in rendered.items():
        committed = ROOT / "diagrams" / name
        assert committed.is_file(), f"{committed} missing: run `turnfsm diagram`"
        assert committed.read_text() == text, (
            f"{committed} is stale: run `turnfsm diagram`"
        )
