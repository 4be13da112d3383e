from __future__ import annotations

import io
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT
from turnfsm.cli import main
from turnfsm.cli._demo import run_demo


def test_demo_compacts_hits_the_emergency_line_and_finishes() -> None:
    out = io.StringIO()
    assert run_demo(out=out) == 0
    text = out.getvalue()
    assert "SIMULATED model" in text
    assert "[compaction] reason=threshold_exceeded" in text
    assert text.count("[compaction] EMERGENCY reason=emergency") == 1
    assert "start --measured--> compact (emergency)" in text
    assert "final answer" in text


def test_demo_says_how_to_look_at_its_session(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The demo said where its session went, and nothing of what to do next.
    db = tmp_path / "my sessions.db"
    assert main(["demo", "--store", str(db)]) == 0
    out = capsys.readouterr().out
    look = next(line for line in out.splitlines() if line.startswith("look at it: "))
    show, _, view = look.removeprefix("look at it: ").partition(" (or in the browser: ")
    assert shlex.split(show)[:3] == ["turnfsm", "sessions", "show"]
    assert shlex.split(view.removesuffix(")"))[:2] == ["turnfsm", "view"]
    assert main(shlex.split(show)[1:]) == 0
    shown = capsys.readouterr().out
    assert shown.startswith(f"session {shlex.split(show)[3]}: 36 entries, 1 run(s)")
    assert main(["demo", "--store", "memory:"]) == 0
    assert "look at it" not in capsys.readouterr().out  # gone when it ends


def test_a_demo_whose_store_fails_mid_run_names_its_session(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # It exited 2 (could not start) with the store's error alone, though the
    # run had begun: no session named, nothing said of how to end it.
    from turnfsm.cli import _demo

    db = tmp_path / "s.db"

    def read_log(name: str) -> str:
        """Read a log file, but remove the session store first.

        Args:
            name: The log file.
        """
        for suffix in ("", "-wal", "-shm"):
            Path(f"{db}{suffix}").unlink(missing_ok=True)
        return "gone"

    built = _demo.build_demo_agent
    monkeypatch.setattr(
        _demo, "build_demo_agent", lambda sink, **kw: built(sink, tool=read_log, **kw)
    )

    assert main(["demo", "--store", str(db)]) == 1
    captured = capsys.readouterr()
    assert "turnfsm demo: cannot use" in captured.err
    session = next(
        line.split()[1]
        for line in captured.out.splitlines()
        if line.startswith("session ses_")
    )
    end = shlex.join(["turnfsm", "abandon", session, "--store", str(db)])
    assert f"once the store works again, end it: {end}" in captured.out


def test_demo_quiet_prints_only_the_answer(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--quiet"]) == 0
    out = capsys.readouterr().out
    lines = out.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("final answer")
    assert out == lines[0] + "\n", "no blank line before the answer"


def test_demo_quiet_prints_no_blank_line_before_the_answer(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["demo", "--quiet"]) == 0
    assert capsys.readouterr().out.startswith("final answer (")


def test_check_accepts_the_shipped_machine(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", str(REPO_ROOT / "machines" / "turn.toml")]) == 0
    assert "ok (7 phases" in capsys.readouterr().out


def test_check_lists_every_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.toml"
    text = (REPO_ROOT / "machines" / "turn.toml").read_text()
    text = text.replace('conditions = ["is_no_progress"]', 'conditions = ["is_nope"]')
    text = text.replace('dest = "done"', 'dest = "finished"')
    bad.write_text(text)
    assert main(["check", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "unknown guard 'is_nope'" in err
    assert "unknown dest phase 'finished'" in err


def test_check_reports_a_missing_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "/nonexistent/machine.toml"]) == 1
    assert capsys.readouterr().err == (
        "/nonexistent/machine.toml: the directory /nonexistent does not exist\n"
    )


def test_diagram_writes_mermaid_and_check_detects_drift(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    machines, out = str(REPO_ROOT / "machines"), tmp_path / "diagrams"
    assert main(["diagram", machines, "--out", str(out)]) == 0
    mmd = (out / "turn.mmd").read_text()
    assert 'call_llm -->|"model_replied<br/>[has_tool_calls]"| run_tools' in mmd
    if shutil.which("dot"):
        assert (out / "turn.svg").read_text().lstrip().startswith("<?xml")
    assert main(["diagram", machines, "--out", str(out), "--check"]) == 0
    (out / "turn.mmd").write_text(mmd + "stale\n")
    assert main(["diagram", machines, "--out", str(out), "--check"]) == 1
    assert "stale" in capsys.readouterr().err


def test_run_names_the_missing_key(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    assert main(["run", "hi", "--model", "openai:gpt-4o-mini"]) == 2
    assert "missing OPENAI_API_KEY" in capsys.readouterr().err
    assert main(["run", "hi", "--model", "anthropic:claude-x"]) == 2
    assert "missing ANTHROPIC_API_KEY" in capsys.readouterr().err


def test_run_rejects_an_unknown_model_spec(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "hi", "--model", "gpt-4o"]) == 2
    err = capsys.readouterr().err
    assert "invalid --model='gpt-4o'" in err
    assert "did you mean openai:gpt-4o?" in err
    assert "openai:MODEL" in err


@pytest.mark.parametrize(
    ("spec", "meant"),
    [
        ("openai/gpt-4o-mini", "openai:gpt-4o-mini"),  # LiteLLM's spelling
        ("anthropic/claude-x", "anthropic:claude-x"),
        ("OpenAI:gpt-4o-mini", "openai:gpt-4o-mini"),
        ("lcoal", "local"),
        ("Local", "local"),
        ("localhost:8080", "http://localhost:8080/v1"),
        ("127.0.0.1:8080/v1", "http://127.0.0.1:8080/v1"),
    ],
)
def test_a_model_spec_spelt_nearly_right_names_the_one_meant(
    spec: str, meant: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", "hi", "--model", spec]) == 2
    err = capsys.readouterr().err
    assert f"invalid --model={spec!r}" in err
    assert err.rstrip().endswith(f"(did you mean {meant}?)")


def test_a_model_name_given_with_a_space_is_named_without_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    assert main(["run", "hi", "--model", "openai: gpt-4o-mini"]) == 2
    assert "the API key for openai:gpt-4o-mini in" in capsys.readouterr().err


def test_a_reader_that_goes_away_ends_the_command_quietly(tmp_path: Path) -> None:
    """`turnfsm ... | head`: no traceback, the status of a SIGPIPE."""
    script = (
        "import sys\n"
        "from turnfsm.cli import main\n"
        "class Gone:\n"
        "    def write(self, text):\n"
        "        raise BrokenPipeError(32, 'Broken pipe')\n"
        "    def flush(self):\n"
        "        pass\n"
        "    def fileno(self):\n"
        "        return 1\n"
        "sys.stdout = Gone()\n"
        "sys.exit(main(['check', sys.argv[1]]))\n"
    )
    machine = REPO_ROOT / "machines" / "turn.toml"
    done = subprocess.run(
        [sys.executable, "-c", script, str(machine)],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 141
    assert "Traceback" not in done.stderr
    assert done.stderr == ""


@pytest.mark.parametrize("temporal", [False, True])
def test_the_program_keeps_its_output_and_status_with_or_without_temporal(
    tmp_path: Path, temporal: bool
) -> None:
    """With Temporal's client loaded the program skips the interpreter's
    teardown (which the SDK's threads can abort), yet prints and exits alike."""
    if temporal:
        pytest.importorskip("temporalio")
    script = (
        "import atexit, sys\n"
        + ("import temporalio.client\n" if temporal else "")
        + "atexit.register(lambda: print('teardown', flush=True))\n"
        "sys.argv = ['turnfsm', 'sessions', 'show', 'nope', '--store', 'memory:']\n"
        "print('before', end='')\n"
        "from turnfsm.cli import script\n"
        "script()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 2
    assert "no session 'nope'" in done.stderr
    assert done.stdout == ("before" if temporal else "beforeteardown\n")
