"""Ctrl-C and refusals at start, as a newcomer meets them on the command line.

Ctrl-C is a SIGINT the model double sends its own process while it thinks:
`turnfsm run` and `turnfsm demo` share one way of taking it (the run is logged
interrupted, a hint says how to go on or end it, exit status 130). The hint
is parsed back with the command line's own parser: it must name the agent the
run had, every option of it.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import attrs
import pytest

from tests.helpers import REPO_ROOT
from turnfsm import cli
from turnfsm.cli import _options, _parser, main
from turnfsm.cli._demo_model import SimulatedModel
from turnfsm.cli._run import AgentOptions
from turnfsm.persistence import Session, SQLiteStore
from turnfsm.providers import ModelRequest, ModelResponse
from turnfsm.testing import FakeModelClient

Capture = pytest.CaptureFixture[str]


async def _ctrl_c_while_thinking(request: ModelRequest) -> str:
    """Press Ctrl-C (SIGINT to this process), then think until cancelled."""
    os.kill(os.getpid(), signal.SIGINT)
    await anyio.sleep(30)
    raise AssertionError("Ctrl-C did not interrupt the run")


@pytest.fixture
def ctrl_c_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every `--model` is a model double that Ctrl-C interrupts."""

    @contextlib.contextmanager
    def open_model(spec: str, **_: Any) -> Iterator[tuple[Any, int]]:
        yield FakeModelClient(_ctrl_c_while_thinking), 8_000

    monkeypatch.setattr("turnfsm.cli._run.open_model", open_model)


def _hint(out: str, command: str) -> list[str]:
    """The `turnfsm COMMAND ...` the interrupted run's hint prints, as argv."""
    hints = ("run interrupted", "exited at once")
    line = next(li for li in out.splitlines() if li.startswith(hints))
    start = line.index(f"turnfsm {command} ")
    words = shlex.split(line[start:].removesuffix(")"))
    end = words.index("(or") if "(or" in words else len(words)
    return words[1:end]


def _sessions(store: Path) -> list[str]:
    """The ids of the sessions `store` keeps."""

    async def listed() -> list[str]:
        async with SQLiteStore(store) as opened:
            return [info.id for info in await opened.list_sessions()]

    return anyio.run(listed)


def _stored(store: Path, session_id: str) -> Session:
    async def load() -> Session:
        async with SQLiteStore(store) as opened:
            return await Session.load(opened, session_id)

    return anyio.run(load)


@pytest.mark.usefixtures("ctrl_c_model")
def test_ctrl_c_s_resume_command_repeats_every_option_of_the_run(
    tmp_path: Path, capsys: Capture
) -> None:
    store = tmp_path / "s.db"
    given = {
        "--model": "http://127.0.0.1:9/v1#m",
        "--tools": "tests.cli.approval_agent:delete_file",
        "--machine": str(REPO_ROOT / "machines" / "turn.toml"),
        "--strategy": "truncating",
        "--system": "Be brief, please.",
        "--window": "4000",
        "--n-ctx": "2048",
        "--max-tokens": "24",
        "--model-timeout": "30",
        "--max-turns": "7",
        "--store": str(store),
    }
    argv = ["run", "Delete the logs.", *[w for pair in given.items() for w in pair]]
    ran = _options(_parser().parse_args(argv))
    # Every option that shapes a built agent is given (a new one must be too).
    unset = [f.name for f in attrs.fields(AgentOptions) if getattr(ran, f.name) is None]
    assert unset == ["agent"]

    assert main(argv) == 130

    out, err = capsys.readouterr()
    assert "interrupting: the run keeps what it finished" in out
    assert "Traceback" not in out + err
    resume = _hint(out, "resume")
    assert _options(_parser().parse_args(resume)) == ran
    abandon = _hint(out, "abandon")
    assert abandon == ["abandon", resume[1], "--store", str(store)]
    (run,) = _stored(store, resume[1]).runs
    assert run.outcome == "interrupted"


