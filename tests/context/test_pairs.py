from __future__ import annotations

import json

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from turnfsm.context import (
    CompactionRequest,
    ContextManager,
    PartRef,
    ToolPair,
    _pairs,
    adjust_split,
    keep_parts,
    pair_tool_traffic,
    sanitize,
)
from turnfsm.context._pairs import scans_shared
from turnfsm.core import CompactionResult, CompactReason
from turnfsm.messages import Message, ToolCallPart, ToolResultPart


def asst(*calls: str, text: str = "") -> Message:
    tool_calls = [ToolCallPart(id=c, name="tool") for c in calls]
    return Message.assistant(text, tool_calls=tool_calls)


def results(*call_ids: str) -> Message:
    parts = [ToolResultPart(call_id=c, content="ok") for c in call_ids]
    return Message(role="tool", parts=parts)


def test_pairs_lone_calls_and_lone_results() -> None:
    messages = [
        Message.user("go"),
        asst("a", "b", text="two calls"),  # parts: text, a, b
        results("b", "ghost"),
        results("a"),
        asst("p"),
    ]

    traffic = pair_tool_traffic(messages)

    assert traffic.pairs == (ToolPair(1, 2, 2, 0), ToolPair(1, 1, 3, 0))
    assert traffic.pairs[0] == (1, 2, 2, 0)
    assert traffic.lone_calls == (PartRef(4, 0),)
    assert traffic.lone_results == (PartRef(2, 1),)


def test_result_claims_the_most_recent_unconsumed_call() -> None:
    messages = [asst("t"), asst("t"), results("t"), results("t"), results("t")]

    traffic = pair_tool_traffic(messages)

    assert traffic.pairs == ((1, 0, 2, 0), (0, 0, 3, 0))
    assert traffic.lone_results == ((4, 0),)
    assert traffic.lone_calls == ()


def test_result_before_its_call_is_lone() -> None:
    traffic = pair_tool_traffic([results("x"), asst("x")])

    assert traffic.pairs == ()
    assert traffic.lone_results == ((0, 0),)
    assert traffic.lone_calls == ((1, 0),)


Refs = list[tuple[int, int]]


def _reference_pairing(
    messages: list[Message],
) -> tuple[list[tuple[int, int, int, int]], Refs, Refs]:
    """The rule as written: each result claims the latest unclaimed call before it."""
    calls = [
        (i, j, p.id)
        for i, m in enumerate(messages)
        for j, p in enumerate(m.parts)
        if isinstance(p, ToolCallPart)
    ]
    claimed: set[tuple[int, int]] = set()
    pairs: list[tuple[int, int, int, int]] = []
    lone_results: Refs = []
    for i, m in enumerate(messages):
        for j, p in enumerate(m.parts):
            if not isinstance(p, ToolResultPart):
                continue
            open_ = [
                (ci, cj)
                for ci, cj, cid in calls
                if cid == p.call_id and ci < i and (ci, cj) not in claimed
            ]
            if open_:
                claimed.add(open_[-1])
                pairs.append((*open_[-1], i, j))
            else:
                lone_results.append((i, j))
    lone_calls = [(i, j) for i, j, _ in calls if (i, j) not in claimed]
    return pairs, lone_calls, lone_results


_IDS = st.sampled_from("abc")  # few ids: calls reuse them often
_MESSAGE = st.one_of(
    st.lists(_IDS, max_size=3).map(lambda ids: asst(*ids, text="t")),
    st.lists(_IDS, min_size=1, max_size=3).map(lambda ids: results(*ids)),
    st.just(Message.user("u")),
)


@given(st.lists(_MESSAGE, max_size=14))
def test_pairing_is_the_rule_as_written_whatever_ids_repeat(
    messages: list[Message],
) -> None:
    traffic = pair_tool_traffic(messages)

    pairs, lone_calls, lone_results = _reference_pairing(messages)
    assert traffic.pairs == tuple(pairs)
    assert traffic.lone_calls == tuple(lone_calls)
    assert traffic.lone_results == tuple(lone_results)


def test_crosses() -> None:
    traffic = pair_tool_traffic([Message.user("u"), asst("a"), results("a")])

    assert [traffic.crosses(i) for i in range(4)] == [False, False, True, False]
    assert not traffic.crosses(2, keep_head=2)


@pytest.mark.parametrize(
    ("split", "keep_head", "expected"),
    [
        (5, 0, 5),  # nothing straddles 5
        (4, 0, 2),  # result at 4 answers the call at 2
        (3, 0, 2),
        (2, 0, 2),
        (1, 0, 0),  # the result at 1 answers the call at 0
        (1, 1, 1),  # ... unless the caller keeps message 0 anyway
        (7, 0, 5),  # clamped to the length
        (-3, 0, 0),
    ],
)
def test_adjust_split(split: int, keep_head: int, expected: int) -> None:
    messages = [asst("x"), results("x"), asst("y"), Message.user("u"), results("y")]

    assert adjust_split(messages, split, keep_head=keep_head) == expected


def test_adjust_split_runs_to_a_fixpoint() -> None:
    messages = [
        Message.user("u"),
        asst("a"),  # 1
        asst("b"),  # 2
        results("a"),  # 3
        results("b"),  # 4
    ]

    assert adjust_split(messages, 4) == 1


