"""`simulate`: a stored session again, replies and tool results held fixed."""

from __future__ import annotations

import io
import json
import logging
from decimal import Decimal
from pathlib import Path

import anyio
import attrs
import pytest

from tests.helpers import REPO_ROOT, restamp
from tests.simulate._runs import measured
from turnfsm import Agent, TruncatingCompactor
from turnfsm._resources import load_machine
from turnfsm.cli._demo import STRATEGIES, TASK, SimulatedModel, build_demo_agent
from turnfsm.context import ContextManager, LayeredCompactor
from turnfsm.driver import RunControl
from turnfsm.errors import ConfigError
from turnfsm.messages import Message
from turnfsm.persistence import (
    CompactionRecord,
    MemoryStore,
    Session,
    dump_session,
    load_session,
)
from turnfsm.providers import ModelRequest, known_prices
from turnfsm.simulate import Simulation, simulate, stored_context
from turnfsm.simulate._simulate import CAVEATS
from turnfsm.testing import FakeModelClient, ScriptedModel, reply, tool_call
from turnfsm.tokens import HeuristicTokenCounter


def _pass(p: CompactionRecord) -> tuple[object, ...]:
    return (
        p.turn,
        p.reason,
        p.verdict,
        p.strategy,
        p.tokens_before,
        p.tokens_after,
        p.usage,
        p.replacement,
    )


async def _demo(strategy: str) -> tuple[Session, ContextManager]:
    store = MemoryStore()
    agent = build_demo_agent(io.StringIO(), store=store, strategy=strategy)
    result = await agent.run(TASK)
    assert result.ok
    assert agent.driver.context is not None
    return await Session.load(store, result.session_id), agent.driver.context


@pytest.mark.anyio
@pytest.mark.parametrize("strategy", STRATEGIES)
async def test_the_demo_with_its_own_settings_reproduces_the_stored_figures(
    strategy: str,
) -> None:
    stored, context = await _demo(strategy)
    version = stored.version
    sim = await simulate(stored, context=context)
    assert isinstance(sim, Simulation)
    (run,) = stored.runs
    # Per call: the tokens the log measured, the context the turn record names.
    assert [c.tokens for c in sim.calls] == measured(run)
    assert [c.turn for c in sim.calls] == list(range(1, len(run.turns) + 1))
    for index, call in enumerate(sim.calls):
        seen = tuple(stored.message(i) for i in run.context(index))
        assert call.messages == seen
        assert call.reply == stored.message(run.turns[index].output)
        assert call.run_id == run.run_id
        assert call.cost is None
    # The same passes, with the same reasons, verdicts, sizes and usage.
    assert [_pass(p) for p in sim.passes] == [_pass(p) for p in run.compactions]
    assert sim.caveats == CAVEATS
    assert sim.differences == ()  # no run ended otherwise than it did
    # Every compacted pass rewrote the prefix: the next call's cache breaks.
    assert sim.cache_breaks == sum(1 for p in run.compactions if p.compacted)
    assert stored.version == version  # nothing was written to it


@pytest.mark.anyio
async def test_a_summary_model_that_hangs_still_ends_the_simulation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # No deadline: the simulation waited on the model for ever.
    monkeypatch.setattr("turnfsm.simulate._simulate._PASS_DEADLINE", 0.2)
    stored, context = await _demo("truncating")
    layered = LayeredCompactor(compact_newest_exchange=True)
    smaller = attrs.evolve(context, compactor=layered, context_window=4_000)

    async def hang(_request: ModelRequest) -> str:
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    with anyio.fail_after(60):
        sim = await simulate(
            stored, context=smaller, summary_model=FakeModelClient(hang)
        )
    assert sim.passes
    assert not any(p.compacted for p in sim.passes)


