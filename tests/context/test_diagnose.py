"""What fills a context: `largest_items`, `explain` and the errors naming them."""

from __future__ import annotations

import json
from collections.abc import Sequence

import attrs
import pytest

from turnfsm import serde
from turnfsm.context._diagnose import explain, largest_items
from turnfsm.errors import (
    CompactionFailed,
    CompactionStalled,
    ConfigError,
    ContextExceeded,
    CorruptRecord,
    LargeItem,
    MaxTurnsExceeded,
    RunFailed,
    TurnFSMError,
)
from turnfsm.messages import SENT, Message, Role, TextPart, ToolCallPart
from turnfsm.tokens import HeuristicTokenCounter


class CharCounter:
    """One token per character: sizes a test can read off its strings."""

    def count(self, messages: Sequence[Message]) -> int:
        return sum(self.count_text(m.text) for m in messages)

    def count_text(self, text: str) -> int:
        return len(text)


COUNTER = CharCounter()


def call(call_id: str, name: str, **arguments: str) -> ToolCallPart:
    return ToolCallPart(id=call_id, name=name, arguments=arguments)


def tool_heavy() -> list[Message]:
    """A system prompt, then two turns whose tool results dwarf the rest."""
    return [
        Message.system("s" * 10),  # 0, turn 0
        Message.user("u" * 5),  # 1, turn 1
        Message.assistant(tool_calls=[call("c1", "read_file", path="a")]),  # 2
        Message.tool_result("c1", "x" * 300),  # 3
        Message.assistant("a" * 20),  # 4
        Message.user("u" * 6),  # 5, turn 2
        Message.assistant(  # 6
            "b" * 7,
            tool_calls=[call("c2", "grep", q="z"), call("c3", "read_file", path="b")],
        ),
        Message.assistant(""),  # 7: an empty reply (nothing to measure)
        Message.tool_result("c2", "y" * 120),  # 8
        Message.tool_result("c3", "w" * 500),  # 9
    ]


RESULT = LargeItem(
    kind="tool_result",
    role="tool",
    turn=3,
    index=7,
    tokens=2410,
    tool="read_file",
    call_id="c1",
)
SYSTEM = LargeItem(kind="message", role="system", turn=0, index=0, tokens=300)
USER = LargeItem(kind="message", role="user", turn=2, index=4, tokens=1200)


# -- largest_items -------------------------------------------------------------


def test_items_come_biggest_first_with_their_tool_turn_and_call() -> None:
    largest = largest_items(tool_heavy(), COUNTER)

    assert largest == (
        LargeItem(
            kind="tool_result",
            role="tool",
            turn=2,
            index=9,
            tokens=500,
            tool="read_file",
            call_id="c3",
        ),
        LargeItem(
            kind="tool_result",
            role="tool",
            turn=1,
            index=3,
            tokens=300,
            tool="read_file",
            call_id="c1",
        ),
        LargeItem(
            kind="tool_result",
            role="tool",
            turn=2,
            index=8,
            tokens=120,
            tool="grep",
            call_id="c2",
        ),
    )


def test_n_bounds_the_items_and_every_kind_is_measured() -> None:
    items = largest_items(tool_heavy(), COUNTER, n=100)

    assert [(i.kind, i.index, i.tokens) for i in items] == [
        ("tool_result", 9, 500),
        ("tool_result", 3, 300),
        ("tool_result", 8, 120),
        ("tool_call", 2, len('read_file{"path":"a"}')),  # 21: a tie, by position
        ("tool_call", 6, len('read_file{"path":"b"}')),
        ("message", 4, 20),
        ("tool_call", 6, len('grep{"q":"z"}')),
        ("message", 0, 10),
        ("message", 6, 7),
        ("message", 5, 6),
        ("message", 1, 5),
    ]
    assert largest_items(tool_heavy(), COUNTER, n=1) == items[:1]
    assert largest_items(tool_heavy(), COUNTER, n=0) == ()
    assert largest_items([], COUNTER) == ()


def test_turns_start_at_each_user_message() -> None:
    items = largest_items(tool_heavy(), COUNTER, n=100)

    turns = {(i.index, i.kind): i.turn for i in items}
    assert turns[(0, "message")] == 0
    assert turns[(1, "message")] == 1
    assert turns[(4, "message")] == 1
    assert turns[(5, "message")] == 2
    assert turns[(9, "tool_result")] == 2


