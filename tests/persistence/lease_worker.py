"""The lease tests' worker: one process that takes, or holds, a session's lease.

    python lease_worker.py race STORE SESSION OWNER GATE COUNT
    python lease_worker.py hold STORE SESSION OWNER TTL
    python lease_worker.py run STORE SESSION

STORE is a file path (SQLite) or a ``postgresql://`` URL / conninfo prefixed
by ``postgres:``.

``race`` waits until COUNT workers have touched a file in the directory
GATE, then acquires the lease once and prints one JSON line: ``{"won":
true}`` or ``{"won": false, "owner": ..., "alive": ...}`` from the
`SessionBusy` it got.

``hold`` acquires the lease with a TTL of TTL seconds, prints ``held``, and
renews it every TTL / 5 seconds until it is killed: a live owner, whose
lease expires once its process is gone.

``run`` starts a new agent run on SESSION and prints ``done``, or the name
of the error that refused it.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread

from turnfsm.errors import SessionBusy
from turnfsm.persistence import open_store


def store_of(spec: str) -> Any:
    """Return the store `spec` names (``postgres:CONNINFO`` or a file path)."""
    if spec.startswith("postgres:"):
        from turnfsm.persistence.postgres import PostgresStore

        return PostgresStore(spec.removeprefix("postgres:"))
    return open_store(spec)


async def race(spec: str, session: str, owner: str, gate: str, count: int) -> None:
    store = store_of(spec)
    async with store:  # connected before the start, like the others
        await anyio.to_thread.run_sync(_wait_at_gate, gate, owner, count)
        try:
            await store.acquire_lease(session, owner, ttl=60)
            print(json.dumps({"won": True}), flush=True)
        except SessionBusy as busy:
            found = {"won": False, "owner": busy.owner, "alive": busy.alive}
            print(json.dumps(found), flush=True)


def _wait_at_gate(gate: str, owner: str, count: int) -> None:
    """Say this worker is ready, then wait until all `count` are."""
    Path(gate, owner).touch()
    while len(list(Path(gate).iterdir())) < count:
        time.sleep(0.002)


async def hold(spec: str, session: str, owner: str, ttl: float) -> None:
    store = store_of(spec)
    async with store:
        await store.acquire_lease(session, owner, ttl=ttl)
        print("held", flush=True)
        while True:
            await anyio.sleep(ttl / 5)
            await store.renew_lease(session, owner, ttl=ttl)


async def run(spec: str, session_id: str) -> None:
    from turnfsm import Agent
    from turnfsm.errors import TurnFSMError
    from turnfsm.testing import ScriptedModel

    async with store_of(spec) as store:
        agent = Agent(model=ScriptedModel.of("hello"), store=store)
        try:
            result = await agent.run("hi", session=await agent.open_session(session_id))
            print(result.outcome, flush=True)
        except TurnFSMError as exc:
            print(type(exc).__name__, flush=True)


def main(argv: list[str]) -> None:
    """Run the worker `argv` names (see the module docstring)."""
    action, spec, session, *more = argv
    owner, *rest = more or [""]
    if action == "race":
        anyio.run(race, spec, session, owner, rest[0], int(rest[1]))
    elif action == "run":
        anyio.run(run, spec, session)
    else:
        anyio.run(hold, spec, session, owner, float(rest[0]))


if __name__ == "__main__":
    main(sys.argv[1:])
