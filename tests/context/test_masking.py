"""The default strategy: a run whose request fits never fails for want of a pass.

`MaskingCompactor` caps, digests and cuts tool results and truncates the
middle with no model call; the brain calls the model when a threshold pass
cannot shrink a request that still fits under the emergency line.
"""

from __future__ import annotations

from collections.abc import Sequence

import anyio
import attrs
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from tests.profiles import heavy
from turnfsm import Agent
from turnfsm.context import (
    CompactionContext,
    ContextManager,
    MaskingCompactor,
    cut_result,
    keep_pinned,
)
from turnfsm.core import CompactReason
from turnfsm.driver import function_tool
from turnfsm.errors import ConfigError
from turnfsm.hooks import Hook
from turnfsm.messages import Message, ToolResultPart
from turnfsm.persistence import CompactionRecord
from turnfsm.providers import ModelRequest
from turnfsm.testing import FakeModelClient, reply, tool_call
from turnfsm.tokens import ConservativeTokenCounter

COUNTER = ConservativeTokenCounter()


def context(messages: list[Message], target: int) -> CompactionContext:
    return CompactionContext(
        tokens_before=COUNTER.count(messages),
        reason=CompactReason.THRESHOLD_EXCEEDED,
        context_window=10 * target,
        turn=1,
        counter=COUNTER,
    )


def compact(messages: list[Message], target: int) -> tuple[Message, ...]:
    compactor = MaskingCompactor()
    proposal = anyio.run(compactor.compact, messages, target, context(messages, target))
    return proposal.messages


def results(messages: tuple[Message, ...]) -> list[str]:
    return [
        p.content for m in messages for p in m.parts if isinstance(p, ToolResultPart)
    ]


def exchange(n: int, size: int) -> list[Message]:
    """A user request, then `n` tool rounds of `size`-character results."""
    out = [Message.user("look around", id="u")]
    for i in range(n):
        out.append(reply("", tool_call("read", f"c{i}", path=f"f{i}")))
        out.append(Message.tool_result(f"c{i}", f"line {i} " + "x" * size, id=f"r{i}"))
    return out


# -- the layers ----------------------------------------------------------------------


def test_cut_result_says_how_much_went_and_cuts_again_from_the_original() -> None:
    once = cut_result("a" * 1_000, 100)
    twice = cut_result(once, 10)

    assert once.startswith("a" * 100 + "\n[... 900 more characters not shown")
    assert twice.startswith("a" * 10 + "\n[... 990 more characters not shown")
    assert cut_result(twice, 10) == twice
    assert cut_result("short", 10) == "short"
    assert cut_result("a" * 120, 100) == "a" * 120  # the note would not save


def test_an_oversized_result_is_capped_first() -> None:
    messages = exchange(1, 10_000)

    out = compact(messages, COUNTER.count(messages) - 1)

    (content,) = results(out)
    assert content.startswith("line 0 " + "x" * 3_993)
    assert "more characters not shown" in content


