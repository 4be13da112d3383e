"""`SummarizingCompactor`: old exchanges become one summary.

An exchange is a user message and everything that answers it, up to the next
user message (summaries do not start one; messages before the first user
message belong to the oldest). A pass:

1. **Split** (`SummarizingCompactor.plan`): the leading system messages are
   kept; an earlier summary is folded in; of the rest, the newest
   `keep_recent_turns` exchanges are kept raw and whole, the ones before
   them are summarised whole. The cut sits at a user message, and moves
   back an exchange while a tool call and its result would straddle it.
   Nothing is reordered, and the newest exchange is never split: a
   conversation of no more exchanges than `keep_recent_turns` (one long
   tool-using exchange, say) has nothing to summarise, unless
   `compact_newest_exchange` lets the pass summarise inside the newest
   exchange (its user message and last messages kept, in order). Every
   input message is in exactly one of summarised / kept.
2. **Nothing to summarise** → the input, unchanged, no model call (with an
   earlier summary, that summary stands).
3. **Idempotent**: the pass's key is (session, last summarised message id,
   count summarised); a summary already recorded under it is reused with no
   model call.
4. **Incremental**: only messages after the earlier summary are summarised,
   with the iterative-update prompt ("PREVIOUS SUMMARY:" + "NEW TURNS TO
   INCORPORATE:").
5. **Sized by the summary model**: its window is `summary_window`, else the
   model's own ``context_window``, never the agent's; without a model of
   its own the summary goes to the agent's model, sized to the agent's
   window. A transcript that does
   not fit beside the prompt and the summary is summarised in parts, then
   the part summaries are; a window too small even for that shrinks the
   summary's budget, down to `MIN_SUMMARY_TOKENS`, before the pass fails.
6. **Checked**: an empty or whitespace summary fails the pass; one over its
   budget is re-asked shorter once, then fails the pass. A summary is never
   committed oversized.
7. **Pins kept**: pinned messages (`CompactionContext.pinned`) are never
   summarised: they stay word for word, in their order, right after the
   summary that replaced the messages around them.
8. The summary becomes one message (role `summary_role`, system by default)
   right after the leading system messages (after the newest exchange's user
   message, when the pass summarised inside it): `SUMMARY_PREFIX`, then the
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
from turnfsm.context._pairs import adjust_split, pair_tool_traffic
from turnfsm.context._pins import keep_pinned
from turnfsm.context._recall_marks import with_recall_marks
from turnfsm.context._summary_model import (
    SummaryFailed,
    check_model,
    check_summary_tokens,
    check_summary_window,
    summarise,
    summary_window,
)
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

    The result of the pass is ``head + opening + (summary,) + kept``: what
    is kept stays in its order. Every input message is in exactly one of
    `head`, `opening`, `previous`, `summarised`, `kept`.

    Attributes:
        head: Leading system messages, kept as they are.
        previous: Earlier summaries, folded into the new one.
        summarised: The messages the new summary covers, in order.
        kept: The messages kept raw after the summary: the newest exchanges,
            whole, in order (or, with `opening`, the newest exchange's last
            messages).
        opening: The newest exchange's user message when the pass compacts
            inside that exchange (``compact_newest_exchange``): kept, before
            the summary. Empty otherwise.
    """

    head: tuple[Message, ...] = attrs.field(converter=as_messages)
    previous: tuple[Message, ...] = attrs.field(converter=as_messages)
    summarised: tuple[Message, ...] = attrs.field(converter=as_messages)
    kept: tuple[Message, ...] = attrs.field(converter=as_messages)
    opening: tuple[Message, ...] = attrs.field(default=(), converter=as_messages)

    def without(self, pinned: frozenset[str]) -> SummaryPlan:
        """Return the plan with the `pinned` messages left out of `summarised`."""
        if not pinned:
            return self
        kept = tuple(m for m in self.summarised if m.id not in pinned)
        return attrs.evolve(self, summarised=kept)

    def key(self, session_id: str) -> str:
        """Return the idempotency key of the pass."""
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
@_checks.keyword_checked
@attrs.frozen(kw_only=True)
class SummarizingCompactor:
    """Summarise old exchanges with a model; keep the recent ones raw.

    Attributes:
        model: The summary model, or None: the agent's own under a
            `Driver` (required when the compactor is used on its own). A
            client that knows its window says so with an int attribute
            ``context_window``.
        keep_recent_turns: Exchanges kept raw, whole (≥ 1): an exchange is
            a user message and everything that answers it (not a *turn*,
            which elsewhere in turnfsm is one model call).
        max_summary_tokens: The most a summary may be, in the counter's
            tokens (≥ 16). The summary call asks the model for 5/8 of it
            (the counter errs high, up to 1.6x on prose). A summary model
            whose window cannot hold it beside the prompt and some of the
            transcript gets a smaller budget, down to `MIN_SUMMARY_TOKENS`.
        summary_window: The summary model's context window in tokens, or
            None: the model's ``context_window`` when it has one, else not
            known (the transcript goes in one request). Never the agent's
            window for a model of its own; without one (`model` None) the
            agent's model summarises, within the agent's window. A
            transcript that does not fit is summarised in parts.
        summary_role: The role of the summary message: system (the
            default; providers that drop later system messages need "user").
        temperature: Of the summary call (0.3: faithful, low-creativity).
        digest_min_chars: When set, summarised tool results longer than
            this are replaced by their one-line digest before the summary
            model sees them (`ToolResultDigest` as a pre-pass).
        compact_newest_exchange: Off (the default), the newest exchange is
            kept whole, so a conversation that is one long tool-using
            exchange (a single run) has nothing to summarise. On, when what
            is kept is one exchange (`keep_recent_turns` 1, or a
            conversation of one exchange), the pass also summarises inside
            the newest exchange: its user message and its last
            ``2 * keep_recent_turns`` messages are kept, in order, with the
            summary between them.

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
    keep_recent_turns: int = attrs.field(
        default=4, validator=_checks.integer(low=1, expected="an int >= 1")
    )
    max_summary_tokens: int = attrs.field(default=1_000, validator=check_summary_tokens)
    summary_window: int | None = attrs.field(
        default=None, validator=check_summary_window
    )
    summary_role: Role = attrs.field(default=Role.SYSTEM, converter=_to_role)
    temperature: float = attrs.field(default=0.3, validator=_check_temperature)
    digest_min_chars: int | None = attrs.field(
        default=None, validator=_checks.integer(low=1, optional=True)
    )
    compact_newest_exchange: bool = attrs.field(
        default=False, validator=_checks.boolean()
    )

    def plan(self, messages: Sequence[Message]) -> SummaryPlan:
        """Split `messages` for a pass (pure: no model, no counting)."""
        return split_turns(
            messages,
            self.keep_recent_turns,
            into_newest=self.compact_newest_exchange,
        )

    async def compact(
        self, messages: Sequence[Message], target: int, ctx: CompactionContext
    ) -> CompactionProposal:
        """Summarise the old part of `messages`; `target` is a hint only.

        Args:
            messages: The conversation.
            target: Ignored: the split is by exchanges, the summary's size
                is bounded by `max_summary_tokens`.
            ctx: The pass's context: the counter, the session's recorded
                summaries, the driver's model call, whether a model may be
                called at all (the circuit breaker).

        Returns:
            The conversation with its old part summarised; the input when
            nothing is left to summarise; a failed outcome when the summary
            could not be made.

        Each replacement it makes names what it covers (a recall note).
        """
        return await with_recall_marks(self._compact, messages, target, ctx)

    async def _compact(
        self, messages: Sequence[Message], target: int, ctx: CompactionContext
    ) -> CompactionProposal:
        """The pass itself, on messages without their recall notes."""
        del target
        plan = self.plan(messages).without(ctx.pinned)
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
                    window=summary_window(
                        self.summary_window, self.model, ctx.context_window
                    ),
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
        new = keep_pinned(
            messages, (*plan.head, *plan.opening, summary, *plan.kept), ctx.pinned
        )
        return CompactionProposal.compacted(
            new, ctx.tokens_before, ctx.counter.count(new)
        )

    def _deterministic(
        self, messages: Sequence[Message], ctx: CompactionContext
    ) -> CompactionProposal:
        """What a pass may do without a model: digest old tool results."""
        new = keep_pinned(
            messages,
            digest_results(
                messages,
                min_chars=self.digest_min_chars or 2_000,
                keep_recent_turns=self.keep_recent_turns,
            ),
            ctx.pinned,
        )
        if all(a is b for a, b in zip(new, messages, strict=True)):
            return CompactionProposal.unchanged(messages, ctx.tokens_before)
        return CompactionProposal.compacted(
            new, ctx.tokens_before, ctx.counter.count(new)
        )


def split_turns(
    messages: Sequence[Message], keep_turns: int, *, into_newest: bool = False
) -> SummaryPlan:
    """Split `messages` into head / previous summaries / summarised / kept.

    An exchange starts at each user message (summaries do not start one;
    messages before the first user message belong to the oldest). The newest
    `keep_turns` exchanges are kept, whole; the ones before them are
    summarised, whole. The cut sits at a user message and moves back an
    exchange while a tool call and its result straddle it (only a
    conversation with a broken pair has one).

    With `into_newest`, when what is kept is one exchange (`keep_turns` 1, or
    a conversation of one exchange), the newest exchange's user message (the
    plan's `opening`) and its last ``2 * keep_turns`` messages are kept and
    everything else is summarised; the cut moves earlier while a tool pair
    straddles it. A pass's result splits to nothing more: a second pass
    finds nothing new.
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
    head = messages[:n_head]
    users = turn_starts(body)
    traffic = pair_tool_traffic(body)
    if into_newest and (len(users) == 1 or (users and keep_turns == 1)):
        latest = users[-1]
        inner = adjust_split(body, len(body) - 2 * keep_turns, traffic=traffic)
        if inner > latest + 1:  # something inside the newest exchange
            return SummaryPlan(
                head=head,
                previous=previous,
                summarised=body[:latest] + body[latest + 1 : inner],
                kept=body[inner:],
                opening=[body[latest]],
            )
    cut = users[-keep_turns] if len(users) > keep_turns else 0
    while cut:
        safe = adjust_split(body, cut, traffic=traffic)
        if safe == cut:
            break
        cut = max((u for u in users if u <= safe), default=0)
    if not cut:  # nothing to summarise: the earlier summaries stand
        return SummaryPlan(head=head, previous=(), summarised=(), kept=rest)
    return SummaryPlan(
        head=head, previous=previous, summarised=body[:cut], kept=body[cut:]
    )
