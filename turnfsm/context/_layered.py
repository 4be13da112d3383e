"""`LayeredCompactor`: five layers from cheap to expensive (seed 001).

A turn starts at each user message. The layers run in order and the pass
stops as soon as the conversation fits the target:

1. budget: a tool result over 4,000 characters keeps its first 4,000 and
   ends ``"... [truncated]"``;
2. trim: the tool results of all but the newest 20 turns are emptied (the
   message and ``is_error`` stay);
3. microcompact: per tool call id, only the last result keeps its content;
4. collapse (model): all but the last 10 turns become one user message,
   ``"[Conversation summary of N earlier turns]"`` and the summary;
5. autocompact (model): everything but the latest user message and the
   two messages after it becomes one user message,
   ``"[Full conversation summary]"`` and the summary.

Characters, not bytes. The model layers call the summary model (the
agent's own under a `Driver`, through its retry policy and usage
accounting); with the session's circuit breaker open (`allow_model` False)
only layers 1-3 run. `compact_deterministic` runs layers 1-3 on their own
and `manual_compact` is the operator's trigger; both answer with a status
(`Applied`, `Skipped`, `Failed`) that never carries message content.

Deliberate difference from the seed: its layer 5 preserved the same last 10
turns as layer 4, so after a collapse it had nothing left to summarise;
here it keeps only the latest user message and the two messages after it.
"""

from __future__ import annotations

import re
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
from turnfsm.context._summarizing import SummaryFailed, split_turns, summarise
from turnfsm.context._transcript import (
    SUMMARY_KEY,
    summary_body,
    summary_id,
    turn_starts,
)
from turnfsm.context._values import (
    CompactionContext,
    CompactionProposal,
)
from turnfsm.core import CompactReason
from turnfsm.messages import SUMMARY_COVERS, Message
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
"""Layer 4: the newest turns kept verbatim by the collapse."""

_INSUFFICIENT: Final = "deterministic layers insufficient; LLM layers required"
_BELOW: Final = "below trigger threshold"


