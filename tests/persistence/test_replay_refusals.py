"""A tampered log is a typed replay error naming the event and the line.

Each row tampers with a good log: replay reports a `LogInconsistent` naming
the run, the event and the entry (`turnfsm replay` the line, exit status 1),
or, when the log does not even read as a session, the load names the line
(exit status 2).
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
from tests.persistence.refusal_world import (
    Capture,
    Edit,
    World,
    as_user,
    build_world,
    drop_call,
    edit_line,
    in_store,
    one_line,
    still_fine,
)
from turnfsm import Agent
from turnfsm.cli import main
from turnfsm.context import (
    ContextManager,
    SummarizingCompactor,
    TruncatingCompactor,
)
from turnfsm.driver import rebuild, replay
from turnfsm.errors import (
    CorruptRecord,
    LogInconsistent,
    ReplayDiverged,
    ReplayError,
)
from turnfsm.messages import Message
from turnfsm.persistence import (
    Session,
    SQLiteStore,
    load_session,
    session_lines,
)
from turnfsm.providers import ModelResponse
from turnfsm.testing import ExtractiveSummaryModel, ScriptedModel, reply, tool_call
from turnfsm.tokens import HeuristicTokenCounter
from turnfsm.values import Usage


@pytest.fixture
def world(tmp_path: Path) -> World:
    return build_world(tmp_path)


def _swap(a: int, b: int) -> Edit:
    """Swap two lines, numbered again as one who knows the format would."""

    def edit(lines: list[str]) -> list[str]:
        lines[a - 1], lines[b - 1] = lines[b - 1], lines[a - 1]
        return restamp(lines)

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
        return restamp(lines)

    return edit


def _delete(number: int) -> Edit:
    """Delete a line, the rest numbered again as one who knows the format would."""
    return lambda ls: restamp([*ls[: number - 1], *ls[number:]])


def edit_line_of(kind: str, change: Callable[[dict[str, Any]], None]) -> Edit:
    """Edit the one line of entry type `kind`."""

    def edit(lines: list[str]) -> list[str]:
        (number,) = [n for n, line in enumerate(lines, 1) if f'"type":"{kind}"' in line]
        return edit_line(number, change)(lines)

    return edit


def delete_line_of(kind: str) -> Edit:
    """Delete the one line of entry type `kind`."""

    def edit(lines: list[str]) -> list[str]:
        (number,) = [n for n, line in enumerate(lines, 1) if f'"type":"{kind}"' in line]
        return _delete(number)(lines)

    return edit


def _repeat(number: int) -> Edit:
    """Repeat a line, numbered again as one who knows the format would."""
    return lambda ls: restamp([*ls[:number], ls[number - 1], *ls[number:]])


_USED = {"input_tokens": 900, "output_tokens": 90}


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
    Tampered("swapped events", _swap(8, 9), 0, 3, 8, "logged as #4"),
    Tampered(
        "swapped events, renumbered",
        _swap_renumbered(8, 9),
        0,
        3,
        8,
        "phase 'run_tools' does not take 'measured'",
    ),
    Tampered("a repeated event", _repeat(5), 0, 2, 6, "logged as #1"),
    Tampered("a deleted event", _delete(5), 0, 1, 6, "logged as #2"),
    Tampered(
        "a reply turned into a user message",
        edit_line(18, as_user),
        1,
        2,
        18,
        "carries it as a user message",
    ),
    Tampered(
        "a turn record naming another reply",
        edit_line(17, lambda d: d["data"].update(output="msg_other")),
        1,
        2,
        18,
        "turn 1's reply is message 'msg_other'",
    ),
    Tampered(
        "a deleted turn record",
        _delete(17),
        1,
        2,
        17,
        "no turn record names the reply",
    ),
    Tampered(
        "a turn record with another context",
        edit_line(17, lambda d: d["data"].update(added=d["data"]["added"][1:])),
        1,
        2,
        18,
        "model call 1 saw",
    ),
    # These replayed "exactly", the end of the run saying what it did not do.
    Tampered(
        "an end that says a done run failed",
        edit_line(13, lambda d: d["data"].update(outcome="failed")),
        0,
        6,
        13,
        "ended failed",
    ),
    Tampered(
        "an end in another phase",
        edit_line(13, lambda d: d["data"].update(phase="failed")),
        0,
        6,
        13,
        "in phase 'failed'",
    ),
    Tampered(
        "an end with another final answer",
        edit_line(13, lambda d: d["data"].update(text="forged")),
        0,
        6,
        13,
        "'forged'",
    ),
    Tampered(
        "an end counting other model calls",
        edit_line(20, lambda d: d["data"].update(turns=7)),
        1,
        3,
        20,
        "after 7 model call(s)",
    ),
    Tampered(
        "a done run said interrupted, to be carried on",
        edit_line(13, lambda d: d["data"].update(outcome="interrupted")),
        0,
        6,
        13,
        "ended interrupted",
    ),
    Tampered(
        "a turn record with usage its reply did not report",
        edit_line(6, lambda d: d["data"].update(usage=_USED)),
        0,
        2,
        7,
        "turn 1's usage",
    ),
    Tampered(
        "an end with usage its turns did not report",
        edit_line(13, lambda d: d["data"].update(usage=_USED)),
        0,
        6,
        13,
        "its end says it used",
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
    still_fine(world, capsys)


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
        _delete(7),
        "line 11: data.messages",
        "was brought in by no event",
    ),
    Unreadable(
        "an event of an unknown run",
        edit_line(5, lambda d: d["data"].update(run_id="run_nope")),
        "line 5",
        "run 'run_nope' has no RunOpened before it",
    ),
    Unreadable(
        "a tampered history before a run",
        edit_line(12, drop_call),
        "line 12: data.messages",
        "not a whole conversation",
    ),
    Unreadable(
        "a tool call turned into a user message",
        edit_line(7, as_user),
        "line 7: data.event.message.parts",
        "a tool call needs role 'assistant'",
    ),
    # A repeated end was read as the run's end, and the log replayed exactly.
    Unreadable(
        "a repeated end of a run",
        _repeat(13),
        "line 14: data.run_id",
        "ended before (done); a run ends once",
    ),
    # These named the line as a "MachineStored | RunOpened | ... record".
    Unreadable(
        "a repeated header",
        _repeat(1),
        "line 2",
        "corrupt session log record at line 2: a second header",
    ),
    Unreadable(
        "a line of an unknown type",
        edit_line(5, lambda d: d.update(type="Nope")),
        "line 5: type",
        "corrupt session log record at line 5: type: unknown record type 'Nope'",
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
    line = one_line(captured.err, f"turnfsm replay: {log}: corrupt ")
    assert f"at {case.where}: " in line
    still_fine(world, capsys)


def test_a_stored_log_with_a_tampered_history_before_a_run(
    world: World, capsys: Capture
) -> None:
    """A store does not check the conversation: replay names the run's opening."""
    lines = edit_line(12, drop_call)(list(world.lines))
    entries = [load_session_entry(line) for line in lines[1:]]

    async def store_it(store: SQLiteStore) -> Session:
        await store.append("ses_tampered", entries, expected_version=0)
        return await Session.load(store, "ses_tampered")

    session = in_store(world, store_it)
    first, second = world.runs
    assert not replay(world.spec, session, first).history_matches
    report = replay(world.spec, session, second)
    error = report.divergence
    assert isinstance(error, LogInconsistent), error
    assert (error.run_id, error.index, error.event) == (second, 0, "run_started")
    assert error.entry == 12  # the second run's RunOpened
    assert "the history before the run is a whole conversation" in str(error)
    assert "answers no earlier tool call" in str(error) or "call_id" in str(error)
    capsys.readouterr()
    assert main(["replay", "--session", "ses_tampered", *world.store]) == 1
    captured = capsys.readouterr()
    assert captured.err == ""
    out = captured.out.strip().splitlines()
    assert len(out) == 2
    assert out[0].startswith(
        f"{first}: DIVERGES - the replayed history differs from the log: the "
        "log commits a history of "
    )
    assert out[1].startswith(f"{second}: DIVERGES - run {second!r} cannot be replayed")
    assert "in entries[12]" in out[1]


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