def test_keep_parts() -> None:
    message = results("a", "b", "c")

    assert keep_parts(message, [0, 1, 2]) is message
    assert keep_parts(message, []) is None
    copy = keep_parts(message, [2, 0, 2])
    assert copy is not None
    assert copy.parts == (message.parts[0], message.parts[2])
    assert copy.id == f"{message.id}#0-2"
    assert keep_parts(message, [0, 2]) == copy  # deterministic


def test_keep_parts_leaves_an_empty_message_alone() -> None:
    empty = Message.assistant("")  # a model's empty reply: no parts

    assert keep_parts(empty, []) is empty


THOUGHTS = "turnfsm.sent.anthropic.thinking"


@st.composite
def thinking_replies(draw: st.DrawFn) -> tuple[Message, list[int]]:
    """A reply of calls with thinking placed among them, and parts to keep."""
    n = draw(st.integers(1, 6))
    places = sorted(draw(st.lists(st.integers(0, n), max_size=6)))
    thoughts = [
        {"at": at, "block": {"type": "thinking", "thinking": str(i)}}
        for i, at in enumerate(places)
    ]
    message = Message(
        role="assistant",
        parts=[ToolCallPart(id=f"c{i}", name="tool") for i in range(n)],
        metadata={THOUGHTS: json.dumps(thoughts), "other": '[{"at": 9}]'},
    )
    kept = draw(st.lists(st.integers(0, n - 1), min_size=1, unique=True))
    return message, kept


@given(thinking_replies())
def test_keep_parts_keeps_thinking_before_the_next_part_it_kept(
    case: tuple[Message, list[int]],
) -> None:
    message, kept = case
    filtered = keep_parts(message, kept)
    assert filtered is not None
    before = json.loads(message.metadata[THOUGHTS])
    after = json.loads(filtered.metadata[THOUGHTS])
    n, kept = len(message.parts), sorted(kept)
    # A thought stays when a kept part followed it, or it was past the end.
    expected = [t for t in before if t["at"] <= kept[-1] or t["at"] == n]
    assert [t["block"] for t in after] == [t["block"] for t in expected]
    for old, new in zip(expected, after, strict=True):
        if new["at"] < len(filtered.parts):  # before the first kept part after it
            assert (
                filtered.parts[new["at"]]
                == message.parts[min(i for i in kept if i >= old["at"])]
            )
        else:
            assert old["at"] == n
    assert [t["at"] for t in after] == sorted(t["at"] for t in after)
    assert filtered.metadata["other"] == '[{"at": 9}]'  # not a SENT value


def test_sanitize_drops_lone_results_and_emptied_messages() -> None:
    messages = [
        Message.user("u"),
        results("ghost"),
        asst("a", "p"),
        results("a", "ghost2"),
    ]

    out = sanitize(messages)

    assert out[:2] == (messages[0], messages[2])
    assert out[2].parts == (messages[3].parts[0],)
    assert len(out) == 3


def test_sanitize_without_lone_results_is_identity() -> None:
    messages = [Message.user("u"), asst("a"), results("a"), asst("pending")]

    out = sanitize(messages)

    assert all(a is b for a, b in zip(out, messages, strict=True))


def test_sanitize_never_returns_empty() -> None:
    messages = [results("x"), results("y")]

    assert sanitize(messages) == tuple(messages)


@given(st.lists(st.lists(_MESSAGE, max_size=8), max_size=8), st.data())
def test_shared_scans_give_what_a_fresh_scan_gives(
    conversations: list[list[Message]], data: st.DataObject
) -> None:
    # Conversations repeat, as copies, slices and the very same lists, more
    # often than the block keeps them: every answer is still the fresh one.
    asked = [*conversations, *conversations[::-1]]
    asked += [c[: data.draw(st.integers(0, len(c)))] for c in conversations]
    with scans_shared():
        for messages in asked:
            assert pair_tool_traffic(messages) == pair_tool_traffic(list(messages))
            fresh = [Message.from_dict(m.to_dict()) for m in messages]
            assert pair_tool_traffic(fresh) == pair_tool_traffic(messages)


def test_a_pass_scans_its_conversation_once(monkeypatch: pytest.MonkeyPatch) -> None:
    scanned: list[int] = []
    scan = _pairs._scan

    def spy(messages: list[Message]) -> object:
        scanned.append(len(messages))
        return scan(messages)

    monkeypatch.setattr(_pairs, "_scan", spy)
    messages = [Message.system("be brief"), Message.user("go")]
    for n in range(40):
        messages += [asst(f"c{n}", text="x" * 200), results(f"c{n}")]
    messages.append(Message.user("and now?"))
    request = CompactionRequest(
        messages=messages, reason=CompactReason.EMERGENCY, turn=1
    )

    event = anyio.run(ContextManager(context_window=4_000).compact, request)

    assert isinstance(event, CompactionResult)
    assert scanned.count(len(messages)) == 1  # pins, cut and check share it
    scanned.clear()
    pair_tool_traffic(messages)
    pair_tool_traffic(messages)
    assert scanned == [len(messages)] * 2  # outside a pass nothing is kept
