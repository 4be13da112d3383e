"""SummarizingCompactor: split, transcript, prompt and checks (seeds 000, 004)."""

from __future__ import annotations

from collections.abc import Sequence

import anyio
import pytest

from tests.helpers import compaction_context as ctx_for
from turnfsm.context import (
    SUMMARY_PREFIX,
    SUMMARY_SECTIONS,
    CompactionProposal,
    SummarizingCompactor,
    handle,
    recall_note,
    replaced_ids,
)
from turnfsm.context._transcript import (
    SUMMARY_KEY,
    TRUNCATION_MARK,
    clip,
    render_message,
    summary_id,
    summary_prompt,
)
from turnfsm.errors import ConfigError, ProviderError
from turnfsm.messages import SUMMARY_COVERS, Message, Role
from turnfsm.providers import ModelRequest, ModelResponse
from turnfsm.testing import ExtractiveSummaryModel, FakeModelClient, check_compactor
from turnfsm.testing import tool_call as call
from turnfsm.tokens import HeuristicTokenCounter

COUNTER = HeuristicTokenCounter()


def run(
    compactor: SummarizingCompactor, messages: Sequence[Message], **ctx: object
) -> CompactionProposal:
    async def go() -> CompactionProposal:
        return await compactor.compact(messages, 0, ctx_for(messages, **ctx))  # type: ignore[arg-type]

    return anyio.run(go)


def conversation(turns: int, *, system: bool = True) -> list[Message]:
    """`turns` user turns, each: user, a read_file call, its result, an answer."""
    out = [Message.system("You are a careful agent.", id="sys")] if system else []
    for i in range(turns):
        out.append(Message.user(f"question {i}: file f{i}.txt", id=f"u{i}"))
        read = call("read_file", f"c{i}", path=f"f{i}.txt")
        out.append(Message.assistant("let me look", tool_calls=[read], id=f"a{i}"))
        out.append(Message.tool_result(f"c{i}", f"contents {i} " * 200, id=f"r{i}"))
        out.append(Message.assistant(f"answer {i}", id=f"z{i}"))
    return out


# -- the transcript -------------------------------------------------------------
@pytest.mark.parametrize(
    ("length", "head", "tail", "cut"),
    [
        (7_500, 6_000, 1_500, False),
        (7_501, 6_000, 1_500, True),
        (5_500, 4_000, 1_500, False),
        (5_501, 4_000, 1_500, True),
        (1_200, 1_200, 0, False),
        (1_201, 1_200, 0, True),
    ],
)
def test_clip_keeps_head_and_tail_at_the_boundaries(
    length: int, head: int, tail: int, cut: bool
) -> None:
    text = "".join(chr(ord("a") + i % 26) for i in range(length))
    clipped = clip(text, head, tail)
    if not cut:
        assert clipped == text
    else:
        assert clipped == text[:head] + TRUNCATION_MARK + (text[-tail:] if tail else "")


def test_clip_counts_characters_not_bytes() -> None:
    text = "日" * 7_500  # 22,500 bytes in UTF-8
    assert clip(text, 6_000, 1_500) == text
    assert clip(text + "é", 6_000, 1_500).count(TRUNCATION_MARK) == 1


def test_transcript_labels() -> None:
    assert render_message(Message.user("hi")) == "[USER]: hi"
    assert render_message(Message.system("rules")) == "[SYSTEM]: rules"
    assert render_message(Message.assistant("ok")) == "[ASSISTANT]: ok"
    assistant = Message.assistant(
        "reading", tool_calls=[call("read_file", "tc_1", path="a")]
    )
    assert render_message(assistant) == (
        '[ASSISTANT]: reading\n[Tool calls: read_file({"path":"a"}) #tc_1]'
    )
    assert render_message(Message.tool_result("tc_1", "42")) == "[TOOL RESULT tc_1]: 42"
    error = Message.tool_result("tc_2", "boom", is_error=True)
    assert render_message(error) == "[TOOL RESULT tc_2] (error): boom"


