from __future__ import annotations

import pytest

from turnfsm.context import Split, TokenSplitter
from turnfsm.errors import ConfigError
from turnfsm.messages import Message, ToolCallPart


def turns(n: int) -> list[Message]:
    """`n` messages alternating user (even) and assistant (odd)."""
    return [
        Message.user(f"q{i}") if i % 2 == 0 else Message.assistant(f"a{i}")
        for i in range(n)
    ]


def call(call_id: str) -> Message:
    return Message.assistant("", tool_calls=[ToolCallPart(id=call_id, name="t")])


def result(call_id: str) -> Message:
    return Message.tool_result(call_id, "ok")


@pytest.mark.parametrize("n", [0, 1, 6])
def test_short_conversation_keeps_everything(n: int) -> None:
    messages = turns(n)

    split = TokenSplitter().split(messages)

    assert split == Split(index=0, to_compact=(), preserved=messages)


def test_splits_at_the_latest_turn_boundary_before_the_recent_ones() -> None:
    messages = turns(12)  # 7 is assistant, 8 is user

    split = TokenSplitter().split(messages)

    assert split.index == 8
    assert split.to_compact == tuple(messages[:8])
    assert split.preserved == tuple(messages[8:])


def test_odd_length_walks_back_to_a_user_message() -> None:
    messages = turns(11)  # 11 - 4 = 7 is an assistant message: walk back to 6

    assert TokenSplitter().split(messages).index == 6


def test_skips_boundaries_a_tool_pair_straddles() -> None:
    messages = turns(12)
    messages[5] = call("c")  # assistant at 5, user at 6: candidate boundary 6
    messages[9] = result("c")  # answered after 8, so 8 and 6 both straddle

    assert TokenSplitter().split(messages).index == 4


def test_pair_before_the_boundary_is_fine() -> None:
    messages = turns(12)
    messages[4] = call("c")
    messages[5] = result("c")
    messages[6] = Message.assistant("done")
    messages[7] = Message.user("next")  # 7 is user; 6 is assistant: boundary 7

    assert TokenSplitter().split(messages).index == 7


def test_call_in_message_zero_counts_too() -> None:
    messages = [call("boot"), *turns(12)[1:]]
    messages[10] = result("boot")

    assert TokenSplitter().split(messages).index == 0


def test_no_boundary_keeps_everything() -> None:
    messages = [Message.user(f"u{i}") for i in range(10)]

    split = TokenSplitter().split(messages)

    assert (split.index, split.to_compact, split.preserved) == (0, (), tuple(messages))


def test_knobs() -> None:
    messages = turns(12)

    assert TokenSplitter(preserve_recent=2).split(messages).index == 10
    assert TokenSplitter(min_messages=12).split(messages).index == 0
    assert TokenSplitter(preserve_recent=12, min_messages=2).split(messages).index == 0


@pytest.mark.parametrize(
    ("field", "kwargs"),
    [
        ("preserve_recent", {"preserve_recent": 0}),
        ("min_messages", {"min_messages": 1}),
        ("min_messages", {"min_messages": False}),
    ],
    ids=["recent-0", "min-1", "min-bool"],
)
def test_bad_knobs_raise_config_error(field: str, kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigError) as info:
        TokenSplitter(**kwargs)  # type: ignore[arg-type]  # bad on purpose

    assert info.value.field == field