@final
@attrs.frozen(kw_only=True)
class LayeredCompactor:
    """Shrink in five layers, cheapest first, until the conversation fits.

    Attributes:
        model: The summary model for layers 4-5, or None: the agent's own
            under a `Driver` (required when used on its own).
        max_tool_result_chars: Layer 1's cap (4,000 characters).
        trim_turns: Layer 2 keeps tool results of this many newest turns (20).
        preserved_turns: Layer 4 keeps this many newest turns verbatim (10).
        max_summary_tokens: The most a layer-4/5 summary may be.
        digest_min_chars: When set, a layer 0 runs first: tool results of
            earlier turns longer than this become their one-line digest
            (`ToolResultDigest` as a layer).

    Raises:
        ConfigError: On construction, naming the field, when a setting is
            out of range or of the wrong type.
    """

    model: ModelClient | None = attrs.field(
        default=None,
        validator=_checks.instance(
            ModelClient, "a ModelClient (None: the agent's own)", optional=True
        ),
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
    max_summary_tokens: int = attrs.field(
        default=1_000, validator=_checks.integer(low=16, expected="an int >= 16")
    )
    digest_min_chars: int | None = attrs.field(
        default=None, validator=_checks.integer(low=1, optional=True)
    )

    # -- the deterministic layers ----------------------------------------
    def apply_budget(self, messages: Sequence[Message]) -> tuple[Message, ...]:
        """Layer 1: cap each tool result at `max_tool_result_chars` characters."""
        return cap_results(messages, self.max_tool_result_chars)

    def apply_trim(self, messages: Sequence[Message]) -> tuple[Message, ...]:
        """Layer 2: empty the tool results of all but the newest `trim_turns` turns."""
        return trim_results(messages, self.trim_turns)

    def apply_digest(self, messages: Sequence[Message]) -> tuple[Message, ...]:
        """Layer 0 (with `digest_min_chars`): digest long results of earlier turns."""
        if self.digest_min_chars is None:
            return tuple(messages)
        return digest_results(
            messages, min_chars=self.digest_min_chars, keep_recent_turns=1
        )

    def apply_microcompact(self, messages: Sequence[Message]) -> tuple[Message, ...]:
        """Layer 3: per tool call id, only the last result keeps its content."""
        return microcompact(messages)

    def _deterministic_layers(
        self, messages: Sequence[Message], target: int, counter: TokenCounter
    ) -> tuple[tuple[Message, ...], list[str], bool]:
        """Run layers 1-3 until the result fits `target`."""
        layers: list[tuple[str, Layer]] = [
            ("budget", self.apply_budget),
            ("trim", self.apply_trim),
            ("microcompact", self.apply_microcompact),
        ]
        if self.digest_min_chars is not None:
            layers.insert(0, ("digest", self.apply_digest))
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
        """
        try:
            current, _layers = await self._run(messages, target, ctx)
        except SummaryFailed as exc:
            return CompactionProposal.failed(str(exc), ctx.tokens_before)
        if len(current) == len(messages) and all(
            a is b for a, b in zip(current, messages, strict=True)
        ):
            return CompactionProposal.unchanged(messages, ctx.tokens_before)
        return CompactionProposal.compacted(
            current, ctx.tokens_before, ctx.counter.count(current)
        )

    async def _run(
        self, messages: Sequence[Message], target: int, ctx: CompactionContext
    ) -> tuple[tuple[Message, ...], list[str]]:
        """Run the layers until the result fits; return it and the layers used."""
        counter = ctx.counter
        current, applied, fits = self._deterministic_layers(messages, target, counter)
        if fits or not ctx.allow_model:
            return current, applied
        for name, keep, label in (
            ("collapse", self.preserved_turns, None),
            ("autocompact", 1, "[Full conversation summary]"),
        ):
            new = await self._collapse(current, keep, label, ctx)
            if new is not current:
                applied.append(name)
                current = new
                if counter.count(current) <= target:
                    break
        return current, applied

    async def _collapse(
        self,
        messages: tuple[Message, ...],
        keep: int,
        label: str | None,
        ctx: CompactionContext,
    ) -> tuple[Message, ...]:
        """Layers 4 and 5: summarise all but the last `keep` turns."""
        plan = split_turns(messages, keep, fallback=label is not None)
        if not plan.summarised:
            return messages
        key = plan.key(ctx.session_id) + (":full" if label else ":collapse")
        message_id = summary_id(key)
        text = ctx.summaries.get(message_id)
        if text is None:
            body = await summarise(
                plan.summarised,
                previous="\n\n".join(summary_body(m) for m in plan.previous),
                ctx=ctx,
                model=self.model,
                max_tokens=self.max_summary_tokens,
                window=ctx.context_window,
            )
            turns = len(turn_starts(plan.summarised)) + sum(
                _summarised_turns(m) for m in plan.previous
            )
            header = label or f"[Conversation summary of {max(turns, 1)} earlier turns]"
            text = f"{header}\n{body}"
        summary = Message.user(
            text,
            id=message_id,
            metadata={SUMMARY_COVERS: plan.summarised[-1].id, SUMMARY_KEY: key},
        )
        return (*plan.head, summary, *plan.kept)

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
        counter = counter or default_counter()
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
            window: The summary model's context window (0: unlimited).

        Returns:
            The messages and `Skipped("below trigger threshold")`,
            `Applied(...)`, or `Failed(error)` with the messages unchanged:
            the breaker is open, a layer failed, or every layer ran and the
            result is still over `limit` (seed 001's CompactionFailed).
        """
        _checks.check(line, "line", _TOKENS)
        _checks.check(limit, "limit", _TOKENS)
        _checks.check(window, "window", _TOKENS)
        counter = counter or default_counter()
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
            new, layers = await self._run(messages, limit, ctx)
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


_COLLAPSED: Final = re.compile(r"^\[Conversation summary of (\d+) earlier turns\]")


def _summarised_turns(summary: Message) -> int:
    """The turns an earlier collapse summary says it covers (0 if none)."""
    found = _COLLAPSED.match(summary.text)
    return int(found.group(1)) if found else 0


_TOKENS = _checks.integer(low=0, expected="an int >= 0 (tokens)")
