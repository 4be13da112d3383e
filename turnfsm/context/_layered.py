"""`LayeredCompactor`: five layers from cheap to expensive.

An exchange is a user message and everything that answers it, up to the
next user message (summaries do not start one).
The layers run in order and the pass stops as soon as the conversation fits
the target:

1. budget: a tool result over 4,000 characters keeps its first 4,000 and
   ends ``"... [truncated]"``;
2. trim: the tool results of all but the newest 20 exchanges are emptied
   (the message and ``is_error`` stay);
3. microcompact: per tool call id, only the last result keeps its content;
4. collapse (model): all but the newest 10 exchanges become one user
   message, ``"[Conversation summary of N earlier turns]"`` and the summary;
5. autocompact (model): all but the newest exchange becomes one user
   message, ``"[Full conversation summary]"`` and the summary.

Layers 4 and 5 summarise whole exchanges and keep the rest as it was, in
order: they never split the newest exchange (when it is all there is, they
have nothing to do). With ``compact_newest_exchange``, layer 5 also
summarises inside the newest exchange: its user message and its last two
messages are kept, with the summary between them. Characters, not bytes.

The model layers call the summary model (the agent's own under a `Driver`,
through its retry policy and usage accounting), sized by its own window
(`summary_window`, else the model's ``context_window``, never the agent's;
the agent's own model within the agent's window);
with the session's circuit breaker open (`allow_model` False) only layers
1-3 run. Each layer is callable on its own (`apply_budget`, `apply_trim`,
`apply_microcompact`, `apply_collapse`, `apply_autocompact`);
`compact_deterministic` runs layers 1-3 and `manual_compact` is the
operator's trigger; both answer with a status
(`Applied`, `Skipped`, `Failed`) that never carries message content.

Layer 5 keeps only the newest exchange, not the 10 layer 4 keeps: after a
collapse, keeping the same 10 would leave it nothing to summarise.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, final

import attrs

from turnfsm import _checks
from turnfsm.context._deterministic_layers import (
    MAX_TOOL_RESULT_CHARS,
    TRIM_TURN_THRESHOLD,
    TRUNCATION_SUFFIX,
    Layer,
    cap_results,
    first_fit,
    microcompact,
    trim_results,
)
from turnfsm.context._digest import digest_results
from turnfsm.context._layered_status import (
    Applied,
    CompactionStatus,
    Failed,
    Skipped,
)
from turnfsm.context._pins import keep_pinned
from turnfsm.context._recall_marks import with_recall_marks
from turnfsm.context._summarizing import SummaryFailed
from turnfsm.context._summary_layers import collapse
from turnfsm.context._summary_model import (
    check_model,
    check_summary_tokens,
    check_summary_window,
    summary_window,
)
from turnfsm.context._values import (
    _COUNTER_CHECK,
    CompactionContext,
    CompactionProposal,
)
from turnfsm.core import CompactReason
from turnfsm.messages import Message
from turnfsm.providers import ModelClient
from turnfsm.tokens import TokenCounter, default_counter

__all__ = [
    "MAX_TOOL_RESULT_CHARS",
    "PRESERVED_TURNS",
    "TRIM_TURN_THRESHOLD",
    "TRUNCATION_SUFFIX",
    "Applied",
    "CompactionStatus",
    "Failed",
    "LayeredCompactor",
    "Skipped",
]

PRESERVED_TURNS: Final = 10
"""Layer 4: the newest exchanges kept verbatim by the collapse."""

_INSUFFICIENT: Final = "deterministic layers insufficient; LLM layers required"
_BELOW: Final = "below trigger threshold"


@final
@_checks.keyword_checked
@attrs.frozen(kw_only=True)
class LayeredCompactor:
    """Shrink in five layers, cheapest first, until the conversation fits.

    Pinned messages (`CompactionContext.pinned`) are left as they are by
    every layer and never summarised.

    The settings named ``*_turns`` count exchanges (a user message and
    everything that answers it), not turns: a *turn* elsewhere in turnfsm
    is one model call.

    Attributes:
        model: The summary model for layers 4-5, or None: the agent's own
            under a `Driver` (required when used on its own). A client that
            knows its window says so with an int attribute ``context_window``.
        max_tool_result_chars: Layer 1's cap (4,000 characters).
        trim_turns: Layer 2 keeps the tool results of this many newest
            exchanges (20).
        preserved_turns: Layer 4 keeps this many newest exchanges verbatim,
            whole (10).
        max_summary_tokens: The most a layer-4/5 summary may be. A summary
            model whose window cannot hold it beside the prompt and some of
            the transcript gets a smaller budget, down to 64 tokens.
        summary_window: The summary model's context window in tokens, or
            None: the model's ``context_window`` when it has one, else not
            known (the transcript goes in one request). Never the agent's
            window for a model of its own; without one (`model` None) the
            agent's model summarises, within the agent's window. A
            transcript that does not fit is summarised in parts.
        compact_newest_exchange: Off (the default), layer 5 keeps the newest
            exchange whole, so a conversation that is one long tool-using
            exchange (a single run) is left to layers 1-3. On, layer 5 also
            summarises inside it: its user message and its last two
            messages are kept, in order, with the summary between them.
        digest_min_chars: When set, a layer 0 runs first: tool results of
            earlier turns longer than this become their one-line digest
            (`ToolResultDigest` as a layer).

    Raises:
        ConfigError: On construction, naming the field, when a setting is
            out of range or of the wrong type.
    """

    model: ModelClient | None = attrs.field(
        default=None,
        validator=[
            _checks.instance(
                ModelClient,
                "a ModelClient (None: the agent's own)",
                optional=True,
                awaited=("complete",),
            ),
            check_model,
        ],
    )
    max_tool_result_chars: int = attrs.field(
        default=MAX_TOOL_RESULT_CHARS,
        validator=_checks.integer(low=1, expected="an int >= 1"),
    )
    trim_turns: int = attrs.field(
        default=TRIM_TURN_THRESHOLD,
        validator=_checks.integer(low=1, expected="an int >= 1"),
    )
    preserved_turns: int = attrs.field(
        default=PRESERVED_TURNS,
        validator=_checks.integer(low=1, expected="an int >= 1"),
    )
    max_summary_tokens: int = attrs.field(default=1_000, validator=check_summary_tokens)
    digest_min_chars: int | None = attrs.field(
        default=None, validator=_checks.integer(low=1, optional=True)
    )
    summary_window: int | None = attrs.field(
        default=None, validator=check_summary_window
    )
    compact_newest_exchange: bool = attrs.field(
        default=False, validator=_checks.boolean()
    )

    # -- the deterministic layers ----------------------------------------
    def apply_budget(self, messages: Sequence[Message]) -> tuple[Message, ...]:
        """Layer 1: cap each tool result at `max_tool_result_chars` characters."""
        return cap_results(messages, self.max_tool_result_chars)

    def apply_trim(self, messages: Sequence[Message]) -> tuple[Message, ...]:
        """Layer 2: empty tool results older than the newest `trim_turns` exchanges."""
        return trim_results(messages, self.trim_turns)

    def apply_digest(self, messages: Sequence[Message]) -> tuple[Message, ...]:
        """Layer 0 (with `digest_min_chars`): digest long results of older exchanges."""
        if self.digest_min_chars is None:
            return tuple(messages)
        return digest_results(
            messages, min_chars=self.digest_min_chars, keep_recent_turns=1
        )

    def apply_microcompact(self, messages: Sequence[Message]) -> tuple[Message, ...]:
        """Layer 3: per tool call id, only the last result keeps its content."""
        return microcompact(messages)

    def _deterministic_layers(
        self,
        messages: Sequence[Message],
        target: int,
        counter: TokenCounter,
        pinned: frozenset[str] = frozenset(),
    ) -> tuple[tuple[Message, ...], list[str], bool]:
        """Run layers 1-3 until the result fits `target`; `pinned` stay as they are."""
        layers: list[tuple[str, Layer]] = [
            ("budget", self.apply_budget),
            ("trim", self.apply_trim),
            ("microcompact", self.apply_microcompact),
        ]
        if self.digest_min_chars is not None:
            layers.insert(0, ("digest", self.apply_digest))
        if pinned:
            layers = [(name, _keeping(layer, pinned)) for name, layer in layers]
        return first_fit(layers, messages, target, counter)

    # -- the passes --------------------------------------------------------
    async def compact(
        self, messages: Sequence[Message], target: int, ctx: CompactionContext
    ) -> CompactionProposal:
        """Apply the layers in order, stopping as soon as the result fits `target`.

        Args:
            messages: The conversation.
            target: The size to reach, in the counter's tokens.
            ctx: The pass's context; with `ctx.allow_model` False (the
                circuit breaker is open) only layers 1-3 run.

        Returns:
            The shrunk conversation (however far the layers got), the input
            when no layer changed anything, or a failed outcome when a
            summary could not be made.

        Each replacement it makes names what it covers (a recall note).
        """
        return await with_recall_marks(self._compact, messages, target, ctx)

    async def _compact(
        self, messages: Sequence[Message], target: int, ctx: CompactionContext
    ) -> CompactionProposal:
        """The pass itself, on messages without their recall notes."""
        try:
            current, _layers = await self._run(messages, target, ctx, self._window(ctx))
        except SummaryFailed as exc:
            return CompactionProposal.failed(str(exc), ctx.tokens_before)
        current = keep_pinned(messages, current, ctx.pinned)
        if len(current) == len(messages) and all(
            a is b for a, b in zip(current, messages, strict=True)
        ):
            return CompactionProposal.unchanged(messages, ctx.tokens_before)
        return CompactionProposal.compacted(
            current, ctx.tokens_before, ctx.counter.count(current)
        )

    def _window(self, ctx: CompactionContext) -> int:
        """The summary model's window (0: not known)."""
        return summary_window(self.summary_window, self.model, ctx.context_window)

    async def _run(
        self,
        messages: Sequence[Message],
        target: int,
        ctx: CompactionContext,
        window: int,
    ) -> tuple[tuple[Message, ...], list[str]]:
        """Run the layers until the result fits; return it and the layers used."""
        counter = ctx.counter
        current, applied, fits = self._deterministic_layers(
            messages, target, counter, ctx.pinned
        )
        if fits or not ctx.allow_model:
            return current, applied
        for name, keep, label in (
            ("collapse", self.preserved_turns, None),
            ("autocompact", 1, "[Full conversation summary]"),
        ):
            new = await collapse(self, current, keep, label, ctx, window)
            if new is not current:
                applied.append(name)
                current = new
                if counter.count(current) <= target:
                    break
        return current, applied

    async def apply_collapse(
        self, messages: Sequence[Message], ctx: CompactionContext
    ) -> tuple[Message, ...]:
        """Layer 4 on its own: summarise all but the newest `preserved_turns`.

        The summary is one user message, ``"[Conversation summary of N
        earlier turns]"`` and the summary, in place of the exchanges it
        covers. Nothing to summarise: the messages as they are.

        Raises:
            SummaryFailed: the summary model failed or its summary does not
                fit its budget.
        """
        return await collapse(
            self, tuple(messages), self.preserved_turns, None, ctx, self._window(ctx)
        )

    async def apply_autocompact(
        self, messages: Sequence[Message], ctx: CompactionContext
    ) -> tuple[Message, ...]:
        """Layer 5 on its own: summarise everything but the newest exchange.

        The summary is one user message, ``"[Full conversation summary]"``
        and the summary. Nothing to summarise: the messages as they are.

        Raises:
            SummaryFailed: the summary model failed or its summary does not
                fit its budget.
        """
        return await collapse(
            self,
            tuple(messages),
            1,
            "[Full conversation summary]",
            ctx,
            self._window(ctx),
        )

    def compact_deterministic(
        self,
        messages: Sequence[Message],
        *,
        limit: int,
        counter: TokenCounter | None = None,
    ) -> tuple[tuple[Message, ...], CompactionStatus]:
        """Run layers 1-3 only (no model call: safe at any boundary).

        Args:
            messages: The conversation.
            limit: The size to fit, in `counter` tokens.
            counter: The counter (default: turnfsm's conservative one).

        Returns:
            The shrunk messages and `Applied(layers, before, after)` when
            they fit `limit`; otherwise the input and
            `Skipped("deterministic layers insufficient; LLM layers
            required")`.
        """
        _checks.check(limit, "limit", _TOKENS)
        counter = _counter(counter)
        before = counter.count(messages)
        new, applied, fits = self._deterministic_layers(messages, limit, counter)
        if not fits:
            return tuple(messages), Skipped(reason=_INSUFFICIENT)
        return new, Applied(
            layers=tuple(applied), tokens_before=before, tokens_after=counter.count(new)
        )

    async def manual_compact(
        self,
        messages: Sequence[Message],
        *,
        line: int,
        limit: int,
        counter: TokenCounter | None = None,
        circuit_open: bool = False,
        window: int = 0,
    ) -> tuple[tuple[Message, ...], CompactionStatus]:
        """The operator's trigger: compact now if over `line`, and say how it went.

        Args:
            messages: The conversation.
            line: The trigger line: at or under it nothing is done.
            limit: The size to fit (the window, or a target under it).
            counter: The counter (default: turnfsm's conservative one).
            circuit_open: The session's circuit breaker is open: fail fast.
            window: The summary model's context window in tokens for this
                call; 0: the compactor's own (`summary_window`, else the
                model's ``context_window``, else not known).

        Returns:
            The messages and `Skipped("below trigger threshold")`,
            `Applied(...)`, or `Failed(error)` with the messages unchanged:
            the breaker is open, a layer failed, or every layer ran and the
            result is still over `limit` (a CompactionFailed).
        """
        _checks.check(line, "line", _TOKENS)
        _checks.check(limit, "limit", _TOKENS)
        _checks.check(window, "window", _TOKENS)
        _checks.check(circuit_open, "circuit_open", _checks.boolean())
        counter = _counter(counter)
        before = counter.count(messages)
        if before <= line:
            return tuple(messages), Skipped(reason=_BELOW)
        if circuit_open:
            return tuple(messages), Failed(error="circuit breaker open")
        ctx = CompactionContext(
            tokens_before=before,
            reason=CompactReason.MANUAL,
            context_window=window,
            turn=0,
            counter=counter,
        )
        try:
            new, layers = await self._run(
                messages, limit, ctx, window or self._window(ctx)
            )
        except SummaryFailed as exc:
            return tuple(messages), Failed(error=str(exc))
        except Exception as exc:  # a status, not content: the type only
            return tuple(messages), Failed(error=f"{type(exc).__name__} in a layer")
        after = counter.count(new)
        if after > limit:
            return tuple(messages), Failed(
                error=f"every layer ran; {after} tokens are still over the "
                f"{limit}-token limit"
            )
        return new, Applied(
            layers=tuple(layers), tokens_before=before, tokens_after=after
        )


def _keeping(layer: Layer, pinned: frozenset[str]) -> Layer:
    """Return `layer`, with the `pinned` messages kept as they were."""

    def run(messages: Sequence[Message]) -> tuple[Message, ...]:
        new = layer(messages)
        return new if new is messages else keep_pinned(messages, new, pinned)

    return run


_TOKENS = _checks.integer(low=0, expected="an int >= 0 (tokens)")


def _counter(counter: TokenCounter | None) -> TokenCounter:
    """`counter`, checked, or the default one for None."""
    if counter is None:
        return default_counter()
    _checks.check(counter, "counter", _COUNTER_CHECK)
    return counter