def test_old_results_become_digests_and_the_newest_stay() -> None:
    messages = exchange(5, 1_000)

    out = compact(messages, COUNTER.count(messages) // 2)

    contents = results(out)
    assert all(len(c) < 200 and "\n" not in c for c in contents[:3])
    assert contents[3:] == results(tuple(messages))[3:]
    assert [m.id for m in out] == [m.id for m in messages]


def test_a_result_bigger_than_the_window_is_cut_to_fit() -> None:
    messages = exchange(1, 6_000)
    target = 500

    out = compact(messages, target)

    assert COUNTER.count(out) <= target
    (content,) = results(out)
    assert "the result was cut to fit the context window" in content


def test_a_long_run_drops_its_middle_and_keeps_its_request_and_pairs() -> None:
    messages = exchange(40, 300)

    out = compact(messages, 1_000)

    assert out[0].id == "u"
    assert COUNTER.count(out) <= 1_000
    calls = {c.id for m in out for c in m.tool_calls}
    answered = {
        p.call_id for m in out for p in m.parts if isinstance(p, ToolResultPart)
    }
    assert calls == answered


def parallel(n: int, size: int) -> list[Message]:
    """A user request, then one reply calling `n` tools at once, and their results."""
    calls = [tool_call("read", f"c{i}", path=f"f{i}") for i in range(n)]
    out = [Message.user("look around", id="u"), reply("", *calls)]
    out += [
        Message.tool_result(f"c{i}", f"line {i} " + "x" * size, id=f"r{i}")
        for i in range(n)
    ]
    return out


def test_one_reply_s_results_are_digested_oldest_first_when_nothing_else_fits() -> None:
    # Twelve results of one reply, none to be cut below 2,000 characters: the
    # newest reply's results are digested too, oldest first, the newest last.
    messages = parallel(12, 2_000)
    target = COUNTER.count(messages) // 2
    compactor = MaskingCompactor(min_result_chars=2_000)

    proposal = anyio.run(compactor.compact, messages, target, context(messages, target))
    out = proposal.messages

    assert COUNTER.count(out) <= target
    assert [m.id for m in out] == [m.id for m in messages]  # every pair kept
    contents = results(out)
    digested = [i for i, c in enumerate(contents) if "x" * 100 not in c]
    assert digested == list(range(len(digested)))  # the oldest ones
    assert 0 < len(digested) < 12
    assert contents[-1] == results(tuple(messages))[-1]
    assert all("[recall " in contents[i] for i in digested)


def test_a_pinned_result_of_the_reply_is_not_digested() -> None:
    messages = parallel(6, 2_000)
    target = COUNTER.count(messages) // 2
    ctx = attrs.evolve(context(messages, target), pinned=frozenset({"r0"}))

    proposal = anyio.run(
        MaskingCompactor(min_result_chars=2_000).compact, messages, target, ctx
    )

    assert proposal.messages[2] == messages[2]
    assert results(proposal.messages)[1] != results(tuple(messages))[1]


def test_words_alone_that_cannot_be_cut_come_back_unchanged() -> None:
    messages = [Message.user("please " * 2_000, id="u")]

    proposal = anyio.run(
        MaskingCompactor().compact, messages, 10, context(messages, 10)
    )

    assert proposal.tokens_after == proposal.tokens_before
    assert proposal.messages == tuple(messages)


def test_a_layer_that_changes_nothing_is_not_counted_again() -> None:
    # Short results: no cap, no digest, no repeated call. The first layer's
    # count shows the conversation does not fit; the next two change nothing.
    messages = exchange(40, 20)
    counted: list[int] = []

    class Counting(ConservativeTokenCounter):  # type: ignore[misc]  # a final class
        def count(self, messages: Sequence[Message]) -> int:
            counted.append(len(messages))
            return super().count(messages)

    ctx = attrs.evolve(context(messages, 100), counter=Counting())
    proposal = anyio.run(MaskingCompactor().compact, messages, 100, ctx)

    assert len(proposal.messages) < len(messages)
    assert counted.count(len(messages)) == 1


def test_repeated_ids_get_their_pins_put_back_when_the_cap_changes_nothing() -> None:
    # Two messages share an id; "b" is pinned. The cap layer changes nothing
    # and the conversation fits, yet the pass has always put the pins back
    # after its first layer, and `keep_pinned` keeps one message per id:
    # the result is what it makes of the conversation, whatever the layer did.
    messages = [
        Message.user("hello there", id="x"),
        Message.assistant("ok", id="b"),
        Message.user("again", id="x"),
    ]
    pinned = frozenset({"b"})
    ctx = attrs.evolve(context(messages, 1_000), pinned=pinned)
    proposal = anyio.run(MaskingCompactor().compact, messages, 1_000, ctx)

    assert proposal.messages == keep_pinned(messages, messages, pinned)
    assert [m.id for m in proposal.messages] == ["b", "x"]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_tool_result_chars", 0),
        ("keep_recent_calls", -1),
        ("mask_min_chars", 0),
        ("min_result_chars", -1),
        ("preserve_recent", 0),
        ("max_tool_result_chars", "4000"),
    ],
)
def test_bad_settings_are_refused_by_name(field: str, value: object) -> None:
    with pytest.raises(ConfigError) as raised:
        MaskingCompactor(**{field: value})  # type: ignore[arg-type]

    assert raised.value.field == field


# -- runs that fit complete ----------------------------------------------------------


class Passes(Hook):
    def __init__(self) -> None:
        self.records: list[CompactionRecord] = []

    def on_compaction_pass(self, record: CompactionRecord) -> None:
        self.records.append(record)


def one_fat_result() -> FakeModelClient:
    def answer(request: ModelRequest) -> Message:
        if any(m.role.value == "tool" for m in request.messages):
            return reply("done")
        return reply("", tool_call("fetch", "c1"))

    return FakeModelClient(answer)


