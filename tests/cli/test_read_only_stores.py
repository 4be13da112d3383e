"""The commands on a store this user can read but not write.

The reading commands (``sessions list|show|export``, ``replay --session``,
``report``, ``view``) read it whole and change nothing in it; the writing
ones (``run``, ``resume``, ``demo``) are refused on one line, naming the
file or its directory and why, before any model is called. The commands
run as a user permissions bind (`tests.persistence.read_only_stores`).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT
from tests.persistence import read_only_stores as bench

# Each test starts several processes (a demo, then each command).
pytestmark = pytest.mark.timeout(600)


@pytest.fixture
def locked_out(tmp_path: Path) -> None:
    reason = bench.lock_out_reason(tmp_path)
    if reason is not None:
        pytest.skip(reason)


def _turnfsm(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return bench.run(["-m", "turnfsm", *args], cwd=cwd)


def _demo_store(tmp: Path, *, in_log: bool) -> tuple[Path, str]:
    """A store holding a demo's session (and a session in its log); the demo's id."""
    directory = tmp / "store"
    directory.mkdir()
    path = directory / "s.db"
    done = subprocess.run(
        [sys.executable, "-m", "turnfsm", "demo", "--quiet", "--store", str(path)],
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    uri = f"file:{path}?mode=ro&immutable=1"  # nothing made beside it
    with contextlib.closing(sqlite3.connect(uri, uri=True)) as conn:
        (session_id,) = conn.execute("SELECT id FROM turnfsm_sessions").fetchone()
    if in_log:
        bench.make_store(path, in_log=True)  # s_a, s_b, and s_log in the log
        Path(f"{path}-shm").unlink()  # copied without its index
    return path, session_id


CASES = {
    "read-only directory": (False, "dir"),
    "read-only file": (False, "files"),
    "log without index, all read-only": (True, "both"),
}


def _locked(path: Path, lock: str) -> list[Path]:
    files = sorted(path.parent.iterdir())
    return {"dir": [path.parent], "files": files, "both": [path.parent, *files]}[lock]


@pytest.mark.usefixtures("locked_out")
@pytest.mark.parametrize("case", list(CASES))
def test_the_reading_commands_read_a_store_they_cannot_write(
    tmp_path: Path, case: str
) -> None:
    in_log, lock = CASES[case]
    path, session_id = _demo_store(tmp_path, in_log=in_log)
    report = tmp_path / "report.html"
    before = bench.contents(path.parent)
    store = ["--store", str(path)]

    with bench.read_only(*_locked(path, lock)):
        listed = _turnfsm("sessions", "list", *store, cwd=tmp_path)
        shown = _turnfsm("sessions", "show", session_id, *store, cwd=tmp_path)
        exported = _turnfsm("sessions", "export", session_id, *store, cwd=tmp_path)
        replayed = _turnfsm("replay", "--session", session_id, *store, cwd=tmp_path)
        reported = _turnfsm(
            "report", session_id, "-o", str(report), *store, cwd=tmp_path
        )
    after = bench.contents(path.parent)

    for done in (listed, shown, exported, replayed, reported):
        assert (done.returncode, done.stderr) == (0, ""), done.args
    ids = {line.split()[0] for line in listed.stdout.splitlines()[1:-1]}
    assert ids == ({session_id, "s_a", "s_b", "s_log"} if in_log else {session_id})
    assert session_id in shown.stdout
    assert f'"session_id": "{session_id}"' in exported.stdout.splitlines()[0]
    assert "replayed exactly" in replayed.stdout
    assert session_id in report.read_text()
    assert after == before


@pytest.mark.usefixtures("locked_out")
def test_the_view_serves_a_store_it_cannot_write(tmp_path: Path) -> None:
    path, session_id = _demo_store(tmp_path, in_log=False)
    before = bench.contents(path.parent)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    argv = ["view", session_id, "--no-open", "--store", str(path)]
    with (
        bench.read_only(path.parent, path),
        subprocess.Popen(
            bench.unprivileged([sys.executable, "-m", "turnfsm", *argv]),
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        ) as view,
    ):
        try:
            assert view.stdout is not None
            lines = [view.stdout.readline(), view.stdout.readline()]
            assert lines[1].startswith(f"serving session {session_id} at "), (
                lines,
                view.stderr.read() if view.stderr else "",
            )
            url = lines[1].split(" at ", 1)[1].strip()
            with urllib.request.urlopen(url, timeout=60) as page:
                assert session_id in page.read().decode()
        finally:
            view.terminate()
            view.wait(timeout=60)
    assert bench.contents(path.parent) == before


@pytest.mark.usefixtures("locked_out")
@pytest.mark.parametrize("lock", ["dir", "files"])
@pytest.mark.parametrize("command", ["run", "resume", "demo"])
def test_a_writing_command_is_refused_before_any_model_is_called(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: str, lock: str
) -> None:
    path, session_id = _demo_store(tmp_path, in_log=False)
    mark = tmp_path / "mark"
    agent = ["--agent", "tests.cli.read_only_agent:marking"]
    argv = {
        "run": ["run", *agent, "say hi", "--session", session_id],
        "resume": ["resume", session_id, *agent],
        "demo": ["demo", "--quiet"],
    }[command]
    before = bench.contents(path.parent)
    monkeypatch.setenv("TURNFSM_TEST_MARK", str(mark))
    with bench.read_only(*_locked(path, lock)):
        done = _turnfsm(*argv, "--store", str(path), cwd=tmp_path)

    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.count("\n") == 1, done.stderr
    if lock == "dir":
        said = (
            f"cannot keep sessions in the directory {path.parent}: it cannot be written"
        )
    else:
        said = f"cannot use {path} as a turnfsm session store: it cannot be written"
    assert said in done.stderr
    assert "(read-only for this user)" in done.stderr
    assert not mark.exists()  # no model was called
    assert bench.contents(path.parent) == before
