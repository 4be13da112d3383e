"""Pair safety: never orphan one half of a tool call/result pair.

Providers reject a conversation that holds a tool result without its call
(and most reject a call whose result is missing once the turn moved on), so a
compactor must cut a conversation only where no pair straddles the cut.

Pairing works like a bracket matcher, per occurrence, because call ids may be
reused: a forward scan keeps, per call id, a stack of unconsumed calls, and
each tool result claims the most recent unconsumed call with its id that
precedes it. Leftovers are classified:

- a *lone call* has no result yet; it may still be in flight, so it is kept
  wherever the conversation is kept;
- a *lone result* answers no call; it is a protocol violation and is dropped.

Everything here is pure and reusable by any compactor.
"""

from __future__ import annotations

import json
from bisect import bisect_left
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from itertools import repeat
from operator import is_
from typing import Final, NamedTuple, final

import attrs

from turnfsm import _checks
from turnfsm.messages import SENT, Message, Role, ToolCallPart

__all__ = [
    "PartRef",
    "ToolPair",
    "ToolTraffic",
    "adjust_split",
    "keep_parts",
    "pair_tool_traffic",
    "pairing_problem",
    "sanitize",
    "scans_shared",
]


@final
class PartRef(NamedTuple):
    """Where a part sits: `messages[message].parts[part]`."""

    message: int
    """Index of the message in the conversation."""
    part: int
    """Index of the part in that message."""


@final
class ToolPair(NamedTuple):
    """A tool call and the result that claimed it, by position."""

    call_message: int
    """Index of the message holding the call."""
    call_part: int
    """Index of the call among that message's parts."""
    result_message: int
    """Index of the message holding the result."""
    result_part: int
    """Index of the result among that message's parts."""


@final
@attrs.frozen(kw_only=True)
class ToolTraffic:
    """The tool calls and results of a conversation, paired per occurrence.

    Attributes:
        pairs: Each result with the call it claimed, in result order.
        lone_calls: Calls no result claimed (yet), in conversation order.
        lone_results: Results that answer no preceding call, in order.
    """

    pairs: tuple[ToolPair, ...]
    lone_calls: tuple[PartRef, ...]
    lone_results: tuple[PartRef, ...]

    def crosses(self, split: int, *, keep_head: int = 0) -> bool:
        """Return whether cutting before `messages[split]` splits a pair.

        Args:
            split: The first message of the kept tail.
            keep_head: Calls in the first `keep_head` messages are kept
                whatever the cut, so their pairs never count as split.
        """
        return any(
            keep_head <= p.call_message < split <= p.result_message for p in self.pairs
        )


_Scans = list[tuple[tuple[Message, ...], ToolTraffic]]

_SCANS: Final[ContextVar[_Scans | None]] = ContextVar("turnfsm_scans", default=None)
"""The conversations scanned in the current `scans_shared` block, newest last."""

_SCANS_KEPT: Final = 4


@contextmanager
def scans_shared() -> Iterator[None]:
    """Within the block, `pair_tool_traffic` scans one conversation once.

    A compaction pass asks for the pairs of the conversation it was handed
    several times (its pins, its strategy's cut, the check of its result).
    Messages are immutable, so a conversation of the very same message
    objects has the same pairs: the block remembers the last few scans and
    hands them out again. Nothing outlives the block.
    """
    token = _SCANS.set([])
    try:
        yield
    finally:
        _SCANS.reset(token)


def pair_tool_traffic(messages: Sequence[Message]) -> ToolTraffic:
    """Pair every tool result with its call, per occurrence.

    Args:
        messages: The conversation.

    Returns:
        The pairs (in result order), lone calls and lone results, by position.
    """
    scans = _SCANS.get()
    if scans is None:
        return _scan(messages)
    n = len(messages)
    for seen, known in scans:
        if len(seen) == n and all(map(is_, seen, messages)):
            return known
    traffic = _scan(messages)
    scans.append((tuple(messages), traffic))
    if len(scans) > _SCANS_KEPT:
        del scans[0]
    return traffic


