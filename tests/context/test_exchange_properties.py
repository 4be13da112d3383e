"""A pass never reorders what it keeps, and never splits the newest exchange.

Every shipped strategy runs on generated valid conversations (`histories`
repaired by `valid`): `TruncatingCompactor`, `SummarizingCompactor` and
`LayeredCompactor` with a scripted summary model, `ToolResultDigest`, and
`TokenSplitter`'s split, with ``keep_recent_turns`` (and the layered
compactor's exchange counts) >= 1. For each pass:

- the input messages it keeps appear in their original relative order;
- the newest exchange (the last user message and everything after it; the
  whole conversation when it has no user message) ends the result whole:
  every message of it, in order, unaltered. A pass that can only keep it
  whole and has nothing else to do is a no-op.

The layered compactor's layers 1 and 3 edit tool results in place (a cap, an
emptied result: seed 001), the newest exchange's too; there "unaltered"
means the same messages with at most those edits. Each pass also runs on its
own output, which carries its summary. With ``compact_newest_exchange`` a
strategy may compact inside the newest exchange, but still keeps what it
keeps in order, and the exchange's user message.
"""

from __future__ import annotations

from collections.abc import Coroutine, Sequence
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.generators import histories, valid
from tests.helpers import compaction_context as ctx_for
from tests.profiles import sized
from turnfsm.context import (
    CompactionProposal,
    LayeredCompactor,
    SummarizingCompactor,
    TokenSplitter,
    ToolResultDigest,
    TruncatingCompactor,
    replaced_ids,
    unmark,
)
from turnfsm.context._layered import TRUNCATION_SUFFIX
from turnfsm.context._transcript import turn_starts
from turnfsm.messages import Message, Role
from turnfsm.testing import FakeModelClient
from turnfsm.tokens import HeuristicTokenCounter

COUNTER = HeuristicTokenCounter()
EXAMPLES = sized(2_000)
"""Examples per strategy under the thorough profile."""

conversations = histories(max_messages=16).map(
    lambda drawn: valid(drawn) or [Message.user("hi", id="only")]
)
"""Valid conversations (`check_history` accepts them), never empty."""

# The issue's case: one exchange, three answers; keep_recent_turns=1 used to
# summarise a1 and keep [u0, a2, a3].
ONE_EXCHANGE = [
    Message.user("u0", id="u0"),
    Message.assistant("a1", id="a1"),
    Message.assistant("a2", id="a2"),
    Message.assistant("a3", id="a3"),
]


def drive(coro: Coroutine[Any, Any, CompactionProposal]) -> CompactionProposal:
    """Run a pass that never suspends (its model double does not await)."""
    try:
        coro.send(None)
    except StopIteration as done:
        outcome: CompactionProposal = done.value
        return outcome
    coro.close()
    raise AssertionError("the pass suspended")


def summary_model() -> FakeModelClient:
    """A scripted summary model: a short summary within any budget it is given."""
    return FakeModelClient(
        lambda request: "Goal: the task. " * (request.max_tokens // 8)
    )


def newest_exchange(messages: Sequence[Message]) -> tuple[Message, ...]:
    """The last user message (not a summary) and everything after it."""
    starts = turn_starts(messages)
    return tuple(messages[starts[-1] :]) if starts else tuple(messages)


def assert_kept_in_order(messages: Sequence[Message], out: Sequence[Message]) -> None:
    """The input messages `out` keeps (by id) come in their input order, once each."""
    position = {m.id: i for i, m in enumerate(messages)}
    assert len(position) == len(messages)  # generated ids are unique
    kept = [position[m.id] for m in out if m.id in position]
    assert kept == sorted(set(kept))


def assert_newest_whole(
    messages: Sequence[Message], out: Sequence[Message], *, edits: int | None = None
) -> None:
    """`out` ends with the newest exchange of `messages`, unaltered.

    With `edits` (the layered compactor's cap), a tool result may be capped
    at that many characters plus the suffix, or emptied; nothing else.
    """
    newest = newest_exchange(messages)
    assert len(out) >= len(newest)
    tail = out[len(out) - len(newest) :]
    for new, old in zip(tail, newest, strict=True):
        if edits is None or new is old:
            assert new is old
            continue
        # An edited result names its own message (the log keeps the original).
        assert replaced_ids(new) == (new.id,)
        plain = unmark([new])[0]
        assert (plain.id, plain.role, dict(plain.metadata)) == (
            old.id,
            old.role,
            dict(old.metadata),
        )
        assert new.role is Role.TOOL
        for a, b in zip(plain.tool_results, old.tool_results, strict=True):
            assert (a.call_id, a.is_error) == (b.call_id, b.is_error)
            assert a.content in (b.content, "", b.content[:edits] + TRUNCATION_SUFFIX)


def check_pass(
    messages: Sequence[Message],
    outcome: CompactionProposal,
    *,
    edits: int | None = None,
) -> tuple[Message, ...]:
    """Check one pass; return what replaces `messages` (the input when it failed)."""
    if outcome.is_failed:  # the manager keeps the input: a no-op
        assert "window" in (outcome.error or "")
        return tuple(messages)
    out = outcome.messages
    assert out
    assert_kept_in_order(messages, out)
    assert_newest_whole(messages, out, edits=edits)
    return out


# -- the strategies ---------------------------------------------------------------


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    messages=conversations,
    preserve_recent=st.integers(1, 5),
    min_messages=st.integers(2, 6),
)
def test_truncating(
    messages: list[Message], preserve_recent: int, min_messages: int
) -> None:
    compactor = TruncatingCompactor(
        preserve_recent=preserve_recent, min_messages=min_messages
    )
    out = check_pass(messages, drive(compactor.compact(messages, 0, ctx_for(messages))))
    check_pass(out, drive(compactor.compact(out, 0, ctx_for(out))))


