from __future__ import annotations

from collections.abc import Sequence

import anyio
import pytest

from turnfsm.context import (
    CompactionContext,
    CompactionProposal,
    TruncatingCompactor,
)
from turnfsm.core._lines import CompactReason
from turnfsm.errors import ConfigError
from turnfsm.messages import Message, ToolCallPart, ToolResultPart
from turnfsm.tokens import HeuristicTokenCounter

COUNTER = HeuristicTokenCounter()


def user(text: str) -> Message:
    return Message.user(text, id=f"u-{text}")


def asst(text: str = "", *calls: str) -> Message:
    tool_calls = [ToolCallPart(id=c, name="tool") for c in calls]
    return Message.assistant(text, tool_calls=tool_calls, id=f"a-{text}")


def results(*call_ids: str, tag: str = "") -> Message:
    parts = [ToolResultPart(call_id=c, content=f"out {c}") for c in call_ids]
    return Message(role="tool", parts=parts, id=f"t-{'-'.join(call_ids)}{tag}")


def chat(n: int) -> list[Message]:
    """`n` text messages: the task, then alternating user and assistant."""
    out = [Message.system("task", id="sys")]
    for i in range(1, n):
        out.append(user(f"q{i}") if i % 2 else asst(f"a{i}"))
    return out


def truncate(
    messages: Sequence[Message], compactor: TruncatingCompactor | None = None
) -> CompactionProposal:
    compactor = compactor or TruncatingCompactor()
    before = COUNTER.count(messages)
    ctx = CompactionContext(
        tokens_before=before,
        reason=CompactReason.THRESHOLD_EXCEEDED,
        context_window=1_000,
        turn=3,
        counter=COUNTER,
    )

    async def go() -> CompactionProposal:
        return await compactor.compact(messages, 0, ctx)

    return anyio.run(go)


def test_seed_example_keeps_first_and_recent_four() -> None:
    messages = chat(12)

    outcome = truncate(messages)

    assert outcome.messages == (messages[0], *messages[8:])
    assert outcome.tokens_before == COUNTER.count(messages)
    assert outcome.tokens_after == COUNTER.count(outcome.messages)
    assert not outcome.is_failed


@pytest.mark.parametrize("n", [1, 2, 5, 6])
def test_short_conversation_is_unchanged(n: int) -> None:
    messages = chat(n)

    outcome = truncate(messages)

    assert outcome.messages == tuple(messages)
    assert outcome.tokens_after == outcome.tokens_before


def test_seven_messages_are_cut() -> None:
    messages = chat(7)

    assert truncate(messages).messages == (messages[0], *messages[3:])


def test_knobs_move_the_cut() -> None:
    messages = chat(12)
    compactor = TruncatingCompactor(preserve_recent=2, min_messages=11)

    assert truncate(messages, compactor).messages == (messages[0], *messages[10:])
    assert truncate(messages[:11], compactor).messages == tuple(messages[:11])


def test_preserve_recent_past_the_start_is_unchanged() -> None:
    messages = chat(8)
    compactor = TruncatingCompactor(preserve_recent=10)

    assert truncate(messages, compactor).messages == tuple(messages)


def test_target_is_ignored() -> None:
    messages = chat(12)
    ctx = CompactionContext(
        tokens_before=COUNTER.count(messages),
        reason=CompactReason.EMERGENCY,
        context_window=0,
        turn=0,
        counter=COUNTER,
    )

    async def go(target: int) -> CompactionProposal:
        return await TruncatingCompactor().compact(messages, target, ctx)

    assert anyio.run(go, 0) == anyio.run(go, 10**9)


def test_pair_at_the_cut_moves_it_earlier() -> None:
    messages = chat(12)
    messages[7] = asst("look", "c1")
    messages[8] = results("c1")

    assert truncate(messages).messages == (messages[0], *messages[7:])


def test_cut_moves_to_a_fixpoint() -> None:
    # The result at 8 pulls the cut to 6; the result at 7 then pulls it to 5.
    messages = chat(12)
    messages[5] = asst("first", "a")
    messages[6] = asst("second", "b")
    messages[7] = results("a")
    messages[8] = results("b")

    assert truncate(messages).messages == (messages[0], *messages[5:])


