"""``turnfsm simulate SESSION``: the table, the passes, the refusals."""

from __future__ import annotations

import re

import anyio
import pytest

from tests.simulate._runs import measured
from tests.simulate.user_compactor import KeepRecent
from turnfsm import Agent
from turnfsm.cli import main
from turnfsm.context import ContextManager
from turnfsm.persistence import Session, SQLiteStore
from turnfsm.testing import ScriptedModel, reply, tool_call

Capture = pytest.CaptureFixture[str]

STORE = "sqlite:///sessions.db"
ROW = re.compile(r"^run_\w+ +(\d+) +(\d+) +(\d+)(?: +(yes))?(?: +(\d+\.\d+))?$", re.M)
PASS = re.compile(
    r"^  run_\w+ after call (\d+): (\w+) -> (\w+) \((\w+), (\d+) -> (\d+)",
    re.M,
)


def _demo_session(capsys: Capture) -> str:
    assert main(["demo", "--quiet", "--store", STORE]) == 0
    assert main(["sessions", "list", "--store", STORE]) == 0
    listing = capsys.readouterr().out
    (session_id,) = re.findall(r"^(ses_\w+)", listing, re.M)
    return session_id


def _stored_figures(session_id: str) -> tuple[list[int], list[tuple[str, ...]]]:
    """The demo's stored session as its log tells it: call sizes, passes."""

    async def load() -> Session:
        store = SQLiteStore("sessions.db")
        try:
            return await Session.load(store, session_id)
        finally:
            await store.aclose()

    (run,) = anyio.run(load).runs
    passes = [
        (str(p.turn), p.reason, p.verdict, str(p.tokens_before), str(p.tokens_after))
        for p in run.compactions
    ]
    return measured(run), passes


def test_the_demos_session_with_no_options_reproduces_the_stored_figures(
    capsys: Capture,
) -> None:
    session_id = _demo_session(capsys)
    assert main(["demo", "--store", "memory:"]) == 0
    demo = capsys.readouterr().out
    args = ["simulate", session_id, "--store", STORE]
    code = main(args)  # the settings the log keeps
    out = capsys.readouterr().out
    assert code == 0, out
    assert "simulated with TruncatingCompactor, window 8000, threshold 80%" in out
    rows = ROW.findall(out)
    sizes, stored = _stored_figures(session_id)
    assert [int(r[0]) for r in rows] == [1, 2, 3, 4, 5, 6]
    assert [int(r[1]) for r in rows] == sizes  # every call's tokens, exactly
    passes = [(p[0], p[1], p[2], p[4], p[5]) for p in PASS.findall(out)]
    assert passes == stored  # every pass: call, reason, verdict, sizes
    # The demo printed its passes as they happened: the same ones.
    shown = re.findall(
        r"\[compaction\] (?:EMERGENCY )?reason=(\w+) \(\w+\): "
        r"(\d+) -> (\d+) tokens",
        demo,
    )
    assert [(p[1], p[3], p[4]) for p in passes] == shown
    assert {p[3] for p in PASS.findall(out)} == {"TruncatingCompactor"}
    assert "differs:" not in out
    assert "stands in" not in out  # no setting was guessed
    # A user's compactor with the demo's settings gives the same figures, and
    # so does a function making a whole context manager.
    for spec in ("compactor", "make_context", "mine"):
        option = f"tests.simulate.user_compactor:{spec}"
        assert main([*args, "--compactor", option]) == 0
        assert ROW.findall(capsys.readouterr().out) == rows


def test_a_compactor_the_log_names_only_by_class_must_be_given(
    capsys: Capture,
) -> None:
    class Local(KeepRecent):
        """Defined in a function: it cannot be imported again."""

    async def record() -> str:
        store = SQLiteStore("sessions.db")
        agent = Agent(
            model=ScriptedModel.of("Hello."),
            context=ContextManager(Local(), context_window=8_000),
            store=store,
        )
        try:
            assert (await agent.run("Hi")).ok
        finally:
            await store.aclose()
        return agent.session.id

    session_id = anyio.run(record)
    args = ["simulate", session_id, "--store", STORE]
    assert main(args) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("turnfsm simulate: invalid --compactor='Local'")
    assert "--compactor MODULE:ATTR" in captured.err
    option = "tests.simulate.user_compactor:mine"
    assert main([*args, "--compactor", option]) == 0
    out = capsys.readouterr().out
    assert "simulated with KeepRecent, window 8000, threshold 80%" in out


