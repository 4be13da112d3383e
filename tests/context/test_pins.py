"""Pins: no committed pass drops, alters or moves a pinned message.

The property runs every shipped strategy, and a careless user strategy that
drops, rewrites and swaps messages at random, through `ContextManager` over
generated histories (raw and repaired, some with calls still in flight),
with random pins: some messages pinned by hand (`Message.pin`), some by the
request (a pre-compact hook's ids), the rules switched on or off. Whatever
the pass proposes, a result the manager accepts keeps every pinned message
word for word and in order; a proposal that loses one is refused, and when
it is otherwise a valid conversation the refusal is `PinnedMessageLost`
naming the message.

The unit tests pin down the rules, `keep_pinned`, the splitter and the
settings' errors.
"""

from __future__ import annotations

import random
from collections.abc import Coroutine, Sequence
from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.generators import histories, valid
from tests.profiles import sized
from turnfsm.context import (
    CompactionContext,
    CompactionProposal,
    CompactionRequest,
    ContextCompactor,
    ContextManager,
    LayeredCompactor,
    MaskingCompactor,
    PinRules,
    SummarizingCompactor,
    TokenSplitter,
    ToolResultDigest,
    TruncatingCompactor,
    keep_pinned,
    pin_loss,
    pinned_ids,
)
from turnfsm.context._pairs import pair_tool_traffic, result_problem
from turnfsm.core import CompactionResult, CompactorFailed, CompactReason, PassEvent
from turnfsm.errors import ConfigError, PinnedMessageLost
from turnfsm.hooks import PreCompact
from turnfsm.messages import (
    PINNED,
    SUMMARY_COVERS,
    Message,
    Role,
    TextPart,
    ToolCallPart,
)
from turnfsm.testing import FakeModelClient
from turnfsm.tokens import HeuristicTokenCounter

COUNTER = HeuristicTokenCounter()
NO_RULES = PinRules(system_prompt=False, first_user=False, latest_user=False)


def drive(coro: Coroutine[Any, Any, PassEvent]) -> PassEvent:
    """Run a pass that never suspends (its model doubles do not await)."""
    try:
        coro.send(None)
    except StopIteration as done:
        event: PassEvent = done.value
        return event
    coro.close()
    raise AssertionError("the pass suspended")


def cheap_model() -> FakeModelClient:
    return FakeModelClient(lambda _request: "Goal: the task. Done: steps 1-3.")


@attrs.frozen
class OnSplitter:
    """A custom strategy built the documented way on `TokenSplitter`."""

    async def compact(
        self, messages: Sequence[Message], target: int, ctx: CompactionContext
    ) -> CompactionProposal:
        split = TokenSplitter(preserve_recent=1, min_messages=2).split(
            messages, ctx.pinned
        )
        if not split.to_compact:
            return CompactionProposal.unchanged(messages, ctx.tokens_before)
        summary = Message.system(
            f"summary of {len(split.to_compact)} messages",
            id=f"sum-{split.index}",
            metadata={SUMMARY_COVERS: split.to_compact[-1].id},
        )
        new = keep_pinned(messages, (summary, *split.preserved), ctx.pinned)
        return CompactionProposal.compacted(
            new, ctx.tokens_before, ctx.counter.count(new)
        )


def shipped() -> dict[str, ContextCompactor]:
    """Every shipped strategy, set to shrink as hard as it can."""
    return {
        "truncating": TruncatingCompactor(preserve_recent=1, min_messages=2),
        "truncating-newest": TruncatingCompactor(
            preserve_recent=1, min_messages=2, compact_newest_exchange=True
        ),
        "masking": MaskingCompactor(
            max_tool_result_chars=1,
            keep_recent_calls=0,
            mask_min_chars=1,
            preserve_recent=1,
        ),
        # No result may be cut: the newest replies' results are digested instead.
        "masking-uncut": MaskingCompactor(min_result_chars=10_000),
        "summarizing": SummarizingCompactor(
            model=cheap_model(), keep_recent_turns=1, digest_min_chars=1
        ),
        "summarizing-newest": SummarizingCompactor(
            model=cheap_model(), keep_recent_turns=1, compact_newest_exchange=True
        ),
        "summarizing-plain": SummarizingCompactor(
            model=cheap_model(), keep_recent_turns=1
        ),
        "layered": LayeredCompactor(
            model=cheap_model(),
            max_tool_result_chars=1,
            trim_turns=1,
            preserved_turns=1,
            digest_min_chars=1,
            compact_newest_exchange=True,
        ),
        "digest": ToolResultDigest(min_chars=1, keep_recent_turns=0),
        "splitter": OnSplitter(),
    }


