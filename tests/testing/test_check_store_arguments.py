"""`check_store` refuses a bad argument up front, naming it, before any check runs."""

from __future__ import annotations

from typing import Any

import pytest

from turnfsm.errors import ConfigError
from turnfsm.persistence import MemoryStore
from turnfsm.testing import check_store


@pytest.mark.anyio
async def test_a_store_given_for_its_factory_is_shown_the_factory() -> None:
    # It failed with TypeError: 'MemoryStore' object is not callable.
    store = MemoryStore()
    with pytest.raises(ConfigError) as caught:
        await check_store(store)  # type: ignore[arg-type]
    assert (caught.value.field, caught.value.value) == ("factory", store)
    assert "not a store: check_store(lambda: MemoryStore(...))" in str(caught.value)


@pytest.mark.anyio
@pytest.mark.parametrize(
    "factory", [5, None, lambda path: MemoryStore()], ids=["int", "none", "arity"]
)
async def test_a_factory_that_cannot_be_called_bare_is_refused(factory: Any) -> None:
    with pytest.raises(ConfigError) as caught:
        await check_store(factory)
    assert (caught.value.field, caught.value.value) == ("factory", factory)


@pytest.mark.anyio
@pytest.mark.parametrize(
    "damage", [5, "rows", lambda store: None], ids=["int", "str", "arity"]
)
async def test_a_bad_damage_is_refused_before_any_check_runs(damage: Any) -> None:
    # It failed with TypeError ('int' object is not callable) after every
    # other check had run.
    made: list[MemoryStore] = []

    def factory() -> MemoryStore:
        made.append(MemoryStore())
        return made[-1]

    with pytest.raises(ConfigError) as caught:
        await check_store(factory, damage=damage)
    assert (caught.value.field, caught.value.value) == ("damage", damage)
    assert "async def damage(store, session_id)" in str(caught.value)
    assert made == []


@pytest.mark.anyio
async def test_a_class_is_a_factory() -> None:
    await check_store(MemoryStore)