@pytest.mark.parametrize(
    ("chars", "window", "threshold"),
    [(1_500, 1_500, 50), (2_500, 1_500, 80), (6_000, 1_500, 50), (3_000, 640, 80)],
    ids=["over-the-threshold", "over-the-emergency-line", "bigger-than-window", "640"],
)
def test_a_run_with_one_fat_tool_result_completes_with_the_defaults(
    chars: int, window: int, threshold: int
) -> None:
    """The model is told that the result was cut."""

    @function_tool
    def fetch() -> str:
        """Fetch the page."""
        return "Lorem ipsum, 12.5%; " * (chars // 20)

    model = one_fat_result()
    passes = Passes()
    agent = Agent(
        model=model,
        tools=[fetch],
        context=ContextManager(context_window=window, threshold=threshold),
        hooks=[passes],
    )

    result = agent.run_sync("fetch the page")

    assert result.outcome == "done", result.error
    assert result.text == "done"
    last = model.requests[-1].messages
    assert "the result was cut to fit the context window" in results(tuple(last))[0]
    assert [r.verdict.value for r in passes.records] == ["compacted"]


def test_a_run_whose_one_reply_calls_many_tools_goes_on_over_the_emergency_line() -> (
    None
):
    """Twelve results of one reply, over the line and uncuttable by setting:
    the oldest are digested, so the run completes instead of stalling."""

    @function_tool
    def read_log(name: str) -> str:
        """Read a log.

        Args:
            name: the log's name.
        """
        return f"{name}: " + "disk full, retrying write; " * 60

    def answer(request: ModelRequest) -> Message:
        if any(m.tool_calls for m in request.messages):
            return reply("All logs say the disk is full.")
        calls = [tool_call("read_log", f"c{i}", name=f"log{i}") for i in range(12)]
        return reply("Reading all logs.", *calls)

    model = FakeModelClient(answer)
    passes = Passes()
    agent = Agent(
        model=model,
        tools=[read_log],
        context=ContextManager(
            MaskingCompactor(min_result_chars=2_000), context_window=6_900
        ),
        hooks=[passes],
    )

    result = agent.run_sync("Audit every log.")

    assert result.outcome == "done", result.error
    assert [r.verdict.value for r in passes.records] == ["compacted"]
    sent = results(tuple(model.requests[-1].messages))
    assert len(sent) == 12
    assert sent[-1].startswith("log11: disk full")  # the newest kept whole
    assert sent[0].startswith("[read_log]")  # the oldest digested


def test_a_long_run_compacts_as_often_as_it_needs() -> None:
    """10,000 tool rounds in an 8,192-token window: hundreds of passes, recorded."""
    rounds = 10_000

    @function_tool
    def step(n: int) -> str:
        """Do step n."""
        return f"step {n} done: " + "ok " * 60

    calls = iter(range(rounds + 1))

    def answer(request: ModelRequest) -> Message:
        done = next(calls)
        if done == rounds:
            return reply("all done")
        return reply("", tool_call("step", f"s{done}", n=done))

    passes = Passes()
    agent = Agent(
        model=FakeModelClient(answer),
        tools=[step],
        context=ContextManager(context_window=8_192),
        hooks=[passes],
        max_turns=rounds * 10,
    )

    result = agent.run_sync("do every step")

    assert result.outcome == "done", result.error
    assert len(passes.records) > 20  # more than the old per-run total allowed
    assert all(r.verdict.value == "compacted" for r in passes.records)


# -- the invariant -------------------------------------------------------------------

words = st.text(alphabet=st.characters(codec="utf-8"), min_size=1, max_size=400)


@heavy(100)
@example(  # short results of 4-byte characters: a cut must weigh bytes, not chars
    rounds=[("Q\U00010000", 52), ("Q\U00010000", 81)],
    request="?",
    window=600,
    threshold=20,
    at_once=1,
    min_result_chars=0,
)
@example(  # one reply's two results, which may not be cut: digested instead
    rounds=[("00\U00010000\U00010000", 68), ("00:\U00010000\U00010000", 130)],
    request="?",
    window=600,
    threshold=20,
    at_once=2,
    min_result_chars=500,
)
@given(
    rounds=st.lists(st.tuples(words, st.integers(0, 3_000)), min_size=0, max_size=12),
    request=st.text(alphabet="abcdefgh?", min_size=1, max_size=100),
    window=st.integers(600, 4_000),
    threshold=st.integers(20, 90),
    at_once=st.integers(1, 12),
    min_result_chars=st.sampled_from([0, 500, 3_000]),
)
def test_a_request_under_the_emergency_line_never_stalls(
    rounds: list[tuple[str, int]],
    request: str,
    window: int,
    threshold: int,
    at_once: int,
    min_result_chars: int,
) -> None:
    """Whatever the conversation, the default strategy shrinks it or the model is
    called: a run only fails when a request cannot be brought under the line.

    A reply calls up to `at_once` tools, so the newest reply may hold many
    results; `min_result_chars` may forbid cutting them."""

    @function_tool
    def fetch(n: int) -> str:
        """Fetch part n."""
        text, size = rounds[n]
        return (text * (size // len(text) + 1))[:size]

    def answer(request_: ModelRequest) -> Message:
        asked = sum(len(m.tool_calls) for m in request_.messages)
        if asked < len(rounds):
            now = range(asked, min(asked + at_once, len(rounds)))
            return reply("", *(tool_call("fetch", f"c{n}", n=n) for n in now))
        return reply("done")

    agent = Agent(
        model=FakeModelClient(answer),
        tools=[fetch],
        context=ContextManager(
            MaskingCompactor(min_result_chars=min_result_chars),
            context_window=window,
            threshold=threshold,
        ),
        max_turns=50,
    )

    result = agent.run_sync(request)

    if result.outcome != "done":
        assert type(result.error).__name__ != "CompactionStalled", result.error