def _scan(messages: Sequence[Message]) -> ToolTraffic:
    """`pair_tool_traffic` itself: one forward scan of `messages`."""
    # The hot loop of every pass: no object made per message or per call,
    # one tuple per pair (its `ToolPair`), named ones at the end.
    # A `Message` holds tool calls only in assistant messages and tool results
    # only (and alone) in tool messages, so the role says which parts to scan.
    # Per call id, `open_at` and `open_part` hold where the most recent
    # unconsumed call stands, and `older` (only for a reused id) the stack
    # of the ones before it.
    open_at: dict[str, int] = {}
    open_part: dict[str, int] = {}
    older: dict[str, list[tuple[int, int]]] = {}
    pairs: list[ToolPair] = []
    lone_results: list[tuple[int, int]] = []
    tool, assistant, call_type = Role.TOOL, Role.ASSISTANT, ToolCallPart
    claim, claim_part, add_pair = open_at.pop, open_part.pop, pairs.append
    new = tuple.__new__  # NamedTuple(*t) without a Python frame per item
    i = -1  # counted by hand: no enumerate (and its tuples) per message
    for message in messages:
        i += 1
        role = message.role
        if role is tool:
            j = -1
            for result in message.parts:
                j += 1
                call_id = result.call_id  # type: ignore[union-attr]  # only results here
                at = claim(call_id, None)
                if at is None:
                    lone_results.append((i, j))
                else:
                    add_pair(new(ToolPair, (at, claim_part(call_id), i, j)))
                    if older:
                        stack = older.get(call_id)
                        if stack:
                            open_at[call_id], open_part[call_id] = stack.pop()
        elif role is assistant:
            j = -1
            for part in message.parts:
                j += 1
                if type(part) is call_type:
                    call_id = part.id
                    if call_id in open_at:
                        older.setdefault(call_id, []).append(
                            (open_at[call_id], open_part[call_id])
                        )
                    open_at[call_id] = i
                    open_part[call_id] = j
    lone_calls = [(at, open_part[call_id]) for call_id, at in open_at.items()]
    for stack in older.values():
        lone_calls += stack
    lone_calls.sort()
    return ToolTraffic(
        pairs=tuple(pairs),
        lone_calls=tuple(map(new, repeat(PartRef), lone_calls)),
        lone_results=tuple(map(new, repeat(PartRef), lone_results)),
    )


def adjust_split(
    messages: Sequence[Message],
    split: int,
    *,
    keep_head: int = 0,
    traffic: ToolTraffic | None = None,
) -> int:
    """Move a cut earlier until no tool pair straddles it.

    The cut keeps `messages[split:]`. While a result at or after the cut is
    paired with a call before it, the cut moves to that call's message; the
    loop runs to a fixpoint, since the new cut may strand earlier pairs. It
    never moves the cut later, so it always ends.

    Args:
        messages: The conversation.
        split: The proposed cut, clamped into ``0..len(messages)``.
        keep_head: The first `keep_head` messages are kept whatever the cut
            (e.g. 1 for a compactor that always keeps the first message), so
            calls there never move it.
        traffic: `pair_tool_traffic(messages)`, if already computed (its
            pairs are in result order).

    Returns:
        The latest cut at or before `split` that splits no pair.
    """
    n = len(messages)
    split = max(0, min(split, n))
    if traffic is None:
        traffic = pair_tool_traffic(messages)
    # Walk the pairs from the last result back, only as far as the cut goes:
    # `earliest` is the earliest movable call answered at or after the cut.
    pairs = traffic.pairs
    k = len(pairs) - 1
    earliest = n
    while True:
        while k >= 0 and pairs[k].result_message >= split:
            call = pairs[k].call_message
            if keep_head <= call < earliest:
                earliest = call
            k -= 1
        if earliest >= split:
            return split
        split = earliest


def keep_parts(message: Message, indices: Iterable[int]) -> Message | None:
    """Return `message` with only the parts at `indices`, or None if emptied.

    A message that keeps all its parts is returned as is. A filtered copy gets
    a new id derived from the original and the kept indices, so it never
    passes for the original (ids key token caches and the audit trail) and
    the same filtering always yields the same id. Blocks its metadata places
    among the parts (a reply's thinking, which Anthropic wants back before
    the tool calls it preceded) move with the parts: each stays before the
    next kept part, and one that only dropped parts followed is dropped.

    Args:
        message: The message to filter.
        indices: Indices of the parts to keep; order and repeats are ignored.

    Returns:
        The message, a filtered copy, or None when filtering removed every
        part of a message that had some.
    """
    kept = sorted(set(indices))
    if len(kept) == len(message.parts):
        return message
    if not kept:
        return None
    suffix = "-".join(str(i) for i in kept)
    return attrs.evolve(
        message,
        parts=tuple(message.parts[i] for i in kept),
        id=f"{message.id}#{suffix}",
        metadata=_placed_with(message.metadata, kept, len(message.parts)),
    )


