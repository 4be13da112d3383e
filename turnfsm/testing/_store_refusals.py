"""The store conformance suite's refused appends: stale, racing, bad ids, repeats."""

from __future__ import annotations

import anyio

from turnfsm.errors import ConfigError, DuplicateRecord, SessionConflict
from turnfsm.persistence import SessionStore
from turnfsm.testing._store_samples import _same, sample_entries

__all__ = ["_bad_id", "_conflict", "_duplicate_key", "_no_ghosts", "_race"]


async def _conflict(store: SessionStore) -> None:
    entries = sample_entries()
    await store.append("s_conflict", entries[:2], expected_version=0)
    for stale in (0, 1, 3):
        try:
            await store.append("s_conflict", entries[2:], expected_version=stale)
        except SessionConflict as exc:
            if (exc.expected, exc.actual) != (stale, 2):
                raise AssertionError(f"conflict: wrong versions in {exc!r}") from None
        else:
            raise AssertionError(
                f"conflict: an append expecting version {stale} of a log at 2 "
                "was accepted"
            )
    _same(await store.load("s_conflict"), entries[:2], "conflict (nothing written)")


async def _race(store: SessionStore) -> None:
    entries = sample_entries()
    wins: list[int] = []
    losses: list[SessionConflict] = []

    async def writer(n: int) -> None:
        try:
            await store.append("s_race", entries[n : n + 1], expected_version=0)
            wins.append(n)
        except SessionConflict as exc:
            losses.append(exc)

    async with anyio.create_task_group() as group:
        for n in range(4):
            group.start_soon(writer, n)
    if len(wins) != 1 or len(losses) != 3:
        raise AssertionError(
            f"race: {len(wins)} of 4 writers expecting version 0 succeeded"
        )
    _same(await store.load("s_race"), entries[wins[0] : wins[0] + 1], "race")


async def _bad_id(store: SessionStore) -> None:
    for bad in ("", 5, None):
        try:
            await store.append(bad, sample_entries()[:1], expected_version=0)  # type: ignore[arg-type]
        except ConfigError:
            continue
        raise AssertionError(f"a session id of {bad!r} was accepted")


async def _duplicate_key(store: SessionStore) -> None:
    entries = sample_entries()
    await store.append("s_keys", entries, expected_version=0)
    again = sample_entries("run_2")
    for batch, version in (((*again, *entries), len(entries)), ((*again, *again), 0)):
        session = "s_keys" if version else "s_keys_new"
        try:
            await store.append(session, batch, expected_version=version)
        except DuplicateRecord as exc:
            if exc.key not in ("run_1:3", "run_2:3"):
                raise AssertionError(f"duplicate key: wrong key in {exc!r}") from None
        else:
            raise AssertionError(
                "duplicate key: an append repeating a compaction key was accepted"
            )
    _same(await store.load("s_keys"), entries, "duplicate key (nothing written)")
    await _no_trace(store, "s_keys_new", "duplicate key")


async def _no_trace(store: SessionStore, session_id: str, check: str) -> None:
    """A session a refused append would have created must not exist."""
    if await store.load(session_id) != ():
        raise AssertionError(f"{check}: a refused append left entries behind")
    listed = [info.id for info in await store.list_sessions()]
    if session_id in listed:
        raise AssertionError(
            f"{check}: a refused append left a ghost session {session_id!r} "
            f"(listed: {listed})"
        )
    entries = sample_entries("run_after")
    if await store.append(session_id, entries[:1], expected_version=0) != 1:
        raise AssertionError(f"{check}: a first append after a refused one failed")


async def _no_ghosts(store: SessionStore) -> None:
    entries = sample_entries()
    for stale in (1, 5):
        try:
            await store.append("s_ghost", entries[:2], expected_version=stale)
        except SessionConflict as exc:
            if (exc.expected, exc.actual) != (stale, 0):
                raise AssertionError(f"ghost: wrong versions in {exc!r}") from None
        else:
            raise AssertionError(
                f"ghost: an append expecting version {stale} of a new session "
                "was accepted"
            )
    if await store.append("s_empty", (), expected_version=0) != 0:
        raise AssertionError("ghost: an empty first append must return version 0")
    if "s_empty" in [info.id for info in await store.list_sessions()]:
        raise AssertionError("ghost: an empty append created a listed session")
    await _no_trace(store, "s_ghost", "ghost")