def test_ctrl_c_interrupts_the_demo_as_it_does_a_run(
    tmp_path: Path, capsys: Capture, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Thinking(SimulatedModel):
        async def complete(self, request: ModelRequest) -> ModelResponse:
            await _ctrl_c_while_thinking(request)
            raise AssertionError("unreachable")

    monkeypatch.setattr("turnfsm.cli._demo.SimulatedModel", Thinking)
    store = tmp_path / "demo.db"

    assert main(["demo", "--store", str(store)]) == 130

    out, err = capsys.readouterr()
    assert "interrupting: the run keeps what it finished" in out
    assert "Traceback" not in out + err
    assert "go on with" not in out  # the demo agent is not one resume can name
    abandon = _hint(out, "abandon")
    session_id = abandon[1]
    assert abandon == ["abandon", session_id, "--store", str(store)]
    assert _stored(store, session_id).runs[0].outcome == "interrupted"

    # The hint works: it ends the run, with no model.
    assert main(abandon) == 0
    out, err = capsys.readouterr()
    assert "abandoned" in out, err
    assert _stored(store, session_id).runs[0].outcome == "failed"


@pytest.mark.parametrize(
    ("options", "said"),
    [
        (
            ["--window", "100"],
            "turnfsm run: invalid --window=100: expected a window well over 271 "
            "tokens: the default reply budget (--max-tokens 256) and the request "
            "must fit under 95 % of it; or give a smaller --max-tokens",
        ),
        (
            ["--window", "1000", "--max-tokens", "990"],
            "turnfsm run: invalid --max-tokens=990: expected an int under 950 "
            "tokens, 95 % of the 1,000-token context window",
        ),
    ],
)
def test_a_reply_budget_the_window_cannot_hold_is_refused_naming_the_option(
    capsys: Capture, options: list[str], said: str
) -> None:
    argv = ["run", "hi", "--model", "http://127.0.0.1:9/v1#m", *options]
    argv += ["--store", "memory:"]

    assert main(argv) == 2

    out, err = capsys.readouterr()
    assert out == ""
    (line,) = err.splitlines()
    assert line.startswith(said)


def test_a_run_whose_pins_cannot_fit_is_refused_on_one_line(
    capsys: Capture,
) -> None:
    prompt = "word " * 1_000
    argv = ["run", prompt, "--model", "http://127.0.0.1:9/v1#m", "--window", "1000"]
    argv += ["--store", "memory:"]

    assert main(argv) == 2

    out, err = capsys.readouterr()
    assert out == ""
    (line,) = err.splitlines()
    assert line.startswith("turnfsm run: pinned messages do not fit: ")
    assert "--max-tokens 256" in line
    assert line.endswith("raise --window or lower --max-tokens")
    assert "PinRules" not in line  # not a setting of the command line


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["run", "hi"], "turnfsm run: missing --model: expected a model"),
        (["replay"], "turnfsm replay: missing LOG: expected a session log file"),
        (
            ["run", "hi", "--model", "http://127.0.0.1:9/v1", "--window", "-5"],
            "turnfsm run: invalid --window=-5: expected an int in 1..100,000,000",
        ),
        (
            ["run", "hi", "--model", "local", "--max-tokens", "0"],
            "turnfsm run: invalid --max-tokens=0: expected an int in 1..100,000,000",
        ),
        (
            ["run", "hi", "--model", "openai:gpt-4o-mini"],
            "turnfsm run: missing OPENAI_API_KEY: expected the API key for "
            "openai:gpt-4o-mini in the environment (export OPENAI_API_KEY=...)",
        ),
        (
            ["run", "hi", "--model", "gpt-4o-mini"],
            "(did you mean openai:gpt-4o-mini?)",
        ),
    ],
)
def test_a_refusal_speaks_the_command_line_s_words(
    argv: list[str], said: str, capsys: Capture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)

    assert main([*argv, "--store", "memory:"]) == 2

    err = capsys.readouterr().err
    assert said in err
    assert "None" not in err


