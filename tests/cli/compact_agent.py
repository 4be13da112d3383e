"""Agents for `turnfsm sessions compact --agent tests.cli.compact_agent:NAME`."""

from __future__ import annotations

from collections.abc import Sequence

import anyio

from turnfsm import Agent, ContextManager, SummarizingCompactor
from turnfsm.context import CompactionContext, CompactionProposal
from turnfsm.messages import Message
from turnfsm.testing import ExtractiveSummaryModel, ScriptedModel
from turnfsm.tokens import HeuristicTokenCounter


def agent() -> Agent:
    """A summarising agent (the model writes extractive summaries)."""
    return Agent(
        model=ScriptedModel.of(*[f"answer {i}" for i in range(20)]),
        context=ContextManager(
            SummarizingCompactor(model=ExtractiveSummaryModel(), keep_recent_turns=2),
            context_window=50_000,
            counter=HeuristicTokenCounter(),
        ),
    )


class _SlowCompactor:
    """Says it began, then compacts for a minute (long enough to be stopped)."""

    async def compact(
        self, messages: Sequence[Message], target: int, ctx: CompactionContext
    ) -> CompactionProposal:
        print("compacting", flush=True)
        await anyio.sleep(60)
        raise AssertionError("the pass was not stopped")


def slow_agent() -> Agent:
    """An agent whose compaction pass takes a minute."""
    return Agent(
        model=ScriptedModel.of("answer"),
        context=ContextManager(
            _SlowCompactor(), context_window=50_000, counter=HeuristicTokenCounter()
        ),
    )
