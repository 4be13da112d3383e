"""What runs cost, in US dollars, and how a caller's sub-agents' costs roll up."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import anyio
import attrs
import pytest

from tests.driver.test_subagent_resume import CHILD_USAGE as RESUME_USAGE
from tests.driver.test_subagent_resume import answering_child, stop_then_resume
from tests.driver.test_subagents import (
    CHILD_USAGE,
    PARENT_USAGE,
    parent_model,
    reader,
    write_files,
)
from turnfsm import Agent
from turnfsm.driver import Driver, RunControl
from turnfsm.errors import ConfigError
from turnfsm.providers import ModelPrices, ModelRequest, ModelResponse, known_prices
from turnfsm.testing import FakeModelClient, reply, tool_call
from turnfsm.values import Usage

pytestmark = pytest.mark.anyio

LEAD = ModelPrices(
    model="lead", input=Decimal(10), cached_input=Decimal(1), output=Decimal(30)
)
SMALL = ModelPrices(
    model="small", input=Decimal(1), cached_input=Decimal(0), output=Decimal(2)
)


def dollars(prices: ModelPrices, calls: int, usage: object) -> float:
    return calls * float(prices.usage_cost(usage))  # type: ignore[arg-type]


async def test_the_lead_pays_its_calls_and_its_sub_agents_roll_up() -> None:
    write_files()
    child = reader(prices=SMALL)
    lead = Agent(
        model=parent_model(),
        tools=[child.as_tool(name="reader", description="Reads one file.")],
        prices=LEAD,
    )
    result = await lead.run("What is the grand total?")

    assert result.outcome == "done", result.error
    # Two lead calls; three children of two calls each (a read, an answer).
    assert result.cost == pytest.approx(dollars(LEAD, 2, PARENT_USAGE))
    assert result.children_cost == pytest.approx(dollars(SMALL, 6, CHILD_USAGE))
    assert result.cost_with_children == pytest.approx(
        result.cost + result.children_cost
    )
    assert result.cost == pytest.approx(2 * (100 * 10 + 5 * 30) / 1e6)


async def test_a_sub_agent_without_prices_makes_the_roll_up_unknown() -> None:
    write_files()
    lead = Agent(
        model=parent_model(),
        tools=[reader().as_tool(name="reader", description="Reads one file.")],
        prices=LEAD,
    )
    result = await lead.run("What is the grand total?")
    assert result.cost is not None
    assert result.children_cost is None  # their usage is counted all the same
    assert result.cost_with_children is None
    assert result.children_usage.input_tokens == 6 * CHILD_USAGE.input_tokens


async def test_a_run_without_prices_costs_nothing_known_and_no_children_cost_0() -> (
    None
):
    result = await Agent(model=parent_model(), tools=[]).run("hi")
    assert result.cost is None
    assert result.children_cost == 0.0


async def test_a_resumed_caller_counts_what_its_earlier_children_cost() -> None:
    # Stopped before its third call, resumed by another agent: two children
    # answered before the resume, one after; all three cost the same.
    child = answering_child()
    child.driver = attrs.evolve(child.driver, prices=SMALL)
    tool = child.as_tool(name="reader", description="Read")
    result, _, _ = await stop_then_resume(tool, 3)

    assert result.outcome == "done", result.error
    assert result.children_cost == pytest.approx(dollars(SMALL, 3, RESUME_USAGE))


def test_prices_are_model_prices_or_a_known_models_name() -> None:
    # As ContextManager(prices=...) takes them.
    agent = Agent(model=parent_model(), prices="gpt-4o")
    assert agent.driver.prices == known_prices("gpt-4o") is not None
    driver = Driver(model=parent_model(), prices="gpt-4o")
    assert driver.prices == known_prices("gpt-4o")
    for bad in ("no-such-model", 3):
        for make in (Agent, Driver):
            with pytest.raises(ConfigError) as caught:
                make(model=parent_model(), prices=bad)
            assert (caught.value.field, caught.value.value) == ("prices", bad)
            assert "or None, or None" not in str(caught.value)


async def test_a_cancelled_callers_children_still_count_what_they_used() -> None:
    stuck = anyio.Event()
    used = Usage(input_tokens=500, output_tokens=5)

    def noop() -> str:
        """Do nothing."""
        return "ok"

    async def child_model(request: ModelRequest) -> ModelResponse:
        if request.messages[-1].tool_results:
            stuck.set()
            await anyio.sleep_forever()
        return ModelResponse(message=reply("", tool_call("noop", "n1")), usage=used)

    child = Agent(model=FakeModelClient(child_model), tools=[noop], prices=SMALL)
    lead = Agent(
        model=parent_model(),
        tools=[child.as_tool(name="reader", description="Reads one file.")],
        prices=LEAD,
    )
    control = RunControl()
    outcome: list[Any] = []

    async def run() -> None:
        outcome.append(await lead.run("What is the grand total?", control=control))

    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            group.start_soon(run)
            await stuck.wait()
            control.cancel("stop")
    (result,) = outcome
    assert result.outcome == "cancelled"
    # Three readers started; each made its first call before the cancel.
    assert result.children_usage.input_tokens % used.input_tokens == 0
    assert result.children_usage.input_tokens >= used.input_tokens
    calls = result.children_usage.input_tokens // used.input_tokens
    assert result.children_cost == pytest.approx(dollars(SMALL, calls, used))


CACHING = ModelPrices(
    model="caching",
    input=Decimal(10),
    cached_input=Decimal(1),
    output=Decimal(30),
    cache_write=Decimal("12.5"),
)
CACHED_USAGE = Usage(
    input_tokens=1_000_000,
    output_tokens=10_000,
    cache_read_tokens=800_000,
    cache_write_tokens=100_000,
)


def test_cache_reads_and_writes_are_priced_at_their_own_rates() -> None:
    # 100k fresh at $10, 100k written at $12.50, 800k read at $1, 10k out at $30.
    assert CACHING.usage_cost(CACHED_USAGE) == Decimal("3.35")
    plain = Usage(input_tokens=1_000_000, output_tokens=10_000)
    assert CACHING.usage_cost(plain) == Decimal("10.3")


async def test_a_run_whose_provider_served_its_prompt_from_cache_costs_that() -> None:
    model = FakeModelClient(
        lambda _: ModelResponse(message=reply("hi"), usage=CACHED_USAGE)
    )
    result = await Agent(model=model, prices=CACHING).run("hi")
    assert result.outcome == "done", result.error
    assert result.usage == CACHED_USAGE
    assert result.cost == pytest.approx(3.35)


async def test_a_resumed_caller_counts_what_its_earlier_failed_children_cost() -> None:
    # Each child's one reply is cut off at its budget: the run fails, but the
    # provider billed the reply. A resumed caller reads what its earlier
    # children cost from their logs; it counted their turns only.
    def cut_off(request: ModelRequest) -> ModelResponse:
        # A reasoning model's thinking took the whole budget: no answer yet.
        return ModelResponse(
            message=reply(""), usage=RESUME_USAGE, finish_reason="length"
        )

    child = Agent(model=FakeModelClient(cut_off), prices=SMALL)
    tool = child.as_tool(name="reader", description="Read")
    result, _, _ = await stop_then_resume(tool, 3)

    assert result.outcome == "done", result.error
    assert "max_tokens" in result.text
    assert result.children_usage == Usage(
        input_tokens=3 * RESUME_USAGE.input_tokens,
        output_tokens=3 * RESUME_USAGE.output_tokens,
    )
    assert result.children_cost == pytest.approx(dollars(SMALL, 3, RESUME_USAGE))


async def test_a_run_whose_provider_reported_no_usage_has_no_known_cost() -> None:
    # It said $0.00: a bill that leaves out every call it made.
    quiet = Agent(model=FakeModelClient(lambda _: "hi"), prices=SMALL)
    result = await quiet.run("hi")
    assert result.outcome == "done", result.error
    assert result.reported_calls == 0
    assert result.cost is None
    assert result.cost_with_children is None


async def test_a_quiet_sub_agent_makes_the_roll_up_unknown() -> None:
    # Its provider reports no usage: what it cost is not known.
    quiet = Agent(model=FakeModelClient(lambda _: "done"), prices=SMALL)
    tool = quiet.as_tool(name="reader", description="Read")
    result, _, _ = await stop_then_resume(tool, 3)
    assert result.outcome == "done", result.error
    assert result.children_cost is None
