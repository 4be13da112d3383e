"""Every replacement a shipped strategy makes names what it covers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import anyio
import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.generators import histories, valid
from tests.helpers import compaction_context as ctx_for
from tests.profiles import sized
from turnfsm.context import (
    REPLACES,
    STRATEGIES,
    CompactionProposal,
    ContextCompactor,
    MaskingCompactor,
    SummarizingCompactor,
    ToolResultDigest,
    TruncatingCompactor,
    call_handle,
    handle,
    mark_replacements,
    recall_note,
    replaced_ids,
    strategy_named,
    unmark,
)
from turnfsm.context._recall_marks import _MarkedCounter, _Marker
from turnfsm.messages import Message, Role, ToolCallPart
from turnfsm.testing import ExtractiveSummaryModel
from turnfsm.tokens import ConservativeTokenCounter

BIG = "x" * 5_000


def conversation(turns: int = 6) -> list[Message]:
    out = [Message.system("rules", id="sys")]
    for i in range(turns):
        out += [
            Message.user(f"task {i}", id=f"u{i}"),
            Message.assistant(
                tool_calls=[ToolCallPart(id=f"c{i}", name="read_file", arguments={})],
                id=f"a{i}",
            ),
            Message.tool_result(f"c{i}", f"result {i} " + BIG, id=f"r{i}"),
            Message.assistant(f"done {i}", id=f"z{i}"),
        ]
    return out


def strategies() -> list[ContextCompactor]:
    """Every shipped strategy (`STRATEGIES`), the summarising ones on a stand-in."""
    model = ExtractiveSummaryModel()
    own: dict[str, dict[str, Any]] = {"summarizing": {"keep_recent_turns": 1}}
    return [
        strategy_named(name, summary_model=model, **own.get(name, {}))
        for name in STRATEGIES
    ]


def run(
    compactor: ContextCompactor, messages: Sequence[Message], target: int = 0
) -> CompactionProposal:
    async def go() -> CompactionProposal:
        return await compactor.compact(messages, target, ctx_for(messages))

    return anyio.run(go)


def check_named(before: Sequence[Message], after: Sequence[Message]) -> None:
    """Each message of `after` is kept, or names what it covers (twice)."""
    by_id = {m.id: m for m in before}
    calls = {c.id: c for m in before for c in m.tool_calls}

    def _handle(message: Message) -> str:
        return handle(message, calls)

    for message in after:
        old = by_id.get(message.id)
        if old is not None and message == old:
            continue
        covered = replaced_ids(message)
        assert covered, f"{message.id} replaces something but names nothing"
        assert set(covered) <= set(by_id), "it names a message it was not given"
        if old is None:  # a summary: the messages dropped where it stands
            assert not set(covered) & {m.id for m in after}
            assert message.text.endswith(
                recall_note([_handle(by_id[covered[0]]), _handle(by_id[covered[-1]])])
                if len(covered) > 1
                else recall_note([_handle(by_id[covered[0]])])
            )
        else:  # a tool result it changed: its own message, by its call
            assert covered == (message.id,)
            for new, was in zip(message.tool_results, old.tool_results, strict=True):
                if new.content != was.content:
                    call = calls.get(new.call_id)
                    named = call_handle(call) if call else new.call_id
                    assert new.content.endswith(recall_note([named]))


@pytest.mark.parametrize("compactor", strategies(), ids=lambda c: type(c).__name__)
def test_every_shipped_strategy_names_what_it_replaces(
    compactor: ContextCompactor,
) -> None:
    messages = conversation()
    out = run(compactor, messages)
    assert out.error is None
    assert list(out.messages) != messages, "the pass changed nothing"
    check_named(messages, out.messages)
    # The notes count: the size reported is the marked result's.
    assert out.tokens_after == ctx_for(messages).counter.count(out.messages)


@pytest.mark.parametrize("compactor", strategies(), ids=lambda c: type(c).__name__)
def test_the_same_pass_writes_the_same_notes(compactor: ContextCompactor) -> None:
    messages = conversation()
    first, second = run(compactor, messages), run(compactor, messages)
    assert [(m.id, m.parts, dict(m.metadata)) for m in first.messages] == [
        (m.id, m.parts, dict(m.metadata)) for m in second.messages
    ]


@pytest.mark.parametrize(
    "compactor",
    [ToolResultDigest(), MaskingCompactor(), TruncatingCompactor()],
    ids=lambda c: type(c).__name__,
)
def test_a_pass_on_its_own_output_adds_no_second_note(
    compactor: ContextCompactor,
) -> None:
    once = run(compactor, conversation()).messages
    twice = run(compactor, once)
    for message in twice.messages:
        for part in message.tool_results:
            assert part.content.count("[recall ") <= 1
    if isinstance(compactor, ToolResultDigest):
        assert twice.tokens_after == twice.tokens_before
        assert all(a is b for a, b in zip(twice.messages, once, strict=True))


def test_a_digest_names_its_call_and_its_message() -> None:
    out = run(ToolResultDigest(), conversation(3)).messages
    digested = next(m for m in out if m.id == "r0")
    assert digested.metadata[REPLACES] == "r0"
    (call,) = out[2].tool_calls
    assert digested.tool_results[0].content.endswith(f" [recall {call_handle(call)}]")
    plain = unmark([digested])[0]
    assert plain.tool_results[0].content == "[read_file] returned 5009 chars, 1 line"
    assert REPLACES not in plain.metadata


def test_a_summary_names_the_range_it_covers() -> None:
    messages = conversation(4)
    out = run(
        SummarizingCompactor(model=ExtractiveSummaryModel(), keep_recent_turns=1),
        messages,
    ).messages
    (summary,) = [m for m in out if m.id not in {x.id for x in messages}]
    covered = replaced_ids(summary)
    assert covered[0] == "u0"
    assert covered[-1] == "z2"
    ends = [handle(messages[1]), handle(next(m for m in messages if m.id == "z2"))]
    assert summary.text.endswith(f"\n\n[recall {ends[0]}..{ends[1]}]")


def undecodable(turns: int = 6) -> list[Message]:
    """`conversation`, its words holding lone surrogates.

    What a tool gives for a file name or output that is not UTF-8, decoded
    the way Python decodes file names (``os.fsdecode``: ``\\udce9`` for a byte).
    """
    name = b"caf\xe9.txt".decode("utf-8", "surrogateescape")
    out: list[Message] = []
    for message in conversation(turns):
        if message.tool_calls:
            calls = [
                attrs.evolve(c, arguments={"path": name}) for c in message.tool_calls
            ]
            message = Message.assistant(
                f"reading {name}", tool_calls=calls, id=message.id
            )
        elif message.tool_results:
            (result,) = message.tool_results
            text = f"{name}: " + result.content
            message = Message.tool_result(result.call_id, text, id=message.id)
        elif message.role is Role.USER:
            message = Message.user(f"{message.text} on {name}", id=message.id)
        out.append(message)
    return out


@pytest.mark.parametrize("compactor", strategies(), ids=lambda c: type(c).__name__)
def test_words_with_lone_surrogates_are_named_too(compactor: ContextCompactor) -> None:
    messages = undecodable()
    out = run(compactor, messages)
    assert out.error is None
    assert list(out.messages) != messages, "the pass changed nothing"
    check_named(messages, out.messages)
    assert handle(messages[1]) != handle(conversation()[1])


def test_notes_name_one_message_or_a_range() -> None:
    assert recall_note(["a"]) == "[recall a]"
    assert recall_note(["a", "b", "c"]) == "[recall a..c]"
    with pytest.raises(ValueError, match="at least one"):
        recall_note([])


@settings(max_examples=sized(200), deadline=None)
@given(messages=histories(max_messages=16), keep=st.integers(0, 2))
def test_any_digest_is_named_and_unmarks_to_the_plain_pass(
    messages: list[Message], keep: int
) -> None:
    messages = valid(messages)
    if not messages:
        return
    big = [
        Message.tool_result(p.call_id, p.content + BIG, id=m.id)
        if m.role is Role.TOOL and len(m.tool_results) == 1
        else m
        for m in messages
        for p in (m.tool_results[:1] or [None])
    ]
    compactor = ToolResultDigest(min_chars=100, keep_recent_turns=keep)
    out = run(compactor, big)
    assert out.error is None
    check_named(big, out.messages)
    # Taking the notes off gives what the pass itself made of the input.
    plain = anyio.run(_plain, compactor, big)
    assert [(m.id, m.parts) for m in unmark(out.messages)] == [
        (m.id, m.parts) for m in plain
    ]
    assert mark_replacements(big, plain) == tuple(out.messages)


async def _plain(
    compactor: ToolResultDigest, messages: Sequence[Message]
) -> tuple[Message, ...]:
    return (await compactor._compact(messages, 0, ctx_for(messages))).messages


def test_the_marked_counter_counts_a_list_changed_in_place_anew() -> None:
    """It answers a repeat count from memory only for the same messages."""
    counter = ConservativeTokenCounter()
    plain = (Message.user("short", id="u1"), Message.assistant("ok", id="a1"))
    marked = _MarkedCounter(counter, _Marker(plain, plain))
    candidate = list(plain)
    assert marked.count(candidate) == counter.count(plain)

    candidate[1] = Message.assistant("a much longer answer " * 20, id="a2")
    fresh = _MarkedCounter(counter, _Marker(plain, plain))
    assert marked.count(candidate) == fresh.count(candidate)
    assert marked.count(candidate) > counter.count(plain)


def test_a_session_whose_id_holds_a_lone_surrogate_gets_its_summary() -> None:
    # A store holds any id of 1 to 200 characters, lone surrogates included.
    messages = conversation(4)
    compactor = SummarizingCompactor(
        model=ExtractiveSummaryModel(), keep_recent_turns=1
    )
    ctx = attrs.evolve(ctx_for(messages), session_id="ses_caf\udce9")

    out = anyio.run(compactor.compact, messages, 0, ctx)

    assert out.error is None
    assert any(m.id.startswith("sum_") for m in out.messages)
