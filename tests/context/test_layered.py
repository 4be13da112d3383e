"""LayeredCompactor: the five layers of seed 001, boundary by boundary."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import anyio
import pytest

from tests.helpers import compaction_context as ctx_for
from turnfsm._checks import MAX_TOKENS
from turnfsm.context import (
    Applied,
    CompactionProposal,
    CompactionStatus,
    Failed,
    LayeredCompactor,
    Skipped,
    call_handle,
    mark_replacements,
    recall_note,
)
from turnfsm.context._layered import (
    MAX_TOOL_RESULT_CHARS,
    PRESERVED_TURNS,
    TRIM_TURN_THRESHOLD,
    TRUNCATION_SUFFIX,
)
from turnfsm.context._pairs import result_problem
from turnfsm.errors import ConfigError, ProviderError
from turnfsm.messages import SUMMARY_COVERS, Message, Role, ToolResultPart
from turnfsm.providers import ModelRequest, ModelResponse
from turnfsm.testing import ExtractiveSummaryModel, FakeModelClient, check_compactor
from turnfsm.testing import tool_call as call
from turnfsm.tokens import HeuristicTokenCounter

COUNTER = HeuristicTokenCounter()
SECRET = "SECRET-XYZ"
INSUFFICIENT = "deterministic layers insufficient; LLM layers required"
COLLAPSE_HEADER = "[Conversation summary of {n} earlier turns]\n"
FULL_HEADER = "[Full conversation summary]\n"


def run(
    compactor: LayeredCompactor,
    messages: Sequence[Message],
    target: int = 0,
    **ctx: object,
) -> CompactionProposal:
    async def go() -> CompactionProposal:
        return await compactor.compact(messages, target, ctx_for(messages, **ctx))  # type: ignore[arg-type]

    return anyio.run(go)


def manual(
    compactor: LayeredCompactor,
    messages: Sequence[Message],
    *,
    line: int = 0,
    limit: int,
    circuit_open: bool = False,
) -> tuple[tuple[Message, ...], CompactionStatus]:
    async def go() -> tuple[tuple[Message, ...], CompactionStatus]:
        return await compactor.manual_compact(
            messages,
            line=line,
            limit=limit,
            counter=COUNTER,
            circuit_open=circuit_open,
        )

    return anyio.run(go)


def conversation(
    turns: int,
    *,
    system: bool = True,
    result: Callable[[int], str] = lambda i: f"contents {i} " * 20,
    user: Callable[[int], str] = lambda i: f"question {i}: file f{i}.txt",
    secret: str = "",
) -> list[Message]:
    """`turns` user turns, each: user, a read_file call, its result, an answer."""
    out = (
        [Message.system(f"You are a careful agent.{secret}", id="sys")]
        if system
        else []
    )
    for i in range(turns):
        out.append(Message.user(user(i) + secret, id=f"u{i}"))
        read = call("read_file", f"c{i}", path=f"f{i}.txt")
        out.append(
            Message.assistant(f"let me look{secret}", tool_calls=[read], id=f"a{i}")
        )
        out.append(Message.tool_result(f"c{i}", result(i) + secret, id=f"r{i}"))
        out.append(Message.assistant(f"answer {i}{secret}", id=f"z{i}"))
    return out


def long_users(turns: int) -> list[Message]:
    """Turns whose user messages are long: summarising one saves a lot."""
    return conversation(turns, user=lambda i: f"question {i}: " + "lorem " * 300)


def same(a: Sequence[Message], b: Sequence[Message]) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))


def contents(messages: Sequence[Message]) -> list[str]:
    return [p.content for m in messages for p in m.tool_results]


# -- the constants --------------------------------------------------------------
def test_the_seed_constants() -> None:
    assert MAX_TOOL_RESULT_CHARS == 4_000
    assert TRUNCATION_SUFFIX == "... [truncated]"
    assert TRIM_TURN_THRESHOLD == 20
    assert PRESERVED_TURNS == 10
    compactor = LayeredCompactor()
    assert compactor.max_tool_result_chars == 4_000
    assert compactor.trim_turns == 20
    assert compactor.preserved_turns == 10


# -- layer 1: budget --------------------------------------------------------------
@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("x" * 3_999, "x" * 3_999),
        ("x" * 4_000, "x" * 4_000),
        ("x" * 4_001, "x" * 4_000 + "... [truncated]"),
        ("x" * 9_000, "x" * 4_000 + "... [truncated]"),
        ("日" * 4_000, "日" * 4_000),  # 12,000 bytes: characters count
        ("日" * 4_001, "日" * 4_000 + "... [truncated]"),
        ("😀" * 4_000, "😀" * 4_000),  # astral: one character each
        ("😀" * 4_001, "😀" * 4_000 + "... [truncated]"),
        ("", ""),
    ],
)
def test_budget_caps_tool_results_at_4000_characters(
    content: str, expected: str
) -> None:
    message = Message.tool_result("c1", content, is_error=True, id="r1")
    (out,) = LayeredCompactor().apply_budget([message])
    (part,) = out.tool_results
    assert part.content == expected
    assert (part.call_id, part.is_error) == ("c1", True)
    assert (out.id, out.role) == ("r1", Role.TOOL)
    assert (out is message) == (content == expected)


def test_budget_leaves_other_messages_and_parts_as_they_are() -> None:
    long = "y" * 10_000
    messages = [
        Message.system(long, id="s"),
        Message.user(long, id="u"),
        Message.assistant(
            long, tool_calls=[call("t", "c1", q=long), call("t", "c2")], id="a"
        ),
        Message(
            role=Role.TOOL,
            parts=(
                ToolResultPart(call_id="c1", content="short"),
                ToolResultPart(call_id="c2", content=long),
            ),
            id="r",
        ),
        Message.assistant(long, id="z"),
    ]
    out = LayeredCompactor().apply_budget(messages)
    assert [m.id for m in out] == ["s", "u", "a", "r", "z"]
    for i in (0, 1, 2, 4):
        assert out[i] is messages[i]
    short, cut = out[3].tool_results
    assert short is messages[3].parts[0]
    assert cut.content == "y" * 4_000 + TRUNCATION_SUFFIX
    assert cut.call_id == "c2"


def test_budget_follows_its_knob() -> None:
    message = Message.tool_result("c1", "abcdef")
    (out,) = LayeredCompactor(max_tool_result_chars=5).apply_budget([message])
    assert out.tool_results[0].content == "abcde" + TRUNCATION_SUFFIX
    (same_msg,) = LayeredCompactor(max_tool_result_chars=6).apply_budget([message])
    assert same_msg is message


def test_budget_with_nothing_to_cut_returns_every_message_itself() -> None:
    messages = conversation(3)
    assert same(LayeredCompactor().apply_budget(messages), messages)


# -- layer 2: trim --------------------------------------------------------------
def test_twenty_turns_are_not_trimmed() -> None:
    messages = conversation(20)
    assert same(LayeredCompactor().apply_trim(messages), messages)


def test_the_21st_turn_empties_the_oldest_turns_results() -> None:
    messages = conversation(21)
    messages[3] = Message.tool_result("c0", "failed: boom", is_error=True, id="r0")
    out = LayeredCompactor().apply_trim(messages)
    assert [m.id for m in out] == [m.id for m in messages]
    emptied = out[3]
    assert (emptied.id, emptied.role) == ("r0", Role.TOOL)
    (part,) = emptied.tool_results
    assert (part.call_id, part.content, part.is_error) == ("c0", "", True)
    for i, (new, old) in enumerate(zip(out, messages, strict=True)):
        if i != 3:
            assert new is old, old.id
    assert contents(out)[1:] == contents(messages)[1:]


@pytest.mark.parametrize(
    ("turns", "keep", "emptied"),
    [
        (20, 20, 0),
        (21, 20, 1),
        (25, 20, 5),
        (3, 1, 2),
        (3, 3, 0),
        (4, 3, 1),
    ],
)
def test_trim_keeps_the_results_of_the_newest_turns(
    turns: int, keep: int, emptied: int
) -> None:
    messages = conversation(turns)
    out = LayeredCompactor(trim_turns=keep).apply_trim(messages)
    got = contents(out)
    assert got[:emptied] == [""] * emptied
    assert got[emptied:] == contents(messages)[emptied:]
    assert all(c for c in got[emptied:])


@pytest.mark.parametrize(("turns", "emptied"), [(20, False), (21, True)])
def test_messages_before_the_first_user_message_belong_to_the_oldest_turn(
    turns: int, emptied: bool
) -> None:
    prelude = [
        Message.system("rules", id="sys"),
        Message.assistant("booting", tool_calls=[call("env", "boot")], id="pa"),
        Message.tool_result("boot", "environment ready", id="pr"),
    ]
    messages = prelude + conversation(turns, system=False)
    out = LayeredCompactor().apply_trim(messages)
    # The prelude is no turn of its own: it is trimmed with the oldest turn.
    assert out[2].tool_results[0].content == ("" if emptied else "environment ready")
    first_turn = contents(messages)[1]
    assert contents(out)[1] == ("" if emptied else first_turn)
    assert contents(out)[2:] == contents(messages)[2:]
    assert out[0] is messages[0]
    assert out[1] is messages[1]


def test_summaries_do_not_start_a_turn() -> None:
    summary = Message.user(
        "[Conversation summary of 3 earlier turns]\n## Goal\nship",
        id="sum",
        metadata={SUMMARY_COVERS: "z_old"},
    )
    messages = [
        Message.system("rules", id="sys"),
        summary,
        *conversation(20, system=False),
    ]
    assert same(LayeredCompactor().apply_trim(messages), messages)


def test_trim_already_empty_results_stay_the_same_objects() -> None:
    messages = conversation(21, result=lambda i: "" if i == 0 else f"out {i}")
    assert same(LayeredCompactor().apply_trim(messages), messages)


# -- layer 3: microcompact --------------------------------------------------------
def test_a_reused_call_id_keeps_only_its_last_result() -> None:
    messages = [
        Message.user("go", id="u0"),
        Message.assistant(tool_calls=[call("t", "dup"), call("t", "solo")], id="a0"),
        Message(
            role=Role.TOOL,
            parts=(
                ToolResultPart(call_id="dup", content="first", is_error=True),
                ToolResultPart(call_id="solo", content="alone"),
            ),
            id="r0",
        ),
        Message.user("again", id="u1"),
        Message.assistant(tool_calls=[call("t", "dup")], id="a1"),
        Message.tool_result("dup", "second", id="r1"),
        Message.assistant(tool_calls=[call("t", "dup")], id="a2"),
        Message.tool_result("dup", "third", id="r2"),
        Message.assistant("done", id="z"),
    ]
    out = LayeredCompactor().apply_microcompact(messages)
    assert [m.id for m in out] == [m.id for m in messages]
    first, solo = out[2].tool_results
    assert (first.call_id, first.content, first.is_error) == ("dup", "", True)
    assert solo is messages[2].parts[1]
    assert out[5].tool_results[0].content == ""
    assert out[7] is messages[7]
    for i in (0, 1, 3, 4, 6, 8):
        assert out[i] is messages[i]


def test_distinct_call_ids_are_untouched() -> None:
    messages = conversation(25)
    assert same(LayeredCompactor().apply_microcompact(messages), messages)


# -- layer 4: collapse ------------------------------------------------------------
@pytest.mark.parametrize(("turns", "n"), [(11, 1), (12, 2), (15, 5)])
def test_collapse_summarises_all_but_the_last_ten_turns(turns: int, n: int) -> None:
    model = ExtractiveSummaryModel()
    messages = long_users(turns)
    out = run(LayeredCompactor(model=model), messages, COUNTER.count(messages) - 1)
    assert out.error is None
    assert len(model.requests) == 1  # it fits: no autocompact
    sys_msg, summary, *kept = out.messages
    assert sys_msg is messages[0]
    assert summary.role is Role.USER
    assert summary.text.startswith(COLLAPSE_HEADER.format(n=n))
    assert "## Active Task" in summary.text
    assert summary.metadata[SUMMARY_COVERS] == f"z{n - 1}"
    assert same(kept, messages[1 + 4 * n :])
    assert kept[0].id == f"u{n}"
    assert len([m for m in kept if m.role is Role.USER]) == 10
    assert out.tokens_after == COUNTER.count(out.messages) < out.tokens_before


def test_ten_turns_are_not_collapsed_but_autocompacted() -> None:
    model = ExtractiveSummaryModel()
    messages = long_users(10)
    out = run(LayeredCompactor(model=model), messages, COUNTER.count(messages) - 1)
    assert out.error is None
    assert len(model.requests) == 1
    sys_msg, summary, *kept = out.messages
    assert sys_msg is messages[0]
    assert summary.text.startswith(FULL_HEADER)
    assert same(kept, messages[-4:])
    limit = COUNTER.count(messages) - 1
    _, status = manual(
        LayeredCompactor(model=ExtractiveSummaryModel()), messages, limit=limit
    )
    assert isinstance(status, Applied)
    assert status.layers == ("autocompact",)
    eleven = long_users(11)
    _, status = manual(
        LayeredCompactor(model=ExtractiveSummaryModel()),
        eleven,
        limit=COUNTER.count(eleven) - 1,
    )
    assert isinstance(status, Applied)
    assert status.layers == ("collapse",)


def test_collapse_follows_preserved_turns() -> None:
    messages = long_users(5)
    compactor = LayeredCompactor(model=ExtractiveSummaryModel(), preserved_turns=3)
    out = run(compactor, messages, COUNTER.count(messages) - 1)
    summary = out.messages[1]
    assert summary.text.startswith(COLLAPSE_HEADER.format(n=2))
    assert summary.metadata[SUMMARY_COVERS] == "z1"
    assert same(out.messages[2:], messages[9:])


def test_several_leading_system_messages_stay_first() -> None:
    messages = [Message.system("second rules", id="sys2"), *long_users(12)]
    messages[0], messages[1] = messages[1], messages[0]
    out = run(
        LayeredCompactor(model=ExtractiveSummaryModel()),
        messages,
        COUNTER.count(messages) - 1,
    )
    assert [m.id for m in out.messages[:2]] == ["sys", "sys2"]
    assert out.messages[2].text.startswith(COLLAPSE_HEADER.format(n=2))


def test_the_collapse_reuses_a_recorded_summary() -> None:
    model = ExtractiveSummaryModel()
    compactor = LayeredCompactor(model=model)
    messages = long_users(12)
    target = COUNTER.count(messages) - 1
    first = run(compactor, messages, target)
    recorded = {m.id: m.text for m in first.messages if SUMMARY_COVERS in m.metadata}
    second = run(compactor, messages, target, summaries=recorded)
    assert [(m.id, m.text) for m in second.messages] == [
        (m.id, m.text) for m in first.messages
    ]
    assert len(model.requests) == 1


# -- layer 5: autocompact ---------------------------------------------------------
def test_autocompact_keeps_only_the_last_turn() -> None:
    model = ExtractiveSummaryModel()
    messages = long_users(15)
    out = run(LayeredCompactor(model=model), messages, 0)
    assert out.error is None
    assert len(model.requests) == 2  # collapse, then autocompact
    sys_msg, summary, *kept = out.messages
    assert sys_msg is messages[0]
    assert summary.role is Role.USER
    assert summary.text.startswith(FULL_HEADER)
    assert summary.metadata[SUMMARY_COVERS] == "z13"
    assert same(kept, messages[-4:])
    assert kept[0].id == "u14"  # the latest user message, verbatim
    assert [m for m in out.messages if SUMMARY_COVERS in m.metadata] == [summary]
    # The collapse's summary was folded into the full one.
    assert "PREVIOUS SUMMARY:" in model.requests[1].messages[0].text
    _, status = manual(
        LayeredCompactor(model=ExtractiveSummaryModel()), messages, limit=3_000
    )
    assert isinstance(status, Applied)
    assert status.layers == ("collapse", "autocompact")


def test_one_long_exchange_is_kept_whole() -> None:
    messages = [Message.system("rules", id="sys"), Message.user("do the task", id="u")]
    for i in range(8):
        messages.append(Message.assistant(tool_calls=[call("t", f"c{i}")], id=f"a{i}"))
        messages.append(Message.tool_result(f"c{i}", f"out {i} " * 50, id=f"r{i}"))
    model = ExtractiveSummaryModel()
    out = run(LayeredCompactor(model=model), messages, 0)
    # Layers 4 and 5 never split the newest exchange: nothing to summarise.
    assert out.error is None
    assert out.messages == tuple(messages)
    assert not model.requests


def test_compact_newest_exchange_summarises_inside_it_in_order() -> None:
    messages = [Message.system("rules", id="sys"), Message.user("do the task", id="u")]
    for i in range(8):
        messages.append(Message.assistant(tool_calls=[call("t", f"c{i}")], id=f"a{i}"))
        messages.append(Message.tool_result(f"c{i}", f"out {i} " * 50, id=f"r{i}"))
    compactor = LayeredCompactor(
        model=ExtractiveSummaryModel(), compact_newest_exchange=True
    )
    out = run(compactor, messages, 0)
    assert out.error is None
    ids = [m.id for m in out.messages]
    # The request stays first; the summary of what followed it comes next.
    assert ids[:2] == ["sys", "u"]
    assert out.messages[2].text.startswith(FULL_HEADER)
    assert ids[3:] == ["a7", "r7"]
    assert result_problem(out.messages, messages) is None


# -- stopping as soon as it fits -----------------------------------------------------
def test_fits_after_the_budget_no_later_layer_runs() -> None:
    messages = conversation(
        25, result=lambda i: "big " * 5_000 if i == 24 else f"out {i}"
    )
    model = ExtractiveSummaryModel()
    compactor = LayeredCompactor(model=model)
    # The pass's result names what it replaced: the target leaves room for it.
    plain = compactor.apply_budget(messages)
    budgeted = mark_replacements(messages, plain)
    target = COUNTER.count(budgeted)
    assert target < COUNTER.count(messages)
    out = run(compactor, messages, target)
    assert model.requests == []
    assert [(m.id, m.parts) for m in out.messages] == [
        (m.id, m.parts) for m in budgeted
    ]
    assert contents(out.messages)[0] == "out 0"  # not trimmed
    new, status = compactor.compact_deterministic(
        messages, limit=target, counter=COUNTER
    )
    assert status == Applied(
        layers=("budget",),
        tokens_before=COUNTER.count(messages),
        tokens_after=COUNTER.count(plain),
    )
    assert contents(new)[0] == "out 0"


def test_fits_after_microcompact_no_model_call() -> None:
    messages = conversation(25)
    messages[-2] = Message.tool_result("c24", "big " * 5_000, id="r24")
    reused = [
        Message.assistant(tool_calls=[call("read_file", "c24")], id="again"),
        Message.tool_result("c24", "fresh", id="r_again"),
    ]
    messages[-1:-1] = reused
    model = ExtractiveSummaryModel()
    compactor = LayeredCompactor(model=model)
    plain = compactor.apply_microcompact(
        compactor.apply_trim(compactor.apply_budget(messages))
    )
    expected = mark_replacements(messages, plain)
    target = COUNTER.count(expected)
    assert target < COUNTER.count(
        mark_replacements(
            messages, compactor.apply_trim(compactor.apply_budget(messages))
        )
    )
    out = run(compactor, messages, target)
    assert model.requests == []
    assert [(m.id, m.parts) for m in out.messages] == [
        (m.id, m.parts) for m in expected
    ]
    # Emptied, but for the note naming the message the log keeps it under.
    (c24,) = {c.id: c for m in messages for c in m.tool_calls if c.id == "c24"}.values()
    assert out.messages[-4].tool_results[0].content == recall_note([call_handle(c24)])
    new, status = compactor.compact_deterministic(
        messages, limit=target, counter=COUNTER
    )
    assert status == Applied(
        layers=("budget", "trim", "microcompact"),
        tokens_before=COUNTER.count(messages),
        tokens_after=COUNTER.count(plain),
    )
    assert [(m.id, m.parts) for m in new] == [(m.id, m.parts) for m in plain]


def test_a_conversation_that_fits_comes_back_unchanged() -> None:
    model = ExtractiveSummaryModel()
    messages = conversation(30)
    out = run(LayeredCompactor(model=model), messages, COUNTER.count(messages))
    assert list(out.messages) == messages
    assert out.tokens_after == out.tokens_before
    assert model.requests == []


def test_with_the_breaker_open_only_layers_1_to_3_run() -> None:
    model = ExtractiveSummaryModel()
    compactor = LayeredCompactor(model=model)
    messages = conversation(25, result=lambda i: "big " * 2_000)
    out = run(compactor, messages, 0, allow_model=False)
    assert model.requests == []
    assert out.error is None
    expected = mark_replacements(
        messages,
        compactor.apply_microcompact(
            compactor.apply_trim(compactor.apply_budget(messages))
        ),
    )
    assert [(m.id, m.parts) for m in out.messages] == [
        (m.id, m.parts) for m in expected
    ]
    assert not any(SUMMARY_COVERS in m.metadata for m in out.messages)
    assert out.tokens_after == COUNTER.count(out.messages) > 0


def test_with_the_breaker_open_and_nothing_to_do_the_input_comes_back() -> None:
    model = ExtractiveSummaryModel()
    messages = conversation(5)
    out = run(LayeredCompactor(model=model), messages, 0, allow_model=False)
    assert list(out.messages) == messages
    assert model.requests == []


# -- compact_deterministic --------------------------------------------------------
def test_compact_deterministic_skips_when_layers_1_to_3_are_not_enough() -> None:
    messages = conversation(25, result=lambda i: "big " * 2_000)
    model = ExtractiveSummaryModel()
    new, status = LayeredCompactor(model=model).compact_deterministic(
        messages, limit=10, counter=COUNTER
    )
    assert status == Skipped(reason=INSUFFICIENT)
    assert same(new, messages)
    assert model.requests == []


def test_compact_deterministic_with_nothing_to_do() -> None:
    messages = conversation(3)
    size = COUNTER.count(messages)
    new, status = LayeredCompactor().compact_deterministic(
        messages, limit=size, counter=COUNTER
    )
    assert status == Applied(layers=(), tokens_before=size, tokens_after=size)
    assert same(new, messages)


def test_compact_deterministic_defaults_to_a_counter() -> None:
    messages = conversation(3, result=lambda i: "z" * 5_000)
    new, status = LayeredCompactor().compact_deterministic(messages, limit=100_000)
    assert isinstance(status, Applied)
    assert status.layers == ("budget",)
    assert status.tokens_after < status.tokens_before
    assert contents(new) == ["z" * 4_000 + TRUNCATION_SUFFIX] * 3


# -- manual_compact ---------------------------------------------------------------
def test_manual_compact_at_or_under_the_line_is_skipped() -> None:
    model = ExtractiveSummaryModel()
    messages = long_users(15)
    size = COUNTER.count(messages)
    new, status = manual(LayeredCompactor(model=model), messages, line=size, limit=10)
    assert status == Skipped(reason="below trigger threshold")
    assert same(new, messages)
    assert model.requests == []
    _, status = manual(
        LayeredCompactor(model=model), messages, line=size - 1, limit=10**6
    )
    assert isinstance(status, Applied)


def test_manual_compact_fails_fast_with_the_breaker_open() -> None:
    model = ExtractiveSummaryModel()
    messages = long_users(15)
    new, status = manual(
        LayeredCompactor(model=model), messages, limit=3_000, circuit_open=True
    )
    assert isinstance(status, Failed)
    assert "circuit breaker" in status.error
    assert same(new, messages)
    assert model.requests == []


def _raise(request: ModelRequest) -> ModelResponse:
    raise ProviderError(f"upstream said {SECRET}", retryable=False, kind="server")


@pytest.mark.parametrize(
    ("handler", "says"),
    [
        (_raise, "ProviderError"),
        (lambda _r: "", "empty summary"),
        (lambda _r: "  \n\t", "empty summary"),
        (lambda _r: "word " * 2_000, "over max_summary_tokens"),
    ],
)
def test_manual_compact_failures_return_the_original_messages(
    handler: Callable[[ModelRequest], object], says: str
) -> None:
    model = FakeModelClient(handler)  # type: ignore[arg-type]
    messages = conversation(25, result=lambda i: "big " * 2_000)
    new, status = manual(LayeredCompactor(model=model), messages, limit=3_000)
    assert isinstance(status, Failed)
    assert says in status.error
    assert same(new, messages)  # not the layer 1-3 result either
    assert model.requests


def test_manual_compact_without_a_model_fails() -> None:
    messages = long_users(15)
    new, status = manual(LayeredCompactor(), messages, limit=3_000)
    assert isinstance(status, Failed)
    assert "no summary model" in status.error
    assert same(new, messages)


def test_manual_compact_applies_the_model_layers() -> None:
    model = ExtractiveSummaryModel()
    messages = conversation(25, result=lambda i: "big " * 2_000)
    new, status = manual(LayeredCompactor(model=model), messages, limit=3_000)
    assert isinstance(status, Applied)
    assert status.layers == ("budget", "trim", "collapse", "autocompact")
    assert status.tokens_before == COUNTER.count(messages)
    assert status.tokens_after == COUNTER.count(new) <= 3_000
    assert new[1].text.startswith(FULL_HEADER)
    assert new[-4].id == "u24"


def test_manual_compact_to_a_target_under_the_window() -> None:
    messages = long_users(15)
    new, status = manual(
        LayeredCompactor(model=ExtractiveSummaryModel()), messages, limit=1_500
    )
    assert isinstance(status, Applied), status
    assert COUNTER.count(new) <= 1_500


def test_manual_compact_still_over_the_limit_fails_with_the_messages_unchanged() -> (
    None
):
    messages = [Message.user("one short question")]
    new, status = manual(
        LayeredCompactor(model=ExtractiveSummaryModel()), messages, limit=5
    )
    assert isinstance(status, Failed)
    assert "still over the 5-token limit" in status.error
    assert same(new, messages)


# -- statuses carry no content ----------------------------------------------------
def _statuses() -> list[CompactionStatus]:
    messages = conversation(25, result=lambda i: "big " * 2_000, secret=SECRET)
    assert all(SECRET in (m.text + "".join(contents([m]))) for m in messages)
    size = COUNTER.count(messages)
    layered = LayeredCompactor(model=ExtractiveSummaryModel())
    out: list[CompactionStatus] = [
        layered.compact_deterministic(messages, limit=size, counter=COUNTER)[1],
        layered.compact_deterministic(messages, limit=10**6, counter=COUNTER)[1],
        layered.compact_deterministic(messages, limit=1, counter=COUNTER)[1],
        manual(layered, messages, line=size, limit=10)[1],
        manual(layered, messages, limit=3_000, circuit_open=True)[1],
        manual(layered, messages, limit=3_000)[1],
        manual(layered, messages, limit=500)[1],  # a window error
        manual(LayeredCompactor(), messages, limit=3_000)[1],
    ]

    def runtime(_r: ModelRequest) -> ModelResponse:
        raise RuntimeError(SECRET)

    for handler in (
        _raise,
        runtime,
        lambda _r: "",
        lambda _r: f"{SECRET} " * 2_000,
    ):
        model = FakeModelClient(handler)  # type: ignore[arg-type]
        out.append(manual(LayeredCompactor(model=model), messages, limit=3_000)[1])
    return out


def test_statuses_never_carry_message_content() -> None:
    statuses = _statuses()
    kinds = {type(s) for s in statuses}
    assert kinds == {Applied, Skipped, Failed}
    for status in statuses:
        assert SECRET not in str(status), status
        assert SECRET not in repr(status), status


# -- pairs survive every layer ----------------------------------------------------
def parallel(turns: int) -> list[Message]:
    """Turns with parallel calls, results out of order, one reused id."""
    out = [Message.system("rules", id="sys")]
    for i in range(turns):
        calls = [call("t", f"p{i}"), call("t", f"q{i}"), call("t", "same")]
        out += [
            Message.user(f"go {i}", id=f"u{i}"),
            Message.assistant(f"three at once {i}", tool_calls=calls, id=f"a{i}"),
            Message.tool_result(f"q{i}", f"q out {i} " * 600, id=f"rq{i}"),
            Message(
                role=Role.TOOL,
                parts=(
                    ToolResultPart(call_id="same", content=f"same {i}"),
                    ToolResultPart(call_id=f"p{i}", content=f"p out {i}"),
                ),
                id=f"rp{i}",
            ),
            Message.assistant(f"done {i}", id=f"z{i}"),
        ]
    return out


@pytest.mark.parametrize("turns", [1, 2, 10, 11, 21, 25])
def test_no_layer_orphans_a_call_or_result(turns: int) -> None:
    messages = parallel(turns)
    compactor = LayeredCompactor(model=ExtractiveSummaryModel())
    current: Sequence[Message] = messages
    for layer in (
        compactor.apply_budget,
        compactor.apply_trim,
        compactor.apply_microcompact,
    ):
        new = layer(current)
        assert result_problem(new, current) is None
        assert result_problem(new, messages) is None
        current = new
    size = COUNTER.count(current)
    for target in (size, size - 1, size // 2, 0):
        out = run(compactor, messages, target)
        assert out.error is None
        assert result_problem(out.messages, messages) is None, target
    limit_out, _ = compactor.compact_deterministic(messages, limit=0, counter=COUNTER)
    assert result_problem(limit_out, messages) is None


# -- settings ---------------------------------------------------------------------
@pytest.mark.parametrize(
    "field",
    ["max_tool_result_chars", "trim_turns", "preserved_turns", "max_summary_tokens"],
)
@pytest.mark.parametrize("value", [0, -1, True, "5", 5.0, None])
def test_bad_knobs_name_the_field(field: str, value: object) -> None:
    with pytest.raises(ConfigError) as info:
        LayeredCompactor(**{field: value})  # type: ignore[arg-type]
    assert info.value.field == field


@pytest.mark.parametrize("field", ["max_summary_tokens", "summary_window"])
def test_a_size_no_model_has_names_the_field(field: str) -> None:
    # The largest size any setting takes: more can only be a mistake.
    assert getattr(LayeredCompactor(**{field: MAX_TOKENS}), field) == MAX_TOKENS
    with pytest.raises(ConfigError) as info:
        LayeredCompactor(**{field: 10**40})
    assert (info.value.field, info.value.value) == (field, 10**40)
    assert "100,000,000" in str(info.value)


def test_max_summary_tokens_boundary() -> None:
    with pytest.raises(ConfigError):
        LayeredCompactor(max_summary_tokens=15)
    assert LayeredCompactor(max_summary_tokens=16).max_summary_tokens == 16
    for field in ("max_tool_result_chars", "trim_turns", "preserved_turns"):
        assert getattr(LayeredCompactor(**{field: 1}), field) == 1  # type: ignore[arg-type]


def test_a_model_that_is_not_a_client_names_the_field() -> None:
    with pytest.raises(ConfigError) as info:
        LayeredCompactor(model="x")  # type: ignore[arg-type]
    assert info.value.field == "model"


def test_it_keeps_the_compactor_contract() -> None:
    anyio.run(check_compactor, LayeredCompactor(model=ExtractiveSummaryModel()))


def test_the_digest_layer_runs_first_when_asked() -> None:
    messages = conversation(3, result=lambda i: f"line {i}\n" * 600)
    layered = LayeredCompactor(digest_min_chars=100)
    new, status = layered.compact_deterministic(messages, limit=10**6, counter=COUNTER)
    assert isinstance(status, Applied)
    assert status.layers[0] == "digest"
    digested = [r.content for m in new for r in m.tool_results]
    # Earlier turns' results are one line; the latest turn's is kept whole.
    assert all("\n" not in c for c in digested[:-1])
    assert digested[-1] == messages[-2].tool_results[0].content or "\n" in digested[-1]
    with pytest.raises(ConfigError):
        LayeredCompactor(digest_min_chars=0)


def test_an_incremental_collapse_counts_the_turns_it_folds_in() -> None:
    def turns(a: int, b: int) -> list[Message]:
        out: list[Message] = []
        for i in range(a, b):
            out.append(Message.user(f"q{i} fact {1000 + i} " + "q" * 400, id=f"u{i}"))
            out.append(Message.assistant(f"a{i} " + "a" * 400, id=f"a{i}"))
        return out

    layered = LayeredCompactor(model=ExtractiveSummaryModel())
    first = run(layered, turns(0, 25), 3_000)
    assert first.messages[0].text.startswith(
        "[Conversation summary of 15 earlier turns]\n"
    )
    second = run(layered, [*first.messages, *turns(25, 30)], 3_000)
    assert second.messages[0].text.startswith(
        "[Conversation summary of 20 earlier turns]\n"
    )


def test_the_budget_layer_leaves_a_cut_result_alone() -> None:
    messages = conversation(3, result=lambda i: "r" * 9_000)
    layered = LayeredCompactor()
    once = layered.apply_budget(messages)
    twice = layered.apply_budget(once)
    assert same(twice, once)
    _new, status = layered.compact_deterministic(once, limit=10**6, counter=COUNTER)
    assert status == Applied(
        layers=(), tokens_before=COUNTER.count(once), tokens_after=COUNTER.count(once)
    )


@pytest.mark.parametrize("value", [None, -1, 1.5, True, "100"])
def test_limits_are_checked(value: object) -> None:
    layered = LayeredCompactor(model=ExtractiveSummaryModel())
    messages = conversation(2)
    with pytest.raises(ConfigError) as info:
        layered.compact_deterministic(messages, limit=value)  # type: ignore[arg-type]
    assert info.value.field == "limit"
    for field in ("line", "limit", "window"):
        options: dict[str, object] = {"line": 0, "limit": 100, field: value}
        with pytest.raises(ConfigError) as info:
            anyio.run(functools.partial(layered.manual_compact, messages, **options))  # type: ignore[arg-type]
        assert info.value.field == field


@pytest.mark.parametrize(
    ("field", "value"),
    [("counter", "tiktoken"), ("counter", 42), ("circuit_open", "false")],
)
def test_the_counter_and_the_breaker_are_checked(field: str, value: object) -> None:
    # A counter by name raised TypeError deep in the count, and "false" read
    # as an open breaker: every pass failed fast, the model never asked.
    layered = LayeredCompactor(model=ExtractiveSummaryModel())
    messages = conversation(2)
    options: dict[str, object] = {"line": 0, "limit": 100, field: value}
    with pytest.raises(ConfigError) as info:
        anyio.run(functools.partial(layered.manual_compact, messages, **options))  # type: ignore[arg-type]
    assert (info.value.field, info.value.value) == (field, value)
    if field == "counter":
        with pytest.raises(ConfigError) as info:
            layered.compact_deterministic(messages, limit=100, counter=value)  # type: ignore[arg-type]
        assert (info.value.field, info.value.value) == (field, value)


@pytest.mark.anyio
async def test_layers_four_and_five_are_callable_on_their_own() -> None:
    from turnfsm.context import CompactionContext
    from turnfsm.core import CompactReason
    from turnfsm.testing import ExtractiveSummaryModel
    from turnfsm.tokens import HeuristicTokenCounter

    messages = [
        m
        for i in range(14)
        for m in (
            Message.user(f"step {i}: the code is {1000 + i}"),
            Message.assistant(f"ok {i}"),
        )
    ]
    layered = LayeredCompactor(model=ExtractiveSummaryModel())
    counter = HeuristicTokenCounter()
    ctx = CompactionContext(
        tokens_before=counter.count(messages),
        reason=CompactReason.MANUAL,
        context_window=0,
        turn=0,
        counter=counter,
    )
    collapsed = await layered.apply_collapse(messages, ctx)
    assert collapsed[0].text.startswith("[Conversation summary of 4 earlier turns]")
    assert collapsed[1:] == tuple(messages[8:])  # the newest 10 exchanges kept
    full = await layered.apply_autocompact(messages, ctx)
    assert full[0].text.startswith("[Full conversation summary]")
    assert full[1:] == tuple(messages[-2:])  # the newest exchange kept
    short = messages[:4]
    assert await layered.apply_collapse(short, ctx) == tuple(short)  # nothing to do
