"""`simulate`: a stored session again, replies and tool results held fixed."""

from __future__ import annotations

import io

import pytest

from turnfsm.cli._demo import STRATEGIES, TASK, build_demo_agent
from turnfsm.context import ContextManager
from turnfsm.core import Measured, ModelReplied
from turnfsm.persistence import CompactionRecord, MemoryStore, RunRecord, Session
from turnfsm.simulate import Simulation, simulate
from turnfsm.simulate._simulate import CAVEATS


def _measured(run: RunRecord) -> list[int]:
    """The size the log measured before each model call of `run`."""
    sizes, last = [], 0
    for event in run.events:
        if isinstance(event, Measured):
            last = event.estimate
        elif isinstance(event, ModelReplied):
            sizes.append(last)
    return sizes


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
    assert [c.tokens for c in sim.calls] == _measured(run)
    assert [c.turn for c in sim.calls] == list(range(1, len(run.turns) + 1))
    for index, call in enumerate(sim.calls):
        seen = tuple(stored.message(i) for i in run.context(index))
        assert call.messages == seen
        assert call.reply == stored.message(run.turns[index].output)
        assert call.run_id == run.run_id
        assert call.cost is None
    # The same passes, with the same reasons, verdicts, sizes and usage.
    assert [_pass(p) for p in sim.passes] == [_pass(p) for p in run.compactions]
    assert sim.caveats == CAVEATS  # no run ended otherwise than it did
    # Every compacted pass rewrote the prefix: the next call's cache breaks.
    assert sim.cache_breaks == sum(1 for p in run.compactions if p.compacted)
    assert stored.version == version  # nothing was written to it
