"""How long a 10,000-turn session takes to open in ``turnfsm view``.

Generates (once, cached beside the store) a session of `TURNS` model calls:
one long tool-using run on a fake model with a small window, so it
compacts every few turns; then starts the live view's server on it and
times the server's start (the log read from the store), then the first
page, as a browser opening it fetches it (built and sent; the page then
asks for the runs' paths, replayed then), the path, and one turn's
details (fetched on demand).

    python bench/view_open.py                 # 10,000 turns, in a temp dir
    python bench/view_open.py 2000 /tmp/v.db  # custom size, kept store

Prints the seconds to the server's start (and the CPU seconds it took: on a
busy machine the wall time is longer), to the first page (the target is 2 s)
and to a turn's details; what ``turnfsm view`` takes before that, to import
(in a fresh interpreter); and the log read alone, timed in this process as
it is made and with Python's garbage collector left running through it (the
ratio is what pausing the collector saves; the least of `REPEATS` reads each),
and the share of it the runs' events take (what decoding them only when a
page needs them would save).
"""

from __future__ import annotations

import contextlib
import html
import os
import re
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import anyio

from turnfsm import Agent
from turnfsm.context import ContextManager, TruncatingCompactor
from turnfsm.messages import Message
from turnfsm.persistence import SQLiteStore, _rows
from turnfsm.providers import ModelRequest
from turnfsm.testing import FakeModelClient, reply, tool_call

TARGET_S = 2.0
REPEATS = 3


def read(path: str) -> str:
    """Read a file.

    Args:
        path: the file.
    """
    return f"contents of {path}: " + "lorem ipsum " * 40


def _agent(store: SQLiteStore, turns: int) -> Agent:
    def plan(request: ModelRequest) -> Message:
        plan.calls += 1  # type: ignore[attr-defined]
        if plan.calls >= turns:  # type: ignore[attr-defined]
            return reply("done")
        return reply("", tool_call("read", path=f"f{plan.calls}.py"))  # type: ignore[attr-defined]

    plan.calls = 0  # type: ignore[attr-defined]
    return Agent(
        model=FakeModelClient(plan),
        tools=[read],
        store=store,
        context=ContextManager(
            TruncatingCompactor(
                preserve_recent=2, min_messages=3, compact_newest_exchange=True
            ),
            context_window=8_000,
        ),
        max_turns=turns + 10,
    )


async def generate(path: Path, turns: int) -> str:
    """Store a session of `turns` model calls in `path`; return its id."""
    store = SQLiteStore(path)
    try:
        result = await _agent(store, turns).run("read every file")
        return result.session_id
    finally:
        await store.aclose()


def import_seconds() -> tuple[float, float]:
    """Wall and CPU seconds a fresh interpreter takes to import the view's command."""
    code = (
        "import time; w, c = time.perf_counter(), time.process_time(); "
        "import turnfsm.cli, turnfsm.view; "
        "print(time.perf_counter() - w, time.process_time() - c)"
    )
    here = str(Path(__file__).resolve().parent.parent)
    path = os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": path},
    )
    wall, cpu = done.stdout.split()
    return float(wall), float(cpu)


def read_cpu(path: Path, session_id: str) -> float:
    """CPU seconds one read of the log takes (`SQLiteStore.load`, no projection)."""

    async def read() -> None:
        async with SQLiteStore(path) as store:
            await store.load(session_id)

    cpu = time.process_time()
    anyio.run(read)
    return time.process_time() - cpu


