"""`turnfsm sessions` and `--store`: the CLI keeps sessions on disk, shows,
exports, imports and removes them; errors exit 2 with one line."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from tests.helpers import REPO_ROOT, ProtocolStore, restamp
from turnfsm import Agent
from turnfsm.cli import main
from turnfsm.cli._sessions import _list
from turnfsm.context import ContextManager, SummarizingCompactor
from turnfsm.driver import Driver, RetryPolicy, RunControl
from turnfsm.errors import CompactionFailed, CorruptRecord, ProviderError
from turnfsm.messages import ImagePart, Message, Role, TextPart
from turnfsm.persistence import (
    BreakerChanged,
    Committed,
    Entry,
    MemoryStore,
    RunEnded,
    Session,
    SQLiteStore,
    TurnRecord,
    child_sessions,
)
from turnfsm.providers import ModelRequest, ModelResponse
from turnfsm.testing import FakeModelClient, ScriptedModel, reply, tool_call
from turnfsm.tokens import HeuristicTokenCounter
from turnfsm.values import Usage

Capture = pytest.CaptureFixture[str]


def _demo(capsys: Capture, *args: str) -> str:
    """Run the demo; return its session id."""
    assert main(["demo", *args]) == 0
    out = capsys.readouterr().out
    found = re.search(r"session (ses_\w+) stored in (.+)", out)
    assert found is not None, out
    return found.group(1)


def test_the_demo_stores_its_session_in_the_user_data_dir(
    tmp_path: Path, capsys: Capture
) -> None:
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    default = tmp_path / "xdg-data" / "turnfsm" / "sessions.db"
    found = re.search(r"session (ses_\w+) stored in (.+)", out)
    assert found is not None
    assert found.group(2) == str(default)
    assert main(["sessions", "list"]) == 0
    listed = capsys.readouterr().out
    assert found.group(1) in listed
    stamp = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"
    assert re.search(rf"{found.group(1)}\s+{stamp}\s+{stamp}\s+\d+\s+1\s+done", listed)


def test_store_option_and_env_var_choose_the_store(
    tmp_path: Path, capsys: Capture, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "mine.db"
    first = _demo(capsys, "--store", str(db))
    monkeypatch.setenv("TURNFSM_STORE", f"sqlite:///{db}")
    second = _demo(capsys)
    assert main(["sessions", "list"]) == 0
    listed = capsys.readouterr().out
    assert first in listed
    assert second in listed
    assert f"2 session(s) in {db}" in listed
    assert not (tmp_path / "xdg-data" / "turnfsm" / "sessions.db").exists()


def test_quiet_demo_still_prints_only_the_answer(
    tmp_path: Path, capsys: Capture
) -> None:
    assert main(["demo", "--quiet", "--store", str(tmp_path / "q.db")]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("final answer")


def test_show_prints_history_runs_and_compactions(
    tmp_path: Path, capsys: Capture
) -> None:
    store = ["--store", str(tmp_path / "s.db")]
    sid = _demo(capsys, *store)
    assert main(["sessions", "show", sid, *store]) == 0
    out = capsys.readouterr().out
    assert f"session {sid}: " in out
    assert "history (4 messages):" in out
    assert re.search(r"  user\s+Audit app\.log", out)
    assert "[tool calls: read_log]" in out
    # The simulated model reports usage as a provider does (chars / 4).
    assert re.search(r"run_\w+  done  6 turn\(s\)  usage 8263 in / 126 out", out)
    assert "compactions (2):" in out
    assert "threshold_exceeded  compacted" in out
    assert "emergency  compacted" in out


def test_show_says_a_message_held_an_image(tmp_path: Path, capsys: Capture) -> None:
    db = tmp_path / "s.db"

    async def run() -> str:
        async with SQLiteStore(db) as store:
            driver = Driver(model=FakeModelClient(lambda _r: "A receipt."))
            photo = Message(
                role=Role.USER,
                parts=(
                    TextPart(text="What is this?"),
                    ImagePart(url="https://example.com/receipt.png"),
                ),
            )
            session = Session(store=store)
            return (await driver.run([photo], session=session)).session_id

    sid = anyio.run(run)
    assert main(["sessions", "show", sid, "--store", str(db)]) == 0
    assert re.search(r"  user\s+What is this\? \[image\]\n", capsys.readouterr().out)


def test_show_says_which_counts_are_reported_and_which_estimated(
    tmp_path: Path, capsys: Capture
) -> None:
    store = ["--store", str(tmp_path / "s.db")]
    sid = _demo(capsys, *store)
    assert main(["sessions", "show", sid, *store]) == 0
    out = capsys.readouterr().out
    assert "usage 8263 in / 126 out (reported)" in out
    passes = re.findall(r"compacted  (\d+) -> (\d+) tokens \(estimated\)", out)
    assert len(passes) == 2
    assert re.search(
        r"token counts: the provider reported up to 0\.\d\d times turnfsm's "
        r"estimate \(6 call\(s\) with both\)",
        out,
    )


def test_export_jsonl_imports_again_into_another_store(
    tmp_path: Path, capsys: Capture
) -> None:
    one, two = ["--store", str(tmp_path / "1.db")], ["--store", str(tmp_path / "2.db")]
    sid = _demo(capsys, *one)
    log = tmp_path / "s.jsonl"
    assert main(["sessions", "export", sid, "--out", str(log), *one]) == 0
    capsys.readouterr()
    assert main(["sessions", "export", sid, *one]) == 0
    assert capsys.readouterr().out == log.read_text()
    assert main(["sessions", "import", str(log), *two]) == 0
    assert f"imported session {sid}" in capsys.readouterr().out

    async def both() -> tuple[Session, Session]:
        async with (
            SQLiteStore(tmp_path / "1.db") as a,
            SQLiteStore(tmp_path / "2.db") as b,
        ):
            return await Session.load(a, sid), await Session.load(b, sid)

    original, imported = anyio.run(both)
    assert imported.entries == original.entries
    assert list(imported.history) == list(original.history)
    # Importing it twice is refused, and says why.
    assert main(["sessions", "import", str(log), *two]) == 2
    assert "already in" in capsys.readouterr().err


@pytest.mark.parametrize(
    "command",
    [
        ["sessions", "list"],
        ["sessions", "show", "ses_x"],
        ["replay", "--session", "ses_x"],
        ["simulate", "ses_x"],
        ["report", "ses_x", "-o", "r.html"],
    ],
    ids=lambda c: " ".join(c[:2]),
)
def test_a_reading_command_refuses_a_store_file_that_is_not_there(
    tmp_path: Path, capsys: Capture, command: list[str]
) -> None:
    """A mistyped --store leaves no empty database behind."""
    missing = tmp_path / "nothere.db"

    assert main([*command, "--store", str(missing)]) == 2

    assert "invalid --store=" in capsys.readouterr().err
    assert not missing.exists()


def test_export_writes_with_o_as_report_and_diagram_do(
    tmp_path: Path, capsys: Capture
) -> None:
    store = ["--store", str(tmp_path / "1.db")]
    sid = _demo(capsys, *store)
    log = tmp_path / "s.jsonl"

    assert main(["sessions", "export", sid, "-o", str(log), *store]) == 0

    assert log.read_text().startswith("{")


def test_export_json_is_one_document_that_imports_too(
    tmp_path: Path, capsys: Capture
) -> None:
    one, two = ["--store", str(tmp_path / "1.db")], ["--store", str(tmp_path / "2.db")]
    sid = _demo(capsys, *one)
    assert main(["sessions", "export", sid, "--format", "json", *one]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["session_id"] == sid
    # The machine the run began on, then the run.
    assert [e["type"] for e in document["entries"][:2]] == [
        "MachineStored",
        "RunOpened",
    ]
    path = tmp_path / "s.json"
    path.write_text(json.dumps(document))
    assert main(["sessions", "import", str(path), *two]) == 0
    assert main(["sessions", "list", *two]) == 0
    assert sid in capsys.readouterr().out


def test_rm_asks_first_unless_yes(
    tmp_path: Path, capsys: Capture, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = ["--store", str(tmp_path / "s.db")]
    sid = _demo(capsys, *store)
    monkeypatch.setattr("sys.stdin", io.StringIO("n\n"))
    assert main(["sessions", "rm", sid, *store]) == 1
    out = capsys.readouterr().out
    assert f"delete session {sid}" in out
    assert "not deleted" in out
    monkeypatch.setattr("sys.stdin", io.StringIO("y\n"))
    assert main(["sessions", "rm", sid, *store]) == 0
    assert f"deleted session {sid}" in capsys.readouterr().out
    assert main(["sessions", "list", *store]) == 0
    assert "no sessions in" in capsys.readouterr().out
    sid = _demo(capsys, *store)
    assert main(["sessions", "rm", sid, "--yes", *store]) == 0


def _turnfsm(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`turnfsm ARGS` run as a program in `cwd`; its output."""
    return subprocess.run(
        [sys.executable, "-m", "turnfsm", *args],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_rm_killed_while_it_asks_leaves_the_session_free(tmp_path: Path) -> None:
    # `turnfsm sessions rm` held the session for ten minutes while it asked
    # [y/N]: a Ctrl-C (or SIGTERM, SIGHUP) meant as "no" left every run,
    # resume and rm of the session refused until the hold ran out.
    path = tmp_path / "s.db"
    store = ["--store", str(path)]
    done = _turnfsm(tmp_path, "demo", *store)
    (sid,) = re.findall(r"session (ses_\w+) stored in", done.stdout)
    with subprocess.Popen(
        [sys.executable, "-m", "turnfsm", "sessions", "rm", sid, *store],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as asking:
        assert asking.stdout is not None
        assert asking.stdout.read(len("delete session")) == "delete session"
        asking.send_signal(signal.SIGTERM)
        asking.wait(timeout=30)

    again = _turnfsm(tmp_path, "sessions", "rm", sid, "--yes", *store)

    assert again.returncode == 0, again.stderr
    assert f"deleted session {sid}" in again.stdout


@pytest.mark.parametrize("stdin", [None, io.StringIO("")], ids=["closed", "empty"])
def test_rm_with_no_one_to_answer_says_so_and_deletes_nothing(
    tmp_path: Path,
    capsys: Capture,
    monkeypatch: pytest.MonkeyPatch,
    stdin: io.StringIO | None,
) -> None:
    # With standard input closed (`<&-`) it crashed with a traceback
    # ("input(): lost sys.stdin"), keeping the session held ten minutes.
    store = ["--store", str(tmp_path / "s.db")]
    sid = _demo(capsys, *store)
    monkeypatch.setattr("sys.stdin", stdin)

    assert main(["sessions", "rm", sid, *store]) == 1

    out = capsys.readouterr().out
    assert out.endswith(
        "not deleted: no answer (standard input ended); --yes deletes without asking\n"
    )
    assert main(["sessions", "rm", sid, "--yes", *store]) == 0


@pytest.mark.parametrize(
    ("stdin", "said"),
    [(None, "closed"), (io.StringIO(""), "empty")],
    ids=["closed", "empty"],
)
def test_import_from_a_standard_input_with_nothing_says_so(
    tmp_path: Path,
    capsys: Capture,
    monkeypatch: pytest.MonkeyPatch,
    stdin: io.StringIO | None,
    said: str,
) -> None:
    # `turnfsm sessions import - <&-` crashed with a traceback
    # ("'NoneType' object has no attribute 'read'").
    monkeypatch.setattr("sys.stdin", stdin)

    assert main(["sessions", "import", "-", "--store", str(tmp_path / "s.db")]) == 2

    assert capsys.readouterr().err == (
        f"turnfsm sessions import: standard input is {said}: expected a session "
        "log, as `turnfsm sessions export` writes it\n"
    )


def test_rm_refuses_a_session_a_live_run_holds_unless_forced(
    tmp_path: Path, capsys: Capture
) -> None:
    # It deleted the log under the run, which then stopped at its next write.
    path = tmp_path / "s.db"
    store = ["--store", str(path)]
    sid = _demo(capsys, *store)

    async def hold() -> None:
        async with SQLiteStore(path) as db:
            await db.acquire_lease(sid, "worker-7", ttl=600)

    anyio.run(hold)

    assert main(["sessions", "rm", sid, "--yes", *store]) == 2
    err = capsys.readouterr().err
    assert err.startswith("turnfsm sessions rm: ")
    assert "'worker-7'" in err
    assert "force=True" not in err  # the command line's word is --force
    assert err.rstrip().endswith(
        "stop that run first, or delete the session under it with --force"
    )
    assert main(["sessions", "list", *store]) == 0
    assert sid in capsys.readouterr().out
    assert main(["sessions", "rm", sid, "--yes", "--force", *store]) == 0
    assert f"deleted session {sid}" in capsys.readouterr().out


def test_replay_reads_a_stored_session(tmp_path: Path, capsys: Capture) -> None:
    store = ["--store", str(tmp_path / "s.db")]
    sid = _demo(capsys, *store)
    assert main(["replay", "--session", sid, *store]) == 0
    assert "events replayed exactly (done)" in capsys.readouterr().out
    assert main(["replay", "--session", "ses_nope", *store]) == 2
    assert "ses_nope" in capsys.readouterr().err
    assert main(["replay"]) == 2
    assert "missing LOG: expected a session log file, or --session ID" in (
        capsys.readouterr().err
    )


@pytest.mark.parametrize(
    "args",
    [
        ["sessions", "show", "ses_nope"],
        ["sessions", "export", "ses_nope"],
        ["sessions", "rm", "ses_nope", "--yes"],
        ["sessions", "import", "missing.jsonl"],
        ["sessions", "list", "--store", "mysql://x/y"],
        ["sessions", "rm", "ses_x", "--store", "memory:"],
        ["demo", "--store", "nonsense://x"],
        ["run", "task", "--model", "local", "--store", "nonsense://x"],
    ],
    ids=lambda a: " ".join(a[1:3]),
)
def test_errors_exit_2_with_one_line(
    tmp_path: Path, capsys: Capture, monkeypatch: pytest.MonkeyPatch, args: list[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(args) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("turnfsm ")


def test_an_unusable_store_file_exits_2_and_stays_unchanged(
    tmp_path: Path, capsys: Capture
) -> None:
    bad = tmp_path / "notes.txt"
    bad.write_text("my notes\n")
    assert main(["sessions", "list", "--store", str(bad)]) == 2
    assert main(["demo", "--store", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"cannot use {bad} as a turnfsm session store" in err
    assert bad.read_text() == "my notes\n"


def test_a_bad_import_file_names_the_line(tmp_path: Path, capsys: Capture) -> None:
    log = tmp_path / "bad.jsonl"
    log.write_text("{not json\n")
    assert main(["sessions", "import", str(log), "--store", "memory:"]) == 2
    assert "line 1" in capsys.readouterr().err


@pytest.mark.parametrize("given", ["missing", "empty", "cut-short", "not-a-log"])
def test_a_refused_import_leaves_no_store_behind(
    tmp_path: Path, capsys: Capture, given: str
) -> None:
    # A store file with its tables was made at --store, then the file refused.
    log = tmp_path / "log.jsonl"
    if given == "empty":
        log.write_text("")
    elif given == "cut-short":
        assert main(["demo", "--store", str(tmp_path / "demo.db")]) == 0
        session_id = re.findall(r"session (ses_\w+)", capsys.readouterr().out)[0]
        full = tmp_path / "full.jsonl"
        export = [
            "sessions",
            "export",
            session_id,
            "--store",
            str(tmp_path / "demo.db"),
        ]
        assert main([*export, "-o", str(full)]) == 0
        log.write_bytes(full.read_bytes()[:3000])
    elif given == "not-a-log":
        log.write_text("{not json\n")
    target = tmp_path / "new.db"
    capsys.readouterr()

    assert main(["sessions", "import", str(log), "--store", str(target)]) == 2

    assert capsys.readouterr().err.startswith("turnfsm sessions import: ")
    assert not target.exists()


# -- reset-breaker -----------------------------------------------------------


def _history(turns: int, size: int = 900) -> list[Message]:
    out: list[Message] = []
    for i in range(turns):
        out.append(Message.user(f"question {i}: the code is {1000 + i} " + "q" * size))
        out.append(Message.assistant(f"answer {i} " + "a" * size))
    return out


def _down(request: ModelRequest) -> ModelResponse:
    raise ProviderError("summary model down", retryable=False, kind="server")


def _unused(request: ModelRequest) -> ModelResponse:
    raise AssertionError("the agent's model is never called: every pass fails")


def _broken_session(path: Path) -> str:
    """Store a session whose log has 3 failed compaction passes; return its id."""

    async def go() -> str:
        async with SQLiteStore(path) as store:
            driver = Driver(
                model=FakeModelClient(_unused),
                context=ContextManager(
                    SummarizingCompactor(
                        model=FakeModelClient(_down), keep_recent_turns=2
                    ),
                    context_window=4_000,
                    threshold=60,
                    counter=HeuristicTokenCounter(),
                ),
                retry=RetryPolicy(max_attempts=1),
            )
            session = Session(store=store)
            for n in (1, 2, 3):
                result = await driver.run(_history(6), session=session)
                assert result.outcome == "failed"
                assert isinstance(result.error, CompactionFailed), result.error
                assert session.compaction_failures == n
            return session.id

    return anyio.run(go)


def _load(path: Path, sid: str) -> Session:
    async def go() -> Session:
        async with SQLiteStore(path) as store:
            return await Session.load(store, sid)

    return anyio.run(go)


def test_show_prints_the_consecutive_compaction_failures(
    tmp_path: Path, capsys: Capture
) -> None:
    db = tmp_path / "s.db"
    sid = _broken_session(db)
    assert main(["sessions", "show", sid, "--store", str(db)]) == 0
    out = capsys.readouterr().out
    # Three failures in a row opened the breaker (max_failures 3).
    assert "compaction circuit breaker: open after 3 failure(s) in a row" in out
    assert "`turnfsm sessions reset-breaker` closes it" in out
    assert out.count("  failed  ") >= 3  # the runs and their failed passes


def test_show_says_nothing_of_failures_when_there_are_none(
    tmp_path: Path, capsys: Capture
) -> None:
    store = ["--store", str(tmp_path / "s.db")]
    sid = _demo(capsys, *store)
    assert main(["sessions", "show", sid, *store]) == 0
    assert "compaction circuit breaker" not in capsys.readouterr().out


def test_reset_breaker_clears_the_count_and_logs_a_runless_entry(
    tmp_path: Path, capsys: Capture
) -> None:
    db = tmp_path / "s.db"
    sid = _broken_session(db)
    before = _load(db, sid)
    opened = [e for e in before.entries if isinstance(e, BreakerChanged)]
    assert [(e.open, e.failures) for e in opened] == [(True, 3)]
    assert main(["sessions", "reset-breaker", sid, "--store", str(db)]) == 0
    out = capsys.readouterr().out
    assert f"session {sid}: " in out
    assert "breaker reset (3 consecutive failure(s) cleared)" in out
    after = _load(db, sid)
    assert after.compaction_failures == 0
    assert after.version == before.version + 1
    assert after.entries[:-1] == before.entries
    last = after.entries[-1]
    assert isinstance(last, BreakerChanged)
    assert (last.open, last.run_id, last.failures) == (False, "", 3)
    assert last.at > 0
    assert len(after.runs) == 3  # no run was added
    assert main(["sessions", "show", sid, "--store", str(db)]) == 0
    assert "compaction circuit breaker" not in capsys.readouterr().out
    # A second reset clears nothing, and says so.
    assert main(["sessions", "reset-breaker", sid, "--store", str(db)]) == 0
    assert "(0 consecutive failure(s) cleared)" in capsys.readouterr().out


def test_reset_breaker_refuses_a_session_a_live_run_holds(
    tmp_path: Path, capsys: Capture
) -> None:
    # It appended under the run: the run's next write failed with
    # SessionConflict ("changed under this writer"), and the run stopped.
    db = tmp_path / "s.db"
    sid = _broken_session(db)
    before = _load(db, sid)

    async def lease(take: bool) -> object:
        async with SQLiteStore(db) as store:
            if take:
                await store.acquire_lease(sid, "worker-7", ttl=600)
            else:
                await store.release_lease(sid, "worker-7")
            return await store.lease_of(sid)

    anyio.run(lease, True)
    args = ["sessions", "reset-breaker", sid, "--store", str(db)]
    assert main(args) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    err = captured.err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("turnfsm sessions reset-breaker: ")
    assert "'worker-7'" in err
    assert f"turnfsm resume|abandon {sid} --store {db} --force" in err
    assert "force=True" not in err
    assert _load(db, sid).version == before.version  # nothing written

    assert anyio.run(lease, False) is None
    assert main(args) == 0
    assert "(3 consecutive failure(s) cleared)" in capsys.readouterr().out
    assert _load(db, sid).compaction_failures == 0
    assert anyio.run(lease, False) is None  # the command let go of its own


def test_reset_breaker_of_an_unknown_session_exits_2_and_writes_nothing(
    tmp_path: Path, capsys: Capture
) -> None:
    db = tmp_path / "s.db"
    sid = _broken_session(db)
    args = ["sessions", "reset-breaker", "ses_nope", "--store", str(db)]
    assert main(args) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    err = captured.err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("turnfsm sessions reset-breaker: ")
    assert "ses_nope" in err
    assert main(["sessions", "list", "--store", str(db)]) == 0
    listed = capsys.readouterr().out
    assert "ses_nope" not in listed
    assert sid in listed
    assert _load(db, sid).compaction_failures == 3  # the other one is untouched


def test_a_reset_session_exports_and_imports_with_the_reset_kept(
    tmp_path: Path, capsys: Capture
) -> None:
    one, two = tmp_path / "1.db", tmp_path / "2.db"
    sid = _broken_session(one)
    assert main(["sessions", "reset-breaker", sid, "--store", str(one)]) == 0
    log = tmp_path / "s.jsonl"
    export = ["sessions", "export", sid, "--out", str(log), "--store", str(one)]
    assert main(export) == 0
    last_line = json.loads(log.read_text().splitlines()[-1])
    assert last_line["type"] == "BreakerChanged"
    assert main(["sessions", "import", str(log), "--store", str(two)]) == 0
    assert f"imported session {sid}" in capsys.readouterr().out
    original, imported = _load(one, sid), _load(two, sid)
    assert imported.entries == original.entries
    last = imported.entries[-1]
    assert isinstance(last, BreakerChanged)
    assert (last.open, last.run_id) == (False, "")
    assert imported.compaction_failures == 0
    # The JSON document form keeps it too.
    capsys.readouterr()
    assert (
        main(["sessions", "export", sid, "--format", "json", "--store", str(one)]) == 0
    )
    document = json.loads(capsys.readouterr().out)
    assert document["entries"][-1]["type"] == "BreakerChanged"
    path, three = tmp_path / "s.json", tmp_path / "3.db"
    path.write_text(json.dumps(document))
    assert main(["sessions", "import", str(path), "--store", str(three)]) == 0
    assert _load(three, sid).entries == original.entries


def test_an_unreset_session_imports_with_its_breaker_still_open(
    tmp_path: Path, capsys: Capture
) -> None:
    one, two = tmp_path / "1.db", tmp_path / "2.db"
    sid = _broken_session(one)
    log = tmp_path / "s.jsonl"
    export = ["sessions", "export", sid, "--out", str(log), "--store", str(one)]
    assert main(export) == 0
    assert main(["sessions", "import", str(log), "--store", str(two)]) == 0
    capsys.readouterr()
    assert _load(two, sid).compaction_failures == 3
    assert main(["sessions", "show", sid, "--store", str(two)]) == 0
    assert "open after 3 failure(s) in a row" in capsys.readouterr().out


def _load_entries(entries: list[Entry]) -> Session:
    async def go() -> Session:
        store = MemoryStore()
        await store.append("ses_x", entries, expected_version=0)
        return await Session.load(store, "ses_x")

    return anyio.run(go)


def test_load_accepts_a_runless_breaker_reset() -> None:
    reset = BreakerChanged(run_id="", open=False, failures=2, at=1.0)
    session = _load_entries([reset])
    assert session.entries == (reset,)
    assert session.runs == []
    assert session.compaction_failures == 0


@pytest.mark.parametrize(
    "entry",
    [
        Committed(run_id="", keep=0, messages=()),
        TurnRecord(run_id="", turn=1, keep=0, added=(), output="msg_x"),
        RunEnded(run_id="", outcome="done", phase="done"),
        BreakerChanged(run_id="run_nope", open=True, failures=3, at=1.0),
    ],
    ids=lambda e: f"{type(e).__name__}({e.run_id!r})",
)
def test_load_still_rejects_other_entries_without_a_run(entry: Entry) -> None:
    reset = BreakerChanged(run_id="", open=False, failures=0, at=1.0)
    with pytest.raises(CorruptRecord) as raised:
        _load_entries([reset, entry])
    assert raised.value.path == "entries[1]"
    assert "has no RunOpened before it" in raised.value.reason


def test_compact_help_names_the_default_strategy(capsys: Capture) -> None:
    with pytest.raises(SystemExit):
        main(["sessions", "compact", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert (
        "one, MaskingCompactor: it caps and digests tool results, then truncates"
        in shown
    )
    assert "which truncates" not in shown


def test_show_says_when_the_model_reported_no_usage(
    tmp_path: Path, capsys: Capture
) -> None:
    path = tmp_path / "s.db"

    async def once() -> str:
        async with SQLiteStore(path) as store:
            driver = Driver(model=FakeModelClient(lambda r: "hi"))
            result = await driver.run("hello", session=Session(store=store))
            return result.session_id

    out, page = _shown(path, anyio.run(once), capsys)
    assert "1 turn(s)  usage not reported" in out
    assert "(reported)" not in out
    assert "<dt>usage</dt><dd>not reported by the provider</dd>" in page
    assert "0 in / 0 out" not in page


def test_show_and_the_report_say_what_the_prompt_cache_served_as_logged(
    tmp_path: Path, capsys: Capture
) -> None:
    path = tmp_path / "s.db"
    cached = Usage(
        input_tokens=900, output_tokens=5, cache_read_tokens=700, cache_write_tokens=150
    )

    async def once() -> str:
        async with SQLiteStore(path) as store:
            model = FakeModelClient(
                lambda r: ModelResponse(message=reply("hi"), usage=cached)
            )
            session = Session(store=store)
            await Driver(model=model).run("hello", session=session)
            assert session.runs[-1].usage == cached
            return session.id

    out, page = _shown(path, anyio.run(once), capsys)
    said = "900 in (700 read from cache, 150 written to cache) / 5 out (reported)"
    assert said in out
    assert said in page


def _shown(path: Path, sid: str, capsys: Capture) -> tuple[str, str]:
    """What `sessions show` prints of session `sid`, and its report's page."""
    assert main(["sessions", "show", sid, "--store", str(path)]) == 0
    out = capsys.readouterr().out
    report = path.with_suffix(".html")
    assert main(["report", sid, "-o", str(report), "--store", str(path)]) == 0
    return out, report.read_text()


def test_show_says_a_run_that_made_no_model_call_used_nothing(
    tmp_path: Path, capsys: Capture
) -> None:
    # A run refused before its first call (its input alone is over the
    # window) was shown "usage not reported", and the report's page said
    # "0 in / 0 out (reported)": nothing was asked, so nothing was reported.
    path = tmp_path / "s.db"

    async def refused() -> str:
        async with SQLiteStore(path) as store:
            driver = Driver(
                model=FakeModelClient(lambda r: "hi"),
                context=None,
                context_window=50,
            )
            result = await driver.run("hello " * 200, session=Session(store=store))
            assert (result.outcome, result.turns) == ("failed", 0)
            return result.session_id

    out, page = _shown(path, anyio.run(refused), capsys)
    assert "  failed  0 turn(s)  no model call  error: " in out
    assert "usage not reported" not in out
    assert "<dt>usage</dt><dd>none: no model call</dd>" in page


def test_show_says_a_run_whose_model_call_failed_made_one(
    tmp_path: Path, capsys: Capture
) -> None:
    # A run whose first call the provider refused (a bad key) was shown
    # "no model call", as if nothing had been asked of the provider.
    path = tmp_path / "s.db"

    async def refused() -> str:
        async with SQLiteStore(path) as store:
            driver = Driver(
                model=ScriptedModel.of(ProviderError("bad key", kind="auth")),
                context=None,
            )
            result = await driver.run("hello", session=Session(store=store))
            assert (result.outcome, result.turns) == ("failed", 0)
            return result.session_id

    out, page = _shown(path, anyio.run(refused), capsys)
    assert "no model call" not in out
    assert "  failed  0 turn(s)  no model reply: 1 call failed  error: " in out
    assert "<dt>usage</dt><dd>none: no model reply: 1 call failed</dd>" in page


def test_show_does_not_say_no_model_call_of_a_run_cut_short_in_one(
    tmp_path: Path, capsys: Capture
) -> None:
    # A run cancelled while its first model call was out was shown "0
    # turn(s)  no model call": the log keeps no reply, not that none was asked.
    path = tmp_path / "s.db"

    async def cut_short() -> str:
        control = RunControl()

        def answer(request: ModelRequest) -> Message:
            control.cancel("stop")
            return reply("hi")

        async with SQLiteStore(path) as store:
            driver = Driver(model=FakeModelClient(answer))
            result = await driver.run(
                "hello", session=Session(store=store), control=control
            )
            assert (result.outcome, result.turns) == ("cancelled", 0)
            return result.session_id

    out, page = _shown(path, anyio.run(cut_short), capsys)
    assert "no model call" not in out
    assert "  cancelled  0 turn(s)  no model reply  error: " in out
    assert "<dt>usage</dt><dd>none: no model reply</dd>" in page


def test_show_says_in_full_why_a_run_failed_and_what_would_help(
    tmp_path: Path, capsys: Capture
) -> None:
    # The error was cut at 72 characters: "the run reached max_turns=2 without
    # a final answer; raise max_turns o...", and a window overflow's largest
    # items and advice were cut off entirely.
    path = tmp_path / "s.db"

    def look() -> str:
        """Look around."""
        return "nothing yet"

    async def looping() -> str:
        async with SQLiteStore(path) as store:
            model = FakeModelClient(lambda r: reply("", tool_call("look", "c")))
            driver = Driver(model=model, tools=[look], max_turns=2)
            result = await driver.run("hello", session=Session(store=store))
            assert result.outcome == "failed"
            return result.session_id

    out, _ = _shown(path, anyio.run(looping), capsys)
    assert (
        "    error in full: the run reached max_turns=2 without a final answer; "
        "raise max_turns or check the tools for a loop\n"
    ) in out


def test_show_says_how_to_go_on_with_an_interrupted_run(
    tmp_path: Path, capsys: Capture
) -> None:
    # It printed the run's error cut at 72 characters, which cut off how to
    # go on; the view's page said so in full.
    path = tmp_path / "s.db"

    async def slow() -> str:
        """Take a while."""
        await anyio.sleep(60)
        return "done"

    async def cut_off() -> str:
        async with SQLiteStore(path) as store:
            session = Session(store=store)
            model = ScriptedModel.of(reply("", tool_call("slow", "c1")))
            driver = Driver(model=model, tools=[slow])
            with anyio.move_on_after(0.2):
                await driver.run("hello", session=session)
            return session.id

    sid = anyio.run(cut_off)
    out, page = _shown(path, sid, capsys)
    (run,) = anyio.run(_runs_of, path, sid)
    assert f"  {run}  interrupted  1 turn(s)  " in out
    # The commands carry the store they were read from, as the page's do:
    # without it, they read the default store, which has no such session.
    target = f"{sid} {run} --store {path}"
    # And the options that build its agent: without them, `resume` is
    # refused (the log does not say which agent ran it).
    assert (
        f"    carry it on: turnfsm resume {target} with the options that built "
        "its agent (--agent MODULE:ATTR, or --model ...), or end it: "
        f"turnfsm abandon {target}\n"
    ) in out
    assert f"turnfsm resume {target}" in page


async def _runs_of(path: Path, sid: str) -> list[str]:
    async with SQLiteStore(path) as store:
        return [r.run_id for r in (await Session.load(store, sid)).runs]


def test_show_says_how_many_times_a_durable_run_continued_as_new(
    tmp_path: Path, capsys: Capture
) -> None:
    # A long durable run moves to a fresh Temporal history now and then: its
    # log marks each move, and `show` counts them instead of saying nothing.
    from turnfsm import Agent
    from turnfsm.driver import BUILTIN_EFFECTS
    from turnfsm.errors import ContinuedAsNew

    moved: list[int] = []

    async def call_llm(ctx: object, decision: object) -> object:
        if len(moved) < 2:  # as a durable run's step stops, twice
            moved.append(1)
            raise ContinuedAsNew(
                workflow_id="turnfsm-x", history_events=21, history_bytes=999
            )
        return await BUILTIN_EFFECTS["call_llm"](ctx, decision)

    db = tmp_path / "s.db"
    agent = Agent(
        model=ScriptedModel.of("done"),
        store=SQLiteStore(db),
        effects={"call_llm": call_llm},
    )

    async def run() -> str:
        result = await agent.run("hi")
        while result.outcome == "interrupted":
            result = await agent.resume(agent.session.id, result.run_id)
        assert result.outcome == "done"
        return agent.session.id

    sid = anyio.run(run)
    assert main(["sessions", "show", sid, "--store", str(db)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"run_\w+  done  1 turn\(s\)", out)
    assert "its durable run's workflow continued as new 2 time(s)" in out
    # The run's record counts them, and the report says so too.
    from turnfsm.view import render_report

    session = anyio.run(Session.load, SQLiteStore(db), sid)
    assert [r.continued for r in session.runs] == [2]
    assert "continued as new 2 time(s)" in render_report(session)


def wipe(path: str) -> str:
    """Wipe a file.

    Args:
        path: the file.
    """
    return "wiped"


def _wiping_agent(store: SQLiteStore, *replies: object) -> Agent:
    """An agent whose `wipe` tool waits for approval, answering with `replies`."""
    from turnfsm import approval_machine

    return Agent(
        model=ScriptedModel.of(*replies),  # type: ignore[arg-type]
        tools=[wipe],
        machine=approval_machine(),
        store=store,
    )


def test_show_names_the_workflow_holding_a_paused_durable_run(
    tmp_path: Path, capsys: Capture
) -> None:
    # `turnfsm approve` is refused on a session its durable run's workflow
    # holds: `show` says who holds it and how it is answered.
    db = tmp_path / "s.db"
    store = SQLiteStore(db)
    agent = _wiping_agent(store, reply("", tool_call("wipe", "c1", path="/x")), "ok")

    async def run() -> str:
        result = await agent.run("wipe it")
        assert result.outcome == "paused"
        sid = agent.session.id
        await store.acquire_lease(sid, f"temporal:turnfsm-{sid}", ttl=3600.0)
        return sid

    sid = anyio.run(run)
    assert main(["sessions", "show", sid, "--store", str(db)]) == 0
    out = capsys.readouterr().out
    assert f"is held by its durable run, Temporal workflow 'turnfsm-{sid}'" in out
    assert (
        f"turnfsm resume|abandon {sid} --store {db} --force only once that workflow "
        "has ended" in out
    )
    assert "answer it: turnfsm approve" not in out


@pytest.mark.parametrize("times", [True, False], ids=["store says", "store silent"])
def test_sessions_list_lists_the_newest_and_says_how_many_it_left_out(
    tmp_path: Path, times: bool
) -> None:
    # Every session was read and listed: on a large store, minutes of reading
    # and thousands of lines for the few sessions wanted.
    db = tmp_path / "s.db"

    async def listing(limit: int | None) -> tuple[list[str], str, int]:
        async with SQLiteStore(db) as inner:
            store = ProtocolStore(inner, times=times)
            out = io.StringIO()
            assert await _list(store, out, limit) == 0  # type: ignore[arg-type]
        lines = out.getvalue().splitlines()
        return [line.split()[0] for line in lines[1:-1]], lines[-1], len(store.loaded)

    async def write() -> list[str]:
        made = []
        async with SQLiteStore(db) as store:
            agent = Agent(model=FakeModelClient(lambda _r: reply("ok")), store=store)
            for _ in range(5):
                result = await agent.run("hi", session=Session(store=store))
                made.append(result.session_id)
        return made

    made = anyio.run(write)
    newest, said, loads = anyio.run(listing, 2)
    assert newest == made[:-3:-1]
    assert said == (
        "2 of 5 session(s) in ProtocolStore, newest first (--limit all lists every one)"
    )
    assert loads == (2 if times else 5)  # only the newest read, when the store says
    every, said, _ = anyio.run(listing, None)
    assert every == made[::-1]
    assert said == "5 session(s) in ProtocolStore, newest first"


def test_sessions_list_refuses_a_limit_that_is_no_count(capsys: Capture) -> None:
    assert main(["sessions", "list", "--limit", "0"]) == 2
    assert capsys.readouterr().err == (
        "turnfsm sessions list: invalid --limit='0': expected a whole number of "
        "sessions from 1 up, or all\n"
    )


def test_sessions_alone_takes_list_s_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Capture
) -> None:
    # `turnfsm sessions --limit 1` said "argument action: invalid choice: '1'".
    db = tmp_path / "s.db"
    monkeypatch.setenv("TURNFSM_STORE", str(db))

    async def write() -> None:
        async with SQLiteStore(db) as store:
            agent = Agent(model=FakeModelClient(lambda _r: reply("ok")), store=store)
            for _ in range(2):
                await agent.run("hi", session=Session(store=store))

    anyio.run(write)
    assert main(["sessions", "list", "--limit", "1"]) == 0
    listed = capsys.readouterr()
    assert main(["sessions", "--limit", "1"]) == 0
    assert capsys.readouterr() == listed
    assert listed.out.splitlines()[-1] == (
        f"1 of 2 session(s) in {db}, newest first (--limit all lists every one)"
    )
    assert main(["sessions", "--limit", "1", "show", "ses_1"]) == 2
    assert capsys.readouterr().err == (
        "turnfsm sessions show: invalid --limit='1': expected it only with "
        "`sessions` alone or `sessions list` (`sessions show` lists nothing)\n"
    )


def test_sessions_alone_lists_the_default_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Capture
) -> None:
    # A bare `turnfsm sessions` stopped at "the following arguments are
    # required: action": a newcomer's first try after the demo.
    db = tmp_path / "s.db"
    monkeypatch.setenv("TURNFSM_STORE", str(db))

    async def write() -> str:
        async with SQLiteStore(db) as store:
            agent = Agent(model=FakeModelClient(lambda _r: reply("ok")), store=store)
            result = await agent.run("hi", session=Session(store=store))
            return result.session_id

    sid = anyio.run(write)
    assert main(["sessions"]) == 0
    alone = capsys.readouterr()
    assert main(["sessions", "list"]) == 0
    listed = capsys.readouterr()
    assert (alone.out, alone.err) == (listed.out, listed.err)
    assert alone.out.splitlines()[1].split()[0] == sid
    assert alone.out.splitlines()[-1] == f"1 session(s) in {db}, newest first"
    # `--store` goes before the action too, or with no action at all.
    monkeypatch.delenv("TURNFSM_STORE")
    for args in (["--store", str(db)], ["--store", str(db), "list"]):
        assert main(["sessions", *args]) == 0
        assert capsys.readouterr().out == listed.out
    assert main(["sessions", "--store", str(db), "show", sid]) == 0
    assert capsys.readouterr().out.startswith(f"session {sid}: ")


def test_show_prints_what_an_unfinished_run_holds_beyond_the_history(
    tmp_path: Path, capsys: Capture
) -> None:
    # A first run stopped before it finished showed `history (0 messages)`,
    # as if what was said were lost; its log holds it.
    db = tmp_path / "s.db"
    store = SQLiteStore(db)
    agent = _wiping_agent(
        store, "first answer", reply("", tool_call("wipe", "c1", path="/x")), "ok"
    )

    async def run() -> tuple[str, str]:
        assert (await agent.run("hello")).outcome == "done"
        result = await agent.run("wipe it")
        assert result.outcome == "paused"
        await store.aclose()
        return agent.session.id, result.run_id

    sid, run_id = anyio.run(run)
    assert main(["sessions", "show", sid, "--store", str(db)]) == 0
    out = capsys.readouterr().out
    held = out.split("\nruns (2):")[0].split("history (2 messages):\n")[1]
    assert held == (
        "  user      hello\n"
        "  assistant first answer\n"
        f"\n2 more in its unfinished run {run_id} (kept in its log; the history "
        "takes them if the run finishes):\n"
        "  user      wipe it\n"
        "  assistant [tool calls: wipe]\n"
    )
    assert main(["abandon", sid, "--store", str(db)]) == 0
    capsys.readouterr()
    assert main(["sessions", "show", sid, "--store", str(db)]) == 0
    assert "more in its unfinished run" not in capsys.readouterr().out  # it ended


def cat_file(path: str) -> str:
    """Read a file.

    Args:
        path: the file's path.
    """
    return "\x1b]0;owned\x07\x1b[2J\x1b[31mred\x1b[0m\tover \u202etxt.exe\rgone"


def test_show_prints_the_log_s_control_characters_as_escapes(
    tmp_path: Path, capsys: Capture
) -> None:
    """A tool result, a task or a reply holding terminal escapes (clear the
    screen, set the title, colour, carriage return, a right-to-left override)
    is shown as the escapes' text: the terminal runs none of them."""
    db = tmp_path / "s.db"

    async def run() -> str:
        async with SQLiteStore(db) as store:
            agent = Agent(
                model=ScriptedModel.of(
                    reply("", tool_call("cat_file", "c1", path="x")),
                    "done \x1b[5mblink",
                ),
                tools=[cat_file],
                store=store,
            )
            return (await agent.run("read \x1b[41mit")).session_id

    sid = anyio.run(run)
    assert main(["sessions", "show", sid, "--store", str(db)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out
    assert "\x07" not in out
    assert "\r" not in out
    assert "\u202e" not in out
    assert "read \\x1b[41mit" in out
    shown = (
        "[c1] \\x1b]0;owned\\x07\\x1b[2J\\x1b[31mred\\x1b[0m\\tover \\u202etxt.exe\n"
    )
    assert shown in out
    assert "done \\x1b[5mblink" in out


def test_show_prints_a_sub_agent_s_call_id_s_control_characters_as_escapes(
    tmp_path: Path, capsys: Capture
) -> None:
    """The id of the call that started a sub-agent is the model's: shown as text."""
    db = tmp_path / "s.db"

    async def run() -> tuple[str, str]:
        async with SQLiteStore(db) as store:
            helper = Agent(model=ScriptedModel.of("read it"))
            lead = Agent(
                model=ScriptedModel.of(
                    reply("", tool_call("helper", "c\x1b[2J1", task="Read.")),
                    "done",
                ),
                tools=[helper.as_tool(name="helper", description="Read a page")],
                store=store,
            )
            await lead.run("go")
            (child,) = await child_sessions(store, lead.session.id)
            return lead.session.id, child.id

    lead, child = anyio.run(run)
    for sid in (lead, child):
        assert main(["sessions", "show", sid, "--store", str(db)]) == 0
        out = capsys.readouterr().out
        assert "\x1b" not in out
        assert "c\\x1b[2J1" in out


def _odd_text_session(db: Path) -> str:
    """A session whose id and messages hold a lone surrogate and non-ASCII text."""

    def listing(folder: str) -> str:
        """List a folder.

        Args:
            folder: the folder.
        """
        return "caf\udce9.txt \u00fc \u65e5\u672c"

    async def run() -> str:
        async with SQLiteStore(db) as store:
            agent = Agent(
                model=ScriptedModel.of(
                    reply("", tool_call("listing", "c1", folder=".")), "one file"
                ),
                tools=[listing],
                store=store,
            )
            session = await Session.open(store, "caf\udce9.txt")
            await agent.run("list caf\udce9", session=session)
            return session.id

    return anyio.run(run)


def _terminal(monkeypatch: pytest.MonkeyPatch, encoding: str) -> io.TextIOWrapper:
    """Stand in a standard output of `encoding` that refuses what it cannot encode."""
    stdout = io.TextIOWrapper(io.BytesIO(), encoding=encoding, errors="strict")
    monkeypatch.setattr("sys.stdout", stdout)
    return stdout


def _written(stdout: io.TextIOWrapper) -> bytes:
    stdout.flush()
    buffer = stdout.buffer
    assert isinstance(buffer, io.BytesIO)
    return buffer.getvalue()


@pytest.mark.parametrize("encoding", ["ascii", "cp1252", "utf-8"])
def test_export_to_standard_output_writes_the_utf8_log_whatever_its_encoding(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, encoding: str
) -> None:
    # `turnfsm sessions export ID > s.jsonl` from a terminal whose encoding
    # holds no Japanese (Windows' cp1252, PYTHONIOENCODING=ascii) failed
    # with a UnicodeEncodeError traceback, writing nothing.
    store = ["--store", str(tmp_path / "1.db")]
    sid = _odd_text_session(tmp_path / "1.db")
    log = tmp_path / "s.jsonl"
    assert main(["sessions", "export", sid, "-o", str(log), *store]) == 0
    stdout = _terminal(monkeypatch, encoding)

    assert main(["sessions", "export", sid, *store]) == 0

    assert _written(stdout) == log.read_bytes()
    two = ["--store", str(tmp_path / "2.db")]
    assert main(["sessions", "import", str(log), *two]) == 0


def test_list_show_and_import_print_a_lone_surrogate_on_a_strict_utf8_terminal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A session id or a message holding a lone surrogate (a file name that
    # was not UTF-8) made `sessions list`, `show`, `export -o` and `import`
    # fail with a UnicodeEncodeError traceback on a terminal in a UTF-8
    # locale such as en_US.UTF-8; they print it as its escape now.
    store = ["--store", str(tmp_path / "1.db")]
    sid = _odd_text_session(tmp_path / "1.db")
    stdout = _terminal(monkeypatch, "utf-8")
    log = tmp_path / "s.jsonl"
    two = ["--store", str(tmp_path / "2.db")]

    assert main(["sessions", "list", *store]) == 0
    assert main(["sessions", "show", sid, *store]) == 0
    assert main(["sessions", "export", sid, "-o", str(log), *store]) == 0
    assert main(["sessions", "import", str(log), *two]) == 0

    out = _written(stdout).decode("utf-8")
    assert out.count("caf\\udce9.txt") >= 4, out
    assert "list caf\\udce9" in out
    assert "\u00fc \u65e5\u672c" in out


def _delegating(db: Path) -> tuple[str, str]:
    """A session whose run gave a task to a sub-agent; its id and the sub-agent's."""

    def delegate(request: ModelRequest) -> Message:
        last = request.messages[-1]
        if last.tool_results:
            return reply("the helper said " + last.tool_results[0].content)
        return reply("", tool_call("helper", "w1", task="look"))

    async def run() -> str:
        async with SQLiteStore(db) as store:
            helper = Agent(model=ScriptedModel.of("seen")).as_tool(
                name="helper", description="Looks."
            )
            agent = Agent(model=FakeModelClient(delegate), tools=[helper], store=store)
            return (await agent.run("delegate")).session_id

    sid = anyio.run(run)
    (child,) = anyio.run(_children_of, db, sid)
    return sid, child


def test_export_names_the_sub_agents_sessions_it_leaves_out(
    tmp_path: Path, capsys: Capture
) -> None:
    # A session whose run delegated to a sub-agent exported without a word
    # of the sub-agent's session: imported elsewhere, its work was gone.
    db = tmp_path / "1.db"
    sid, child = _delegating(db)
    one, two = ["--store", str(db)], ["--store", str(tmp_path / "2.db")]
    log = tmp_path / "s.jsonl"

    assert main(["sessions", "export", sid, "-o", str(log), *one]) == 0
    out = capsys.readouterr().out
    assert "sub-agents ran in 1 session(s) of their own, not in this log" in out
    command = f"turnfsm sessions export {child} --store {db} -o {child}.jsonl"
    assert command in out
    assert main(["sessions", "export", sid, *one]) == 0  # the log on stdout
    captured = capsys.readouterr()
    assert captured.out.encode() == log.read_bytes()
    assert command in captured.err
    # Both imported, the session shows its sub-agent's as before.
    assert (
        main(["sessions", "export", child, "-o", str(tmp_path / "c.jsonl"), *one]) == 0
    )
    assert main(["sessions", "import", str(log), *two]) == 0
    assert main(["sessions", "import", str(tmp_path / "c.jsonl"), *two]) == 0
    capsys.readouterr()
    assert main(["sessions", "show", sid, *two]) == 0
    assert f"sub-agent sessions (1):\n  {child}" in capsys.readouterr().out


async def _children_of(db: Path, session_id: str) -> list[str]:
    async with SQLiteStore(db) as store:
        return [s.id for s in await child_sessions(store, session_id)]


def test_import_over_a_stored_session_says_what_the_store_holds(
    tmp_path: Path, capsys: Capture
) -> None:
    # Every refusal said "`turnfsm sessions rm` it first to import it again",
    # also of a store holding another conversation under that id, which that
    # would have deleted.
    async def stored(db: Path, text: str) -> None:
        async with SQLiteStore(db) as store:
            agent = Agent(model=ScriptedModel.of("noted"), store=store)
            await agent.run(text, session=await Session.open(store, "ses_same"))

    anyio.run(stored, tmp_path / "1.db", "one")
    anyio.run(stored, tmp_path / "2.db", "another")
    log, part = tmp_path / "s.jsonl", tmp_path / "part.jsonl"
    assert (
        main(["sessions", "export", "ses_same", "-o", str(log), *_at(tmp_path, 1)]) == 0
    )
    # An export of the session when it held its first 4 entries.
    part.write_text("\n".join(restamp(log.read_text().splitlines()[:5])) + "\n")
    assert main(["sessions", "import", str(part), *_at(tmp_path, 3)]) == 0
    capsys.readouterr()

    said = {}
    for name, file, db in [
        ("same", log, 1),
        ("newer", part, 1),
        ("older", log, 3),
        ("another", log, 2),
    ]:
        assert main(["sessions", "import", str(file), *_at(tmp_path, db)]) == 2
        captured = capsys.readouterr()
        assert captured.out == ""
        assert captured.err.startswith("turnfsm sessions import: session ses_same")
        assert captured.err.count("\n") == 1
        said[name] = captured.err

    assert f"the same log as {log} (8 entries): nothing imported" in said["same"]
    assert (
        f"has gone on since {part} was exported (8 entries, the file's 4"
        in (said["newer"])
    )
    assert (
        f"an older copy of {log}'s log (4 of its 8 entries); `turnfsm "
        in (said["older"])
    )
    assert "rm` it first to import the whole log" in said["older"]
    assert (
        "another log under that id (8 entries; its entry 2 differs" in (said["another"])
    )
    assert "`turnfsm sessions rm` would delete that session" in said["another"]
    for name in ("same", "newer", "another"):
        assert "rm` it first" not in said[name]


def _at(tmp_path: Path, n: int) -> list[str]:
    return ["--store", str(tmp_path / f"{n}.db")]


def test_a_damaged_sub_agent_session_hides_nothing_of_its_caller(
    tmp_path: Path, capsys: Capture
) -> None:
    # `sessions show`, `replay --session` and `report` of a sound session
    # whose sub-agent's session was damaged failed whole (replay replayed
    # nothing, report wrote nothing), and `export` failed after writing the
    # file.
    db = tmp_path / "1.db"
    sid, child = _delegating(db)
    with sqlite3.connect(db) as connection:
        connection.execute(
            "UPDATE turnfsm_entries SET body = '{oops' WHERE session_id = ?"
            " AND seq = 3",
            (child,),
        )
    log = tmp_path / "s.jsonl"
    damaged = f"corrupt Entry record at sessions['{child}'].entries[3]"

    assert main(["sessions", "export", sid, "-o", str(log), "--store", str(db)]) == 0
    out = capsys.readouterr().out
    assert f"session {sid}: 12 entries written to {log}" in out
    assert damaged in out
    assert main(["sessions", "show", sid, "--store", str(db)]) == 1
    out = capsys.readouterr().out
    assert "history (4 messages)" in out
    assert f"sub-agent sessions: one cannot be read: {damaged}" in out
    assert main(["replay", "--session", sid, "--store", str(db)]) == 2
    captured = capsys.readouterr()
    assert "events replayed exactly (done)" in captured.out
    assert captured.err.startswith(
        f"turnfsm replay: a sub-agent session of {sid} cannot be read"
    )
    assert damaged in captured.err
    report = tmp_path / "r.html"
    assert main(["report", sid, "-o", str(report), "--store", str(db)]) == 1
    captured = capsys.readouterr()
    assert captured.out.startswith(f"wrote {report} (session {sid}: 1 run(s)")
    assert captured.err.startswith(
        f"turnfsm report: a sub-agent session of {sid} cannot be read, and is "
        "not in the report: "
    )
    assert report.read_text().count("delegate") >= 1


def test_an_imported_session_id_s_terminal_escapes_are_printed_as_text(
    tmp_path: Path, capsys: Capture
) -> None:
    # A log from elsewhere may name its session anything: `import`, `list`,
    # `show`, `export`, `replay` and `rm` printed its id as it was, so
    # importing a file could clear the screen or set the terminal's title.
    hostile = "\x1b]0;owned\x07\x1b[2Jses\u202e_1"
    db = tmp_path / "1.db"

    async def run() -> None:
        async with SQLiteStore(db) as store:
            agent = Agent(model=ScriptedModel.of("hi"), store=store)
            await agent.run("hello", session=Session(hostile, store=store))

    anyio.run(run)
    store = ["--store", str(db)]
    log, other = tmp_path / "s.jsonl", ["--store", str(tmp_path / "2.db")]
    outs = []
    assert main(["sessions", "export", hostile, "-o", str(log), *store]) == 0
    outs.append(capsys.readouterr().out)
    for command in (
        ["sessions", "import", str(log), *other],
        ["sessions", "list", *other],
        ["sessions", "show", hostile, *other],
        ["replay", "--session", hostile, *other],
        ["sessions", "rm", hostile, "--yes", *other],
    ):
        assert main(command) == 0, command
        outs.append(capsys.readouterr().out)

    shown = "\\x1b]0;owned\\x07\\x1b[2Jses\\u202e_1"
    for out in outs:
        assert shown in out or "replayed exactly" in out, out
        assert "\x1b" not in out
        assert "\x07" not in out
        assert "\u202e" not in out


def test_a_session_id_s_terminal_escapes_are_text_in_every_command(
    tmp_path: Path, capsys: Capture
) -> None:
    # `report`, `view`, `simulate` and `eval` printed the id as it was.
    import threading

    from turnfsm.cli._run import AgentOptions
    from turnfsm.cli._view import run_view

    hostile = "\x1b]0;owned\x07\x1b[2Jses\u202e_1"
    db = tmp_path / "1.db"

    async def run() -> None:
        async with SQLiteStore(db) as store:
            agent = Agent(model=ScriptedModel.of("hi"), store=store)
            await agent.run("hello", session=Session(hostile, store=store))

    anyio.run(run)
    store = ["--store", str(db)]
    probes = tmp_path / "probes.toml"
    probes.write_text('[[probe]]\nkind = "fact"\nquestion = "q?"\nexpect = "hi"\n')
    commands = [
        ["report", hostile, "-o", str(tmp_path / "r.html")],
        ["simulate", hostile],
        ["eval", hostile, "--probes", str(probes), "--strategy", "truncating"],
    ]
    outs = []
    for command in commands:
        main([*command, *store, *(["--progress"] if command[0] == "eval" else [])])
        outs.append(capsys.readouterr())
    stop = threading.Event()
    stop.set()
    options = AgentOptions(store=str(db))
    assert run_view(hostile, options, open_browser=False, stop=stop) == 0
    outs.append(capsys.readouterr())

    shown = "\\x1b]0;owned\\x07\\x1b[2Jses\\u202e_1"
    for out in outs:
        assert shown in out.out, out
        assert "\x1b" not in out.out + out.err
        assert "\u202e" not in out.out + out.err


@pytest.mark.parametrize("at", [float("inf"), float("nan"), 1e20])
def test_a_time_no_calendar_holds_is_listed_as_unknown(
    tmp_path: Path, capsys: Capture, at: float
) -> None:
    # A log may hold one (a reset stamped by hand): `list` and `show` raised
    # the calendar's OverflowError or ValueError.
    path = tmp_path / "s.db"

    async def write() -> str:
        async with SQLiteStore(path) as store:
            agent = Agent(model=ScriptedModel.of("x"), store=store)
            await agent.run("hi")
            stamp = BreakerChanged(run_id="", open=False, failures=0, at=at)
            await agent.session.append(stamp)
            return agent.session.id

    session_id = anyio.run(write)
    assert main(["sessions", "list", "--store", str(path)]) == 0
    listed = capsys.readouterr().out  # its start, and the last time it can say
    assert re.search(rf"{session_id} +\d{{4}}-\d\d-\d\d [\d:]+ ", listed)
    assert main(["sessions", "show", session_id, "--store", str(path)]) == 0