def test_parallel_calls_answered_in_separate_messages() -> None:
    messages = chat(12)
    messages[6] = asst("both", "a", "b")
    messages[7] = results("a")
    messages[8] = results("b")

    assert truncate(messages).messages == (messages[0], *messages[6:])


def test_parallel_results_in_one_message() -> None:
    messages = chat(12)
    messages[7] = asst("both", "a", "b")
    messages[8] = results("b", "a")

    assert truncate(messages).messages == (messages[0], *messages[7:])


def test_reused_call_ids_pair_per_occurrence() -> None:
    # Paired by id alone, the result at 8 would reach back to the call at 1
    # and nothing could be cut; per occurrence it claims the call at 7.
    messages = chat(12)
    messages[1] = asst("old", "t")
    messages[2] = results("t", tag="old")
    messages[7] = asst("new", "t")
    messages[8] = results("t", tag="new")

    assert truncate(messages).messages == (messages[0], *messages[7:])


def test_reused_id_result_claims_the_latest_unconsumed_call() -> None:
    # Calls "t" at 5 and 6; the result at 7 claims 6 (the latest), so the cut
    # stops at 6 and the call at 5 stays lone in the dropped region.
    messages = chat(11)
    messages[5] = asst("one", "t")
    messages[6] = asst("two", "t")
    messages[7] = results("t")

    assert truncate(messages).messages == (messages[0], *messages[6:])


def test_pair_reaching_back_to_message_one_leaves_nothing_to_cut() -> None:
    messages = chat(12)
    messages[1] = asst("early", "slow")
    messages[10] = results("slow")

    outcome = truncate(messages)

    assert outcome.messages == tuple(messages)
    assert outcome.tokens_after == outcome.tokens_before


def test_first_message_calls_get_their_dropped_results_back() -> None:
    messages = chat(12)
    messages[0] = asst("boot", "a", "b")
    messages[2] = results("a")
    messages[4] = results("b")

    assert truncate(messages).messages == (
        messages[0],
        messages[2],
        messages[4],
        *messages[8:],
    )


def test_first_message_call_answered_in_the_tail_does_not_move_the_cut() -> None:
    messages = chat(12)
    messages[0] = asst("boot", "late")
    messages[9] = results("late")

    assert truncate(messages).messages == (messages[0], *messages[8:])


def test_reattach_keeps_only_the_first_message_results() -> None:
    # Message 3 answers the first message's call and a dropped call (at 2):
    # only the first part comes back, as a copy with a derived id.
    messages = chat(12)
    messages[0] = asst("boot", "a")
    messages[2] = asst("mid", "m")
    messages[3] = results("a", "m")

    out = truncate(messages).messages

    assert out[0] == messages[0]
    assert out[1].parts == (messages[3].parts[0],)
    assert out[1].id == f"{messages[3].id}#0"
    assert out[2:] == tuple(messages[8:])


def test_reused_id_reattaches_only_the_first_message_occurrence() -> None:
    messages = chat(12)
    messages[0] = asst("boot", "t")
    messages[1] = results("t", tag="boot")
    messages[3] = asst("again", "t")
    messages[4] = results("t", tag="again")

    assert truncate(messages).messages == (messages[0], messages[1], *messages[8:])


def test_lone_calls_survive_outside_the_dropped_region() -> None:
    messages = chat(12)
    messages[0] = asst("boot", "never")
    messages[3] = asst("dropped", "gone")
    messages[10] = asst("pending", "p")

    out = truncate(messages).messages

    assert out == (messages[0], *messages[8:])


def test_lone_results_are_dropped_from_the_cut() -> None:
    messages = chat(12)
    messages[9] = results("ghost")

    out = truncate(messages).messages

    assert out == (messages[0], messages[8], messages[10], messages[11])


def test_lone_result_part_is_filtered_from_a_kept_message() -> None:
    messages = chat(12)
    messages[8] = asst("call", "k")
    messages[9] = results("k", "ghost")

    out = truncate(messages).messages

    assert out[2].parts == (messages[9].parts[0],)
    assert out[2].id == f"{messages[9].id}#0"
    assert out[3:] == (messages[10], messages[11])