def test_transcript_truncates_messages_results_and_arguments() -> None:
    long_text = "m" * 6_000 + "M" * 5_000
    rendered = render_message(Message.user(long_text))
    assert rendered == "[USER]: " + "m" * 6_000 + TRUNCATION_MARK + "M" * 1_500
    result = render_message(Message.tool_result("t", "r" * 4_000 + "R" * 9_000))
    assert result == "[TOOL RESULT t]: " + "r" * 4_000 + TRUNCATION_MARK + "R" * 1_500
    big = Message.assistant(tool_calls=[call("write", "w1", text="x" * 5_000)])
    line = render_message(big).splitlines()[1]
    assert line.startswith('[Tool calls: write({"text":"xxx')
    assert "...[truncated]..." in render_message(big)
    assert len(line) < 1_300


# -- the prompt -------------------------------------------------------------
def test_first_and_iterative_prompts() -> None:
    first = summary_prompt("[USER]: hi", previous=None, max_tokens=1_000)
    assert "Create a structured checkpoint summary" in first
    assert "PREVIOUS SUMMARY:" not in first
    update = summary_prompt("[USER]: hi", previous="## Goal\nship", max_tokens=1_000)
    assert "PREVIOUS SUMMARY:\n## Goal\nship" in update
    assert "NEW TURNS TO INCORPORATE:\n[USER]: hi" in update
    assert update.index("PREVIOUS SUMMARY:") < update.index("NEW TURNS TO INCORPORATE:")
    for prompt in (first, update):
        template = prompt[prompt.index("Write the summary under") :]
        positions = [template.index(f"## {s}") for s in SUMMARY_SECTIONS]
        assert positions == sorted(positions)
        assert "numbers, names" in prompt


def test_the_template_has_the_13_sections_in_the_seed_order() -> None:
    assert SUMMARY_SECTIONS == (
        "Active Task",
        "Goal",
        "Constraints & Preferences",
        "Completed Actions",
        "Active State",
        "In Progress",
        "Blocked",
        "Key Decisions",
        "Resolved Questions",
        "Pending User Asks",
        "Relevant Files",
        "Remaining Work",
        "Critical Context",
    )


def test_hook_guidance_reaches_the_prompt() -> None:
    prompt = summary_prompt(
        "t",
        previous=None,
        max_tokens=9,
        instructions=("keep paths",),
        additional_context=("ctx",),
    )
    assert "ADDITIONAL INSTRUCTIONS:\nkeep paths" in prompt
    assert "ADDITIONAL CONTEXT:\nctx" in prompt


# -- the split -------------------------------------------------------------
def test_plan_keeps_the_last_four_turns_and_the_system_prompt() -> None:
    messages = conversation(6)
    plan = SummarizingCompactor(model=ExtractiveSummaryModel()).plan(messages)
    assert [m.id for m in plan.head] == ["sys"]
    assert [m.id for m in plan.summarised] == [
        "u0",
        "a0",
        "r0",
        "z0",
        "u1",
        "a1",
        "r1",
        "z1",
    ]
    assert plan.kept[0].id == "u2"
    assert plan.kept[-1].id == "z5"


def test_one_long_exchange_has_nothing_to_summarise() -> None:
    messages = [Message.user("do the task", id="u")]
    for i in range(10):
        messages.append(
            Message(role=Role.ASSISTANT, parts=(call("t", f"c{i}"),), id=f"a{i}")
        )
        messages.append(Message.tool_result(f"c{i}", f"out {i}", id=f"r{i}"))
    plan = SummarizingCompactor(keep_recent_turns=2).plan(messages)
    # Two exchanges asked, one exists: it is kept whole, never split.
    assert plan.summarised == ()
    assert plan.kept == tuple(messages)


