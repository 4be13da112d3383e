"""Properties of `TruncatingCompactor` over generated histories.

The pairing used to judge the compactor is written again here, by tag, so the
test does not trust the code it checks.
"""

from __future__ import annotations

from collections.abc import Sequence

import anyio
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.generators import histories, tag_of
from tests.profiles import heavy, sized
from turnfsm.context import (
    CompactionContext,
    CompactionProposal,
    TokenSplitter,
    TruncatingCompactor,
    adjust_split,
    pair_tool_traffic,
)
from turnfsm.core._lines import CompactReason
from turnfsm.messages import Message, Role, ToolCallPart, ToolResultPart
from turnfsm.tokens import HeuristicTokenCounter

COUNTER = HeuristicTokenCounter()


def reference_pairs(messages: Sequence[Message]) -> tuple[dict[str, str], set[str]]:
    """Return {result tag: call tag} and the tags of lone results."""
    open_calls: dict[str, list[str]] = {}
    pairs: dict[str, str] = {}
    lone: set[str] = set()
    for message in messages:
        for part in message.parts:
            if isinstance(part, ToolCallPart):
                open_calls.setdefault(part.id, []).append(tag_of(part))
            elif isinstance(part, ToolResultPart):
                stack = open_calls.get(part.call_id)
                if stack:
                    pairs[tag_of(part)] = stack.pop()
                else:
                    lone.add(tag_of(part))
    return pairs, lone


def tags(messages: Sequence[Message]) -> list[str]:
    return [tag_of(part) for message in messages for part in message.parts]


def is_subsequence(short: list[str], long: list[str]) -> bool:
    rest = iter(long)
    return all(tag in rest for tag in short)


def compact(
    messages: list[Message], compactor: TruncatingCompactor
) -> CompactionProposal:
    ctx = CompactionContext(
        tokens_before=COUNTER.count(messages),
        reason=CompactReason.EMERGENCY,
        context_window=0,
        turn=0,
        counter=COUNTER,
    )

    async def go() -> CompactionProposal:
        return await compactor.compact(messages, 0, ctx)

    return anyio.run(go)


def truncate(
    messages: list[Message], compactor: TruncatingCompactor
) -> CompactionProposal:
    # The compactor never awaits: drive its coroutine by hand so that 10,000
    # examples do not each start an event loop.
    ctx = CompactionContext(
        tokens_before=COUNTER.count(messages),
        reason=CompactReason.EMERGENCY,
        context_window=0,
        turn=0,
        counter=COUNTER,
    )
    coro = compactor.compact(messages, 0, ctx)
    try:
        coro.send(None)
    except StopIteration as done:
        outcome: CompactionProposal = done.value
        return outcome
    coro.close()
    raise AssertionError("TruncatingCompactor awaited something")


compactors = st.builds(
    TruncatingCompactor,
    preserve_recent=st.integers(1, 6),
    min_messages=st.integers(2, 8),
)


@heavy(10_000)
@given(messages=histories(), compactor=compactors)
def test_truncation_never_splits_a_pair(
    messages: list[Message], compactor: TruncatingCompactor
) -> None:
    outcome = truncate(messages, compactor)
    out = outcome.messages
    pairs, lone = reference_pairs(messages)
    kept = set(tags(out))

    # never an empty list, never an empty message, never a longer one
    assert out
    assert all(m.parts for m in out)
    assert len(out) <= len(messages)
    # only lone results can make the first message go
    if messages[0].role is not Role.TOOL:
        assert out[0] is messages[0]
    # nothing is invented and the order is kept
    assert is_subsequence(tags(out), tags(messages))
    # per occurrence, a pair survives whole or not at all
    for result, call in pairs.items():
        assert (result in kept) == (call in kept), (result, call)
    # lone results go, unless nothing else was there
    if kept & lone:
        assert out == tuple(messages)
        assert all(m.role is Role.TOOL for m in messages)
        assert not pairs
    # the output pairs up exactly as the input did
    out_pairs, out_lone = reference_pairs(out)
    assert out_pairs == {r: c for r, c in pairs.items() if r in kept}
    assert out_lone == kept & lone
    assert outcome.tokens_after == COUNTER.count(out)
    assert outcome.tokens_before == COUNTER.count(messages)


@settings(max_examples=sized(300), deadline=None)
@given(messages=histories(), compactor=compactors)
def test_compact_through_an_event_loop_agrees(
    messages: list[Message], compactor: TruncatingCompactor
) -> None:
    assert compact(messages, compactor) == truncate(messages, compactor)


@heavy(2_000)
@given(messages=histories(), split=st.integers(-2, 26), keep_head=st.integers(0, 2))
def test_adjusted_split_is_the_latest_safe_cut(
    messages: list[Message], split: int, keep_head: int
) -> None:
    traffic = pair_tool_traffic(messages)

    cut = adjust_split(messages, split, keep_head=keep_head, traffic=traffic)

    clamped = max(0, min(split, len(messages)))
    assert 0 <= cut <= clamped
    assert not traffic.crosses(cut, keep_head=keep_head)
    later = range(cut + 1, clamped + 1)
    assert all(traffic.crosses(s, keep_head=keep_head) for s in later)


@heavy(2_000)
@given(messages=histories(), recent=st.integers(1, 6), minimum=st.integers(2, 8))
def test_splitter_cuts_only_at_safe_turn_boundaries(
    messages: list[Message], recent: int, minimum: int
) -> None:
    split = TokenSplitter(preserve_recent=recent, min_messages=minimum).split(messages)

    assert split.to_compact + split.preserved == tuple(messages)
    i = split.index
    if i:
        assert len(messages) > minimum
        assert i <= len(messages) - recent
        assert messages[i - 1].role is Role.ASSISTANT
        assert messages[i].role is Role.USER
        pairs, _ = reference_pairs(messages)
        before = set(tags(messages[:i]))
        after = set(tags(messages[i:]))
        assert not any(r in after and c in before for r, c in pairs.items())
