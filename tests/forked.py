"""Worker processes forked from a server that imported their module once.

The crash tests start a worker process per kill, hundreds a run. A new
interpreter spends about a second importing turnfsm before it reaches the
code under test; a process forked from multiprocessing's fork server, which
imported the worker's module once, starts in milliseconds. Each worker is
still a process of its own, opening its store after the fork and dying by
a real SIGKILL: what a crash does to the store is the same.

A worker module exposes ``async def main(argv, say)``; it reports its
progress lines (``ready``, ``complete``) with ``say`` instead of printing
them, and its standard error goes to a file.
"""

from __future__ import annotations

import contextlib
import importlib
import multiprocessing
import os
import signal
import sys
import traceback
from collections.abc import Mapping, Sequence
from multiprocessing.connection import Connection
from pathlib import Path

import anyio

_CONTEXT = multiprocessing.get_context("forkserver")


def preload(*modules: str) -> None:
    """Import `modules` in the fork server before it forks its first worker.

    Called once per test process, before its first `ForkedWorker`: the
    server starts with the first worker and keeps its imports for the rest.
    Name installed modules (turnfsm's, its dependencies'), not the tests':
    the server starts with a new interpreter's import path, where ``tests``
    may name another checkout's (a worker imports its own module with the
    test process's path).
    """
    _CONTEXT.set_forkserver_preload(list(modules))


class ForkedWorker:
    """One worker process running ``module.main(argv, say)`` under asyncio."""

    def __init__(
        self,
        module: str,
        argv: Sequence[str],
        stderr: Path,
        env: Mapping[str, str] | None = None,
    ) -> None:
        lines, sent = _CONTEXT.Pipe(duplex=False)
        self._lines = lines
        self.process = _CONTEXT.Process(
            target=_run,
            args=(module, list(argv), sent, str(stderr), dict(env or {}), sys.path),
        )
        self.process.start()
        sent.close()
        self.killed = False

    @property
    def pid(self) -> int:
        pid = self.process.pid
        assert pid is not None
        return pid

    def readline(self, timeout: float) -> str:
        """The next line the worker said, or "" if none came within `timeout`."""
        if not self._lines.poll(timeout):
            return ""
        try:
            line: str = self._lines.recv()
        except EOFError:  # it exited without saying more
            return ""
        return line

    def rest(self) -> list[str]:
        """The lines it said that were not read yet (after it exited)."""
        out: list[str] = []
        while self._lines.poll(0):
            try:
                out.append(self._lines.recv())
            except EOFError:
                break
        return out

    def running(self) -> bool:
        return self.process.exitcode is None

    def kill(self) -> None:
        """SIGKILL the worker and what it started (its process group)."""
        self.killed = True
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:  # not yet the leader of a group of its own
            with contextlib.suppress(ProcessLookupError):  # or gone already
                os.kill(self.pid, signal.SIGKILL)

    def wait(self, timeout: float) -> int:
        """Its exit code (``-9`` when killed); raise TimeoutError past `timeout`."""
        self.process.join(timeout)
        code = self.process.exitcode
        if code is None:
            raise TimeoutError(f"worker {self.pid} still runs after {timeout}s")
        return code

    def close(self) -> None:
        """Kill it if it still runs, reap it, and close its pipe."""
        if self.process.exitcode is None:
            self.kill()
        self.process.join(30)
        self._lines.close()
        self.process.close()


def _run(
    module: str,
    argv: list[str],
    lines: Connection,
    stderr: str,
    env: dict[str, str],
    path: list[str],
) -> None:
    os.setsid()  # a group of its own, as a worker started with start_new_session
    os.environ.update(env)
    sys.path[:] = path  # the test process's: its ``tests`` package
    fd = os.open(stderr, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    try:
        main = importlib.import_module(module).main
        anyio.run(main, argv, lines.send, backend="asyncio")
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    sys.stderr.flush()
    os._exit(0)