@pytest.mark.parametrize(
    ("ids", "keep", "summarised"),
    [
        # The newest exchange alone: nothing to summarise (it was [a1]).
        (["u0", "a1", "a2", "a3"], 1, []),
        (["sys", "u0", "a1", "a2", "a3"], 1, []),
        (["u0", "a1", "u2", "a3", "a4", "a5"], 1, ["u0", "a1"]),
        (["u0", "a1", "u2", "a3", "a4", "a5"], 2, []),
        (["u0", "u1", "a2", "a3", "a4"], 1, ["u0"]),
        (["a0", "u1", "a2"], 1, []),  # before the first user message: oldest
        (["a0", "u1", "a2", "u3", "a4"], 1, ["a0", "u1", "a2"]),
    ],
)
def test_the_cut_walks_back_to_a_user_message(
    ids: list[str], keep: int, summarised: list[str]
) -> None:
    make = {"s": Message.system, "u": Message.user, "a": Message.assistant}
    messages = [make[i[0]](f"text {i}", id=i) for i in ids]
    model = FakeModelClient(lambda _request: "the summary")
    compactor = SummarizingCompactor(model=model, keep_recent_turns=keep)

    plan = compactor.plan(messages)
    out = run(compactor, messages)

    assert [m.id for m in plan.summarised] == summarised
    kept = [m.id for m in out.messages if m.id in ids]
    assert kept == [i for i in ids if i not in summarised]  # in their order
    if not summarised:
        assert out.messages == tuple(messages)
        assert not model.requests


def long_exchange(calls: int = 10) -> list[Message]:
    """One request answered by `calls` tool calls, each with its result."""
    messages = [Message.user("do the task", id="u")]
    for i in range(calls):
        messages.append(
            Message(role=Role.ASSISTANT, parts=(call("t", f"c{i}"),), id=f"a{i}")
        )
        messages.append(Message.tool_result(f"c{i}", f"out {i}", id=f"r{i}"))
    return messages


def test_compact_newest_exchange_summarises_inside_it_in_order() -> None:
    messages = [Message.system("rules", id="sys"), *long_exchange()]
    compactor = SummarizingCompactor(
        model=ExtractiveSummaryModel(),
        keep_recent_turns=2,
        compact_newest_exchange=True,
    )

    plan = compactor.plan(messages)
    out = run(compactor, messages)

    assert [m.id for m in plan.opening] == ["u"]
    assert [m.id for m in plan.kept] == ["a8", "r8", "a9", "r9"]
    assert plan.summarised[0].id == "a0"
    assert plan.summarised[-1].id == "r7"
    ids = [m.id for m in out.messages]
    # The request, then the summary of what followed it, then the last ones.
    assert ids[:2] == ["sys", "u"]
    assert out.messages[2].metadata[SUMMARY_COVERS] == "r7"
    assert ids[3:] == ["a8", "r8", "a9", "r9"]
    # A second pass finds nothing new.
    assert not compactor.plan(out.messages).summarised


def test_compact_newest_exchange_with_earlier_exchanges_summarises_them_too() -> None:
    earlier = [Message.user("hi", id="u0"), Message.assistant("hello", id="z0")]
    messages = [*earlier, *long_exchange(3)]
    compactor = SummarizingCompactor(keep_recent_turns=1, compact_newest_exchange=True)

    plan = compactor.plan(messages)

    assert [m.id for m in plan.summarised] == ["u0", "z0", "a0", "r0", "a1", "r1"]
    assert [m.id for m in plan.opening] == ["u"]
    assert [m.id for m in plan.kept] == ["a2", "r2"]  # 2 * keep_recent_turns


def test_compact_newest_exchange_never_splits_a_tool_pair() -> None:
    messages = long_exchange(3)
    # The last two messages are the answer to one call of a parallel pair.
    messages[-2] = Message(
        role=Role.ASSISTANT, parts=(call("t", "c2"), call("t", "c3")), id="a2"
    )
    messages[-1] = Message.tool_result("c2", "out 2", id="r2")
    messages.append(Message.tool_result("c3", "out 3", id="r3"))
    plan = SummarizingCompactor(keep_recent_turns=1, compact_newest_exchange=True).plan(
        messages
    )
    assert [m.id for m in plan.kept] == ["a2", "r2", "r3"]


def test_the_cut_never_splits_a_tool_pair() -> None:
    messages = [Message.user("go", id="u0")]
    messages.append(
        Message(role=Role.ASSISTANT, parts=(call("t", "c1"), call("t", "c2")), id="a")
    )
    messages.append(Message.tool_result("c1", "one", id="r1"))
    messages.append(Message.user("and?", id="u1"))  # injected mid-batch
    messages.append(Message.tool_result("c2", "two", id="r2"))
    messages.append(Message.assistant("done", id="z"))
    plan = SummarizingCompactor(keep_recent_turns=1).plan(messages)
    kept = {m.id for m in plan.kept}
    assert ("a" in kept) == ("r2" in kept)


