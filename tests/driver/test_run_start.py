"""What a run holds from its start to its end, and lets go of however it ends.

The session (claimed by one run at a time), an in-memory session across its
views (one run of the process at a time), a `RunControl` (one run at a
time), the link to a calling run: each is taken when a run starts and given
back when it ends, done, failed or crashed.
"""

from __future__ import annotations

import re

import anyio
import attrs
import pytest

from turnfsm.driver import BUILTIN_EFFECTS, Driver, EffectSettings, RunControl
from turnfsm.driver._subagents import opening_link
from turnfsm.errors import ConfigError, SessionBusy
from turnfsm.persistence import MemoryStore, Session, new_id
from turnfsm.providers import ModelRequest, ModelResponse
from turnfsm.testing import ScriptedModel, reply

pytestmark = pytest.mark.anyio


class Held:
    """A model that answers once `release` is set; `called` says it was asked."""

    def __init__(self) -> None:
        self.called = anyio.Event()
        self.release = anyio.Event()

    async def complete(self, request: ModelRequest) -> ModelResponse:
        self.called.set()
        await self.release.wait()
        return ModelResponse(message=reply("held answer"))


class Broken:
    """A model with a bug: the run crashes on it."""

    async def complete(self, request: ModelRequest) -> ModelResponse:
        raise RuntimeError("a bug")


async def test_a_session_runs_one_run_at_a_time_and_is_free_once_it_ends() -> None:
    held = Held()
    session = Session()
    results = []

    async def first() -> None:
        results.append(await Driver(model=held).run("one", session=session))

    async with anyio.create_task_group() as tg:
        tg.start_soon(first)
        await held.called.wait()
        with pytest.raises(SessionBusy):
            await Driver(model=ScriptedModel.of("no")).run("two", session=session)
        held.release.set()
    assert results[0].ok
    later = await Driver(model=ScriptedModel.of("yes")).run("three", session=session)
    assert later.ok
    assert [m.text for m in session.history] == ["one", "held answer", "three", "yes"]


async def test_a_session_is_free_again_after_a_run_that_crashed() -> None:
    session = Session()
    with pytest.raises(RuntimeError, match="a bug"):
        await Driver(model=Broken()).run("one", session=session)
    assert session.runs[-1].outcome == "failed"
    again = await Driver(model=ScriptedModel.of("ok")).run("two", session=session)
    assert again.ok


async def test_two_views_of_an_in_memory_session_run_one_run_at_a_time() -> None:
    store = MemoryStore()
    held = Held()
    first_view = Session("s1", store=store)
    other_view = Session("s1", store=store)

    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: Driver(model=held).run("one", session=first_view))
        await held.called.wait()
        with pytest.raises(SessionBusy):
            await Driver(model=ScriptedModel.of("no")).run("two", session=other_view)
        held.release.set()
    # Free again, through a fresh view; after a crash too.
    fresh = await Session.open(store, "s1")
    with pytest.raises(RuntimeError):
        await Driver(model=Broken()).run("two", session=fresh)
    fresh = await Session.open(store, "s1")
    done = await Driver(model=ScriptedModel.of("ok")).run("three", session=fresh)
    assert done.ok


async def test_a_control_steers_one_run_at_a_time_and_is_free_once_it_ends() -> None:
    held = Held()
    control = RunControl()

    async with anyio.create_task_group() as tg:
        tg.start_soon(
            lambda: Driver(model=held).run("one", session=Session(), control=control)
        )
        await held.called.wait()
        with pytest.raises(ConfigError, match="in use by run"):
            await Driver(model=ScriptedModel.of("no")).run(
                "two", session=Session(), control=control
            )
        held.release.set()
    with pytest.raises(RuntimeError):
        await Driver(model=Broken()).run("three", session=Session(), control=control)
    done = await Driver(model=ScriptedModel.of("ok")).run(
        "four", session=Session(), control=control
    )
    assert done.ok


async def test_a_run_leaves_no_link_to_a_caller_behind() -> None:
    assert opening_link() is None
    await Driver(model=ScriptedModel.of("ok")).run("one")
    with pytest.raises(RuntimeError):
        await Driver(model=Broken()).run("two")
    assert opening_link() is None


def test_new_ids_are_the_prefix_and_twenty_random_hex_digits() -> None:
    ids = {new_id("run") for _ in range(1000)}
    assert len(ids) == 1000
    assert all(re.fullmatch("run_[0-9a-f]{20}", i) for i in ids)


def test_the_users_own_effects_follow_the_effects_they_are_made_of() -> None:
    async def mine(ctx: object, decision: object) -> object:
        raise AssertionError("not run")

    settings = Driver(model=ScriptedModel.of("x")).effect_settings
    assert settings._own_effects == frozenset()
    replaced = attrs.evolve(settings, effects={**BUILTIN_EFFECTS, "call_llm": mine})
    assert replaced._own_effects == {"call_llm"}
    assert attrs.evolve(replaced, effects=BUILTIN_EFFECTS)._own_effects == frozenset()
    assert isinstance(replaced, EffectSettings)