def _placed_with(
    metadata: Mapping[str, str], kept: list[int], parts: int
) -> Mapping[str, str]:
    """`metadata` with the blocks its `SENT` values place among the parts moved.

    Such a value (a reply's thinking, kept by `AnthropicModel`) is JSON text
    of a list of ``{"at": n, ...}``, ``n`` the number of the message's
    `parts` before the block. Once only the parts at `kept` are left, ``n``
    is the number of those before it: each block stays in its order, before
    the first kept part at or after its place. A block that only dropped
    parts followed goes with them (it led to them); one past the last part
    stays there. Any other value is left as it is.
    """
    moved: dict[str, str] = {}
    for key, value in metadata.items():
        if not key.startswith(SENT) or not isinstance(value, str):
            continue
        try:
            items = json.loads(value)
        except ValueError:
            continue
        if not isinstance(items, list) or not all(
            isinstance(item, dict) and _checks.is_int(item.get("at")) for item in items
        ):
            continue
        placed = [
            dict(item, at=bisect_left(kept, item["at"]))
            for item in items
            if item["at"] <= kept[-1] or item["at"] >= parts
        ]
        if placed != items:
            moved[key] = json.dumps(placed, ensure_ascii=False)
    return {**metadata, **moved} if moved else metadata


def sanitize(
    messages: Sequence[Message], *, traffic: ToolTraffic | None = None
) -> tuple[Message, ...]:
    """Drop lone tool results and the messages that filtering empties.

    Lone calls are kept: their results may still be in flight. When nothing
    would remain (a conversation made only of lone results), the messages are
    returned as received, since a compactor never returns an empty list.

    Args:
        messages: The conversation.
        traffic: `pair_tool_traffic(messages)`, if already computed.

    Returns:
        The sanitised conversation (the same messages when nothing was lone).
    """
    if traffic is None:
        traffic = pair_tool_traffic(messages)
    if not traffic.lone_results:
        return tuple(messages)
    lone = set(traffic.lone_results)
    out: list[Message] = []
    for i, message in enumerate(messages):
        keep = [j for j in range(len(message.parts)) if (i, j) not in lone]
        kept = keep_parts(message, keep)
        if kept is not None:
            out.append(kept)
    return tuple(out) if out else tuple(messages)


def result_problem(result: Sequence[Message], source: Sequence[Message]) -> str | None:
    """Return why `result` cannot replace `source`, or None when it can.

    `result` must be a valid conversation by `turnfsm.messages.check_history`
    rules: every tool result answers an earlier open call, and every call is
    answered before the next non-tool message and before the end. Orphans
    that `source` already had may survive (at most as many lone calls and
    lone results as it had), but a pair with a message between its halves is
    always rejected. No two messages of `result` may share an id, unless
    `source` already repeated it as often. The messages `result` keeps (by
    id, changed or not) stay in `source`'s order. No message of `result` is
    empty (no parts) unless `source` had it so. The context manager checks
    every strategy's result so, and the driver a pass an effect of yours
    makes.
    """
    return (
        pairing_problem(result, source)
        or _id_problem(result, source)
        or _order_problem(result, source)
        or _empty_problem(result, source)
    )


def _empty_problem(result: Sequence[Message], source: Sequence[Message]) -> str | None:
    """Name a message of `result` with no parts that `source` did not hold, or None."""
    for message in result:
        if not message.parts and not any(message == m for m in source):
            return (
                f"the compactor's result holds message {message.id!r} "
                f"({message.role.value}) with nothing in it; a provider refuses "
                "an empty message, so a pass adds none"
            )
    return None


def pairing_problem(result: Sequence[Message], source: Sequence[Message]) -> str | None:
    """Return how `result` breaks a tool call/result pair, or None.

    The rule a `ContextManager` holds every pass's result to: every tool
    result answers an earlier call, and every call is answered by the tool
    messages right after it, before the next other message. No message may
    come between a call and its result, even where `source` (the
    conversation the pass was handed) had one there; a lone call or a lone
    result may stay only where `source` had as many.

    Args:
        result: The pass's result.
        source: The conversation the pass was handed.

    Returns:
        What is broken, naming the call id and the messages, or None.
    """
    # The fast path: check_history's counting scan, no positions kept.
    open_counts: dict[str, int] = {}
    pending = 0
    tool, assistant, call_type = Role.TOOL, Role.ASSISTANT, ToolCallPart
    for message in result:
        role = message.role
        if role is tool:
            for part in message.parts:
                call_id = part.call_id  # type: ignore[union-attr]  # only results here
                count = open_counts.get(call_id)
                if not count:
                    return _locate(result, source)
                open_counts[call_id] = count - 1
            pending -= len(message.parts)
            continue
        if pending:
            return _locate(result, source)
        if role is assistant:
            for part in message.parts:
                if type(part) is call_type:
                    open_counts[part.id] = open_counts.get(part.id, 0) + 1
                    pending += 1
    return _locate(result, source) if pending else None


