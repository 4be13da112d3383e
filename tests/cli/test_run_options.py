"""`turnfsm run` with your own agent or one built of options; the answer commands.

Each bad option is refused with exit status 2 and one line naming the option
and its value, before anything is written.
"""

from __future__ import annotations

import gc
import http.server
import json
import re
import socket
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.cli import approval_agent
from tests.helpers import REPO_ROOT, http_server
from turnfsm.cli import main
from turnfsm.cli._run import (
    LOCAL_MAX_TURNS,
    AgentOptions,
    _driver,
    cli_words,
    open_driver,
    report_interrupted,
)
from turnfsm.cli._stores import IN_MEMORY
from turnfsm.context import LayeredCompactor, SummarizingCompactor
from turnfsm.errors import MaxTurnsExceeded
from turnfsm.persistence import Session, SQLiteStore
from turnfsm.testing import ScriptedModel

Capture = pytest.CaptureFixture[str]
CAREFUL = "tests.cli.approval_agent:careful"
SCRIPTED = "tests.cli.compact_agent:agent"


@pytest.fixture(autouse=True)
def _fresh_effects() -> Iterator[None]:
    approval_agent.DELETED.clear()
    yield
    approval_agent.DELETED.clear()


TOOLS = "tests.cli.approval_agent"


@pytest.mark.parametrize(
    ("argv", "option", "named"),
    [
        (["--agent", "no_such_mod:agent"], "--agent", "named 'no_such_mod'"),
        (["--agent", "tests.cli.nope:a"], "--agent", "named 'tests.cli.nope'"),
        (["--agent", TOOLS], "--agent", "MODULE:ATTR"),
        (["--agent", f"{TOOLS}:nobody"], "--agent", "no 'nobody'"),
        (
            # A misspelt name: the one it is closest to.
            ["--agent", f"{TOOLS}:carful"],
            "--agent",
            "(no 'carful'; did you mean 'careful'?)",
        ),
        (
            ["--model", "openai:o", "--tools", f"{TOOLS}:delete_fil"],
            "--tools",
            "did you mean 'delete_file'?",
        ),
        (["--agent", f"{TOOLS}:not_an_agent"], "--agent", "(it is an int)"),
        (
            ["--agent", f"{TOOLS}:needs_a_name"],
            "--agent",
            "(it is a function that needs name; a function making one takes no "
            "arguments)",
        ),
        (
            ["--agent", f"{TOOLS}:makes_no_agent"],
            "--agent",
            "(the function returned a str)",
        ),
        (
            ["--agent", "tests/cli/approval_agent.py:careful"],
            "--agent",
            "expected an importable module (a module is named as Python imports "
            "it, not by its file: tests.cli.approval_agent:careful, run from the "
            "directory that holds it)",
        ),
        (
            ["--agent", "tests.cli.approval_agent.py:careful"],
            "--agent",
            "not by its file: tests.cli.approval_agent:careful",
        ),
        (
            ["--model", "openai:o", "--tools", "./tests/cli/approval_agent.py:a"],
            "--tools",
            "not by its file: tests.cli.approval_agent:a",
        ),
        (
            ["--agent", "my-agent:agent"],
            "--agent",
            "a module's name is Python names joined by dots",
        ),
        (
            ["--agent", "tests.cli.broken_module:x"],
            "--agent",
            "it raised RuntimeError: the module's own code failed",
        ),
        (["--agent", CAREFUL, "--model", "openai:gpt-4o"], "--model", "with --agent"),
        (["--agent", CAREFUL, "--window", "9000"], "--window=9000", "with --agent"),
        (["--agent", CAREFUL, "--system", "hi"], "--system='hi'", "with --agent"),
        (["--agent", CAREFUL, "--tools", TOOLS], "--tools", "with --agent"),
        (["--agent", CAREFUL, "--n-ctx", "2048"], "--n-ctx=2048", "with --agent"),
        (["--agent", CAREFUL, "--max-tokens", "9"], "--max-tokens=9", "with --agent"),
        (["--agent", CAREFUL, "--max-turns", "9"], "--max-turns=9", "with --agent"),
        (["--model", "openai:o", "--max-turns", "0"], "--max-turns=0", "an int > 0"),
        (
            # It was taken and unused: the run worked in the model's window.
            ["--model", "anthropic:claude-x", "--n-ctx", "100"],
            "--n-ctx=100",
            "no --n-ctx with --model anthropic:claude-x",
        ),
        (
            ["--agent", CAREFUL, "--model-timeout", "9"],
            "--model-timeout=9.0",
            "with --agent",
        ),
        (
            ["--model", "openai:o", "--model-timeout", "0"],
            "--model-timeout=0.0",
            "a finite number of seconds > 0",
        ),
        (
            # Not "..., or None": no option gives None.
            ["--model", "openai:o", "--model-timeout", "-1"],
            "--model-timeout=-1.0",
            "a finite number of seconds > 0\n",
        ),
        (["--model", ""], "--model=''", "openai:MODEL, anthropic:MODEL, local"),
        *(
            # Named as the library's context_window and max_output_tokens.
            ([flag, "99999999999999999999"], f"{flag}=9999", "1..100,000,000\n")
            for flag in ("--window", "--n-ctx", "--max-tokens")
        ),
        (["--model", " "], "--model=' '", "openai:MODEL, anthropic:MODEL, local"),
        (
            # It named the library's base_url (or tried to connect to no host).
            ["--model", "http:///v1#m"],
            "--model='http:///v1#m'",
            "a base URL with a host (http://127.0.0.1:8080/v1)",
        ),
        ([], "missing --model", "--agent MODULE:ATTR"),
        (["--model", "openai:o", "--tools", f"{TOOLS}:DELETED"], "--tools", "a list"),
        (["--model", "openai:o", "--tools", f"{TOOLS}:nope"], "--tools", "no 'nope'"),
        (
            # It named '' as the value, and an agent as the example.
            ["--model", "openai:o", "--tools", f"{TOOLS}:delete_file,"],
            f"--tools='{TOOLS}:delete_file,'",
            "with no empty name (e.g. myapp.tools:a,b)",
        ),
        (
            # A module without its function: it showed an agent as the example
            # (MODULE:ATTR (e.g. myapp.agents:support)).
            ["--model", "openai:o", "--tools", TOOLS],
            f"--tools='{TOOLS}'",
            "expected MODULE:FUNC (e.g. myapp.tools:search)\n",
        ),
        (
            ["--model", "openai:o", "--machine", "none.toml"],
            "--machine='none.toml'",
            "a machine file, or a shipped machine's name (none.toml does not "
            "exist, nor a shipped machine of that name (approval, compaction, "
            "review, turn))",
        ),
        (
            # A shipped machine's name misspelt: the one it is closest to
            # (it said only "approvl does not exist").
            ["--model", "openai:o", "--machine", "approvl"],
            "--machine='approvl'",
            "(approval, compaction, review, turn; did you mean 'approval'?))\n",
        ),
        (
            # A shipped machine by its name: the review machine, which needs
            # its reviewer's effect.
            ["--model", "openai:o", "--machine", "review"],
            "--machine",
            "an effect named 'review' for phase 'await_review': give --agent",
        ),
        (
            [
                "--model",
                "openai:o",
                "--machine",
                str(REPO_ROOT / "machines/review.toml"),
            ],
            "review.toml",
            "an effect named 'review' for phase 'await_review': give --agent",
        ),
        (["--agent", SCRIPTED, "--session", "ses_nothere"], "ses_nothere", "s.db"),
    ],
)
def test_a_bad_option_is_named_with_its_value(
    argv: list[str],
    option: str,
    named: str,
    capsys: Capture,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    store = tmp_path / "s.db"
    assert main(["run", "hi", "--store", str(store), *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("turnfsm run: ")
    assert captured.err.count("\n") == 1
    assert option in captured.err
    assert named in captured.err
    if store.exists():  # nothing was written
        assert main(["sessions", "list", "--store", str(store)]) == 0
        assert capsys.readouterr().out.startswith("no sessions")


@pytest.mark.parametrize(
    ("settings", "check"),
    [
        ({"system": "Be brief."}, lambda d: d.system_prompt == "Be brief."),
        ({"window": 9000}, lambda d: d.context.context_window == 9000),
        ({"strategy": "layered"}, lambda d: _compactor(d, LayeredCompactor)),
        ({"strategy": "summarizing"}, lambda d: _compactor(d, SummarizingCompactor)),
        (
            {"tools": "tests.cli.approval_agent:delete_file,careful"},
            lambda d: len(d.tools) == 2,
        ),
        (
            # A function and a Tool (what @function_tool made of one).
            {
                "tools": "tests.cli.approval_agent:delete_file,"
                "tests.driver.decorated_tool:double"
            },
            lambda d: (
                [getattr(t, "name", getattr(t, "__name__", "")) for t in d.tools]
                == ["delete_file", "double"]
            ),
        ),
        (
            {"machine": str(REPO_ROOT / "machines" / "approval.toml")},
            lambda d: d.machine.name == "approval",
        ),
        ({}, lambda d: d.context.context_window == 128_000),
        ({}, lambda d: d.model_timeout == 300.0),
        ({"model_timeout": 2.5}, lambda d: d.model_timeout == 2.5),
        ({}, lambda d: d.max_turns == 50),
        ({"max_turns": 7}, lambda d: d.max_turns == 7),
    ],
    ids=lambda v: "-".join(v) if isinstance(v, dict) else "",
)
def test_the_options_build_the_agent(
    settings: dict[str, Any],
    check: Callable[[Any], bool],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    options = AgentOptions(model="openai:gpt-4o", **settings)
    with open_driver(options) as (driver, own):
        assert own is None
        assert check(driver)


def test_a_printed_command_never_shows_the_stores_password() -> None:
    # `turnfsm run` prints the command that resumes an interrupted run.
    for given, printed in [
        (
            "postgresql://app:s3cret@db:5432/agents?options=-csearch_path%3Dteam",
            "postgresql://app:PASSWORD@db:5432/agents?options=-csearch_path%3Dteam",
        ),
        (
            "postgres://db/agents?user=app&password=s3cret",
            "postgres://db/agents?user=app&password=PASSWORD",
        ),
        ("postgresql://app@db/agents", "postgresql://app@db/agents"),
        ("sessions.db", "sessions.db"),
    ]:
        options = AgentOptions(agent="app:agent", store=given)
        assert options.flags() == ["--agent", "app:agent", "--store", printed]
        assert options.store_flags() == ["--store", printed]


@pytest.mark.parametrize(
    ("spec", "calibrated"),
    [
        ("openai:gpt-4o", False),  # the default counter errs high on its tokens
        ("anthropic:claude-3-5-haiku-latest", True),
        ("http://127.0.0.1:9/v1#any", True),
    ],
)
def test_an_agent_calibrates_unless_its_model_counts_as_openais_do(
    spec: str, calibrated: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model with a tokenizer of its own makes its agent learn the ratio."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test")
    options = AgentOptions(model=spec, window=8_000)
    with open_driver(options) as (driver, _):
        assert driver.context is not None
        assert driver.context.calibrate is calibrated


def _compactor(driver: object, kind: type) -> bool:
    context = getattr(driver, "context", None)
    return isinstance(getattr(context, "compactor", None), kind)


def _session_id(text: str) -> str:
    found = re.search(r"session (ses_\w+) stored in", text)
    assert found is not None, text
    return found.group(1)


def test_a_reply_is_printed_once_and_session_continues(
    capsys: Capture, tmp_path: Path
) -> None:
    store = str(tmp_path / "s.db")
    assert main(["run", "first", "--agent", SCRIPTED, "--store", store]) == 0
    out = capsys.readouterr().out
    assert out.count("answer 0") == 1
    assert "run done: 1 model call(s)" in out
    session_id = _session_id(out)
    argv = ["run", "second", "--agent", SCRIPTED, "--store", store]
    assert main([*argv, "--session", session_id]) == 0
    assert _session_id(capsys.readouterr().out) == session_id

    async def history() -> list[str]:
        async with SQLiteStore(store) as sessions:
            session = await Session.load(sessions, session_id)
        return [m.text for m in session.history]

    assert anyio.run(history) == ["first", "answer 0", "second", "answer 0"]


@pytest.mark.parametrize(
    ("maker", "said", "then"),
    [
        (
            "wiping",
            ("turnfsm run: cannot use", "deleted or replaced"),
            "run stopped where its store failed; once the store works again, "
            "carry it on: turnfsm resume {session} --agent {agent} --store {store}",
        ),
        (
            "taken_over",
            ("turnfsm run: ", "'elsewhere:1:x' took the session over"),
            "run stopped: another process took its session over; see what it "
            "did: turnfsm sessions show {session} --store {store}",
        ),
        (
            "removing",
            ("turnfsm run: ", "is no longer in the store"),
            "run stopped: its session was removed from the store while it ran "
            "(turnfsm sessions rm); nothing more of it is kept",
        ),
    ],
)
def test_a_run_stopped_by_its_store_names_its_session_and_what_to_do(
    capsys: Capture,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    maker: str,
    said: tuple[str, ...],
    then: str,
) -> None:
    # It said the store's error alone, with exit status 2 (could not start),
    # and never which session the run had begun in: a store that failed
    # under it, or a session another process took over.
    store = tmp_path / "s.db"
    monkeypatch.setattr(approval_agent, "STORE_FILES", [store])
    agent = f"tests.cli.approval_agent:{maker}"
    assert main(["run", "tidy up", "--agent", agent, "--store", str(store)]) == 1
    captured = capsys.readouterr()
    for words in said:
        assert words in captured.err
    found = re.search(r"session (ses_\w+) (stored in|was in)", captured.out)
    assert found is not None, captured.out
    session_id = found.group(1)
    assert then.format(session=session_id, agent=agent, store=store) in captured.out


def test_a_run_whose_provider_reports_no_usage_says_so_not_zero_tokens(
    capsys: Capture, tmp_path: Path
) -> None:
    store = str(tmp_path / "s.db")
    assert main(["run", "first", "--agent", SCRIPTED, "--store", store]) == 0
    out = capsys.readouterr().out
    assert "run done: 1 model call(s), token usage not reported by the provider" in out
    assert "0 tokens in" not in out
    assert main(["sessions", "show", _session_id(out), "--store", store]) == 0
    assert "usage not reported" in capsys.readouterr().out


def _paused(store: str, capsys: Capture) -> str:
    assert main(["run", "Free disk.", "--agent", CAREFUL, "--store", store]) == 3
    out = capsys.readouterr().out
    assert "paused in await_approval, waiting on 2 tool call(s):" in out
    return _session_id(out)


def test_reject_one_call_runs_the_other(capsys: Capture, tmp_path: Path) -> None:
    store = str(tmp_path / "s.db")
    session_id = _paused(store, capsys)
    assert main(["sessions", "show", session_id, "--store", store]) == 0
    shown = capsys.readouterr().out
    assert "paused in await_approval, waiting on 2 tool call(s):" in shown
    assert '    c2  delete_file({"path": "/etc/hosts"})' in shown
    argv = ["reject", session_id, "--agent", CAREFUL, "--store", store]
    assert main([*argv, "--call", "c2", "--reason", "never /etc"]) == 0
    out = capsys.readouterr().out
    assert "Report: rejected by the reviewer: never /etc; deleted /tmp/cache.db" in out
    assert approval_agent.DELETED == ["/tmp/cache.db"]


def test_abandon_needs_no_model_and_frees_the_session(
    capsys: Capture, tmp_path: Path
) -> None:
    store = str(tmp_path / "s.db")
    session_id = _paused(store, capsys)
    assert main(["abandon", session_id, "--store", store, "--reason", "no"]) == 0
    out = capsys.readouterr().out
    assert "abandoned: run cancelled: no" in out
    assert main(["sessions", "list", "--store", store]) == 0
    assert " failed" in capsys.readouterr().out
    assert approval_agent.DELETED == []


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["approve"], "missing --model"),
        (["approve", "--model", "openai:gpt-4o"], "(delete_file)"),
        (["approve", "RUN", "run_nothere"], "invalid RUN='run_nothere'"),
        (["reject", "--agent", CAREFUL, "--call", "c9"], "invalid --call='c9'"),
        (["resume", "--agent", CAREFUL], "answer it with turnfsm approve|reject"),
        (["approve", "SESSION", "ses_nothere"], "ses_nothere"),
    ],
)
def test_a_refused_answer_writes_nothing(
    argv: list[str],
    named: str,
    capsys: Capture,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    store = str(tmp_path / "s.db")
    session_id = _paused(store, capsys)
    action, *rest = argv
    target = [session_id]
    if rest[:1] == ["RUN"]:
        target, rest = [session_id, rest[1]], rest[2:]
    elif rest[:1] == ["SESSION"]:
        target, rest = [rest[1]], rest[2:]
    assert main([action, *target, "--store", store, *rest]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"turnfsm {action}: ")
    assert named in err
    # Still paused, and still answerable.
    argv = ["approve", session_id, "--agent", CAREFUL, "--store", store]
    assert main(argv) == 0
    # The two approved calls run concurrently: either may finish first.
    assert sorted(approval_agent.DELETED) == ["/etc/hosts", "/tmp/cache.db"]


@pytest.mark.parametrize(
    ("action", "agent", "named"),
    [
        (
            "resume",
            CAREFUL,
            "expected an unfinished run to resume (it is paused in await_approval:"
            " answer it with turnfsm approve|reject|abandon ses_",
        ),
        (
            "approve",
            "tests.cli.approval_agent:signalled",
            "expected a run paused for a review of its tool calls to approve (it"
            " waits in await_approval, for no review: answer it with Agent.resume"
            " from Python, with one of go_on, message_injected, run_cancelled;"
            " or end it: turnfsm abandon ses_",
        ),
        (
            "reject",
            "tests.cli.approval_agent:signalled",
            "expected a run paused for a review of its tool calls to reject",
        ),
    ],
)
def test_an_answer_the_pause_cannot_take_is_refused_before_it_goes_on(
    action: str, agent: str, named: str, capsys: Capture, tmp_path: Path
) -> None:
    # It printed "the run goes on", then the event's whole repr as the error.
    store = str(tmp_path / "s.db")
    assert main(["run", "Free disk.", "--agent", agent, "--store", store]) == 3
    session_id = _session_id(capsys.readouterr().out)

    assert main([action, session_id, "--agent", agent, "--store", store]) == 2

    out, err = capsys.readouterr()
    assert "goes on" not in out
    (line,) = err.splitlines()
    assert line.startswith(f"turnfsm {action}: invalid RUN='run_")
    assert named in line
    assert approval_agent.DELETED == []


def test_an_answer_refused_for_a_session_held_elsewhere_does_not_say_it_goes_on(
    capsys: Capture, tmp_path: Path
) -> None:
    # It printed "approve: the run goes on", then the refusal (two answers
    # at once: the second found the session taken).
    store = str(tmp_path / "s.db")
    assert main(["run", "Free disk.", "--agent", CAREFUL, "--store", store]) == 3
    session_id = _session_id(capsys.readouterr().out)

    async def hold() -> None:
        async with SQLiteStore(store) as db:
            await db.acquire_lease(session_id, "elsewhere:1:abc", ttl=600)

    anyio.run(hold)

    assert main(["approve", session_id, "--agent", CAREFUL, "--store", store]) == 2

    out, err = capsys.readouterr()
    assert "goes on" not in out
    assert "is held by 'elsewhere:1:abc'" in err
    assert approval_agent.DELETED == []


def test_approving_a_run_another_process_carries_on_names_its_holder(
    capsys: Capture, tmp_path: Path
) -> None:
    # It said "(it is unfinished: `turnfsm resume` carries it on)", naming a
    # RUN the user never gave, and resume was then refused for the lease.
    from turnfsm import Agent
    from turnfsm.testing import FakeModelClient, reply, tool_call

    started = anyio.Event()

    async def slow(n: int) -> str:
        """Work slowly.

        Args:
            n: Which.
        """
        started.set()
        await anyio.sleep(60)
        return "done"

    store = str(tmp_path / "s.db")

    async def cut_off() -> str:
        agent = Agent(
            model=FakeModelClient(lambda r: reply("", tool_call("slow", "c1", n=1))),
            tools=[slow],
            store=store,
        )
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(agent.run, "go")
            await started.wait()
            tasks.cancel_scope.cancel()  # interrupted: an unfinished run
        async with SQLiteStore(store) as db:
            await db.acquire_lease(agent.session.id, "elsewhere:1:abc", ttl=600)
        return agent.session.id

    session_id = anyio.run(cut_off)

    assert main(["approve", session_id, "--agent", CAREFUL, "--store", store]) == 2

    out, err = capsys.readouterr()
    assert "goes on" not in out
    assert "is held by 'elsewhere:1:abc'" in err
    assert "RUN" not in err


def test_a_pause_that_takes_no_review_is_shown_with_its_own_answer(
    capsys: Capture, tmp_path: Path
) -> None:
    # `run` and `sessions show` offered `turnfsm approve|reject`, which it refuses.
    store = str(tmp_path / "s.db")
    signalled = "tests.cli.approval_agent:signalled"
    assert main(["run", "Free disk.", "--agent", signalled, "--store", store]) == 3
    out = capsys.readouterr().out
    session_id = _session_id(out)
    hint = (
        "Agent.resume from Python, with one of go_on, message_injected,"
        " run_cancelled; or end it: turnfsm abandon "
    )
    assert f"answer it with: {hint}{session_id} --agent {signalled}" in out
    assert "approve" not in out

    assert main(["sessions", "show", session_id, "--store", store]) == 0
    shown = capsys.readouterr().out
    assert f"    answer it: {hint}{session_id} --store {store}\n" in shown
    assert "approve" not in shown


def test_list_puts_the_newest_first_with_times(capsys: Capture, tmp_path: Path) -> None:
    store = str(tmp_path / "s.db")
    paused = _paused(store, capsys)
    assert main(["run", "hi", "--agent", SCRIPTED, "--store", store]) == 0
    done = _session_id(capsys.readouterr().out)
    assert main(["sessions", "list", "--store", store]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == [
        "ID", "STARTED", "LAST", "ACTIVITY", "ENTRIES", "RUNS", "LAST", "OUTCOME"
    ]  # fmt: skip
    stamp = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"
    assert re.fullmatch(rf"{done}\s+{stamp}\s+{stamp}\s+\d+\s+1\s+done", lines[1])
    assert re.fullmatch(rf"{paused}\s+{stamp}\s+{stamp}\s+\d+\s+1\s+paused", lines[2])
    assert lines[3] == f"2 session(s) in {store}, newest first"


def test_export_to_a_dash_writes_stdout(capsys: Capture, tmp_path: Path) -> None:
    store = str(tmp_path / "s.db")
    session_id = _paused(store, capsys)
    assert main(["sessions", "export", session_id, "--store", store, "--out", "-"]) == 0
    out = capsys.readouterr().out
    assert json.loads(out.splitlines()[0])["session_id"] == session_id
    assert not (tmp_path / "-").exists()


@pytest.fixture
def silent_server() -> Iterator[str]:
    """A model server that takes each connection and never answers."""
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def take() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=take, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}/v1#m"
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    listener.close()


def test_a_model_that_never_answers_fails_the_run_after_model_timeout(
    silent_server: str, tmp_path: Path, capsys: Capture
) -> None:
    # Without it, each call waited 300 s: the command looked hung. Its
    # advice named `model_timeout=`, Python's word, not the option's.
    store = tmp_path / "s.db"
    argv = ["run", "hi", "--model", silent_server, "--window", "4000"]
    started = time.monotonic()

    status = main([*argv, "--model-timeout", "0.2", "--store", str(store)])

    assert time.monotonic() - started < 30
    assert status == 1
    out, err = capsys.readouterr()
    assert "timed out after 0.2s" in out + err
    (ended,) = [line for line in out.splitlines() if line.startswith("run failed")]
    assert "--model-timeout 0.2 s per attempt; raise it to wait longer" in ended
    assert "model_timeout" not in ended


@pytest.mark.parametrize("task", ["", "  "])
def test_a_blank_task_is_named_as_the_task(
    task: str, capsys: Capture, tmp_path: Path
) -> None:
    # It read "invalid message text=''", a name the command line never uses.
    store = tmp_path / "s.db"
    assert main(["run", task, "--agent", SCRIPTED, "--store", str(store)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        f"turnfsm run: invalid task={task!r}: expected what the agent should do "
        "(it is blank)\n"
    )
    assert not store.exists()


@pytest.mark.parametrize(
    "agent", [CAREFUL, "tests.cli.approval_agent:manager"], ids=["paused", "sub-agent"]
)
def test_a_run_paused_in_a_memory_store_offers_no_command_to_answer_it(
    agent: str, capsys: Capture
) -> None:
    # It offered `turnfsm approve ... --store memory:`, which finds no session.
    assert main(["run", "Free disk.", "--agent", agent, "--store", "memory:"]) == 3
    out = capsys.readouterr().out
    assert "answer it with" not in out
    assert out.endswith(
        "no command can answer it: its store, memory:, ends with this command "
        "(keep the session in a file to go on with it later: --store FILE, or "
        "TURNFSM_STORE)\n"
    )


def test_a_run_interrupted_in_a_memory_store_offers_no_command_to_go_on(
    capsys: Capture,
) -> None:
    options = AgentOptions(agent=CAREFUL, store="memory:")
    assert (
        report_interrupted("ses_1", IN_MEMORY, options, sys.stdout, resume="x") == 130
    )
    out = capsys.readouterr().out
    assert "resume" not in out
    assert "abandon" not in out
    assert "run interrupted; no command can go on with it: its store, memory:" in out


def test_a_new_task_on_a_session_with_a_paused_run_names_the_answers(
    capsys: Capture, tmp_path: Path
) -> None:
    # It said "resume or abandon it first", and `turnfsm resume` refuses a
    # paused run.
    store = str(tmp_path / "s.db")
    assert main(["run", "Free disk.", "--agent", CAREFUL, "--store", store]) == 3
    paused = capsys.readouterr().out
    session_id = _session_id(paused)
    found = re.search(r"run (run_\w+) paused", paused)
    assert found is not None, paused
    argv = ["run", "And now?", "--agent", CAREFUL, "--store", store]
    assert main([*argv, "--session", session_id]) == 2
    out, err = capsys.readouterr()
    target = f"{session_id} --agent {CAREFUL} --store {store}"
    assert out == ""
    assert err == (
        f"turnfsm run: session {session_id!r} has an open run {found.group(1)!r}"
        f": answer it with turnfsm approve|reject|abandon {target} if it is "
        f"paused, or carry it on with turnfsm resume {target} if its process "
        "died; then run the task again\n"
    )
    assert main(["approve", session_id, "--agent", CAREFUL, "--store", store]) == 0
    capsys.readouterr()
    assert main([*argv, "--session", session_id]) == 0


def test_a_run_that_crashes_names_its_session_and_the_exception(
    tmp_path: Path, capsys: Capture
) -> None:
    # A model client of one's own raising RuntimeError was told as one line,
    # `turnfsm run: the client's own bug`, exit status 2 (could not start):
    # no traceback, and not the session that keeps the run, logged failed.
    store = str(tmp_path / "s.db")
    agent = ["--agent", f"{TOOLS}:broken", "--store", store]
    assert main(["run", "hello", *agent]) == 1
    out, err = capsys.readouterr()
    session = re.findall(r"session (ses_\w+) stored in", out)
    assert session, out
    assert "run failed: it crashed on RuntimeError: the client's own bug" in out
    assert "Traceback" in err
    assert "in _broken" in err
    assert main(["sessions", "show", session[0], "--store", store]) == 0
    assert "failed  0 turn(s)" in capsys.readouterr().out


def test_a_run_that_crashes_going_on_names_its_session(
    tmp_path: Path, capsys: Capture
) -> None:
    store = str(tmp_path / "s.db")
    assert main(["run", "clean up", "--agent", CAREFUL, "--store", store]) == 3
    (session,) = re.findall(r"session (ses_\w+) stored in", capsys.readouterr().out)
    agent = ["--agent", f"{TOOLS}:careful_then_broken", "--store", store]
    assert main(["approve", session, *agent]) == 1
    out, err = capsys.readouterr()
    assert f"session {session} stored in" in out
    assert "run failed: it crashed on RuntimeError: the client's own bug" in out
    assert "Traceback" in err


@pytest.mark.parametrize(
    ("max_turns", "turns"),
    [(None, LOCAL_MAX_TURNS), (12, 12)],
    ids=["default", "given"],
)
def test_a_run_on_the_local_model_makes_a_few_model_calls_unless_told(
    max_turns: int | None, turns: int
) -> None:
    # Given a tool's result, the tiny local model called the same tool again
    # every turn: 50 calls, many minutes, before the run failed.
    options = AgentOptions(model="local", max_turns=max_turns)
    driver = _driver(ScriptedModel([]), 2048, [], None, options)
    assert driver.max_turns == turns


def test_a_run_out_of_model_calls_names_the_option_that_gives_more() -> None:
    # It said "raise max_turns", a setting the command line has no name for.
    said = cli_words(MaxTurnsExceeded(3), AgentOptions(model="local"))
    assert said.startswith("the run reached --max-turns 3 without a final answer")
    assert "raise --max-turns" in said
    assert "the local model's default is 3" in said
    given = cli_words(MaxTurnsExceeded(9), AgentOptions(model="local", max_turns=9))
    assert "default" not in given
    mine = cli_words(MaxTurnsExceeded(9), AgentOptions(agent=CAREFUL))
    assert "max_turns=9" in mine  # your agent's own setting


def test_an_async_factory_is_refused_and_its_coroutine_closed(
    capsys: Capture, tmp_path: Path
) -> None:
    # It said "the function returned a coroutine", then Python warned that
    # the coroutine was never awaited.
    spec = f"{TOOLS}:makes_an_agent_later"
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert (
            main(["run", "hi", "--store", str(tmp_path / "s.db"), "--agent", spec]) == 2
        )
        gc.collect()
    assert [str(w.message) for w in seen] == []
    assert capsys.readouterr().err == (
        f"turnfsm run: invalid --agent='{spec}': expected a function that makes "
        "an agent and returns it (it is an async def, which the command line "
        "does not await: make an agent in a plain def)\n"
    )


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (["--n-ctx", "200000"], "--n-ctx=200000"),
        # --n-ctx defaults to --window: the window given is the one named.
        (["--window", "100000"], "--window=100000"),
    ],
)
def test_a_local_window_past_the_bundled_model_is_refused_before_it_starts(
    argv: list[str], option: str, capsys: Capture, tmp_path: Path
) -> None:
    # The server started, died allocating memory, and its log was printed.
    store = str(tmp_path / "s.db")
    assert main(["run", "hi", "--model", "local", "--store", store, *argv]) == 2
    assert capsys.readouterr().err == (
        f"turnfsm run: invalid {option}: expected an int in 1..32,768, the "
        "bundled Gemma 3 270M's trained context\n"
    )


class _LocalCompletions(http.server.BaseHTTPRequestHandler):
    """A stand-in for the local model's server: every reply is "hello"."""

    def do_POST(self) -> None:
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        reply = {"role": "assistant", "content": "hello"}
        done = {"index": 0, "finish_reason": "stop"}
        usage = {"prompt_tokens": 5, "completion_tokens": 1}
        if request.get("stream"):
            chunks = [
                {"choices": [{"index": 0, "delta": reply}]},
                {"choices": [{**done, "delta": {}}], "usage": usage},
            ]
            data = "".join(
                f"data: {json.dumps({'id': 'x', 'model': 'local', **c})}\n\n"
                for c in chunks
            )
            body, kind = (data + "data: [DONE]\n\n").encode(), "text/event-stream"
        else:
            choice = {**done, "message": reply}
            completion = {"id": "x", "model": "local", "choices": [choice]}
            body = json.dumps({**completion, "usage": usage}).encode()
            kind = "application/json"
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # no /props: the window is the n_ctx it started with
        self.send_error(404)

    def log_message(self, *_args: object) -> None:
        pass


def test_the_local_model_s_start_is_announced_and_timed(
    capsys: Capture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Loading the model took 15 s on a busy machine, with nothing printed:
    # the command seemed to hang before its first line.
    from turnfsm.providers import LlamaServer

    with http_server(_LocalCompletions) as (url, _served):

        def start(server: LlamaServer) -> LlamaServer:
            print("(the server starts)", file=sys.stderr)
            server.port = int(url.rsplit(":", 1)[1])
            return server

        monkeypatch.setattr(LlamaServer, "start", start)
        argv = ["run", "hi", "--model", "local", "--store", "memory:"]
        assert main([*argv, "--n-ctx", "2048"]) == 0
    out, err = capsys.readouterr()
    assert re.fullmatch(
        r"starting the local model \(Gemma 3 270M on llama.cpp, a 2,048-token "
        r"window\) \.\.\.\n\(the server starts\)\nlocal model ready in \d+\.\d s\n",
        err,
    ), err
    assert "hello" in out


def test_a_local_model_that_fails_to_start_was_announced_first(
    capsys: Capture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from turnfsm.errors import ModelServerFailed
    from turnfsm.providers import LlamaServer

    def start(server: LlamaServer) -> LlamaServer:
        raise ModelServerFailed(
            model_path="/models/gemma.gguf", port=1, reason="exited with status 1"
        )

    monkeypatch.setattr(LlamaServer, "start", start)
    assert main(["run", "hi", "--model", "local", "--store", "memory:"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "starting the local model (Gemma 3 270M on llama.cpp, a 4,096-token "
        "window) ...",
        "turnfsm run: the llama.cpp server of /models/gemma.gguf on port 1 exited "
        "with status 1",
    ]


def test_a_store_that_cannot_be_used_is_named_before_the_local_model_starts(
    capsys: Capture, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # The local model was started (seconds) and stopped, then the store refused.
    from turnfsm.errors import ModelServerFailed
    from turnfsm.providers import LlamaServer

    started: list[LlamaServer] = []

    def start(server: LlamaServer) -> LlamaServer:
        started.append(server)
        raise ModelServerFailed(model_path="m.gguf", port=1, reason="(a stand-in)")

    monkeypatch.setattr(LlamaServer, "start", start)
    missing = str(tmp_path / "no" / "s.db")
    for store in ("nonsense://x", missing):
        assert main(["run", "hi", "--model", "local", "--store", store]) == 2
        (line,) = capsys.readouterr().err.splitlines()
        assert line.startswith("turnfsm run: ")
        assert "--store" in line
    assert started == []


def _local_starts(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """The local servers a command starts (each fails at once), as a list."""
    from turnfsm.errors import ModelServerFailed
    from turnfsm.providers import LlamaServer

    started: list[object] = []

    def start(server: LlamaServer) -> LlamaServer:
        started.append(server)
        raise ModelServerFailed(model_path="m.gguf", port=1, reason="(a stand-in)")

    monkeypatch.setattr(LlamaServer, "start", start)
    return started


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--session", "nope"], "no session 'nope' in "),
        (["--window", "200"], "invalid --window=200: expected a window well over"),
        (
            ["--window", "8000", "--n-ctx", "4096"],
            "--window=8000 is larger than the local server's window of 4096",
        ),
        (["--max-tokens", "4000"], "invalid --max-tokens=4000"),
        (
            ["--window", "400", "--max-tokens", "10", "--system", "word " * 300],
            "invalid --window=400: expected a window of at least 610 tokens, whose",
        ),
        # The window --n-ctx sizes the server to is named by --n-ctx, the
        # option given (--window, not given, would only confuse).
        (["--n-ctx", "200"], "invalid --n-ctx=200: expected a window well over"),
        (
            ["--n-ctx", "400", "--max-tokens", "10", "--system", "word " * 300],
            "invalid --n-ctx=400: expected a window of at least 610 tokens, whose",
        ),
        (
            ["--n-ctx", "4096", "--window", "200"],
            "invalid --window=200: expected a window well over",
        ),
    ],
    ids=[
        "unknown session",
        "small window",
        "window over n_ctx",
        "reply budget",
        "system prompt",
        "small n_ctx",
        "system prompt over n_ctx",
        "small window under n_ctx",
    ],
)
def test_what_refuses_the_run_is_named_before_the_local_model_starts(
    argv: list[str],
    said: str,
    capsys: Capture,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    # The local model was started (seconds), then the session or the
    # settings refused, and the model was stopped.
    started = _local_starts(monkeypatch)
    store = str(tmp_path / "s.db")
    assert main(["run", "hi", "--model", "local", "--store", store, *argv]) == 2
    out, err = capsys.readouterr()
    assert (out, started) == ("", [])
    (line,) = err.splitlines()
    assert line.startswith(f"turnfsm run: {said}"), line


def test_a_session_with_an_open_run_is_refused_before_the_local_model_starts(
    capsys: Capture, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    store = str(tmp_path / "s.db")
    session_id = _paused(store, capsys)
    started = _local_starts(monkeypatch)
    argv = ["run", "And now?", "--model", "local", "--store", store]
    assert main([*argv, "--session", session_id]) == 2
    out, err = capsys.readouterr()
    assert (out, started) == ("", [])
    assert err.startswith(
        f"turnfsm run: session {session_id!r} has an open run 'run_"
    ), err
    assert f"turnfsm approve|reject|abandon {session_id} --model local" in err