@pytest.mark.anyio
async def test_layered_at_4000_tokens_reports_every_pass_with_costs() -> None:
    stored, context = await _demo("truncating")
    layered = LayeredCompactor(compact_newest_exchange=True)
    smaller = attrs.evolve(context, compactor=layered, context_window=4_000)
    sim = await simulate(
        stored, context=smaller, summary_model=SimulatedModel(), prices="gpt-4o"
    )
    assert sim.differences == ()
    assert len(sim.passes) >= 2
    assert len(sim.pass_costs) == len(sim.passes)
    for p, cost in zip(sim.passes, sim.pass_costs, strict=True):
        assert p.strategy == "LayeredCompactor"
        assert p.compacted
        assert p.tokens_after < p.tokens_before
        assert p.usage is not None  # each pass made a summary call
        assert cost is not None
        assert cost > 0
    assert all(c.tokens <= 4_000 for c in sim.calls)
    prices = known_prices("gpt-4o")
    assert prices is not None
    for call in sim.calls:
        assert call.cost is not None
        out = call.output_tokens
        assert out > 0
        assert call.cost == prices.cost(call.tokens, call.cached_tokens, out)
    # A pass rewrote the prefix before each call after it: the cache breaks.
    assert sim.cache_breaks == len(sim.passes)
    assert sim.cost == sum(c.cost or 0 for c in sim.calls) + sum(
        c or 0 for c in sim.pass_costs
    )
    assert sim.summary_calls == len(sim.passes)
    assert sim.tokens_sent < sum(measured(stored.runs[0]))


@pytest.mark.anyio
async def test_a_summary_the_log_does_not_hold_needs_a_summary_model() -> None:
    stored, context = await _demo("truncating")
    layered = LayeredCompactor(compact_newest_exchange=True)
    smaller = attrs.evolve(context, compactor=layered, context_window=4_000)
    with pytest.raises(ConfigError) as caught:
        await simulate(stored, context=smaller)
    assert caught.value.field == "summary_model"
    assert "does not hold" in str(caught.value)


def _without_settings(stored: Session, path: Path) -> str:
    """`stored`'s log as written before runs kept their context settings."""
    dump_session(stored, str(path))
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    for line in lines:
        for key in ("digests", "seq", "log_version", "entry_count"):
            line.pop(key, None)  # written before lines carried them too
        if line.get("type") == "RunOpened":
            del line["data"]["context"]
    return "".join(json.dumps(line) + "\n" for line in lines)


@pytest.mark.anyio
async def test_without_settings_the_logged_lines_and_compactor_kind_stand_in(
    tmp_path: Path,
) -> None:
    new, _ = await _demo("truncating")
    stored = await load_session(_without_settings(new, tmp_path / "old.jsonl"))
    sim = await simulate(stored)
    assert any("TruncatingCompactor with its defaults" in c for c in sim.caveats)
    # The default truncating compactor keeps the newest exchange whole: the
    # demo's one long run cannot shrink, and the simulation says it failed.
    assert sim.differences
    assert "ended failed in the simulation (done in the log)" in sim.differences[0]
    assert stored_context(stored).window == 8_000


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("value", "field"),
    [("nope-model", "prices"), ("", "prices")],
)
async def test_unknown_prices_are_refused(value: str, field: str) -> None:
    stored, context = await _demo("truncating")
    with pytest.raises(ConfigError) as caught:
        await simulate(stored, context=context, prices=value)
    assert caught.value.field == field
    assert caught.value.value == value


@pytest.mark.anyio
@pytest.mark.parametrize("value", ["gpt-4o", 5])
async def test_a_summary_model_that_is_no_model_is_refused(value: object) -> None:
    stored, context = await _demo("truncating")
    with pytest.raises(ConfigError) as caught:
        await simulate(stored, context=context, summary_model=value)  # type: ignore[arg-type]
    assert caught.value.field == "summary_model"
    assert caught.value.value == value


