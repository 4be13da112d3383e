"""`simulate` with and without the cache-aware setting, on a long stored session.

The session: an agent reads eight files in a 4,000-token window, then
answers ten short questions, one run each (a scripted model, so every size
is the same on every run). Priced at claude-sonnet-4-5 (writes 1.25x the
input price, cached reads 0.1x), some of its masking passes rewrite far
more of the cached prompt than they remove: declining those passes
(`cache_payback_calls=3`) breaks the cache less often and costs less.
"""

from __future__ import annotations

import attrs
import pytest

from turnfsm import Agent, ContextManager, MaskingCompactor
from turnfsm.persistence import Session
from turnfsm.simulate import Simulation, simulate
from turnfsm.testing import ScriptedModel, reply, tool_call

pytestmark = pytest.mark.anyio

PRICES = "claude-sonnet-4-5"


def read_file(path: str) -> str:
    """Read a file of the project.

    Args:
        path: the file's path.
    """
    lines = "".join(f"line {n}: some code of {path}\n" for n in range(60))
    return f"# {path}\n{lines}"


async def long_session() -> tuple[Session, ContextManager]:
    files = [f"f{i}.py" for i in range(8)]
    script = [
        reply(f"Reading {name}.", tool_call("read_file", f"call_{i}", path=name))
        for i, name in enumerate(files)
    ]
    script += ["All read."]
    script += [f"Answer {k}: the module does what its name says." for k in range(10)]
    context = ContextManager(MaskingCompactor(), context_window=4_000, threshold=80)
    agent = Agent(
        model=ScriptedModel.of(*script),
        tools=[read_file],
        context=context,
        store="memory:",
    )
    await agent.run("Read the project's files and say what it is.")
    for k in range(10):
        await agent.run(f"Question {k}: what does module f{k}.py do?")
    return agent.session, context


def figures(name: str, sim: Simulation) -> str:
    t = sim.totals
    return (
        f"{name:<24} {t['calls']:>5} {t['passes']:>6} {t['compacted']:>9} "
        f"{t['declined']:>8} {t['cache_breaks']:>6} {t['tokens_sent']:>7} "
        f"{t['cost']:>10.6f}"
    )


async def test_the_cache_aware_setting_compacts_less_and_costs_less() -> None:
    session, context = await long_session()
    priced = attrs.evolve(context, prices=PRICES)
    plain = await simulate(session, context=priced, prices=PRICES)
    aware = await simulate(
        session,
        context=attrs.evolve(priced, cache_payback_calls=3),
        prices=PRICES,
    )
    print()
    print(
        f"{'setting':<24} {'calls':>5} {'passes':>6} {'compacted':>9} "
        f"{'declined':>8} {'breaks':>6} {'tokens':>7} {'cost $':>10}"
    )
    print(figures("no cache_payback_calls", plain))
    print(figures("cache_payback_calls=3", aware))
    print(aware.table())
    assert not plain.differences
    assert not aware.differences
    assert len(plain.calls) == len(aware.calls) == 19
    # Fewer passes that compact (each one breaks the prompt cache) ...
    assert aware.totals["compacted"] < plain.totals["compacted"]
    assert aware.cache_breaks < plain.cache_breaks
    # ... and a lower projected cost.
    assert aware.cost is not None
    assert plain.cost is not None
    assert aware.cost < plain.cost
    # Every declined pass is a noop with its figures and its reason.
    declined = [p for p in aware.passes if p.payback and p.payback.declined]
    assert declined
    assert len(declined) == aware.declined
    for p in declined:
        assert str(p.verdict) == "noop"
        assert p.payback is not None
        assert p.payback.priced
        assert p.payback.note.startswith("declined: it would ")
        assert p.tokens_after == p.tokens_before
    # Every compacting pass records what it invalidates, costs and saves.
    for p in plain.passes:
        assert p.payback is not None
        assert p.payback.priced
        assert p.payback.invalidated_tokens > 0
    assert "cache: invalidates" in aware.table()
    assert f"{aware.declined} declined" in aware.table()