@settings(max_examples=EXAMPLES, deadline=None)
@example(
    messages=ONE_EXCHANGE,
    keep=1,
    budget=1_000,
    window=None,
    role="system",
    digest=None,
)
@given(
    messages=conversations,
    keep=st.integers(1, 4),
    budget=st.sampled_from([16, 64, 1_000]),
    window=st.sampled_from([None, 450, 700, 2_000]),
    role=st.sampled_from(["system", "user"]),
    digest=st.sampled_from([None, 1]),
)
def test_summarizing(
    messages: list[Message],
    keep: int,
    budget: int,
    window: int | None,
    role: str,
    digest: int | None,
) -> None:
    model = summary_model()
    compactor = SummarizingCompactor(
        model=model,
        keep_recent_turns=keep,
        max_summary_tokens=budget,
        summary_window=window,
        summary_role=role,
        digest_min_chars=digest,
    )
    outcome = drive(compactor.compact(messages, 0, ctx_for(messages)))
    out = check_pass(messages, outcome)
    if out == tuple(messages):
        # Nothing to summarise (the newest exchanges are all there is): no call.
        assert outcome.is_failed or not model.requests
    check_pass(out, drive(compactor.compact(out, 0, ctx_for(out))))


def test_the_issues_case_is_a_no_op() -> None:
    model = summary_model()
    compactor = SummarizingCompactor(model=model, keep_recent_turns=1)
    outcome = drive(compactor.compact(ONE_EXCHANGE, 0, ctx_for(ONE_EXCHANGE)))
    assert outcome.messages == tuple(ONE_EXCHANGE)
    assert all(a is b for a, b in zip(outcome.messages, ONE_EXCHANGE, strict=True))
    assert not model.requests


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    messages=conversations,
    cap=st.integers(1, 3),  # generated results are 2-3 characters
    trim=st.integers(1, 3),
    preserved=st.integers(1, 3),
    budget=st.sampled_from([16, 64]),
    window=st.sampled_from([None, 450]),
    percent=st.integers(0, 100),
    allow_model=st.booleans(),
)
def test_layered(
    messages: list[Message],
    cap: int,
    trim: int,
    preserved: int,
    budget: int,
    window: int | None,
    percent: int,
    allow_model: bool,
) -> None:
    compactor = LayeredCompactor(
        model=summary_model(),
        max_tool_result_chars=cap,
        trim_turns=trim,
        preserved_turns=preserved,
        max_summary_tokens=budget,
        summary_window=window,
    )
    target = COUNTER.count(messages) * percent // 100

    def one(history: Sequence[Message]) -> tuple[Message, ...]:
        ctx = ctx_for(history, allow_model=allow_model)
        return check_pass(
            history, drive(compactor.compact(history, target, ctx)), edits=cap
        )

    one(one(messages))


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    messages=conversations,
    min_chars=st.integers(1, 3),
    keep=st.integers(1, 3),
)
def test_digest(messages: list[Message], min_chars: int, keep: int) -> None:
    compactor = ToolResultDigest(min_chars=min_chars, keep_recent_turns=keep)
    outcome = drive(compactor.compact(messages, 0, ctx_for(messages)))
    out = check_pass(messages, outcome)
    assert [m.id for m in out] == [m.id for m in messages]  # it drops nothing


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    messages=conversations,
    preserve_recent=st.integers(1, 5),
    min_messages=st.integers(2, 6),
)
def test_token_splitter(
    messages: list[Message], preserve_recent: int, min_messages: int
) -> None:
    split = TokenSplitter(
        preserve_recent=preserve_recent, min_messages=min_messages
    ).split(messages)
    assert split.to_compact + split.preserved == tuple(messages)
    # A compactor that replaces the old part keeps the newest exchange whole.
    assert_newest_whole(messages, split.preserved)


# -- compacting inside the newest exchange, when asked ---------------------------------


def assert_request_kept(messages: Sequence[Message], out: Sequence[Message]) -> None:
    """The newest exchange's user message and its last message are kept."""
    starts = turn_starts(messages)
    ids = [m.id for m in out]
    if starts:
        assert messages[starts[-1]].id in ids
    assert out[-1] is messages[-1]


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    messages=conversations,
    keep=st.integers(1, 4),
    preserve_recent=st.integers(1, 5),
    strategy=st.sampled_from(["truncating", "summarizing", "layered"]),
)
def test_compacting_inside_the_newest_exchange_keeps_order_and_the_request(
    messages: list[Message], keep: int, preserve_recent: int, strategy: str
) -> None:
    compactor: Any
    if strategy == "truncating":
        compactor = TruncatingCompactor(
            preserve_recent=preserve_recent, compact_newest_exchange=True
        )
    elif strategy == "summarizing":
        compactor = SummarizingCompactor(
            model=summary_model(), keep_recent_turns=keep, compact_newest_exchange=True
        )
    else:
        compactor = LayeredCompactor(
            model=summary_model(),
            preserved_turns=keep,
            max_tool_result_chars=10,
            compact_newest_exchange=True,
        )
    outcome = drive(compactor.compact(messages, 0, ctx_for(messages)))
    assert not outcome.is_failed, outcome.error
    out = outcome.messages
    assert_kept_in_order(messages, out)
    assert_request_kept(messages, out)
