"""`MaskingCompactor`: the default strategy, no model call, cheapest first.

What makes an agent's conversation fat is nearly always what its tools
returned, so the layers shrink tool results first and drop messages last.
They run in order and the pass stops as soon as the conversation fits the
target:

1. cap: a tool result over `max_tool_result_chars` characters keeps its head
   and says how many characters were cut;
2. mask: the results of all but the newest `keep_recent_calls` tool-calling
   replies, when longer than `mask_min_chars`, become their one-line digest
   (what the call did, e.g. ``[read_file] read notes.md (10 chars)``);
3. latest: per tool call id, only the last result keeps its content;
4. truncate: the middle of the conversation is dropped by `TruncatingCompactor`
   (the first message and the newest user message stay; no tool call is
   parted from its result);
5. fit: every tool result still over the size at which the conversation fits
   is cut to it (down to `min_result_chars`), and says so;
6. mask the newest: when that is still not enough (one reply called many
   tools at once, or `min_result_chars` forbids the cut), the results the
   layers above kept whole, those of the newest replies too, become their
   digest, oldest first and as few as it takes, with layer 5 after; the
   newest result is the last to go. Each call keeps its result: only the
   result's content changes, and it names its call for recall.

A pass for the message-count line (too many messages, not too many tokens)
or one asked for by hand (`Agent.compact`, ``turnfsm sessions compact``)
always runs the truncation, which is what shortens the conversation.

Pinned messages (`CompactionContext.pinned`) are left as they are by every
layer: a pinned tool result is never capped, digested or cut.

So a run whose one tool result is bigger than the whole window goes on with
that result cut to fit, and the model reads that it was cut. A run whose
newest reply called a dozen tools goes on too: their results are cut to fit,
and where cutting is not enough (or `min_result_chars` forbids it) the older
of them are digested. A conversation whose size is in its own words (a long
user message, long replies) and too short to truncate comes back unchanged:
the brain then calls the model when the request still fits under the
emergency line, and the error says what is large otherwise.

Masking old observations rather than summarising them is as good at half the
cost (JetBrains, "The Complexity Trap", arXiv 2508.21433). Characters, not
bytes.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Sequence
from typing import Final, final

import attrs

from turnfsm import _checks
from turnfsm.context._deterministic_layers import (
    MAX_TOOL_RESULT_CHARS,
    map_results,
    microcompact,
)
from turnfsm.context._digest import digest_before
from turnfsm.context._pins import keep_pinned
from turnfsm.context._recall_marks import same_messages, with_recall_marks
from turnfsm.context._transcript import result_texts
from turnfsm.context._truncating import TruncatingCompactor
from turnfsm.context._values import CompactionContext, CompactionProposal
from turnfsm.core import CompactReason
from turnfsm.messages import Message, Role, ToolResultPart
from turnfsm.tokens import TokenCounter

__all__ = ["MaskingCompactor", "cut_result"]

_ALWAYS_TRUNCATE: Final = frozenset({CompactReason.MESSAGE_COUNT, CompactReason.MANUAL})
"""The passes that are for fewer messages, or asked for, whatever the size."""

_CUT: Final = re.compile(r"\n\[\.\.\. (\d+) more characters not shown[^\n]*\]\Z")


def cut_result(content: str, keep: int) -> str:
    """Return `content` cut to its first `keep` characters, saying how much went.

    The note names how many characters were cut, counting an earlier cut's
    too, so cutting again only shortens the head. Content of at most `keep`
    characters, or that the note would not make shorter (in UTF-8 bytes),
    comes back as it is.

    Args:
        content: A tool result's text, maybe cut already.
        keep: How many characters of its head to keep (≥ 0).
    """
    if len(content) <= keep:  # its head, cut before or not, is no longer
        return content
    found = _CUT.search(content)
    head, gone = (
        (content, 0)
        if found is None
        else (
            content[: found.start()],
            int(found.group(1)),
        )
    )
    if len(head) <= keep:
        return content
    gone += len(head) - keep
    cut = (
        f"{head[:keep]}\n[... {gone} more characters not shown: the result was "
        "cut to fit the context window]"
    )
    # Shorter in UTF-8 bytes, not characters: a character outside ASCII
    # costs a token per byte, so a short text of them may outweigh the note.
    return cut if _bytes(cut) < _bytes(content) else content


def _bytes(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


@final
@_checks.keyword_checked
@attrs.frozen(kw_only=True)
class MaskingCompactor:
    """Shrink tool results, then drop the middle, with no model call (the default).

    The layers are listed in the module's docstring; the pass stops as soon
    as the conversation fits the target. Every message that is kept stays in
    its order, and no tool call is parted from its result.

    Attributes:
        max_tool_result_chars: Layer 1's cap on any tool result (4,000).
        keep_recent_calls: Layer 2 leaves the results of this many newest
            tool-calling replies as they are (2).
        mask_min_chars: Layer 2 digests older results longer than this (200).
        min_result_chars: Layer 5 cuts no result below this many characters
            (0: as far as the conversation needs, down to the note alone).
            Layer 6 may still digest a result when the conversation does
            not fit otherwise.
        preserve_recent: Layer 4 keeps at least this many recent messages (4).

    Raises:
        ConfigError: On construction, naming the field, when a setting is
            out of range or of the wrong type.
    """

    max_tool_result_chars: int = attrs.field(
        default=MAX_TOOL_RESULT_CHARS, validator=_checks.integer(low=1)
    )
    keep_recent_calls: int = attrs.field(default=2, validator=_checks.integer(low=0))
    mask_min_chars: int = attrs.field(default=200, validator=_checks.integer(low=1))
    min_result_chars: int = attrs.field(default=0, validator=_checks.integer(low=0))
    preserve_recent: int = attrs.field(default=4, validator=_checks.integer(low=1))

    async def compact(
        self, messages: Sequence[Message], target: int, ctx: CompactionContext
    ) -> CompactionProposal:
        """Apply the layers in order until the conversation fits `target`.

        Args:
            messages: The conversation.
            target: The size to reach, in the counter's tokens.
            ctx: The pass's context; `ctx.counter` measures.

        Returns:
            The shrunk conversation (however far the layers got), or the
            input unchanged when no layer could change anything.

        Each replacement it makes names what it covers (a recall note).
        """
        return await with_recall_marks(self._compact, messages, target, ctx)

    async def _compact(
        self, messages: Sequence[Message], target: int, ctx: CompactionContext
    ) -> CompactionProposal:
        """The pass itself, on messages without their recall notes."""
        counter = ctx.counter
        current = tuple(messages)
        by_count = ctx.reason in _ALWAYS_TRUNCATE
        pinned = ctx.pinned
        # Whether `current` is known not to fit (or never needs to): a layer
        # that changed nothing then has nothing to put back or count again.
        over = by_count
        for layer in (self._cap, self._mask, microcompact):
            changed = layer(current)
            if over and same_messages(changed, current):
                continue
            # Not `else`: with ids repeated, putting the pins back may move
            # messages even where the layer changed none.
            current = keep_pinned(current, changed, pinned)
            if not by_count:
                if counter.count(current) <= target:
                    return _proposal(messages, current, ctx)
                over = True
        truncator = TruncatingCompactor(
            preserve_recent=self.preserve_recent, compact_newest_exchange=True
        )
        # `current` carries no notes; this pass marks once, at its end.
        cut = await truncator._compact(current, target, ctx)
        size = None
        if not same_messages(cut.messages, current):
            current, size = tuple(cut.messages), cut.tokens_after
        if (counter.count(current) if size is None else size) > target:
            current = self._squeeze(current, target, counter, pinned)
        return _proposal(messages, keep_pinned(messages, current, pinned), ctx)

    def _cap(self, messages: Sequence[Message]) -> tuple[Message, ...]:
        cap = self.max_tool_result_chars
        if max(map(len, result_texts(messages)), default=0) <= cap:
            return tuple(messages)  # nothing to cut
        return map_results(messages, lambda p: _cut_part(p, cap))

    def _mask(self, messages: Sequence[Message]) -> tuple[Message, ...]:
        keep = self.keep_recent_calls
        end = len(messages)
        if keep:  # before the `keep`-th latest message that calls tools, or none
            end, found = 0, 0
            assistant = Role.ASSISTANT
            for i in range(len(messages) - 1, -1, -1):
                m = messages[i]
                if m.role is assistant and m.tool_calls:
                    found += 1
                    if found == keep:
                        end = i
                        break
        return digest_before(messages, end, self.mask_min_chars)

    def _squeeze(
        self,
        messages: tuple[Message, ...],
        target: int,
        counter: TokenCounter,
        pinned: frozenset[str],
    ) -> tuple[Message, ...]:
        """Layers 5 and 6: cut the results to fit; failing that, digest the newest.

        Layer 6 digests the results the earlier layers kept whole (those of
        the newest replies, which the truncation keeps), oldest first, as few
        as make the conversation fit after layer 5; the newest result is the
        last to go. Every call keeps its result: only contents change.
        """
        fitted = self._fit(messages, target, counter, pinned)
        size = counter.count(fitted)
        if size <= target:
            return fitted
        ends = [i + 1 for i, m in enumerate(messages) if m.role is Role.TOOL]

        def at(k: int) -> tuple[Message, ...]:
            """The results of the first `k` tool messages digested, then layer 5."""
            digested = _shorter(messages, digest_before(messages, ends[k - 1], 0))
            return self._fit(
                keep_pinned(messages, digested, pinned), target, counter, pinned
            )

        if not ends:
            return fitted
        high = len(ends)
        best = at(high)
        smallest = counter.count(best)
        if smallest > target:  # as small as the layers go
            return best if smallest < size else fitted
        low = 0  # at(low) does not fit; at(high) does
        while high - low > 1:
            middle = (low + high) // 2
            candidate = at(middle)
            if counter.count(candidate) <= target:
                high, best = middle, candidate
            else:
                low = middle
        return best

    def _fit(
        self,
        messages: tuple[Message, ...],
        target: int,
        counter: TokenCounter,
        pinned: frozenset[str],
    ) -> tuple[Message, ...]:
        """Cut every tool result but the pinned ones to the size that fits."""
        sizes = [
            len(p.content)
            for m in messages
            if m.role is Role.TOOL
            for p in m.parts
            if isinstance(p, ToolResultPart)
        ]
        low, high = self.min_result_chars, max(sizes, default=0)
        if high <= low:
            return messages

        def at(keep: int) -> tuple[Message, ...]:
            cut = map_results(messages, lambda p: _cut_part(p, keep))
            return keep_pinned(messages, cut, pinned)

        if counter.count(at(low)) > target:
            return at(low)  # as small as this layer goes
        while high - low > 1:  # count(at(low)) fits; find the largest that does
            middle = (low + high) // 2
            if counter.count(at(middle)) <= target:
                low = middle
            else:
                high = middle
        return at(low)


def _shorter(
    original: tuple[Message, ...], digested: tuple[Message, ...]
) -> tuple[Message, ...]:
    """Return `digested` with the results its digests made no shorter put back.

    Shorter in UTF-8 bytes, as for a cut: those are what a token costs.
    """
    out = list(digested)
    for at, (was, now) in enumerate(zip(original, digested, strict=True)):
        if was is now:
            continue
        parts = tuple(
            old if _bytes(new.content) >= _bytes(old.content) else new  # type: ignore[union-attr]  # a tool message holds only results
            for old, new in zip(was.parts, now.parts, strict=True)
        )
        if all(map(operator.is_, parts, was.parts)):
            out[at] = was
        elif any(map(operator.is_not, parts, now.parts)):
            out[at] = attrs.evolve(now, parts=parts)
    return tuple(out)


def _cut_part(part: ToolResultPart, keep: int) -> ToolResultPart:
    content = cut_result(part.content, keep)
    return part if content is part.content else attrs.evolve(part, content=content)


def _proposal(
    original: Sequence[Message], current: tuple[Message, ...], ctx: CompactionContext
) -> CompactionProposal:
    if same_messages(current, original):
        return CompactionProposal.unchanged(original, ctx.tokens_before)
    return CompactionProposal.compacted(
        current, ctx.tokens_before, ctx.counter.count(current)
    )
