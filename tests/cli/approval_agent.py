"""Agents for the answer commands' tests (`--agent tests.cli.approval_agent:...`).

`careful` asks to delete two files on the approval machine, then reports
what the tools said; each tool run is kept in `DELETED`. `manager` gives
that work to `careful`, as a sub-agent. `wiping` removes its own store's
files in a tool.
"""

from __future__ import annotations

import sys
from pathlib import Path

import anyio

from turnfsm import Agent, approval_machine, machines_dir
from turnfsm.core import MachineSpec
from turnfsm.messages import Message
from turnfsm.persistence.sqlite import SQLiteStore
from turnfsm.providers import ModelRequest
from turnfsm.testing import FakeModelClient, reply, tool_call

DELETED: list[str] = []


def delete_file(path: str) -> str:
    """Delete a file.

    Args:
        path: the file to delete.
    """
    DELETED.append(path)
    return f"deleted {path}"


def _plan(request: ModelRequest) -> Message:
    results = [p.content for m in request.messages for p in m.tool_results]
    if not results:
        return reply(
            "",
            tool_call("delete_file", "c1", path="/tmp/cache.db"),
            tool_call("delete_file", "c2", path="/etc/hosts"),
        )
    return reply("Report: " + "; ".join(results))


def careful() -> Agent:
    """The approval agent (a fresh one per call)."""
    return Agent(
        model=FakeModelClient(_plan), tools=[delete_file], machine=approval_machine()
    )


def signalled() -> Agent:
    """`careful` on a machine whose pause only a signal (``go_on``) answers."""
    text = (machines_dir() / "approval.toml").read_text()
    text = text.replace(
        'terminal = ["done", "failed"]\n',
        'terminal = ["done", "failed"]\nsignals = ["go_on"]\n',
    )
    text = text.replace(
        'trigger = "tool_calls_reviewed"\nsource = "await_approval"',
        'trigger = "go_on"\nsource = "await_approval"',
    )
    machine = MachineSpec.from_toml(text.replace('actions = ["record_review"]', ""))
    return Agent(model=FakeModelClient(_plan), tools=[delete_file], machine=machine)


def needs_a_name(name: str) -> Agent:
    """Not a factory: it takes an argument."""
    raise AssertionError(name)


not_an_agent = 42


def makes_no_agent() -> str:
    """A factory that makes something else than an agent."""
    return "an agent"


async def makes_an_agent_later() -> Agent:
    """An async factory: the command line calls its factories, it awaits none."""
    return Agent(model=FakeModelClient(_plan), tools=[delete_file])


def _delegate(request: ModelRequest) -> Message:
    last = request.messages[-1]
    if last.tool_results:
        return reply(f"The cleaner said: {last.tool_results[0].content}")
    return reply("", tool_call("cleaner", "w1", task="delete the two files"))


def manager() -> Agent:
    """Gives the clean-up to `careful`, a sub-agent that asks before deleting."""
    cleaner = careful().as_tool(name="cleaner", description="Deletes files, asking.")
    return Agent(model=FakeModelClient(_delegate), tools=[cleaner])


def _delegate_twice(request: ModelRequest) -> Message:
    last = request.messages[-1]
    if last.tool_results:
        results = [p.content for m in request.messages for p in m.tool_results]
        return reply("The cleaners said: " + " | ".join(results))
    return reply(
        "",
        tool_call("cleaner", "w1", task="delete the two files"),
        tool_call("cleaner", "w2", task="delete the two files again"),
    )


def two_cleaners() -> Agent:
    """Gives the clean-up to `careful` twice, in one batch: both pause."""
    cleaner = careful().as_tool(name="cleaner", description="Deletes files, asking.")
    return Agent(model=FakeModelClient(_delegate_twice), tools=[cleaner])


def _broken(request: ModelRequest) -> Message:
    raise RuntimeError("the client's own bug")


def broken() -> Agent:
    """A model client of one's own that raises: the run crashes."""
    return Agent(model=FakeModelClient(_broken), tools=[delete_file])


def careful_then_broken() -> Agent:
    """`careful`'s tools and machine, with `broken`'s model: it crashes going on."""
    return Agent(
        model=FakeModelClient(_broken), tools=[delete_file], machine=approval_machine()
    )


STORE_FILES: list[Path] = []
"""The store files `wipe_store` removes."""


