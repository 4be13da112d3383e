"""Sub-agent phases a machine file declares, run by the driver."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from turnfsm import Agent, Driver, approval_machine, load_machine, machines_dir
from turnfsm.core import MachineSpec, ToolCallsReviewed
from turnfsm.driver import replay
from turnfsm.errors import ConfigError, EffectFailed, SubagentWaiting
from turnfsm.messages import Message
from turnfsm.persistence import MemoryStore, Session, child_sessions, parent_of
from turnfsm.providers import ModelRequest
from turnfsm.testing import FakeModelClient, reply, tool_call

pytestmark = pytest.mark.anyio

REVIEW = (machines_dir() / "review.toml").read_text()


def reviewed(tmp_path: Path, **settings: Any) -> MachineSpec:
    """The review machine, its review phase running the sub-agent `critic`."""
    table = {
        "machine": '"turn.toml"',
        "signal": '"revise"',
        "key": '"feedback"',
        "routes": '{ approved = "APPROVED" }',
        "task": '"Check {reply} (asked: {request})"',
        **settings,
    }
    text = REVIEW.replace('name = "review"', 'name = "reviewed"').replace(
        'await_review      = { effect = "review" }',
        'await_review      = { subagent = "critic" }',
    )
    text += "\n[subagents.critic]\n" + "".join(
        f"{key} = {value}\n" for key, value in table.items()
    )
    path = tmp_path / "reviewed.toml"
    path.write_text(text)
    return load_machine(path)


def writer(*drafts: str) -> FakeModelClient:
    answers = iter(drafts)
    return FakeModelClient(lambda request: reply(next(answers)))


def critic(tasks: list[str]) -> Agent:
    def review(request: ModelRequest) -> Message:
        task = request.messages[-1].text
        tasks.append(task)
        return reply("approved." if task.startswith("Check France") else "No: France.")

    return Agent(model=FakeModelClient(review))


async def test_the_phase_runs_the_declared_sub_agent_and_routes_on_its_answer(
    tmp_path: Path,
) -> None:
    tasks: list[str] = []
    store = MemoryStore()
    agent = Agent(
        model=writer("Italy.", "France."),
        machine=reviewed(tmp_path),
        subagents={"critic": critic(tasks)},
        store=store,
    )
    result = await agent.run("Where is Paris?")

    assert result.outcome == "done", result.error
    assert [m.text for m in agent.session.history] == [
        "Where is Paris?",
        "Italy.",
        "No: France.",
        "France.",
    ]
    # The task is the file's template, filled from the conversation.
    assert tasks == [
        "Check Italy. (asked: Where is Paris?)",
        "Check France. (asked: No: France.)",
    ]
    children = await child_sessions(store, agent.session.id)
    assert [c.runs[0].text for c in children] == ["No: France.", "approved."]
    links = [parent_of(c) for c in children]
    assert all(link is not None for link in links)
    assert {link.run_id for link in links if link} == {result.run_id}
    assert [link.call_id.split("-")[0] for link in links if link] == [
        "await_review",
        "await_review",
    ]
    # The log replays, on the machine it keeps.
    assert replay(None, agent.session, result.run_id).ok


async def test_max_children_from_the_file_bounds_the_reviews(tmp_path: Path) -> None:
    tasks: list[str] = []
    never = critic(tasks)  # never approves: no draft names France
    driver = Driver(
        model=writer("a", "b", "c", "d"),
        machine=reviewed(tmp_path, max_children=2),
        subagents={"critic": never.driver},
    )
    result = await driver.run("Where is Paris?")

    assert result.outcome == "failed"
    assert isinstance(result.error, EffectFailed)
    assert result.error.type == "SubagentTooMany"
    assert len(tasks) == 2

    routed = Driver(
        model=writer("a", "b", "c", "d"),
        machine=reviewed(tmp_path, max_children=2, on_failure='"approved"'),
        subagents={"critic": critic([]).driver},
    )
    assert (await routed.run("Where is Paris?")).outcome == "done"


def test_the_driver_refuses_sub_agents_that_do_not_fit_the_file(
    tmp_path: Path,
) -> None:
    machine = reviewed(tmp_path)
    child = critic([]).driver
    model = writer("x")

    with pytest.raises(ConfigError) as missing:
        Driver(model=model, machine=machine)
    assert missing.value.field == "subagents"
    assert "an agent for the sub-agent 'critic' that phase 'await_review' runs" in str(
        missing.value
    )

    with pytest.raises(ConfigError) as extra:
        Driver(model=model, machine=machine, subagents={"critic": child, "x": child})
    assert extra.value.field == "subagents['x']"

    with pytest.raises(ConfigError) as wrong:
        Driver(model=model, machine=machine, subagents={"critic": "an agent"})
    assert wrong.value.field == "subagents['critic']"

    other = Agent(model=writer("x"), machine=approval_machine())
    with pytest.raises(ConfigError) as machine_error:
        Driver(model=model, machine=machine, subagents={"critic": other.driver})
    assert machine_error.value.field == "subagents['critic'].machine"
    assert "turn.toml" in str(machine_error.value)

    async def effect(ctx: Any, decision: Any) -> Any:
        raise AssertionError

    with pytest.raises(ConfigError) as clash:
        Driver(
            model=model,
            machine=machine,
            subagents={"critic": child},
            effects={"critic": effect},
        )
    assert clash.value.field == "effects['critic']"


async def test_a_machine_read_from_the_log_runs_its_sub_agent_on_resume(
    tmp_path: Path,
) -> None:
    # Read from data alone (as a log keeps it), the machine has no child
    # machine to check against: any agent given runs the phase.
    machine = MachineSpec.from_dict(reviewed(tmp_path).to_dict())
    assert machine.children == {}
    session = Session(store=MemoryStore())
    driver = Driver(
        model=writer("France."),
        machine=machine,
        subagents={"critic": critic([]).driver},
    )
    result = await driver.run("Where is Paris?", session=session)
    assert result.outcome == "done"


def approving_critic(ran: list[str]) -> Agent:
    """A critic on the approval machine: it checks the draft with a tool first."""

    def check(draft: str) -> str:
        """Check a draft."""
        ran.append(draft)
        return "fine"

    def review(request: ModelRequest) -> Message:
        if request.messages[-1].tool_results:
            return reply("APPROVED")
        return reply("", tool_call("check", "k1", draft="France."))

    return Agent(
        model=FakeModelClient(review), tools=[check], machine=approval_machine()
    )


async def test_a_phase_whose_sub_agent_waits_for_approval_is_answered_through_it(
    tmp_path: Path,
) -> None:
    ran: list[str] = []
    store = MemoryStore()
    critic_agent = approving_critic(ran)

    def lead() -> Agent:
        return Agent(
            model=writer("France."),
            machine=reviewed(tmp_path, machine='"approval.toml"'),
            subagents={"critic": critic_agent},
            store=store,
        )

    first = await lead().run("Where is Paris?")
    assert first.outcome == "interrupted"
    assert isinstance(first.error, SubagentWaiting)
    assert first.error.calls == ("k1",)
    assert ran == []

    done = await lead().resume(
        first.session_id, first.run_id, ToolCallsReviewed.approve_all()
    )
    assert done.outcome == "done", done.error
    assert done.text == "France."
    assert ran == ["France."]


async def test_a_phase_with_no_task_fails_typed_and_runs_no_sub_agent(
    tmp_path: Path,
) -> None:
    tasks: list[str] = []
    driver = Driver(
        model=writer(""),  # the reply the task is made of is empty
        machine=reviewed(tmp_path, task='"{reply}"'),
        subagents={"critic": critic(tasks).driver},
    )
    result = await driver.run("Where is Paris?")
    assert result.outcome == "failed"
    assert isinstance(result.error, EffectFailed)
    assert result.error.type == "SubagentFailed"
    assert "did not run: its task is ''" in result.error.message
    assert tasks == []


@pytest.mark.parametrize("blank", ["", "  \n"], ids=["empty", "blank"])
async def test_a_blank_answer_ends_the_phase_as_a_failed_child_does(
    tmp_path: Path, blank: str
) -> None:
    """A child that answers nothing (it ended done with no text) did not answer.

    It failed the run with `InvalidMessage` blaming the machine file (the
    signal's data 'feedback' is blank): the child's blank answer was routed to
    `revise`, whose transition adds it to the conversation.
    """
    mute = Driver(model=writer(blank, blank))
    driver = Driver(
        model=writer("Italy."),
        machine=reviewed(tmp_path),
        subagents={"critic": mute},
    )
    result = await driver.run("Where is Paris?")

    assert result.outcome == "failed"
    assert isinstance(result.error, EffectFailed), result.error
    assert result.error.type == "SubagentFailed"
    assert (
        f"the sub-agent 'critic' ended done: its answer is blank ({blank!r}: the"
        " text of its last reply), and a sub-agent phase ends on its answer"
    ) in result.error.message
    # With on_failure, the file routes it.
    routed = Driver(
        model=writer("Italy."),
        machine=reviewed(tmp_path, on_failure='"approved"'),
        subagents={"critic": Driver(model=writer(blank))},
    )
    done = await routed.run("Where is Paris?")
    assert (done.outcome, done.text) == ("done", "Italy.")


async def test_a_phase_sub_agent_that_times_out_ends_with_on_failure(
    tmp_path: Path,
) -> None:
    # Its timeout ended the caller's run cancelled, as a custom effect's
    # does, though on_failure names the signal for a sub-agent that does
    # not answer; without on_failure it still does.
    async def slow(x: str) -> str:
        """Look slowly.

        Args:
            x: What.
        """
        await anyio.sleep(30)
        return "seen"

    def looking() -> Driver:
        look = reply("", tool_call("slow", x="a"))
        return Driver(model=FakeModelClient(lambda request: look), tools=[slow])

    routed = Driver(
        model=writer("Italy."),
        machine=reviewed(tmp_path, on_failure='"approved"'),
        subagents={"critic": looking()},
        effect_timeout=0.5,
    )
    with anyio.fail_after(20):
        done = await routed.run("Where is Paris?")
    assert (done.outcome, done.text) == ("done", "Italy.")

    plain = Driver(
        model=writer("Italy."),
        machine=reviewed(tmp_path),
        subagents={"critic": looking()},
        effect_timeout=0.5,
    )
    with anyio.fail_after(20):
        cancelled = await plain.run("Where is Paris?")
    assert cancelled.outcome == "cancelled"
    assert "effect 'critic' timed out" in str(cancelled.error)