def _locate(result: Sequence[Message], source: Sequence[Message]) -> str | None:
    """Name the first broken tool call of `result` (the slow path), or None."""
    traffic = pair_tool_traffic(result)
    boundary = -1  # the latest non-tool message at or before each position
    boundaries: list[int] = []
    for k, message in enumerate(result):
        if message.role is not Role.TOOL:
            boundary = k
        boundaries.append(boundary)
    for pair in traffic.pairs:
        between = boundaries[pair.result_message]
        if between > pair.call_message:
            return _broken(
                result,
                PartRef(pair.call_message, pair.call_part),
                f"message {result[between].id!r} ({result[between].role.value}) "
                f"comes between the call (in message "
                f"{result[pair.call_message].id!r}) and its result (in message "
                f"{result[pair.result_message].id!r})",
            )
    if not (traffic.lone_results or traffic.lone_calls):
        return None
    before = pair_tool_traffic(source)
    if len(traffic.lone_results) > len(before.lone_results):
        ref = _new_orphan(result, traffic.lone_results, source, before.lone_results)
        where = result[ref.message].id
        return _broken(result, ref, f"the result in message {where!r} answers no call")
    if len(traffic.lone_calls) > len(before.lone_calls):
        ref = _new_orphan(result, traffic.lone_calls, source, before.lone_calls)
        where = result[ref.message].id
        return _broken(result, ref, f"the call in message {where!r} has no result")
    return None


def _tool_id(messages: Sequence[Message], ref: PartRef) -> str:
    part = messages[ref.message].parts[ref.part]
    return part.id if isinstance(part, ToolCallPart) else part.call_id  # type: ignore[union-attr]  # a call or a result


def _broken(result: Sequence[Message], ref: PartRef, why: str) -> str:
    return f"the compactor's result breaks tool call {_tool_id(result, ref)!r}: {why}"


def _new_orphan(
    result: Sequence[Message],
    lone: Sequence[PartRef],
    source: Sequence[Message],
    known: Sequence[PartRef],
) -> PartRef:
    """Return the first lone part of `result` whose id `source` had fewer of."""
    allowed = Counter(_tool_id(source, ref) for ref in known)
    for ref in lone:
        tool_id = _tool_id(result, ref)
        if not allowed[tool_id]:
            return ref
        allowed[tool_id] -= 1
    return lone[0]  # unreachable when `lone` outnumbers `known`


def _id_problem(result: Sequence[Message], source: Sequence[Message]) -> str | None:
    if len({message.id for message in result}) == len(result):
        return None
    allowed = Counter(message.id for message in source)
    seen: Counter[str] = Counter()
    for message in result:
        seen[message.id] += 1
        if seen[message.id] > max(1, allowed[message.id]):
            return f"the compactor's result repeats message id {message.id!r}"
    return None


def _order_problem(result: Sequence[Message], source: Sequence[Message]) -> str | None:
    """Name a kept message that `result` moved after one said later, or None."""
    # The place in `source` of each id `result` keeps; an id `source`
    # repeats has no one place, and is not checked.
    wanted = {message.id for message in result}
    place: dict[str, int] = {}
    repeated: set[str] = set()
    for i in [i for i, message in enumerate(source) if message.id in wanted]:
        key = source[i].id
        if key in place:
            repeated.add(key)
        else:
            place[key] = i
    for key in repeated:
        del place[key]
    last, last_id = -1, ""
    for message in result:
        at = place.get(message.id)
        if at is None:  # a message of the pass's own (a summary)
            continue
        if at < last:
            return (
                f"the compactor's result moves message {message.id!r} after "
                f"message {last_id!r}, which was said later; a pass keeps the "
                "messages it keeps in their order"
            )
        last, last_id = at, message.id
    return None
