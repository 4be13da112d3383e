"""`summarise`: ask the summary model for one summary that fits, in chunks if needed."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final, final

from turnfsm import _checks
from turnfsm.context._digest import digest_results
from turnfsm.context._transcript import (
    clip,
    render_message,
    shorten_prompt,
    summary_prompt,
)
from turnfsm.context._values import CompactionContext
from turnfsm.messages import Message
from turnfsm.providers import ModelClient, ModelRequest
from turnfsm.tokens import TokenCounter

__all__ = [
    "MIN_SUMMARY_TOKENS",
    "SummaryFailed",
    "check_model",
    "check_summary_tokens",
    "check_summary_window",
    "known_window",
    "summarise",
    "summary_window",
]


MIN_SUMMARY_TOKENS: Final = 64
"""The smallest summary budget a pass shrinks `max_summary_tokens` to.

When the summary model's window cannot hold the summary prompt, a transcript
and a reply of `max_summary_tokens`, the budget shrinks (never below this, or
below `max_summary_tokens` when that is smaller); a window that cannot hold a
request even then fails the pass, naming the figures.
"""

_SUMMARY_TOKENS: Final = _checks.integer(low=16, high=_checks.MAX_TOKENS)
_SUMMARY_WINDOW: Final = _checks.integer(low=1, high=_checks.MAX_TOKENS, optional=True)


def check_summary_tokens(inst: Any, attr: Any, value: Any) -> None:
    """An attrs validator: a `max_summary_tokens` (16 to the largest token setting)."""
    _SUMMARY_TOKENS(inst, attr, value)


def check_summary_window(inst: Any, attr: Any, value: Any) -> None:
    """An attrs validator: a `summary_window` (None: the model's own)."""
    _SUMMARY_WINDOW(inst, attr, value)


_PART_LABEL: Final = "[SUMMARY OF PART 9999]\n"
"""The widest label a chunk summary carries when the summaries are summarised."""


class SummaryFailed(Exception):
    """A summary could not be made (empty, oversized, or would not fit)."""


def known_window(model: object) -> int | None:
    """Return the window a summary model says it has, or None if it says none.

    A client tells its window with an int attribute ``context_window``, in
    tokens (a client of a llama.cpp server: the server's ``n_ctx``).
    `OpenAIModel` and `AnthropicModel` have it for the models the bundled
    catalogue knows (`turnfsm.providers.known_window`); for others, give
    the client ``context_window`` or the compactor ``summary_window``.

    Raises:
        ConfigError: The attribute is there but not an int >= 1 or None.
    """
    value: Any = getattr(model, "context_window", None)
    _checks.check(value, "model.context_window", _WINDOW)
    window: int | None = value
    return window


def check_model(_inst: Any, _attr: Any, value: Any) -> None:
    """An attrs validator: a summary model's ``context_window``, if any, is usable."""
    known_window(value)


_WINDOW = _checks.integer(
    low=1, optional=True, expected="an int >= 1 (tokens), or None (not known)"
)


def summary_window(setting: int | None, model: object, agents: int = 0) -> int:
    """Return the summary model's window in tokens; 0 when it is not known.

    The compactor's setting first, else the model's `known_window`; never
    the agent's window for a model of its own (a `ContextManager`'s window
    is a compaction policy for the agent's requests, not another model's
    limit). Without a model of its own (`model` None) the summary goes to
    the agent's model, whose window is the agent's: `agents`
    (`CompactionContext.context_window`), which the driver holds every
    request to that model to. 0 (not known) sends the transcript in one
    request, with `max_summary_tokens` as the reply budget: a model that
    cannot hold it fails the pass with its own error.
    """
    if setting is not None:
        return setting
    if model is None:
        return agents
    return known_window(model) or 0


async def summarise(
    messages: Sequence[Message],
    *,
    previous: str,
    ctx: CompactionContext,
    model: ModelClient | None,
    max_tokens: int,
    window: int,
    temperature: float = 0.3,
    digest_min_chars: int | None = None,
) -> str:
    """Return a summary of `messages` (updating `previous`), checked for size.

    The one summary routine of the shipped compactors: `SummarizingCompactor`
    and `LayeredCompactor` both call it. A request is the prompt, a part of
    the transcript and the summary's budget; within a `window`:

    1. the whole transcript in one request, with `max_tokens`, when it fits;
    2. else in parts of the room left beside the prompt and `max_tokens`,
       when that room holds at least two part summaries (their summaries
       are then summarised, in rounds, until one is left);
    3. else with the largest budget under `max_tokens`, down to
       `MIN_SUMMARY_TOKENS`, for which 1 or 2 holds;
    4. else the pass fails, naming the window, the prompt and the budget.

    Args:
        messages: The turns to summarise.
        previous: The previous summary ("" for none): the iterative path.
        ctx: The pass's context (counter, hook guidance, model call).
        model: The summary model, or None: the driver's (the agent's own).
        max_tokens: The most the summary may be, in `ctx.counter` tokens.
        window: The summary model's window in tokens (0: not known, no limit;
            see `summary_window`).
        temperature: Of the summary call.
        digest_min_chars: Digest tool results longer than this first.

    Raises:
        SummaryFailed: The summary is empty, stays over its budget after a
            shorter re-ask, or no request fits `window`.
        Exception: Whatever the model call raised (a `ProviderError`, ...).
    """
    if digest_min_chars is not None:
        messages = digest_results(
            messages, min_chars=digest_min_chars, keep_recent_turns=0
        )
    blocks = [render_message(m) for m in messages]
    asker = _Asker(ctx, model, max_tokens, temperature, window)
    asker.fit(blocks, previous)
    rounds = 0
    while True:
        rounds += 1
        chunks = _chunks(blocks, asker, previous)
        if len(chunks) == 1:
            return await asker.summary(chunks[0], previous)
        if rounds > 1 and len(chunks) >= len(blocks):  # unreachable by `fit`
            raise SummaryFailed(
                f"the part summaries did not fit the summary model's "
                f"{window}-token window two at a time"
            )
        # Chunk by chunk, then the chunk summaries are the new turns.
        blocks = [
            f"[SUMMARY OF PART {i}]\n{await asker.summary(chunk, '')}"
            for i, chunk in enumerate(chunks, 1)
        ]


def _chunks(blocks: list[str], asker: _Asker, previous: str) -> list[list[str]]:
    """Group `blocks` so each group's prompt fits the window with the reply."""
    if not asker.window:
        return [blocks]
    room = asker.room(previous)
    chunks: list[list[str]] = [[]]
    used = 0
    for block in blocks:
        size = asker.size(block) + 1
        if size > room:  # one block alone is too big: keep its two ends
            block = _shrink(block, asker, room)
            size = asker.size(block) + 1
        if used + size > room and chunks[-1]:
            chunks.append([])
            used = 0
        chunks[-1].append(block)
        used += size
    return chunks


def _shrink(block: str, asker: _Asker, room: int) -> str:
    keep = len(block)
    while keep > 32:
        keep //= 2
        cut = clip(block, keep * 3 // 4, keep // 4)
        if asker.size(cut) + 1 <= room:
            return cut
    raise SummaryFailed(
        "a message does not fit the summary model's window even cut to 32 characters"
    )


@final
class _Asker:
    """Asks the summary model for one summary and checks it (internal)."""

    def __init__(
        self,
        ctx: CompactionContext,
        model: ModelClient | None,
        max_tokens: int,
        temperature: float,
        window: int,
    ) -> None:
        self.ctx = ctx
        self.model = model
        self.ceiling = max_tokens  # the setting; `fit` may lower the budget
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.window = window
        self.counter: TokenCounter = ctx.counter

    @property
    def reply_budget(self) -> int:
        """The reply budget asked of the model, in its tokens.

        turnfsm's counter errs high (up to 1.6x on prose), so a reply the
        model cuts at 5/8 of the summary's budget still counts under it.
        """
        return max(16, self.max_tokens * 5 // 8)

    def size(self, text: str) -> int:
        return self.counter.count_text(text)

    def prompt(self, blocks: Sequence[str], previous: str) -> str:
        return summary_prompt(
            "\n\n".join(blocks),
            previous=previous or None,
            max_tokens=self.max_tokens,
            instructions=self.ctx.instructions,
            additional_context=self.ctx.additional_context,
        )

    def room(self, previous: str) -> int:
        """Tokens left for the transcript beside the prompt and the budget."""
        return self.window - self.max_tokens - self.size(self.prompt([], previous))

    def _fits(self, budget: int, total: int, previous: str) -> bool:
        self.max_tokens = budget
        room = self.room(previous)
        return room >= total or room >= 2 * (budget + self.size(_PART_LABEL) + 1)

    def fit(self, blocks: Sequence[str], previous: str) -> None:
        """Set the summary's budget: the largest that fits the window.

        `max_tokens` when the whole transcript, or parts of it two part
        summaries at a time, fit beside it; else the largest smaller budget,
        down to `MIN_SUMMARY_TOKENS`, for which they do.

        Raises:
            SummaryFailed: Not even the smallest budget fits, with the figures.
        """
        if not self.window:
            return
        total = sum(self.size(block) + 1 for block in blocks)
        if self._fits(self.ceiling, total, previous):
            return
        floor = min(MIN_SUMMARY_TOKENS, self.ceiling)
        if not self._fits(floor, total, previous):
            prompt = self.size(self.prompt([], previous))
            raise SummaryFailed(
                f"the summary model's {self.window}-token window cannot hold a "
                f"summary request: the prompt alone is {prompt} tokens, and with "
                f"even a {floor}-token summary (max_summary_tokens "
                f"{self.ceiling}) {max(0, self.window - prompt - floor)} tokens "
                f"are left for a {total}-token transcript; give the summary "
                "model a larger window (summary_window)"
            )
        low, high = floor, self.ceiling - 1  # low fits, ceiling does not
        while low < high:
            middle = (low + high + 1) // 2
            if self._fits(middle, total, previous):
                low = middle
            else:
                high = middle - 1
        self.max_tokens = low

    def _over(self, size: int) -> str:
        if self.max_tokens == self.ceiling:
            return f"over max_summary_tokens ({self.ceiling})"
        return (
            f"over its {self.max_tokens}-token budget (max_summary_tokens "
            f"{self.ceiling}, shrunk to fit the summary model's "
            f"{self.window}-token window)"
        )

    async def summary(self, blocks: Sequence[str], previous: str) -> str:
        text = await self._ask(self.prompt(blocks, previous))
        size = self.size(text)
        if size > self.max_tokens:
            # Re-asked shorter once; never committed oversized.
            prompt = shorten_prompt(text, max_tokens=self.max_tokens, size=size)
            # Half the reply budget: a model that filled it can only be shorter.
            budget = max(16, self.reply_budget // 2)
            if self.window and self.size(prompt) + budget > self.window:
                raise SummaryFailed(
                    f"the summary is {size} tokens, {self._over(size)}, and "
                    "asking for a shorter one would not fit the summary "
                    f"model's {self.window}-token window"
                )
            text = await self._ask(prompt, budget=budget)
            size = self.size(text)
            if size > self.max_tokens:
                raise SummaryFailed(
                    f"the summary is {size} tokens, {self._over(size)}, even "
                    "when asked for a shorter one"
                )
        return text

    async def _ask(self, prompt: str, *, budget: int | None = None) -> str:
        request = ModelRequest(
            messages=[Message.user(prompt)],
            max_tokens=budget or self.reply_budget,
            temperature=self.temperature,
        )
        call = self.ctx.model_call
        if call is not None:
            response = await call(request, self.model)
        elif self.model is not None:
            response = await self.model.complete(request)
        else:
            raise SummaryFailed(
                "no summary model: pass model= to the compactor, or run it "
                "under a Driver, which lends the agent's own"
            )
        text = response.message.text.strip()
        if not text:
            raise SummaryFailed("the summary model returned an empty summary")
        return text
