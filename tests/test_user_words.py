"""User-facing text names no internal document (tests/user_words.py).

The repository passes; a planted reference (in a copy, never in the
repository) fails the check, on its file and line.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests import user_words
from tests.helpers import REPO_ROOT


def test_the_repository_names_no_internal_document() -> None:
    found = user_words.findings([REPO_ROOT / name for name in user_words.SCANNED])
    assert found == [], "\n".join(map(str, found))


def test_a_planted_seed_000_in_a_docstring_fails_the_check(tmp_path: Path) -> None:
    original = REPO_ROOT / "turnfsm" / "core" / "_guards.py"
    copy = tmp_path / "turnfsm" / "core" / "_guards.py"
    copy.parent.mkdir(parents=True)
    shutil.copy(original, copy)
    text = copy.read_text()
    planted = text.replace(
        '"""The run already made `max_turns` model calls."""',
        '"""The run already made `max_turns` model calls (seed 000)."""',
    )
    assert planted != text
    copy.write_text(planted)
    line = planted.splitlines().index(
        '    """The run already made `max_turns` model calls (seed 000)."""'
    )

    run = subprocess.run(
        [sys.executable, "-m", "tests.user_words", str(tmp_path)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=False,
    )

    assert run.returncode == 1, run
    assert run.stdout.startswith(f"{copy}:{line + 1}: 'seed 000' names a seed"), run
    assert run.stdout.count("\n") == 1, run.stdout
    assert "1 reference(s) to internal documents" in run.stderr


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("the message-count line (seed 000)", "seed 000"),
        ("SummarizingCompactor (seeds 000 and 004)", "seeds 000 and 004"),
        ("Seed 004's trigger: measure", "Seed 004"),
        ("the name is the seed's", "seed's"),
        ("keep the seeds' names", "seeds'"),
        ("Deliberate difference from the seed: its layer 5", "from the seed"),
        ("as explained in DESIGN 2.1", "DESIGN"),
        ("see DESIGN.md", "DESIGN.md"),
        ("STYLE.md asks for it", "STYLE.md"),
        ("the run log (§4)", "§"),
        ("described in section 4.2", "section 4.2"),
        ("Appendix A lists them", "Appendix A"),
        ("### Structured final answers (issue 11)", "issue 11"),
        ("fixed in #42 (#42)", "(#42)"),
        ("The original specification estimated tokens", "original specification"),
        ("and the specification promised it", "the specification"),
    ],
)
def test_each_way_of_citing_an_internal_document_is_caught(
    text: str, words: str
) -> None:
    found = list(user_words.findings_in_text(text, Path("page.md")))
    assert [f.words for f in found] == [words]
    assert str(found[0]).startswith(f"page.md:1: {words!r} ")


@pytest.mark.parametrize(
    "text",
    [
        "a random seed for the sampler",
        'params = {"seed": 42, "temperature": 0.0}',
        "hypothesis prints the seed to reproduce a failure",
        "set the seed (seed=7) for a repeatable run",
        "positional truncation, by design",
        "one design, two engines",
        "See [Design](design.md) for why",
        "transition #3 (measured): unknown guard",
        "user message #0 in turn 1",
        "the OpenAPI specification of the tool",
    ],
)
def test_the_users_words_pass(text: str) -> None:
    assert list(user_words.findings_in_text(text, Path("page.md"))) == []
