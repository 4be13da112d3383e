"""`turnfsm sessions` on bad stores: a FIFO never hangs it, a damaged session is
reported on its line without hiding the others, and can be removed."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from tests.helpers import REPO_ROOT
from turnfsm.cli import main
from turnfsm.persistence import SQLiteStore
from turnfsm.testing import sample_entries

Capture = pytest.CaptureFixture[str]


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_a_store_path_that_is_no_file_exits_2_at_once(
    tmp_path: Path, kind: str
) -> None:
    path = tmp_path / f"store.{kind}"
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.mkdir()
    # In a process of its own: a store that blocks on the FIFO would hang it.
    done = subprocess.run(
        [sys.executable, "-m", "turnfsm", "sessions", "list", "--store", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    what = "a FIFO (named pipe)" if kind == "fifo" else "a directory"
    assert f"cannot use {path} as a turnfsm session store: it is {what}" in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]  # nothing made


def _store(path: Path) -> None:
    async def write() -> None:
        async with SQLiteStore(path) as store:
            for name in ("s_a", "s_counter", "s_row", "s_z"):
                await store.append(name, sample_entries(), expected_version=0)

    anyio.run(write)
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute("UPDATE turnfsm_sessions SET version = 40 WHERE id = 's_counter'")
        conn.execute(
            "UPDATE turnfsm_entries SET body = '{nope' WHERE session_id = 's_row'"
            " AND seq = 3"
        )


def test_sessions_list_reports_damaged_sessions_and_lists_the_others(
    tmp_path: Path, capsys: Capture
) -> None:
    path = tmp_path / "s.db"
    _store(path)
    assert main(["sessions", "list", "--store", str(path)]) == 1
    out = capsys.readouterr().out
    lines = {line.split()[0]: line for line in out.splitlines()}
    entries = len(sample_entries())
    for sound in ("s_a", "s_z"):
        # ID, STARTED and LAST ACTIVITY (a date and a time each), ENTRIES, ...
        assert lines[sound].split()[5:8] == [str(entries), "1", "paused"]
    assert (
        "damaged: its version counter says 40 entries, the log holds"
        in (lines["s_counter"])
    )
    assert (
        "damaged: corrupt Entry record at sessions['s_row'].entries[3]"
        in (lines["s_row"])
    )
    assert "4 session(s) in" in out
    assert "2 damaged session(s): `turnfsm sessions rm ID` removes one" in out


def test_a_damaged_session_can_be_removed_and_the_list_is_clean_again(
    tmp_path: Path, capsys: Capture
) -> None:
    path = tmp_path / "s.db"
    _store(path)
    for damaged in ("s_counter", "s_row"):
        assert main(["sessions", "show", damaged, "--store", str(path)]) == 2
        assert main(["sessions", "rm", damaged, "--yes", "--store", str(path)]) == 0
    assert main(["sessions", "list", "--store", str(path)]) == 0
    out = capsys.readouterr().out
    assert "deleted session s_counter" in out
    assert "deleted session s_row" in out
    assert "2 session(s) in" in out
    listing = out.split("deleted session s_row")[-1]
    assert "damaged:" not in listing
    assert "damaged session(s)" not in listing


@pytest.mark.parametrize("command", [["demo"], ["sessions", "list"]])
@pytest.mark.parametrize(
    ("where", "setting", "reason"),
    [
        ("store=missing/s.db", "--store", "it does not exist"),
        ("store=sqlite:///missing/s.db", "--store", "it does not exist"),
        ("store=afile/s.db", "--store", "it is not a directory"),
        ("env=missing/s.db", "TURNFSM_STORE", "it does not exist"),
        ("env=sqlite:///afile/s.db", "TURNFSM_STORE", "it is not a directory"),
        ("xdg=afile", "XDG_DATA_HOME", "it cannot be created"),
        ("xdg=/proc/xdg", "XDG_DATA_HOME", "it cannot be created"),
    ],
)
def test_a_store_directory_that_cannot_be_used_is_named_with_its_setting(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: Capture,
    command: list[str],
    where: str,
    setting: str,
    reason: str,
) -> None:
    (tmp_path / "afile").write_text("not a directory")
    kind, _, value = where.partition("=")
    if kind == "xdg" and not value.startswith("/"):
        value = str(tmp_path / value)  # XDG_DATA_HOME is an absolute path
    argv = [*command]
    if kind == "store":
        argv += ["--store", value]
    elif kind == "env":
        monkeypatch.setenv("TURNFSM_STORE", value)
    else:
        monkeypatch.setenv("XDG_DATA_HOME", value)
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1, captured.err
    path = value.removeprefix("sqlite:///")
    directory = Path(path) / "turnfsm" if kind == "xdg" else Path(path).parent
    named = f"cannot keep sessions in the directory {directory.absolute()}: "
    assert captured.err.startswith(f"turnfsm {' '.join(command)}: {named}")
    assert reason in captured.err
    assert f"change {setting}" in captured.err
    assert "Traceback" not in captured.err
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing made


@pytest.mark.parametrize("command", [["demo", "--quiet"], ["sessions", "list"]])
@pytest.mark.parametrize("setting", ["--store", "TURNFSM_STORE"])
def test_a_store_path_that_is_a_directory_is_named_with_its_setting(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: Capture,
    command: list[str],
    setting: str,
) -> None:
    """``TURNFSM_STORE=~/work``, a directory: the message said only its path."""
    argv = [*command]
    if setting == "--store":
        argv += ["--store", str(tmp_path)]
    else:
        monkeypatch.setenv("TURNFSM_STORE", str(tmp_path))

    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err == (
        f"turnfsm {' '.join(command[:2]).removesuffix(' --quiet')}: cannot use "
        f"{tmp_path} as a turnfsm session "
        f"store: it is a directory, not a regular file; change {setting} "
        "(nothing was changed)\n"
    )


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        *(("--store", value) for value in ("", "  ", "mysql://db/x", "sqlite:///")),
        # An empty TURNFSM_STORE is unset: the default store.
        *(("TURNFSM_STORE", value) for value in ("mysql://db/x", "sqlite:///")),
    ],
)
@pytest.mark.parametrize("command", [["sessions", "list"], ["demo", "--quiet"]])
def test_a_store_that_names_no_store_is_refused_by_its_setting(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: Capture,
    command: list[str],
    setting: str,
    value: str,
) -> None:
    # They read `invalid store='': expected a SessionStore, ...`: neither
    # the option the user gave nor a store the command line can take.
    monkeypatch.chdir(tmp_path)
    argv = [*command]
    if setting == "--store":
        argv += ["--store", value]
    else:
        monkeypatch.setenv("TURNFSM_STORE", value)

    assert main(argv) == 2

    name = " ".join(word for word in command if not word.startswith("-"))
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(
        f"turnfsm {name}: invalid {setting}={value!r}: expected "
    ), captured.err
    assert captured.err.count("\n") == 1, captured.err
    assert "SessionStore" not in captured.err
    assert list(tmp_path.iterdir()) == []  # nothing made


@pytest.mark.parametrize(
    "value", [":memory:", "file::memory:", "file:x?mode=memory", "sqlite:///:memory:"]
)
@pytest.mark.parametrize(
    "command", [["sessions", "list"], ["sessions", "show", "s"], ["demo", "--quiet"]]
)
def test_a_store_sqlite_keeps_in_memory_is_refused_saying_memory(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: Capture,
    command: list[str],
    value: str,
) -> None:
    # `demo --store file:x?mode=memory` made a file of that name; the reading
    # commands said no store file was there.
    monkeypatch.chdir(tmp_path)
    assert main([*command, "--store", value]) == 2
    name = " ".join(word for word in command[:2] if not word.startswith("-"))
    captured = capsys.readouterr()
    assert captured.err == (
        f"turnfsm {name}: invalid --store={value!r}: expected 'memory:', a file "
        "path, 'sqlite:///PATH' or a postgresql:// URL (did you mean 'memory:', "
        "a store in this process's memory?)\n"
    )
    assert list(tmp_path.iterdir()) == []  # nothing made
