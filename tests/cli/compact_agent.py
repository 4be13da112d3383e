"""An agent for `turnfsm sessions compact --agent tests.cli.compact_agent:agent`."""

from __future__ import annotations

from turnfsm import Agent, ContextManager, SummarizingCompactor
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
