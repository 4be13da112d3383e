"""The crash test's worker: one long, scripted, tool-using, compacting session.

`tests/persistence/test_crash.py` runs this file in a subprocess and kills it
with SIGKILL at random points; each new process reopens the session from the
store and carries on where the log says it stopped:

    python crash_worker.py STORE SESSION_ID EFFECTS TRACE [TASKS] [idempotent]

STORE is ``sqlite:PATH`` or a ``postgresql://`` URL / conninfo (prefixed by
``postgres:``). The worker

1. reopens the session, or starts it (`Session.open`), and prints ``ready``;
2. resumes the open run, if there is one (`Driver.resume`, no event: the
   effect in flight is redone, journaled tool results are not re-run, and a
   call cut short is closed as interrupted - or, with ``idempotent``, the
   tool being marked safe to run twice, run again);
3. runs the remaining scripted tasks (``task 0`` .. ``task N-1``, one run
   each) and prints ``complete``.

Everything is deterministic: the model answers from the request's last
message (the task and step it names), the tool call ids are derived from
the task and step, the compactor is `TruncatingCompactor` (positional). So
the finished history has the same content however often the worker died.

Two files record what happened, both appended with `os.write` to an
``O_APPEND`` descriptor (a SIGKILL cannot lose a write that returned):

- EFFECTS: one line per tool execution, the call id: the side effect whose
  duplicates the test counts;
- TRACE: ``+what`` / ``-what`` around every model call, tool call,
  compaction pass and store append, so the test can tell what was in flight
  when the kill landed.

The module is also imported by the test, which runs the same script
in-process (`drive`) for the uninterrupted reference.
"""

from __future__ import annotations

import os
import re
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anyio

from turnfsm import ContextManager, Driver, HeuristicTokenCounter, TruncatingCompactor
from turnfsm.context import CompactionContext, CompactionProposal
from turnfsm.driver import function_tool
from turnfsm.messages import Message, Role
from turnfsm.persistence import Entry, Session, SessionInfo, SessionStore
from turnfsm.providers import ModelRequest
from turnfsm.testing import FakeModelClient, reply, tool_call

TASKS = 16
"""Tasks (runs) in the scripted session."""

MODEL_SECONDS = 0.003
TOOL_SECONDS = 0.004
COMPACT_SECONDS = 0.008
"""Each step is slow-ish, so that kills land inside it, not only between."""

_CALL_ID = re.compile(r"^t(\d+)s(\d+)c(\d+)$")


def steps_of(task: int) -> int:
    """How many tool-calling steps task `task` takes before its final answer."""
    return 2 + task % 4


def calls_of(task: int, step: int) -> int:
    """How many tool calls (run concurrently) step `step` of `task` makes."""
    return 2 if (task + step) % 3 == 0 else 1


def task_input(task: int) -> str:
    return f"task {task}: do the {task}th thing, one step at a time"


class Trace:
    """Markers around every slow operation, for the test to read after a kill."""

    def __init__(self, path: str | None) -> None:
        self._fd = (
            os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            if path
            else None
        )

    def mark(self, text: str) -> None:
        if self._fd is not None:
            os.write(self._fd, f"{text}\n".encode())


class TracedStore:
    """A `SessionStore` that marks the start and end of every append.

    With ``TURNFSM_KILL_AFTER_APPEND=N`` in the environment, the process
    kills itself (SIGKILL) as soon as its N-th append has committed, before
    the driver hears of it: a kill at that append boundary.
    """

    def __init__(self, inner: SessionStore, trace: Trace) -> None:
        self.inner = inner
        self.trace = trace
        self.appends = 0
        self.kill_after = int(os.environ.get("TURNFSM_KILL_AFTER_APPEND", "0"))

    async def append(
        self, session_id: str, entries: Sequence[Entry], *, expected_version: int
    ) -> int:
        kinds = ",".join(type(e).__name__ for e in entries)
        self.trace.mark(f"+append {expected_version} {kinds}")
        version = await self.inner.append(
            session_id, entries, expected_version=expected_version
        )
        self.trace.mark(f"-append {version}")
        self.appends += 1
        if self.appends == self.kill_after:
            os.kill(os.getpid(), signal.SIGKILL)
        return version

    async def load(self, session_id: str) -> tuple[Entry, ...]:
        return await self.inner.load(session_id)

    async def list_sessions(self) -> tuple[SessionInfo, ...]:
        return await self.inner.list_sessions()


class SlowCompactor:
    """`TruncatingCompactor`, after a short sleep (so kills land mid-pass)."""

    def __init__(self, trace: Trace) -> None:
        self.inner = TruncatingCompactor(
            preserve_recent=4, min_messages=6, compact_newest_exchange=True
        )
        self.trace = trace

    async def compact(
        self, messages: Sequence[Message], target: int, ctx: CompactionContext
    ) -> CompactionProposal:
        self.trace.mark("+compact")
        await anyio.sleep(COMPACT_SECONDS)
        outcome = await self.inner.compact(messages, target, ctx)
        self.trace.mark("-compact")
        return outcome