SHIPPED = tuple(shipped())


class Careless:
    """A user strategy that drops, rewrites and swaps messages at random."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.proposed: tuple[Message, ...] = ()

    async def compact(
        self, messages: Sequence[Message], target: int, ctx: CompactionContext
    ) -> CompactionProposal:
        rng = self.rng
        out: list[Message] = []
        for message in messages:
            roll = rng.random()
            if roll < 0.3:
                continue  # dropped
            out.append(rewritten(message) if roll < 0.45 else message)
        if len(out) > 1 and rng.random() < 0.3:
            i = rng.randrange(len(out) - 1)
            out[i], out[i + 1] = out[i + 1], out[i]
        if not out:
            out = [messages[-1]]
        self.proposed = tuple(out)
        return CompactionProposal.compacted(out, ctx.tokens_before, 0)


def rewritten(message: Message) -> Message:
    """`message` with other words (same id, role and tool traffic)."""
    if message.role is Role.TOOL:
        parts = tuple(
            attrs.evolve(p, content=p.content + " (edited)")
            for p in message.tool_results
        )
        return attrs.evolve(message, parts=parts)
    calls = tuple(p for p in message.parts if isinstance(p, ToolCallPart))
    return attrs.evolve(message, parts=(TextPart(text="edited"), *calls))


# -- the oracle: written here, apart from the code under test ---------------
def must_pin(
    messages: Sequence[Message], rules: PinRules, also: Sequence[str]
) -> set[str]:
    """What the pins must include at least (before the pair closure)."""
    ids = {m.id for m in messages if m.metadata.get(PINNED) == "true"} | set(also)
    ids &= {m.id for m in messages}
    if rules.system_prompt:
        for m in messages:
            if m.role is not Role.SYSTEM or SUMMARY_COVERS in m.metadata:
                break
            ids.add(m.id)
    users = [
        m for m in messages if m.role is Role.USER and SUMMARY_COVERS not in m.metadata
    ]
    if users and rules.first_user:
        ids.add(users[0].id)
    if users and rules.latest_user:
        ids.add(users[-1].id)
    answered = {p.call_id for m in messages for p in m.tool_results}
    ids |= {m.id for m in messages if any(c.id not in answered for c in m.tool_calls)}
    return ids - with_lone_results(messages)


def with_lone_results(messages: Sequence[Message]) -> set[str]:
    """Tool messages with a result that answers no open call before it."""
    open_calls: list[str] = []
    out: set[str] = set()
    for m in messages:
        open_calls.extend(c.id for c in m.tool_calls)
        for r in m.tool_results:
            if r.call_id in open_calls:
                open_calls.remove(r.call_id)
            else:
                out.add(m.id)
    return out


def first_loss(
    before: Sequence[Message], after: Sequence[Message], pinned: set[str]
) -> str | None:
    """The id of the first pinned message `after` drops, alters or moves."""
    where = {m.id: i for i, m in enumerate(after)}
    last = -1
    for m in before:
        if m.id not in pinned:
            continue
        at = where.get(m.id)
        if at is None or after[at].to_dict() != m.to_dict() or at < last:
            return m.id
        last = at
    return None


def displaced(
    before: Sequence[Message], after: Sequence[Message], rules: PinRules
) -> str | None:
    """The id of the first or latest user message a new user message displaces."""

    def users(messages: Sequence[Message]) -> list[str]:
        return [
            m.id
            for m in messages
            if m.role is Role.USER and SUMMARY_COVERS not in m.metadata
        ]

    old, new = users(before), users(after)
    if not old or not new:
        return None
    if rules.first_user and new[0] != old[0]:
        return old[0]
    if rules.latest_user and new[-1] != old[-1]:
        return old[-1]
    return None


Case = tuple[list[Message], PinRules, tuple[str, ...]]


def padded(message: Message) -> Message:
    """`message` with its tool results 300 characters longer (same id)."""
    if message.role is not Role.TOOL:
        return message
    parts = tuple(
        attrs.evolve(p, content=p.content + " " + "x" * 300)
        for p in message.tool_results
    )
    return attrs.evolve(message, parts=parts)


@st.composite
def cases(draw: st.DrawFn) -> Case:
    """A history (raw or repaired, maybe with calls in flight) and its pins."""
    messages = draw(histories(max_messages=14))
    if draw(st.booleans()):  # results big enough to cap, digest and cut
        messages = [padded(m) for m in messages]
    if draw(st.booleans()):
        messages = valid(messages) or [Message.user("hi", id="fix-empty")]
        if draw(st.booleans()):  # the last results are not back yet
            while len(messages) > 1 and messages[-1].role is Role.TOOL:
                messages.pop()
    by_hand = draw(st.sets(st.integers(0, len(messages) - 1), max_size=3))
    messages = [m.pin() if i in by_hand else m for i, m in enumerate(messages)]
    by_hook = draw(st.sets(st.sampled_from([m.id for m in messages]), max_size=2))
    flags = draw(st.tuples(st.booleans(), st.booleans(), st.booleans()))
    rules = PinRules(system_prompt=flags[0], first_user=flags[1], latest_user=flags[2])
    return messages, rules, tuple(sorted(by_hook))


def run_pass(
    compactor: ContextCompactor,
    messages: Sequence[Message],
    rules: PinRules,
    also: Sequence[str],
) -> PassEvent:
    manager = ContextManager(compactor, context_window=0, counter=COUNTER, pins=rules)
    request = CompactionRequest(
        messages=messages, reason=CompactReason.MANUAL, turn=1, pinned=also
    )
    return drive(manager.compact(request))


@pytest.mark.parametrize("name", SHIPPED)
@settings(max_examples=sized(500), deadline=None)
@given(case=cases())
def test_a_shipped_strategy_keeps_every_pinned_message(name: str, case: Case) -> None:
    messages, rules, also = case
    compactor = shipped()[name]
    pinned = pinned_ids(messages, rules, also)
    assert must_pin(messages, rules, also) <= pinned

    event = run_pass(compactor, messages, rules, also)

    if isinstance(event, CompactorFailed):
        # A shipped strategy may fail (a raw history it cannot make valid),
        # never by losing a pin.
        assert event.error.type != "PinnedMessageLost", event.error.message
        return
    if isinstance(event, CompactionResult):
        assert first_loss(messages, event.messages, set(pinned)) is None


@settings(max_examples=sized(1_000), deadline=None)
@given(case=cases(), seed=st.integers(0, 2**32 - 1))
def test_a_careless_strategy_never_commits_a_lost_pin(case: Case, seed: int) -> None:
    messages, rules, also = case
    careless = Careless(seed)
    pinned = pinned_ids(messages, rules, also)

    event = run_pass(careless, messages, rules, also)

    lost = first_loss(messages, careless.proposed, set(pinned))
    if lost is None and result_problem(careless.proposed, messages) is None:
        lost = displaced(messages, careless.proposed, rules)
    if isinstance(event, CompactionResult):
        assert first_loss(messages, event.messages, set(pinned)) is None
    if lost is None:
        assert not (
            isinstance(event, CompactorFailed)
            and event.error.type == "PinnedMessageLost"
        )
        return
    assert isinstance(event, CompactorFailed)  # refused: nothing is committed
    if result_problem(careless.proposed, messages) is None:
        assert event.error.type == "PinnedMessageLost"
        assert lost in event.error.message
        assert "Careless" in event.error.message


# -- the rules -------------------------------------------------------------
def conversation() -> list[Message]:
    """system, first user, a tool exchange, a summary, latest user, a call out."""
    return [
        Message.system("be brief", id="sys"),
        Message.user("the task", id="u1"),
        Message.assistant(
            "", tool_calls=[ToolCallPart(id="c1", name="t", arguments={})], id="a1"
        ),
        Message.tool_result("c1", "result one", id="r1"),
        Message.assistant("done one", id="a2"),
        Message.user(
            "summary", id="s1", metadata={SUMMARY_COVERS: "a2"}
        ),  # a user-role summary
        Message.user("the latest request", id="u2"),
        Message.assistant(
            "", tool_calls=[ToolCallPart(id="c2", name="t", arguments={})], id="a3"
        ),
    ]


@pytest.mark.parametrize(
    ("rules", "expected"),
    [
        (PinRules(), {"sys", "u1", "u2", "a3"}),
        (PinRules(system_prompt=False), {"u1", "u2", "a3"}),
        (PinRules(first_user=False), {"sys", "u2", "a3"}),
        (PinRules(latest_user=False), {"sys", "u1", "a3"}),
        (NO_RULES, {"a3"}),  # a call in flight is always pinned
    ],
    ids=["defaults", "no-system", "no-first", "no-latest", "no-rules"],
)
def test_rules_pin_the_prompt_the_first_and_latest_user_message(
    rules: PinRules, expected: set[str]
) -> None:
    assert pinned_ids(conversation(), rules) == expected


def test_a_summary_is_never_pinned_by_a_rule() -> None:
    messages = [Message.user("summary", id="s", metadata={SUMMARY_COVERS: "x"})]
    assert pinned_ids(messages) == frozenset()
    messages = [Message.system("summary", id="s", metadata={SUMMARY_COVERS: "x"})]
    assert pinned_ids(messages) == frozenset()


@pytest.mark.parametrize(
    ("pin", "expected"),
    [
        ("a1", {"a1", "r1"}),  # a pinned call keeps its result
        ("r1", {"a1", "r1"}),  # a pinned result keeps its call
        ("a2", {"a2"}),
    ],
)
def test_pins_are_pair_safe(pin: str, expected: set[str]) -> None:
    messages = conversation()[:5]
    assert pinned_ids(messages, NO_RULES, [pin]) == expected
    marked = [m.pin() if m.id == pin else m for m in messages]
    assert pinned_ids(marked, NO_RULES) == expected


def test_a_call_awaiting_its_result_is_pinned_with_its_message() -> None:
    messages = conversation()[:3]  # a1's call c1 has no result yet
    assert pinned_ids(messages, NO_RULES) == {"a1"}
    assert pinned_ids([*messages, conversation()[3]], NO_RULES) == frozenset()


def test_ids_of_no_message_are_ignored() -> None:
    assert pinned_ids(conversation()[:2], NO_RULES, ["nope"]) == frozenset()


def test_pin_marks_a_copy_and_survives_the_dict_form() -> None:
    message = Message.user("keep me", id="m")
    pinned = message.pin()
    assert (message.pinned, pinned.pinned) == (False, True)
    assert pinned.metadata[PINNED] == "true"
    assert (pinned.id, pinned.parts, pinned.role) == (
        message.id,
        message.parts,
        message.role,
    )
    assert pinned.pin() is pinned
    assert Message.from_dict(pinned.to_dict()).pinned


# -- keep_pinned and pin_loss ---------------------------------------------
def test_keep_pinned_puts_back_what_a_summary_replaced_after_the_summary() -> None:
    messages = conversation()[:5]
    summary = Message.system("summary", id="sum")
    proposed = (messages[0], summary, messages[4])
    kept = keep_pinned(messages, proposed, frozenset({"u1"}))
    assert [m.id for m in kept] == ["sys", "sum", "u1", "a2"]


def test_keep_pinned_restores_an_altered_pinned_message() -> None:
    messages = conversation()[:5]
    proposed = [rewritten(m) if m.id == "r1" else m for m in messages]
    kept = keep_pinned(messages, proposed, frozenset({"a1", "r1"}))
    assert kept == tuple(messages)
    assert kept[3].tool_results[0].content == "result one"


@given(
    altered=st.sets(st.integers(0, 7)),
    pinned=st.sets(st.integers(0, 7)),
    twin=st.none() | st.integers(1, 7),
)
def test_keep_pinned_on_messages_changed_in_place_is_the_general_rule(
    altered: set[int], pinned: set[int], twin: int | None
) -> None:
    # A proposal with the same ids in the same places takes a short way;
    # with one more message at its end, it takes the general one. They
    # agree, ids repeated (`twin`: a message reusing the first one's id) or not.
    messages = conversation()
    if twin is not None and twin < len(messages):
        messages[twin] = attrs.evolve(messages[twin], id=messages[0].id)
    proposed = [rewritten(m) if i in altered else m for i, m in enumerate(messages)]
    ids = frozenset(messages[i].id for i in pinned if i < len(messages))
    extra = Message.assistant("appended", id="extra")

    kept = keep_pinned(messages, proposed, ids)

    assert kept == keep_pinned(messages, [*proposed, extra], ids)[:-1]
    if twin is None:
        assert all(k is messages[i] for i, k in enumerate(kept) if k.id in ids)
        assert all(k is proposed[i] for i, k in enumerate(kept) if k.id not in ids)


@pytest.mark.parametrize(
    ("proposed_ids", "what"),
    [
        (["sys", "a2"], "dropped"),
        (["sys", "u1*", "a2"], "altered"),
        (["u1", "sys", "a2"], "moved"),
    ],
)
def test_pin_loss_names_the_message_and_what_happened(
    proposed_ids: list[str], what: str
) -> None:
    messages = conversation()[:5]
    by_id = {m.id: m for m in messages}
    proposed = [
        rewritten(by_id[i[:-1]]) if i.endswith("*") else by_id[i] for i in proposed_ids
    ]
    lost = pin_loss(messages, proposed, frozenset({"sys", "u1"}), strategy="Mine")
    assert lost is not None
    assert (lost.message_id, lost.what, lost.strategy) == ("u1", what, "Mine")
    assert lost.message_id in str(lost)
    assert f"Mine {what} the pinned" in str(lost)


def test_the_splitter_keeps_the_old_parts_pins_apart() -> None:
    messages = [
        Message.user("u0", id="u0"),
        Message.assistant("a0", id="a0"),
        Message.user("u1", id="u1"),
        Message.assistant("a1", id="a1"),
        Message.user("u2", id="u2"),
        Message.assistant("a2", id="a2"),
        Message.user("u3", id="u3"),
        Message.assistant("a3", id="a3"),
    ]
    split = TokenSplitter(preserve_recent=2).split(messages, {"u0", "a1"})
    assert split.index == 6
    assert [m.id for m in split.to_compact] == ["a0", "u1", "u2", "a2"]
    assert [m.id for m in split.pinned] == ["u0", "a1"]
    plain = TokenSplitter(preserve_recent=2).split(messages)
    assert [m.id for m in plain.to_compact] == [m.id for m in messages[:6]]
    assert plain.pinned == ()


# -- the hook's pins reach the pass -----------------------------------------
def test_ids_a_request_pins_are_kept_and_a_pass_losing_one_is_refused() -> None:
    messages = [
        *conversation()[:5],
        Message.user("next", id="u9"),
        Message.assistant("ok", id="a9"),
    ]
    kept = run_pass(
        TruncatingCompactor(preserve_recent=1, min_messages=2),
        messages,
        NO_RULES,
        ["u1"],
    )
    assert isinstance(kept, CompactionResult)
    assert [m.id for m in kept.messages] == ["sys", "u1", "u9", "a9"]
    careless = Careless(0)
    careless.compact = drop("u1")  # type: ignore[method-assign]
    refused = run_pass(careless, messages, NO_RULES, ["u1"])
    assert isinstance(refused, CompactorFailed)
    assert refused.error.type == "PinnedMessageLost"
    assert "u1" in refused.error.message


def drop(message_id: str) -> Any:
    async def compact(
        messages: Sequence[Message], target: int, ctx: CompactionContext
    ) -> CompactionProposal:
        kept = [m for m in messages if m.id != message_id]
        return CompactionProposal.compacted(kept, ctx.tokens_before, 0)

    return compact


# -- the settings' errors ---------------------------------------------------
@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: PinRules(system_prompt="yes"), "system_prompt"),
        (lambda: PinRules(first_user=1), "first_user"),
        (lambda: PinRules(latest_user=None), "latest_user"),
        (lambda: ContextManager(pins={"first_user": False}), "pins"),
        (lambda: CompactionRequest(messages=[], pinned="m1"), "pinned"),
        (lambda: CompactionRequest(messages=[], pinned=[1]), "pinned[0]"),
        (lambda: PreCompact(pin="m1"), "pin"),
        (lambda: PreCompact(pin=[None]), "pin[0]"),
    ],
    ids=[
        "rule-str",
        "rule-int",
        "rule-none",
        "manager-dict",
        "request-str",
        "request-int",
        "hook-str",
        "hook-none",
    ],
)
def test_bad_pin_settings_fail_naming_the_field(build: Any, field: str) -> None:
    with pytest.raises(ConfigError) as caught:
        build()
    assert caught.value.field == field
    assert field in str(caught.value)


def test_a_request_pinning_a_message_it_does_not_hold_is_refused() -> None:
    # It pinned nothing, silently: a misspelt id protected no message.
    messages = [Message.user("plan the trip", id="u1")]
    assert CompactionRequest(messages=messages, pinned=["u1"]).pinned == ("u1",)

    with pytest.raises(ConfigError) as caught:
        CompactionRequest(messages=messages, pinned=["u1", "u-1"])

    assert str(caught.value) == (
        "invalid pinned[1]='u-1': expected the id of one of the request's messages"
    )


@pytest.mark.parametrize(
    ("arguments", "field", "value"),
    [
        (("plan the trip",), "messages", "plan the trip"),
        (([Message.user("plan", id="u1"), None],), "messages[1]", None),
        (([Message.user("plan", id="u1")], "u1"), "also", "u1"),
        (([Message.user("plan", id="u1")], [7]), "also[0]", 7),
    ],
)
def test_the_managers_pins_of_what_is_no_conversation_are_refused(
    arguments: tuple[object, ...], field: str, value: object
) -> None:
    with pytest.raises(ConfigError) as caught:
        ContextManager().pinned(*arguments)  # type: ignore[arg-type]
    assert (caught.value.field, caught.value.value) == (field, value)


def test_the_lost_pin_error_reads_as_what_to_do() -> None:
    error = PinnedMessageLost(
        message_id="msg_1", role="user", strategy="MyCompactor", what="dropped"
    )
    assert str(error).startswith("MyCompactor dropped the pinned user message msg_1")
    assert "do not pin that message" in str(error)


def test_every_traffic_helper_sees_the_same_open_calls() -> None:
    # The rule for calls in flight is the pairing every pass uses.
    messages = conversation()
    refs = pair_tool_traffic(messages).lone_calls
    assert [messages[r.message].id for r in refs] == ["a3"]


# -- a new user message in front of the task, or after the request --------
@attrs.frozen
class InFront:
    """Puts a plain user message before the kept ones (or after, `last`)."""

    last: bool = False

    async def compact(
        self, messages: Sequence[Message], target: int, ctx: CompactionContext
    ) -> CompactionProposal:
        split = TokenSplitter(preserve_recent=2, min_messages=2).split(
            messages, ctx.pinned
        )
        note = Message.user("[Summary of the earlier conversation] hi", id="note")
        kept = keep_pinned(messages, (note, *split.preserved), ctx.pinned)
        if self.last:
            kept = keep_pinned(messages, (*split.preserved, note), ctx.pinned)
        return CompactionProposal.compacted(
            kept, ctx.tokens_before, ctx.counter.count(kept)
        )


def chat(n: int = 6) -> list[Message]:
    out: list[Message] = []
    for i in range(n):
        out += [Message.user(f"u{i} " * 20, id=f"u{i}")]
        out += [Message.assistant(f"a{i} " * 20, id=f"a{i}")]
    return out


@pytest.mark.parametrize(
    ("last", "pinned", "place"),
    [(False, "u0", "before"), (True, "u5", "after")],
)
def test_a_user_message_put_where_a_rule_would_pin_it_is_refused(
    last: bool, pinned: str, place: str
) -> None:
    # A plain user message in front of the first user message would be the
    # first user message on the next pass: it would be pinned in the task's
    # place, and the task summarised away; after the latest request, it
    # would be read as the request.
    messages = chat()
    event = run_pass(InFront(last=last), messages, PinRules(), ())

    assert isinstance(event, CompactorFailed)
    assert event.error.type == "PinnedMessageLost"
    text = event.error.message
    assert f"InFront put the user message note {place} the pinned" in text
    assert pinned in text
    assert "SUMMARY_COVERS" in text


@attrs.frozen
class NoteOnTop:
    """Puts a note (an assistant message, or a summary) above everything."""

    summary: bool = False

    async def compact(
        self, messages: Sequence[Message], target: int, ctx: CompactionContext
    ) -> CompactionProposal:
        metadata = {SUMMARY_COVERS: "a0"} if self.summary else {}
        note = Message.assistant(
            "[earlier turns dropped]", id="note", metadata=metadata
        )
        kept = [note, *(m for m in messages if m.id != "a0")]
        return CompactionProposal.compacted(
            kept, ctx.tokens_before, ctx.counter.count(kept)
        )


@pytest.mark.parametrize("summary", [False, True])
def test_a_message_put_before_the_system_prompt_is_refused(summary: bool) -> None:
    # The system prompt was pinned as the message the conversation opens
    # with: once a note stood before it, it was pinned no more, and the
    # next pass dropped it without a word.
    messages = [Message.system("Never delete prod.", id="sys"), *chat()]

    event = run_pass(NoteOnTop(summary=summary), messages, PinRules(), ())

    assert isinstance(event, CompactorFailed)
    assert event.error.type == "PinnedMessageLost"
    assert event.error.message.startswith(
        "NoteOnTop put the message note before the pinned system message sys;"
    )
    rules = PinRules(system_prompt=False)
    assert isinstance(run_pass(NoteOnTop(), messages, rules, ()), CompactionResult)


@pytest.mark.parametrize("last", [False, True])
def test_the_same_message_is_kept_when_its_rule_is_off_or_it_is_a_summary(
    last: bool,
) -> None:
    messages = chat()
    rules = PinRules(first_user=last, latest_user=not last)
    assert isinstance(
        run_pass(InFront(last=last), messages, rules, ()), CompactionResult
    )

    @attrs.frozen
    class Marked:
        async def compact(
            self, messages: Sequence[Message], target: int, ctx: CompactionContext
        ) -> CompactionProposal:
            proposal = await InFront(last=last).compact(messages, target, ctx)
            marked = [
                attrs.evolve(m, metadata={SUMMARY_COVERS: "a3"})
                if m.id == "note"
                else m
                for m in proposal.messages
            ]
            return CompactionProposal.compacted(marked, ctx.tokens_before, 0)

    event = run_pass(Marked(), messages, PinRules(), ())
    assert isinstance(event, CompactionResult)
