"""How the reading commands scale with the sessions a store holds.

Writes `N` sessions to a SQLite file (a 1-turn run each; one in every 50 a
lead that gives its task to a sub-agent, whose session is one more), then
times, in this process, what ``turnfsm sessions show`` and ``turnfsm view``
do to find a session's sub-agents (`descendants`) and what ``turnfsm
sessions list`` does to list the newest 100, each on the shipped store and on
the same store seen through the store protocol alone (the baseline: a store
of one's own that neither lists sub-agents' sessions nor says when a session
grew, so every session is read).

    python bench/many_sessions.py           # 5,000 sessions, in a temp dir
    python bench/many_sessions.py 20000     # more

Prints milliseconds and the ratio to the baseline for each.
"""

from __future__ import annotations

import io
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import anyio
import attrs

from turnfsm import Agent
from turnfsm.cli._sessions import _list
from turnfsm.persistence import (
    Entry,
    Session,
    SessionInfo,
    SessionStore,
    SQLiteStore,
    descendants,
)
from turnfsm.providers import ModelRequest
from turnfsm.testing import FakeModelClient, reply, tool_call

LEADS_EVERY = 50
LISTED = 100


class ProtocolOnly:
    """`store` through the `SessionStore` protocol alone (no times, no links)."""

    def __init__(self, store: SQLiteStore) -> None:
        self.store = store

    async def append(
        self, session_id: str, entries: Sequence[Entry], *, expected_version: int
    ) -> int:
        return await self.store.append(
            session_id, entries, expected_version=expected_version
        )

    async def load(self, session_id: str) -> tuple[Entry, ...]:
        return await self.store.load(session_id)

    async def list_sessions(self) -> tuple[SessionInfo, ...]:
        listed = await self.store.list_sessions()
        return tuple(attrs.evolve(info, updated_at=None) for info in listed)


def _lead(request: ModelRequest) -> object:
    if request.messages[-1].tool_results:
        return reply("done")
    return reply("", tool_call("helper", task="look it up"))


async def write(store: SQLiteStore, count: int) -> str:
    """Write `count` sessions; return a lead's id."""
    plain = Agent(model=FakeModelClient(lambda _r: reply("ok")), store=store)
    helper = Agent(model=FakeModelClient(lambda _r: reply("found")))
    lead = Agent(
        model=FakeModelClient(_lead),
        tools=[helper.as_tool(name="helper", description="Look it up")],
        store=store,
    )
    lead_id = ""
    written = 0
    while written < count:
        if written % LEADS_EVERY == 0:
            result = await lead.run("go", session=Session(store=store))
            lead_id = result.session_id
            written += 2
        else:
            await plain.run("hi", session=Session(store=store))
            written += 1
    return lead_id


async def timed(work: Callable[[], Awaitable[object]], repeats: int = 3) -> float:
    """The least of `repeats` runs of `work`, in ms."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        await work()
        best = min(best, time.perf_counter() - start)
    return best * 1000


async def main(count: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "many.db"
        async with SQLiteStore(path) as store:
            start = time.perf_counter()
            lead_id = await write(store, count)
            took = time.perf_counter() - start
            stored = len(await store.list_sessions())
            print(f"{stored} sessions written in {took:.1f} s ({path.name})")
            plain = ProtocolOnly(store)

            def below(on: SessionStore) -> Callable[[], Awaitable[object]]:
                return lambda: descendants(on, lead_id)

            def listing(on: SessionStore) -> Callable[[], Awaitable[object]]:
                return lambda: _list(on, io.StringIO(), LISTED)

            rows = [
                ("a lead's sub-agents (descendants)", below),
                (f"the newest {LISTED} (sessions list)", listing),
            ]
            print(f"{'':38}{'shipped':>12}{'protocol only':>16}{'ratio':>9}")
            for name, make in rows:
                shipped = await timed(make(store))
                baseline = await timed(make(plain), repeats=1)
                print(
                    f"{name:38}{shipped:>9.1f} ms{baseline:>13.1f} ms"
                    f"{shipped / baseline:>8.3f}x"
                )


if __name__ == "__main__":
    anyio.run(main, int(sys.argv[1]) if len(sys.argv) > 1 else 5000)
