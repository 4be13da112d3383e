"""`SummarizingCompactor`: old turns become one summary (seeds 000 and 004).

A pass:

1. **Split** (`SummarizingCompactor.plan`): the leading system messages are
   kept; an earlier summary is folded in; of the rest, the last
   `keep_recent_turns` turns (a turn starts at each user message) are kept
   raw. When that is one turn (one long tool-using run, or
   `keep_recent_turns` 1), it keeps the turn's user message and its last
   ``2 * keep_recent_turns`` messages. The cut never
   separates a tool call from its result, and the latest user message is
   always kept verbatim. Every input message is in exactly one of
   summarised / kept.
2. **Nothing to summarise** → the input, unchanged, no model call (with an
   earlier summary, that summary stands).
3. **Idempotent**: the pass's key is (session, last summarised message id,
   count summarised); a summary already recorded under it is reused with no
   model call.
4. **Incremental**: only messages after the earlier summary are summarised,
   with the iterative-update prompt ("PREVIOUS SUMMARY:" + "NEW TURNS TO
   INCORPORATE:").
5. **Chunked** when the prompt would not fit the summary model's window:
   each chunk is summarised, then the chunk summaries are summarised, to
   `max_summary_tokens`.
6. **Checked**: an empty or whitespace summary fails the pass; one over
   `max_summary_tokens` is re-asked shorter once, then fails the pass. A
   summary is never committed oversized.
7. The summary becomes one message (role `summary_role`, system by default)
   right after the leading system messages: `SUMMARY_PREFIX`, then the
   summary; its metadata names the last message it covers (`SUMMARY_COVERS`)
   and the pass's key.

The summary call is one user message, no tools, temperature 0.3. Under a
`Driver` it runs through the run's retry policy, timeout and usage
accounting (`CompactionContext.model_call`); elsewhere through `model`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import final

import attrs

from turnfsm import _checks
from turnfsm.context._digest import digest_results
from turnfsm.context._pairs import adjust_split
from turnfsm.context._summary_model import SummaryFailed, summarise
from turnfsm.context._transcript import (
    SUMMARY_KEY,
    SUMMARY_PREFIX,
    is_summary,
    summary_body,
    summary_id,
    turn_starts,
)
from turnfsm.context._values import (
    CompactionContext,
    CompactionProposal,
)
from turnfsm.errors import ConfigError
from turnfsm.messages import SUMMARY_COVERS, Message, Role, as_messages
from turnfsm.providers import ModelClient

__all__ = [
    "SummarizingCompactor",
    "SummaryFailed",
    "SummaryPlan",
    "split_turns",
    "summarise",
]


@final
@attrs.frozen(kw_only=True)
class SummaryPlan:
    """How a conversation splits for one summarising pass.

    The result of the pass is ``head + (summary,) + kept``. Every input
    message is in exactly one of `head`, `previous`, `summarised`, `kept`.

    Attributes:
        head: Leading system messages, kept as they are.
        previous: Earlier summaries, folded into the new one.
        summarised: The messages the new summary covers, in order.
        kept: The messages kept raw: the latest user message (when the cut
            falls after it) and the recent tail, in order.
    """

    head: tuple[Message, ...] = attrs.field(converter=as_messages)
    previous: tuple[Message, ...] = attrs.field(converter=as_messages)
    summarised: tuple[Message, ...] = attrs.field(converter=as_messages)
    kept: tuple[Message, ...] = attrs.field(converter=as_messages)

    def key(self, session_id: str) -> str:
        """Return the idempotency key of the pass (seed 000)."""
        last = self.summarised[-1].id if self.summarised else ""
        return f"{session_id}:{last}:{len(self.summarised)}"


_check_temperature = _checks.number(
    "temperature", low=0, high=2, expected="a finite number in 0..2"
)


def _to_role(value: object) -> Role:
    if isinstance(value, str) and value in ("system", "user"):
        return Role(value)
    raise ConfigError("summary_role", value, "'system' or 'user'")


@final
@attrs.frozen(kw_only=True)
class SummarizingCompactor:
    """Summarise old turns with a model; keep the recent ones raw.

    Attributes:
        model: The summary model, or None: the agent's own under a
            `Driver` (required when the compactor is used on its own).
        keep_recent_turns: Turns kept raw (≥ 1).
        max_summary_tokens: The most a summary may be, in the counter's
            tokens (≥ 16). The summary call asks the model for 5/8 of it
            (the counter errs high, up to 1.6x on prose).
        summary_window: The summary model's context window, or None: the
            run's. A prompt that would not fit is summarised in chunks.
        summary_role: The role of the summary message: system (the seed's;
            providers that drop later system messages need "user").
        temperature: Of the summary call (0.3: faithful, low-creativity).
        digest_min_chars: When set, summarised tool results longer than
            this are replaced by their one-line digest before the summary
            model sees them (`ToolResultDigest` as a pre-pass).

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
    keep_recent_turns: int = attrs.field(
        default=4, validator=_checks.integer(low=1, expected="an int >= 1")
    )
    max_summary_tokens: int = attrs.field(
        default=1_000, validator=_checks.integer(low=16, expected="an int >= 16")
    )
    summary_window: int | None = attrs.field(
        default=None, validator=_checks.integer(low=1, optional=True)
    )
    summary_role: Role = attrs.field(default=Role.SYSTEM, converter=_to_role)
    temperature: float = attrs.field(default=0.3, validator=_check_temperature)
    digest_min_chars: int | None = attrs.field(
        default=None, validator=_checks.integer(low=1, optional=True)
    )

    def plan(self, messages: Sequence[Message]) -> SummaryPlan:
        """Split `messages` for a pass (pure: no model, no counting)."""
        return split_turns(messages, self.keep_recent_turns)

    async def compact(
        self, messages: Sequence[Message], target: int, ctx: CompactionContext
    ) -> CompactionProposal:
        """Summarise the old part of `messages`; `target` is a hint only.

        Args:
            messages: The conversation.
            target: Ignored: the split is by turns, the summary's size is
                bounded by `max_summary_tokens`.
            ctx: The pass's context: the counter, the session's recorded
                summaries, the driver's model call, whether a model may be
                called at all (the circuit breaker).

        Returns:
            The conversation with its old part summarised; the input when
            nothing is left to summarise; a failed outcome when the summary
            could not be made.
        """
        del target
        plan = self.plan(messages)
        if not plan.summarised:
            return CompactionProposal.unchanged(messages, ctx.tokens_before)
        key = plan.key(ctx.session_id)
        message_id = summary_id(key)
        text = ctx.summaries.get(message_id)
        if text is None:
            if not ctx.allow_model:  # the breaker is open: deterministic only
                return self._deterministic(messages, ctx)
            try:
                body = await summarise(
                    plan.summarised,
                    previous="\n\n".join(summary_body(m) for m in plan.previous),
                    ctx=ctx,
                    model=self.model,
                    max_tokens=self.max_summary_tokens,
                    window=self.summary_window or ctx.context_window,
                    temperature=self.temperature,
                    digest_min_chars=self.digest_min_chars,
                )
            except SummaryFailed as exc:
                return CompactionProposal.failed(str(exc), ctx.tokens_before)
            text = f"{SUMMARY_PREFIX}\n\n{body}"
        summary = Message(
            role=self.summary_role,
            parts=text,
            id=message_id,
            metadata={SUMMARY_COVERS: plan.summarised[-1].id, SUMMARY_KEY: key},
        )
        new = (*plan.head, summary, *plan.kept)
        return CompactionProposal.compacted(
            new, ctx.tokens_before, ctx.counter.count(new)
        )

    def _deterministic(
        self, messages: Sequence[Message], ctx: CompactionContext
    ) -> CompactionProposal:
        """What a pass may do without a model: digest old tool results."""
        new = digest_results(
            messages,
            min_chars=self.digest_min_chars or 2_000,
            keep_recent_turns=self.keep_recent_turns,
        )
        if all(a is b for a, b in zip(new, messages, strict=True)):
            return CompactionProposal.unchanged(messages, ctx.tokens_before)
        return CompactionProposal.compacted(
            new, ctx.tokens_before, ctx.counter.count(new)
        )


