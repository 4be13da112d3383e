"""The how-to "Add a review phase with feedback" shows what really happens.

Its Python blocks run in order, in one namespace, and each prints exactly the
``text`` block that follows it; its TOML blocks are pieces of the shipped
``machines/review.toml``; its ``turnfsm check`` session and the refusal it
quotes are what the checker prints.
"""

from __future__ import annotations

import contextlib
import io
import re
import shutil
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT
from turnfsm.cli import main
from turnfsm.core import MachineSpec
from turnfsm.errors import DefinitionError

PAGE = REPO_ROOT / "docs" / "how-to" / "review.md"
REVIEW = REPO_ROOT / "machines" / "review.toml"
FENCE = re.compile(r"^```(\w+)\n(.*?)^```\n", re.MULTILINE | re.DOTALL)


def _blocks() -> list[tuple[str, str]]:
    """The page's fenced blocks, as (language, text), in order."""
    text = PAGE.read_text(encoding="utf-8")
    return [(m.group(1), m.group(2)) for m in FENCE.finditer(text)]


def _runs() -> list[tuple[str, str | None]]:
    """Each Python block and the ``text`` block right after it, if any."""
    blocks = _blocks()
    out: list[tuple[str, str | None]] = []
    for i, (language, code) in enumerate(blocks):
        if language != "python":
            continue
        after = blocks[i + 1] if i + 1 < len(blocks) else None
        out.append((code, after[1] if after and after[0] == "text" else None))
    return out


def test_the_page_is_in_the_nav() -> None:
    nav = (REPO_ROOT / "mkdocs.yml").read_text(encoding="utf-8")

    assert "how-to/review.md" in nav


def test_every_python_block_prints_what_the_page_shows() -> None:
    runs = _runs()
    assert len(runs) == 3
    namespace: dict[str, object] = {"__name__": "__howto__"}
    for code, shown in runs:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(code, str(PAGE), "exec"), namespace)
        assert shown is not None, code
        assert out.getvalue() == shown


def test_every_toml_block_is_a_piece_of_the_shipped_machine() -> None:
    machine = REVIEW.read_text(encoding="utf-8")
    pieces = [text for language, text in _blocks() if language == "toml"]

    assert len(pieces) == 4
    for piece in pieces:
        assert piece in machine


def test_the_check_session_is_what_turnfsm_check_prints(
    capsys: pytest.CaptureFixture[str],
) -> None:
    (session,) = [text for language, text in _blocks() if language == "console"]
    command, *shown = session.splitlines()
    shutil.copy(REVIEW, Path("review.toml"))

    assert command == "$ turnfsm check review.toml"
    assert main(["check", "review.toml"]) == 0
    assert capsys.readouterr().out.splitlines() == shown


def test_the_refusal_quoted_is_what_the_loader_says() -> None:
    quoted = [
        text
        for language, text in _blocks()
        if language == "text" and text.startswith("review.toml:")
    ]
    trigger = '[[transitions]]\ntrigger = "tools_finished"\n'
    text = REVIEW.read_text(encoding="utf-8")
    assert text.count(trigger) == 1
    bad = text.replace(trigger, trigger + 'message = "feedback"\n')

    with pytest.raises(DefinitionError) as refused:
        MachineSpec.from_toml(bad, source="review.toml")

    assert quoted == [f"{refused.value}\n"]