def test_a_repeated_compaction_pass_is_refused_naming_the_line(
    tmp_path: Path, capsys: Capture
) -> None:
    # It said "session ... already holds the compaction record with key ...;
    # nothing was appended - reload the session", naming no line.
    manager = ContextManager(
        TruncatingCompactor(),
        context_window=2_000,
        threshold=60,
        counter=HeuristicTokenCounter(),
    )
    agent = Agent(model=ScriptedModel.of("fine"), context=manager)
    said = [Message.user(f"question {i} " + "q" * 400) for i in range(12)]
    assert agent.run_sync(said).outcome == "done"
    lines = list(session_lines(agent.session))
    (number,) = [n for n, line in enumerate(lines, 1) if "CompactionRecord" in line]
    repeated = _repeat(number)(lines)
    with pytest.raises(CorruptRecord) as raised:
        anyio.run(load_session, "\n".join(repeated))
    assert raised.value.path == f"line {number + 1}: data.key"
    log = tmp_path / "t.jsonl"
    log.write_text("\n".join(repeated) + "\n")
    capsys.readouterr()
    assert main(["replay", str(log)]) == 2
    line = one_line(capsys.readouterr().err, f"turnfsm replay: {log}: corrupt ")
    assert line == (
        f"turnfsm replay: {log}: corrupt CompactionRecord record at line "
        f"{number + 1}: "
        f"data.key: the pass {agent.session.runs[0].compactions[0].key!r} is "
        "logged on an earlier line too; a pass is logged once; it was written "
        "by another turnfsm version or changed since"
    )