def test_ties_go_to_the_earlier_item() -> None:
    messages = [Message.user("aaa"), Message.assistant("bbb"), Message.user("ccc")]

    items = largest_items(messages, COUNTER, n=2)

    assert [i.index for i in items] == [0, 1]
    assert [i.role for i in items] == ["user", "assistant"]


def test_a_tool_call_is_its_name_and_json_arguments() -> None:
    part = ToolCallPart(id="c", name="write", arguments={"text": "né"})
    messages = [Message.assistant(tool_calls=[part]), Message.tool_result("c", "")]

    (item,) = largest_items(messages, COUNTER, n=1)

    assert (item.kind, item.tool, item.call_id) == ("tool_call", "write", "c")
    assert item.tokens == len('write{"text":"né"}')  # non-ASCII kept as is


def test_a_result_whose_call_is_not_in_the_context_names_no_tool() -> None:
    # A compactor may have dropped the call; the result still counts.
    messages = [Message.user("hi"), Message.tool_result("gone", "z" * 50)]

    (item,) = largest_items(messages, COUNTER, n=1)

    assert (item.kind, item.tool, item.call_id, item.turn) == (
        "tool_result",
        "",
        "gone",
        1,
    )
    assert str(item) == "tool result (call gone) in turn 1: 50 tokens"


def test_the_text_parts_of_a_message_are_one_item() -> None:
    message = Message(role=Role.USER, parts=[TextPart(text="ab"), TextPart(text="c")])

    (item,) = largest_items([message], COUNTER)

    assert (item.kind, item.tokens) == ("message", 3)


def test_a_replys_thinking_is_in_its_message_item() -> None:
    # A reply's thinking (metadata its model client sends back) filled the
    # window unlisted: a stall named a few small items and advised masking.
    thought = "let me think " * 400
    call = ToolCallPart(id="t1", name="look", arguments={})
    reply = Message.assistant("", tool_calls=[call], metadata={f"{SENT}t": thought})
    messages = [Message.user("look"), reply, Message.tool_result("t1", "found")]

    item = largest_items(messages, HeuristicTokenCounter(), n=1)[0]

    assert (item.kind, item.role, item.index) == ("message", "assistant", 1)
    assert item.tokens == HeuristicTokenCounter().count_text(thought)


def test_a_real_counter_measures_each_piece_with_count_text() -> None:
    counter = HeuristicTokenCounter()
    messages = tool_heavy()

    (item,) = largest_items(messages, counter, n=1)

    assert item.tokens == counter.count_text("w" * 500)


@pytest.mark.parametrize("n", [-1, True, 2.0])
def test_a_bad_n_is_a_config_error(n: int) -> None:
    with pytest.raises(ConfigError) as caught:
        largest_items(tool_heavy(), COUNTER, n=n)
    assert caught.value.field == "n"


# -- LargeItem and the errors' messages ----------------------------------------


def test_a_large_item_reads_as_what_where_and_how_big() -> None:
    assert str(RESULT) == "tool result of read_file (call c1) in turn 3: 2,410 tokens"
    call_item = LargeItem(
        kind="tool_call",
        role="assistant",
        turn=1,
        index=2,
        tokens=12,
        tool="grep",
        call_id="c9",
    )
    assert str(call_item) == "tool call to grep (call c9) in turn 1: 12 tokens"
    assert str(USER) == "user message #4 in turn 2: 1,200 tokens"
    assert str(SYSTEM) == "system message #0 before the first turn: 300 tokens"


def test_a_large_item_has_a_known_kind() -> None:
    with pytest.raises(ValueError, match="kind"):
        LargeItem(kind="image", role="user", turn=1, index=0, tokens=1)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("error", "start"),
    [
        (ContextExceeded(used=9, limit=8), "context exceeded: 9 tokens used"),
        (CompactionStalled(used=8, limit=8), "compaction stalled: 8 tokens after"),
        (
            CompactionFailed(used=7, limit=8, cause="boom"),
            "compaction failed at 7 tokens (limit 8): boom",
        ),
    ],
)
def test_without_largest_the_message_is_unchanged(
    error: ContextExceeded, start: str
) -> None:
    assert error.largest == ()
    assert str(error).startswith(start)
    assert "largest" not in str(error)
    assert "ToolResultDigest" not in str(error)


