"""A SIGKILL at every append boundary of a run: history and audit still agree.

The crash test's worker (`crash_worker.py`, forked: `tests.forked`) runs a
short scripted session (a few tool-using, compacting runs) and kills itself
with SIGKILL right after its N-th append has committed, before the driver
hears of it; the test does this for every N from the first append to the
last. After each kill the session is reopened with a fresh store object and
checked:

- the history is a whole conversation, one the uninterrupted run went
  through, and it holds the final answer of exactly the runs the audit trail
  says ended ``done`` (a run's final commit and its end are one append);
- at most one run is open, the last one.

Then, alternately, the open run is resumed by a new worker (the session
completes with the uninterrupted run's history; a tool call runs again only
if its result was not yet logged when the process died: the worker's tool is
marked safe to run twice, ``idempotent``, so a call cut short runs again
instead of being closed as interrupted) or abandoned (it ends
``failed`` with a `Cancelled` error, nothing of it is committed, and the
session takes the next run).
"""

from __future__ import annotations

import signal
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.forked import ForkedWorker, preload
from tests.persistence import crash_worker as worker
from tests.persistence.test_crash import content, journaled
from tests.profiles import PROFILE
from turnfsm.core import CompactionResult
from turnfsm.errors import Cancelled
from turnfsm.messages import check_history
from turnfsm.persistence import (
    Committed,
    EventRecorded,
    MemoryStore,
    Session,
    SQLiteStore,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

WORKER_MODULE = "tests.persistence.crash_worker"
preload(*worker.PRELOAD)
TASKS = 2
"""Runs in the scripted session: enough for tool batches and compactions."""


def _reference(tmp: Path) -> tuple[Any, int]:
    """The uninterrupted session, and how many appends it makes."""

    async def go() -> tuple[Any, int]:
        trace = worker.Trace(None)
        driver = worker.build_driver(
            str(tmp / "reference-effects"), trace, idempotent=True
        )
        store = worker.TracedStore(MemoryStore(), trace)
        session = await worker.drive(store, "ses_ref", driver, trace, tasks=TASKS)
        return session, store.appends

    return anyio.run(go, backend="asyncio")


def _worker(
    store_arg: str, session_id: str, tmp: Path, kill_after: int = 0
) -> tuple[int, str]:
    """Run the worker to its end or its own kill: its exit code and its stderr."""
    err = tmp / f"{session_id}.stderr"
    proc = ForkedWorker(
        WORKER_MODULE,
        [
            store_arg,
            session_id,
            str(tmp / f"{session_id}.effects"),
            str(tmp / f"{session_id}.trace"),
            str(TASKS),
            "idempotent",
        ],
        err,
        env={"TURNFSM_KILL_AFTER_APPEND": str(kill_after)},
    )
    try:
        code = proc.wait(120)
    finally:
        proc.close()
    return code, err.read_text()


def _commits(session: Session, run_id: str) -> list[str]:
    """What each of a run's commit points came after: "pass" or "end"."""
    kinds: list[str] = []
    last: Any = None
    for entry in session.entries:
        if getattr(entry, "run_id", None) != run_id:
            continue
        if isinstance(entry, Committed):
            assert isinstance(last, EventRecorded), last
            kinds.append("pass" if isinstance(last.event, CompactionResult) else "end")
        if isinstance(entry, EventRecorded):
            last = entry
    return kinds


def _check_agreement(session: Session, committed: set[Any]) -> None:
    """History and audit trail tell the same story.

    A run the audit says is done made its final commit; a run it says is in
    flight (or abandoned) committed nothing but its compaction passes.
    """
    check_history(session.history)
    assert content(session.history) in committed
    for run in session.runs:
        commits = _commits(session, run.run_id)
        if run.outcome == "done":
            assert commits[-1:] == ["end"], (run.run_id, commits)
        elif run.outcome == "failed":  # abandoned: nothing of it committed
            assert isinstance(run.error, Cancelled), run.error
            assert "end" not in commits, (run.run_id, commits)
        else:
            assert run.is_open, (run.run_id, run.outcome)
            assert "end" not in commits, (run.run_id, commits)
    assert all(not r.is_open for r in session.runs[:-1])


def _boundaries(
    store_arg: Callable[[str], str],
    open_store: Callable[[str], Any],
    tmp: Path,
) -> Counter[str]:
    reference, appends = _reference(tmp)
    view = Session("ses_view", store=MemoryStore())
    committed = {content(())}

    async def replayed() -> None:
        for entry in reference.entries:
            await view.append(entry)
            committed.add(content(view.history))

    anyio.run(replayed, backend="asyncio")
    seen: Counter[str] = Counter()
    step = 1 if PROFILE == "ci" else 4  # every boundary under ci
    for i, n in enumerate(range(1, appends + 1, step)):
        session_id = f"ses_cut{n:03d}"
        arg = store_arg(session_id)
        code, stderr = _worker(arg, session_id, tmp, kill_after=n)
        assert code == -signal.SIGKILL, stderr

        async def reopen(session_id: str = session_id) -> Session:
            store = open_store(session_id)
            try:
                return await Session.load(store, session_id)
            finally:
                await store.aclose()

        session = anyio.run(reopen, backend="asyncio")
        _check_agreement(session, committed)
        open_runs = session.open_runs()
        if i % 2 == 0 or not open_runs:
            seen["resumed" if open_runs else "between runs"] += 1
            code, stderr = _worker(arg, session_id, tmp)
            assert code == 0, stderr
            finished = anyio.run(reopen, backend="asyncio")
            assert content(finished.history) == content(reference.history)
            assert [r.outcome for r in finished.runs] == ["done"] * TASKS
            effects = Counter((tmp / f"{session_id}.effects").read_text().split())
            again = {k for k, v in effects.items() if v > 1}
            # At least once, at most twice: only a call whose result was not
            # yet logged when the process died runs again.
            assert again <= set(effects) - journaled(session)
            assert max(effects.values()) <= 2
        else:
            seen["abandoned"] += 1
            before = content(session.history)

            run_id = open_runs[0].run_id

            async def abandon(
                session_id: str = session_id, run_id: str = run_id
            ) -> Session:
                store = open_store(session_id)
                try:
                    again = await Session.load(store, session_id)
                    driver = worker.build_driver(
                        str(tmp / f"{session_id}.effects"),
                        worker.Trace(None),
                        idempotent=True,
                    )
                    result = await driver.abandon(again, run_id)
                    assert result.outcome == "failed"
                    assert isinstance(result.error, Cancelled)
                    return await Session.load(store, session_id)
                finally:
                    await store.aclose()

            after = anyio.run(abandon, backend="asyncio")
            assert content(after.history) == before  # nothing of it committed
            assert not after.open_runs()
            _check_agreement(after, committed)
    return seen


def test_sqlite_every_append_boundary(tmp_path: Path) -> None:
    seen = _boundaries(
        lambda sid: f"sqlite:{tmp_path / (sid + '.db')}",
        lambda sid: SQLiteStore(tmp_path / f"{sid}.db"),
        tmp_path,
    )
    assert seen["resumed"], seen
    assert seen["abandoned"], seen
    print("sqlite append boundaries:", dict(seen))


def test_postgres_every_append_boundary(
    tmp_path: Path, postgres_url: Callable[[], str]
) -> None:
    from turnfsm.persistence.postgres import PostgresStore

    urls: dict[str, str] = {}

    def url_of(session_id: str) -> str:
        if session_id not in urls:
            urls[session_id] = postgres_url()
        return urls[session_id]

    seen = _boundaries(
        lambda sid: f"postgres:{url_of(sid)}",
        lambda sid: PostgresStore(url_of(sid), min_size=0, max_size=1),
        tmp_path,
    )
    assert seen["resumed"], seen
    assert seen["abandoned"], seen
    print("postgres append boundaries:", dict(seen))
