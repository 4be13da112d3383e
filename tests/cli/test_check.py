"""`turnfsm check` and `turnfsm diagram` on several files: every file, every problem."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT
from turnfsm.cli import main

STOCK = (REPO_ROOT / "machines" / "turn.toml").read_text()


def edit(text: str, old: str, new: str) -> str:
    """Replace the one occurrence of `old` in `text`."""
    assert text.count(old) == 1, old
    return text.replace(old, new)


def line_with(text: str, marker: str) -> int:
    """The 1-based line of the one occurrence of `marker` in `text`."""
    assert text.count(marker) == 1, marker
    return text[: text.index(marker)].count("\n") + 1


def five_problems() -> str:
    """The stock machine with five distinct problems, each on its own line."""
    text = edit(
        STOCK,
        'conditions = ["is_over_emergency_line"]',
        'conditions = ["is_over_emergncy_line"]',
    )
    text = edit(
        text,
        'conditions = ["has_tool_calls"]\nactions = ["record_reply"]',
        'conditions = ["has_tool_calls"]\nactions = ["record_replie"]',
    )
    text = edit(text, 'dest = "done"', 'dest = "don"')
    text = edit(
        text,
        'done              = { decision = "finish", on_enter = ["commit_pending"] }',
        'done              = { decision = "finish", on_entre = ["commit_pending"] }',
    )
    text = edit(text, "[states]\n", '[states]\nreview = { decision = "run_tools" }\n')
    return text + (
        '\n[[transitions]]\ntrigger = "tools_finished"\nsource = "review"\n'
        'dest = "start"\nactions = ["record_results"]\n'
    )


def test_check_prints_all_five_problems_with_their_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = five_problems()
    bad = tmp_path / "bad.toml"
    bad.write_text(text)

    status = main(["check", str(bad)])

    out, err = capsys.readouterr()
    assert (status, out) == (1, "")
    dest = line_with(text, 'dest = "don"')
    assert err.splitlines() == [
        f"{bad}:{line_with(text, 'on_entre')}: state 'done': unknown key"
        " 'on_entre' (did you mean 'on_enter'?)",
        f"{bad}:{line_with(text, 'is_over_emergncy_line')}: transition #4"
        " (measured): unknown guard 'is_over_emergncy_line' (did you mean"
        " 'is_over_emergency_line'?)",
        f"{bad}:{line_with(text, 'record_replie')}: transition #8"
        " (model_replied): unknown reducer 'record_replie' (did you mean"
        " 'record_reply'?)",
        f"{bad}:{dest}: transition #10 (model_replied):"
        " unknown dest phase 'don' (did you mean 'done'?)",
        f"{bad}:{line_with(text, 'review =')}: phase 'review' is unreachable"
        " from 'start'",
    ]


def test_check_processes_every_file_of_a_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "a_bad.toml").write_text(edit(STOCK, 'dest = "done"', 'dest = "don"'))
    (tmp_path / "b_good.toml").write_text(STOCK)
    (tmp_path / "notes.txt").write_text("not a machine")

    status = main(["check", str(tmp_path)])

    out, err = capsys.readouterr()
    dest = line_with(STOCK, 'dest = "done"')
    assert status == 1
    assert out == f"{tmp_path / 'b_good.toml'}: ok (7 phases, 33 transitions)\n"
    assert err.splitlines() == [
        f"{tmp_path / 'a_bad.toml'}:{dest}:"
        " transition #10 (model_replied): unknown dest phase 'don'"
        " (did you mean 'done'?)",
        "1 of 2 machine files have problems",
    ]


def test_check_takes_files_and_directories_and_goes_on_past_a_missing_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    missing = tmp_path / "missing.toml"

    status = main(["check", str(REPO_ROOT / "machines"), str(missing), str(empty)])

    out, err = capsys.readouterr()
    assert status == 1
    assert out.splitlines() == [
        f"{REPO_ROOT / 'machines' / 'approval.toml'}: ok (8 phases, 34 transitions)",
        f"{REPO_ROOT / 'machines' / 'compaction.toml'}: ok (4 phases, 8 transitions)",
        f"{REPO_ROOT / 'machines' / 'review.toml'}: ok (8 phases, 36 transitions)",
        f"{REPO_ROOT / 'machines' / 'turn.toml'}: ok (7 phases, 33 transitions)",
    ]
    assert err.splitlines() == [
        f"{empty}: no machine files (*.toml)",
        f"{missing} does not exist",  # plain words, as every command says it
        "1 of 5 machine files have problems",
    ]


def test_check_passes_on_the_shipped_machines(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status = main(["check", str(REPO_ROOT / "machines")])

    out, err = capsys.readouterr()
    assert (status, err) == (0, "")
    assert [line.split(": ")[1] for line in out.splitlines()] == [
        "ok (8 phases, 34 transitions)",
        "ok (4 phases, 8 transitions)",
        "ok (8 phases, 36 transitions)",
        "ok (7 phases, 33 transitions)",
    ]


def test_diagram_renders_the_good_files_and_fails_for_the_bad_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    machines = tmp_path / "machines"
    machines.mkdir()
    (machines / "a_bad.toml").write_text(edit(STOCK, 'dest = "done"', 'dest = "don"'))
    (machines / "b_good.toml").write_text(STOCK)
    (machines / "c_bad.toml").write_text("name = ")
    out = tmp_path / "diagrams"

    status = main(["diagram", str(machines), "--out", str(out)])
    checked = main(["diagram", str(machines), "--out", str(out), "--check"])

    err = capsys.readouterr().err
    assert (status, checked) == (1, 1)
    assert sorted(p.name for p in out.glob("*.mmd")) == ["b_good.mmd"]
    assert err.count("unknown dest phase 'don' (did you mean 'done'?)") == 2
    assert err.count(f"{machines / 'c_bad.toml'}:1: not valid TOML") == 2
    assert "stale" not in err


@pytest.mark.parametrize("check", [False, True], ids=["write", "check"])
@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("missing", "no such directory"),
        ("empty", "no machine files (*.toml)"),
        (
            "turn.toml",
            "not a directory (give the directory of the machine files, or"
            " draw one file with --machine FILE -o NAME.svg)",
        ),
    ],
    ids=["missing", "empty", "a-file"],
)
def test_diagram_of_a_directory_without_machines_fails_and_writes_nothing(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    name: str,
    problem: str,
    check: bool,
) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "turn.toml").write_text(STOCK)
    given = tmp_path / name
    before = sorted(tmp_path.rglob("*"))

    status = main(["diagram", str(given), *(["--check"] if check else [])])

    out, err = capsys.readouterr()
    assert (status, out, err) == (1, "", f"{given}: {problem}\n")
    assert sorted(tmp_path.rglob("*")) == before
