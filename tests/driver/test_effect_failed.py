"""An effect of yours that raises ends its run as a typed failure, not a crash."""

from __future__ import annotations

import functools
import logging
from typing import Any

import pytest

from turnfsm import Agent, review_machine
from turnfsm.core import Event, Measured, MessageInjected, Perform, Signal
from turnfsm.driver import Effect, EffectContext
from turnfsm.errors import ConfigError, EffectFailed, InvalidReturn
from turnfsm.messages import Message
from turnfsm.testing import ScriptedModel


async def review(ctx: EffectContext, decision: Perform) -> Event:
    raise ValueError("the reviewer is out to lunch")


def test_an_effect_that_raises_fails_the_run_with_a_typed_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    agent = Agent(
        model=ScriptedModel.of("a draft"),
        machine=review_machine(),
        effects={"review": review},
    )

    with caplog.at_level(logging.ERROR, logger="turnfsm.driver"):
        result = agent.run_sync("write a haiku")  # returns: no traceback escapes

    assert result.outcome == "failed"
    error = result.error
    assert isinstance(error, EffectFailed)
    assert (error.effect, error.type, error.message) == (
        "review",
        "ValueError",
        "the reviewer is out to lunch",
    )
    assert str(result.error).startswith(
        "effect 'review' raised ValueError: the reviewer is out to lunch"
    )
    assert list(agent.session.history) == []  # nothing the run said is committed
    assert agent.session.runs[-1].outcome == "failed"
    tracebacks = [r.exc_info for r in caplog.records if r.exc_info]
    assert len(tracebacks) == 1  # the traceback is in the log, once
    assert isinstance(tracebacks[0][1], ValueError)


class Unreadable(Exception):
    """An exception whose message cannot be read: its ``__str__`` raises."""

    def __str__(self) -> str:
        raise AttributeError("no such field")


async def unreadable(ctx: EffectContext, decision: Perform) -> Event:
    raise Unreadable


def test_an_effect_raising_an_exception_with_no_readable_message_fails_typed() -> None:
    agent = Agent(
        model=ScriptedModel.of("a draft"),
        machine=review_machine(),
        effects={"review": unreadable},
    )

    result = agent.run_sync("write a haiku")

    assert isinstance(result.error, EffectFailed)
    assert (result.error.type, result.error.message) == (
        "Unreadable",
        "(its message could not be read: str() raised AttributeError)",
    )
    assert agent.session.runs[-1].outcome == "failed"


class UnreadableClient:
    async def complete(self, request: object) -> object:
        raise Unreadable


def test_a_crash_on_an_exception_with_no_readable_message_is_logged_failed() -> None:
    agent = Agent(model=UnreadableClient())

    with pytest.raises(Unreadable):
        agent.run_sync("hi")

    run = agent.session.runs[-1]
    assert run.outcome == "failed"
    assert "Unreadable" in str(run.error)


def test_a_built_in_effect_that_raises_is_still_a_crash() -> None:
    """A bug of turnfsm's own is not dressed up: it propagates, logged as crashed."""

    class Broken:
        async def complete(self, request: object) -> object:
            raise RuntimeError("a bug in the client")

    agent = Agent(model=Broken())

    with pytest.raises(RuntimeError, match="a bug in the client"):
        agent.run_sync("hi")

    assert agent.session.runs[-1].outcome == "failed"  # logged as crashed


async def undeclared(ctx: EffectContext, decision: Perform) -> Event:
    return Signal("looks-good")  # the file declares 'approved' and 'revise'


async def measured(ctx: EffectContext, decision: Perform) -> Event:
    return Measured(estimate=10)  # another phase's event


@pytest.mark.parametrize(
    ("effect", "value"),
    [(undeclared, "Signal('looks-good')"), (measured, "Measured")],
    ids=["undeclared-signal", "another-phase's-event"],
)
def test_an_event_the_phase_has_no_transition_for_fails_the_run_naming_the_effect(
    effect: Effect, value: str
) -> None:
    agent = Agent(
        model=ScriptedModel.of("a draft"),
        machine=review_machine(),
        effects={"review": effect},
    )

    result = agent.run_sync("write a haiku")  # no IllegalEvent escapes

    assert result.outcome == "failed"
    error = result.error
    assert isinstance(error, InvalidReturn)
    assert (error.source, error.value) == ("effect 'review'", value)
    assert "'approved', 'message_injected', 'revise', 'run_cancelled'" in str(error)
    assert list(agent.session.history) == []


def test_an_effect_that_injects_a_message_fails_the_run_instead_of_looping() -> None:
    # The phase stays where it is on an injection, so the effect ran again
    # for as long as it returned one (for ever), and what it injected was
    # dropped when the run ended done.
    calls = [0]

    async def injecting(ctx: EffectContext, decision: Perform) -> Event:
        calls[0] += 1
        return MessageInjected(Message.user(f"note {calls[0]}"))

    agent = Agent(
        model=ScriptedModel.of("a draft"),
        machine=review_machine(),
        effects={"review": injecting},
    )

    result = agent.run_sync("write a haiku")

    assert calls == [1]
    assert result.outcome == "failed"
    error = result.error
    assert isinstance(error, InvalidReturn)
    assert (error.source, error.value) == ("effect 'review'", "MessageInjected")
    assert "return a signal whose transition names a key of its data" in str(error)
    assert list(agent.session.history) == []


