"""The conformance suite catches a store that breaks a rule: ghosts, lost text,
repeated compaction keys, damage it does not see, leases two owners hold."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import attrs
import pytest

from turnfsm import serde
from turnfsm.errors import ConfigError, SessionConflict
from turnfsm.persistence import Entry, Lease, MemoryStore, RunOpened, SessionInfo
from turnfsm.testing import check_store

pytestmark = pytest.mark.anyio


@attrs.define
class _Wrapped:
    """A store that passes everything to a `MemoryStore`; subclasses break a rule."""

    inner: MemoryStore = attrs.field(factory=MemoryStore)

    async def append(
        self, session_id: str, entries: Sequence[Entry], *, expected_version: int
    ) -> int:
        return await self.inner.append(
            session_id, entries, expected_version=expected_version
        )

    async def load(self, session_id: str) -> tuple[Entry, ...]:
        return await self.inner.load(session_id)

    async def list_sessions(self) -> tuple[SessionInfo, ...]:
        return await self.inner.list_sessions()


@attrs.define
class _Ghostly(_Wrapped):
    """Creates the session before it checks the version (as MemoryStore did)."""

    made: set[str] = attrs.field(factory=set)

    async def append(
        self, session_id: str, entries: Sequence[Entry], *, expected_version: int
    ) -> int:
        self.made.add(session_id)
        return await super().append(
            session_id, entries, expected_version=expected_version
        )

    async def list_sessions(self) -> tuple[SessionInfo, ...]:
        listed = {info.id: info for info in await super().list_sessions()}
        for session_id in self.made - set(listed):
            listed[session_id] = SessionInfo(id=session_id, version=0)
        return tuple(listed[k] for k in sorted(listed))


@attrs.define
class _Replacing(_Wrapped):
    """Stores text as UTF-8 with errors replaced: a lone surrogate becomes '?'."""

    async def append(
        self, session_id: str, entries: Sequence[Entry], *, expected_version: int
    ) -> int:
        def lossy(entry: Entry) -> Entry:
            text = json.dumps(serde.envelope(entry), ensure_ascii=False)
            text = text.encode("utf-8", "replace").decode()
            return serde.open_envelope(json.loads(text), Entry)  # type: ignore[no-any-return]

        return await super().append(
            session_id, [lossy(e) for e in entries], expected_version=expected_version
        )


@attrs.define
class _KeyBlind(_Wrapped):
    """Never checks compaction keys."""

    logs: dict[str, list[Entry]] = attrs.field(factory=dict)

    async def append(
        self, session_id: str, entries: Sequence[Entry], *, expected_version: int
    ) -> int:
        if not isinstance(session_id, str) or not session_id:
            raise ConfigError("session_id", session_id, "a non-empty string")
        log = self.logs.get(session_id, [])
        if len(log) != expected_version:
            raise SessionConflict(session_id, expected_version, len(log))
        if entries:
            self.logs[session_id] = [*log, *entries]
        return expected_version + len(entries)

    async def load(self, session_id: str) -> tuple[Entry, ...]:
        return tuple(self.logs.get(session_id, ()))

    async def list_sessions(self) -> tuple[SessionInfo, ...]:
        return tuple(
            SessionInfo(id=k, version=len(v)) for k, v in sorted(self.logs.items()) if v
        )


@attrs.define
class _Greedy(_Wrapped):
    """Keeps leases, but hands one to every owner that asks."""

    async def acquire_lease(
        self, session_id: str, owner: str, *, ttl: float, force: bool = False
    ) -> Lease:
        return Lease(session_id=session_id, owner=owner, since=0.0, expires_at=ttl)

    async def renew_lease(self, session_id: str, owner: str, *, ttl: float) -> Lease:
        return await self.acquire_lease(session_id, owner, ttl=ttl)

    async def release_lease(self, session_id: str, owner: str) -> None:
        return None

    async def lease_of(self, session_id: str) -> Lease | None:
        return None


@attrs.define
class _Backwards(_Wrapped):
    """Says each session grew earlier than the one written before it."""

    async def list_sessions(self) -> tuple[SessionInfo, ...]:
        listed = await super().list_sessions()
        return tuple(
            attrs.evolve(info, updated_at=float(n)) for n, info in enumerate(listed)
        )


@attrs.define
class _EveryOpening(_Wrapped):
    """Lists every run that names a parent, not only a session's first."""

    async def list_delegated(self) -> dict[str, RunOpened]:
        found: dict[str, RunOpened] = {}
        for info in await self.list_sessions():
            for entry in await self.load(info.id):
                if isinstance(entry, RunOpened) and entry.parent is not None:
                    found.setdefault(info.id, entry)
        return found


@pytest.mark.parametrize(
    ("store", "check"),
    [
        (_Ghostly, "a refused append left a ghost session"),
        (_Replacing, "odd text: entry 0 came back as RunOpened(run_id='run_0_?'"),
        (_KeyBlind, "duplicate key: an append repeating a compaction key"),
        (_Greedy, "leases (acquire): 'owner-b' took a live lease"),
        (_EveryOpening, "list_delegated: got {'s_child \\udcff': RunOpened("),
        (_Backwards, "s_a, written after s_b, is listed as updated at 0.0, before"),
    ],
    ids=[
        "ghosts",
        "lost surrogates",
        "repeated keys",
        "greedy leases",
        "later runs",
        "times backwards",
    ],
)
async def test_the_suite_catches_a_store_that_breaks_a_rule(
    store: Any, check: str
) -> None:
    with pytest.raises(AssertionError) as caught:
        await check_store(store)
    assert check in str(caught.value)


async def test_the_suite_catches_a_store_that_does_not_see_damage() -> None:
    async def damage(store: MemoryStore, session_id: str) -> None:
        return None  # whatever broke, the store reads on as if nothing had

    with pytest.raises(AssertionError, match="damaged session loaded without"):
        await check_store(MemoryStore, damage=damage)


async def test_shipped_stores_leases_pass_the_suite_as_leasing_stores() -> None:
    # MemoryStore is a LeasingStore: check_store runs the lease checks on it.
    await check_store(MemoryStore)