def test_version_and_no_arguments(capsys: Capture) -> None:
    from turnfsm import __version__

    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"turnfsm {__version__}\n"

    assert main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: turnfsm")
    assert "run one task" in out  # the subcommands, with their help


def test_ctrl_c_outside_a_run_ends_the_program_with_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: Capture
) -> None:
    # While the SDKs import, say: it printed Python's own traceback.
    def interrupted(argv: object = None) -> int:
        raise KeyboardInterrupt

    def exit_now(status: int) -> None:
        raise SystemExit(status)

    monkeypatch.setattr(cli, "main", interrupted)
    # Nor may it take this process's SIGTERM and SIGHUP.
    monkeypatch.setattr(cli, "_stop_as_ctrl_c", lambda: None)
    # A stopped command ends through os._exit (no teardown waiting for the
    # threads of the tools it interrupted), which would end this test too.
    monkeypatch.setattr(os, "_exit", exit_now)

    with pytest.raises(SystemExit) as ended:
        cli.script()

    assert ended.value.code == 130
    assert capsys.readouterr().err == "\nturnfsm: interrupted\n"


_CTRL_C_WHILE_IMPORTING = """
import sys

class CtrlC:
    def find_spec(self, name, path=None, target=None):
        if name == "turnfsm.context":  # the first heavy module the program loads
            raise KeyboardInterrupt
        return None

sys.meta_path.insert(0, CtrlC())
sys.argv = ["turnfsm", "sessions", "list", "--store", "memory:"]
from turnfsm.cli import script

script()
"""


