"""Errors of the context window: a run that did not fit it; compaction's limits."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final, Literal, final

import attrs

from turnfsm._lines import window_to_send
from turnfsm.errors._base import TurnFSMError

__all__ = [
    "CompactionCircuitOpen",
    "CompactionFailed",
    "CompactionLimitExceeded",
    "CompactionStalled",
    "ContextExceeded",
    "LargeItem",
    "PinnedMessageLost",
    "PinnedTooLarge",
]


_KINDS: Final = ("tool_result", "tool_call", "message")


@final
@attrs.frozen(kw_only=True)
class LargeItem:
    """One big piece of a context: a tool result, a tool call or a message's text.

    A `ContextExceeded` lists the largest ones in `largest`, so its message
    says what filled the window (`largest_items` finds them, `explain` fills them).

    Attributes:
        kind: ``"tool_result"``, ``"tool_call"`` or ``"message"`` (the text
            parts of one message, and what its model client sends of its
            metadata, such as a reply's thinking).
        role: the role of the message holding it.
        turn: the 1-based turn it is in; a turn starts at each user message,
            and items before the first user message are in turn 0.
        index: the position of its message in the context.
        tokens: its size, by the run's counter.
        tool: the tool's name for a tool call or result (a result's is found
            from the call it answers; ``""`` if unknown); ``""`` otherwise.
        call_id: the tool call's id for a tool call or result; ``""`` otherwise.
        pinned: whether its message is pinned: no pass drops or shortens it.
    """

    kind: Literal["tool_result", "tool_call", "message"] = attrs.field(
        validator=attrs.validators.in_(_KINDS)
    )
    role: str
    turn: int
    index: int
    tokens: int
    tool: str = ""
    call_id: str = ""
    pinned: bool = False

    def __str__(self) -> str:
        call = f" (call {self.call_id})" if self.call_id else ""
        match self.kind:
            case "tool_result":
                what = f"tool result of {self.tool}" if self.tool else "tool result"
            case "tool_call":
                what = f"tool call to {self.tool}" if self.tool else "tool call"
            case _:
                what, call = f"{self.role} message #{self.index}", ""
        when = f"in turn {self.turn}" if self.turn else "before the first turn"
        pinned = " (pinned)" if self.pinned else ""
        return f"{what}{call} {when}{pinned}: {self.tokens:,} tokens"


def _items(value: Iterable[LargeItem]) -> tuple[LargeItem, ...]:
    return tuple(value)


_MASKS: Final = frozenset({"MaskingCompactor", "LayeredCompactor"})
"""The shipped strategies that cap and digest tool results."""

_SUMMARISES: Final = frozenset({"SummarizingCompactor", "LayeredCompactor"})
"""The shipped strategies that can summarise old turns."""


def _largest_text(error: ContextExceeded) -> str:
    """Return the ``"; largest: ..."`` tail of a `ContextExceeded` message."""
    largest = error.largest
    if not largest:
        return ""
    items = ", ".join(str(item) for item in largest)
    return f"; largest: {items}; {_hint(error)}"


def _hint(error: ContextExceeded) -> str:
    """What would help, given what fills the context and the strategy in use.

    The hint follows where the listed tokens are: tool results shrink in
    place (capped, digested), anything else only by summarising the old
    turns. It never recommends the strategy that could not make it fit.
    """
    largest, strategy = error.largest, error.strategy
    results = sum(i.tokens for i in largest if i.kind == "tool_result")
    # Refused by the provider, the window is the model's: it cannot grow.
    refused = bool(error.provider_message)
    window = (
        "the model's real window as its context_window"
        if refused
        else f"a context window of at least {window_to_send(_needed(error))} tokens"
    )
    if error.window_check.startswith(REPLY_OVER_WINDOW):
        # The reply, not what the context holds: no pass makes room for a
        # reply that comes unbudgeted.
        return (
            "the reply did not fit beside the conversation: set a reply budget "
            "(max_output_tokens), so that room for the reply is kept before the "
            f"model is called, or give the run {window}"
        )
    # A reply cut at the window: its budget did not fit beside the messages.
    smaller = " or a smaller reply budget (max_output_tokens)" if _cut(error) else ""
    fits = (
        f"{window}, a smaller reply budget (max_output_tokens), or fewer pinned "
        "messages"
    )
    listed = sum(i.tokens for i in largest)
    if 2 * sum(i.tokens for i in largest if i.pinned) >= listed:
        # No strategy shrinks these: naming one would send the user astray.
        return (
            "pinned messages fill it, and no pass drops or shortens a pinned "
            "message: shorten them, switch off a pin rule (PinRules), or give "
            f"the run {window}{smaller}"
        )
    if 2 * results >= listed:
        if strategy not in _MASKS:
            default = " (the default strategy)" if not strategy else ""
            return (
                f"tool results fill it: MaskingCompactor{default} caps, digests "
                "and cuts them to fit"
            )
        # MaskingCompactor cuts inside the newest exchange already; what
        # LayeredCompactor cuts a result to is its max_tool_result_chars.
        newest = (
            ""
            if strategy == "MaskingCompactor"
            else "lower its max_tool_result_chars, let it cut the newest exchange "
            "(compact_newest_exchange=True) unless it does already, or "
        )
        return (
            f"tool results fill it, and {strategy} (the strategy in use) could "
            f"not cut them further: {newest}give the run {fits}"
        )
    if strategy not in _SUMMARISES:
        return (
            "messages fill it: SummarizingCompactor, or LayeredCompactor with a "
            "summary model, summarises old turns; or set "
            + (
                "context_window to the model's real window"
                if refused
                else "a bigger context_window"
            )
            + smaller
        )
    # What each keeps whole: its newest exchanges, which no summary covers.
    keeps = (
        "lower its keep_recent_turns (the newest exchanges it keeps whole), "
        if strategy == "SummarizingCompactor"
        else ""
    )
    return (
        f"messages fill it, and {strategy} (the strategy in use) could not "
        f"summarise them small enough: {keeps}let it summarise inside the "
        "newest exchange (compact_newest_exchange=True) unless it does already, "
        f"or give the run {fits}"
    )


@attrs.frozen(auto_exc=True)
class ContextExceeded(TurnFSMError):
    """Raised when a run could not fit the context window.

    `used` and `limit` are payload-comparable token estimates. `limit` is the
    window when the compacted result still did not fit. `largest` lists the
    biggest items of the context, biggest first (empty when not measured);
    the message then names them and what would shrink them, never the
    strategy that could not: `strategy` is the class name of the compactor
    in use (``""``: not known). `provider_message` is the provider's own
    words when it refused the request as too long (``"maximum context
    length is 4096 tokens"``), quoted in the message; ``""`` otherwise.
    `window_check` is what the run's own window check said when it refused
    the request or the model's reply as over the window (``"the reply makes
    the conversation 306393 tokens, over the 100000 window; it is not
    committed"``), quoted in the message; ``""`` otherwise.
    `counter` names the token counter when its count is more than any
    tokenizer makes of the text it counted (``"HugeCounter counted
    1000000000 tokens for 5 characters"``): the message then blames it,
    not the conversation; ``""`` otherwise.
    """

    used: int
    limit: int
    largest: tuple[LargeItem, ...] = attrs.field(
        default=(), converter=_items, kw_only=True
    )
    # Left out of the log while empty (the key `turnfsm.core.OMITTED_IF_DEFAULT`
    # names; this module imports no other turnfsm package): an error keeps the
    # form records written before the field have.
    strategy: str = attrs.field(
        default="", kw_only=True, metadata={"turnfsm.omitted_if_default": True}
    )
    provider_message: str = attrs.field(
        default="", kw_only=True, metadata={"turnfsm.omitted_if_default": True}
    )
    window_check: str = attrs.field(
        default="", kw_only=True, metadata={"turnfsm.omitted_if_default": True}
    )
    counter: str = attrs.field(
        default="", kw_only=True, metadata={"turnfsm.omitted_if_default": True}
    )

    def __str__(self) -> str:
        if self.provider_message:
            what = (
                "the provider kept cutting the reply off at the window - "
                + _SMALLER_REPLY
                if _cut(self)
                else "the provider kept refusing the request as too long - "
            ) + _REFUSED
        else:
            what = "use a bigger window or a compactor that shrinks harder"
        return (
            f"context exceeded: {self.used} tokens used, limit {self.limit}; "
            f"{_counter_text(self) or what}"
            + _provider_text(self)
            + _check_text(self)
            + _largest_text(self)
        )


_REFUSED: Final = (
    "set context_window to the model's real window (with a counter that does not"
    " undercount its tokens), so that compaction starts before the provider"
    " refuses"
)
"""What to do when the provider refused a request the run's window allowed."""

_CUT_MARKS: Final = (
    "model_context_window_exceeded",  # Anthropic's stop reason, quoted
    "cut the reply off at",  # a server that clips the reply budget to its window
)
"""What the provider's words hold when its overflow was a reply cut at the window."""

_SMALLER_REPLY: Final = (
    "lower the reply budget (max_output_tokens), which the window did not hold"
    " beside the conversation, or "
)
"""The first advice for a reply cut at the window, before `_REFUSED`."""


def _cut(error: ContextExceeded) -> bool:
    """Whether the provider's overflow was a reply cut at the window.

    Such a reply (Anthropic's ``model_context_window_exceeded``, a server
    that clips the reply budget to what its window leaves) overflowed by
    its budget: a smaller budget fixes it, as the model's real window does.
    """
    said = error.provider_message
    return any(mark in said for mark in _CUT_MARKS)


def _provider_text(error: ContextExceeded) -> str:
    """Return the ``" (the provider said: ...)"`` part of a message, if any."""
    said = error.provider_message
    return f" (the provider said: {said})" if said else ""


def _counter_text(error: ContextExceeded) -> str:
    """Return the advice that blames the counter, if it is at fault, else ``""``."""
    said = error.counter
    if not said:
        return ""
    return (
        f"the token counter is at fault, not the conversation: {said}, more "
        "than any tokenizer makes of that text - fix the counter (its count, "
        "count_text or units)"
    )


REPLY_OVER_WINDOW: Final = "the reply makes the conversation"
"""How the window check's words begin when a reply would not fit (not committed)."""

_CHECKED: Final = re.compile(r"(\d+) tokens")


def _needed(error: ContextExceeded) -> int:
    """The size to send: the window check's, when it is larger.

    A stalled pass's `used` is what it left; the request or reply the check
    refused was bigger. The window it needs has its emergency line over it.
    """
    found = _CHECKED.search(error.window_check)
    return max(error.used, int(found[1])) if found else error.used


def _check_text(error: ContextExceeded) -> str:
    """Return the ``" (the window check said: ...)"`` part of a message, if any."""
    said = error.window_check
    return f" (the window check said: {said})" if said else ""


@final
@attrs.frozen(auto_exc=True)
class CompactionStalled(ContextExceeded):
    """Raised when a compaction pass saved nothing (the no-progress guard).

    `used` is the size after the pass and `limit` the size before it; a
    pre-compact hook that vetoes over the line ends here too. A pass run
    because the provider refused the request as too long quotes the
    provider (`provider_message`), and its message asks for the model's real
    window: the run's own allowed a request the model did not.
    """

    def __str__(self) -> str:
        if self.provider_message:
            cut = _cut(self)
            what = (
                (
                    "the provider cut the reply off at the window"
                    if cut
                    else "the provider refused the request as too long"
                )
                + ", and the pass run for it saved nothing (a vetoing hook, no"
                " context manager, or a conversation the compactor cannot cut) - "
                + (_SMALLER_REPLY if cut else "")
                + _REFUSED
            )
        elif self.window_check:
            what = (
                "the run's window check refused the request or the model's reply"
                " as over the window, and the pass run for it saved nothing (a"
                " vetoing hook, no context manager, or a conversation the"
                " compactor cannot cut) - a reply too big for the window needs a"
                " smaller reply budget (max_output_tokens) or a bigger window"
            )
        else:
            what = (
                "nothing was saved (a vetoing hook, no context manager, or a"
                " conversation the compactor cannot cut) - see what is biggest,"
                " choose a strategy that shrinks it, or a bigger window"
            )
        return (
            f"compaction stalled: {self.used} tokens after the pass, "
            f"{self.limit} before; {_counter_text(self) or what}"
            + _provider_text(self)
            + _check_text(self)
            + _largest_text(self)
        )


@final
@attrs.frozen(auto_exc=True)
class CompactionFailed(ContextExceeded):
    """Raised when the compactor itself failed; `cause` says why."""

    cause: str = ""

    def __str__(self) -> str:
        head = (
            f"compaction failed at {self.used} tokens (limit {self.limit}): "
            f"{self.cause}" + (f"; {_counter_text(self)}" if self.counter else "")
        )
        if self.largest and self._had_room():
            # A summary model down, a compactor that raised: what fills the
            # conversation, or a bigger window, is no help.
            return head + (
                "; the conversation fits the window (its emergency line is over "
                f"{self.used} tokens): what failed is the pass's own"
            )
        return head + _largest_text(self)

    def _had_room(self) -> bool:
        """Whether the window had room for what the pass was given, by the count.

        Not when the provider refused the request as too long (the window is
        then the model's, smaller than counted) or the window check refused
        one (what it refused was bigger than `used`).
        """
        return (
            not self.provider_message
            and not self.counter
            and window_to_send(_needed(self)) <= self.limit
        )


@final
@attrs.frozen(auto_exc=True)
class CompactionCircuitOpen(TurnFSMError):
    """Raised when the compaction circuit breaker is open and refuses to run."""

    failures: int

    def __str__(self) -> str:
        return (
            f"compaction circuit open after {self.failures} consecutive failures; "
            "once the cause is mended (a summary model down, a compactor that "
            "raises), reset it: session.reset_breaker(), or turnfsm sessions "
            "reset-breaker ID"
        )


@final
@attrs.frozen(auto_exc=True)
class CompactionLimitExceeded(TurnFSMError):
    """Raised after `max_compactions` passes in a row with no model call between."""

    max_compactions: int

    def __str__(self) -> str:
        return (
            f"the run made max_compactions={self.max_compactions} compaction "
            "passes in a row, with no model call between them, and still has no "
            "request that fits; raise max_compactions, or check for a hook that "
            "adds a message after every pass"
        )


@final
@attrs.frozen(auto_exc=True)
class PinnedTooLarge(ContextExceeded):
    """Raised when a run's pinned messages alone cannot fit the window.

    `used` is `pinned` plus `reserved`, `limit` the window: a request is sent
    only under the window's emergency line (`line`), and no pass may drop a
    pinned message, so no pass could make the request fit.

    Attributes:
        pinned: The pinned messages' tokens.
        reserved: What rides every request besides its messages (system
            prompt, tool schemas, output schema, reply budget), in tokens.
        line: The emergency line of the window, which `used` reaches
            (0: not given; `used` is then over the window).
        scale: The factor the figures include: a calibrating context
            manager counts a session's requests as its provider reported
            them, this many times the token counter's estimate (1.0: the
            estimate as it is).
        reply: The reply budget (``max_output_tokens``) within `reserved`.
    """

    pinned: int = attrs.field(default=0, kw_only=True)
    reserved: int = attrs.field(default=0, kw_only=True)
    line: int = attrs.field(
        default=0, kw_only=True, metadata={"turnfsm.omitted_if_default": True}
    )
    scale: float = attrs.field(
        default=1.0, kw_only=True, metadata={"turnfsm.omitted_if_default": True}
    )
    reply: int = attrs.field(
        default=0, kw_only=True, metadata={"turnfsm.omitted_if_default": True}
    )

    @property
    def counted_as(self) -> str:
        """How the figures were counted, when not as the counter estimates.

        Empty at scale 1.0; else a clause for after the figures, naming the
        scale the session learned from the usage its provider reported.
        """
        if self.scale == 1.0:
            return ""
        return (
            f" (counted as the provider counts: {self.scale:.2f}x the token "
            "counter's estimate, the scale this session learned from the usage "
            "its provider reported)"
        )

    def __str__(self) -> str:
        if self.reserved > self.pinned:  # no pin rule could make it fit
            budget = " lower max_output_tokens," if self.reply else ""
            advice = (
                "most of it is reserved (the system prompt, the tool schemas, "
                "the output type's schema and the reply budget): shorten the "
                "system prompt or the tools' descriptions, give fewer tools or "
                f"a smaller output type,{budget} or use a bigger window"
            )
        else:
            advice = (
                "pin less (switch off a pin rule in PinRules), shorten the "
                "pinned messages, or use a bigger window"
            )
        where = (
            f"on or over the {self.line}-token emergency line of the "
            f"{self.limit}-token window (a request there is compacted, never sent)"
            if self.line
            else f"over the {self.limit}-token window"
        )
        return (
            f"pinned messages do not fit: {self.pinned} pinned tokens plus "
            f"{self.reserved} reserved is {self.used}{self.counted_as}, {where}; "
            f"{_counter_text(self) or advice}"
        ) + _largest_text(self)


PinLoss = Literal["dropped", "altered", "moved", "preceded", "followed"]
"""What a pass did to a pinned message."""


@final
@attrs.frozen(auto_exc=True, kw_only=True)
class PinnedMessageLost(TurnFSMError):
    """Reported when a compaction pass dropped, altered or moved a pinned message.

    The context manager refuses such a pass: it fails, and the conversation
    stays as it was.

    Attributes:
        message_id: The pinned message's id.
        role: Its role (``"user"``, ``"system"``, ...).
        strategy: The compactor's class name.
        what: ``"dropped"`` (missing from the result), ``"altered"`` (its
            words or metadata changed), ``"moved"`` (out of order with
            the other pinned messages), ``"preceded"`` (a new user message,
            `by`, was put before the first user message: the next pass
            would pin it in the task's place; or a message was put before a
            pinned system message, which the next pass would no longer
            pin) or ``"followed"`` (one was
            put after the latest user message: the model would read it as
            the request, and the next pass would pin it in its place).
        by: The new message's id (``"preceded"``, ``"followed"``), else
            ``""``.
    """

    message_id: str
    role: str
    strategy: str
    what: PinLoss
    by: str = ""

    def __str__(self) -> str:
        if self.what == "preceded" and self.role == "system":
            return (
                f"{self.strategy} put the message {self.by} before the pinned "
                f"system message {self.message_id}; only the system messages "
                f"the conversation opens with are pinned, so the next pass "
                f"could drop {self.message_id}: it was refused and the "
                "conversation kept as it was: put new messages after the "
                "system messages"
            )
        if self.what in ("preceded", "followed"):
            where, which = (
                ("before", "first") if self.what == "preceded" else ("after", "latest")
            )
            return (
                f"{self.strategy} put the user message {self.by} {where} the "
                f"pinned {which} user message {self.message_id}; the next pass "
                f"would pin {self.by} in its place, so it was refused and the "
                "conversation kept as it was: mark a summary with "
                "SUMMARY_COVERS (turnfsm.messages), give the message another "
                f"role, or put it {'after' if where == 'before' else 'before'} "
                f"{self.message_id}"
            )
        return (
            f"{self.strategy} {self.what} the pinned {self.role} message "
            f"{self.message_id}; a pass must keep every pinned message word for "
            "word and in order, so it was refused and the conversation kept as "
            "it was: fix the strategy, or do not pin that message"
        )
