"""`SQLiteStore(path, read_only=True)` reads every store it can, and changes none.

Each case is real files: a directory or file made read-only with chmod, a
copy taken with or without its write-ahead log and index, a run in
progress, a read-only disk. The reads run as a user permissions bind
(`tests.persistence.read_only_stores`); each checks that every session is
read, every write is refused naming the file, and the files (their bytes
and permissions) are as they were, with nothing made beside them.
"""

from __future__ import annotations

import contextlib
import os
import re
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest

from tests.helpers import REPO_ROOT
from tests.persistence import read_only_stores as bench
from tests.persistence.test_sqlite import BAD_FILES
from turnfsm.errors import StoreDirectoryUnusable, StoreUnusable
from turnfsm.persistence import SQLiteStore, open_store
from turnfsm.testing import sample_entries

N = len(sample_entries())

# Each test starts processes of its own (a writer, readers).
pytestmark = pytest.mark.timeout(600)


@pytest.fixture
def locked_out(tmp_path: Path) -> None:
    reason = bench.lock_out_reason(tmp_path)
    if reason is not None:
        pytest.skip(reason)


# Each: how the copy is left (its log, its index) and what is made read-only.
CASES: dict[str, tuple[bool, bool, str]] = {
    "read-only directory": (False, False, "dir"),
    "read-only file": (False, False, "files"),
    "read-only file and directory": (False, False, "both"),
    "log and index, all read-only": (True, False, "both"),
    "log and index, read-only files": (True, False, "files"),
    "log without index, read-only directory": (True, True, "both"),
    "log without index, read-only files": (True, True, "files"),
}


def _lay(tmp: Path, case: str) -> tuple[Path, dict[str, list[int]], list[Path]]:
    in_log, no_index, lock = CASES[case]
    directory = tmp / "store"
    directory.mkdir()
    path = directory / "s.db"
    held = bench.make_store(path, in_log=in_log)
    if no_index:  # copied without it, or deleted: the log's commits count
        Path(f"{path}-shm").unlink()
    files = sorted(directory.iterdir())
    locked = {"dir": [directory], "files": files, "both": [directory, *files]}
    return path, held, locked[lock]


@pytest.mark.usefixtures("locked_out")
@pytest.mark.parametrize("case", list(CASES))
def test_a_store_that_cannot_be_written_is_read_whole_and_left_as_it_was(
    tmp_path: Path, case: str
) -> None:
    path, held, locked = _lay(tmp_path, case)
    scratch = tmp_path / "tmp"  # where a private copy would be made
    scratch.mkdir()
    before = bench.contents(path.parent)

    with bench.read_only(*locked):
        found = bench.worker("read", path, tmpdir=scratch)
    after = bench.contents(path.parent)

    assert found["sessions"] == held  # the log's commits too
    assert found["leases"] == [False] * len(held)
    for write in ("append", "lease", "delete"):
        refused = found[write]
        assert refused["type"] == "StoreUnusable", refused
        assert refused["path"] == str(path)
        assert "opened to read only (read_only=True)" in refused["said"]
    assert after == before  # no byte, no permission, no file beside it
    assert list(scratch.iterdir()) == []  # a copy read is deleted


@pytest.mark.usefixtures("locked_out")
@pytest.mark.parametrize(
    ("case", "refused", "reason"),
    [
        ("read-only directory", "directory", "it cannot be written (read-only for"),
        ("read-only file", "file", "it cannot be written (read-only for this user)"),
        ("log and index, read-only files", "file", "it cannot be written (read-only"),
    ],
)
def test_a_writer_is_refused_a_store_it_cannot_write_before_it_opens_it(
    tmp_path: Path, case: str, refused: str, reason: str
) -> None:
    path, _held, locked = _lay(tmp_path, case)
    before = bench.contents(path.parent)

    with bench.read_only(*locked):
        found = bench.worker("write", path)["refused"]
    after = bench.contents(path.parent)

    if refused == "directory":
        assert found["type"] == "StoreDirectoryUnusable"
        assert found["directory"] == str(path.parent)
    else:
        assert found["type"] == "StoreUnusable"
        assert found["path"] == str(path)
        assert "a run, a resume or an answer writes to the store" in found["said"]
    assert reason in found["said"], found
    assert after == before


