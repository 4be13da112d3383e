"""Pins under the driver: the hook's pins, a refused pass, the check at start."""

from __future__ import annotations

import gc
import logging
from collections.abc import Sequence
from typing import Any

import anyio
import attrs
import pytest

from turnfsm.context import (
    CompactionContext,
    CompactionProposal,
    ContextManager,
    PinRules,
    TruncatingCompactor,
)
from turnfsm.core import Compact, CompactionResult, Event
from turnfsm.driver import Driver, EffectContext, Session, function_tool
from turnfsm.errors import (
    CompactionFailed,
    ContextExceeded,
    InvalidReturn,
    PinnedTooLarge,
    ReserveTooLarge,
)
from turnfsm.hooks import Hook, PreCompact, PreCompactInfo
from turnfsm.messages import Message
from turnfsm.persistence import CompactionRecord
from turnfsm.providers import ModelRequest, ModelResponse
from turnfsm.testing import FakeModelClient, ScriptedModel
from turnfsm.tokens import HeuristicTokenCounter
from turnfsm.values import Usage

pytestmark = pytest.mark.anyio

HEURISTIC = HeuristicTokenCounter()


def history(n: int, size: int) -> list[Message]:
    out: list[Message] = []
    for i in range(n):
        out.append(Message.user(f"question {i} " + "q" * size, id=f"u{i}"))
        out.append(Message.assistant(f"answer {i} " + "a" * size, id=f"a{i}"))
    return out


class KeepLast:
    """A user strategy that keeps the last message only."""

    async def compact(
        self, messages: Sequence[Message], target: int, ctx: CompactionContext
    ) -> CompactionProposal:
        return CompactionProposal.compacted(messages[-1:], ctx.tokens_before, 0)


class PinAnswer(Hook):
    """Pins the answer `message_id` before every pass."""

    def __init__(self, message_id: str) -> None:
        self.message_id = message_id
        self.records: list[CompactionRecord] = []

    def pre_compact(self, info: PreCompactInfo) -> PreCompact:
        return PreCompact(pin=[self.message_id])

    def on_compaction_pass(self, record: CompactionRecord) -> None:
        self.records.append(record)


async def test_a_pass_that_drops_a_pinned_message_fails_the_run_and_loses_nothing() -> (
    None
):
    session = Session()
    first = await Driver(model=ScriptedModel.of("ok")).run(
        history(3, 10), session=session
    )
    assert first.ok
    kept = list(session.history)
    manager = ContextManager(KeepLast(), context_window=1_000, counter=HEURISTIC)
    driver = Driver(model=ScriptedModel.of("never"), context=manager)
    result = await driver.run("q" * 3_400, session=session)
    assert isinstance(result.error, CompactionFailed)
    assert "KeepLast dropped the pinned user message u0" in result.error.cause
    assert list(session.history) == kept  # nothing committed is lost
    (record,) = session.runs[-1].compactions
    assert record.verdict == "failed"


async def test_a_hooks_pin_reaches_the_pass() -> None:
    hook = PinAnswer("a1")
    session = Session()
    manager = ContextManager(
        TruncatingCompactor(), context_window=2_000, counter=HEURISTIC
    )
    driver = Driver(model=ScriptedModel.of("ok"), context=manager, hooks=[hook])
    result = await driver.run(history(6, 600), session=session)
    assert result.ok, result.error
    assert hook.records
    assert hook.records[0].compacted
    ids = [m.id for m in session.history]
    assert "a1" in ids  # pinned by the hook: kept though it is old
    assert "a2" not in ids  # its neighbours went
    assert ids[:2] == ["u0", "a1"]


async def test_a_hooks_pin_refuses_a_pass_that_drops_it() -> None:
    hook = PinAnswer("a1")
    manager = ContextManager(
        KeepLast(),
        context_window=2_000,
        counter=HEURISTIC,
        pins=PinRules(first_user=False, latest_user=False),
    )
    driver = Driver(model=ScriptedModel.of("never"), context=manager, hooks=[hook])
    result = await driver.run(history(6, 600))
    assert isinstance(result.error, CompactionFailed)
    assert "dropped the pinned assistant message a1" in result.error.cause


