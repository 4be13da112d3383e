"""A bad import file is refused whole, naming its line and field; nothing is written.

Each row makes a bad file from a good export and names what the refusal must
say: through `load_session` (a `CorruptRecord`) and `turnfsm sessions import`
(exit status 2, one line); the store is left as it was.
"""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import attrs
import pytest

from tests.helpers import restamp
from tests.persistence.refusal_world import (
    GOOD,
    Capture,
    Edit,
    World,
    build_world,
    driver_of,
    drop_call,
    edit_line,
    in_store,
    one_line,
    still_fine,
    unknown_message,
)
from turnfsm.cli import main
from turnfsm.errors import ConfigError, CorruptRecord
from turnfsm.persistence import (
    Session,
    SQLiteStore,
    dump_session,
    load_session,
)


@pytest.fixture
def world(tmp_path: Path) -> World:
    return build_world(tmp_path)


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


def _header(change: Callable[[dict[str, Any]], object]) -> Edit:
    def make(lines: list[str]) -> list[str]:
        header = json.loads(lines[0])
        change(header)
        return [json.dumps(header), *lines[1:]]

    return make


def _strip(key: str, number: int) -> Edit:
    """Drop `key` from line `number`."""

    def make(lines: list[str]) -> list[str]:
        data = json.loads(lines[number - 1])
        del data[key]
        lines[number - 1] = json.dumps(data)
        return lines

    return make


