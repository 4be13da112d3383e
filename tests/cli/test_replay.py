"""`turnfsm demo --log` then `turnfsm replay`: every run of the demo replays."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from tests.helpers import restamp
from turnfsm.cli import main


def _demo_log(tmp_path: Path) -> Path:
    log = tmp_path / "demo.jsonl"
    assert main(["demo", "--quiet", "--log", str(log)]) == 0
    return log


def test_every_run_of_the_demo_replays_exactly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = _demo_log(tmp_path)
    capsys.readouterr()
    assert main(["replay", str(log)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1
    assert "events replayed exactly (done)" in lines[0]


def test_a_tampered_log_is_reported_at_the_first_diverging_event(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = _demo_log(tmp_path)
    lines = log.read_text().splitlines()
    # Make the first measurement that led to a compaction look small.
    for number, line in enumerate(lines):
        entry = json.loads(line)
        data = entry.get("data", {})
        if data.get("decision", "").startswith("compact:"):
            data["event"]["estimate"] = 10
            lines[number] = json.dumps(entry)
            index = data["index"]
            break
    log.write_text("\n".join(restamp(lines)) + "\n")  # as one who knows the format
    capsys.readouterr()
    assert main(["replay", str(log)]) == 1
    out = capsys.readouterr().out
    assert f"diverges at event #{index} (measured)" in out
    assert "compact:threshold_exceeded" in out


def test_replay_of_a_file_that_is_not_a_log_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"hello": 1}\n')
    assert main(["replay", str(bad)]) == 2
    assert f"turnfsm replay: {bad}: corrupt" in capsys.readouterr().err
    assert main(["replay", str(tmp_path / "missing.jsonl")]) == 2
    assert main(["replay", str(_demo_log(tmp_path)), "--run", "run_nope"]) == 2


@pytest.mark.parametrize("text", ["", "\n\n"], ids=["empty", "blank lines"])
def test_replay_of_an_empty_file_names_the_file(
    text: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text(text)
    assert main(["replay", str(empty)]) == 2
    assert capsys.readouterr().err == (
        f"turnfsm replay: invalid LOG={str(empty)!r}: expected a session log, as "
        "`turnfsm sessions export` writes it (this file is empty)\n"
    )


def test_a_session_id_given_as_the_log_points_to_session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # `turnfsm approve SESSION`, `report SESSION`, `simulate SESSION`: a
    # newcomer types `turnfsm replay SESSION` too; it names the option.
    monkeypatch.chdir(tmp_path)
    assert main(["replay", "ses_0123456789abcdef0123"]) == 2
    assert capsys.readouterr().err == (
        "turnfsm replay: invalid LOG='ses_0123456789abcdef0123': expected a "
        "session log file (there is none of that name; to replay a stored "
        "session, give --session ses_0123456789abcdef0123)\n"
    )
    # A missing file with a path or an extension is only missing.
    for name in ("logs/run.jsonl", "run.jsonl"):
        assert main(["replay", name]) == 2
        err = capsys.readouterr().err
        assert "does not exist" in err
        assert "--session" not in err


def test_a_log_on_standard_input_is_read_with_a_dash(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # `turnfsm sessions export ID | turnfsm replay -` was told to give
    # "--session -".
    log = _demo_log(tmp_path)
    capsys.readouterr()
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(log.read_bytes())))
    assert main(["replay", "-"]) == 0
    assert "events replayed exactly (done)" in capsys.readouterr().out

    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"")))
    assert main(["replay", "-"]) == 2
    assert "(standard input gave nothing)" in capsys.readouterr().err


def test_replay_from_a_closed_standard_input_says_so(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # `turnfsm replay - <&-` crashed with a traceback
    # ("'NoneType' object has no attribute 'buffer'").
    monkeypatch.setattr("sys.stdin", None)
    assert main(["replay", "-"]) == 2
    assert capsys.readouterr().err == (
        "turnfsm replay: invalid LOG='-': expected a session log, as `turnfsm "
        "sessions export` writes it (standard input is closed)\n"
    )
