"""`ToolResultDigest`: replace old, oversized tool results with one line.

A result from an earlier exchange (a user message and everything that
answers it) that is longer than `min_chars` characters becomes an
informative one-line digest of what the call did, rather than a generic
"hidden" placeholder. No model call: the digest is pure string parsing of
the call's arguments and the result's text (`digest_line`).

The digest formats are listed in `_digest_line.py`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import final

import attrs

from turnfsm import _checks
from turnfsm.context._digest_line import _is_digest, digest_line
from turnfsm.context._pairs import pair_tool_traffic
from turnfsm.context._pins import keep_pinned
from turnfsm.context._recall_marks import with_recall_marks
from turnfsm.context._transcript import turn_starts
from turnfsm.context._values import CompactionContext, CompactionProposal
from turnfsm.messages import (
    Message,
    Part,
    Role,
    ToolCallPart,
    ToolResultPart,
)

__all__ = ["ToolResultDigest", "digest_before", "digest_line", "digest_results"]

_check_min_chars = _checks.integer("min_chars", low=1)
_check_keep_recent_turns = _checks.integer("keep_recent_turns", low=0)


def digest_results(
    messages: Sequence[Message], *, min_chars: int = 2000, keep_recent_turns: int = 1
) -> tuple[Message, ...]:
    """Replace the oversized tool results of older exchanges by their digests.

    An exchange is a user message and everything that answers it (summaries
    do not start one; messages before the first user message come before the
    oldest exchange, and are digested with the older ones). In every exchange
    but the newest `keep_recent_turns`, a tool result longer than `min_chars`
    characters gets `digest_line(call, result)` as its content; its call id
    and error flag, and its message's role, id and metadata, are kept. The
    call is the one `pair_tool_traffic` pairs the result with (None for a
    lone result). A result that already reads like its digest (one line of
    at most 200 characters starting as its digest would) is left alone, so
    applying the function twice changes nothing more.

    Args:
        messages: The conversation.
        min_chars: Results of at most this many characters are kept (≥ 1).
        keep_recent_turns: How many of the newest exchanges are left as they
            are (≥ 0; 0 digests every exchange).

    Returns:
        As many messages as `messages`; the ones with no digested result are
        the same objects.

    Raises:
        ConfigError: When a knob is out of range.
    """
    _checks.check(min_chars, "min_chars", _check_min_chars)
    _checks.check(keep_recent_turns, "keep_recent_turns", _check_keep_recent_turns)
    return digest_before(
        messages, _recent_start(messages, keep_recent_turns), min_chars
    )


def digest_before(
    messages: Sequence[Message], end: int, min_chars: int
) -> tuple[Message, ...]:
    """Digest the results in ``messages[:end]`` longer than `min_chars` characters.

    The rules are `digest_results`'s, with the boundary given as an index.
    """
    tool = Role.TOOL
    big = [
        (i, j)
        for i, m in enumerate(messages[:end])
        if m.role is tool
        for j, part in enumerate(m.parts)
        if len(part.content) > min_chars  # type: ignore[union-attr]  # a tool message holds only results
    ]
    if not big:
        return tuple(messages)
    # Results before `end` pair with calls before them: the prefix suffices.
    calls = {
        (p.result_message, p.result_part): messages[p.call_message].parts[p.call_part]
        for p in pair_tool_traffic(messages[:end]).pairs
    }
    edited: dict[int, list[Part]] = {}
    for i, j in big:
        result = _as_result(messages[i].parts[j])
        found = calls.get((i, j))
        call = found if isinstance(found, ToolCallPart) else None
        if _is_digest(call, result):
            continue
        parts = edited.setdefault(i, list(messages[i].parts))
        parts[j] = attrs.evolve(result, content=digest_line(call, result))
    out = list(messages)
    for i, parts in edited.items():
        out[i] = attrs.evolve(messages[i], parts=tuple(parts))
    return tuple(out)


@final
@_checks.keyword_checked
@attrs.frozen(kw_only=True)
class ToolResultDigest:
    """Digest the oversized tool results of older exchanges; drop nothing.

    A `ContextCompactor` that applies `digest_results`, pinned results
    aside (they stay word for word): every message stays,
    so no tool call/result pair can break, and a pass on its own output
    changes nothing. It shrinks by content, not towards a size: the target is
    ignored, and a conversation with nothing to digest comes back unchanged.

    Attributes:
        min_chars: Results of at most this many characters are kept (≥ 1).
        keep_recent_turns: How many of the newest exchanges (a user message
            and everything that answers it) are left as they are (≥ 0; not
            a *turn*, which elsewhere in turnfsm is one model call).

    Raises:
        ConfigError: On construction, when a knob is out of range.
    """

    min_chars: int = attrs.field(default=2000, validator=_check_min_chars)
    keep_recent_turns: int = attrs.field(default=1, validator=_check_keep_recent_turns)

    async def compact(
        self, messages: Sequence[Message], target: int, ctx: CompactionContext
    ) -> CompactionProposal:
        """Digest the oversized results of `messages`; `target` is ignored.

        Args:
            messages: The conversation.
            target: Ignored: what is digested depends on size and age only.
            ctx: The pass's context; `ctx.counter` re-counts the result.

        Returns:
            The digested conversation, or the input unchanged when no result
            needed a digest.

        Each replacement it makes names what it covers (a recall note).
        """
        return await with_recall_marks(self._compact, messages, target, ctx)

    async def _compact(
        self, messages: Sequence[Message], target: int, ctx: CompactionContext
    ) -> CompactionProposal:
        """The pass itself, on messages without their recall notes."""
        del target  # size-blind: age and length pick the results, by design
        digested = keep_pinned(
            messages,
            digest_results(
                messages,
                min_chars=self.min_chars,
                keep_recent_turns=self.keep_recent_turns,
            ),
            ctx.pinned,
        )
        if all(a is b for a, b in zip(digested, messages, strict=True)):
            return CompactionProposal.unchanged(messages, ctx.tokens_before)
        return CompactionProposal.compacted(
            digested, ctx.tokens_before, ctx.counter.count(digested)
        )


def _recent_start(messages: Sequence[Message], keep: int) -> int:
    """Return the index of the first message of the newest `keep` exchanges."""
    if keep == 0:
        return len(messages)
    starts = turn_starts(messages)
    return starts[-keep] if len(starts) >= keep else 0


def _as_result(part: Part) -> ToolResultPart:
    assert isinstance(part, ToolResultPart)  # a tool message holds only results
    return part