@pytest.mark.usefixtures("locked_out")
def test_a_writer_is_refused_an_index_a_reader_left_read_only(tmp_path: Path) -> None:
    # SQLite makes the index with the file's permissions: a read-only one,
    # left beside a file made writable again, would fail the run's first write.
    path, _held, _locked = _lay(tmp_path, "log and index, read-only files")
    index = Path(f"{path}-shm")
    with bench.read_only(index):
        found = bench.worker("write", path)["refused"]
    assert found["type"] == "StoreUnusable"
    assert f"its file {index} cannot be written" in found["said"]


@pytest.mark.usefixtures("locked_out")
@pytest.mark.parametrize("lock", [False, True], ids=["same user", "read-only"])
def test_a_run_in_progress_is_read_and_its_log_is_never_touched(
    tmp_path: Path, lock: bool
) -> None:
    path = tmp_path / "store" / "s.db"
    path.parent.mkdir()
    bench.make_store(path)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    with subprocess.Popen(
        [sys.executable, str(bench.WORKER), "keep", str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    ) as writer:
        _follow(writer, path, lock)
    assert not Path(f"{path}-wal").exists()  # the writer, last to close, folded it


def _follow(writer: subprocess.Popen[str], path: Path, lock: bool) -> None:
    try:
        assert writer.stdin is not None
        assert writer.stdout is not None
        assert writer.stdout.readline() == "ready\n"
        log = Path(f"{path}-wal")
        locked = [path.parent, *sorted(path.parent.iterdir())] if lock else []
        for version in (N, 2 * N):
            before = bench.contents(path.parent)
            with bench.read_only(*locked):
                found = bench.worker("read", path)
            assert found["sessions"]["s_live"] == [version, version]
            after = bench.contents(path.parent)
            assert after == before  # the log neither checkpointed nor cut
            assert log.stat().st_size > 0
            if version == N:
                writer.stdin.write("more\n")
                writer.stdin.flush()
                assert writer.stdout.readline() == f"more {2 * N}\n"
        writer.stdin.write("close\n")
        writer.stdin.close()
        assert writer.wait(timeout=60) == 0
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait()


def test_a_store_on_a_read_only_disk_is_read_and_a_writer_refused(
    tmp_path: Path,
) -> None:
    reason = bench.read_only_mount_reason(tmp_path)
    if reason is not None:
        pytest.skip(reason)
    for name, no_index in (("clean", False), ("log", False), ("no index", True)):
        directory = tmp_path / name.replace(" ", "_")
        directory.mkdir()
        path = directory / "s.db"
        held = bench.make_store(path, in_log=name != "clean")
        if no_index:
            Path(f"{path}-shm").unlink()
        before = bench.contents(directory)

        found = bench.worker("read", path, mount=directory)
        refused = bench.worker("write", path, mount=directory)["refused"]

        assert found["sessions"] == held, name
        assert refused["type"] == "StoreDirectoryUnusable", refused
        assert "it cannot be written (a read-only file system)" in refused["said"]
        assert "copy the store to a writable disk" in refused["said"]
        assert bench.contents(directory) == before


def _empty(path: Path) -> None:
    path.write_bytes(b"")


def _random(path: Path) -> None:
    path.write_bytes(bytes(range(256)) * 16)


def _a_directory(path: Path) -> None:
    path.mkdir()


READ_REFUSALS: dict[str, tuple[Callable[[Path], object], str]] = {
    **{
        kind: (make, reason.replace("\\", ""))
        for kind, (make, reason) in BAD_FILES.items()
    },
    "empty": (_empty, "it holds no turnfsm store (an empty database)"),
    "random bytes": (_random, "it is not an SQLite database"),
    "directory": (_a_directory, "it is a directory, not a regular file"),
    "missing": (lambda p: None, "it does not exist, and a store opened to read"),
}


@pytest.mark.parametrize("kind", list(READ_REFUSALS))
def test_a_file_that_holds_no_store_is_refused_to_read_and_left_as_it_was(
    tmp_path: Path, kind: str
) -> None:
    make, reason = READ_REFUSALS[kind]
    path = tmp_path / "bad.db"
    make(path)
    before = bench.contents(tmp_path), path.is_dir()
    for opener in (
        lambda: SQLiteStore(path, read_only=True),
        lambda: open_store(str(path), read_only=True),
        lambda: open_store(f"sqlite:///{path}", read_only=True),
    ):
        with pytest.raises(StoreUnusable, match=re.escape(reason)) as refused:
            opener()
        assert refused.value.path == str(path)
        assert str(path) in str(refused.value)
        assert (bench.contents(tmp_path), path.is_dir()) == before


def test_a_missing_directory_is_refused_to_read_by_name(tmp_path: Path) -> None:
    path = tmp_path / "nowhere" / "s.db"
    with pytest.raises(StoreDirectoryUnusable) as refused:
        SQLiteStore(path, read_only=True)
    assert (refused.value.directory, refused.value.reason) == (
        str(path.parent),
        "it does not exist",
    )
    assert list(tmp_path.iterdir()) == []


def test_a_store_of_an_older_schema_is_read_as_it_is(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    bench.make_store(path)
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute("DROP TABLE turnfsm_leases")  # schema 1 had none
        conn.execute("UPDATE turnfsm_meta SET value = '1' WHERE key = 'schema_version'")
    before = bench.contents(tmp_path)

    async def read() -> None:
        async with SQLiteStore(path, read_only=True) as store:
            assert [i.id for i in await store.list_sessions()] == ["s_a", "s_b"]
            assert len(await store.load("s_a")) == N
            assert await store.lease_of("s_a") is None

    anyio.run(read)
    assert bench.contents(tmp_path) == before  # not migrated


def test_a_read_only_store_in_a_writable_place_leaves_nothing_behind(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.db"
    bench.make_store(path)
    before = bench.contents(tmp_path)

    async def read() -> None:
        async with SQLiteStore(path, read_only=True) as store:
            assert len(await store.load("s_b")) == 3
            with pytest.raises(StoreUnusable, match="opened to read only") as no:
                await store.append("s_b", sample_entries()[:1], expected_version=3)
            assert no.value.path == str(path)
            with pytest.raises(StoreUnusable, match="opened to read only"):
                await store.delete_session("s_a")

    anyio.run(read)
    assert bench.contents(tmp_path) == before  # no log, no index left


def _left_in_log(path: Path, *statements: str) -> None:
    """Run `statements` in a process that ends without closing: they stay in the log."""
    script = (
        "import os, sqlite3, sys\n"
        "conn = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
        "conn.execute('PRAGMA journal_mode = WAL')\n"
        "conn.execute('PRAGMA wal_autocheckpoint = 0')\n"
        "for sql in sys.argv[2:]:\n"
        "    conn.execute(sql)\n"
        "os._exit(0)\n"
    )
    subprocess.run(
        [sys.executable, "-c", script, str(path), *statements], check=True, timeout=60
    )
    assert Path(f"{path}-wal").stat().st_size > 0


@pytest.mark.parametrize("read_only", [True, False], ids=["reader", "writer"])
@pytest.mark.parametrize("kind", ["foreign", "newer"])
def test_a_file_refused_keeps_the_commits_its_log_holds_where_they_are(
    tmp_path: Path, kind: str, read_only: bool
) -> None:
    # A connection that refused it folded its log into it as it closed: the
    # file changed, though the refusal said "nothing was changed".
    path = tmp_path / "s.db"
    if kind == "foreign":
        _left_in_log(path, "CREATE TABLE users (id)", "INSERT INTO users VALUES (1)")
        reason = "another application's SQLite database (tables: users)"
    else:
        bench.make_store(path)
        _left_in_log(
            path, "UPDATE turnfsm_meta SET value = '99' WHERE key = 'schema_version'"
        )
        reason = "its schema version 99 is newer than this turnfsm knows"
    before = bench.contents(tmp_path)

    with pytest.raises(StoreUnusable, match=re.escape(reason)) as refused:
        SQLiteStore(path, read_only=read_only)

    assert refused.value.path == str(path)
    assert bench.contents(tmp_path) == before


def test_a_log_without_its_index_is_read_where_it_is_and_never_folded(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.db"
    held = bench.make_store(path, in_log=True)
    index = Path(f"{path}-shm")
    index.unlink()
    before = bench.contents(tmp_path)

    found = bench.worker("read", path)

    assert found["sessions"] == held
    after = bench.contents(tmp_path)
    assert after.pop(index.name) == (before[path.name][0], b"")  # the file's mode
    assert after == before  # the file and its log as they were


@pytest.mark.usefixtures("locked_out")
@pytest.mark.parametrize("lock", [False, True], ids=["writable", "read-only"])
def test_a_path_sqlite_would_read_as_a_uri_is_read_as_the_file_it_names(
    tmp_path: Path, lock: bool
) -> None:
    directory = tmp_path / "file:x?mode=memory#a %41"
    directory.mkdir()
    path = directory / "s.db"
    held = bench.make_store(path)
    before = bench.contents(directory)
    with bench.read_only(*([directory] if lock else [])):
        found = bench.worker("read", path)
    assert found["sessions"] == held
    assert bench.contents(directory) == before
