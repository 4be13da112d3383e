"""`turnfsm eval`: the shipped corpus's table, the floor, a user's sessions, a judge."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from tests.evals._judged import context_only, judged
from tests.helpers import REPO_ROOT
from turnfsm import Agent
from turnfsm.cli import main
from turnfsm.context import ContextManager, TruncatingCompactor
from turnfsm.errors import ConfigError, ProviderError
from turnfsm.evals import (
    CORPUS_SESSIONS,
    PROBE_KINDS,
    context_text,
    corpus_probes,
    evaluate,
    replay_session,
    shipped_strategy,
    store_corpus,
)
from turnfsm.messages import Message
from turnfsm.persistence import MemoryStore, SQLiteStore
from turnfsm.providers import ModelRequest
from turnfsm.simulate import simulate
from turnfsm.testing import (
    ExtractiveSummaryModel,
    FakeModelClient,
    ScriptedModel,
    reply,
    tool_call,
)

pytestmark = pytest.mark.timeout(300)

# What `turnfsm eval` prints on the shipped corpus: every strategy is
# deterministic there (the summary model is the extractive stand-in).
TABLE = Path(__file__).with_name("eval_table.txt")


def test_the_shipped_corpus_table_is_exact(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eval"]) == 0
    assert capsys.readouterr().out == TABLE.read_text()


def test_the_corpus_plants_every_kind_in_each_session() -> None:
    probes = corpus_probes()
    for session in CORPUS_SESSIONS:
        kinds = {p.kind for p in probes if p.session == session}
        assert kinds == set(PROBE_KINDS)


@pytest.mark.anyio
async def test_uncompacted_every_probe_is_present_and_nothing_was_compacted() -> None:
    sessions = await store_corpus(MemoryStore())
    assert [s.id for s in sessions] == list(CORPUS_SESSIONS)
    assert all(not r.compactions for s in sessions for r in s.runs)
    evaluation = await evaluate(
        sessions,
        corpus_probes(),
        strategies={"truncating": lambda m: shipped_strategy("truncating", m)},
        window=1_000_000,
        summary_model=ExtractiveSummaryModel(),
        settings=ContextManager(max_messages=0),
    )
    (result,) = evaluation.results
    assert result.passes == 0
    assert all(p.present for p in result.probes)


def test_the_floor_fails_on_a_compactor_that_drops_everything(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["eval", "--strategy", "digest", "--floor", "0.5"]
    assert main(argv) == 0
    capsys.readouterr()
    careless = "tests.evals.drop_all:drop_all"
    assert main([*argv, "--strategy", careless]) == 1
    captured = capsys.readouterr()
    assert f"| {careless} |" in captured.out
    assert f"turnfsm eval: {careless} keeps 12% of the probes" in captured.err
    assert "digest keeps" not in captured.err


def test_runs_cut_short_say_why(capsys: pytest.CaptureFixture[str]) -> None:
    # A strategy that fails every pass cut runs short with no reason given:
    # the table said "70" and nothing of the ValueError.
    raising = "tests.evals.drop_all:raising"
    assert main(["eval", "--strategy", raising, "--strategy", "digest"]) == 0
    out = capsys.readouterr().out
    (row,) = [line for line in out.splitlines() if line.startswith(f"| {raising} ")]
    cut = int(row.rstrip(" |").rsplit("|", 1)[1])
    assert cut > 0
    (note,) = [line for line in out.splitlines() if line.startswith(f"- {raising}:")]
    assert note.startswith(
        f"- {raising}: {cut} runs cut short; the first ended failed "
    )
    assert "ValueError: the summary service is down" in note
    assert len(note) < 400


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--strategy", "shrinking"], "invalid --strategy='shrinking'"),
        (["--strategy", "tests.evals.drop_all:nothing"], "no 'nothing'"),
        (["--strategy", "tests.evals.test_eval:TABLE"], "a ContextCompactor"),
        (  # named as typed, not "compactor=<... object at 0x...>"
            ["--strategy", "tests.evals.drop_all:plain_def"],
            "invalid --strategy='tests.evals.drop_all:plain_def': expected a "
            "ContextCompactor (an async compact() method); its compact() is a "
            "plain def",
        ),
        (
            ["--strategy", "tests.evals.drop_all:PlainDef"],
            "invalid --strategy='tests.evals.drop_all:PlainDef'",
        ),
        (["--floor", "80"], "invalid --floor=80.0: expected a share in 0..1"),
        (["--window", "0"], "invalid --window=0"),
        (["some-session"], "missing --probes"),
        (["--probes", "missing.toml"], "a readable probe file"),
        (["--prices", "gpt-nothing"], "invalid --prices='gpt-nothing'"),
    ],
)
def test_a_bad_option_exits_2_naming_it(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["eval", *argv]) == 2
    captured = capsys.readouterr()
    assert message in captured.err
    assert captured.out == ""


async def _store_session(path: Path) -> str:
    """A user's own session: a greeting, a fact stated, then four runs of chat."""
    agent = Agent(
        model=ScriptedModel.of("Hello.", "Noted.", *["Fine."] * 4),
        store=SQLiteStore(path),
        context=ContextManager(context_window=100_000),
    )
    await agent.run("Hello!")
    await agent.run("Remember: the deploy code is 7431. " + "padding " * 150)
    for _ in range(4):
        await agent.run("How are things? " + "more padding " * 150)
    await agent.store.aclose()
    return agent.session.id