def test_known_prices_come_from_the_bundled_catalogue() -> None:
    gpt = known_prices("gpt-4o")
    assert gpt is not None
    assert (gpt.input, gpt.cached_input, gpt.output) == (
        Decimal("2.5"),
        Decimal("1.25"),
        Decimal("10"),
    )
    assert gpt.cost(1_000_000, 0, 0) == Decimal("2.5")
    assert gpt.cost(1_000_000, 1_000_000, 1_000_000) == Decimal("11.25")
    claude = known_prices("claude-sonnet-4-5")
    assert claude is not None
    assert claude.tiers  # dearer past 200,000 input tokens
    assert claude.cost(300_000, 0, 0) > claude.cost(100_000, 0, 0) * 3
    assert known_prices("no-such-model") is None


def _read(path: str) -> str:
    """Read a file.

    Args:
        path: the file's path.
    """
    return f"# {path}\n" + "".join(f"line {n} of {path}\n" for n in range(60))


@pytest.mark.anyio
async def test_a_session_of_several_runs_reproduces_run_by_run() -> None:
    calls = [
        reply(f"Reading {i}.", tool_call("_read", f"call_{i}", path=f"f{i}.py"))
        for i in range(6)
    ]
    model = ScriptedModel.of(
        *calls[:3], "first three read", *calls[3:], "all six read", "bye"
    )
    context = ContextManager(
        TruncatingCompactor(preserve_recent=2, min_messages=3),
        context_window=4_000,
        threshold=60,
    )
    store = MemoryStore()
    agent = Agent(
        model=model, tools=[_read], context=context, store=store, system_prompt="Hi."
    )
    for task in ("read f0..f2", "read f3..f5", "thanks"):
        assert (await agent.run(task)).ok
    stored = await Session.load(store, agent.session.id)
    assert len(stored.runs) == 3
    assert any(r.compactions for r in stored.runs)
    sim = await simulate(stored, context=context)
    assert sim.differences == ()
    assert [c.tokens for c in sim.calls] == [
        size for run in stored.runs for size in measured(run)
    ]
    assert [c.run_id for c in sim.calls] == [
        run.run_id for run in stored.runs for _ in run.turns
    ]
    assert sim.passes == tuple(p for r in stored.runs for p in r.compactions)


@pytest.mark.anyio
async def test_the_shipped_machine_file_gives_the_same_figures() -> None:
    stored, context = await _demo("truncating")
    own = await simulate(stored, context=context)
    shipped = load_machine(REPO_ROOT / "machines" / "turn.toml")
    again = await simulate(stored, context=context, machine=shipped)
    assert [c.tokens for c in again.calls] == [c.tokens for c in own.calls]
    assert again.passes == own.passes


@pytest.mark.anyio
async def test_a_pass_outside_any_run_is_simulated_as_a_pass() -> None:
    """`Agent.compact` (`turnfsm sessions compact`) logs a run with no input."""
    chatty = [f"answer {i}: " + "because " * 150 for i in range(6)]
    agent = Agent(
        model=ScriptedModel.of(*chatty),
        context=ContextManager(
            TruncatingCompactor(preserve_recent=2), counter=HeuristicTokenCounter()
        ),
    )
    for i in range(6):
        (await agent.run(f"question {i}")).raise_for_failure()
    manual = await agent.compact()
    assert manual.ok

    simulation = await simulate(agent.session)

    (record,) = simulation.passes
    assert (record.run_id, record.reason, record.verdict) == (
        manual.run_id,
        "manual",
        "compacted",
    )
    assert simulation.differences == ()
    # Made between runs, after the sixth run's one call: not before any call.
    (line,) = [x for x in simulation.table().splitlines() if manual.run_id in x]
    assert line.startswith(f"  {manual.run_id} between runs: manual -> compacted")


@pytest.mark.anyio
async def test_a_pass_by_another_agent_reserves_what_that_agent_sent() -> None:
    """`turnfsm sessions compact` compacts with an agent of its own: no tools."""
    store = MemoryStore()
    context = ContextManager(
        TruncatingCompactor(preserve_recent=2), counter=HeuristicTokenCounter()
    )
    agent = Agent(
        model=ScriptedModel.of(*[f"answer {i}: " + "because " * 150 for i in range(6)]),
        tools=[_read],
        context=context,
        store=store,
        system_prompt="You read files. " * 20,
    )
    for i in range(6):
        (await agent.run(f"question {i}")).raise_for_failure()
    bare = Agent(model=ScriptedModel.of(), context=context, store=store)
    manual = await bare.compact(agent.session.id)
    assert manual.ok
    stored = await Session.load(store, agent.session.id)

    simulation = await simulate(stored)

    (record,) = simulation.passes
    assert record == stored.run(manual.run_id).compactions[0]
    assert simulation.differences == ()