def _python(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """This interpreter run on `args` in `cwd`, turnfsm importable; its output."""
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_ctrl_c_while_the_program_imports_ends_it_with_one_line(
    tmp_path: Path,
) -> None:
    # Ctrl-C in the first half second of `turnfsm ...`: importing the command
    # line loaded every compactor before its Ctrl-C handling began.
    done = _python(tmp_path, "-c", _CTRL_C_WHILE_IMPORTING)

    assert done.returncode == 130, done.stderr
    assert done.stderr == "\nturnfsm: interrupted\n"
    assert done.stdout == ""


def test_ctrl_c_ends_the_program_though_a_tool_s_thread_cannot_stop(
    tmp_path: Path,
) -> None:
    # A sync tool runs in a worker thread, which nothing can stop: once the
    # run was interrupted and said so, the program waited for that thread to
    # end before it exited (here two minutes), and a second Ctrl-C printed
    # the traceback of the interpreter's wait.
    store = tmp_path / "s.db"
    agent = "tests.cli.stuck_tool_agent:agent"
    started = time.monotonic()
    command = ["run", "Is the disk back?", "--agent", agent, "--store", str(store)]
    done = _python(tmp_path, "-m", "turnfsm", *command)

    assert done.returncode == 130, done.stderr
    assert time.monotonic() - started < 20
    assert done.stderr == ""
    assert "[tool] wait_for_the_disk interrupted" in done.stdout
    assert "run interrupted: what it finished is kept" in done.stdout
    session_id = _hint(done.stdout, "resume")[1]
    assert _stored(store, session_id).runs[0].outcome == "interrupted"


def test_a_run_that_ended_leaves_a_tool_s_thread_past_its_timeout_behind(
    tmp_path: Path,
) -> None:
    # A sync tool that outlives its timeout goes on in its worker thread: the
    # run ended, answered and was logged, then the program waited two more
    # minutes for that thread before it exited.
    store = tmp_path / "s.db"
    agent = "tests.cli.stuck_tool_agent:timed_out_agent"
    started = time.monotonic()
    command = ["run", "Is the disk back?", "--agent", agent, "--store", str(store)]
    done = _python(tmp_path, "-m", "turnfsm", *command)

    assert done.returncode == 0, done.stderr
    assert time.monotonic() - started < 20
    assert "timed out after 1.0s" in done.stdout
    assert "\nrun done: 2 model call(s)" in done.stdout, done.stdout
    assert done.stderr == (
        "turnfsm: not waiting for 1 thread still running (such as a plain tool "
        "past its timeout, which goes on until it returns); the command is done\n"
    )


def _stopped_while_the_tool_runs(
    cwd: Path,
    command: list[str],
    signum: signal.Signals,
    *,
    tool: str = "wait_for_the_disk_a_minute",
    again_after: float | None = None,
) -> tuple[int, str, str]:
    """Run `turnfsm COMMAND`; send `signum` once its slow `tool` began.

    With `again_after`, send it again that many seconds later. Returns its
    exit status, its output and its errors.
    """
    with subprocess.Popen(
        [sys.executable, "-m", "turnfsm", *command],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as program:
        assert program.stdout is not None
        seen = []
        for line in program.stdout:  # the tool has begun: stop the program
            seen.append(line)
            if line.startswith(f"[tool] {tool}("):
                program.send_signal(signum)
                if again_after is not None:
                    time.sleep(again_after)
                    program.send_signal(signum)
                break
        out, err = program.communicate(timeout=30)
    return program.returncode, "".join(seen) + out, err


_SLOW = ["--agent", "tests.cli.stuck_tool_agent:slow_agent"]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=str)
def test_sigterm_interrupts_a_run_as_ctrl_c_does_and_lets_its_session_go(
    tmp_path: Path, signum: signal.Signals
) -> None:
    # `kill`, `docker stop` and a service manager send SIGTERM, a closed
    # terminal or a dropped ssh connection SIGHUP: the program died at once,
    # its run left open and its session held until the lease ran out, so
    # `turnfsm abandon` (or `resume`) was refused meanwhile.
    store = tmp_path / "s.db"
    command = ["run", "Is the disk back?", *_SLOW, "--store", str(store)]
    status, out, err = _stopped_while_the_tool_runs(tmp_path, command, signum)

    assert status == 130, err
    assert err == ""
    said = f"interrupting: the run keeps what it finished ({signum.name} again"
    assert said in out
    abandon = _hint(out, "abandon")
    session_id = abandon[1]
    assert _stored(store, session_id).runs[0].outcome == "interrupted"

    # The session was let go: ending the run needs no wait and no --force.
    done = _python(tmp_path, "-m", "turnfsm", *abandon)
    assert done.returncode == 0, done.stdout + done.stderr
    assert _stored(store, session_id).runs[0].outcome == "failed"


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_resumed_run_is_interrupted_as_a_run_is(
    tmp_path: Path, signum: signal.Signals
) -> None:
    # `turnfsm resume` (and approve, reject) ended on Ctrl-C with only
    # "turnfsm: interrupted", saying nothing of the run or how to go on,
    # and SIGTERM killed it.
    store = tmp_path / "s.db"
    command = ["run", "Is the disk back?", *_SLOW, "--store", str(store)]
    status, out, err = _stopped_while_the_tool_runs(tmp_path, command, signal.SIGINT)
    assert status == 130, err
    resume = _hint(out, "resume")

    status, out, err = _stopped_while_the_tool_runs(tmp_path, resume, signum)

    assert status == 130, err
    # Its end is in the log: not "its process ended", as after a kill.
    (run,) = _stored(store, resume[1]).runs
    said = f"run {run.run_id} was interrupted (Ctrl-C, or a cancelled task)\n"
    assert out.startswith(said)
    assert "interrupting: the run keeps what it finished" in out
    assert "turnfsm: interrupted" not in err
    assert _hint(out, "resume") == resume
    (run,) = _stored(store, resume[1]).runs
    assert run.outcome == "interrupted"


def test_a_second_ctrl_c_exits_at_once_naming_the_session_and_how_to_go_on(
    tmp_path: Path,
) -> None:
    # The run's tool takes five seconds to stop; Ctrl-C again meanwhile
    # exited at once, printing nothing more: the new session's id was never
    # printed, so nothing said which session to resume or abandon, nor that
    # it stays held a while.
    store = tmp_path / "s.db"
    agent = "tests.cli.stuck_tool_agent:slow_to_stop_agent"
    command = ["run", "Fetch the report.", "--agent", agent, "--store", str(store)]
    status, out, err = _stopped_while_the_tool_runs(
        tmp_path, command, signal.SIGINT, tool="fetch_the_report", again_after=1
    )

    assert status == 130, err
    assert err == ""
    *_, last = out.splitlines()
    assert last.startswith("exited at once: session ses_")
    assert "its run stays open, held for up to 30 s (its lease)" in last
    resume = _hint(out, "resume")
    assert resume == ["resume", resume[1], "--agent", agent, "--store", str(store)]
    assert _hint(out, "abandon") == ["abandon", resume[1], "--store", str(store)]
    (run,) = _stored(store, resume[1]).runs
    assert run.outcome == "running"  # left open: resume carries it on once let go


def test_a_closed_terminal_interrupts_the_run_and_exits_as_ctrl_c_does(
    tmp_path: Path,
) -> None:
    # The terminal window closed (or the ssh connection dropped): the kernel
    # sends SIGHUP, and the terminal takes no more output. The run was
    # logged interrupted, but printing where it is kept failed on the gone
    # terminal, and the program ended on that error (status 1, a traceback
    # to nowhere) instead of as an interrupted run.
    store = tmp_path / "s.db"
    command = ["run", "Is the disk back?", *_SLOW, "--store", str(store)]
    terminal, side = os.openpty()
    with subprocess.Popen(
        [sys.executable, "-m", "turnfsm", *command],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "TERM": "xterm"},
        stdin=side,
        stdout=side,
        stderr=side,
        start_new_session=True,
    ) as program:
        os.close(side)
        seen = b""
        while b"[tool] wait_for_the_disk_a_minute(" not in seen:
            seen += os.read(terminal, 4096)
        os.close(terminal)  # hang up
        program.send_signal(signal.SIGHUP)
        status = program.wait(timeout=30)

    assert status == 130
    (session,) = _sessions(store)
    assert _stored(store, session).runs[0].outcome == "interrupted"