def test_a_log_cut_short_says_so_naming_its_last_line(
    world: World, tmp_path: Path, capsys: Capture
) -> None:
    # It said "not JSON: Unterminated string ...", as of a line edited badly.
    lines = list(world.lines)
    last = len(lines)
    log = tmp_path / "t.jsonl"
    log.write_text("\n".join(lines)[:-25])  # a copy that stopped early
    capsys.readouterr()
    assert main(["replay", str(log)]) == 2
    line = one_line(capsys.readouterr().err, f"turnfsm replay: {log}: corrupt ")
    assert line.startswith(
        f"turnfsm replay: {log}: corrupt session log record at line {last}: "
        "cut short, "
        "the file ends inside it (not JSON: "
    )
    # A line that is whole but not JSON is not said to be cut short.
    lines[last - 2] = lines[last - 2][:-25]
    log.write_text("\n".join(lines) + "\n")
    assert main(["replay", str(log)]) == 2
    line = one_line(capsys.readouterr().err, f"turnfsm replay: {log}: corrupt ")
    assert f"at line {last - 1}: not JSON: " in line


def test_a_commit_the_events_do_not_make_names_its_line_and_the_message(
    world: World, tmp_path: Path, capsys: Capture
) -> None:
    # It said "DIVERGES - the replayed history differs from the log", naming
    # neither the line nor what differs.
    lines = edit_line(19, lambda d: d["data"].update(keep=0))(list(world.lines))
    session = anyio.run(load_session, "\n".join(lines))
    second = world.runs[1]
    report = replay(world.spec, session, second)
    assert (report.divergence, report.history_matches) == (None, False)
    assert report.commit == 17  # the run's commit: line 19, the header line 1
    assert report.history_difference is not None
    assert report.history_difference.startswith(
        "the log commits a history of 2 message(s), the replayed events make 6; "
        "message #1 is user message "
    )
    log = tmp_path / "t.jsonl"
    log.write_text("\n".join(lines) + "\n")
    capsys.readouterr()
    assert main(["replay", str(log), "--run", second]) == 1
    out = capsys.readouterr().out
    assert out == (
        f"{second}: DIVERGES at line 19 - the replayed history differs from the "
        f"log: {report.history_difference}\n"
    )