@pytest.mark.anyio
async def test_a_window_too_small_for_the_pins_is_refused_naming_the_window() -> None:
    # It raised PinnedTooLarge, naming no setting, and advised shortening the
    # system prompt or giving fewer tools: nothing a simulation can change.
    stored, context = await _demo("truncating")
    small = attrs.evolve(context, context_window=100)
    with pytest.raises(ConfigError) as caught:
        await simulate(stored, context=small)
    assert caught.value.field == "context_window"
    assert caught.value.value == 100
    run = stored.runs[0].run_id
    assert f"run {run}'s pinned messages" in str(caught.value)
    assert "system prompt" not in str(caught.value)


async def _answered_session() -> Session:
    """Two runs on the approval machine: the first paused, approved, then done."""
    from turnfsm import approval_machine
    from turnfsm.core import ToolCallsReviewed

    store = MemoryStore()
    agent = Agent(
        model=ScriptedModel.of(
            reply("Reading.", tool_call("_read", "call_0", path="a.py")),
            "a.py read",
            "bye",
        ),
        tools=[_read],
        store=store,
        machine=approval_machine(),
    )
    paused = await agent.run("read a.py")
    assert paused.outcome == "paused"
    approved = await agent.resume(
        paused.session_id, paused.run_id, ToolCallsReviewed.approve_all()
    )
    assert approved.outcome == "done"
    assert (await agent.run("thanks")).ok
    return await Session.load(store, agent.session.id)


@pytest.mark.anyio
async def test_a_run_paused_and_answered_is_answered_again_as_the_log_says() -> None:
    # simulate raised SessionBusy ("resume or abandon it first"): the
    # simulated run stopped at its pause, and the next run found it open.
    stored = await _answered_session()
    sim = await simulate(stored)
    assert sim.differences == ()
    assert [c.tokens for c in sim.calls] == [
        size for run in stored.runs for size in measured(run)
    ]


@pytest.mark.anyio
async def test_a_run_paused_only_in_the_simulation_is_said_to_and_the_rest_go_on() -> (
    None
):
    from turnfsm import approval_machine

    model = ScriptedModel.of(
        reply("Reading.", tool_call("_read", "call_0", path="a.py")), "read", "bye"
    )
    store = MemoryStore()
    agent = Agent(model=model, tools=[_read], store=store)
    assert (await agent.run("read a.py")).ok
    assert (await agent.run("thanks")).ok
    stored = await Session.load(store, agent.session.id)
    first, second = (r.run_id for r in stored.runs)
    sim = await simulate(stored, machine=approval_machine())
    assert sim.differences[0].startswith(
        f"run {first} ended paused in the simulation (done in the log)"
    )
    assert [c.run_id for c in sim.calls] == [first, second]


async def _hang(x: int) -> str:
    """Wait for good.

    Args:
        x: a number.
    """
    await anyio.sleep(3600)
    return "never"


