"""The generated corpus evaluated with a judge, for the eval tests."""

from __future__ import annotations

from typing import Any

from turnfsm.evals import (
    Evaluation,
    corpus_probes,
    evaluate,
    shipped_strategy,
    store_corpus,
)
from turnfsm.persistence import MemoryStore
from turnfsm.providers import ModelClient, ModelRequest
from turnfsm.testing import ExtractiveSummaryModel

__all__ = ["context_only", "judged"]


def context_only(request: ModelRequest) -> str:
    """A judge that answers with the conversation it was shown."""
    return request.messages[0].text.split("\n\nAnswer from the conversation")[0]


async def judged(strategy: str, judge: ModelClient, **options: Any) -> Evaluation:
    """The corpus under the shipped `strategy` on a 16,384 window, `judge` asked."""
    sessions = await store_corpus(MemoryStore())
    return await evaluate(
        sessions,
        corpus_probes(),
        strategies={strategy: lambda m: shipped_strategy(strategy, m)},
        window=16_384,
        summary_model=ExtractiveSummaryModel(),
        judge=judge,
        **options,
    )