def test_layered_at_4000_tokens_reports_every_pass_with_costs(capsys: Capture) -> None:
    session_id = _demo_session(capsys)
    code = main(
        [
            "simulate",
            session_id,
            "--store",
            STORE,
            "--strategy",
            "layered",
            "--window",
            "4000",
            "--newest-exchange",
            "--summary-model",
            "demo",
            "--prices",
            "gpt-4o",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert "simulated with LayeredCompactor, window 4000" in out
    rows = ROW.findall(out)
    assert rows
    assert all(r[4] for r in rows)  # every call has its cost
    passes = PASS.findall(out)
    (count,) = re.findall(r"^passes: (\d+)$", out, re.M)
    assert len(passes) == int(count) >= 2
    assert {p[3] for p in passes} == {"LayeredCompactor"}
    for p in passes:
        assert int(p[5]) < int(p[4])  # each pass shrank the request
        assert int(p[5]) <= 4000
    # Every pass says what its summary cost.
    assert len(re.findall(r"tokens, summary \$\d+\.\d{6}\)$", out, re.M)) == len(passes)
    assert "at gpt-4o prices" in out
    assert re.search(r"cost \$\d+\.\d{6} at gpt-4o prices", out)
    assert "the model would have answered differently" in out


def test_cache_payback_prices_every_pass_against_the_prompt_cache(
    capsys: Capture,
) -> None:
    session_id = _demo_session(capsys)
    args = ["simulate", session_id, "--store", STORE, "--prices", "claude-sonnet-4-5"]
    assert main([*args, "--strategy", "masking", "--window", "4000"]) in (0, 1)
    plain = capsys.readouterr().out
    code = main(
        [*args, "--strategy", "masking", "--window", "4000", "--cache-payback", "1"]
    )
    out = capsys.readouterr().out
    assert code in (0, 1), out
    passes = PASS.findall(out)
    figures = re.findall(
        r"^    cache: invalidates (\d+) cached tokens, costs \$\d+\.\d{6}, "
        r"saves \$-?\d+\.\d{6} a call",
        out,
        re.M,
    )
    # Every pass, kept or declined, says what it invalidates and costs.
    assert passes
    assert len(figures) == len(passes)
    assert len(PASS.findall(plain)) == len(re.findall(r"^    cache: ", plain, re.M))
    # The demo's threshold pass would not pay back on the next call.
    declined = [p for p in passes if p[2] == "noop"]
    assert declined
    assert "declined" not in plain
    assert len(re.findall(r"declined: it would ", out)) == len(declined)
    assert f"{len(declined)} declined)" in out


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("0.8", "expected an int percentage in 0..100 (80, not 0.8)"),
        ("abc", "expected an int percentage in 0..100, not 'abc'"),
    ],
)
def test_a_threshold_that_is_no_whole_percentage_names_the_one_meant(
    capsys: Capture, value: str, said: str
) -> None:
    # It said "invalid int value: '0.8'", though the docs warn: 80, not 0.8.
    with pytest.raises(SystemExit) as exited:  # a usage error, as argparse's
        main(["simulate", "ses_x", "--threshold", value])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.endswith(f"turnfsm simulate: error: argument --threshold: {said}\n")