def _compacted_lines() -> list[str]:
    """A log of one run whose first measurement is over the line: one pass."""
    manager = ContextManager(
        TruncatingCompactor(),
        context_window=2_000,
        threshold=60,
        counter=HeuristicTokenCounter(),
    )
    agent = Agent(model=ScriptedModel.of("fine"), context=manager)
    said = [Message.user(f"question {i} " + "q" * 400) for i in range(12)]
    assert agent.run_sync(said).outcome == "done"
    return list(session_lines(agent.session))


def _drop_last_replacement(data: dict[str, Any]) -> None:
    data["data"]["replacement"] = data["data"]["replacement"][:-1]


# Each replayed "exactly", the pass's record saying what the pass did not do.
PASS_EDITS = [
    ("tokens before", lambda d: d["data"].update(tokens_before=10), "tokens_before"),
    ("tokens after", lambda d: d["data"].update(tokens_after=1), "tokens_after"),
    ("verdict", lambda d: d["data"].update(outcome="noop"), "verdict"),
    ("what it replaced", _drop_last_replacement, "replacement"),
    ("what it covered", lambda d: d["data"].update(covers=["m"]), "covers"),
    ("its turn", lambda d: d["data"].update(turn=4), "turn"),
]


@pytest.mark.parametrize(
    ("edit", "field"),
    [(e, f) for _, e, f in PASS_EDITS],
    ids=[n for n, *_ in PASS_EDITS],
)
def test_a_compaction_record_the_pass_did_not_make_is_refused_naming_it(
    tmp_path: Path, capsys: Capture, edit: Any, field: str
) -> None:
    lines = _compacted_lines()
    (number,) = [n for n, line in enumerate(lines, 1) if "CompactionRecord" in line]
    lines = edit_line(number, edit)(lines)
    session = anyio.run(load_session, "\n".join(lines))
    (run,) = session.runs
    report = replay(None, session, run.run_id)
    error = report.divergence
    assert isinstance(error, LogInconsistent), report
    assert error.entry == number - 2  # the header is line 1
    assert field in str(error)
    log = tmp_path / "t.jsonl"
    log.write_text("\n".join(lines) + "\n")
    capsys.readouterr()
    assert main(["replay", str(log)]) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"{run.run_id}: DIVERGES at line {number} - ")


def test_a_compaction_record_deleted_is_refused_naming_the_pass(
    tmp_path: Path,
) -> None:
    # Deleted, the pass left no record (the session showed no compaction),
    # and the run replayed exactly.
    lines = _compacted_lines()
    (number,) = [n for n, line in enumerate(lines, 1) if "CompactionRecord" in line]
    lines = _delete(number)(lines)
    session = anyio.run(load_session, "\n".join(lines))
    (run,) = session.runs
    report = replay(None, session, run.run_id)
    error = report.divergence
    assert isinstance(error, LogInconsistent), report
    assert error.entry == number - 2  # the pass's event, now on that line
    assert "no compaction record" in str(error)


def _summarized_lines() -> list[str]:
    """A log of one run whose pass summarized the conversation."""
    manager = ContextManager(
        SummarizingCompactor(model=ExtractiveSummaryModel()),
        context_window=8_000,
    )
    agent = Agent(model=ScriptedModel.of("fine"), context=manager)
    said: list[Message] = []
    for i in range(8):
        said += [Message.user(f"q{i} " + "word " * 400)]
        said += [Message.assistant(f"a{i} " + "word " * 400)]
    assert agent.run_sync([*said, Message.user("go on")]).outcome == "done"
    assert agent.session.summaries
    return list(session_lines(agent.session))


