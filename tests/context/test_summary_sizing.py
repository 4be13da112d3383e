"""Summaries sized by the summary model: its window, and a budget that shrinks to fit.

The summary model's window is the compactor's ``summary_window``, else the
model's own ``context_window``, else not known (one request, no chunking);
never the agent's window (`CompactionContext.context_window`). A request
that cannot hold the prompt, some transcript and ``max_summary_tokens``
gets a smaller budget, down to `MIN_SUMMARY_TOKENS`; below that the pass
fails and says the figures.
"""

from __future__ import annotations

from collections.abc import Sequence

import anyio
import attrs
import pytest

from tests.helpers import compaction_context as ctx_for
from turnfsm.context import (
    MIN_SUMMARY_TOKENS,
    CompactionProposal,
    ContextCompactor,
    LayeredCompactor,
    SummarizingCompactor,
)
from turnfsm.context._transcript import summary_prompt
from turnfsm.errors import ConfigError
from turnfsm.messages import Message
from turnfsm.providers import ModelRequest, ModelResponse
from turnfsm.testing import ExtractiveSummaryModel, FakeModelClient
from turnfsm.tokens import HeuristicTokenCounter

COUNTER = HeuristicTokenCounter()
BARE = COUNTER.count_text(summary_prompt("", previous=None, max_tokens=1_000))
"""The summary prompt without a transcript (about 220 tokens)."""


@attrs.define(eq=False)
class WindowedModel:
    """An extractive summary model that says its window (``context_window``)."""

    context_window: object
    inner: ExtractiveSummaryModel = attrs.field(factory=ExtractiveSummaryModel)

    @property
    def requests(self) -> list[ModelRequest]:
        return self.inner.requests

    async def complete(self, request: ModelRequest) -> ModelResponse:
        return await self.inner.complete(request)


def exchanges(n: int, words: int = 30) -> list[Message]:
    """`n` exchanges of a user question and an answer, `words` words each."""
    out = [Message.system("You are a careful agent.", id="sys")]
    for i in range(n):
        out.append(Message.user(f"question {i} " + "detail " * words, id=f"u{i}"))
        out.append(Message.assistant(f"answer {i} " + "fact " * words, id=f"a{i}"))
    return out


def run(
    compactor: ContextCompactor,
    messages: Sequence[Message],
    *,
    target: int = 0,
    window: int = 100_000,
) -> CompactionProposal:
    async def go() -> CompactionProposal:
        return await compactor.compact(
            messages, target, ctx_for(messages, window=window)
        )

    return anyio.run(go)


def request_sizes(requests: Sequence[ModelRequest]) -> list[tuple[int, int]]:
    """Each request's prompt size and reply budget."""
    out = []
    for request in requests:
        assert request.max_tokens is not None
        out.append((COUNTER.count_text(request.messages[0].text), request.max_tokens))
    return out


# -- where the window comes from ----------------------------------------------------


def summarizing(model: object, **knobs: object) -> SummarizingCompactor:
    return SummarizingCompactor(model=model, keep_recent_turns=1, **knobs)  # type: ignore[arg-type]


def layered(model: object, **knobs: object) -> LayeredCompactor:
    return LayeredCompactor(model=model, preserved_turns=1, **knobs)  # type: ignore[arg-type]


@pytest.mark.parametrize("build", [summarizing, layered])
@pytest.mark.parametrize(
    ("setting", "known", "agent_window", "chunked"),
    [
        # Not known: one request, whatever the agent's window.
        (None, None, 800, False),
        (None, None, 100_000, False),
        # The model's own window: chunked to it, not to the agent's.
        (None, 900, 100_000, True),
        (None, 100_000, 800, False),
        # The setting wins over the model's window.
        (900, 100_000, 100_000, True),
        (100_000, 900, 800, False),
    ],
)
def test_the_summary_window_is_the_summary_models_own(
    build: object,
    setting: int | None,
    known: int | None,
    agent_window: int,
    chunked: bool,
) -> None:
    model = WindowedModel(known)
    compactor = build(model, summary_window=setting, max_summary_tokens=200)  # type: ignore[operator]
    messages = exchanges(8)

    out = run(compactor, messages, window=agent_window)

    assert out.error is None
    assert (len(model.requests) > 1) is chunked
    window = setting or known
    for prompt, budget in request_sizes(model.requests):
        assert budget <= 200
        if window is not None:
            assert prompt + 200 <= window


def test_a_layered_pass_under_a_small_agent_window_reaches_the_model() -> None:
    # Before: layers 4-5 took the agent's 800-token window as the summary
    # model's and failed before any call ("leaves no room ...").
    model = FakeModelClient(lambda _request: "the summary")
    messages = exchanges(12)

    out = run(LayeredCompactor(model=model), messages, target=100, window=800)

    assert out.error is None
    assert model.requests
    assert len(out.messages) < len(messages)