def test_the_message_names_the_largest_items_and_a_tool_result_strategy() -> None:
    plain = CompactionStalled(used=9000, limit=9000)
    error = CompactionStalled(used=9000, limit=9000, largest=[RESULT, USER, SYSTEM])

    assert str(error) == (
        f"{plain}; largest: tool result of read_file (call c1) in turn 3: "
        "2,410 tokens, user message #4 in turn 2: 1,200 tokens, system "
        "message #0 before the first turn: 300 tokens; tool results fill it: "
        "MaskingCompactor (the default strategy) caps, digests and cuts them to fit"
    )
    assert error.largest == (RESULT, USER, SYSTEM)  # a list becomes a tuple


def test_when_tool_results_are_not_the_bulk_the_hint_is_summarising() -> None:
    small = LargeItem(
        kind="tool_result",
        role="tool",
        turn=1,
        index=3,
        tokens=1000,
        tool="ls",
        call_id="c",
    )
    error = ContextExceeded(used=9, limit=8, largest=(small, USER, SYSTEM))

    assert str(error).startswith(str(ContextExceeded(used=9, limit=8)))
    assert str(error).endswith(
        "; messages fill it: SummarizingCompactor, or LayeredCompactor with a"
        " summary model, summarises old turns; or set a bigger context_window"
    )
    assert "ToolResultDigest" not in str(error)


@pytest.mark.parametrize(
    ("strategy", "largest"),
    [
        ("MaskingCompactor", (RESULT, USER, SYSTEM)),
        ("LayeredCompactor", (RESULT, USER, SYSTEM)),
        ("SummarizingCompactor", (USER, SYSTEM)),
        ("LayeredCompactor", (USER, SYSTEM)),
    ],
)
def test_the_hint_never_recommends_the_strategy_that_stalled(
    strategy: str, largest: tuple[LargeItem, ...]
) -> None:
    error = CompactionStalled(used=9000, limit=9000, largest=largest, strategy=strategy)
    hint = str(error).rpartition("; ")[2]

    assert f"and {strategy} (the strategy in use) could not" in hint
    assert hint.count("Compactor") == 1  # it names no other strategy to use
    assert "a context window of at least 9475 tokens" in hint
    assert "a smaller reply budget (max_output_tokens)" in hint
    assert "fewer pinned messages" in hint


def test_the_strategy_in_use_is_told_only_of_settings_it_has() -> None:
    # MaskingCompactor always cuts inside the newest exchange: it has no
    # compact_newest_exchange to set. LayeredCompactor cuts a result to its
    # max_tool_result_chars, however the newest exchange is set.
    masking = CompactionStalled(
        used=9000, limit=9000, largest=(RESULT,), strategy="MaskingCompactor"
    )
    layered = CompactionStalled(
        used=9000, limit=9000, largest=(RESULT,), strategy="LayeredCompactor"
    )

    assert "compact_newest_exchange" not in str(masking)
    assert str(masking).endswith(
        "tool results fill it, and MaskingCompactor (the strategy in use) could "
        "not cut them further: give the run a context window of at least 9475 tokens, "
        "a smaller reply budget (max_output_tokens), or fewer pinned messages"
    )
    assert str(layered).endswith(
        "tool results fill it, and LayeredCompactor (the strategy in use) could "
        "not cut them further: lower its max_tool_result_chars, let it cut the "
        "newest exchange (compact_newest_exchange=True) unless it does already, "
        "or give the run a context window of at least 9475 tokens, a smaller reply "
        "budget (max_output_tokens), or fewer pinned messages"
    )


def test_a_summarising_strategy_is_told_what_it_keeps_whole() -> None:
    # A SummarizingCompactor keeping its 4 newest exchanges, on a session of
    # 4 big ones, had nothing to summarise: the hint named no setting of it.
    summarizing = CompactionStalled(
        used=9000, limit=9000, largest=(USER,), strategy="SummarizingCompactor"
    )
    layered = CompactionStalled(
        used=9000, limit=9000, largest=(USER,), strategy="LayeredCompactor"
    )

    assert str(summarizing).endswith(
        "messages fill it, and SummarizingCompactor (the strategy in use) could "
        "not summarise them small enough: lower its keep_recent_turns (the newest "
        "exchanges it keeps whole), let it summarise inside the newest exchange "
        "(compact_newest_exchange=True) unless it does already, or give the run "
        "a context window of at least 9475 tokens, a smaller reply budget "
        "(max_output_tokens), or fewer pinned messages"
    )
    assert "keep_recent_turns" not in str(layered)  # it has no such setting
    assert "(compact_newest_exchange=True) unless it does already" in str(layered)