def events_cpu(path: Path, session_id: str) -> tuple[int, float, float]:
    """The runs' events in the log: how many, the CPU to decode them, their share.

    The rows are decoded as `SQLiteStore.load` does, once all of them and
    once all but the events: the difference is what decoding the events
    costs (the first page shows of them only the replies of its first turns).
    """
    with contextlib.closing(sqlite3.connect(path)) as conn:
        key = _rows.column_text(session_id)
        rows = conn.execute(_ROWS, (key,)).fetchall()
        messages = dict(conn.execute(_MESSAGES, (key,)).fetchall())
    every = [body for _, body in rows]
    others = [body for kind, body in rows if kind != "EventRecorded"]

    def decode(bodies: list[str]) -> float:
        cpu = time.process_time()
        _rows.decode_log(session_id, bodies, messages, version=len(bodies))
        return time.process_time() - cpu

    every_cpu, others_cpu = least(lambda: decode(every), lambda: decode(others))
    events = every_cpu - others_cpu
    return len(every) - len(others), events, events / every_cpu


_ROWS = "SELECT kind, body FROM turnfsm_entries WHERE session_id = ? ORDER BY seq"
_MESSAGES = "SELECT digest, body FROM turnfsm_messages WHERE session_id = ?"


def least(
    measure: Callable[[], float], baseline: Callable[[], float]
) -> tuple[float, float]:
    """The least of `REPEATS` runs of each, taken in turn (as made, baseline)."""
    made, base = [], []
    for _ in range(REPEATS):
        made.append(measure())
        base.append(baseline())
    return min(made), min(base)


def main() -> None:
    from turnfsm.view import ViewServer

    turns = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000
    where = Path(sys.argv[2]) if len(sys.argv) > 2 else None
    with tempfile.TemporaryDirectory() as tmp:
        path = where or Path(tmp) / "view.db"
        ids = path.with_suffix(".id")
        if not ids.exists():
            began = time.perf_counter()
            ids.write_text(anyio.run(generate, path, turns))
            print(f"generated {turns} turns in {time.perf_counter() - began:.1f} s")
        session_id = ids.read_text()
        imported, import_cpu = import_seconds()
        began, cpu = time.perf_counter(), time.process_time()
        with ViewServer(lambda: SQLiteStore(path), session_id) as server:
            started = time.perf_counter() - began
            start_cpu = time.process_time() - cpu
            began = time.perf_counter()
            with urllib.request.urlopen(server.url) as page:
                body = page.read()
            opened = time.perf_counter() - began
            open_cpu = time.process_time() - cpu
            # What the page asks for once it is shown: the first run's path.
            found = re.search(rb'data-load="([^"]+)"', body)
            assert found is not None, "the page asks for no path"
            began = time.perf_counter()
            with urllib.request.urlopen(html.unescape(found.group(1).decode())) as page:
                page.read()
            drawn = time.perf_counter() - began
            began = time.perf_counter()
            with urllib.request.urlopen(server.turn_url(0, turns - 1)) as page:
                page.read()
            turn = time.perf_counter() - began
            entries = server.session().version

        def collecting() -> float:  # the read as it was: the collector running
            with mock.patch.object(_rows, "_collector_paused", contextlib.nullcontext):
                return read_cpu(path, session_id)

        made, base = least(lambda: read_cpu(path, session_id), collecting)
        events, event_cpu, share = events_cpu(path, session_id)
        total = started + opened
        verdict = "ok" if total <= TARGET_S else "OVER"
        print(
            f"{turns} turns ({entries} log entries): server ready in {started:.2f} s "
            f"({start_cpu:.2f} s of CPU: the log read); first page {opened:.2f} s "
            f"later ({len(body) // 1024} KiB), so open in {total:.2f} s "
            f"({open_cpu:.2f} s of CPU; target {TARGET_S:.0f} s: {verdict}); "
            f"then the path, drawn as the page asks for it, in {drawn:.2f} s; "
            f"a turn's details {turn:.3f} s\n"
            f"before that, `turnfsm view` imports in {imported:.2f} s "
            f"({import_cpu:.2f} s of CPU), so {imported + total:.2f} s in all\n"
            f"the log read alone: {made:.2f} s of CPU; {base:.2f} s with the garbage "
            f"collector running through it ({base / made:.2f}x); its {events} events "
            f"take {event_cpu:.2f} s of it ({share:.0%}), and the first "
            "page shows of them only the replies of each run's first turns"
        )


if __name__ == "__main__":
    main()