BAD_FILES = [
    # Each imported without a word, as a session with fewer or more entries
    # (a cut one "running"), or replayed "exactly" when its edit was one the
    # replay does not see.
    BadFile(
        "cut short after a whole line",
        lambda ls: ls[:19],
        "line 19",
        "the log ends after this entry, the 18th of the 19 its header counts: "
        "the file was cut short after it",
    ),
    BadFile(
        "cut short after a run's first lines",
        lambda ls: ls[:16],
        "line 16",
        "the 15th of the 19 its header counts",
    ),
    BadFile(
        "a line deleted",
        lambda ls: [*ls[:16], *ls[17:]],
        "line 17: seq",
        "the 17th entry, but the 16th entry is nowhere in the file: a line was "
        "deleted before it",
    ),
    BadFile(
        "two lines deleted",
        lambda ls: [*ls[:7], *ls[9:]],
        "line 8: seq",
        "the 9th entry, but the 7th and 8th entries are nowhere",
    ),
    BadFile(
        "a commit repeated",
        lambda ls: [*ls[:12], ls[11], *ls[12:]],
        "line 13: seq",
        "the 11th entry again (line 12 holds it too): a line was repeated",
    ),
    BadFile(
        "a machine repeated",
        lambda ls: [*ls[:2], ls[1], *ls[2:]],
        "line 3: seq",
        "the 1st entry again (line 2 holds it too)",
    ),
    BadFile(
        "two lines swapped",
        lambda ls: [*ls[:16], ls[17], ls[16], *ls[18:]],
        "line 17: seq",
        "the 17th entry where the 16th belongs (line 18 holds it): the lines are "
        "out of order",
    ),
    BadFile(
        "a line added after the end",
        lambda ls: [*ls, ls[-1]],
        "line 21: seq",
        "the 19th entry again (line 20 holds it too)",
    ),
    BadFile(
        "an entry added with a position of its own",
        lambda ls: [*ls, ls[-1].replace('"seq":19', '"seq":20')],
        "line 21: seq",
        "the 20th entry of a log whose header counts 19: a line was added",
    ),
    BadFile(
        "a line's digests removed",
        _strip("digests", 5),
        "line 5: digests",
        "missing: each entry line of this log carries its fields' digests",
    ),
    BadFile(
        "a line's position removed",
        _strip("seq", 5),
        "line 5: seq",
        "missing: each entry line of this log carries its position",
    ),
    BadFile(
        "a position that is no number",
        lambda ls: [*ls[:4], ls[4].replace('"seq":4', '"seq":"4"'), *ls[5:]],
        "line 5: seq",
        "expected the entry's position in the log (1, 2, ...), got '4'",
    ),
    BadFile(
        "the header's log version removed",
        _header(lambda d: d.pop("log_version")),
        "line 1: log_version",
        "missing, yet line 2 carries its position in the log (seq)",
    ),
    BadFile(
        "a log version from the future",
        _header(lambda d: d.update(log_version=3)),
        "line 1: log_version",
        "unknown log version 3; this turnfsm reads logs of version 2 and those "
        "written before, of version 1 or none",
    ),
    BadFile(
        "the header's count removed",
        _header(lambda d: d.pop("entry_count")),
        "line 1: entry_count",
        "missing: the header counts the log's entries",
    ),
    BadFile(
        "a count that is no number",
        _header(lambda d: d.update(entry_count=True)),
        "line 1: entry_count",
        "expected the number of entries the log holds, got True",
    ),
    # What the session's own checks refuse, of lines edited as one who knows
    # the format would (numbered again, their digests made again).
    BadFile(
        "reversed",
        lambda ls: restamp([ls[0], *ls[:0:-1]]),
        "line 2",
        "no RunOpened",
    ),
    BadFile(
        "no RunOpened",
        lambda ls: restamp([*ls[:2], *ls[3:]]),
        "line 3",
        "no RunOpened",
    ),
    BadFile(
        "unknown message id",
        edit_line(12, unknown_message),
        "line 12: data.messages",
        "'msg_nope' was brought in by no event",
    ),
    BadFile(
        "lone tool result",
        edit_line(12, drop_call),
        "line 12: data.messages",
        "not a whole conversation",
    ),
    BadFile(
        "header without v",
        edit_line(1, lambda d: d.pop("v")),
        "line 1: v",
        "missing",
    ),
    BadFile(
        "unknown version",
        edit_line(1, lambda d: d.update(v=99)),
        "line 1: v",
        "unknown version 99",
    ),
    BadFile(
        "header with no usable id",
        edit_line(1, lambda d: d.update(session_id="")),
        "line 1: session_id",
        "not a session id",
    ),
    BadFile("no header", lambda ls: ls[1:], "line 1", "not a session log header"),
    BadFile("header only", lambda ls: ls[:1], "line 2", "no entries"),
    BadFile(
        "deep nesting on a line",
        lambda ls: [*ls, _deep(100_000)],
        "line 21",
        "nested deeper",
    ),
    BadFile(
        "deep nesting in a tool call's arguments",
        lambda ls: [*ls[:6], _deep_arguments(ls[6]), *ls[7:]],
        "line 7",
        "nested deeper",
    ),
    BadFile(
        "UTF-16",
        lambda ls: "\n".join(ls).encode("utf-16"),
        "line 1",
        "not UTF-8",
    ),
    # A compressed log read as text that is not UTF-8 ("byte 0x8b").
    BadFile(
        "gzip",
        lambda ls: gzip.compress("\n".join(ls).encode()),
        "line 1",
        "gzip-compressed data, not a log's text: decompress it first (gunzip FILE)",
    ),
    BadFile(
        "xz",
        lambda ls: lzma.compress("\n".join(ls).encode()),
        "line 1",
        "xz-compressed data",
    ),
    BadFile(
        "bzip2",
        lambda ls: bz2.compress("\n".join(ls).encode()),
        "line 1",
        "bzip2-compressed data",
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
        edit_line(5, lambda d: d.update(type="Nope")),
        "line 5: type",
        "unknown record type 'Nope'",
    ),
    # Blamed on its digests: "digests: expected an object of the entry's
    # field digests".
    BadFile(
        "an entry line without its data",
        lambda ls: [*ls[:4], json.dumps({**json.loads(ls[4]), "data": None}), *ls[5:]],
        "line 5: data",
        "expected an object, got null",
    ),
    # Each imported, and replayed "exactly": a commit after the run's end.
    BadFile(
        "a run's commit after its end",
        lambda ls: restamp([*ls[:11], ls[12], ls[11], *ls[13:]]),
        "line 13: data.run_id",
        "ended before (done); no entry of a run comes after its end",
    ),
    BadFile(
        "a run's commit moved past its end into the next run",
        lambda ls: restamp([*ls[:11], *ls[12:14], ls[11], *ls[14:]]),
        "line 14: data.run_id",
        "ended before (done); no entry of a run comes after its end",
    ),
    BadFile(
        "a run opened twice",
        lambda ls: restamp([*ls[:3], ls[2], *ls[3:]]),
        "line 4: data.run_id",
        "opened before",
    ),
    BadFile(
        "a commit keeping more than the history",
        edit_line(19, lambda d: d["data"].update(keep=9)),
        "line 19: data.keep",
        "keeps 9 messages of a history of 4",
    ),
    # Each imported, the field dropped: exported again, the log lost it.
    BadFile(
        "a key the header does not have",
        _header(lambda h: h.update(encryption="aes")),
        "line 1: encryption",
        "not a field of a session log line",
    ),
    BadFile(
        "a key an entry line does not have",
        edit_line(5, lambda d: d.update(signed_by="me")),
        "line 5: signed_by",
        "not a field of a session log line",
    ),
    BadFile(
        "a field an event does not have, its digest made again",
        edit_line(4, lambda d: d["data"]["event"].update(bogus=1)),
        "line 4: data.event.bogus",
        "not a field of this record",
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
        in_store(world, load)
    assert raised.value.path.startswith(bad.where), raised.value
    assert bad.reason in str(raised.value)
    still_fine(world, capsys)
    assert main(["sessions", "import", str(path), *world.store]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    if "compressed data" in bad.reason:  # no log at all: not "changed since"
        said = f"turnfsm sessions import: {path} is not a session log (it is "
        line = one_line(captured.err, said)
    else:
        line = one_line(captured.err, f"turnfsm sessions import: {path}: corrupt ")
        assert f"at {bad.where}" in line
    assert bad.reason in line
    still_fine(world, capsys)


@pytest.mark.parametrize("text", [b"", b"\n\n  \n"], ids=["empty", "blank lines"])
def test_an_empty_import_file_is_no_log_not_a_corrupt_one(
    world: World, tmp_path: Path, capsys: Capture, text: bytes
) -> None:
    # It said "corrupt ... it was written by another turnfsm version or
    # changed since" of a file with nothing in it.
    path = tmp_path / "empty.jsonl"
    path.write_bytes(text)

    async def load(store: SQLiteStore) -> Session:
        return await load_session(path.read_bytes(), store)

    with pytest.raises(ConfigError, match="this one is empty") as raised:
        in_store(world, load)
    assert raised.value.field == "lines"
    still_fine(world, capsys)
    assert main(["sessions", "import", str(path), *world.store]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        f"turnfsm sessions import: {path} is empty: expected a session log, as "
        "`turnfsm sessions export` writes it\n"
    )
    still_fine(world, capsys)


def test_the_same_files_made_well_import(
    world: World, tmp_path: Path, capsys: Capture
) -> None:
    path = _bad_file(world, tmp_path, BadFile("none", lambda ls: ls, "", ""))
    assert main(["sessions", "import", str(path), *world.store]) == 0
    assert "imported session ses_imported (19 entries)" in capsys.readouterr().out


def test_a_line_separator_inside_a_message_survives_export_and_import(
    tmp_path: Path, capsys: Capture
) -> None:
    one, two = tmp_path / "1.db", tmp_path / "2.db"

    async def build() -> None:
        async with SQLiteStore(one) as store:
            session = Session(GOOD, store=store)
            await driver_of("a\u2028b\x85c").run("x\u2029y", session=session)

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
        await driver_of("a\udcffb \\udcff").run("in\ud800put", session=session)
        dump_session(session, str(tmp_path / "s.jsonl"))
        data = (tmp_path / "s.jsonl").read_bytes()
        return session, await load_session(data)

    session, loaded = anyio.run(go)
    assert loaded.entries == session.entries
    assert [m.text for m in loaded.history] == ["in\ud800put", "a\udcffb \\udcff"]


def _log_text(tmp_path: Path) -> str:
    session = Session(GOOD)
    anyio.run(lambda: driver_of("an answer").run("a question", session=session))
    dump_session(session, str(tmp_path / "s.jsonl"))
    return (tmp_path / "s.jsonl").read_text()


@pytest.mark.parametrize(
    ("given", "store", "field", "says"),
    [
        ("PATH", None, "lines", "not its path: read the file"),
        ("NAME", None, "lines", "not a file's name: read the file"),
        (None, None, "lines", "the log's text, bytes or lines"),
        (5, None, "lines", "the log's text, bytes or lines"),
        ([1, 2], None, "lines[0]", "a line of text (str)"),
        ("TEXT", "memory:", "store", "a SessionStore"),
        ("TEXT", 5, "store", "a SessionStore"),
    ],
    ids=[
        "a-path",
        "a-file-name",
        "none",
        "an-int",
        "ints",
        "a-store-spec",
        "an-int-store",
    ],
)
def test_load_session_given_no_log_names_the_argument(
    given: object, store: object, field: str, says: str, tmp_path: Path
) -> None:
    # Each raised TypeError or AttributeError, or read a file's name as a
    # log that is "not JSON".
    text = _log_text(tmp_path)
    path = tmp_path / "s.jsonl"
    named = {"PATH": path, "NAME": str(path), "TEXT": text}
    lines = named[given] if isinstance(given, str) else given

    with pytest.raises(ConfigError) as raised:
        anyio.run(load_session, lines, store)

    assert raised.value.field == field
    assert says in str(raised.value)


def test_load_session_reads_a_binary_file_and_a_bytearray(tmp_path: Path) -> None:
    text = _log_text(tmp_path)

    async def both() -> tuple[Session, Session]:
        with (tmp_path / "s.jsonl").open("rb") as binary:
            one = await load_session(binary)  # type: ignore[arg-type]
        return one, await load_session(bytearray(text.encode()))  # type: ignore[arg-type]

    one, two = anyio.run(both)
    assert one.entries == two.entries
    assert [m.text for m in one.history] == ["a question", "an answer"]


@pytest.mark.parametrize("session", ["ses_1", None])
def test_dump_session_of_no_session_names_it_and_writes_nothing(
    session: object, tmp_path: Path
) -> None:
    path = tmp_path / "s.jsonl"

    with pytest.raises(ConfigError, match=r"invalid session=.*: expected a Session"):
        dump_session(session, str(path))  # type: ignore[arg-type]

    assert not path.exists()


def test_a_store_given_as_a_log_is_named_a_store(
    world: World, tmp_path: Path, capsys: Capture
) -> None:
    # `turnfsm replay sessions.db` and `turnfsm sessions import sessions.db`
    # said "corrupt session log record at line 1: not UTF-8 text (byte
    # 0x..); a session log is UTF-8: write it again in that encoding".
    path = world.store[-1]
    assert main(["replay", path]) == 2
    captured = capsys.readouterr()
    assert captured.err == (
        f"turnfsm replay: invalid LOG={path!r}: expected a session log, as "
        "`turnfsm sessions export` writes it (this file is an SQLite store: "
        f"replay its sessions with --store {path} --session ID)\n"
    )
    other = tmp_path / "other.db"
    assert main(["sessions", "import", path, "--store", str(other)]) == 2
    captured = capsys.readouterr()
    assert (captured.out, captured.err) == (
        "",
        f"turnfsm sessions import: {path} is an SQLite store, not a session log: "
        "its sessions are read where they are (--store FILE), and `turnfsm "
        "sessions export` writes a session's log\n",
    )
    still_fine(world, capsys)


@pytest.mark.parametrize("newline", ["\n", "\r\n"], ids=["lf", "crlf"])
def test_a_bad_entry_of_a_json_document_is_named_with_its_line(
    world: World, tmp_path: Path, capsys: Capture, newline: str
) -> None:
    # An export in --format json (2,000 lines for a short session) edited by
    # hand was refused naming `entries[5]` only, not where the file has it.
    path = tmp_path / "s.json"
    assert (
        main(
            [
                "sessions",
                "export",
                GOOD,
                "--format",
                "json",
                "-o",
                str(path),
                *world.store,
            ]
        )
        == 0
    )
    text = path.read_text()
    lines = text.split("\n")
    start = [n for n, line in enumerate(lines, 1) if line == "    {"][5]
    at = next(n for n in range(start, len(lines)) if '"at": ' in lines[n - 1])
    lines[at - 1] = lines[at - 1].replace('"at": 1', '"at": 2')
    path.write_bytes(newline.join(lines).replace(GOOD, "ses_imported").encode())

    assert main(["sessions", "import", str(path), *world.store]) == 2

    line = one_line(capsys.readouterr().err, f"turnfsm sessions import: {path}: ")
    assert f"at entries[5] (from line {start}): data.at: changed since" in line
    still_fine(world, capsys)


def test_blank_lines_before_the_header_are_passed_over(
    world: World, tmp_path: Path, capsys: Capture
) -> None:
    # Blank lines between entries were passed over, but one before the
    # header (an editor's, a concatenation's) refused the whole log: "line 3:
    # not JSON: Extra data (column 1)".
    path = _bad_file(
        world, tmp_path, BadFile("none", lambda ls: ["", " \r", *ls], "", "")
    )
    assert main(["sessions", "import", str(path), *world.store]) == 0
    assert "imported session ses_imported (19 entries)" in capsys.readouterr().out
    # What it names is counted from the file's first line.
    header_only = tmp_path / "h.jsonl"
    header_only.write_text("\n\n" + world.lines[0] + "\n")
    assert main(["replay", str(header_only)]) == 2
    assert "at line 4: no entries after the header" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("prefix", "newline"),
    [("", "\r\n"), ("\ufeff", "\n"), ("\ufeff", "\r\n")],
    ids=["crlf", "bom", "bom-crlf"],
)
def test_a_log_saved_with_a_bom_or_crlf_imports_and_replays(
    world: World, tmp_path: Path, capsys: Capture, prefix: str, newline: str
) -> None:
    # As a Windows editor saves it: its positions and digests still hold.
    path = _bad_file(world, tmp_path, BadFile("none", lambda ls: ls, "", ""))
    text = path.read_text()
    path.write_bytes((prefix + newline.join(text.split("\n")) + newline).encode())
    assert main(["sessions", "import", str(path), *world.store]) == 0
    assert "imported session ses_imported (19 entries)" in capsys.readouterr().out
    assert main(["replay", str(path)]) == 0
    assert capsys.readouterr().out.count("replayed exactly (done)") == 2


def test_a_line_deleted_from_a_json_document_is_named_with_its_line(
    world: World, tmp_path: Path, capsys: Capture
) -> None:
    path = tmp_path / "s.json"
    export = ["sessions", "export", GOOD, "--format", "json", "-o", str(path)]
    assert main([*export, *world.store]) == 0
    document = json.loads(path.read_text())
    del document["entries"][4]
    path.write_text(json.dumps(document, indent=2).replace(GOOD, "ses_imported"))
    lines = path.read_text().split("\n")
    start = [n for n, line in enumerate(lines, 1) if line == "    {"][4]

    assert main(["sessions", "import", str(path), *world.store]) == 2

    line = one_line(capsys.readouterr().err, f"turnfsm sessions import: {path}: ")
    assert (
        f"at entries[4] (from line {start}): seq: the 6th entry, but the 5th "
        "entry is nowhere in the file" in line
    )
    still_fine(world, capsys)


def test_a_whole_export_of_a_run_still_going_on_imports_it_running(
    world: World, tmp_path: Path, capsys: Capture
) -> None:
    # What the export of a session writes while its run goes on: the run's
    # end is not yet in it, and its header counts the entries it holds.
    path = _bad_file(world, tmp_path, BadFile("none", lambda ls: ls, "", ""))
    lines = restamp(path.read_text().split("\n")[:19])
    assert json.loads(lines[0])["entry_count"] == 18
    path.write_text("\n".join(lines) + "\n")
    assert main(["sessions", "import", str(path), *world.store]) == 0
    assert "imported session ses_imported (18 entries)" in capsys.readouterr().out

    async def outcome(store: SQLiteStore) -> str:
        return (await Session.load(store, "ses_imported")).runs[-1].outcome

    assert in_store(world, outcome) == "running"


def test_a_log_written_before_lines_carried_positions_imports_as_it_did(
    world: World, tmp_path: Path, capsys: Capture
) -> None:
    # Its lines cannot tell a deletion at its end: only the session's own
    # checks apply, as they did when it was written.
    newer = ("digests", "seq", "log_version", "entry_count")
    older = [
        json.dumps({k: v for k, v in json.loads(line).items() if k not in newer})
        for line in world.lines
    ]
    path = tmp_path / "old.jsonl"
    path.write_text("\n".join(older[:19]).replace(GOOD, "ses_imported") + "\n")
    note = (
        f"note: {path} was written by an older turnfsm: its lines carry no "
        "positions, so a line deleted, repeated or cut from its end cannot be "
        "told (an export by this turnfsm can be checked whole)\n"
    )
    assert main(["sessions", "import", str(path), *world.store]) == 0
    captured = capsys.readouterr()
    assert "imported session ses_imported (18 entries)" in captured.out
    assert captured.err == f"turnfsm sessions import: {note}"
    # Replay says so too: "replayed exactly" holds of what the lines show.
    assert main(["replay", str(path)]) == 0
    captured = capsys.readouterr()
    assert "replayed exactly (running)" in captured.out
    assert captured.err == f"turnfsm replay: {note}"
    # Its export by this turnfsm is checked whole.
    assert (
        main(["sessions", "export", "ses_imported", "-o", str(path), *world.store]) == 0
    )
    assert main(["replay", str(path)]) == 0
    assert capsys.readouterr().err == ""