def _screen(raw: str, width: int) -> list[str]:
    """The lines a terminal `width` columns wide shows after `raw`.

    As much of a terminal as a live status line uses: text that wraps at
    the edge, ``\\r``, ``\\n``, erase the line (``ESC[2K``) and cursor up
    (``ESC[1A``); other escapes change nothing shown.
    """
    lines, row, col = [""], 0, 0
    for piece in re.split(r"(\x1b\[[0-9;?]*[A-Za-z]|\r|\n)", raw):
        if piece == "\r":
            col = 0
        elif piece == "\n":
            row, col = row + 1, 0
        elif piece == "\x1b[2K":
            lines[row] = ""
        elif piece == "\x1b[1A":
            row = max(row - 1, 0)
        elif piece.startswith("\x1b"):
            continue
        for char in "" if piece.startswith(("\x1b", "\r", "\n")) else piece:
            if col == width:
                row, col = row + 1, 0
            lines += [""] * (row + 1 - len(lines))
            lines[row] = lines[row][:col].ljust(col) + char + lines[row][col + 1 :]
            col += 1
        lines += [""] * (row + 1 - len(lines))
    return lines


def _on_a_terminal(
    cwd: Path, command: list[str], columns: int, ctrl_c: list[float]
) -> tuple[int, str]:
    """Run `turnfsm COMMAND` on a terminal `columns` wide; press Ctrl-C.

    Ctrl-C is pressed once its first tool began, then again after each of
    the seconds in `ctrl_c`. Returns its exit status and all it wrote.
    """
    terminal, side = os.openpty()
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "TERM": "xterm"}
    env["COLUMNS"] = str(columns)
    env.pop("NO_COLOR", None)
    with subprocess.Popen(
        [sys.executable, "-m", "turnfsm", *command],
        cwd=cwd,
        env=env,
        stdin=side,
        stdout=side,
        stderr=side,
        start_new_session=True,
    ) as program:
        os.close(side)
        seen = b""
        while b"[tool] " not in seen:
            seen += os.read(terminal, 4096)
        program.send_signal(signal.SIGINT)
        for seconds in ctrl_c:
            time.sleep(seconds)
            program.send_signal(signal.SIGINT)
        status = program.wait(timeout=30)
        with contextlib.suppress(OSError):  # its end: EIO once it closed
            while chunk := os.read(terminal, 4096):
                seen += chunk
        os.close(terminal)
    return status, seen.decode()