def answer(messages: Sequence[Message]) -> Message:
    """The scripted reply to a request, from its last message alone."""
    last = messages[-1]
    if last.role == Role.USER:
        task, step = int(last.text.split(":")[0].split()[1]), 0
    else:
        results = last.tool_results
        assert results, f"unexpected last message {last!r}"
        match = _CALL_ID.match(results[-1].call_id)
        assert match is not None, results[-1].call_id
        task, step = int(match[1]), int(match[2]) + 1
    if step == steps_of(task):
        return reply(f"task {task} done after {step} steps")
    calls = [
        tool_call("record", f"t{task}s{step}c{i}", key=f"t{task}s{step}c{i}")
        for i in range(calls_of(task, step))
    ]
    return reply(f"task {task} step {step}: " + "thinking " * 8, *calls)


def build_driver(effects: str, trace: Trace, *, idempotent: bool = False) -> Driver:
    """The driver every worker process (and the reference run) uses."""
    fd = os.open(effects, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    async def record(key: str) -> str:
        """Apply the side effect of call `key` (append a line to a file).

        Args:
            key: The tool call's id.
        """
        trace.mark(f"+tool {key}")
        await anyio.sleep(TOOL_SECONDS)
        os.write(fd, f"{key}\n".encode())
        trace.mark(f"-tool {key}")
        return f"recorded {key}: " + "lorem ipsum dolor " * 25

    async def handle(request: ModelRequest) -> Message:
        trace.mark("+model")
        await anyio.sleep(MODEL_SECONDS)
        message = answer(request.messages)
        trace.mark("-model")
        return message

    manager = ContextManager(
        SlowCompactor(trace),
        context_window=1_000,
        threshold=80,
        counter=HeuristicTokenCounter(),
    )
    return Driver(
        model=FakeModelClient(handle),
        tools=[function_tool(record, idempotent=idempotent)],
        system_prompt="You are the crash test's scripted agent.",
        context=manager,
        max_turns=20,
        tool_timeout=10.0,
    )


async def drive(
    store: SessionStore,
    session_id: str,
    driver: Driver,
    trace: Trace,
    *,
    tasks: int = TASKS,
    ready: Any = None,
) -> Session:
    """Carry the scripted session on from its log until every task is done."""
    store = TracedStore(store, trace)
    session = await Session.open(store, session_id)
    trace.mark(f"loaded {session.version}")
    if ready is not None:
        ready()
    waiting = session.open_runs()
    assert len(waiting) <= 1, [r.run_id for r in waiting]
    if waiting:
        # A run opens in the same append as its first event, so an open run
        # always holds its input: resume it.
        run = waiting[0]
        assert run.events, run
        trace.mark(f"resume {run.run_id}")
        result = await driver.resume(session, run.run_id)
        assert result.outcome == "done", result
    while True:
        done = [r for r in session.runs if r.outcome == "done"]
        assert all(r.outcome == "done" for r in session.runs if not r.is_open)
        if len(done) >= tasks:
            return session
        trace.mark(f"run {len(done)}")
        result = await driver.run(task_input(len(done)), session=session)
        assert result.outcome == "done", result


PRELOAD = (
    "anyio",
    "turnfsm",
    "turnfsm.context",
    "turnfsm.driver",
    "turnfsm.messages",
    "turnfsm.persistence",
    "turnfsm.persistence.postgres",
    "turnfsm.providers",
    "turnfsm.testing",
)
"""What a forked worker imports before its fork (`tests.forked.preload`)."""


def _print(line: str) -> None:
    print(line, flush=True)


def open_store(spec: str) -> Any:
    if spec.startswith("sqlite:"):
        from turnfsm.persistence import SQLiteStore

        return SQLiteStore(Path(spec.removeprefix("sqlite:")))
    from turnfsm.persistence.postgres import PostgresStore

    return PostgresStore(spec.removeprefix("postgres:"), min_size=1, max_size=2)


async def main(argv: Sequence[str], say: Callable[[str], None] = _print) -> None:
    """Run the scripted session; `say` reports ``ready`` and ``complete``."""
    spec, session_id, effects, trace_path, *rest = argv
    tasks = int(rest[0]) if rest else TASKS
    idempotent = rest[1:] == ["idempotent"]
    trace = Trace(trace_path)
    store = open_store(spec)
    driver = build_driver(effects, trace, idempotent=idempotent)

    await drive(
        store, session_id, driver, trace, tasks=tasks, ready=lambda: say("ready")
    )
    await store.aclose()
    trace.mark("complete")
    say("complete")


if __name__ == "__main__":
    anyio.run(main, sys.argv[1:], backend="asyncio")