def test_another_strategy_than_masking_is_told_to_use_it() -> None:
    error = CompactionStalled(
        used=9000, limit=9000, largest=(RESULT,), strategy="TruncatingCompactor"
    )

    assert str(error).endswith(
        "; tool results fill it: MaskingCompactor caps, digests and cuts them to fit"
    )


def test_explain_names_the_strategy_in_use_and_the_log_keeps_it() -> None:
    error = explain(
        CompactionStalled(used=900, limit=900),
        tool_heavy(),
        COUNTER,
        strategy="MaskingCompactor",
    )

    assert error.strategy == "MaskingCompactor"
    assert "caps, digests" not in str(error)
    again = round_trip(error)
    assert isinstance(again, CompactionStalled)
    assert again.strategy == "MaskingCompactor"
    assert str(again) == str(error)
    plain = serde.error_to_json(CompactionStalled(used=900, limit=900))
    assert "strategy" not in plain  # unknown: written as before


def test_compaction_failed_keeps_its_cause_positionally_and_lists_items() -> None:
    error = CompactionFailed(7, 8, "boom", largest=(RESULT,))

    assert error.cause == "boom"
    assert str(error).startswith("compaction failed at 7 tokens (limit 8): boom; ")
    assert str(error).endswith(
        "tool results fill it: MaskingCompactor (the default strategy) caps,"
        " digests and cuts them to fit"
    )


def test_a_pass_that_failed_with_room_to_spare_blames_no_size() -> None:
    # A summary model down, at 384 tokens of a 50,000-token window: the error
    # said "could not summarise them small enough", asking for a window of
    # at least 406 tokens, or told the user to change strategy.
    for largest in ((USER,), (RESULT,)):
        error = CompactionFailed(
            384,
            50_000,
            "ConnectionError: summary service unreachable",
            largest=largest,
            strategy="SummarizingCompactor",
        )
        assert str(error) == (
            "compaction failed at 384 tokens (limit 50000): ConnectionError: "
            "summary service unreachable; the conversation fits the window (its "
            "emergency line is over 384 tokens): what failed is the pass's own"
        )
        assert str(round_trip(error)) == str(error)
    # Over the emergency line, or refused by the provider: the sizes still tell.
    tight = CompactionFailed(390, 410, "boom", largest=(USER,), strategy="X")
    assert "largest: user message #4" in str(tight)
    refused = attrs.evolve(error, provider_message="maximum context length is 300")
    assert "largest: tool result of read_file" in str(refused)


