"""Stores a user can read but not write, made of real files, and a user to read them.

A directory or file made read-only with chmod binds every user but root,
who writes it all the same (CAP_DAC_OVERRIDE). Tests run as root in CI, so
the commands under test run in a process of their own that gave up root's
power to override permissions (`unprivileged`): it is still uid 0, the
files' owner, and the owner's bits bind it as they bind any user. A user
that keeps that power skips, saying so (`lock_out_reason`).

A read-only disk is a read-only bind mount in a mount namespace of the
command's own, where one is allowed (`read_only_mount_reason`): not even
root writes there.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import anyio

from tests.helpers import REPO_ROOT
from turnfsm.persistence import SQLiteStore
from turnfsm.testing import sample_entries

WORKER = Path(__file__).with_name("read_only_worker.py")

# Run by root's child before the command: it drops CAP_DAC_OVERRIDE,
# CAP_DAC_READ_SEARCH and CAP_FOWNER (what lets root write, read and chmod
# files whatever their permissions say) from its bounding set, then runs
# the command, which starts without them (uid 0 keeps only the bounding
# set's capabilities across exec). A program of its own, not a preexec_fn:
# the test process may have threads.
_DROP_OVERRIDES = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
for cap in (1, 2, 3):
    if libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
        raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")
os.execvp(sys.argv[1], sys.argv[1:])
"""


def unprivileged(command: Sequence[str]) -> list[str]:
    """`command`, run so that permissions bind it.

    Root's command runs without the capabilities that override them (see
    ``_DROP_OVERRIDES``); anyone else's as it is.
    """
    if os.name != "posix" or os.geteuid() != 0:
        return list(command)
    return [sys.executable, "-c", _DROP_OVERRIDES, *command]


def run(
    argv: Sequence[str],
    *,
    cwd: Path,
    tmpdir: Path | None = None,
    stdin: str | None = None,
    mount: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run `argv` (a Python program's arguments) as a user permissions bind.

    With `mount`, inside a mount namespace where that directory is mounted
    read-only (`read_only_mount`).
    """
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    if tmpdir is not None:
        env["TMPDIR"] = str(tmpdir)
    command = unprivileged([sys.executable, *argv])
    if mount is not None:
        command = _in_read_only_mount(mount, command)
    return subprocess.run(
        command,
        cwd=cwd,
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def worker(
    mode: str, path: Path, *, tmpdir: Path | None = None, mount: Path | None = None
) -> dict[str, Any]:
    """`read_only_worker` MODE on `path`, as a user permissions bind: its JSON."""
    done = run(
        [str(WORKER), mode, str(path)], cwd=path.parent, tmpdir=tmpdir, mount=mount
    )
    assert done.returncode == 0, done.stderr
    found: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return found


def lock_out_reason(tmp: Path) -> str | None:
    """Why this test cannot lock a user out of a directory here (None: it can)."""
    if os.name != "posix":
        return "POSIX permissions only"
    probe = tmp / "locked"
    probe.mkdir()
    probe.chmod(0o555)
    script = (
        "import sys\n"
        "try:\n    open(sys.argv[1], 'w')\n"
        "except PermissionError:\n    print('refused')\n"
        "else:\n    print('written')\n"
    )
    try:
        done = run(["-c", script, str(probe / "x")], cwd=tmp)
    finally:
        probe.chmod(0o755)
        shutil.rmtree(probe)
    if done.stdout.strip() == "written":
        return (
            "this user writes a directory whatever its permissions say (root "
            "that cannot drop CAP_DAC_OVERRIDE): chmod cannot make one read-only"
        )
    if done.stdout.strip() != "refused":
        return (
            "no process without root's power over permissions could be "
            f"started here: {done.stderr.strip()[-300:]}"
        )
    return None


def _in_read_only_mount(directory: Path, command: list[str]) -> list[str]:
    script = (
        'mount --bind "$1" "$1" && mount -o remount,ro,bind "$1" && shift && exec "$@"'
    )
    return ["unshare", "--mount", "sh", "-c", script, "sh", str(directory), *command]


def read_only_mount_reason(tmp: Path) -> str | None:
    """Why no read-only mount can be made here (None: it can)."""
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        return "no unshare or mount command"
    probe = tmp / "mounted"
    probe.mkdir()
    try:
        done = subprocess.run(
            _in_read_only_mount(probe, ["touch", str(probe / "x")]),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        shutil.rmtree(probe)
    if "Read-only file system" not in done.stderr:
        return (
            "a read-only bind mount is not allowed here (no mount namespace "
            f"of its own): {done.stderr.strip() or done.returncode}"
        )
    return None


def make_store(path: Path, *, in_log: bool = False) -> dict[str, list[int]]:
    """A store holding ``s_a`` and ``s_b`` (and ``s_log``, `in_log`); what it holds.

    With `in_log`, ``s_log`` is appended by a process that ends without
    closing the store: its commits are only in the write-ahead log, which
    is left beside the file with its index (``-shm``), as a crash or a copy
    taken while a run went on leaves them.
    """

    async def write() -> None:
        async with SQLiteStore(path) as store:
            await store.append("s_a", sample_entries(), expected_version=0)
            await store.append("s_b", sample_entries("run_b")[:3], expected_version=0)

    anyio.run(write)
    n = len(sample_entries())
    held = {"s_a": [n, n], "s_b": [3, 3]}
    if in_log:
        done = subprocess.run(
            [sys.executable, str(WORKER), "crash", str(path)],
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert Path(f"{path}-wal").stat().st_size > 0
        held["s_log"] = [n, n]
    return held


def contents(directory: Path) -> dict[str, tuple[int, bytes]]:
    """Every file in `directory`: its permission bits and bytes.

    A write-ahead log's index (``-shm``) is shared memory that any reader
    may rebuild: only its permission bits are compared.
    """
    return {
        p.name: (
            stat.S_IMODE(p.stat().st_mode),
            b"" if p.name.endswith("-shm") else p.read_bytes(),
        )
        for p in sorted(directory.iterdir())
        if p.is_file()
    }


@contextlib.contextmanager
def read_only(*paths: Path) -> Iterator[None]:
    """Take the write bits off `paths` (files and directories); give them back."""
    modes = {p: stat.S_IMODE(p.stat().st_mode) for p in paths}
    try:
        for p in paths:
            p.chmod(modes[p] & ~0o222)
        yield
    finally:
        for p in reversed(paths):
            p.chmod(modes[p])
