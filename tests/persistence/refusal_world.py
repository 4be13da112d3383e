"""The world the refusal tests share: a store of two sessions and a good log.

`tests/persistence/test_unknown_ids.py`, `test_import_refusals.py` and
`test_replay_refusals.py` each give a table of refusals; after each row,
`still_fine` checks that nothing was written and that the stored sessions
still list and load.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import attrs
import pytest

from tests.helpers import restamp
from turnfsm.cli import main
from turnfsm.core import MachineSpec
from turnfsm.driver import Driver
from turnfsm.messages import Message
from turnfsm.persistence import (
    Session,
    SQLiteStore,
    session_lines,
)
from turnfsm.testing import ScriptedModel, reply, tool_call

Capture = pytest.CaptureFixture[str]

GOOD, OTHER = "ses_good", "ses_other"


def read(name: str) -> str:
    """Read a file."""
    return f"contents of {name}"


def driver_of(*replies: Message | str) -> Driver:
    return Driver(model=ScriptedModel.of(*replies), tools=[read])


@attrs.frozen
class World:
    """A store with two sessions, and the exported log of the first.

    The log of `GOOD`, line by line (1 is the header):
    2 RunOpened (run 1), 3-4 events #0-#1, 5 TurnRecord, 6 event #2 (a tool
    call), 7-8 events #3-#4, 9 TurnRecord, 10 event #5 (the answer),
    11 Committed, 12 RunEnded; 13 RunOpened (run 2), 14-15 events #0-#1,
    16 TurnRecord, 17 event #2 (the answer), 18 Committed, 19 RunEnded.
    """

    db: Path
    lines: tuple[str, ...]
    runs: tuple[str, ...]
    listed: tuple[tuple[str, int], ...]
    spec: MachineSpec

    @property
    def store(self) -> list[str]:
        return ["--store", str(self.db)]


def build_world(tmp_path: Path) -> World:
    db = tmp_path / "s.db"

    async def build() -> World:
        async with SQLiteStore(db) as store:
            good = Session(GOOD, store=store)
            driver = driver_of(
                reply("", tool_call("read", "c1", name="a.txt")),
                "read it",
                "you are welcome",
            )
            await driver.run("read a.txt", session=good)
            await driver.run("thanks", session=good)
            await driver_of("hi").run("hello", session=Session(OTHER, store=store))
            listed = tuple((i.id, i.version) for i in await store.list_sessions())
            return World(
                db=db,
                lines=tuple(session_lines(good)),
                runs=tuple(r.run_id for r in good.runs),
                listed=listed,
                spec=driver.machine,
            )

    built = anyio.run(build)
    assert len(built.lines) == 20
    assert [i for i, _ in built.listed] == [GOOD, OTHER]
    return built


def still_fine(world: World, capsys: Capture) -> None:
    """Nothing was written, and every stored session still lists and loads."""

    async def read_all() -> tuple[tuple[str, int], ...]:
        async with SQLiteStore(world.db) as store:
            listed = tuple((i.id, i.version) for i in await store.list_sessions())
            for session_id, version in listed:
                assert (await Session.load(store, session_id)).version == version
            return listed

    assert anyio.run(read_all) == world.listed
    capsys.readouterr()
    assert main(["sessions", "list", *world.store]) == 0
    out = capsys.readouterr().out
    assert GOOD in out
    assert OTHER in out
    assert "2 session(s)" in out


def one_line(text: str, prefix: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    assert lines[0].startswith(prefix), text
    assert "Traceback" not in text
    return lines[0]


def in_store(world: World, read: Callable[[SQLiteStore], Any]) -> Any:
    async def go() -> Any:
        async with SQLiteStore(world.db) as store:
            return await read(store)

    return anyio.run(go)


Edit = Callable[[list[str]], list[str]]
"""A change to a log's lines (1 is the header)."""


def edit_line(number: int, change: Callable[[dict[str, Any]], object]) -> Edit:
    """Edit line `number` as one who knows the format: its digests are made again.

    The log then reads, and what replay makes of the edit is what is tested.
    """

    def edit(lines: list[str]) -> list[str]:
        data = json.loads(lines[number - 1])
        change(data)
        lines[number - 1] = json.dumps(data)
        return restamp(lines)

    return edit


def drop_call(data: dict[str, Any]) -> None:
    del data["data"]["messages"][1]  # the reply that made the tool call


def unknown_message(data: dict[str, Any]) -> None:
    data["data"]["messages"][1] = "msg_nope"


def as_user(data: dict[str, Any]) -> None:
    data["data"]["event"]["message"]["role"] = "user"