async def test_a_run_whose_pins_cannot_fit_fails_at_start_with_the_figures() -> None:
    session = Session()
    manager = ContextManager(context_window=1_000, counter=HEURISTIC)
    driver = Driver(
        model=ScriptedModel.of("never"),
        context=manager,
        system_prompt="be brief " * 50,
        max_output_tokens=100,
    )
    request = Message.user("q" * 4_000, id="big")
    with pytest.raises(PinnedTooLarge) as caught:
        await driver.run(request, session=session)
    error = caught.value
    pinned = HEURISTIC.count([request])
    reserved = HEURISTIC.count_text("be brief " * 50) + 100
    assert (error.pinned, error.reserved, error.limit) == (pinned, reserved, 1_000)
    assert error.used == pinned + reserved
    assert f"{pinned} pinned tokens plus {reserved} reserved" in str(error)
    assert "950-token emergency line of the 1000-token window" in str(error)
    assert session.version == 0  # nothing was written


async def test_unpinned_the_same_run_is_not_refused_at_start() -> None:
    manager = ContextManager(
        context_window=1_000,
        counter=HEURISTIC,
        pins=PinRules(first_user=False, latest_user=False),
    )
    driver = Driver(model=ScriptedModel.of("never"), context=manager)
    result = await driver.run(Message.user("q" * 4_000))
    # It started (and failed later, as such a run does without pins).
    assert type(result.error) is ContextExceeded
    assert result.turns == 0