def wipe_store() -> str:
    """Remove the store's files, as a disk cleaner might."""
    for path in STORE_FILES:
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
    return "wiped"


def _wipe(request: ModelRequest) -> Message:
    if request.messages[-1].tool_results:
        return reply("wiped it")
    return reply("", tool_call("wipe_store", "c1"))


def wiping() -> Agent:
    """Calls `wipe_store`, then answers."""
    return Agent(model=FakeModelClient(_wipe), tools=[wipe_store])


async def take_over() -> str:
    """Take the session over from another process, and write to it first."""
    async with SQLiteStore(STORE_FILES[0]) as store:
        (info,) = await store.list_sessions()
        await store.acquire_lease(info.id, "elsewhere:1:x", ttl=30, force=True)
        entries = await store.load(info.id)
        await store.append(info.id, [entries[-1]], expected_version=len(entries))
    return "taken"


def _take(request: ModelRequest) -> Message:
    if request.messages[-1].tool_results:
        return reply("took it")
    return reply("", tool_call("take_over", "c1"))


def taken_over() -> Agent:
    """Calls `take_over`, which hands the session to another process."""
    return Agent(model=FakeModelClient(_take), tools=[take_over])


async def remove_session() -> str:
    """Delete the session from the store under the run (``sessions rm --force``)."""
    async with SQLiteStore(STORE_FILES[0]) as store:
        (info,) = await store.list_sessions()
        await store.delete_session(info.id)
    return "removed"


def _remove(request: ModelRequest) -> Message:
    if request.messages[-1].tool_results:
        return reply("removed it")
    return reply("", tool_call("remove_session", "c1"))


def removing() -> Agent:
    """Calls `remove_session`, which deletes the run's session under it."""
    return Agent(model=FakeModelClient(_remove), tools=[remove_session])


OWN_STORE: list[Path] = []
"""The store file `careful_in_its_store` keeps its sessions in (a test sets it)."""


def careful_in_its_store() -> Agent:
    """`careful`, keeping its sessions in a store of its own (`OWN_STORE`)."""
    return Agent(
        model=FakeModelClient(_plan),
        tools=[delete_file],
        machine=approval_machine(),
        store=str(OWN_STORE[0]),
    )


TAKEN_AFTER: list[float] = [0.0]
"""Seconds the taking tools wait after the take-over (a test sets it)."""

LEASE_TTL: list[float] = [30.0]
"""The lease the taken agents' runs hold (a test sets it: renewals every third)."""


async def take_over_and_wait() -> str:
    """`take_over`, then wait `TAKEN_AFTER` (a lease renewal may land in it)."""
    await take_over()
    await anyio.sleep(TAKEN_AFTER[0])
    return "taken"


async def abandon_it() -> str:
    """Abandon the run with force: ``turnfsm abandon --force`` in another process."""
    async with SQLiteStore(OWN_STORE[0]) as store:
        (info,) = await store.list_sessions()
    argv = ["abandon", info.id, "--store", str(OWN_STORE[0]), "--force"]
    # Shielded: the run learns of the takeover at its next renewal, maybe
    # before the other process has written the abandon, and its cancel of
    # this call would kill that process half-way (on a busy machine it did).
    with anyio.CancelScope(shield=True):
        done = await anyio.run_process(
            [sys.executable, "-m", "turnfsm", *argv, "--reason", "took over"]
        )
    assert done.returncode == 0, done
    await anyio.sleep(TAKEN_AFTER[0])
    return "abandoned"


def _call(name: str) -> FakeModelClient:
    def plan(request: ModelRequest) -> Message:
        if request.messages[-1].tool_results:
            return reply("went on")
        return reply("", tool_call(name, "c1"))

    return FakeModelClient(plan)


def taken_over_in_its_store() -> Agent:
    """Calls `take_over_and_wait`; keeps its sessions in `OWN_STORE`."""
    return Agent(
        model=_call("take_over_and_wait"),
        tools=[take_over_and_wait],
        store=str(OWN_STORE[0]),
        lease_ttl=LEASE_TTL[0],
    )


def abandoned_in_its_store() -> Agent:
    """Calls `abandon_it`; keeps its sessions in `OWN_STORE`."""
    return Agent(
        model=_call("abandon_it"),
        tools=[abandon_it],
        store=str(OWN_STORE[0]),
        lease_ttl=LEASE_TTL[0],
    )