def test_lone_results_are_dropped_on_the_unchanged_path() -> None:
    messages = [user("hi"), results("ghost"), asst("hello"), user("bye")]

    outcome = truncate(messages)

    kept = (messages[0], messages[2], messages[3])
    assert outcome.messages == kept
    assert outcome.tokens_after == COUNTER.count(kept)
    assert outcome.tokens_after < outcome.tokens_before


def test_only_lone_results_are_returned_as_received() -> None:
    messages = [results("x"), results("y", "z")]

    outcome = truncate(messages)

    assert outcome.messages == tuple(messages)
    assert outcome.tokens_after == outcome.tokens_before


def test_a_cut_into_lone_results_moves_back_to_the_newest_exchange() -> None:
    # Seed 003 cut after q2: only lone results were left, so it fell back to
    # sanitising. The cut now never passes the newest exchange's user message.
    messages = [results("g0"), user("q"), asst("a"), user("q2"), asst("a2")]
    messages += [results(f"g{i}") for i in range(1, 5)]

    out = truncate(messages).messages

    assert out == tuple(messages[3:5])


def one_long_exchange(calls: int) -> list[Message]:
    """The task, an earlier exchange, then one request answered by `calls` tools."""
    out = [Message.system("task", id="sys"), user("q0"), asst("a0"), user("go")]
    for i in range(calls):
        out += [asst(f"call{i}", f"c{i}"), results(f"c{i}")]
    out.append(asst("done"))
    return out


def test_the_newest_exchange_is_never_cut() -> None:
    messages = one_long_exchange(6)  # the newest exchange: messages[3:]

    out = truncate(messages).messages

    # Seed 003 kept [sys] + the last four: the request "go" was dropped.
    assert out == (messages[0], *messages[3:])


def test_a_conversation_of_one_exchange_is_not_cut() -> None:
    messages = one_long_exchange(6)[:1] + one_long_exchange(6)[3:]

    outcome = truncate(messages)

    assert outcome.messages == tuple(messages)
    assert outcome.tokens_after == outcome.tokens_before


def test_with_compact_newest_exchange_the_cut_keeps_its_user_message() -> None:
    messages = one_long_exchange(6)
    compactor = TruncatingCompactor(compact_newest_exchange=True)

    out = truncate(messages, compactor).messages

    # The first message, the request, and the last four moved back to the
    # call whose result they hold: in their order.
    assert out == (messages[0], messages[3], *messages[-5:])


def test_with_compact_newest_exchange_only_lone_results_left_is_unchanged() -> None:
    # No user message, a tail of lone results: cutting would leave nothing.
    messages = [results("g0"), asst("x"), asst("y"), asst("z")]
    messages += [results(f"g{i}") for i in range(1, 5)]
    compactor = TruncatingCompactor(compact_newest_exchange=True)

    out = truncate(messages, compactor).messages

    assert out == tuple(messages[1:4])


def test_first_message_lone_result_is_dropped() -> None:
    messages = [results("ghost"), *chat(12)[1:]]

    out = truncate(messages).messages

    assert out == tuple(messages[8:])


@pytest.mark.parametrize(
    ("field", "kwargs"),
    [
        ("preserve_recent", {"preserve_recent": 0}),
        ("preserve_recent", {"preserve_recent": True}),
        ("preserve_recent", {"preserve_recent": 2.0}),
        ("min_messages", {"min_messages": 1}),
        ("min_messages", {"min_messages": "6"}),
        ("compact_newest_exchange", {"compact_newest_exchange": 1}),
        ("compact_newest_exchange", {"compact_newest_exchange": None}),
    ],
    ids=[
        "recent-0",
        "recent-bool",
        "recent-float",
        "min-1",
        "min-str",
        "newest-int",
        "newest-none",
    ],
)
def test_bad_knobs_raise_config_error(field: str, kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigError) as info:
        TruncatingCompactor(**kwargs)  # type: ignore[arg-type]  # bad on purpose

    assert info.value.field == field
    assert field in str(info.value)


def test_smallest_knobs_are_accepted() -> None:
    compactor = TruncatingCompactor(preserve_recent=1, min_messages=2)
    messages = chat(4)

    assert truncate(messages, compactor).messages == (messages[0], messages[3])