def test_every_message_is_in_exactly_one_part() -> None:
    messages = conversation(7)
    plan = SummarizingCompactor().plan(messages)
    ids = [
        m.id
        for part in (plan.head, plan.previous, plan.summarised, plan.kept)
        for m in part
    ]
    assert sorted(ids) == sorted(m.id for m in messages)


# -- the pass -------------------------------------------------------------
def test_a_pass_injects_one_summary_after_the_system_prompt() -> None:
    model = ExtractiveSummaryModel()
    messages = conversation(6)
    out = run(SummarizingCompactor(model=model), messages)
    assert out.error is None
    summary = out.messages[1]
    assert out.messages[0].id == "sys"
    assert summary.role is Role.SYSTEM
    assert summary.text.startswith(SUMMARY_PREFIX)
    assert summary.metadata[SUMMARY_COVERS] == "z1"
    assert summary.metadata[SUMMARY_KEY] == "ses_1:z1:8"
    assert summary.id == summary_id("ses_1:z1:8")
    assert [m.id for m in out.messages[2:]] == [m.id for m in messages[9:]]
    assert out.tokens_after == COUNTER.count(out.messages) < out.tokens_before
    (request,) = model.requests
    assert request.temperature == 0.3
    assert request.tools == ()
    assert request.system is None
    assert [m.role for m in request.messages] == [Role.USER]
    assert request.max_tokens == 625  # 1,000 counted tokens, asked as 5/8 of it
    assert "[USER]: question 0" in request.messages[0].text
    assert "[TOOL RESULT c1]" in request.messages[0].text


def test_the_summary_role_can_be_user() -> None:
    out = run(
        SummarizingCompactor(model=ExtractiveSummaryModel(), summary_role="user"),
        conversation(6),
    )
    assert out.messages[1].role is Role.USER


def test_nothing_to_summarise_returns_the_input_without_a_model_call() -> None:
    model = ExtractiveSummaryModel()
    messages = conversation(4)  # four turns, all kept
    out = run(SummarizingCompactor(model=model), messages)
    assert list(out.messages) == messages
    assert out.tokens_after == out.tokens_before
    assert model.requests == []


def test_a_second_pass_updates_the_summary_incrementally() -> None:
    model = ExtractiveSummaryModel()
    compactor = SummarizingCompactor(model=model)
    first = run(compactor, conversation(6))
    grown = list(first.messages)
    for i in range(6, 9):
        grown += [
            Message.user(f"question {i}", id=f"u{i}"),
            Message.assistant(f"answer {i} code 77{i}", id=f"z{i}"),
        ]
    second = run(compactor, grown)
    assert second.error is None
    prompt = model.requests[-1].messages[0].text
    assert "PREVIOUS SUMMARY:" in prompt
    assert "NEW TURNS TO INCORPORATE:" in prompt
    assert "question 0" not in prompt.split("NEW TURNS TO INCORPORATE:")[1]
    summaries = [m for m in second.messages if SUMMARY_COVERS in m.metadata]
    assert len(summaries) == 1
    assert summaries[0].metadata[SUMMARY_COVERS] == "z4"


def test_everything_already_summarised_keeps_the_existing_summary() -> None:
    model = ExtractiveSummaryModel()
    compactor = SummarizingCompactor(model=model)
    first = run(compactor, conversation(6))
    again = run(compactor, first.messages)
    assert list(again.messages) == list(first.messages)
    assert len(model.requests) == 1


def test_a_repeat_with_the_same_key_calls_no_model() -> None:
    model = ExtractiveSummaryModel()
    compactor = SummarizingCompactor(model=model)
    messages = conversation(6)
    first = run(compactor, messages)
    recorded = {m.id: m.text for m in first.messages if SUMMARY_COVERS in m.metadata}
    second = run(compactor, messages, summaries=recorded)
    assert [(m.id, m.text) for m in second.messages] == [
        (m.id, m.text) for m in first.messages
    ]
    assert len(model.requests) == 1
    # Another session: another key, another summary.
    run(compactor, messages, summaries=recorded, session_id="ses_2")
    assert len(model.requests) == 2