# -- explain ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "error",
    [
        ContextExceeded(used=900, limit=800),
        CompactionStalled(used=900, limit=900),
        CompactionFailed(used=900, limit=800, cause="boom"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_explain_fills_largest_of_a_context_exceeded(error: ContextExceeded) -> None:
    explained = explain(error, tool_heavy(), COUNTER)

    assert type(explained) is type(error)
    assert (explained.used, explained.limit) == (error.used, error.limit)
    assert explained.largest == largest_items(tool_heavy(), COUNTER)
    assert str(explained).startswith(str(error) + "; largest: tool result of ")
    assert error.largest == ()  # the original is a value: unchanged
    if isinstance(error, CompactionFailed):
        assert isinstance(explained, CompactionFailed)
        assert explained.cause == "boom"


def test_explain_keeps_items_already_named() -> None:
    error = CompactionStalled(used=9, limit=9, largest=(SYSTEM,))

    assert explain(error, tool_heavy(), COUNTER) is error


def test_explain_with_nothing_to_measure_returns_the_error() -> None:
    error = ContextExceeded(used=9, limit=8)

    assert explain(error, [], COUNTER) is error


@pytest.mark.parametrize(
    "error",
    [
        MaxTurnsExceeded(max_turns=3),
        RunFailed(error=CompactionStalled(used=9, limit=9)),
        ConfigError("n", -1, "an int >= 0"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_explain_leaves_other_errors_alone(error: TurnFSMError) -> None:
    assert explain(error, tool_heavy(), COUNTER) is error


# -- serde ------------------------------------------------------------------------


def round_trip(error: TurnFSMError) -> TurnFSMError:
    data = json.loads(json.dumps(serde.error_to_json(error)))
    return serde.error_from_json(data)


@pytest.mark.parametrize(
    "error",
    [
        ContextExceeded(used=900, limit=800, largest=(RESULT, USER)),
        CompactionStalled(used=900, limit=900, largest=(RESULT, USER, SYSTEM)),
        CompactionFailed(used=900, limit=800, cause="boom", largest=(SYSTEM,)),
    ],
    ids=lambda e: type(e).__name__,
)
def test_an_error_with_largest_round_trips(error: ContextExceeded) -> None:
    back = round_trip(error)
    enveloped = serde.open_envelope(json.loads(json.dumps(serde.envelope(error))))
    nested = serde.loads(RunFailed, serde.dumps(RunFailed(error=error)))

    for again in (back, enveloped, nested.error):
        assert type(again) is type(error)
        assert again.args == error.args
        assert str(again) == str(error)
    first = error.largest[0]
    assert serde.to_json(error)["largest"][0] == attrs.asdict(first)  # type: ignore[call-overload,index]


def test_an_error_without_largest_keeps_its_old_form() -> None:
    assert serde.error_to_json(CompactionFailed(used=5, limit=9, cause="x")) == {
        "type": "CompactionFailed",
        "used": 5,
        "limit": 9,
        "cause": "x",
    }


@pytest.mark.parametrize(
    "data",
    [
        {"type": "CompactionStalled", "used": 5, "limit": 9},
        {"type": "ContextExceeded", "used": 5, "limit": 9},
        {"type": "CompactionFailed", "used": 5, "limit": 9, "cause": "x"},
    ],
)
def test_a_record_written_before_largest_still_loads(data: dict[str, object]) -> None:
    error = serde.error_from_json(data)

    assert isinstance(error, ContextExceeded)
    assert (type(error).__name__, error.used, error.limit) == (data["type"], 5, 9)
    assert error.largest == ()
    assert "largest" not in str(error)


def test_a_stored_item_of_an_unknown_kind_is_corrupt() -> None:
    data = serde.error_to_json(CompactionStalled(used=5, limit=9, largest=(RESULT,)))
    data["largest"][0]["kind"] = "image"  # type: ignore[index,call-overload]

    with pytest.raises(CorruptRecord) as caught:
        serde.error_from_json(data)
    assert caught.value.path.startswith("largest")


class NoneForText(CharCounter):
    """Counts messages, but answers None for a text."""

    def count_text(self, text: str) -> int:
        return None  # type: ignore[return-value]


def test_a_counter_that_returns_no_count_for_an_item_is_named() -> None:
    with pytest.raises(ConfigError) as caught:
        largest_items([Message.user("hello")], NoneForText())

    assert (caught.value.field, caught.value.value) == ("counter", None)
    assert "from NoneForText.count_text" in str(caught.value)


SAID = "HTTP 400: maximum context length is 4096 tokens"


def test_a_stall_after_the_provider_refused_says_so_and_what_to_do() -> None:
    # It said "nothing was saved (a vetoing hook or a conversation the
    # compactor cannot cut) ... or a bigger window": the window was the
    # model's, and a bigger one is what made the provider refuse.
    error = CompactionStalled(used=1537, limit=1537, provider_message=SAID)

    assert str(error) == (
        "compaction stalled: 1537 tokens after the pass, 1537 before; the"
        " provider refused the request as too long, and the pass run for it"
        " saved nothing (a vetoing hook, no context manager, or a conversation"
        " the compactor cannot cut) - set context_window to the model's real"
        " window (with a counter that does not undercount its tokens), so that"
        " compaction starts before the provider refuses (the provider said:"
        f" {SAID})"
    )
    assert "nothing was saved" in str(CompactionStalled(used=9, limit=9))


def test_one_overflow_too_many_says_the_provider_kept_refusing() -> None:
    error = ContextExceeded(used=1537, limit=100_000, provider_message=SAID)

    assert str(error) == (
        "context exceeded: 1537 tokens used, limit 100000; the provider kept"
        " refusing the request as too long - set context_window to the model's"
        " real window (with a counter that does not undercount its tokens), so"
        " that compaction starts before the provider refuses (the provider said:"
        f" {SAID})"
    )


@pytest.mark.parametrize(
    ("strategy", "largest"),
    [("TruncatingCompactor", (USER, SYSTEM)), ("MaskingCompactor", (RESULT,))],
    ids=["messages", "results-in-use"],
)
def test_after_a_refusal_the_hint_asks_for_the_models_window_not_a_bigger_one(
    strategy: str, largest: tuple[LargeItem, ...]
) -> None:
    error = CompactionStalled(
        used=9000,
        limit=9000,
        largest=largest,
        strategy=strategy,
        provider_message=SAID,
    )
    hint = str(error).rpartition("; ")[2]

    assert "the model's real window" in hint
    assert "bigger" not in hint
    assert "over 9000" not in hint


CUT = (
    # Anthropic's client, and the driver's word for a server that clips the
    # reply budget to its window (llama.cpp's)
    "the reply filled the model's context window before it was done (stop reason"
    " 'model_context_window_exceeded', after 4 output tokens on 9 input tokens)",
    "the provider cut the reply off at 12 of its 500 tokens: by its count the"
    " request is 3900 input + 500 reply = 4400 tokens > the 4096 window",
)


@pytest.mark.parametrize("said", CUT, ids=["anthropic", "clipped"])
@pytest.mark.parametrize("error_type", [CompactionStalled, ContextExceeded])
def test_a_reply_cut_at_the_window_asks_for_a_smaller_reply_budget_too(
    said: str, error_type: type[ContextExceeded]
) -> None:
    # It asked only for the model's real window: the reply budget, which did
    # not fit beside the conversation, went unnamed.
    error = error_type(
        used=9000,
        limit=9000,
        largest=(USER, SYSTEM),
        strategy="TruncatingCompactor",
        provider_message=said,
    )
    advice = str(error)

    assert "the reply off at the window" in advice
    assert "lower the reply budget (max_output_tokens)" in advice
    assert "context_window to the model's real window" in advice
    assert advice.endswith(
        "context_window to the model's real window or a smaller reply budget"
        " (max_output_tokens)"
    )


def test_a_refused_request_asks_for_no_smaller_reply_budget() -> None:
    error = CompactionStalled(
        used=9000,
        limit=9000,
        largest=(USER, SYSTEM),
        strategy="TruncatingCompactor",
        provider_message=SAID,
    )

    assert "max_output_tokens" not in str(error)


# -- pinned items: no strategy shrinks them --------------------------------------


def test_items_of_pinned_messages_say_so() -> None:
    messages = [
        Message.user("the task " * 60, id="task"),
        Message.assistant("ok", id="a1"),
        Message.user("the request " * 40, id="ask"),
    ]
    largest = largest_items(messages, COUNTER, pinned={"task", "ask"})

    assert [(i.index, i.pinned) for i in largest] == [(0, True), (2, True), (1, False)]
    assert str(largest[0]) == "user message #0 in turn 1 (pinned): 540 tokens"
    assert str(largest[2]) == "assistant message #1 in turn 1: 2 tokens"


@pytest.mark.parametrize(
    "strategy", ["", "TruncatingCompactor", "SummarizingCompactor"]
)
def test_when_pinned_messages_fill_it_the_hint_is_to_pin_less(strategy: str) -> None:
    task = attrs.evolve(USER, pinned=True)
    error = ContextExceeded(
        used=9000, limit=8000, largest=(task, SYSTEM), strategy=strategy
    )
    hint = str(error).rpartition("; ")[2]

    assert hint == (
        "pinned messages fill it, and no pass drops or shortens a pinned "
        "message: shorten them, switch off a pin rule (PinRules), or give the "
        "run a context window of at least 9475 tokens"
    )


def test_an_item_stored_before_pins_were_told_loads_unpinned() -> None:
    data = serde.to_json(USER)
    assert isinstance(data, dict)
    del data["pinned"]
    assert serde.from_json(LargeItem, data) == USER