def test_a_users_own_session_with_their_probe_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "sessions.db"
    session_id = anyio.run(_store_session, db)
    probes = tmp_path / "probes.toml"
    probes.write_text(
        f'[[probe]]\nsession = "{session_id}"\nkind = "fact"\n'
        'question = "What is the deploy code?"\nexpect = "7431"\n'
    )
    argv = ["eval", session_id, "--probes", str(probes), "--store", str(db)]
    argv += ["--strategy", "truncating", "--window", "2000", "--floor", "1"]
    assert main(argv) == 1  # truncating dropped the second turn: the fact is gone
    out = capsys.readouterr().out
    assert f"Sessions: {session_id}; window 2,000" in out
    assert "| truncating | " in out
    assert "| 0/1 (0%) |" in out
    assert main([*argv[:-4], "--window", "100000", "--floor", "1"]) == 0
    assert "| 1/1 (100%) |" in capsys.readouterr().out
    assert main(["eval", "nosuch", "--probes", str(probes), "--store", str(db)]) == 2
    assert "nosuch" in capsys.readouterr().err


def test_a_session_given_twice_is_refused_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # `turnfsm eval S S` counted S twice in every row.
    db = tmp_path / "sessions.db"
    session_id = anyio.run(_store_session, db)
    probes = tmp_path / "probes.toml"
    probes.write_text('[[probe]]\nkind = "fact"\nquestion = "q?"\nexpect = "x"\n')
    argv = ["eval", session_id, session_id, "--probes", str(probes)]
    assert main([*argv, "--store", str(db)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        f"turnfsm eval: invalid SESSION='{session_id}': expected each session "
        "once (it is given twice)\n"
    )


def test_a_mistyped_store_is_refused_and_not_made(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # `turnfsm eval S --store typo.db` left an empty database at typo.db and
    # said "no session 'S' in typo.db".
    probes = tmp_path / "probes.toml"
    probes.write_text('[[probe]]\nkind = "fact"\nquestion = "q?"\nexpect = "x"\n')
    typo = tmp_path / "typo.db"
    argv = ["eval", "ses_1", "--probes", str(probes), "--store", str(typo)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"invalid --store='{typo}': expected a store file that exists" in err
    assert not typo.exists()


@pytest.mark.anyio
async def test_a_judge_is_asked_every_probe_over_each_final_context() -> None:
    judge = FakeModelClient(context_only)
    evaluation = await judged("layered", judge)
    (result,) = evaluation.results
    assert len(judge.requests) == len(corpus_probes())
    assert result.judged_share == result.present_share == result.score
    assert "| judge right |" in evaluation.table().splitlines()[2]


@pytest.mark.anyio
async def test_a_judge_that_fails_answers_nothing() -> None:
    def failing(_request: ModelRequest) -> Message:
        raise ProviderError("the judge is down")

    evaluation = await judged("digest", FakeModelClient(failing))
    (result,) = evaluation.results
    assert result.judged_share == 0 < result.present_share
    assert all(p.answer is None for p in result.probes)


@pytest.mark.anyio
async def test_a_replay_under_the_recorded_settings_sees_the_stored_contexts() -> None:
    sessions = await store_corpus(MemoryStore())
    for session in sessions:
        replay = await replay_session(
            session,
            ContextManager(
                TruncatingCompactor(), context_window=1_000_000, max_messages=0
            ),
        )
        stored = [
            context_text([session.message(i) for i in run.context(n)])
            for run in session.runs
            for n in range(len(run.turns))
        ]
        assert [context_text(c.messages) for c in replay.calls] == stored
        assert replay.passes == ()
        assert replay.cut_short == ()


@pytest.mark.anyio
async def test_the_pass_count_rises_exactly_where_a_pass_rewrote_the_context() -> None:
    (coding, _chat) = await store_corpus(MemoryStore())
    manager = ContextManager(TruncatingCompactor(), context_window=16_384)
    replay = await replay_session(coding, manager)
    simulation = await simulate(coding, context=manager)
    assert replay.passes
    rises = [
        n
        for n, call in enumerate(replay.calls)
        if call.passes > (replay.calls[n - 1].passes if n else 0)
    ]
    breaks = [n for n, call in enumerate(simulation.calls) if call.cache_break]
    assert rises == breaks


@pytest.mark.anyio
async def test_a_session_compacted_when_recorded_is_weighed_uncompacted() -> None:
    """`tokens kept` is against the whole conversation, not the stored history."""
    context = ContextManager(
        TruncatingCompactor(preserve_recent=2, min_messages=3), max_messages=6
    )
    agent = Agent(
        model=ScriptedModel.of(*[f"answer {i}: " + "so " * 50 for i in range(8)]),
        context=context,
    )
    said: list[Message] = []
    for i in range(8):
        question = Message.user(f"question {i}: " + "why " * 50)
        result = await agent.run([question])
        assert result.ok
        said += [question, agent.session.history[-1]]
    assert any(run.compactions for run in agent.session.runs)
    assert len(agent.session.history) < len(said)

    replay = await replay_session(agent.session, context)

    assert replay.history_tokens == context.count(said)


@pytest.mark.anyio
async def test_a_paused_run_s_messages_are_weighed_too() -> None:
    """A paused run's last call carried what it brought, committed or not."""
    from turnfsm import approval_machine

    def look() -> str:
        """Look."""
        return "seen " * 40

    agent = Agent(
        model=ScriptedModel.of(
            "done: " + "so " * 30,
            reply("", tool_call("look", "c1")),
        ),
        tools=[look],
        machine=approval_machine(),
    )
    assert (await agent.run("first " * 30)).ok
    paused = await agent.run("second " * 60)
    assert paused.outcome == "paused"

    replay = await replay_session(agent.session, ContextManager())
    final = replay.calls[-1].messages

    assert 0 < ContextManager().count(list(final)) <= replay.history_tokens


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("sessions", "probes", "field"),
    [("corpus-chat", [], "sessions"), ([object()], [], "sessions[0]")],
)
async def test_what_is_not_sessions_or_probes_is_refused_naming_it(
    sessions: object, probes: object, field: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        await evaluate(
            sessions,  # type: ignore[arg-type]
            probes,  # type: ignore[arg-type]
            strategies={"masking": lambda m: shipped_strategy("masking", m)},
            window=16_384,
            summary_model=ExtractiveSummaryModel(),
        )
    assert caught.value.field == field


@pytest.mark.anyio
async def test_evaluate_refuses_a_session_given_twice() -> None:
    (session, _chat) = await store_corpus(MemoryStore())
    with pytest.raises(ConfigError) as caught:
        await evaluate(
            [session, session],
            corpus_probes(),
            strategies={"masking": lambda m: shipped_strategy("masking", m)},
            window=16_384,
            summary_model=ExtractiveSummaryModel(),
        )
    assert (caught.value.field, caught.value.value) == ("sessions[1]", session.id)


@pytest.mark.parametrize(
    ("given", "field"),
    [
        ({"strategies": {"t": TruncatingCompactor()}}, "strategies['t']"),
        ({"strategies": ["truncating"]}, "strategies"),
        ({"judge": 5}, "judge"),
        ({"settings": 5}, "settings"),
        ({"progress": 5}, "progress"),
        ({"summary_model": "gpt-4o"}, "summary_model"),
    ],
)
@pytest.mark.anyio
async def test_evaluate_refuses_what_it_cannot_use_naming_it(
    given: dict[str, object], field: str
) -> None:
    # A compactor made once where a function of the summary model is due
    # failed inside ("object is not callable"), as did the others.
    sessions = list(await store_corpus(MemoryStore()))
    options: dict[str, object] = {
        "strategies": {"masking": lambda m: shipped_strategy("masking", m)},
        "window": 16_384,
        "summary_model": ExtractiveSummaryModel(),
        **given,
    }
    with pytest.raises(ConfigError) as caught:
        await evaluate(sessions, corpus_probes(), **options)  # type: ignore[arg-type]
    assert caught.value.field == field


def test_the_strategy_guide_shows_the_corpus_table_as_it_is() -> None:
    guide = (REPO_ROOT / "docs/how-to/choose-a-strategy.md").read_text()
    section = guide.split("## Measured trade-offs")[1]
    shown = [line for line in section.splitlines() if line.startswith("| ")][1:]
    rows = {
        cells[0]: cells
        for line in TABLE.read_text().splitlines()
        if line.startswith("| ")
        for cells in [[c.strip() for c in line.strip("|").split("|")]]
    }
    assert shown, "the guide shows no table"
    for line in shown:
        cells = [c.strip() for c in line.strip("|").split("|")]
        full = rows[cells[0]]
        assert cells == [full[0], full[1], full[2], full[3], full[5], full[7]]


@pytest.mark.anyio
async def test_prices_cost_the_calls_and_the_summaries() -> None:
    sessions = await store_corpus(MemoryStore())
    evaluation = await evaluate(
        sessions,
        corpus_probes(),
        strategies={
            "truncating": lambda m: shipped_strategy("truncating", m),
            "layered": lambda m: shipped_strategy("layered", m),
        },
        window=16_384,
        summary_model=ExtractiveSummaryModel(),
        prices="gpt-4o-mini",
    )
    truncating, layered = evaluation.results
    assert truncating.summary_cost == 0 < layered.summary_cost  # type: ignore[operator]
    assert 0 < truncating.cost < layered.cost  # type: ignore[operator]
    assert "| cost $ | summary cost $ |" in evaluation.table()


@pytest.mark.anyio
@pytest.mark.parametrize("window", [-1, 100])
async def test_a_window_that_cannot_be_replayed_on_is_refused_naming_window(
    window: int,
) -> None:
    # It was refused as context_window (a setting evaluate has no argument
    # for) or, too small for the pins, as PinnedTooLarge naming no setting.
    sessions = await store_corpus(MemoryStore())
    with pytest.raises(ConfigError) as caught:
        await evaluate(
            sessions,
            corpus_probes(),
            strategies={"masking": lambda m: shipped_strategy("masking", m)},
            window=window,
            summary_model=ExtractiveSummaryModel(),
        )
    assert (caught.value.field, caught.value.value) == ("window", window)


def test_eval_on_a_window_too_small_for_the_pins_names_the_option(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "sessions.db"
    session_id = anyio.run(_store_session, db)
    probes = tmp_path / "probes.toml"
    probes.write_text('[[probe]]\nkind = "fact"\nquestion = "Code?"\nexpect = "7431"\n')
    argv = ["eval", session_id, "--probes", str(probes), "--store", str(db)]
    assert main([*argv, "--strategy", "truncating", "--window", "100"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("turnfsm eval: invalid --window=100: expected a window of")


def _read(path: str) -> str:
    """Read a file.

    Args:
        path: the file's path.
    """
    return f"# {path}\n" + "".join(f"line {n} of {path}\n" for n in range(40))


@pytest.mark.anyio
async def test_tokens_kept_never_counts_what_a_request_reserves_beside_it() -> None:
    # With a system prompt, tool schemas and a reply budget, a session no
    # pass touched read "12,729 of 12,605 (101.0%)" kept: the final request's
    # size, what it reserved beside its messages included, against the
    # messages alone.
    from turnfsm.evals import Probe
    from turnfsm.testing import reply, tool_call

    model = ScriptedModel.of(
        reply("Reading.", tool_call("_read", "call_1", path="a.py")), "Read it."
    )
    store = MemoryStore()
    agent = Agent(
        model=model,
        tools=[_read],
        system_prompt="You read files. " * 40,
        max_output_tokens=2_000,
        store=store,
    )
    assert (await agent.run("Read a.py.")).ok
    session = agent.session
    evaluation = await evaluate(
        [session],
        [Probe(kind="fact", question="Which file?", expect="a.py")],
        strategies={"masking": lambda m: shipped_strategy("masking", m)},
        window=100_000,
        summary_model=ExtractiveSummaryModel(),
    )
    (result,) = evaluation.results
    assert result.passes == 0
    last = session.runs[-1]
    context = ContextManager()
    seen = [session.message(i) for i in last.context(len(last.turns) - 1)]
    assert result.final_tokens == context.count(seen)
    assert result.final_tokens < result.history_tokens
