"""`summarise`: ask the summary model for one summary that fits, in chunks if needed."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, final

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

__all__ = ["SummaryFailed", "summarise"]


_MAX_DEPTH: Final = 4
"""Rounds of summarising chunk summaries before a pass gives up."""


class SummaryFailed(Exception):
    """A summary could not be made (empty, oversized, or would not fit)."""


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
    and `LayeredCompactor` both call it.

    Args:
        messages: The turns to summarise.
        previous: The previous summary ("" for none): the iterative path.
        ctx: The pass's context (counter, hook guidance, model call).
        model: The summary model, or None: the driver's (the agent's own).
        max_tokens: The most the summary may be, in `ctx.counter` tokens.
        window: The summary model's window in tokens (0: unlimited).
        temperature: Of the summary call.
        digest_min_chars: Digest tool results longer than this first.

    Raises:
        SummaryFailed: The summary is empty, stays over `max_tokens` after a
            shorter re-ask, or the input cannot be made to fit `window`.
        Exception: Whatever the model call raised (a `ProviderError`, ...).
    """
    if digest_min_chars is not None:
        messages = digest_results(
            messages, min_chars=digest_min_chars, keep_recent_turns=0
        )
    asker = _Asker(ctx, model, max_tokens, temperature)
    blocks = [render_message(m) for m in messages]
    for _ in range(_MAX_DEPTH):
        chunks = _chunks(blocks, asker, previous, window)
        if len(chunks) == 1:
            return await asker.summary(chunks[0], previous)
        # Chunk by chunk, then the chunk summaries are the new turns.
        blocks = [
            f"[SUMMARY OF PART {i}]\n{await asker.summary(chunk, '')}"
            for i, chunk in enumerate(chunks, 1)
        ]
    raise SummaryFailed(
        f"the input did not fit the summary model's {window}-token window "
        f"after {_MAX_DEPTH} rounds of chunking"
    )


def _chunks(
    blocks: list[str], asker: _Asker, previous: str, window: int
) -> list[list[str]]:
    """Group `blocks` so each group's prompt fits `window` with the reply."""
    if not window:
        return [blocks]
    room = window - asker.max_tokens - asker.size(asker.prompt([], previous))
    if room <= 0:
        raise SummaryFailed(
            f"the summary model's {window}-token window leaves no room for a "
            f"transcript beside a {asker.max_tokens}-token summary"
        )
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
    while keep > 200:
        keep //= 2
        cut = clip(block, keep * 3 // 4, keep // 4)
        if asker.size(cut) + 1 <= room:
            return cut
    raise SummaryFailed(
        "a message does not fit the summary model's window even cut to 200 characters"
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
    ) -> None:
        self.ctx = ctx
        self.model = model
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.counter: TokenCounter = ctx.counter
        # The reply budget asked of the model, in its tokens: turnfsm's
        # counter errs high (up to 1.6x on prose), so a reply the model cuts
        # at this budget still counts under `max_tokens`.
        self.reply_budget = max(16, max_tokens * 5 // 8)

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

    async def summary(self, blocks: Sequence[str], previous: str) -> str:
        text = await self._ask(self.prompt(blocks, previous))
        size = self.size(text)
        if size > self.max_tokens:
            # Re-asked shorter once; never committed oversized.
            prompt = shorten_prompt(text, max_tokens=self.max_tokens, size=size)
            # Half the reply budget: a model that filled it can only be shorter.
            text = await self._ask(prompt, budget=max(16, self.reply_budget // 2))
            size = self.size(text)
            if size > self.max_tokens:
                raise SummaryFailed(
                    f"the summary is {size} tokens, over max_summary_tokens "
                    f"({self.max_tokens}), even when asked for a shorter one"
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
