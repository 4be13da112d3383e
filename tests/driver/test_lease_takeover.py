"""Two processes, one session: a live owner refuses; a dead one is taken over."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest

from tests.driver.lease_worker import TTL, build
from tests.helpers import REPO_ROOT
from turnfsm.errors import SessionBusy
from turnfsm.persistence import Session, SQLiteStore

pytestmark = pytest.mark.timeout(120)


def _load(path: Path, session_id: str) -> Session:
    async def go() -> Session:
        async with SQLiteStore(path) as store:
            return await Session.load(store, session_id)

    return anyio.run(go)


def test_a_live_owner_refuses_then_a_dead_one_is_taken_over(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    owner = subprocess.Popen(
        [sys.executable, "-m", "tests.driver.lease_worker", str(path), "ses_shared"],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert owner.stdout is not None
        assert owner.stdout.readline().decode().strip() == "holding"
        session = _load(path, "ses_shared")
        (run,) = session.open_runs()

        async def resume(*, force: bool = False) -> object:
            async with SQLiteStore(path) as store:
                again = await Session.load(store, "ses_shared")
                return await build(hang=False).resume(again, run.run_id, force=force)

        # The owner is alive (it keeps renewing): refused, and told so.
        time.sleep(TTL * 1.5)  # longer than a lease: only renewals keep it
        with pytest.raises(SessionBusy) as refused:
            anyio.run(resume)
        assert refused.value.alive is True
        assert refused.value.owner is not None
        assert f":{owner.pid}:" in refused.value.owner
        assert refused.value.since is not None
        assert "alive" in str(refused.value)
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.communicate()
    # Dead: its lease expires, and the run is taken over where it stopped.
    time.sleep(TTL * 1.5)
    result = anyio.run(resume)
    assert result.ok, result  # type: ignore[attr-defined]
    finished = _load(path, "ses_shared")
    assert [r.outcome for r in finished.runs] == ["done"]
    assert finished.history[-1].text == "all done"


def test_a_new_run_on_a_dead_owners_session_says_it_is_dead(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    owner = subprocess.Popen(
        [sys.executable, "-m", "tests.driver.lease_worker", str(path), "ses_dead"],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        stdout=subprocess.PIPE,
    )
    assert owner.stdout is not None
    assert owner.stdout.readline().decode().strip() == "holding"
    owner.send_signal(signal.SIGKILL)
    owner.communicate()
    time.sleep(TTL * 1.5)

    async def run() -> object:
        async with SQLiteStore(path) as store:
            session = await Session.load(store, "ses_dead")
            return await build(hang=False).run("something else", session=session)

    with pytest.raises(SessionBusy) as refused:
        anyio.run(run)
    assert refused.value.alive is False
    assert refused.value.run_id is not None
    assert "resume or abandon" in str(refused.value)