def split_turns(
    messages: Sequence[Message], keep_turns: int, *, fallback: bool = True
) -> SummaryPlan:
    """Split `messages` into head / previous summaries / summarised / kept.

    A turn starts at each user message (summaries do not start one). The
    last `keep_turns` turns are kept; when what is kept is one turn (a
    conversation of one long tool-using turn, or `keep_turns` 1), with
    `fallback`, only its user message and its last ``2 * keep_turns``
    messages are. A pass's result splits to nothing more: a
    second pass finds nothing new. The cut moves
    earlier until no tool pair straddles it, and the latest user message is
    always kept.
    """
    n_head = 0
    while (
        n_head < len(messages)
        and messages[n_head].role is Role.SYSTEM
        and not is_summary(messages[n_head])
    ):
        n_head += 1
    rest = messages[n_head:]
    previous = [m for m in rest if is_summary(m)]
    body = [m for m in rest if not is_summary(m)] if previous else list(rest)
    users = turn_starts(body)
    cut = users[-keep_turns] if len(users) > keep_turns else 0
    if fallback and (len(users) <= 1 or keep_turns == 1):
        # What is kept is one turn: its user message and its last messages
        # (one long tool-using turn would otherwise be kept whole).
        cut = max(cut, len(body) - 2 * keep_turns)
    cut = adjust_split(body, cut)
    latest = users[-1] if users else -1
    if 0 <= latest < cut:  # the latest user message is always kept
        summarised = body[:latest] + body[latest + 1 : cut]
        kept = [body[latest], *body[cut:]]
    else:
        summarised, kept = body[:cut], body[cut:]
    if not summarised:  # nothing to summarise: the earlier summaries stand
        return SummaryPlan(
            head=messages[:n_head], previous=(), summarised=(), kept=rest
        )
    return SummaryPlan(
        head=messages[:n_head], previous=previous, summarised=summarised, kept=kept
    )
