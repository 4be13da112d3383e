"""A bad file or value on the command line is one line on stderr, no traceback.

Each error reads ``turnfsm COMMAND: ...``, names the option and the path (or
the value) and what is wrong with it in plain words, and the status is 2.
An output file that cannot be written is refused before the command works.
"""

from __future__ import annotations

import errno
import gzip
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import anyio
import attrs
import pytest

from tests.helpers import REPO_ROOT
from turnfsm.cli import main
from turnfsm.cli._errors import explain
from turnfsm.errors import ConfigError
from turnfsm.persistence import SQLiteStore

Capture = pytest.CaptureFixture[str]


def _one_line(capsys: Capture, command: str, *, quiet: bool = False) -> str:
    out, err = capsys.readouterr()
    if quiet:
        assert out == "", "the command did no work"
    assert "Traceback" not in err
    assert "Errno" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"turnfsm {command}: "), err
    return lines[0]


@pytest.fixture
def session(tmp_path: Path, capsys: Capture, monkeypatch: pytest.MonkeyPatch) -> str:
    """The id of a finished demo session, in the store TURNFSM_STORE names."""
    monkeypatch.setenv("TURNFSM_STORE", str(tmp_path / "s.db"))
    assert main(["demo"]) == 0
    found = re.search(r"session (ses_\w+) stored", capsys.readouterr().out)
    assert found is not None
    return found.group(1)


@pytest.mark.parametrize("option", ["--log", "--trace-file"])
def test_demo_refuses_an_output_file_in_a_missing_directory_before_the_run(
    tmp_path: Path, capsys: Capture, option: str
) -> None:
    path = tmp_path / "missing" / "x.jsonl"
    try:
        status = main(["demo", "--quiet", option, str(path)])
    except SystemExit as exit:  # tracing is set up around the command
        status = exit.code
    assert status == 2
    line = _one_line(capsys, "demo", quiet=True)
    assert f"{option}='{path}'" in line
    assert f"{path.parent} does not exist" in line
    assert not path.parent.exists()


@pytest.mark.parametrize("option", [["--trace"], ["--trace-file", "spans.jsonl"]])
def test_a_durable_demo_refuses_tracing_options_it_cannot_honour(
    tmp_path: Path, capsys: Capture, option: list[str]
) -> None:
    # The run's calls are made in the worker: before, the demo took the
    # option, exported nothing and wrote no file, and said nothing of it.
    path = tmp_path / "spans.jsonl"
    given = [*option[:1], *([str(path)] if len(option) > 1 else [])]
    status = main(["demo", "--durable", "--quiet", *given])
    assert status == 2
    line = _one_line(capsys, "demo", quiet=True)
    assert f"invalid {option[0]}=" in line
    assert "`turnfsm worker`" in line
    assert not path.exists()


def test_the_worker_takes_the_tracing_options() -> None:
    from turnfsm.cli import _parser

    args = _parser().parse_args(
        ["worker", "--task-queue", "q", "--trace", "--trace-file", "spans.jsonl"]
    )
    assert args.trace is True
    assert str(args.trace_file) == "spans.jsonl"


def test_demo_refuses_a_directory_as_its_log(tmp_path: Path, capsys: Capture) -> None:
    assert main(["demo", "--quiet", "--log", str(tmp_path)]) == 2
    line = _one_line(capsys, "demo")
    assert f"--log='{tmp_path}'" in line
    assert "it is a directory" in line


def test_diagram_refuses_an_out_that_is_a_file(tmp_path: Path, capsys: Capture) -> None:
    taken = tmp_path / "taken"
    taken.write_text("mine")
    assert main(["diagram", str(REPO_ROOT / "machines"), "--out", str(taken)]) == 2
    line = _one_line(capsys, "diagram")
    assert f"--out='{taken}'" in line
    assert "it is a file" in line
    assert taken.read_text() == "mine"


def test_diagram_of_a_run_refuses_an_output_in_a_missing_directory(
    tmp_path: Path, capsys: Capture, session: str
) -> None:
    path = tmp_path / "missing" / "x.svg"
    assert main(["diagram", "--run", session, "-o", str(path)]) == 2
    line = _one_line(capsys, "diagram")
    assert f"-o='{path}'" in line
    assert f"{path.parent} does not exist" in line


