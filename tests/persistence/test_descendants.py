"""`descendants`: a session's sub-agent sessions, each before its own children."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from tests.delegation import ALONE, LEAD, delegating_store
from turnfsm.errors import ConfigError
from turnfsm.persistence import SQLiteStore, child_sessions, descendants, parent_of


def tree(path: Path, session_id: str, depth: int | None) -> list[tuple[str, str]]:
    """``(call id, parent session)`` of each descendant, in the order given."""

    async def read() -> list[tuple[str, str]]:
        store = SQLiteStore(path)
        try:
            found = await descendants(store, session_id, depth=depth)
            links = [parent_of(s) for s in found]
            return [(k.call_id, k.session_id) for k in links if k is not None]
        finally:
            await store.aclose()

    return anyio.run(read)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return delegating_store(tmp_path_factory.mktemp("store") / "s.db")


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
