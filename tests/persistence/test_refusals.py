"""Unknown ids, bad import files and tampered logs: each a typed refusal.

One table per kind. Each row names the typed error, the id, line or field it
must name, and (for the command line) the exit code and the one line it
prints; after each, nothing was written and the stored sessions still list
and load.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import attrs
import pytest

from turnfsm import Agent
from turnfsm.cli import main
from turnfsm.core import MachineSpec
from turnfsm.driver import Driver, rebuild, replay
from turnfsm.errors import (
    ConfigError,
    CorruptRecord,
    LogInconsistent,
    ReplayDiverged,
    ReplayError,
    SessionNotFound,
)
from turnfsm.messages import Message
from turnfsm.persistence import (
    MemoryStore,
    Session,
    SQLiteStore,
    dump_session,
    load_session,
    session_lines,
)
from turnfsm.testing import ScriptedModel, reply, tool_call

Capture = pytest.CaptureFixture[str]

GOOD, OTHER = "ses_good", "ses_other"


def read(name: str) -> str:
    """Read a file."""
    return f"contents of {name}"


def _driver(*replies: Message | str) -> Driver:
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


@pytest.fixture
def world(tmp_path: Path) -> World:
    db = tmp_path / "s.db"

    async def build() -> World:
        async with SQLiteStore(db) as store:
            good = Session(GOOD, store=store)
            driver = _driver(
                reply("", tool_call("read", "c1", name="a.txt")),
                "read it",
                "you are welcome",
            )
            await driver.run("read a.txt", session=good)
            await driver.run("thanks", session=good)
            await _driver("hi").run("hello", session=Session(OTHER, store=store))
            listed = tuple((i.id, i.version) for i in await store.list_sessions())
            return World(
                db=db,
                lines=tuple(session_lines(good)),
                runs=tuple(r.run_id for r in good.runs),
                listed=listed,
                spec=driver.machine,
            )

    built = anyio.run(build)
    assert len(built.lines) == 19
    assert [i for i, _ in built.listed] == [GOOD, OTHER]
    return built


def _still_fine(world: World, capsys: Capture) -> None:
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


def _one_line(text: str, prefix: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    assert lines[0].startswith(prefix), text
    assert "Traceback" not in text
    return lines[0]


def _in_store(world: World, read: Callable[[SQLiteStore], Any]) -> Any:
    async def go() -> Any:
        async with SQLiteStore(world.db) as store:
            return await read(store)

    return anyio.run(go)


# -- unknown ids ---------------------------------------------------------------


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
        _in_store(world, read)
    assert raised.value.session_id == "ses_goot"
    assert isinstance(raised.value, LookupError)
    assert "no session 'ses_goot'" in str(raised.value)
    _still_fine(world, capsys)


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
    line = _one_line(captured.err, "turnfsm ")
    assert f"no session 'ses_goot' in {world.db} (did you mean 'ses_good'?)" in line
    _still_fine(world, capsys)


def test_a_run_on_a_new_session_id_still_creates_it(tmp_path: Path) -> None:
    async def go() -> tuple[int, int, int]:
        store = MemoryStore()
        fresh = await Session.open(store, "ses_new")  # reads nothing, writes nothing
        assert await store.list_sessions() == ()
        await _driver("one").run("hi", session=fresh)
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
    assert "run_nope" in _one_line(capsys.readouterr().err, "turnfsm replay: ")


# -- bad import files ------------------------------------------------------------


def _edit(number: int, change: Callable[[dict[str, Any]], object]) -> Edit:
    def edit(lines: list[str]) -> list[str]:
        data = json.loads(lines[number - 1])
        change(data)
        lines[number - 1] = json.dumps(data)
        return lines

    return edit


Edit = Callable[[list[str]], list[str]]


def _drop_call(data: dict[str, Any]) -> None:
    del data["data"]["messages"][1]  # the reply that made the tool call


def _unknown_message(data: dict[str, Any]) -> None:
    data["data"]["messages"][1] = "msg_nope"


def _document(entries: object) -> Callable[[list[str]], bytes]:
    def make(lines: list[str]) -> bytes:
        header = json.loads(lines[0])
        return json.dumps({**header, "entries": entries}).encode()

    return make


def _deep(depth: int) -> str:
    return "[" * depth + "]" * depth


def _deep_arguments(line: str) -> str:
    data = json.loads(line)
    (call,) = [p for p in data["data"]["event"]["message"]["parts"] if "arguments" in p]
    call["arguments"] = {"name": "DEEP"}
    return json.dumps(data).replace('"DEEP"', _deep(100_000))


@attrs.frozen
class BadFile:
    """One bad import file: how to make it from a good log, what it must name."""

    name: str
    make: Callable[[list[str]], list[str] | bytes]
    where: str  # the line (and field) the error names
    reason: str


BAD_FILES = [
    BadFile("reversed", lambda ls: [ls[0], *ls[:0:-1]], "line 2", "no RunOpened"),
    BadFile("no RunOpened", lambda ls: [ls[0], *ls[2:]], "line 2", "no RunOpened"),
    BadFile(
        "unknown message id",
        _edit(11, _unknown_message),
        "line 11: data.messages",
        "'msg_nope' was brought in by no event",
    ),
    BadFile(
        "lone tool result",
        _edit(11, _drop_call),
        "line 11: data.messages",
        "not a whole conversation",
    ),
    BadFile(
        "header without v",
        _edit(1, lambda d: d.pop("v")),
        "line 1: v",
        "missing",
    ),
    BadFile(
        "unknown version",
        _edit(1, lambda d: d.update(v=99)),
        "line 1: v",
        "unknown version 99",
    ),
    BadFile(
        "header with no usable id",
        _edit(1, lambda d: d.update(session_id="")),
        "line 1: session_id",
        "not a session id",
    ),
    BadFile("no header", lambda ls: ls[1:], "line 1", "not a session log header"),
    BadFile("header only", lambda ls: ls[:1], "line 2", "no entries"),
    BadFile("empty", lambda ls: [], "line 1", "empty"),
    BadFile(
        "deep nesting on a line",
        lambda ls: [*ls, _deep(100_000)],
        "line 20",
        "nested deeper",
    ),
    BadFile(
        "deep nesting in a tool call's arguments",
        lambda ls: [*ls[:5], _deep_arguments(ls[5]), *ls[6:]],
        "line 6",
        "nested deeper",
    ),
    BadFile(
        "UTF-16",
        lambda ls: "\n".join(ls).encode("utf-16"),
        "line 1",
        "not UTF-8",
    ),
    BadFile(
        "entries not a list",
        _document({"a": 1}),
        "entries",
        "expected a list of entries, got an object",
    ),
    BadFile(
        "a document entry that is not an entry",
        _document([[]]),
        "entries[0]",
        "expected an object",
    ),
    BadFile(
        "a line not JSON", lambda ls: [*ls[:4], "{oops", *ls[5:]], "line 5", "not JSON"
    ),
    BadFile(
        "a line not an entry",
        _edit(5, lambda d: d.update(type="Nope")),
        "line 5: type",
        "unknown record type 'Nope'",
    ),
    BadFile(
        "a run opened twice",
        lambda ls: [*ls[:2], ls[1], *ls[2:]],
        "line 3: data.run_id",
        "opened before",
    ),
    BadFile(
        "a commit keeping more than the history",
        _edit(18, lambda d: d["data"].update(keep=9)),
        "line 18: data.keep",
        "keeps 9 messages of a history of 4",
    ),
]


def _bad_file(world: World, tmp_path: Path, bad: BadFile) -> Path:
    lines = list(world.lines)
    header = json.loads(lines[0])
    header["session_id"] = "ses_imported"  # a new session, were it imported
    lines[0] = json.dumps(header)
    made = bad.make(lines)
    path = tmp_path / "bad.jsonl"
    path.write_bytes(made if isinstance(made, bytes) else "\n".join(made).encode())
    return path


@pytest.mark.parametrize("bad", BAD_FILES, ids=lambda b: b.name)
def test_a_bad_import_file_is_refused_whole_naming_the_line(
    world: World, tmp_path: Path, capsys: Capture, bad: BadFile
) -> None:
    path = _bad_file(world, tmp_path, bad)

    async def load(store: SQLiteStore) -> Session:
        return await load_session(path.read_bytes(), store)

    with pytest.raises(CorruptRecord) as raised:
        _in_store(world, load)
    assert raised.value.path.startswith(bad.where), raised.value
    assert bad.reason in str(raised.value)
    _still_fine(world, capsys)
    assert main(["sessions", "import", str(path), *world.store]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    line = _one_line(captured.err, "turnfsm sessions import: corrupt ")
    assert f"at {bad.where}" in line
    assert bad.reason in line
    _still_fine(world, capsys)


def test_the_same_files_made_well_import(
    world: World, tmp_path: Path, capsys: Capture
) -> None:
    path = _bad_file(world, tmp_path, BadFile("none", lambda ls: ls, "", ""))
    assert main(["sessions", "import", str(path), *world.store]) == 0
    assert "imported session ses_imported (18 entries)" in capsys.readouterr().out


def test_a_line_separator_inside_a_message_survives_export_and_import(
    tmp_path: Path, capsys: Capture
) -> None:
    one, two = tmp_path / "1.db", tmp_path / "2.db"

    async def build() -> None:
        async with SQLiteStore(one) as store:
            session = Session(GOOD, store=store)
            await _driver("a\u2028b\x85c").run("x\u2029y", session=session)

    anyio.run(build)
    log = tmp_path / "s.jsonl"
    export = ["sessions", "export", GOOD, "--out", str(log), "--store", str(one)]
    assert main(export) == 0
    assert main(["sessions", "import", str(log), "--store", str(two)]) == 0
    capsys.readouterr()

    async def texts(path: Path) -> list[str]:
        async with SQLiteStore(path) as store:
            return [m.text for m in (await Session.load(store, GOOD)).history]

    assert (
        anyio.run(texts, two) == anyio.run(texts, one) == ["x\u2029y", "a\u2028b\x85c"]
    )


def test_lone_surrogates_survive_export_and_import(tmp_path: Path) -> None:
    """Text decoded from bytes that were not UTF-8 is exported as JSON escapes."""

    async def go() -> tuple[Session, Session]:
        session = Session(GOOD)
        await _driver("a\udcffb \\udcff").run("in\ud800put", session=session)
        dump_session(session, str(tmp_path / "s.jsonl"))
        data = (tmp_path / "s.jsonl").read_bytes()
        return session, await load_session(data)

    session, loaded = anyio.run(go)
    assert loaded.entries == session.entries
    assert [m.text for m in loaded.history] == ["in\ud800put", "a\udcffb \\udcff"]


# -- tampered logs -------------------------------------------------------------


def _swap(a: int, b: int) -> Edit:
    def edit(lines: list[str]) -> list[str]:
        lines[a - 1], lines[b - 1] = lines[b - 1], lines[a - 1]
        return lines

    return edit


def _swap_renumbered(a: int, b: int) -> Edit:
    """Swap two event lines and their indexes: the order checks pass."""

    def edit(lines: list[str]) -> list[str]:
        first, second = json.loads(lines[a - 1]), json.loads(lines[b - 1])
        first["data"]["index"], second["data"]["index"] = (
            second["data"]["index"],
            first["data"]["index"],
        )
        lines[a - 1], lines[b - 1] = json.dumps(second), json.dumps(first)
        return lines

    return edit


def _delete(number: int) -> Edit:
    return lambda ls: [*ls[: number - 1], *ls[number:]]


def _repeat(number: int) -> Edit:
    return lambda ls: [*ls[:number], ls[number - 1], *ls[number:]]


def _as_user(data: dict[str, Any]) -> None:
    data["data"]["event"]["message"]["role"] = "user"


@attrs.frozen
class Tampered:
    """One tampered log, and the run, event and line where replay must stop."""

    name: str
    edit: Edit
    run: int  # which run (0 or 1) replay stops in
    index: int  # the event of that run
    line: int  # the line of the file
    says: str  # what the error says differs


TAMPERED = [
    Tampered("swapped events", _swap(7, 8), 0, 3, 7, "logged as #4"),
    Tampered(
        "swapped events, renumbered",
        _swap_renumbered(7, 8),
        0,
        3,
        7,
        "phase 'run_tools' does not take 'measured'",
    ),
    Tampered("a repeated event", _repeat(4), 0, 2, 5, "logged as #1"),
    Tampered("a deleted event", _delete(4), 0, 1, 5, "logged as #2"),
    Tampered(
        "a reply turned into a user message",
        _edit(17, _as_user),
        1,
        2,
        17,
        "carries it as a user message",
    ),
    Tampered(
        "a turn record naming another reply",
        _edit(16, lambda d: d["data"].update(output="msg_other")),
        1,
        2,
        17,
        "turn 1's reply is message 'msg_other'",
    ),
    Tampered(
        "a deleted turn record",
        _delete(16),
        1,
        2,
        16,
        "no turn record names the reply",
    ),
    Tampered(
        "a turn record with another context",
        _edit(16, lambda d: d["data"].update(added=d["data"]["added"][1:])),
        1,
        2,
        17,
        "model call 1 saw",
    ),
]


def _tampered_entries(world: World, edit: Edit) -> Session:
    lines = edit(list(world.lines))
    return anyio.run(load_session, "\n".join(lines))


@pytest.mark.parametrize("case", TAMPERED, ids=lambda c: c.name)
def test_a_tampered_log_is_a_typed_replay_error_naming_the_line(
    world: World, tmp_path: Path, capsys: Capture, case: Tampered
) -> None:
    session = _tampered_entries(world, case.edit)
    run_id = world.runs[case.run]
    report = replay(world.spec, session, run_id)
    assert not report.ok
    error = report.divergence
    assert isinstance(error, LogInconsistent), error
    assert (error.run_id, error.index) == (run_id, case.index)
    assert error.entry == case.line - 2  # the header is line 1
    assert case.says in str(error)
    with pytest.raises(LogInconsistent):
        rebuild(world.spec, session, run_id)
    # The other run replays exactly.
    other = world.runs[1 - case.run]
    assert replay(world.spec, session, other).ok
    # The command line: one line per run, the tampered one naming the line.
    log = tmp_path / "t.jsonl"
    log.write_text("\n".join(case.edit(list(world.lines))) + "\n")
    capsys.readouterr()
    assert main(["replay", str(log)]) == 1
    captured = capsys.readouterr()
    assert captured.err == ""
    out = captured.out.strip().splitlines()
    assert len(out) == 2, captured.out
    events = len(session.run(other).events)
    assert out[1 - case.run] == f"{other}: {events} events replayed exactly (done)"
    assert out[case.run].startswith(f"{run_id}: DIVERGES at line {case.line} - ")
    assert case.says in out[case.run]
    _still_fine(world, capsys)


@attrs.frozen
class Unreadable:
    """A tampered log that does not even read as a session."""

    name: str
    edit: Edit
    where: str
    reason: str


UNREADABLE = [
    Unreadable(
        "a deleted line that brought a message",
        _delete(6),
        "line 10: data.messages",
        "was brought in by no event",
    ),
    Unreadable(
        "an event of an unknown run",
        _edit(4, lambda d: d["data"].update(run_id="run_nope")),
        "line 4",
        "run 'run_nope' has no RunOpened before it",
    ),
    Unreadable(
        "a tampered history before a run",
        _edit(11, _drop_call),
        "line 11: data.messages",
        "not a whole conversation",
    ),
    Unreadable(
        "a tool call turned into a user message",
        _edit(6, _as_user),
        "line 6: data.event.message.parts",
        "a tool call needs role 'assistant'",
    ),
]


@pytest.mark.parametrize("case", UNREADABLE, ids=lambda c: c.name)
def test_a_log_too_damaged_to_read_is_refused_naming_the_line(
    world: World, tmp_path: Path, capsys: Capture, case: Unreadable
) -> None:
    with pytest.raises(CorruptRecord) as raised:
        _tampered_entries(world, case.edit)
    assert raised.value.path == case.where
    assert case.reason in str(raised.value)
    log = tmp_path / "t.jsonl"
    log.write_text("\n".join(case.edit(list(world.lines))) + "\n")
    capsys.readouterr()
    assert main(["replay", str(log)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    line = _one_line(captured.err, "turnfsm replay: corrupt ")
    assert f"at {case.where}: " in line
    _still_fine(world, capsys)


def test_a_stored_log_with_a_tampered_history_before_a_run(
    world: World, capsys: Capture
) -> None:
    """A store does not check the conversation: replay names the run's opening."""
    lines = _edit(11, _drop_call)(list(world.lines))
    entries = [load_session_entry(line) for line in lines[1:]]

    async def store_it(store: SQLiteStore) -> Session:
        await store.append("ses_tampered", entries, expected_version=0)
        return await Session.load(store, "ses_tampered")

    session = _in_store(world, store_it)
    first, second = world.runs
    assert not replay(world.spec, session, first).history_matches
    report = replay(world.spec, session, second)
    error = report.divergence
    assert isinstance(error, LogInconsistent), error
    assert (error.run_id, error.index, error.event) == (second, 0, "run_started")
    assert error.entry == 11  # the second run's RunOpened
    assert "the history before the run is a whole conversation" in str(error)
    assert "answers no earlier tool call" in str(error) or "call_id" in str(error)
    capsys.readouterr()
    assert main(["replay", "--session", "ses_tampered", *world.store]) == 1
    captured = capsys.readouterr()
    assert captured.err == ""
    out = captured.out.strip().splitlines()
    assert len(out) == 2
    assert out[0] == f"{first}: DIVERGES - the replayed history differs from the log"
    assert out[1].startswith(f"{second}: DIVERGES - run {second!r} cannot be replayed")
    assert "in entries[11]" in out[1]


def load_session_entry(line: str) -> Any:
    from turnfsm import serde
    from turnfsm.persistence import Entry

    return serde.open_envelope(json.loads(line), Entry)


def test_replay_errors_are_one_family() -> None:
    assert issubclass(ReplayDiverged, ReplayError)
    assert issubclass(LogInconsistent, ReplayError)
    error = LogInconsistent(
        run_id="run_1", index=3, event="measured", expected="a", actual="b", entry=7
    )
    assert str(error).startswith(
        "run 'run_1' cannot be replayed at event #3 (measured) in entries[7]: "
        "the log says a, but b;"
    )