async def bad_signal(ctx: EffectContext, decision: Perform) -> Event:
    return Signal("revise", {"feedback": 5})  # type: ignore[dict-item]  # not text


def test_a_value_an_effect_makes_wrong_fails_the_run_like_any_exception() -> None:
    agent = Agent(
        model=ScriptedModel.of("a draft"),
        machine=review_machine(),
        effects={"review": bad_signal},
    )

    result = agent.run_sync("write a haiku")  # the ConfigError does not escape

    error = result.error
    assert isinstance(error, EffectFailed)
    assert (error.effect, error.type) == ("review", "ConfigError")
    assert "data['feedback']=5" in error.message
    assert agent.session.runs[-1].outcome == "failed"


def plain_review(ctx: EffectContext, decision: Perform) -> Event:
    return Signal("approved")


async def approve(ctx: EffectContext, decision: Perform) -> Event:
    return Signal("approved")


@pytest.mark.parametrize(
    ("effects", "field", "says"),
    [
        (
            {"review": plain_review},
            "effects['review']",
            "an async function: it is a plain def, and it is awaited",
        ),
        (
            {"review": approve, "run_tools": lambda ctx, decision: None},
            "effects['run_tools']",
            "an async function: it is a plain def, and it is awaited",
        ),
        (
            {"review": approve, "run_tool": approve},
            "effects",
            "the name of an effect of machine 'review''s phases or of a built-in"
            " effect: call_llm, compact, measure, review, run_tools",
        ),
        (
            # The key is at fault: "effects[5]=<function approve>: expected an
            # async function" blamed the (async) function.
            {5: approve},
            "effects",
            "invalid effects=5: expected a string: the name of an effect of "
            "machine 'review''s phases",
        ),
        (
            {None: approve},
            "effects",
            "invalid effects=None: expected a string: the name of an effect",
        ),
    ],
    ids=[
        "a-plain-def",
        "a-plain-lambda-for-a-built-in",
        "a-misspelt-name",
        "a-key-not-a-string",
        "a-key-of-none",
    ],
)
def test_an_effect_that_cannot_run_is_refused_when_the_agent_is_made(
    effects: dict[str, object], field: str, says: str
) -> None:
    # A plain def ran until its first await (EffectFailed: "can't be used in
    # 'await' expression"); a misspelt name was ignored, the built-in ran.
    with pytest.raises(ConfigError) as raised:
        Agent(
            model=ScriptedModel.of("a draft"), machine=review_machine(), effects=effects
        )

    assert raised.value.field == field
    assert says in str(raised.value)


async def review_without_decision(ctx: EffectContext) -> Event:
    return Signal("approved")


async def review_with_a_third(
    ctx: EffectContext, decision: Perform, reviewer: str
) -> Event:
    return Signal("approved")


async def review_any(*args: object, strict: bool = False) -> Event:
    return Signal("approved")


@pytest.mark.parametrize(
    ("effect", "why"),
    [
        (review_without_decision, "too many positional arguments"),
        (review_with_a_third, "missing a required argument: 'reviewer'"),
    ],
    ids=["one-parameter", "a-required-third"],
)
def test_an_effect_that_cannot_take_its_call_is_refused_when_the_agent_is_made(
    effect: object, why: str
) -> None:
    # It was taken, and the run failed at the phase with EffectFailed:
    # "TypeError: review_without_decision() takes 1 positional argument ...".
    with pytest.raises(ConfigError) as raised:
        Agent(
            model=ScriptedModel.of("a draft"),
            machine=review_machine(),
            effects={"review": effect},
        )

    assert raised.value.field == "effects['review']"
    assert f"expected an effect called as effect(ctx, decision): {why}" in str(
        raised.value
    )


def test_an_effect_that_takes_its_call_its_own_way_runs() -> None:
    agent = Agent(
        model=ScriptedModel.of("a draft"),
        machine=review_machine(),
        effects={"review": review_any},
    )

    assert agent.run_sync("write a haiku").outcome == "done"


def test_an_async_callable_object_or_partial_is_an_effect() -> None:
    class Approve:
        async def __call__(self, ctx: EffectContext, decision: Perform) -> Event:
            return Signal("approved")

    for effect in (Approve(), functools.partial(approve)):
        agent = Agent(
            model=ScriptedModel.of("a draft"),
            machine=review_machine(),
            effects={"review": effect},
        )
        assert agent.run_sync("write a haiku").outcome == "done"


def test_good_effects_are_checked_without_listing_the_known_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The sorted list of known effects, which only a refusal prints, was
    # built for every agent and driver made.
    from turnfsm.driver import _inputs

    listed: list[object] = []

    def counting_sorted(*args: Any, **kwargs: Any) -> list[Any]:
        listed.append(args[0])
        return sorted(*args, **kwargs)

    monkeypatch.setattr(_inputs, "sorted", counting_sorted, raising=False)
    machine = review_machine()
    Agent(
        model=ScriptedModel.of("a draft"), machine=machine, effects={"review": approve}
    )

    assert listed == []
    with pytest.raises(ConfigError, match="call_llm, compact, measure, review"):
        Agent(
            model=ScriptedModel.of("a draft"),
            machine=machine,
            effects={"review": approve, "run_tool": approve},
        )