def test_ctrl_c_on_a_narrow_terminal_keeps_its_notice_and_the_cursor(
    tmp_path: Path,
) -> None:
    # The notice was written under the live status line, leaving a stale
    # copy of it on the screen (wrapped on a narrow terminal, the line's next
    # refresh could erase the notice instead); a second Ctrl-C exited with
    # the status line still drawn and the cursor hidden, so the shell the
    # user came back to had no cursor.
    store = tmp_path / "s.db"
    agent = "tests.cli.stuck_tool_agent:slow_to_stop_agent"
    command = ["run", "Fetch the report.", "--agent", agent, "--store", str(store)]
    status, raw = _on_a_terminal(tmp_path, command, columns=30, ctrl_c=[1.5])

    assert status == 130
    shown = "\n".join(_screen(raw, 30)).replace("\n", "")
    assert "interrupting: the run keeps what it finished (Ctrl-C again to exit" in shown
    assert "exited at once: session ses_" in shown
    assert raw.rfind("\x1b[?25h") > raw.rfind("\x1b[?25l")  # the cursor is back
    assert "of 8000 tokens" not in shown  # the status line leaves no trace


def test_ctrl_c_stops_a_run_started_as_a_background_job(tmp_path: Path) -> None:
    # A script's `turnfsm run ... &` starts with Ctrl-C ignored (so does a
    # job of a CI runner): a `kill -INT` sent to it on purpose did nothing,
    # and the run went on to its end.
    store = tmp_path / "s.db"
    command = ["run", "Is the disk back?", *_SLOW, "--store", str(store)]
    with subprocess.Popen(
        [sys.executable, "-m", "turnfsm", *command],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    ) as program:
        assert program.stdout is not None
        for line in program.stdout:
            if line.startswith("[tool] wait_for_the_disk_a_minute("):
                break
        program.send_signal(signal.SIGINT)
        out, _ = program.communicate(timeout=30)

    assert program.returncode == 130
    assert "(Ctrl-C again to exit at once)" in out
    assert "run interrupted: what it finished is kept" in out


def test_a_run_under_nohup_goes_on_when_its_terminal_closes(tmp_path: Path) -> None:
    # `nohup turnfsm run ... &` asks for SIGHUP to be ignored, so that the
    # run outlives the terminal: the run must not take it as a Ctrl-C.
    store = tmp_path / "s.db"
    command = ["run", "Is the disk back?", *_SLOW, "--store", str(store)]
    with subprocess.Popen(
        ["nohup", sys.executable, "-m", "turnfsm", *command],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as program:
        assert program.stdout is not None
        for line in program.stdout:
            if line.startswith("[tool] wait_for_the_disk_a_minute("):
                break
        program.send_signal(signal.SIGHUP)
        time.sleep(1)
        going_on = program.poll() is None
        program.send_signal(signal.SIGINT)
        out, _ = program.communicate(timeout=30)

    assert going_on
    assert "(SIGHUP again" not in out
    assert "(Ctrl-C again to exit at once)" in out
