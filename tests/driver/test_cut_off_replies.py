"""Replies the provider stopped short: cut off by their budget, or withheld.

A reply's `ModelResponse.finish_reason` says why it ended; one that is no
usable answer fails the run at once, naming what to change, instead of
being blamed on the output type and asked again.
"""

from __future__ import annotations

import attrs
import pytest

from tests.driver.test_output import Person
from turnfsm.core import ContextOverflowed, ModelFailed
from turnfsm.driver import Driver, replay
from turnfsm.errors import ProviderError
from turnfsm.messages import Message, ToolCallPart
from turnfsm.persistence import Session
from turnfsm.providers import ModelPrices, ModelResponse
from turnfsm.testing import ScriptedModel
from turnfsm.values import Usage

pytestmark = pytest.mark.anyio


def _cut(message: Message | str, reason: str = "length") -> ModelResponse:
    if isinstance(message, str):
        message = Message.assistant(message)
    return ModelResponse(message=message, finish_reason=reason)


async def test_an_answer_cut_off_by_the_budget_names_the_budget_not_the_type() -> None:
    model = ScriptedModel.of(_cut('{"name": "Ada", "a'))

    result = await Driver(model=model, output_type=Person, max_output_tokens=8).run(
        "go"
    )

    assert isinstance(result.error, ProviderError), result.error
    assert result.error.kind == "max_tokens"
    assert "max_output_tokens=8" in str(result.error)
    assert len(model.requests) == 1  # not asked again: it would be cut again


async def test_a_whole_answer_at_the_budget_is_the_output() -> None:
    model = ScriptedModel.of(_cut('{"name": "Ada", "age": 36}'))

    result = await Driver(model=model, output_type=Person).run("go")

    assert result.output == Person("Ada", 36)


async def test_a_tool_call_cut_off_by_the_budget_fails_naming_the_budget() -> None:
    def lookup(name: str) -> str:
        """Look a person up."""
        return "36"

    call = ToolCallPart(id="c1", name="lookup", arguments={"_raw": '{"name": "A'})
    model = ScriptedModel.of(_cut(Message.assistant(tool_calls=[call])))

    result = await Driver(model=model, tools=[lookup]).run("go")

    assert isinstance(result.error, ProviderError), result.error
    assert result.error.kind == "max_tokens"
    assert "'lookup'" in str(result.error)
    assert "client's max_tokens" in str(result.error)


async def test_plain_text_cut_off_stands() -> None:
    model = ScriptedModel.of(_cut("The answer is"))

    result = await Driver(model=model).run("go")

    assert (result.ok, result.text) == (True, "The answer is")


async def test_a_reply_the_content_filter_withheld_fails_the_run() -> None:
    model = ScriptedModel.of(_cut("", "content_filter"))

    result = await Driver(model=model).run("go")

    assert isinstance(result.error, ProviderError), result.error
    assert (result.error.kind, result.error.retryable) == ("content_filter", False)


async def test_filtered_text_that_came_stands() -> None:
    model = ScriptedModel.of(_cut("Part of it", "content_filter"))

    result = await Driver(model=model).run("go")

    assert (result.ok, result.text) == (True, "Part of it")


async def test_a_refusal_is_not_blamed_on_the_type_nor_asked_again() -> None:
    model = ScriptedModel.of(_cut("I can't help with that.", "content_filter"))

    result = await Driver(model=model, output_type=Person).run("go")

    assert isinstance(result.error, ProviderError), result.error
    assert result.error.kind == "content_filter"
    assert "I can't help with that." in str(result.error)
    assert len(model.requests) == 1


async def test_a_scripted_usage_keeps_the_finish_reason() -> None:
    model = ScriptedModel([_cut('{"name": "A')], usage=Usage(input_tokens=3))

    result = await Driver(model=model, output_type=Person).run("go")

    assert isinstance(result.error, ProviderError), result.error
    assert result.error.kind == "max_tokens"


async def test_a_reply_cut_off_before_any_answer_fails_naming_the_budget() -> None:
    model = ScriptedModel.of(_cut(""))  # a reasoning model's thinking took it all

    result = await Driver(model=model, max_output_tokens=16).run("go")

    assert isinstance(result.error, ProviderError), result.error
    assert result.error.kind == "max_tokens"
    assert "with no answer yet" in str(result.error)


async def test_what_an_unusable_reply_cost_counts_in_the_run() -> None:
    # The run failed on a cut-off reply whose tokens the provider billed, and
    # said it had used nothing.
    spent = Usage(input_tokens=10, output_tokens=5)
    cut = attrs.evolve(_cut('{"name": "Tok'), usage=spent)
    driver = Driver(
        model=ScriptedModel.of(cut),
        output_type=Person,
        prices=ModelPrices(
            model="m", input=1_000_000, cached_input=0, output=2_000_000
        ),
    )
    session = Session()

    result = await driver.run("go", session=session)

    assert result.error is not None
    assert result.usage == spent
    assert result.reported_calls == 1
    assert result.cost == pytest.approx(20.0)
    (run,) = session.runs
    assert run.usage == spent
    assert run.call_usages == (spent,)
    assert run.reported_calls == 1
    (failed,) = [e for e in run.events if isinstance(e, ModelFailed)]
    assert failed.usage == spent  # kept in the log
    assert (await Session.load(session.store, session.id)).runs[0].usage == spent
    assert replay(None, session, run.run_id).ok  # its end's usage is its calls'


async def test_what_a_reply_over_the_window_cost_counts_in_the_run() -> None:
    # The reply did not fit beside the conversation, so it was not committed;
    # the provider billed it all the same, and the run said it used nothing.
    spent = Usage(input_tokens=10, output_tokens=5)
    huge = ModelResponse(message=Message.assistant("word " * 5_000), usage=spent)
    driver = Driver(
        model=ScriptedModel.of(huge),
        context_window=2_000,
        prices=ModelPrices(
            model="m", input=1_000_000, cached_input=0, output=2_000_000
        ),
    )
    session = Session()

    result = await driver.run("go", session=session)

    assert not result.ok
    assert (result.usage, result.reported_calls) == (spent, 1)
    assert result.cost == pytest.approx(20.0)
    (run,) = session.runs
    (refused,) = [e for e in run.events if isinstance(e, ContextOverflowed)]
    assert refused.usage == spent  # kept in the log
    assert (await Session.load(session.store, session.id)).runs[0].usage == spent
    assert replay(None, session, run.run_id).ok  # its end's usage is its calls'