@pytest.mark.parametrize("text", ["", "   \n\t "])
def test_an_empty_summary_fails_the_pass(text: str) -> None:
    model = FakeModelClient(lambda _r: text)
    out = run(SummarizingCompactor(model=model), conversation(6))
    assert out.is_failed
    assert "empty summary" in (out.error or "")


def test_an_oversized_summary_is_re_asked_shorter() -> None:
    answers = iter(["word " * 400, "## Active Task\nshort"])
    model = FakeModelClient(lambda _r: next(answers))
    messages = conversation(6)
    out = run(SummarizingCompactor(model=model, max_summary_tokens=100), messages)
    assert out.error is None
    # The summary ends by naming the messages it stands for.
    by_id = {m.id: m for m in messages}
    covered = [by_id[i] for i in replaced_ids(out.messages[1])]
    calls = {c.id: c for m in messages for c in m.tool_calls}
    ends = [handle(covered[0], calls), handle(covered[-1], calls)]
    assert out.messages[1].text.endswith("short\n\n" + recall_note(ends))
    assert len(model.requests) == 2
    assert "rewrite it in under 100 tokens" in model.requests[1].messages[0].text


def test_a_summary_oversized_twice_fails_the_pass() -> None:
    model = FakeModelClient(lambda _r: "word " * 400)
    out = run(
        SummarizingCompactor(model=model, max_summary_tokens=100), conversation(6)
    )
    assert out.is_failed
    assert "over max_summary_tokens (100)" in (out.error or "")


def test_a_model_error_propagates_to_the_manager() -> None:
    def boom(_r: ModelRequest) -> ModelResponse:
        raise ProviderError("down", retryable=False, kind="server")

    with pytest.raises(ProviderError):
        run(SummarizingCompactor(model=FakeModelClient(boom)), conversation(6))


def test_without_a_model_the_pass_fails_and_says_why() -> None:
    out = run(SummarizingCompactor(), conversation(6))
    assert out.is_failed
    assert "no summary model" in (out.error or "")


def test_with_the_breaker_open_no_model_is_called() -> None:
    model = ExtractiveSummaryModel()
    messages = conversation(6)
    messages[3] = Message.tool_result("c0", "x" * 5_000, id="r0")
    out = run(SummarizingCompactor(model=model), messages, allow_model=False)
    assert model.requests == []
    assert out.error is None
    assert out.messages[3].tool_results[0].content.startswith("[read_file]")


def test_a_small_summary_window_chunks_then_resummarises() -> None:
    model = ExtractiveSummaryModel()
    compactor = SummarizingCompactor(
        model=model, summary_window=1_200, max_summary_tokens=200
    )
    out = run(compactor, conversation(14))
    assert out.error is None
    assert len(model.requests) >= 3
    final = model.requests[-1].messages[0].text
    assert "[SUMMARY OF PART 1]" in final
    for request in model.requests:
        assert COUNTER.count_text(request.messages[0].text) + 200 <= 1_200


def test_a_window_too_small_for_any_transcript_fails() -> None:
    compactor = SummarizingCompactor(
        model=ExtractiveSummaryModel(), summary_window=300, max_summary_tokens=200
    )
    out = run(compactor, conversation(6))
    assert out.is_failed
    assert "window" in (out.error or "")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("keep_recent_turns", 0),
        ("keep_recent_turns", True),
        ("max_summary_tokens", 15),
        ("max_summary_tokens", "1000"),
        ("summary_window", 0),
        ("summary_window", 1.5),
        ("summary_window", 10**40),  # can only be a mistake: no model has it
        ("max_summary_tokens", 10**40),  # it would be asked of the model as is
        ("summary_role", "assistant"),
        ("temperature", float("nan")),
        ("temperature", 3),
        ("digest_min_chars", 0),
        ("model", "gpt-4o"),
        ("compact_newest_exchange", 1),
        ("compact_newest_exchange", "no"),
    ],
)
def test_bad_settings_name_the_field(field: str, value: object) -> None:
    with pytest.raises(ConfigError) as info:
        SummarizingCompactor(**{field: value})  # type: ignore[arg-type]
    assert info.value.field == field


def test_it_keeps_the_compactor_contract() -> None:
    anyio.run(check_compactor, SummarizingCompactor(model=ExtractiveSummaryModel()))
