"""Interrupted, not lost: Ctrl-C or a cancel from outside keeps what completed.

An interrupted run is logged ``interrupted``, holds its session like a paused
run, and `resume` carries it on as after a crash: no finished tool runs again,
and a call cut short is closed as interrupted (its tool runs again only if it
says it is safe to run twice, ``idempotent``).
"""

from __future__ import annotations

import functools
import os
import sqlite3
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import anyio
import pytest

from turnfsm.driver import Driver, Session, function_tool
from turnfsm.errors import Cancelled, SessionBusy, SessionConflict, StoreUnusable
from turnfsm.messages import Message
from turnfsm.persistence import (
    Entry,
    MemoryStore,
    RunOpened,
    SessionInfo,
    SQLiteStore,
    ToolResultRecorded,
)
from turnfsm.providers import ModelRequest
from turnfsm.testing import FakeModelClient, reply, tool_call

pytestmark = pytest.mark.anyio

REPO = Path(__file__).resolve().parents[2]


def _model(request: ModelRequest) -> Message:
    if any(m.role.value == "tool" for m in request.messages):
        return reply("all three done")
    return reply(
        "",
        tool_call("work", "c1", name="a"),
        tool_call("work", "c2", name="b"),
        tool_call("work", "c3", name="c"),
    )


async def _interrupted_once(
    driver: Driver, session: Session, task: str, until: Callable[[], Awaitable[None]]
) -> None:
    """Run `task`, and cancel the run from outside once `until` returns."""
    with anyio.fail_after(5):
        async with anyio.create_task_group() as group:

            async def run() -> None:
                await driver.run(task, session=session)

            group.start_soon(run)
            await until()
            group.cancel_scope.cancel()


@pytest.mark.parametrize("idempotent", [False, True])
async def test_an_interrupted_batch_resumes_without_running_a_finished_tool(
    idempotent: bool,
) -> None:
    ran: list[str] = []
    hang = anyio.Event()
    two_done = anyio.Event()

    async def work(name: str) -> str:
        """Do one piece of work.

        Args:
            name: which piece.
        """
        if name == "c" and not hang.is_set():
            await anyio.sleep_forever()
        ran.append(name)
        if len(ran) == 2:
            two_done.set()
        return f"{name} done"

    session = Session()
    tool = function_tool(work, idempotent=idempotent)
    driver = Driver(model=FakeModelClient(_model), tools=[tool])

    async def journaled() -> None:
        await two_done.wait()
        await anyio.sleep(0.05)  # the two results reach the journal

    await _interrupted_once(driver, session, "do a, b and c", journaled)

    interrupted = session.runs[-1]
    assert interrupted.outcome == "interrupted"
    assert isinstance(interrupted.error, Cancelled)
    assert list(session.history) == []  # nothing committed by an unfinished run
    with pytest.raises(SessionBusy) as busy:
        await driver.run("something else", session=session)
    # This process is alive: the run was interrupted, and it says so.
    assert "(paused, interrupted, or its process died)" in str(busy.value)

    hang.set()
    result = await driver.resume(session, interrupted.run_id)

    assert (result.outcome, result.text) == ("done", "all three done")
    # a and b ran once, before the interrupt; c, cut short, runs again only
    # if its tool is safe to run twice, else it is closed as interrupted.
    assert sorted(ran) == (["a", "b", "c"] if idempotent else ["a", "b"])
    assert [m.text for m in session.history][-1] == "all three done"
    (c3,) = [
        part for m in session.history for part in m.tool_results if part.call_id == "c3"
    ]
    if idempotent:
        assert (c3.content, c3.is_error) == ("c done", False)
    else:
        assert c3.is_error
        assert "interrupted" in c3.content
        assert "effects are unknown" in c3.content


