"""A paused run is answered from outside, never by a start or a step's outcome.

A machine file of one's own may give a pause phase a transition on any
trigger; fed to a paused run as its answer, a run's start crashed it
(``IllegalEvent``), and a compaction result wiped the committed history,
pins and all, with none of the checks its pass makes. And a failed run
commits nothing, on whatever transition it fails.
"""

from __future__ import annotations

import anyio
import pytest

from tests.core.test_termination import edit, problems_of
from tests.helpers import turn_toml_text
from turnfsm import Agent
from turnfsm.core import CompactionResult, MachineSpec, RunStarted, Signal
from turnfsm.errors import ConfigError
from turnfsm.messages import Message
from turnfsm.testing import ScriptedModel


def _with_gate() -> MachineSpec:
    """The stock machine, starting paused in `gate` until a `go`."""
    text = turn_toml_text().replace('initial = "start"', 'initial = "gate"')
    text = edit(
        text,
        'terminal = ["done", "failed"]\n',
        'terminal = ["done", "failed"]\nsignals = ["go"]\n',
    )
    text = edit(text, "[states]\n", '[states]\ngate = { decision = "pause" }\n')
    text = edit(
        text,
        '[[transitions]]\ntrigger = "run_started"\nsource = "start"\n',
        '[[transitions]]\ntrigger = "run_started"\nsource = "gate"\n',
    )
    text += (
        '\n[[transitions]]\ntrigger = "go"\nsource = "gate"\ndest = "start"\n\n'
        '[[transitions]]\ntrigger = "compaction_result"\nsource = "gate"\n'
        'dest = "start"\nactions = ["record_compaction"]\n'
    )
    return MachineSpec.from_toml(text)


def test_a_start_or_a_steps_outcome_is_no_answer_and_leaves_the_run_paused() -> None:
    agent = Agent(model=ScriptedModel.of("first", "second"), machine=_with_gate())

    async def main() -> None:
        assert (await agent.run("first question")).outcome == "paused"
        await agent.resume(
            agent.session.id, agent.session.runs[-1].run_id, Signal(name="go")
        )
        committed = list(agent.session.history)
        paused = await agent.run("second question")
        assert paused.waiting is not None
        assert paused.waiting.answers == ("go", "message_injected", "run_cancelled")
        for answer in (
            RunStarted(input=(Message.user("again"),)),
            CompactionResult(messages=(), before=100, after=0),
        ):
            with pytest.raises(ConfigError) as refused:
                await agent.resume(agent.session.id, paused.run_id, answer)
            assert refused.value.field == "event"
            assert "accepts: go, message_injected, run_cancelled" in str(refused.value)
            assert list(agent.session.history) == committed  # nothing wiped
        done = await agent.resume(agent.session.id, paused.run_id, Signal(name="go"))
        assert done.text == "second"

    anyio.run(main)


def test_a_pass_adopted_on_the_way_into_a_fail_phase_is_refused() -> None:
    text = edit(
        turn_toml_text(),
        'trigger = "compaction_result"\n'
        'source = ["compact", "compact_and_retry"]\ndest = "failed"\n'
        'conditions = ["is_no_progress"]\nerror = "compaction_stalled"\n',
        'trigger = "compaction_result"\n'
        'source = ["compact", "compact_and_retry"]\ndest = "failed"\n'
        'conditions = ["is_no_progress"]\nerror = "compaction_stalled"\n'
        'actions = ["record_compaction"]\n',
    )

    assert (
        "'record_compaction' commits a pass's result, but this transition ends the"
        " run in fail phase 'failed', and a failed run commits nothing: take"
        " 'record_compaction' out of its actions"
    ) in problems_of(text)


@pytest.mark.parametrize("name", ["compact", "call_llm", "run_tools", "measure"])
def test_a_phase_of_ones_own_named_as_a_built_in_step_is_refused(name: str) -> None:
    # It loaded, and ran the built-in step on its own decision: AttributeError.
    text = edit(
        turn_toml_text(), "[states]\n", f'[states]\nmine = {{ effect = "{name}" }}\n'
    )
    text += (
        '\n[[transitions]]\ntrigger = "tools_finished"\nsource = "mine"\n'
        'dest = "start"\n'
    )

    assert (
        f"state 'mine': effect {name!r} is a built-in step's name: give your effect"
        f" another name, or write decision = {name!r} for the built-in step"
    ) in problems_of(text)
