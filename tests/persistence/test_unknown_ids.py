"""Reading an unknown session or run is a typed error; a run on a new id is not.

Each row: the typed error naming the id (and, on the command line, the store
and the closest stored ids, in one line, exit status 2); nothing written; the
stored sessions still list and load.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.persistence.refusal_world import (
    GOOD,
    Capture,
    World,
    build_world,
    driver_of,
    in_store,
    one_line,
    still_fine,
)
from turnfsm import Agent
from turnfsm.cli import main
from turnfsm.driver import rebuild, replay
from turnfsm.errors import (
    ConfigError,
    SessionNotFound,
)
from turnfsm.persistence import (
    MemoryStore,
    Session,
    SQLiteStore,
)
from turnfsm.testing import ScriptedModel


@pytest.fixture
def world(tmp_path: Path) -> World:
    return build_world(tmp_path)


async def _load_unknown(store: SQLiteStore) -> None:
    await Session.load(store, "ses_goot")


async def _resume_unknown(store: SQLiteStore) -> None:
    await Agent(model=ScriptedModel.of("x"), store=store).resume("ses_goot", "run_1")


async def _abandon_unknown(store: SQLiteStore) -> None:
    await Agent(model=ScriptedModel.of("x"), store=store).abandon("ses_goot", "run_1")


@pytest.mark.parametrize(
    "read",
    [_load_unknown, _resume_unknown, _abandon_unknown],
    ids=["Session.load", "Agent.resume", "Agent.abandon"],
)
def test_reading_an_unknown_session_is_a_typed_error(
    world: World, capsys: Capture, read: Callable[[SQLiteStore], Any]
) -> None:
    with pytest.raises(SessionNotFound) as raised:
        in_store(world, read)
    assert raised.value.session_id == "ses_goot"
    assert isinstance(raised.value, LookupError)
    assert "no session 'ses_goot'" in str(raised.value)
    still_fine(world, capsys)


@pytest.mark.parametrize(
    "args",
    [
        ["sessions", "show", "ses_goot"],
        ["sessions", "export", "ses_goot"],
        ["sessions", "export", "ses_goot", "--format", "json"],
        ["sessions", "reset-breaker", "ses_goot"],
        ["sessions", "rm", "ses_goot", "--yes"],
        ["replay", "--session", "ses_goot"],
    ],
    ids=lambda a: " ".join(a[:2]) + (" json" if "json" in a else ""),
)
def test_the_cli_names_an_unknown_session_and_the_closest_ones(
    world: World, capsys: Capture, args: list[str]
) -> None:
    capsys.readouterr()
    assert main([*args, *world.store]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    line = one_line(captured.err, "turnfsm ")
    assert f"no session 'ses_goot' in {world.db} (did you mean 'ses_good'?)" in line
    still_fine(world, capsys)


def test_a_shortened_id_names_the_session_it_begins(
    tmp_path: Path, capsys: Capture
) -> None:
    # A shortened id (as git's are, or one cut at a narrow terminal's edge)
    # was too far from the whole one to be named: "no session", no hint.
    db = tmp_path / "s.db"

    async def two_sessions() -> list[str]:
        async with SQLiteStore(db) as store:
            agent = Agent(model=ScriptedModel.of("a", "b"), store=store)
            first = await agent.run("one")
            second = await agent.run("two", session=await Session.open(store, "ses_x"))
            return [first.session_id, second.session_id]

    generated, _ = anyio.run(two_sessions)
    for asked in (generated[:12], generated[4:12], generated[4:]):
        assert main(["sessions", "show", asked, "--store", str(db)]) == 2
        line = one_line(capsys.readouterr().err, "turnfsm ")
        assert f"no session '{asked}' in {db} (did you mean '{generated}'?)" in line
    # Too short to say which: no id is named for three characters.
    assert main(["sessions", "show", generated[4:7], "--store", str(db)]) == 2
    assert "did you mean" not in capsys.readouterr().err


def test_a_run_on_a_new_session_id_still_creates_it(tmp_path: Path) -> None:
    async def go() -> tuple[int, int, int]:
        store = MemoryStore()
        fresh = await Session.open(store, "ses_new")  # reads nothing, writes nothing
        assert await store.list_sessions() == ()
        await driver_of("one").run("hi", session=fresh)
        agent = Agent(model=ScriptedModel.of("two"), store=store)
        result = await agent.run("hello")
        reopened = await Session.load(store, "ses_new")
        again = await Session.open(store, "ses_new")
        return (
            reopened.version,
            again.version,
            (await Session.load(store, result.session_id)).version,
        )

    reopened, again, agents = anyio.run(go)
    assert reopened == again > 0
    assert agents > 0


@pytest.mark.parametrize("how", ["replay", "rebuild"])
def test_an_unknown_run_in_replay_is_a_config_error_naming_it(
    world: World, how: str
) -> None:
    async def go() -> None:
        async with SQLiteStore(world.db) as store:
            session = await Session.load(store, GOOD)
        call = replay if how == "replay" else rebuild
        call(world.spec, session, world.runs[0][:-1] + "x")

    with pytest.raises(ConfigError) as raised:
        anyio.run(go)
    assert raised.value.field == "run_id"
    assert raised.value.value == world.runs[0][:-1] + "x"
    assert f"did you mean {world.runs[0]!r}" in str(raised.value)


def test_the_cli_names_an_unknown_run(world: World, capsys: Capture) -> None:
    capsys.readouterr()
    args = ["replay", "--session", GOOD, "--run", "run_nope", *world.store]
    assert main(args) == 2
    assert "run_nope" in one_line(capsys.readouterr().err, "turnfsm replay: ")


def test_a_runs_id_given_as_the_session_is_named_a_runs_id(
    world: World, capsys: Capture
) -> None:
    # `run run_... paused` and `session ses_...` are printed together: the
    # run's id, or the two ids swapped in resume(), read as a session's.
    run_id = world.runs[0]

    async def swapped(store: SQLiteStore) -> None:
        await Agent(model=ScriptedModel.of("x"), store=store).resume(run_id, GOOD)

    with pytest.raises(SessionNotFound) as raised:
        in_store(world, swapped)
    assert str(raised.value) == (
        f"no session {run_id!r} in the store ({run_id!r} is a run's id: give "
        "its session's id, ses_...); check the id against the stored sessions "
        "(a session is created by its first run, never by reading it)"
    )
    capsys.readouterr()
    assert main(["sessions", "show", run_id, *world.store]) == 2
    line = one_line(capsys.readouterr().err, "turnfsm sessions show: ")
    assert f"in {world.db} ({run_id!r} is a run's id: give its session's" in line
    still_fine(world, capsys)