async def test_results_riding_the_next_reply_are_kept_when_the_run_is_interrupted() -> (
    None
):
    # A tool safe to run twice has its results written with the next reply,
    # not before the model is asked: interrupted in that call, the run still
    # writes them (with its end), and its resume does not run the tool again.
    ran: list[str] = []
    asked = anyio.Event()

    async def slow_model(request: ModelRequest) -> Message:
        if any(m.role.value == "tool" for m in request.messages):
            asked.set()
            await anyio.sleep_forever()
        return reply("", tool_call("work", "c1", name="a"))

    async def work(name: str) -> str:
        """Do one piece of work.

        Args:
            name: which piece.
        """
        ran.append(name)
        return f"{name} done"

    session = Session()
    driver = Driver(
        model=FakeModelClient(slow_model),
        tools=[function_tool(work, idempotent=True)],
    )
    await _interrupted_once(driver, session, "do a", asked.wait)

    interrupted = session.runs[-1]
    assert interrupted.outcome == "interrupted"
    assert ran == ["a"]
    driver = Driver(
        model=FakeModelClient(_model), tools=[function_tool(work, idempotent=True)]
    )
    result = await driver.resume(session, interrupted.run_id)

    assert (result.outcome, result.text) == ("done", "all three done")
    assert ran == ["a"]  # its result was kept: it did not run again
    (a,) = [part for m in session.history for part in m.tool_results]
    assert (a.call_id, a.content, a.is_error) == ("c1", "a done", False)


WORKER = Path(__file__).with_name("interrupt_worker.py")


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("idempotent", [False, True])
async def test_ctrl_c_keeps_the_finished_tools_and_resume_finishes(
    tmp_path: Path, idempotent: bool
) -> None:
    script = WORKER
    effects = tmp_path / "effects.txt"
    store = tmp_path / "s.db"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    mode = ["idempotent"] if idempotent else []

    with anyio.fail_after(60):
        first = await anyio.run_process(
            [sys.executable, str(script), str(effects), str(store), "first", *mode],
            env=env,
            check=False,
        )
    assert first.returncode != 0  # Ctrl-C ends the process
    assert "KeyboardInterrupt" in first.stderr.decode()
    assert effects.read_text().split() == ["0", "1"]

    with anyio.fail_after(60):
        second = await anyio.run_process(
            [sys.executable, str(script), str(effects), str(store), "second", *mode],
            env=env,
            check=False,
        )

    assert second.returncode == 0, second.stderr.decode()
    assert second.stdout.decode().splitlines() == ["interrupted", "done finished"]
    # No step ran twice. The Ctrl-C landed with the third step's call made:
    # a step safe to run twice runs on resume; any other is closed as
    # interrupted (the model hears it, and answers).
    ran = ["0", "1", "2"] if idempotent else ["0", "1"]
    assert effects.read_text().split() == ran
    if not idempotent:
        assert "closing 1 call(s) left without a result" in second.stderr.decode()