def test_diagram_passes_on_what_dot_said_when_it_fails(
    tmp_path: Path, capsys: Capture, session: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    dot = bin_dir / "dot"
    dot.write_text("#!/bin/sh\necho 'Error: out of memory' >&2\nexit 1\n")
    dot.chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    path = tmp_path / "x.svg"
    assert main(["diagram", "--run", session, "-o", str(path)]) == 2
    line = _one_line(capsys, "diagram")
    assert f"-o='{path}'" in line
    assert "(dot: Error: out of memory)" in line


def test_simulate_prints_a_turnfsm_error_as_one_line(
    capsys: Capture, session: str
) -> None:
    assert main(["simulate", session, "--window", "10"]) == 2
    line = _one_line(capsys, "simulate")
    assert "invalid --window=10: expected a window of at least" in line
    assert "pinned messages" in line


def test_an_agent_factory_that_raises_is_named_with_its_error(
    tmp_path: Path, capsys: Capture, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "failing_factory.py").write_text(
        "def make():\n    raise ValueError('no API key in the config')\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TURNFSM_STORE", "memory:")
    monkeypatch.delitem(sys.modules, "failing_factory", raising=False)
    assert main(["run", "hi", "--agent", "failing_factory:make"]) == 2
    line = _one_line(capsys, "run")
    assert "--agent='failing_factory:make'" in line
    assert "ValueError: no API key in the config" in line


def test_replay_names_a_missing_log_in_plain_words(
    tmp_path: Path, capsys: Capture
) -> None:
    assert main(["replay", str(tmp_path / "gone.jsonl")]) == 2
    assert _one_line(capsys, "replay").endswith(
        f"{tmp_path / 'gone.jsonl'} does not exist"
    )
    assert main(["replay", str(tmp_path)]) == 2
    assert _one_line(capsys, "replay").endswith(
        f"{tmp_path} is a directory, not a file"
    )


def test_replay_of_a_session_id_given_as_its_log_says_to_use_session(
    tmp_path: Path, capsys: Capture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # It said only "ses_0123 does not exist", true of the file, not of the
    # session the user meant.
    monkeypatch.chdir(tmp_path)
    assert main(["replay", "--store", "s.db", "ses_0123"]) == 2
    line = _one_line(capsys, "replay")
    assert "ses_0123" in line
    assert "--session ses_0123" in line


_NOT_LOGS = {
    "notes.py": "\ufeff\nprint('hello')\n".encode(),
    "log.jsonl.gz": gzip.compress(b'{"format": "x"}\n'),
}
_WHY = {
    "notes.py": "its first line is not JSON: \"print('hello')\"",
    "log.jsonl.gz": "it is gzip-compressed data, not a log's text: decompress it "
    "first (gunzip FILE)",
}


@pytest.mark.parametrize("name", list(_NOT_LOGS))
@pytest.mark.parametrize("command", [["replay"], ["sessions", "import"]])
def test_a_file_that_is_no_session_log_is_named(
    tmp_path: Path,
    capsys: Capture,
    monkeypatch: pytest.MonkeyPatch,
    command: list[str],
    name: str,
) -> None:
    # It said "corrupt session log record at line 1: ...", naming no file;
    # then, naming it, that it "was written by another turnfsm version or
    # changed since", of a file that never was a log (a compressed one too,
    # after the advice to decompress it).
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TURNFSM_STORE", str(tmp_path / "s.db"))
    Path(name).write_bytes(_NOT_LOGS[name])
    assert main([*command, name]) == 2
    line = _one_line(capsys, " ".join(command), quiet=True)
    export = "`turnfsm sessions export` writes it"
    assert (
        line
        == {
            "replay": f"turnfsm replay: invalid LOG={name!r}: expected a session log, "
            f"as {export} ({_WHY[name]})",
            "sessions import": f"turnfsm sessions import: {name} is not a session log "
            f"({_WHY[name]}): expected one, as {export}",
        }[" ".join(command)]
    )


def test_eval_names_a_missing_probe_file_in_plain_words(
    tmp_path: Path, capsys: Capture, session: str
) -> None:
    # It said "([Errno 2] No such file or directory: '...')".
    probes = tmp_path / "probes.toml"
    assert main(["eval", session, "--probes", str(probes)]) == 2
    line = _one_line(capsys, "eval", quiet=True)
    assert line == (
        f"turnfsm eval: invalid --probes='{probes}': expected a readable probe "
        "file (it does not exist)"
    )


def test_sessions_import_names_a_missing_directory(
    tmp_path: Path, capsys: Capture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TURNFSM_STORE", "memory:")
    path = tmp_path / "missing" / "log.jsonl"
    assert main(["sessions", "import", str(path)]) == 2
    line = _one_line(capsys, "sessions import")
    assert line.endswith(f"{path}: the directory {path.parent} does not exist")


@pytest.mark.parametrize(
    "command", [["report", "{id}", "-o"], ["sessions", "export", "{id}", "-o"]]
)
@pytest.mark.parametrize("where", ["missing/x.out", "."])
def test_report_and_export_refuse_an_output_they_cannot_write(
    tmp_path: Path, capsys: Capture, session: str, command: list[str], where: str
) -> None:
    path = tmp_path / where
    args = [a.replace("{id}", session) for a in command] + [str(path)]
    assert main(args) == 2
    line = _one_line(capsys, " ".join(command[:-2]))
    assert f"-o='{path}'" in line
    assert ("does not exist" if where != "." else "it is a directory") in line


def test_the_main_handler_turns_any_os_error_into_one_line(
    capsys: Capture, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fails(_args: object) -> int:
        raise PermissionError(errno.EACCES, "Permission denied", "/x/y")

    monkeypatch.setattr("turnfsm.cli._other", fails)
    assert main(["check", "m.toml"]) == 2
    assert _one_line(capsys, "check") == (
        "turnfsm check: /x/y cannot be opened: permission denied"
    )


def test_a_turnfsm_error_no_command_caught_is_one_line(
    capsys: Capture, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fails(_args: object) -> int:
        raise ConfigError("--window", 0, "an int >= 1")

    monkeypatch.setattr("turnfsm.cli._other", fails)
    assert main(["sessions", "list"]) == 2
    assert _one_line(capsys, "sessions list") == (
        "turnfsm sessions list: invalid --window=0: expected an int >= 1"
    )


def test_explain_words_an_os_error_without_a_path() -> None:
    assert explain(OSError(errno.ENOSPC, "No space left on device")) == (
        "no space left on device"
    )


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (["demo", "--log", ""], "--log"),
        (["demo", "--trace-file", " "], "--trace-file"),
        (["run", "task", "--model", "local", "--machine", ""], "--machine"),
        (["check", ""], "PATH"),
        (["diagram", ""], "machines"),
        (["diagram", "--run", "ses_x", "-o", ""], "-o/--output"),
        (["replay", ""], "log"),
        (["report", "ses_x", "-o", ""], "-o/--output"),
        (["sessions", "export", "ses_x", "-o", ""], "-o/--output/--out"),
        (["sessions", "import", ""], "FILE"),
        (["eval", "--probes", ""], "--probes"),
    ],
    ids=lambda value: " ".join(value) if isinstance(value, list) else None,
)
def test_an_empty_path_is_refused_naming_its_option(
    tmp_path: Path,
    capsys: Capture,
    monkeypatch: pytest.MonkeyPatch,
    argv: list[str],
    option: str,
) -> None:
    # An empty path is the current directory: `turnfsm check ""` checked it,
    # `turnfsm diagram ""` drew the shipped machines, `--log ""` failed with
    # "turnfsm demo:  does not exist".
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TURNFSM_STORE", str(tmp_path / "s.db"))
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert "Traceback" not in err
    value = argv[argv.index(option.split("/")[0]) + 1] if "-" in option else ""
    assert err.splitlines()[-1].endswith(
        f": error: argument {option}: expected a path, not {value!r}"
    ), err
    assert list(tmp_path.iterdir()) == []  # nothing made, nothing drawn


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (["sessions", "show", ""], "ID"),
        (["sessions", "rm", " "], "ID"),
        (["report", "", "-o", "x.html"], "SESSION"),
        (["simulate", ""], "SESSION"),
        (["resume", "", "--model", "openai:x"], "SESSION"),
        (["run", "task", "--model", "openai:x", "--session", ""], "--session"),
        (["replay", "--session", ""], "--session"),
        (["eval", "", "--probes", "p.toml"], "SESSION"),
    ],
    ids=lambda value: " ".join(value) if isinstance(value, list) else None,
)
def test_an_empty_session_id_is_refused_naming_its_argument(
    tmp_path: Path,
    capsys: Capture,
    monkeypatch: pytest.MonkeyPatch,
    argv: list[str],
    option: str,
) -> None:
    # It was refused as "invalid session_id=''": a name the user never typed.
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TURNFSM_STORE", str(tmp_path / "s.db"))
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    value = (
        argv[argv.index(option) + 1]
        if option.startswith("-")
        else argv[2 - (argv[0] != "sessions")]
    )
    assert err.splitlines()[-1].endswith(
        f": error: argument {option}: expected a session id "
        f"(as `turnfsm sessions list` shows it), not {value!r}"
    ), err
    assert "session_id" not in err


@pytest.mark.parametrize(
    ("argv", "option", "what"),
    [
        (["worker", "--task-queue", ""], "--task-queue", "a task queue's name"),
        (
            ["demo", "--durable", "--task-queue", " "],
            "--task-queue",
            "a task queue's name",
        ),
        (["demo", "--durable", "--namespace", ""], "--namespace", "a namespace's name"),
        (
            ["worker", "--task-queue", "q", "--namespace", " "],
            "--namespace",
            "a namespace's name",
        ),
    ],
    ids=lambda value: " ".join(value) if isinstance(value, list) else None,
)
def test_a_blank_task_queue_or_namespace_is_refused_naming_its_option(
    tmp_path: Path,
    capsys: Capture,
    monkeypatch: pytest.MonkeyPatch,
    argv: list[str],
    option: str,
    what: str,
) -> None:
    # A blank task queue was refused as "invalid task_queue=''", a name the
    # user never typed; a blank namespace reached the server and was said
    # as the server lost ("Namespace not set on request.", exit status 1).
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TURNFSM_STORE", str(tmp_path / "s.db"))
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    value = argv[argv.index(option) + 1]
    assert err.splitlines()[-1].endswith(
        f": error: argument {option}: expected {what}, not {value!r}"
    ), err


@pytest.mark.parametrize(
    ("argv", "command", "said"),
    [
        (
            ["run", "task", "--modle", "openai:x"],
            "run",
            "unrecognized arguments: --modle openai:x (did you mean --model?)",
        ),
        (
            ["demo", "--quite"],
            "demo",
            "unrecognized arguments: --quite (did you mean --quiet?)",
        ),
        (["demo", "--window", "10"], "demo", "unrecognized arguments: --window 10"),
        (
            ["sessions", "list", "--bogus"],
            "sessions list",
            "unrecognized arguments: --bogus",
        ),
    ],
)
def test_an_unknown_argument_is_refused_by_its_subcommand(
    capsys: Capture, argv: list[str], command: str, said: str
) -> None:
    # The program's parser refused it: `turnfsm: error: ...` under the
    # program's usage, which lists the subcommands, not their options.
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: turnfsm {command} ")
    assert err.splitlines()[-1] == f"turnfsm {command}: error: {said}"


@pytest.mark.parametrize(
    ("argv", "usage", "said", "hint"),
    [
        (
            # The docs say "summarising"; the option's choice is spelt with z.
            ["demo", "--strategy", "summarising"],
            "turnfsm demo",
            "turnfsm demo: error: argument --strategy: invalid choice: 'summarising'",
            " (did you mean 'summarizing'?)",
        ),
        (
            ["sessions", "lst"],
            "turnfsm sessions",
            "turnfsm sessions: error: argument action: invalid choice: 'lst'",
            " (did you mean 'list'?)",
        ),
        (
            ["rn", "task"],
            "turnfsm",
            "turnfsm: error: argument command: invalid choice: 'rn'",
            " (did you mean 'run'?)",
        ),
        (
            ["demo", "--strategy", "xyz"],
            "turnfsm demo",
            "turnfsm demo: error: argument --strategy: invalid choice: 'xyz'",
            "",  # nothing close: argparse's list alone
        ),
    ],
)
def test_a_misspelt_choice_names_the_one_it_is_close_to(
    capsys: Capture, argv: list[str], usage: str, said: str, hint: str
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: {usage} ")
    line = err.splitlines()[-1]
    assert line.startswith(said)
    assert line.endswith(hint)
    assert ("did you mean" in line) == bool(hint)
    assert "(choose from " in line  # argparse's own list is kept


def test_a_run_on_a_session_another_process_holds_names_the_command_to_take_it(
    session: str, tmp_path: Path, capsys: Capture
) -> None:
    # It said "take it over with force=True": Python's word, no option's;
    # then `turnfsm resume SESSION --force`, without the agent (or the store)
    # the run was given, which resume needs: typed as printed, it was refused.
    async def hold() -> None:
        async with SQLiteStore(tmp_path / "s.db") as store:
            await store.acquire_lease(session, "elsewhere:1:abc", ttl=600)

    anyio.run(hold)
    agent = "tests.cli.compact_agent:agent"
    assert main(["run", "Go on.", "--agent", agent, "--session", session]) == 2
    line = _one_line(capsys, "run", quiet=True)
    assert "is held by 'elsewhere:1:abc'" in line
    assert (
        f"take it over with `turnfsm resume {session} --agent {agent} --force` "
        "only if you know "
        "that process is gone (past "
    ) in line
    assert line.endswith(" UTC, resume and abandon take it over without it)")


class _HeadOne(io.StringIO):
    """Standard output read by ``| head -1``: the reader goes after one line."""

    def write(self, text: str) -> int:
        if "\n" in self.getvalue():
            raise BrokenPipeError(errno.EPIPE, "Broken pipe")
        return super().write(text)


@pytest.mark.parametrize(
    "argv",
    [
        ["sessions", "show", "{session}"],
        ["sessions", "list"],
        ["diagram", "{machines}", "--out", "{tmp}"],
    ],
    ids=lambda argv: " ".join(argv[:2]),
)
def test_a_reader_gone_ends_a_command_quietly_with_status_141(
    session: str,
    tmp_path: Path,
    capsys: Capture,
    monkeypatch: pytest.MonkeyPatch,
    argv: list[str],
) -> None:
    # `turnfsm sessions show ID | head -5` ended now and then with
    # "turnfsm sessions show: broken pipe" and status 2.
    machines = str(REPO_ROOT / "machines")
    words = [w.format(session=session, machines=machines, tmp=tmp_path) for w in argv]
    capsys.readouterr()
    monkeypatch.setattr(sys, "stdout", _HeadOne())

    assert main(words) == 141

    assert capsys.readouterr().err == ""


class _Pipe(io.RawIOBase):
    """An unbuffered pipe (``PYTHONUNBUFFERED``): each write takes 1000 bytes.

    Its reader goes (``| head -c 100``) once `gone_after` bytes are written.
    """

    def __init__(self, gone_after: int | None = None) -> None:
        self.taken = bytearray()
        self.gone_after = gone_after

    def writable(self) -> bool:
        return True

    def write(self, data: object) -> int:
        if self.gone_after is not None and len(self.taken) >= self.gone_after:
            raise BrokenPipeError(errno.EPIPE, "Broken pipe")
        part = bytes(memoryview(data))[:1000]  # type: ignore[arg-type]
        self.taken += part
        return len(part)


def _unbuffered(pipe: _Pipe) -> io.TextIOWrapper:
    return io.TextIOWrapper(pipe, encoding="utf-8", write_through=True)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "argv",
    [["sessions", "export", "{session}"], ["report", "{session}", "-o", "-"]],
    ids=["sessions export", "report"],
)
def test_a_long_output_is_written_whole_to_a_pipe_that_takes_part_of_a_write(
    session: str, capsys: Capture, monkeypatch: pytest.MonkeyPatch, argv: list[str]
) -> None:
    # An unbuffered standard output says how much of a write a pipe took:
    # the export dropped the rest, and ended 0 when the reader had gone.
    words = [w.format(session=session) for w in argv]
    capsys.readouterr()
    pipe = _Pipe()
    monkeypatch.setattr(sys, "stdout", _unbuffered(pipe))

    assert main(words) == 0

    text = pipe.taken.decode("utf-8")
    assert len(text) > 5000
    assert text.rstrip().endswith("}" if argv[0] == "sessions" else "</html>")
    pipe.gone_after = 2000
    pipe.taken.clear()
    capsys.readouterr()
    assert main(words) == 141
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(
    ("agent", "status", "said"),
    [
        (
            "tests.cli.approval_agent:careful",
            3,
            "answer it with: turnfsm approve|reject|abandon ses_",
        ),
        ("tests.cli.compact_agent:agent", 0, "run done: 1 model call(s)"),
    ],
    ids=["paused", "done"],
)
def test_a_run_on_a_full_disk_says_on_stderr_how_it_ended_and_where_it_is(
    tmp_path: Path, agent: str, status: int, said: str
) -> None:
    # `turnfsm run ... > /dev/full`: the run went on and was kept, then the
    # command said only "turnfsm run: no space left on device", with status
    # 2 ("could not start"): nothing named the session, nor its next step.
    store = tmp_path / "s.db"
    command = ["run", "Delete the logs.", "--agent", agent, "--store", str(store)]
    with Path("/dev/full").open("w") as full:
        done = subprocess.run(
            [sys.executable, "-m", "turnfsm", *command],
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            check=False,
        )

    assert done.returncode == status, done.stderr
    first, *rest = done.stderr.splitlines()
    assert first == (
        "turnfsm run: standard output failed (no space left on device); "
        "how the run ended:"
    )
    assert rest[0].startswith("session ses_")
    assert rest[0].endswith(f" stored in {store}")
    assert rest[-1].startswith(said)


def test_a_session_written_since_the_command_read_it_is_to_be_run_again() -> None:
    # A command reads its session anew each time: "reload the session" is
    # what a program does, not a command line user.
    from turnfsm.cli._run import cli_words
    from turnfsm.errors import SessionConflict

    said = cli_words(SessionConflict("ses_1", 8, 15))
    assert said == (
        "session 'ses_1' changed under this writer: expected version 8, found 15; "
        "another writer appended first - run it again"
    )
    # One started by another command at the same moment: the advice on how a
    # program reads a session is no command line user's.
    said = cli_words(SessionConflict("ses_1", 0, 3))
    assert said == "session 'ses_1' was started by another writer - run it again"
    # One removed under the run (turnfsm sessions rm): there is nothing to
    # run again.
    said = cli_words(SessionConflict("ses_1", 6, 0))
    assert "is no longer in the store: it was removed" in said
    assert "run it again" not in said


# The window of `--model local` is its server's, `--n-ctx`: `--window` only
# narrows it. Advice to make it larger names the option that does.
@pytest.mark.parametrize(
    ("flags", "limit", "fix"),
    [
        ({"model": "local", "n_ctx": 100}, 100, "raise --n-ctx or lower --max-tokens"),
        ({"model": "local"}, 4096, "raise --n-ctx or lower --max-tokens"),
        (
            {"model": "local", "n_ctx": 8000, "window": 100},
            100,
            "raise --window or lower --max-tokens",
        ),
        (
            {"model": "http://127.0.0.1:9/v1#m", "n_ctx": 100},
            100,
            "raise --n-ctx or lower --max-tokens",
        ),
        (
            {"model": "http://127.0.0.1:9/v1#m", "window": 100},
            100,
            "raise --window or lower --max-tokens",
        ),
        ({"model": "openai:gpt-4o-mini"}, 128000, "lower --max-tokens"),
    ],
)
def test_the_advice_for_pins_that_do_not_fit_names_the_window_option(
    flags: dict[str, object], limit: int, fix: str
) -> None:
    from turnfsm.cli._run import AgentOptions, cli_words
    from turnfsm.errors import PinnedTooLarge

    error = PinnedTooLarge(limit + 1, limit, pinned=limit - 255, reserved=256)
    said = cli_words(error, AgentOptions(**flags))  # type: ignore[arg-type]
    assert said.endswith(f"-token window: {fix}"), said


def test_a_refusal_on_a_learned_scale_names_it_on_the_command_line() -> None:
    from turnfsm.cli._run import AgentOptions, cli_words
    from turnfsm.errors import PinnedTooLarge

    error = PinnedTooLarge(
        990, 1000, pinned=30, reserved=960, line=950, scale=2.5, reply=256
    )
    said = cli_words(error, AgentOptions(model="local", window=1000))
    assert "is 990 (counted as the provider counts: 2.50x the token counter's" in said
    plain = cli_words(attrs.evolve(error, scale=1.0), AgentOptions(model="local"))
    assert "is 990, on or over the 950-token emergency line" in plain


def test_a_window_over_the_local_servers_names_n_ctx() -> None:
    from turnfsm.cli._run import AgentOptions, cli_words
    from turnfsm.errors import WindowTooLarge

    error = WindowTooLarge("--window", 1000, "at most 100", model="local", window=100)
    said = cli_words(error, AgentOptions(model="local", n_ctx=100, window=1000))
    assert said == (
        "--window=1000 is larger than the local server's window of 100 tokens "
        "(--n-ctx): give at most 100, leave --window unset, or raise --n-ctx"
    )


# A store of your agent's (`--agent`) that never answers: a command that
# reads a session from it gives up after the agent's store_timeout, on one
# line, instead of waiting for ever.
@pytest.mark.parametrize(
    "argv",
    [
        ["run", "go on", "--session", "ses_x"],
        ["resume", "ses_x"],
        ["approve", "ses_x"],
        ["abandon", "ses_x"],
    ],
    ids=["run", "resume", "approve", "abandon"],
)
@pytest.mark.timeout(30)  # it waited for ever
def test_a_store_of_your_agents_that_never_answers_is_given_up(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    agent = ["--agent", "tests.cli.stalling_store_agent:agent"]
    assert main([*argv, *agent]) == 2
    _, err = capsys.readouterr()
    assert err == (
        f"turnfsm {argv[0]}: cannot use StallingStore as a turnfsm session "
        "store: its load did not return within store_timeout=0.2 s (nothing "
        "was changed)\n"
    )


def test_a_postgres_connection_string_as_the_store_is_refused_unshown(
    tmp_path: Path, capsys: Capture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # It was a file path: "a store file that exists" was asked for, the
    # password shown; a writing command made an SQLite file of that name.
    monkeypatch.chdir(tmp_path)
    spec = "host=db.example user=app password=s3cret dbname=app"
    for command in (["sessions", "list"], ["sessions", "rm", "ses_x", "--yes"]):
        assert main([*command, "--store", spec]) == 2
        err = capsys.readouterr().err
        assert "postgresql://USER:PASSWORD@HOST:PORT/DATABASE" in err
        assert "s3cret" not in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("spec", ["memory", "MEMORY:", "sqlite://s.db"])
def test_a_reading_command_names_the_store_a_slip_meant(
    spec: str, tmp_path: Path, capsys: Capture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `run` and `demo` said "did you mean 'memory:'", the reading commands
    # only that no store file was there.
    monkeypatch.chdir(tmp_path)
    assert main(["sessions", "list", "--store", spec]) == 2
    err = capsys.readouterr().err
    assert f"invalid --store='{spec}': " in err
    assert "did you mean " in err
    assert list(tmp_path.iterdir()) == []


# A server that refuses a request as too long (a URL server that does not
# tell its window, so the run drew its lines at the default): the advice
# names the option a command line user sets, not the Python setting.
@pytest.mark.parametrize(
    "error",
    [
        "stalled",
        "exceeded",
    ],
)
def test_a_refused_requests_advice_names_the_window_option(error: str) -> None:
    from turnfsm.cli._run import AgentOptions, cli_words
    from turnfsm.errors import CompactionStalled, ContextExceeded, LargeItem

    said_by_server = "HTTP 400: This model's maximum context length is 512 tokens."
    largest = (LargeItem(kind="message", role="user", turn=1, index=0, tokens=1291),)
    exc: ContextExceeded = (
        CompactionStalled(1307, 1307, provider_message=said_by_server, largest=largest)
        if error == "stalled"
        else ContextExceeded(
            1307, 4096, provider_message=said_by_server, largest=largest
        )
    )
    said = cli_words(exc, AgentOptions(model="http://127.0.0.1:9/v1#m"))
    assert "context_window" not in said, said
    assert "max_output_tokens" not in said, said
    assert "--window" in said, said
    assert said_by_server in said, said
    # Your own agent (--agent) is set in code: the library's words hold.
    own = cli_words(exc, AgentOptions(agent="mod:agent"))
    assert "context_window" in own, own


def test_a_reply_cut_at_the_window_names_the_max_tokens_option_too() -> None:
    from turnfsm.cli._run import AgentOptions, cli_words
    from turnfsm.errors import CompactionStalled

    cut = (
        "the provider cut the reply off at 12 of its 500 tokens: by its count the"
        " request is 3900 input + 500 reply = 4400 tokens > the 4096 window"
    )
    from turnfsm.errors import LargeItem

    largest = (LargeItem(kind="message", role="user", turn=1, index=0, tokens=1291),)
    exc = CompactionStalled(1307, 1307, provider_message=cut, largest=largest)
    said = cli_words(exc, AgentOptions(model="http://127.0.0.1:9/v1#m"))
    assert "lower the reply budget (--max-tokens)" in said, said
    assert "--window to the model's real window" in said, said
    assert "max_output_tokens" not in said, said
    assert "context_window" not in said, said


def test_a_run_the_server_refused_ends_with_the_window_option() -> None:
    import io

    from turnfsm.cli._run import AgentOptions, report_result
    from turnfsm.driver import RunResult
    from turnfsm.errors import CompactionStalled
    from turnfsm.values import Usage

    error = CompactionStalled(1307, 1307, provider_message="HTTP 400: too long")
    result: RunResult[str] = RunResult(
        outcome="failed",
        text="",
        error=error,
        usage=Usage(),
        session_id="ses_1",
        run_id="run_1",
        turns=0,
    )
    out = io.StringIO()
    options = AgentOptions(model="http://127.0.0.1:9/v1#m")
    assert report_result(result, "memory:", options, out) == 1
    ended = out.getvalue().splitlines()[-1]
    assert ended.startswith("run failed: compaction stalled"), ended
    assert "set --window to the model's real window" in ended, ended
    assert "context_window" not in ended, ended


def test_a_reply_cut_off_by_its_budget_names_the_max_tokens_option() -> None:
    from turnfsm.cli._run import AgentOptions, cli_words
    from turnfsm.errors import ProviderError

    error = ProviderError(
        "the reply was cut off at its budget (max_output_tokens=8; finish reason "
        "'length') with no answer yet; raise max_output_tokens",
        kind="max_tokens",
    )
    said = cli_words(error, AgentOptions(model="local"))  # type: ignore[call-arg]
    assert "max_output_tokens" not in said
    assert said.endswith(
        "(--max-tokens=8; finish reason 'length') with no answer yet; "
        "raise --max-tokens"
    )


def test_a_misspelt_shipped_machine_names_the_one_it_is_close_to(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Capture
) -> None:
    # It said only "turnn does not exist": the shipped machines and the
    # closest of them were lost on the way to the command line. Named as
    # the option, as `turnfsm run` names it.
    monkeypatch.chdir(tmp_path)
    assert main(["demo", "--quiet", "--store", "s.db", "--log", "demo.jsonl"]) == 0
    session = re.search(r"ses_\w+", Path("demo.jsonl").read_text())
    assert session is not None
    capsys.readouterr()
    for argv in (
        ["replay", "demo.jsonl"],
        ["simulate", session[0], "--store", "s.db"],
        ["diagram", "-o", "x.svg"],
    ):
        assert main([*argv, "--machine", "turnn"]) == 2
        line = _one_line(capsys, argv[0])
        assert line.endswith(
            "invalid --machine='turnn': expected a machine file, or a shipped "
            "machine's name (turnn does not exist, nor a shipped machine of that "
            "name (approval, compaction, review, turn; did you mean 'turn'?))"
        ), line


def test_every_command_says_what_it_does_in_its_own_help() -> None:
    # `turnfsm demo --help`, `check`, `replay` and `worker` showed only their
    # options: what the command does, and its exit statuses, were left out.
    from tests.docs_tables import subcommands
    from turnfsm.cli import _parser

    commands = subcommands(_parser())
    assert [name for name, sub in commands.items() if not sub.description] == []


@pytest.mark.parametrize("command", ["run", "demo"])
def test_digest_is_refused_with_why_an_agent_does_not_take_it(
    capsys: Capture, command: str
) -> None:
    # `eval` takes it, the docs name it among the shipped compactors: the
    # refusal listed the others and said nothing of why.
    argv = [command, "--strategy", "digest"] + (["task"] if command == "run" else [])
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    line = capsys.readouterr().err.splitlines()[-1]
    assert "invalid choice: 'digest'" in line
    assert line.endswith(
        "(digest alone only shortens old tool results, which cannot bring a long "
        "run back under its window; `turnfsm eval --strategy digest` measures it)"
    )


def test_simulates_strategy_refuses_digest_saying_why() -> None:
    from turnfsm.cli._run import compactor

    with pytest.raises(ConfigError, match="digest alone only shortens") as caught:
        compactor("digest")
    assert (caught.value.field, caught.value.value) == ("--strategy", "digest")


@pytest.mark.parametrize("name", ["out.pdf", "report", "r.txt"])
def test_report_refuses_a_file_that_is_not_html(
    tmp_path: Path, capsys: Capture, session: str, name: str
) -> None:
    # It wrote HTML into out.pdf and said so, with status 0.
    path = tmp_path / name
    assert main(["report", session, "-o", str(path)]) == 2
    line = _one_line(capsys, "report")
    assert line.endswith(
        f"-o='{path}': expected an HTML file (ending .html or .htm), or - for stdout"
    )
    assert not path.exists()
    assert main(["report", session, "-o", str(tmp_path / "R.HTM")]) == 0