async def test_a_conversation_that_fits_is_not_searched_for_pins_at_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Its pins fit if all of it does: a run on a long session starts in
    # O(new messages), not with a pin search over the whole history.
    manager = ContextManager(context_window=100_000, counter=HEURISTIC, max_messages=0)
    session = Session()
    await Driver(model=ScriptedModel.of("one"), context=manager).run(
        history(200, 10), session=session
    )
    searched: list[int] = []
    real = ContextManager.pinned

    def spy(self: ContextManager, messages: Sequence[Message], also: Any = ()) -> Any:
        searched.append(len(messages))
        return real(self, messages, also)

    monkeypatch.setattr(ContextManager, "pinned", spy)
    driver = Driver(model=ScriptedModel.of("two"), context=manager)
    assert (await driver.run("and now?", session=session)).ok
    assert searched == []
    # Over the window as a whole, the pins are looked for, and they fit.
    assert len(session.history) == 403
    size = HEURISTIC.count(list(session.history))
    small = ContextManager(context_window=size // 2, counter=HEURISTIC)
    driver = Driver(model=ScriptedModel.of("three"), context=small)
    await driver.run("and then?", session=session)
    assert searched[:1] == [404]


async def test_a_hooks_pin_of_a_message_the_pass_lacks_is_a_hook_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # It was ignored: a misspelt id pinned nothing, and nothing said so.
    manager = ContextManager(
        TruncatingCompactor(), context_window=2_000, counter=HEURISTIC
    )
    hook = PinAnswer("a-1")
    driver = Driver(model=ScriptedModel.of("ok"), context=manager, hooks=[hook])
    with caplog.at_level(logging.ERROR, logger="turnfsm.hooks"):
        result = await driver.run(history(6, 600))

    # Logged and detached, like any bad answer: the pass ran without it.
    assert result.ok, result.error
    assert "no message has the id 'a-1'" in caplog.text
    assert hook.records == []  # detached before the pass ended

    strict = Driver(
        model=ScriptedModel.of("ok"),
        context=manager,
        hooks=[PinAnswer("a-1")],
        strict_hooks=True,
    )
    result = await strict.run(history(6, 600))

    assert isinstance(result.error, InvalidReturn)
    assert result.error.source == "hook PinAnswer.pre_compact"
    assert result.error.expected == (
        "a PreCompact pinning messages of the pass, by their ids in"
        " info.messages: no message has the id 'a-1'"
    )


@attrs.frozen
class _TextCounting:
    """A hashable incremental counter that records each text it prices."""

    tag: str = ""
    inner: HeuristicTokenCounter = attrs.field(factory=HeuristicTokenCounter)
    texts: list[str] = attrs.field(factory=list, eq=False, hash=False)

    def count(self, messages: Sequence[Message]) -> int:
        return self.inner.count(messages)

    def count_text(self, text: str) -> int:
        return self.inner.count_text(text)

    def units(self, message: Message) -> int:
        return self.inner.units(message)

    def text_units(self, text: str) -> int:
        self.texts.append(text)
        return self.inner.text_units(text)

    def tokens(self, units: int) -> int:
        return self.inner.tokens(units)


class _Forgetful:
    """Answers every request and keeps none (a server's model client)."""

    async def complete(self, request: ModelRequest) -> ModelResponse:
        return ModelResponse(message=Message.assistant("ok"))


def test_a_driver_prices_its_extras_once_across_runs() -> None:
    # The system prompt and the tool schemas ride every request: a driver
    # reused for many runs (on new sessions, nothing of a run kept) prices
    # each of them once.
    def lookup(key: str) -> str:
        """Look a key up."""
        return key

    counter = _TextCounting()
    driver = Driver(
        model=_Forgetful(),
        tools=[lookup],
        system_prompt="You are terse.",
        context=ContextManager(context_window=8_000, counter=counter),
    )
    for _ in range(3):
        assert anyio.run(driver.run, "go").ok
        gc.collect()
    assert sorted(counter.texts) == sorted(set(counter.texts))
    assert "You are terse." in counter.texts

    # A manager put in its place measures with its own counter.
    other = _TextCounting(tag="other")
    driver.context = ContextManager(context_window=8_000, counter=other)
    assert anyio.run(driver.run, "go").ok
    assert "You are terse." in other.texts


async def test_a_run_whose_reserve_cannot_fit_is_told_what_the_reserve_is() -> None:
    # It advised to pin less, though 6 pinned tokens were not the problem:
    # the tools' schemas were.
    def lookup(word: str) -> str:
        """Look a word up.

        Args:
            word: the word.
        """
        return word

    tool = function_tool(lookup, description="Look a word up. " * 120)
    manager = ContextManager(context_window=1_000, counter=HEURISTIC)
    driver = Driver(model=ScriptedModel.of("never"), context=manager, tools=[tool])
    with pytest.raises(PinnedTooLarge) as caught:
        await driver.run("words " * 340)
    assert caught.value.reserved > caught.value.pinned
    assert "pin less" not in str(caught.value)
    assert str(caught.value).endswith(
        "never sent); most of it is reserved (the system prompt, the tool schemas, the "
        "output type's schema and the reply budget): shorten the system prompt or "
        "the tools' descriptions, give fewer tools or a smaller output type, or use "
        "a bigger window"  # no reply budget reserved: none to lower
    )
    # Alone over the window, no run could fit: refused when the agent is built.
    bigger = function_tool(lookup, description="Look a word up. " * 400)
    with pytest.raises(ReserveTooLarge) as refused:
        Driver(model=ScriptedModel.of("never"), context=manager, tools=[bigger])
    assert (refused.value.field, refused.value.window) == ("tools", 1_000)
    assert refused.value.reserved > 1_000


def test_a_reserve_between_the_emergency_line_and_the_window_is_refused() -> None:
    # 965 tokens ride every request on a 1,000-token window: under the
    # window, but a request on or over its emergency line (950) is never
    # sent, so every run failed, blaming a five-token pin.
    manager = ContextManager(context_window=1_000, counter=HEURISTIC)
    prompt = "abcd " * 400
    assert HEURISTIC.count_text(prompt) == 505

    with pytest.raises(ReserveTooLarge) as refused:
        Driver(
            model=ScriptedModel.of("never"),
            context=manager,
            system_prompt=prompt,
            max_output_tokens=460,
        )

    assert (refused.value.field, refused.value.reserved) == ("system_prompt", 965)
    assert "950-token emergency line of the 1,000-token context window" in str(
        refused.value
    )
    # One token under the line is what can still be sent beside a message.
    Driver(
        model=ScriptedModel.of("never"),
        context=manager,
        system_prompt=prompt,
        max_output_tokens=444,
    )


async def test_pins_that_reach_the_emergency_line_are_refused_at_start() -> None:
    session = Session()
    manager = ContextManager(context_window=1_000, counter=HEURISTIC)
    driver = Driver(
        model=ScriptedModel.of("never"), context=manager, max_output_tokens=100
    )
    request = Message.user("q" * 3_400, id="big")  # with the reply: 955 tokens
    pinned = HEURISTIC.count([request])
    assert 950 <= pinned + 100 <= 1_000

    with pytest.raises(PinnedTooLarge) as caught:
        await driver.run(request, session=session)

    assert (caught.value.used, caught.value.line) == (pinned + 100, 950)
    assert "on or over the 950-token emergency line of the 1000-token window" in (
        str(caught.value)
    )
    assert session.version == 0  # nothing was written


async def test_pins_are_measured_as_a_calibrating_session_measures_its_requests() -> (
    None
):
    # The session learned that the model counts about a third of the
    # estimate: the run's requests are scaled so, and the pins' check was
    # not, refusing a run that would have sent its request.
    def small(_request: ModelRequest) -> ModelResponse:
        usage = Usage(input_tokens=3, output_tokens=1)
        return ModelResponse(message=Message.assistant("ok"), usage=usage)

    def driver(model: FakeModelClient, calibrate: bool) -> Driver:
        manager = ContextManager(context_window=1_000, calibrate=calibrate)
        return Driver(model=model, context=manager, max_output_tokens=10)

    for calibrate, sent in ((True, 2), (False, 1)):
        model = FakeModelClient(small)
        session = Session()
        await driver(model, calibrate).run("hello there", session=session)
        big = "word " * 520  # about 990 tokens by the estimate, pinned
        if calibrate:
            assert (await driver(model, True).run(big, session=session)).ok
        else:
            with pytest.raises(PinnedTooLarge):
                await driver(model, False).run(big, session=session)
        assert len(model.requests) == sent


async def test_a_refusal_on_a_learned_scale_says_the_figures_include_it() -> None:
    # The provider counted nearly three times the estimate: the second run
    # was refused with a reserve of 2,938 tokens for a system prompt the
    # counter estimates at about a thousand, and nothing said why.
    def counted_high(_request: ModelRequest) -> ModelResponse:
        usage = Usage(input_tokens=2_900, output_tokens=1)
        return ModelResponse(message=Message.assistant("ok"), usage=usage)

    model = FakeModelClient(counted_high)
    manager = ContextManager(context_window=3_000, calibrate=True)
    driver = Driver(
        model=model,
        context=manager,
        system_prompt="Be terse. " * 250,
        max_output_tokens=20,
    )
    session = Session()
    assert (await driver.run("hello", session=session)).ok
    entries = len(session.entries)
    with pytest.raises(PinnedTooLarge) as caught:
        await driver.run("again", session=session)
    refused = caught.value
    assert 2.5 < refused.scale < 3.5  # 2,900 reported for about 1,000 estimated
    assert refused.reply == 20
    said = str(refused)
    assert f"is {refused.used} (counted as the provider counts: " in said
    assert f"{refused.scale:.2f}x the token counter's estimate" in said
    assert "lower max_output_tokens" in said  # a reply budget is reserved
    assert len(session.entries) == entries  # nothing written
    assert len(model.requests) == 1


def test_a_calibrating_agent_is_refused_as_any_other() -> None:
    # A session's first run has learned no scale: what rides every request
    # is measured as it is, and at the line no session could ever begin.
    manager = ContextManager(context_window=1_000, counter=HEURISTIC, calibrate=True)
    with pytest.raises(ReserveTooLarge):
        Driver(
            model=ScriptedModel.of("never"),
            context=manager,
            system_prompt="abcd " * 400,  # 505 tokens
            max_output_tokens=460,
        )


class Billions:
    """A faulty counter: a billion tokens for any text."""

    def count(self, messages: object) -> int:
        return 1_000_000_000

    def count_text(self, text: str) -> int:
        return 1_000_000_000


def test_a_counter_at_fault_is_named_when_the_agent_is_built() -> None:
    """Nine characters of system prompt are not what is over the window."""
    manager = ContextManager(context_window=8_000, counter=Billions())

    with pytest.raises(ReserveTooLarge) as refused:
        Driver(
            model=ScriptedModel.of("never"), context=manager, system_prompt="Be brief."
        )

    assert refused.value.field == "counter"
    assert "Billions counted" in str(refused.value)
    assert "fix the counter" in str(refused.value)


class Framed:
    """A plain counter whose count of no messages is its framing, 10 tokens."""

    def count(self, messages: list[Message]) -> int:
        return 10 + sum(len(m.text) // 4 for m in messages)

    def count_text(self, text: str) -> int:
        return len(text) // 4


def test_an_agent_without_tools_reserves_nothing_for_them() -> None:
    manager = ContextManager(context_window=1_000, counter=Framed())

    with pytest.raises(ReserveTooLarge) as refused:
        Driver(
            model=ScriptedModel.of("never"), context=manager, system_prompt="x" * 8_000
        )

    assert refused.value.field == "system_prompt"
    assert "tool schemas 0," in str(refused.value)


async def test_a_compact_effect_of_the_users_that_drops_a_pin_fails_the_run() -> None:
    """A replaced `compact` effect is held to the pins like any strategy."""

    async def drop_first(ctx: EffectContext, decision: Compact) -> Event:
        messages = (*decision.history, *decision.pending)
        kept = messages[1:]
        return CompactionResult(messages=kept, before=9_000, after=100)

    session = Session()
    first = await Driver(model=ScriptedModel.of("ok")).run(
        history(3, 10), session=session
    )
    assert first.ok
    kept = list(session.history)
    manager = ContextManager(context_window=1_000, counter=HEURISTIC)
    driver = Driver(
        model=ScriptedModel.of("never"),
        context=manager,
        effects={"compact": drop_first},
    )

    result = await driver.run("q" * 3_400, session=session)

    assert isinstance(result.error, InvalidReturn)
    assert result.error.source == "effect 'compact'"
    assert "dropped the pinned user message u0" in str(result.error)
    assert list(session.history) == kept  # nothing committed is lost


async def test_a_run_filled_by_its_pins_says_so_not_to_summarise() -> None:
    # The first and the latest request are pinned: no strategy shrinks them,
    # so the error does not send the user to a summarising one.
    task = "Translate this contract. " + "Clause text. " * 189
    manager = ContextManager(TruncatingCompactor(), context_window=2_000)
    driver = Driver(model=ScriptedModel.of(*["Done."] * 6), context=manager)
    session = Session()
    await driver.run(task, session=session)
    for i in range(3):
        await driver.run(f"And clause {i}?", session=session)
    result = await driver.run("Now the annex. " + "Annex text. " * 189, session=session)

    assert isinstance(result.error, ContextExceeded)
    assert [item.pinned for item in result.error.largest[:2]] == [True, True]
    assert "pinned messages fill it" in str(result.error)
    assert "SummarizingCompactor" not in str(result.error)