@pytest.mark.parametrize(
    ("options", "said"),
    [
        ([], "no session 'ses_nope'"),
        (["--strategy", "fast"], "invalid --strategy='fast'"),
        (["--prices", "gpt-nope"], "invalid --prices='gpt-nope'"),
        (["--compactor", "nomodule:x"], "invalid --compactor='nomodule:x'"),
        (  # named as typed, not as the object it names (42, <... object at ...>)
            ["--compactor", "tests.simulate.user_compactor:not_a_compactor"],
            "invalid --compactor='tests.simulate.user_compactor:not_a_compactor': "
            "expected a ContextCompactor",
        ),
        (
            ["--compactor", "tests.simulate.user_compactor:nothing"],
            "invalid --compactor='tests.simulate.user_compactor:nothing'",
        ),
        (["--compactor", "x:y", "--strategy", "layered"], "invalid --compactor"),
        (["--window", "-1"], "invalid --window=-1"),
        (["--threshold", "101"], "invalid --threshold=101"),
        (
            ["--strategy", "masking", "--newest-exchange"],
            "invalid --newest-exchange=True: expected a compactor with a "
            "compact_newest_exchange setting (MaskingCompactor has none: it cuts "
            "inside the newest exchange already)",
        ),
        (["--summary-model", "nowhere"], "invalid --summary-model='nowhere'"),
        (
            ["--strategy", "layered", "--window", "4000", "--newest-exchange"],
            "missing --summary-model",
        ),
        (["--machine", "missing.toml"], "missing.toml"),
        (["--cache-payback", "3"], "invalid --cache-payback=3"),
        (["--cache-payback", "0", "--prices", "gpt-4o"], "invalid --cache-payback=0"),
    ],
)
def test_bad_input_is_refused_naming_the_option_and_value(
    capsys: Capture, options: list[str], said: str
) -> None:
    session_id = _demo_session(capsys)
    if not options:
        session_id = "ses_nope"
    assert main(["simulate", session_id, "--store", STORE, *options]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("turnfsm simulate: ")
    assert said in captured.err


@pytest.mark.parametrize(
    ("options", "header"),
    [
        (["--window", "0"], "window 0 (no lines)"),
        (["--threshold", "0"], "window 8000, threshold off"),
    ],
)
def test_a_line_turned_off_is_said_to_be_off(
    capsys: Capture, options: list[str], header: str
) -> None:
    # The header said "window 0, threshold 80%" and "threshold 0%": read as
    # figures, where 0 turns the lines off (no pass at the threshold).
    session_id = _demo_session(capsys)
    main(["simulate", session_id, "--store", STORE, *options])
    out = capsys.readouterr().out
    assert f"simulated with TruncatingCompactor, {header}\n" in out
    assert "threshold_exceeded" not in out


def test_a_window_too_small_for_the_pins_names_the_option(capsys: Capture) -> None:
    session_id = _demo_session(capsys)
    assert main(["simulate", session_id, "--store", STORE, "--window", "100"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("turnfsm simulate: invalid --window=100: expected a window")


@pytest.mark.parametrize(
    ("options", "said"),
    [
        (["--window", "-1"], "invalid --window=-1: expected an int in 0..100,000,000"),
        (
            ["--cache-payback", "0", "--prices", "gpt-4o"],
            "invalid --cache-payback=0: expected an int in 1..1,000,000",
        ),
    ],
)
def test_a_refused_number_offers_nothing_the_command_line_cannot_take(
    capsys: Capture, options: list[str], said: str
) -> None:
    # It ended "..., or None (the model's)": there is no None to type.
    session_id = _demo_session(capsys)
    assert main(["simulate", session_id, "--store", STORE, *options]) == 2
    err = capsys.readouterr().err
    assert said in err
    assert "None" not in err


def ping() -> str:
    """Ping."""
    return "pong"


def test_a_run_that_crashed_is_simulated_with_no_difference(capsys: Capture) -> None:
    # A run that crashed (its model raised) was simulated as interrupted and
    # reported `differs: ... ended interrupted in the simulation (failed in
    # the log)`, with exit status 1, for a session simulated unchanged.
    async def record() -> str:
        store = SQLiteStore("sessions.db")
        agent = Agent(
            model=ScriptedModel.of(
                reply("", tool_call("ping", "c1")), ValueError("boom"), "Fine."
            ),
            tools=[ping],
            store=store,
        )
        try:
            with pytest.raises(ValueError, match="boom"):
                await agent.run("Ping it.")
            assert (await agent.run("Again.")).ok
        finally:
            await store.aclose()
        return agent.session.id

    session_id = anyio.run(record)
    capsys.readouterr()
    assert main(["simulate", session_id, "--store", STORE]) == 0
    out = capsys.readouterr().out
    assert "differs" not in out
    (crashed,) = re.findall(
        r"^note: run (run_\w+) crashed in its log on (.*)$", out, re.M
    )
    assert crashed[1] == (
        "ValueError: boom; it is simulated up to where its log stops, as the "
        "crash stopped it"
    )