def test_manual_compact_window_overrides_the_compactors() -> None:
    model = WindowedModel(100_000)
    compactor = LayeredCompactor(model=model, preserved_turns=1, max_summary_tokens=200)

    async def go() -> None:
        await compactor.manual_compact(
            exchanges(8), line=0, limit=0, counter=COUNTER, window=900
        )

    anyio.run(go)
    assert len(model.requests) > 1  # chunked to the 900 tokens asked for
    for prompt, _budget in request_sizes(model.requests):
        assert prompt + 200 <= 900


@pytest.mark.parametrize("build", [summarizing, layered])
@pytest.mark.parametrize("value", [0, -5, 1.5, "4096", True])
def test_a_bad_context_window_on_the_model_names_it(
    build: object, value: object
) -> None:
    with pytest.raises(ConfigError) as info:
        build(WindowedModel(value))  # type: ignore[operator]
    assert info.value.field == "model.context_window"
    assert repr(value) in str(info.value)


@pytest.mark.parametrize("build", [summarizing, layered])
def test_a_model_without_a_context_window_is_fine(build: object) -> None:
    build(FakeModelClient(lambda _request: "x"))  # type: ignore[operator]
    build(WindowedModel(None))  # type: ignore[operator]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("summary_window", 0),
        ("summary_window", "big"),
        ("summary_window", 1.5),
        ("compact_newest_exchange", 1),
        ("compact_newest_exchange", "yes"),
        ("compact_newest_exchange", None),
    ],
)
def test_bad_layered_settings_name_the_field(field: str, value: object) -> None:
    with pytest.raises(ConfigError) as info:
        LayeredCompactor(**{field: value})  # type: ignore[arg-type]
    assert info.value.field == field


# -- the budget shrinks before the pass fails ------------------------------------------


def obedient() -> FakeModelClient:
    """A summary model whose reply fills the budget it is asked for."""
    return FakeModelClient(lambda request: "fact " * (request.max_tokens // 2))


@pytest.mark.parametrize("build", [summarizing, layered])
@pytest.mark.parametrize(
    "window",
    # Too small for the whole 1,000-token summary beside the prompt, down to
    # just over the prompt, the smallest budget and a little transcript.
    [1_400, 1_300, 1_000, 800, 600, 500, BARE + 3 * (MIN_SUMMARY_TOKENS + 10)],
)
def test_the_summary_budget_shrinks_to_fit_the_window(
    build: object, window: int
) -> None:
    model = obedient()
    compactor = build(model, summary_window=window)  # type: ignore[operator]
    messages = exchanges(6, words=60)

    out = run(compactor, messages)

    assert out.error is None, out.error
    assert model.requests
    for request, (prompt, budget) in zip(
        model.requests, request_sizes(model.requests), strict=True
    ):
        assert prompt + budget <= window  # every request fits
        if "Write the summary under" in request.messages[0].text:
            assert budget < 1_000 * 5 // 8  # smaller than the setting's
            assert budget >= MIN_SUMMARY_TOKENS * 5 // 8
            # The prompt and the whole (shrunk) summary fit beside it.
            assert prompt + budget * 8 // 5 <= window


def test_a_window_that_holds_the_full_budget_keeps_it() -> None:
    model = ExtractiveSummaryModel()
    compactor = SummarizingCompactor(
        model=model, keep_recent_turns=1, summary_window=100_000
    )
    assert run(compactor, exchanges(6)).error is None
    assert [budget for _, budget in request_sizes(model.requests)] == [625]


@pytest.mark.parametrize("build", [summarizing, layered])
@pytest.mark.parametrize("window", [1, 100, BARE, BARE + MIN_SUMMARY_TOKENS])
def test_a_window_too_small_for_the_smallest_budget_fails_with_the_figures(
    build: object, window: int
) -> None:
    model = ExtractiveSummaryModel()
    compactor = build(model, summary_window=window)  # type: ignore[operator]

    out = run(compactor, exchanges(6))

    assert out.is_failed
    assert not model.requests  # refused before any call
    error = out.error or ""
    assert f"{window}-token window" in error
    assert f"{MIN_SUMMARY_TOKENS}-token summary" in error
    assert "max_summary_tokens 1000" in error
    assert "summary_window" in error  # how to fix it


def test_a_setting_under_the_smallest_budget_is_the_floor() -> None:
    # max_summary_tokens 40 < 64: the budget never grows past the setting.
    model = ExtractiveSummaryModel()
    compactor = SummarizingCompactor(
        model=model,
        keep_recent_turns=1,
        max_summary_tokens=40,
        summary_window=BARE + 20,
    )
    out = run(compactor, exchanges(4))
    assert out.is_failed
    assert "40-token summary" in (out.error or "")