class _LockedOnce:
    """An SQLite store whose file another writer holds during one append.

    The append that writes the first entry of `kind` meets the lock (a real
    ``BEGIN IMMEDIATE`` of another connection) for longer than the store's
    ``busy_timeout``; the lock is let go as that append fails, so the store
    works again at once, as after a short outage.
    """

    def __init__(self, path: Path, kind: type = ToolResultRecorded) -> None:
        self.inner = SQLiteStore(path, busy_timeout=0.05)
        self.path = path
        self.kind = kind
        self.locked = False

    async def append(
        self, session_id: str, entries: Sequence[Entry], *, expected_version: int
    ) -> int:
        if self.locked or not any(isinstance(e, self.kind) for e in entries):
            return await self.inner.append(
                session_id, entries, expected_version=expected_version
            )
        self.locked = True
        other = sqlite3.connect(self.path, isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")
            return await self.inner.append(
                session_id, entries, expected_version=expected_version
            )
        finally:
            other.execute("ROLLBACK")
            other.close()

    async def load(self, session_id: str) -> tuple[Entry, ...]:
        return await self.inner.load(session_id)

    async def list_sessions(self) -> tuple[SessionInfo, ...]:
        return await self.inner.list_sessions()


async def test_a_store_down_for_one_append_leaves_the_run_to_resume(
    tmp_path: Path,
) -> None:
    ran: list[str] = []

    async def work(name: str) -> str:
        """Do one piece of work.

        Args:
            name: which piece.
        """
        ran.append(name)
        return f"{name} done"

    store = _LockedOnce(tmp_path / "s.db")
    session = Session(store=store)
    driver = Driver(model=FakeModelClient(_model), tools=[function_tool(work)])
    with anyio.fail_after(10), pytest.raises(StoreUnusable, match="locked"):
        await driver.run("do a, b and c", session=session)

    # The store is back at once: the run is logged interrupted, not failed,
    # with the store's error, and it resumes; no finished tool runs again.
    reopened = await Session.load(store.inner, session.id)
    (stopped,) = reopened.open_runs()
    assert stopped.outcome == "interrupted"
    assert isinstance(stopped.error, StoreUnusable)
    result = await driver.resume(reopened, stopped.run_id)
    assert (result.outcome, result.text) == ("done", "all three done")
    assert sorted(ran) == ["a", "b", "c"]
    closed = [r for m in reopened.history for r in m.tool_results if r.is_error]
    assert all("interrupted" in r.content for r in closed)
    await store.inner.aclose()


async def test_a_run_whose_first_write_the_store_refused_never_began(
    tmp_path: Path,
) -> None:
    store = _LockedOnce(tmp_path / "s.db", kind=RunOpened)
    session = Session(store=store)
    model = FakeModelClient(_model)
    driver = Driver(model=model, tools=[function_tool(_work)])
    with anyio.fail_after(10), pytest.raises(StoreUnusable, match="locked"):
        await driver.run("do a, b and c", session=session)
    # Nothing of it is in the log: no run without its input to resume.
    assert await store.inner.list_sessions() == ()
    result = await driver.run("do a, b and c", session=session)
    assert (result.outcome, result.text) == ("done", "all three done")
    assert session.history[0].text == "do a, b and c"
    await store.inner.aclose()


async def _work(name: str) -> str:
    """Do one piece of work.

    Args:
        name: which piece.
    """
    return f"{name} done"


async def test_a_new_run_refused_meanwhile_does_not_refuse_the_resume(
    tmp_path: Path,
) -> None:
    # A second request's new run, refused for the open run, took the session
    # while its refusal read the log: the resume of that run, in the same
    # process at that moment, was refused as "running another run", though
    # nothing ran, and the session stayed interrupted.
    reading = anyio.Event()
    go_on = anyio.Event()

    class Gated(SQLiteStore):
        gate = False

        async def load(self, session_id: str) -> Sequence[Entry]:
            if self.gate:  # the refusal's read of the log: held up
                self.gate = False
                reading.set()
                await go_on.wait()
            return await super().load(session_id)

    calls: list[int] = []

    async def work() -> str:
        """Work a while the first time."""
        calls.append(1)
        if len(calls) == 1:
            await anyio.sleep(5)
        return "worked"

    store = Gated(tmp_path / "s.db")
    driver = Driver(
        model=FakeModelClient(
            lambda r: (
                reply("done")
                if r.messages[-1].role.value == "tool"
                else reply("", tool_call("work", "c1"))
            )
        ),
        tools=[function_tool(work, idempotent=True)],
    )
    session = Session(store=store)
    with anyio.move_on_after(0.3):  # the client went away while `work` ran
        await driver.run("task", session=session)
    (run,) = (await Session.open(store, session.id)).open_runs()
    refused: list[BaseException] = []

    async def new_run() -> None:
        view = await Session.open(store, session.id)
        store.gate = True
        try:
            await driver.run("hello", session=view)
        except (SessionBusy, SessionConflict) as exc:
            refused.append(exc)

    with anyio.fail_after(20):
        async with anyio.create_task_group() as group:
            group.start_soon(new_run)
            await reading.wait()
            resumed = await driver.resume(
                await Session.open(store, session.id), run.run_id
            )
            go_on.set()
    assert resumed.outcome == "done"
    assert len(refused) == 1
    await store.aclose()


@pytest.mark.parametrize("on_disk", [False, True], ids=["memory", "sqlite"])
async def test_a_new_run_beside_one_running_here_is_told_to_wait(
    tmp_path: Path, on_disk: bool
) -> None:
    # Told to resume or abandon the run (as if paused or dead), which only
    # met SessionBusy again: the run was running, in this process.
    started = [anyio.Event()]

    async def work() -> str:
        """Work a while."""
        started[-1].set()
        if len(started) > 1:  # the second run's: it runs until cancelled
            await anyio.sleep(5)
        return "worked"

    store = SQLiteStore(tmp_path / "s.db") if on_disk else MemoryStore()
    driver = Driver(
        model=FakeModelClient(
            lambda r: (
                reply("done")
                if r.messages[-1].role.value == "tool"
                else reply("", tool_call("work", "c1"))
            )
        ),
        tools=[work],
    )
    session = Session(store=store)
    with anyio.fail_after(10):
        await driver.run("first", session=session)  # stored: a second view reads it
        started.append(anyio.Event())
        async with anyio.create_task_group() as group:
            group.start_soon(functools.partial(driver.run, "task", session=session))
            await started[-1].wait()
            with pytest.raises(SessionBusy) as busy:
                await driver.run("hello", session=await Session.open(store, session.id))
            group.cancel_scope.cancel()
    assert "is running another run; wait for it to end" in str(busy.value)