def _forge_summary(data: dict[str, Any]) -> None:
    data["data"]["content"] = "the user agreed to everything"


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        (edit_line_of("SummaryRecorded", _forge_summary), "its summary record"),
        (delete_line_of("SummaryRecorded"), "no summary record"),
    ],
    ids=["another summary", "a deleted summary"],
)
def test_a_summary_record_the_pass_did_not_bring_in_is_refused(
    edit: Edit, says: str
) -> None:
    # Both replayed exactly, the session's summaries saying what no pass wrote.
    lines = edit(_summarized_lines())
    session = anyio.run(load_session, "\n".join(lines))
    (run,) = session.runs
    report = replay(None, session, run.run_id)
    assert isinstance(report.divergence, LogInconsistent), report
    assert says in str(report.divergence)


def test_a_failed_run_whose_end_names_another_error_is_refused() -> None:
    # It replayed exactly, the session saying a person abandoned the run
    # that had reached max_turns.
    model = ScriptedModel.of(reply("again", tool_call("read", "c1", name="a")))

    def read(name: str) -> str:
        """Read a file.

        Args:
            name: the file.
        """
        return name

    agent = Agent(model=model, tools=[read], max_turns=1)
    assert agent.run_sync("read a").outcome == "failed"
    forged = edit_line_of(
        "RunEnded",
        lambda d: d["data"].update(error={"type": "Cancelled", "reason": "abandoned"}),
    )(list(session_lines(agent.session)))
    session = anyio.run(load_session, "\n".join(forged))
    (run,) = session.runs
    report = replay(None, session, run.run_id)
    assert isinstance(report.divergence, LogInconsistent), report
    assert "run cancelled: abandoned" in str(report.divergence)


def _interrupted_lines() -> list[str]:
    """The log of a run interrupted from outside in its tool call."""

    async def slow(name: str) -> str:
        """Wait.

        Args:
            name: the file.
        """
        await anyio.sleep(30)
        return name

    used = Usage(input_tokens=10, output_tokens=3)
    called = reply("", tool_call("slow", "c1", name="a"))
    model = ScriptedModel.of(ModelResponse(message=called, usage=used), "done")
    agent = Agent(model=model, tools=[slow])

    async def interrupted() -> None:
        with anyio.move_on_after(0.3):
            await agent.run("go")

    anyio.run(interrupted)
    return list(session_lines(agent.session))


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"turns": 0}, "after 0 model call(s)"),
        ({"phase": "nowhere"}, "in phase 'nowhere'"),
        ({"usage": {"input_tokens": 1, "output_tokens": 3}}, "its end says it used"),
    ],
)
def test_an_interrupted_runs_end_behind_its_log_is_refused(
    change: dict[str, Any], says: str
) -> None:
    # An interrupted run's end may be ahead of its log (a store that stalled
    # took none of its last steps), never behind it, and names a phase of
    # its machine.
    lines = _interrupted_lines()
    session = anyio.run(load_session, "\n".join(lines))
    (run,) = session.runs
    assert run.outcome == "interrupted"
    assert replay(None, session, run.run_id).ok
    forged = edit_line_of("RunEnded", lambda d: d["data"].update(change))(lines)
    session = anyio.run(load_session, "\n".join(forged))
    report = replay(None, session, run.run_id)
    assert isinstance(report.divergence, LogInconsistent), report
    assert says in str(report.divergence)


def test_an_interrupted_runs_end_ahead_of_its_log_replays() -> None:
    # What a stalled store leaves: the end counts a call and usage its log
    # could not take.
    ahead = {"turns": 2, "usage": {"input_tokens": 30, "output_tokens": 9}}
    forged = edit_line_of("RunEnded", lambda d: d["data"].update(ahead))(
        _interrupted_lines()
    )
    session = anyio.run(load_session, "\n".join(forged))
    (run,) = session.runs
    assert replay(None, session, run.run_id).ok