async def _stopped_session(how: str, tmp_path: Path) -> Session:
    """A session whose runs are stopped from outside: in a tool, in the model.

    `how`: ``left`` (interrupted, the last run left open), ``abandoned``
    (each abandoned, a run after them), ``cancelled`` (by its control), or
    ``died`` (interrupted, its end gone from the log: its process died).
    """
    calls = 0

    async def answer(request: ModelRequest) -> Message | str:
        nonlocal calls
        calls += 1
        if calls == 2:
            return reply("Waiting.", tool_call("_hang", "call_h", x=1))
        if calls == 3:
            await anyio.sleep(3600)
        return f"answer {calls}"

    store = MemoryStore()
    agent = Agent(model=FakeModelClient(answer), tools=[_hang], store=store)
    assert (await agent.run("hello")).ok
    for text in ["wait in a tool", "wait in the model"]:
        control = RunControl()
        with anyio.move_on_after(0.2 if how != "cancelled" else 5):
            async with anyio.create_task_group() as tasks:
                if how == "cancelled":
                    tasks.start_soon(_cancel_soon, control)
                await agent.run(text, control=control)
        if how in ("left", "died"):
            break
        if how == "abandoned":
            await agent.abandon(agent.session.id, agent.session.runs[-1].run_id)
    if how in ("abandoned", "cancelled"):
        assert (await agent.run("still there?")).ok
    stored = await Session.load(store, agent.session.id)
    expected = {"abandoned": "failed", "cancelled": "cancelled"}
    assert stored.runs[1].outcome == expected.get(how, "interrupted")
    if how != "died":
        return stored
    path = tmp_path / "died.jsonl"
    dump_session(stored, str(path))
    lines = path.read_text().splitlines()
    assert '"RunEnded"' in lines[-1]
    died = await load_session(restamp(lines[:-1]))  # as a store holds it
    assert died.runs[-1].outcome == "running"
    return died


async def _cancel_soon(control: RunControl) -> None:
    await anyio.sleep(0.2)
    control.cancel("stop it")


@pytest.mark.anyio
@pytest.mark.parametrize("how", ["left", "abandoned", "cancelled", "died"])
async def test_a_run_stopped_from_outside_stops_where_its_log_stops(
    how: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A session with a run stopped from outside (Ctrl-C in a tool, or
    # during a model call) differed under its own settings: the run "ended
    # failed in the simulation (interrupted in the log): effect 'run_tools'
    # raised ConfigError ... fix the effect", with a traceback logged; or
    # failed with "no recorded reply" (exit status 1 from the command).
    stored = await _stopped_session(how, tmp_path)
    sim = await simulate(stored)
    assert sim.differences == ()
    assert [c.run_id for c in sim.calls] == [
        r.run_id for r in stored.runs for _ in r.turns
    ]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    # Under other settings too, the runs stop where the log stops.
    other = await simulate(stored, context=ContextManager(context_window=50_000))
    assert other.differences == ()


@pytest.mark.anyio
async def test_a_run_whose_summary_model_failed_is_simulated_as_it_ran() -> None:
    # Under the log's own settings it asked for a summary model: the failed
    # pass holds no summary, and the simulation called that a conversation
    # that differs from the recorded one.
    from turnfsm import SummarizingCompactor
    from turnfsm.driver import RetryPolicy
    from turnfsm.errors import ProviderError

    def listing(n: int) -> str:
        """List lines.

        Args:
            n: How many.
        """
        return "\n".join(f"line {i} data data data" for i in range(n))

    def model(request: ModelRequest) -> Message:
        messages = list(request.messages)
        asked = max(i for i, m in enumerate(messages) if m.role.value == "user")
        results = sum(len(m.tool_results) for m in messages[asked:])
        return reply("", tool_call("listing", n=120)) if results < 3 else reply("ok")

    def down(request: ModelRequest) -> Message:
        raise ProviderError("the summary model is down", retryable=False)

    context = ContextManager(
        SummarizingCompactor(model=FakeModelClient(down), keep_recent_turns=1),
        context_window=6_000,
        counter=HeuristicTokenCounter(),
    )
    agent = Agent(
        model=FakeModelClient(model),
        tools=[listing],
        context=context,
        retry=RetryPolicy(max_attempts=1),
    )
    for task in range(4):
        await agent.run(f"list {task}")
    passes = [p for run in agent.session.runs for p in run.compactions]
    assert {p.verdict.value for p in passes} == {"failed"}

    sim = await simulate(agent.session)

    assert sim.differences == ()
    assert [_pass(p) for p in sim.passes] == [_pass(p) for p in passes]
