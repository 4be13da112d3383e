"""The Temporal crash test's worker: serves the scripted agent's durable runs.

`tests/temporal/test_crash.py` runs this file in a subprocess and kills it
with SIGKILL at random points; another process like it picks the workflow
up (Temporal runs the lost activity again, or hands the workflow task on):

    python -m tests.temporal.crash_worker [--standby] ADDRESS TASK_QUEUE \
        STORE_PATH EFFECTS ATTEMPTS TRACE

(from the repository's root, so that `tests` and this `turnfsm` import).

It connects to Temporal at ADDRESS, builds the agent (`build_agent`: the
script of `tests/persistence/crash_worker.py`, on an `SQLiteStore` at
STORE_PATH) and serves it on TASK_QUEUE, printing ``ready`` once it polls.
With ``--standby`` it first prints ``standby`` and waits for a line on
stdin, so that the test can have the next worker's imports done before it
kills the current one.

The one tool with a side effect, ``record``, uses its idempotency key
(`turnfsm.driver.current_tool_call().id`) as a real tool would:

- ATTEMPTS gets one line per invocation, the key (re-runs included);
- EFFECTS gets the key only if it is not there yet (an idempotent write):
  the side effect, which must happen exactly once per call id.

TRACE gets ``+what`` / ``-what`` around every activity, model call, tool
call, compaction pass, store load and store append (and ``=tool KEY`` when
a re-run finds its effect applied), so the test can tell what a kill
interrupted. All three files are written with `os.write` to ``O_APPEND``
descriptors: a SIGKILL cannot lose a write that returned.

The test imports `build_agent` too: for its client (the same agent, by name)
and for the uninterrupted in-process reference run.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread

from tests.persistence import crash_worker as script
from turnfsm import Agent, ContextManager, HeuristicTokenCounter
from turnfsm.context import CompactionContext, CompactionProposal
from turnfsm.driver import Tool, current_tool_call, function_tool
from turnfsm.errors import SessionConflict
from turnfsm.messages import Message
from turnfsm.persistence import Entry, SessionStore
from turnfsm.providers import ModelRequest
from turnfsm.testing import FakeModelClient

NAME = "crash-agent"
"""The agent's name: the workers and the test's client agree on it."""

MODEL_SECONDS = 0.04
TOOL_SECONDS = 0.06
COMPACT_SECONDS = 0.06
STORE_SECONDS = 0.02
"""Slower than in-process: each activity and workflow task costs Temporal's
round trips, and the kills should land inside the effects too, not only
around them (`build_agent`'s `pace` scales them: 0 for the reference)."""


class TracedStore(script.TracedStore):
    """The persistence test's traced store; loads and conflicts are marked too.

    An append that finds the log moved on ends with ``!append``: an
    activity run again finding its entries written (`append_once`). An
    append that committed takes a moment more before it returns, so that
    kills land there too (its activity runs again and finds it written).
    """

    def __init__(self, inner: SessionStore, trace: script.Trace, pace: float) -> None:
        super().__init__(inner, trace)
        self.pace = pace

    async def append(
        self, session_id: str, entries: Sequence[Entry], *, expected_version: int
    ) -> int:
        kinds = ",".join(type(e).__name__ for e in entries)
        self.trace.mark(f"+append {expected_version} {kinds}")
        try:
            version = await self.inner.append(
                session_id, entries, expected_version=expected_version
            )
        except SessionConflict:
            self.trace.mark("!append")
            raise
        await anyio.sleep(STORE_SECONDS * self.pace)
        self.trace.mark(f"-append {version}")
        return version

    async def load(self, session_id: str) -> tuple[Entry, ...]:
        self.trace.mark("+load")
        entries = await self.inner.load(session_id)
        self.trace.mark("-load")
        return entries


class SlowCompactor(script.SlowCompactor):
    """The persistence test's compactor, with this test's pace."""

    def __init__(self, trace: script.Trace, pace: float) -> None:
        super().__init__(trace)
        self.pace = pace

    async def compact(
        self, messages: Sequence[Message], target: int, ctx: CompactionContext
    ) -> CompactionProposal:
        self.trace.mark("+compact")
        await anyio.sleep(COMPACT_SECONDS * self.pace)
        outcome = await self.inner.compact(messages, target, ctx)
        self.trace.mark("-compact")
        return outcome


def _applied(effects: str, key: str) -> bool:
    with open(effects) as f:
        return key in f.read().split()


def record_tool(effects: str, attempts: str, trace: script.Trace, pace: float) -> Tool:
    """The tool with a side effect, keyed by its call's idempotency key."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT
    attempts_fd = os.open(attempts, flags, 0o644)
    effects_fd = os.open(effects, flags, 0o644)

    async def record(key: str) -> str:
        """Apply the side effect of call `key` (append a line to a file, once).

        Args:
            key: The tool call's id.
        """
        call = current_tool_call()
        assert call is not None
        os.write(attempts_fd, f"{call.id}\n".encode())
        trace.mark(f"+tool {call.id}")
        await anyio.sleep(TOOL_SECONDS / 2 * pace)
        if _applied(effects, call.id):
            trace.mark(f"=tool {call.id}")  # applied by an attempt that died
        else:
            os.write(effects_fd, f"{call.id}\n".encode())
        # Still busy after the effect: a kill here loses the result, not the
        # effect, and the call runs again (where the key matters).
        await anyio.sleep(TOOL_SECONDS / 2 * pace)
        trace.mark(f"-tool {call.id}")
        return f"recorded {key}: " + "lorem ipsum dolor " * 25

    tool: Tool = function_tool(record)
    return tool


def build_agent(
    store: SessionStore,
    effects: str,
    attempts: str,
    trace: script.Trace,
    *,
    pace: float = 1.0,
) -> Agent:
    """The agent every worker, the test's client and the reference run use.

    The persistence crash test's script (`tests/persistence/crash_worker.py`:
    its model's answers, system prompt, context manager and limits), with
    `record_tool` for its tool.
    """

    async def handle(request: ModelRequest) -> Message:
        trace.mark("+model")
        await anyio.sleep(MODEL_SECONDS * pace)
        message = script.answer(request.messages)
        trace.mark("-model")
        return message

    manager = ContextManager(
        SlowCompactor(trace, pace),
        context_window=1_000,
        threshold=80,
        counter=HeuristicTokenCounter(),
    )
    return Agent(
        store=TracedStore(store, trace, pace),
        model=FakeModelClient(handle),
        tools=[record_tool(effects, attempts, trace, pace)],
        system_prompt="You are the crash test's scripted agent.",
        context=manager,
        max_turns=20,
        tool_timeout=10.0,
        name=NAME,
    )


def _interceptor(trace: script.Trace) -> Any:
    from temporalio import activity
    from temporalio.worker import (
        ActivityInboundInterceptor,
        ExecuteActivityInput,
        Interceptor,
    )

    class Traced(ActivityInboundInterceptor):
        async def execute_activity(self, input: ExecuteActivityInput) -> Any:
            info = activity.info()
            trace.mark(f"+activity {info.activity_type} {info.attempt}")
            try:
                return await self.next.execute_activity(input)
            finally:
                trace.mark(f"-activity {info.activity_type}")

    class Tracing(Interceptor):
        def intercept_activity(
            self, next: ActivityInboundInterceptor
        ) -> ActivityInboundInterceptor:
            return Traced(next)

    return Tracing()


async def main(argv: Sequence[str]) -> None:
    from temporalio.client import Client

    from turnfsm.persistence import SQLiteStore
    from turnfsm.temporal import create_worker

    standby = argv[:1] == ["--standby"]
    address, queue, store_path, effects, attempts, trace_path = argv[standby:]
    trace = script.Trace(trace_path)
    client = await Client.connect(address)
    agent = build_agent(SQLiteStore(Path(store_path)), effects, attempts, trace)
    worker = create_worker(
        client,
        queue,
        agent,
        sticky_queue_schedule_to_start_timeout=timedelta(seconds=1),
        interceptors=[_interceptor(trace)],
    )
    if standby:
        print("standby", flush=True)
        await anyio.to_thread.run_sync(sys.stdin.readline)
    async with worker:
        trace.mark("ready")
        print("ready", flush=True)
        await anyio.sleep_forever()


if __name__ == "__main__":
    anyio.run(main, sys.argv[1:], backend="asyncio")
