"""`descendants`: a session's sub-agent sessions, each before its own children."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from tests.delegation import ALONE, LEAD, delegating_store
from tests.helpers import ProtocolStore
from turnfsm.errors import ConfigError
from turnfsm.persistence import (
    LinkingStore,
    MemoryStore,
    SessionStore,
    SQLiteStore,
    child_sessions,
    descendants,
    parent_of,
)


class Plain(ProtocolStore):
    """A shipped store seen through the protocol alone (it lists no sub-agents)."""

    inner: SQLiteStore


class Linking(Plain):
    """`Plain`, with the shipped store's `list_delegated`."""

    async def list_delegated(self) -> dict[str, object]:
        return dict(await self.inner.list_delegated())


def tree(
    path: Path, session_id: str, depth: int | None, *, linking: bool = True
) -> list[tuple[str, str]]:
    """``(call id, parent session)`` of each descendant, in the order given."""

    async def read() -> list[tuple[str, str]]:
        inner = SQLiteStore(path)
        store: SessionStore = Linking(inner) if linking else Plain(inner)
        try:
            found = await descendants(store, session_id, depth=depth)
            links = [parent_of(s) for s in found]
            return [(k.call_id, k.session_id) for k in links if k is not None]
        finally:
            await inner.aclose()

    return anyio.run(read)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return delegating_store(tmp_path_factory.mktemp("store") / "s.db")


def test_every_shipped_store_lists_sub_agents_sessions_at_once(store: Path) -> None:
    sqlite = SQLiteStore(store)
    try:
        assert isinstance(MemoryStore(), LinkingStore)
        assert isinstance(sqlite, LinkingStore)
        assert not isinstance(Plain(sqlite), LinkingStore)
    finally:
        anyio.run(sqlite.aclose)


def test_a_store_that_lists_them_is_read_only_below_the_session(store: Path) -> None:
    # Of a store that lists sub-agents' sessions, only the sessions in the
    # tree are read; of any other, every session (and the same tree found).
    async def loads(linking: bool, session_id: str) -> list[str]:
        inner = SQLiteStore(store)
        wrapped = Linking(inner) if linking else Plain(inner)
        try:
            await descendants(wrapped, session_id)
            return wrapped.loaded
        finally:
            await inner.aclose()

    async def count() -> int:
        async with SQLiteStore(store) as sqlite:
            return len(await sqlite.list_sessions())

    everything = anyio.run(count)
    assert len(anyio.run(loads, False, ALONE)) == everything - 1  # all but it
    assert anyio.run(loads, True, ALONE) == []
    assert len(anyio.run(loads, True, LEAD)) == 4  # the lead and its three
    for session_id in (LEAD, ALONE):
        for depth in (None, 1):
            assert tree(store, session_id, depth) == tree(
                store, session_id, depth, linking=False
            )


def test_each_session_comes_before_its_children_in_call_order(store: Path) -> None:
    found = tree(store, LEAD, None)

    assert [call for call, _ in found] == ["call_mid", "call_leaf", "call_solo"]
    assert found[1][1] not in (LEAD, ALONE)  # the grandchild's parent: mid
    assert found[0][1] == found[2][1] == LEAD


def test_depth_one_is_the_children(store: Path) -> None:
    async def children() -> list[str]:
        sessions = SQLiteStore(store)
        try:
            return [s.id for s in await child_sessions(sessions, LEAD)]
        finally:
            await sessions.aclose()

    assert [call for call, _ in tree(store, LEAD, 1)] == ["call_mid", "call_solo"]
    assert len(anyio.run(children)) == 2


def test_a_session_that_delegated_nothing_has_none(store: Path) -> None:
    assert tree(store, ALONE, None) == []


def test_a_depth_below_one_is_refused(store: Path) -> None:
    with pytest.raises(ConfigError, match="depth"):
        tree(store, LEAD, 0)
