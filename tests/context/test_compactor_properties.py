"""Properties of the shipped compactors over generated histories.

`SummarizingCompactor`, `LayeredCompactor` and `ToolResultDigest` run on
`histories()` (reused call ids, orphan results, pending calls) and on the
same histories repaired into valid ones. Whatever the input, a pass breaks
no tool pair the input had (`result_problem`), never returns an empty list,
never grows the conversation and never mutates its input.

The compactors never suspend with these model doubles, so most passes are
driven by hand (no event loop per example); one test runs through `anyio`.
CI (the "ci" profile) runs at least 10,000 examples per main property; the
"dev" profile keeps its own small count so local runs stay quick.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Coroutine, Sequence
from math import prod
from typing import Any

import anyio
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.generators import histories, valid
from tests.helpers import compaction_context as ctx_for
from tests.profiles import heavy, sized
from turnfsm.context import (
    REPLACES,
    SUMMARY_PREFIX,
    CompactionProposal,
    LayeredCompactor,
    SummarizingCompactor,
)
from turnfsm.context._digest import ToolResultDigest
from turnfsm.context._pairs import pair_tool_traffic, result_problem
from turnfsm.context._transcript import SUMMARY_KEY, is_summary, summary_prompt
from turnfsm.messages import (
    SUMMARY_COVERS,
    Message,
    Role,
    ToolCallPart,
    check_history,
)
from turnfsm.providers import ModelRequest
from turnfsm.testing import ExtractiveSummaryModel, FakeModelClient
from turnfsm.tokens import HeuristicTokenCounter

COUNTER = HeuristicTokenCounter()
SUMMARY = "Goal: finish the task. Done: steps 1-3."
"""What the cheap summary model always answers (well under 16 tokens)."""


# -- inputs ------------------------------------------------------------------
def repair(messages: Sequence[Message]) -> list[Message]:
    """A valid history from a generated one (`valid`), never empty."""
    return valid(messages) or [Message.user("hi", id="fix-empty")]


Case = tuple[list[Message], dict[str, Any]]
"""A conversation and the knobs of one pass over it."""


def cases(max_messages: int, **choices: Sequence[Any]) -> st.SearchStrategy[Case]:
    """A history, raw (often invalid) or repaired (valid), and a knob each.

    All the knobs (the repair flag too) come from one integer draw: per
    example that halves Hypothesis's overhead against one draw per knob,
    which keeps 10,000 examples a test affordable. It shrinks to the first
    choice of every knob.
    """
    choices = {"valid": (False, True), **choices}

    def decode(drawn: tuple[list[Message], int]) -> Case:
        messages, k = drawn
        knobs: dict[str, Any] = {}
        for name, values in choices.items():
            k, i = divmod(k, len(values))
            knobs[name] = values[i]
        return (repair(messages) if knobs.pop("valid") else messages), knobs

    size = prod(len(values) for values in choices.values())
    drawn = st.tuples(histories(max_messages=max_messages), st.integers(0, size - 1))
    return drawn.map(decode)


# -- running a pass ------------------------------------------------------------


def drive(coro: Coroutine[Any, Any, CompactionProposal]) -> CompactionProposal:
    """Run a pass that never suspends (its model doubles do not await)."""
    try:
        coro.send(None)
    except StopIteration as done:
        outcome: CompactionProposal = done.value
        return outcome
    coro.close()
    raise AssertionError("the pass suspended")


def cheap_model() -> FakeModelClient:
    return FakeModelClient(lambda _request: SUMMARY)


Snapshot = list[tuple[Message, object, dict[str, str], list[dict[str, object]]]]


def snapshot(messages: Sequence[Message]) -> Snapshot:
    """What a pass must leave as it was: the list, parts, metadata, arguments."""
    return [
        (
            m,
            m.parts,
            dict(m.metadata),
            [dict(p.arguments) for p in m.parts if isinstance(p, ToolCallPart)],
        )
        for m in messages
    ]


def assert_untouched(messages: Sequence[Message], before: Snapshot) -> None:
    assert len(messages) == len(before)
    for m, (old, parts, metadata, arguments) in zip(messages, before, strict=True):
        assert m is old
        assert m.parts is parts
        assert dict(m.metadata) == metadata
        assert [
            dict(p.arguments) for p in m.parts if isinstance(p, ToolCallPart)
        ] == arguments


def lone_ids(messages: Sequence[Message]) -> tuple[Counter[str], Counter[str]]:
    """Call ids of the lone calls and of the lone results of `messages`."""
    traffic = pair_tool_traffic(messages)
    calls = Counter(
        messages[r.message].parts[r.part].id  # type: ignore[union-attr]
        for r in traffic.lone_calls
    )
    results = Counter(
        messages[r.message].parts[r.part].call_id  # type: ignore[union-attr]
        for r in traffic.lone_results
    )
    return calls, results


def assert_pairs_safe(out: Sequence[Message], messages: Sequence[Message]) -> None:
    """`out` may replace `messages`: it breaks no pair and orphans nothing new."""
    if result_problem(messages, messages) is None:
        assert result_problem(out, messages) is None
    # Raw inputs may hold a pair with a message between its halves (always a
    # problem); then at least no new orphan, per call id, and no repeated id.
    out_calls, out_results = lone_ids(out)
    in_calls, in_results = lone_ids(messages)
    assert out_calls <= in_calls
    assert out_results <= in_results
    assert len({m.id for m in out}) == len(out)


def same(a: Sequence[Message], b: Sequence[Message]) -> bool:
    """Equal messages, metadata included (`Message.__eq__` ignores it)."""
    return len(a) == len(b) and all(
        x == y and dict(x.metadata) == dict(y.metadata)
        for x, y in zip(a, b, strict=True)
    )


def test_repaired_histories_are_valid() -> None:
    @settings(max_examples=sized(500), deadline=None)
    @given(histories(max_messages=16))
    def check(messages: list[Message]) -> None:
        repaired = repair(messages)
        check_history(repaired)
        assert result_problem(repaired, repaired) is None

    check()


# -- SummarizingCompactor ------------------------------------------------------


SUMMARIZER_KNOBS: dict[str, Sequence[Any]] = {
    "keep_recent_turns": range(1, 6),
    "max_summary_tokens": (16, 24, 48),
    "summary_role": ("system", "user"),
    "digest_min_chars": (None, 1, 2, 3),
    "compact_newest_exchange": (False, True),
}


def assert_partition(messages: Sequence[Message], compactor: Any) -> Any:
    """Every input message is in exactly one part of the plan, in order."""
    plan = compactor.plan(messages)
    parts = (plan.head, plan.opening, plan.previous, plan.summarised, plan.kept)
    assert sum(map(len, parts)) == len(messages)
    assert Counter(m.id for p in parts for m in p) == Counter(m.id for m in messages)
    position = {id(m): i for i, m in enumerate(messages)}
    assert sorted(position[id(m)] for p in parts for m in p) == list(
        range(len(messages))
    )
    assert plan.head == tuple(messages[: len(plan.head)])
    for part in (plan.summarised, plan.head + plan.opening + plan.kept):
        indices = [position[id(m)] for m in part]
        assert indices == sorted(indices)  # what is kept stays in order
    return plan


@heavy(10_000)
@given(case=cases(16, **SUMMARIZER_KNOBS))
def test_summarizing_pass_is_complete_safe_and_idempotent(case: Case) -> None:
    messages, knobs = case
    model = cheap_model()
    compactor = SummarizingCompactor(model=model, **knobs)
    before = snapshot(messages)

    outcome = drive(compactor.compact(messages, 0, ctx_for(messages)))
    out = outcome.messages
    plan = assert_partition(messages, compactor)

    assert not outcome.is_failed, outcome.error
    assert out
    assert all(m.parts for m in out)
    assert len(out) <= len(messages)
    assert_pairs_safe(out, messages)
    assert outcome.tokens_after == COUNTER.count(out)
    if not plan.summarised:
        assert not model.requests
        assert out == tuple(messages)
        assert all(a is b for a, b in zip(out, messages, strict=True))
        assert_untouched(messages, before)
        return
    # head + one summary + kept, after exactly one cheap summary call
    assert len(model.requests) == 1
    request: ModelRequest = model.requests[0]
    assert len(request.messages) == 1
    assert not request.tools
    assert request.max_tokens is not None
    assert request.max_tokens <= knobs["max_summary_tokens"]  # the reply budget
    n = len(plan.head) + len(plan.opening)
    lead = plan.head + plan.opening
    assert all(a is b for a, b in zip(out[:n], lead, strict=True))
    summary = out[n]
    assert all(a is b for a, b in zip(out[n + 1 :], plan.kept, strict=True))
    assert len(out) == n + 1 + len(plan.kept)
    assert summary.role.value == knobs["summary_role"]
    # The summary, then the note naming what it replaced (for recall).
    body = f"{SUMMARY_PREFIX}\n\n{SUMMARY}"
    assert summary.text.startswith(body)
    note = summary.text[len(body) :]
    assert re.fullmatch(r"\n\n\[recall [^ .\]]+(\.\.[^ .\]]+)?\]", note), note
    assert summary.metadata[REPLACES].split() == [m.id for m in plan.summarised]
    assert summary.metadata[SUMMARY_COVERS] == plan.summarised[-1].id
    assert summary.metadata[SUMMARY_KEY] == plan.key("ses_1")
    assert summary.id not in {m.id for m in messages}

    # The recorded summary is reused: same messages, no model call.
    recorded = {summary.id: summary.text}
    again = drive(compactor.compact(messages, 0, ctx_for(messages, summaries=recorded)))
    assert same(again.messages, out)
    assert [m.text for m in again.messages] == [m.text for m in out]
    assert len(model.requests) == 1

    assert_untouched(messages, before)
    assert_own_output_is_final(compactor, out)


def assert_own_output_is_final(compactor: SummarizingCompactor, out: Any) -> None:
    """A pass on its own output finds nothing new: no call, no change."""
    model = compactor.model
    assert isinstance(model, FakeModelClient)
    calls = len(model.requests)
    own = drive(compactor.compact(out, 0, ctx_for(out)))
    assert not own.is_failed
    assert len(model.requests) == calls
    assert same(own.messages, out)
    assert not compactor.plan(out).summarised


# The smallest case: two turns, the last one a user message and three more.
_ONE_TURN_KEPT = [
    Message.user("t1", id="m0"),
    Message.user("t2", id="m1"),
    Message.assistant("t3", id="m2"),
    Message.assistant("t4", id="m3"),
    Message.assistant("t5", id="m4"),
]


@settings(max_examples=sized(1_000), deadline=None)
@example(case=(_ONE_TURN_KEPT, {"keep_recent_turns": 1}))
@given(case=cases(16, **{**SUMMARIZER_KNOBS, "keep_recent_turns": (1,)}))
def test_summarizing_keeping_one_turn_its_own_output_is_final(case: Case) -> None:
    messages, knobs = case
    compactor = SummarizingCompactor(model=cheap_model(), **knobs)
    out = drive(compactor.compact(messages, 0, ctx_for(messages)))
    assert not out.is_failed
    assert_own_output_is_final(compactor, out.messages)


@heavy(2_000)
@given(case=cases(16, **SUMMARIZER_KNOBS))
def test_summarizing_with_the_breaker_open_calls_no_model(case: Case) -> None:
    messages, knobs = case
    model = cheap_model()
    compactor = SummarizingCompactor(model=model, **knobs)
    before = snapshot(messages)

    ctx = ctx_for(messages, allow_model=False)
    outcome = drive(compactor.compact(messages, 0, ctx))

    assert not model.requests
    assert not outcome.is_failed
    out = outcome.messages
    assert [m.id for m in out] == [m.id for m in messages]
    assert [m.role for m in out] == [m.role for m in messages]
    assert_pairs_safe(out, messages)
    assert_untouched(messages, before)


@settings(max_examples=sized(300), deadline=None)
@given(
    messages=histories(max_messages=12) | histories(max_messages=12).map(repair),
    keep=st.integers(1, 5),
    budget=st.integers(100, 300),  # the extractive form's headings need ~100
    window=st.none() | st.integers(0, 400),  # extra room over the bare prompt
)
def test_summarizing_with_an_extractive_model_through_an_event_loop(
    messages: list[Message], keep: int, budget: int, window: int | None
) -> None:
    model = ExtractiveSummaryModel()
    bare = COUNTER.count_text(summary_prompt("", previous=None, max_tokens=budget))
    compactor = SummarizingCompactor(
        model=model,
        keep_recent_turns=keep,
        max_summary_tokens=budget,
        summary_window=None if window is None else bare + budget + window,
    )
    before = snapshot(messages)

    async def go(history: Sequence[Message]) -> CompactionProposal:
        return await compactor.compact(history, 0, ctx_for(history))

    outcome = anyio.run(go, messages)
    assert_untouched(messages, before)
    plan = compactor.plan(messages)
    if outcome.is_failed:  # only chunking into a tight window may give up
        assert window is not None
        assert plan.summarised
        assert "window" in str(outcome.error)
        return
    out = outcome.messages
    assert out
    assert_pairs_safe(out, messages)
    if not plan.summarised:
        assert not model.requests
        assert out == tuple(messages)
        return
    assert model.requests
    summary = out[len(plan.head)]
    assert is_summary(summary)
    body = summary.text.removeprefix(f"{SUMMARY_PREFIX}\n\n")
    assert COUNTER.count_text(body) <= budget  # never committed oversized
    for request in model.requests:
        assert request.max_tokens is not None
        assert request.max_tokens <= budget
        if compactor.summary_window is not None:  # the prompt and reply fit
            prompt = COUNTER.count_text(request.messages[0].text)
            assert prompt + request.max_tokens <= compactor.summary_window
    calls = len(model.requests)
    own = anyio.run(go, out)
    assert len(model.requests) == calls
    assert same(own.messages, out)


# -- LayeredCompactor ------------------------------------------------------------

LAYERED_KNOBS: dict[str, Sequence[Any]] = {
    "max_tool_result_chars": range(1, 4),  # generated results: 2-3 chars
    "trim_turns": range(1, 4),
    "preserved_turns": range(1, 4),
    "max_summary_tokens": (16, 48),
}


@heavy(10_000)
@given(case=cases(16, **LAYERED_KNOBS, percent=range(101), allow_model=(True, False)))
def test_layered_pass_is_safe_bounded_and_deterministic(case: Case) -> None:
    messages, knobs = case
    target = COUNTER.count(messages) * knobs.pop("percent") // 100  # 0..count
    allow_model = knobs.pop("allow_model")
    before = snapshot(messages)

    def run() -> tuple[CompactionProposal, FakeModelClient]:
        model = cheap_model()
        compactor = LayeredCompactor(model=model, **knobs)
        ctx = ctx_for(messages, allow_model=allow_model)
        return drive(compactor.compact(messages, target, ctx)), model

    outcome, model = run()
    out = outcome.messages

    assert not outcome.is_failed, outcome.error
    assert out
    assert all(m.parts for m in out)
    assert len(out) <= len(messages)
    assert_pairs_safe(out, messages)
    assert outcome.tokens_after == COUNTER.count(out)
    if not allow_model:  # layers 1-3 only: every message stays, in place
        assert not model.requests
        assert len(out) == len(messages)
        for new, old in zip(out, messages, strict=True):
            assert (new.id, new.role, len(new.parts)) == (
                old.id,
                old.role,
                len(old.parts),
            )
            if new.role is not Role.TOOL:
                assert new is old
            assert [(p.call_id, p.is_error) for p in new.tool_results] == [
                (p.call_id, p.is_error) for p in old.tool_results
            ]
    elif len(out) < len(messages):
        assert model.requests
    assert_untouched(messages, before)

    # The same input gives the same output, with the same calls.
    second, model2 = run()
    assert same(second.messages, out)
    assert [m.text for m in second.messages] == [m.text for m in out]
    assert len(model2.requests) == len(model.requests)


# -- ToolResultDigest ------------------------------------------------------------


@heavy(10_000)
@given(
    case=cases(
        16,
        min_chars=range(1, 4),  # generated results are 2-3 characters
        keep_recent_turns=range(4),
    )
)
def test_digest_keeps_every_message_and_is_idempotent(case: Case) -> None:
    messages, knobs = case
    compactor = ToolResultDigest(**knobs)
    before = snapshot(messages)

    outcome = drive(compactor.compact(messages, 0, ctx_for(messages)))
    out = outcome.messages

    assert not outcome.is_failed
    assert len(out) == len(messages)
    assert [m.id for m in out] == [m.id for m in messages]
    assert result_problem(out, messages) == result_problem(messages, messages)
    assert_pairs_safe(out, messages)
    assert_untouched(messages, before)

    again = drive(compactor.compact(out, 0, ctx_for(out)))
    assert same(again.messages, out)
    assert all(a is b for a, b in zip(again.messages, out, strict=True))
