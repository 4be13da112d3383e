"""Cycles through compaction passes that the no-progress guard cannot bound.

The guard bounds a cycle of passes only while each pass lowers the size the
next one starts from: its result adopted, and nothing on the cycle adding
to the conversation again. Each machine here passed the check and ran
passes for ever (or called the model unmeasured); each is refused, naming
why, and runs of the same shape that are bounded still load.
"""

from __future__ import annotations

import anyio
import pytest

from tests.core.test_termination import edit, problems_of
from tests.helpers import turn_toml_text
from turnfsm import Agent, ContextManager, TruncatingCompactor
from turnfsm.core import MachineSpec
from turnfsm.messages import Message
from turnfsm.testing import ScriptedModel

UNBOUNDED = "is not bounded by a model call, a retry counter or the no-progress guard"

MINI = """
name = "mini"
initial = "start"
terminal = ["done", "failed"]

[states]
start    = { decision = "measure", on_enter = ["flush_inbox"] }
call_llm = { decision = "call_llm" }
compact  = { decision = "compact" }
done     = { decision = "finish", on_enter = ["commit_pending"] }
failed   = { decision = "fail", on_enter = ["discard_pending"] }

[[transitions]]
trigger = "run_started"
source = "start"
actions = ["record_start"]

[[transitions]]
trigger = "measured"
source = "start"
dest = "failed"
conditions = ["is_turn_limit_reached"]
error = "max_turns_exceeded"

[[transitions]]
trigger = "measured"
source = "start"
dest = "failed"
conditions = ["is_over_emergency_line", "is_compaction_limit_reached"]
error = "compaction_limit_exceeded"

[[transitions]]
trigger = "measured"
source = "start"
dest = "compact"
conditions = ["is_over_emergency_line"]
reason = "emergency"
actions = ["record_estimate"]

[[transitions]]
trigger = "measured"
source = "start"
dest = "call_llm"
actions = ["record_estimate"]

[[transitions]]
trigger = "model_replied"
source = "call_llm"
dest = "failed"
conditions = ["has_tool_calls"]
error = "max_turns_exceeded"

[[transitions]]
trigger = "model_replied"
source = "call_llm"
dest = "done"
actions = ["record_reply"]

[[transitions]]
trigger = "context_overflowed"
source = "call_llm"
dest = "failed"
error = "context_exceeded"

[[transitions]]
trigger = "model_failed"
source = "call_llm"
dest = "failed"
error = "provider_error"

[[transitions]]
trigger = "compaction_result"
source = "compact"
dest = "failed"
conditions = ["is_no_progress"]
error = "compaction_stalled"

[[transitions]]
trigger = "compaction_result"
source = "compact"
dest = "start"
actions = ["record_compaction", "count_compaction"]

[[transitions]]
trigger = "compaction_noop"
source = "compact"
dest = "failed"
error = "compaction_stalled"

[[transitions]]
trigger = "compaction_overflowed"
source = "compact"
dest = "failed"
error = "context_exceeded"

[[transitions]]
trigger = "compactor_failed"
source = "compact"
dest = "failed"
error = "compaction_failed"

[[transitions]]
trigger = "compaction_circuit_opened"
source = "compact"
dest = "failed"
error = "compaction_circuit_open"

[[transitions]]
trigger = "run_cancelled"
source = "*"
dest = "failed"
error = "cancelled"
"""
"""A small machine that loads: every pass's result adopted, then measured."""

ADOPTED = (
    '[[transitions]]\ntrigger = "compaction_result"\nsource = "compact"\n'
    'dest = "start"\nactions = ["record_compaction", "count_compaction"]\n'
)


def test_the_small_machine_loads_and_ends() -> None:
    spec = MachineSpec.from_toml(MINI)
    agent = Agent(
        model=ScriptedModel.of("done"),
        machine=spec,
        context=ContextManager(TruncatingCompactor(), context_window=2_000),
        max_compactions=3,
    )
    history = [Message.user(f"note {i} " + "x" * 300) for i in range(25)]

    async def run() -> object:
        with anyio.fail_after(10):
            return await agent.run(history)

    result = anyio.run(run)
    assert result.outcome in ("done", "failed")


def test_a_result_let_through_the_guard_but_never_adopted_is_refused() -> None:
    # Each pass found the same conversation and saved the same again: the
    # guard never fired, and 18,000 passes ran in ten seconds.
    text = edit(
        MINI,
        ADOPTED,
        '[[transitions]]\ntrigger = "compaction_result"\nsource = "compact"\n'
        'actions = ["count_compaction"]\n',
    )

    assert problems_of(text) == (
        f"cycle compact -[compaction_result]-> compact {UNBOUNDED} (its "
        "'compaction_result' out of 'compact' passes the no-progress guard without"
        " 'record_compaction': the next pass finds the same conversation and saves"
        " the same again)",
    )


def test_a_result_of_an_effect_of_ones_own_adopted_on_the_cycle_is_refused() -> None:
    # The effect put back what the pass cut, honestly sized: every pass saved
    # something, and the cycle never ended.
    text = edit(
        MINI,
        ADOPTED,
        '[[transitions]]\ntrigger = "compaction_result"\nsource = "compact"\n'
        'dest = "regrow"\nactions = ["record_compaction", "count_compaction"]\n\n'
        '[[transitions]]\ntrigger = "compaction_result"\nsource = "regrow"\n'
        'dest = "compact"\nreason = "emergency"\nactions = ["record_compaction"]\n',
    )
    text = edit(
        text,
        'compact  = { decision = "compact" }\n',
        'compact  = { decision = "compact" }\nregrow   = { effect = "regrow" }\n',
    )

    (problem,) = problems_of(text)
    assert problem.startswith(
        "cycle regrow -[compaction_result]-> compact -[compaction_result]-> regrow"
    )
    assert (
        "(its 'compaction_result' adopts the messages of a step that is no "
        "compaction pass as the conversation, undoing what a pass saved" in problem
    )


def test_a_phase_that_takes_in_injections_at_once_on_the_cycle_is_refused() -> None:
    # A hook injected a note after every pass: the estimate went back over
    # the threshold each time, and 35,000 steps ran with no model call.
    text = edit(
        MINI,
        'start    = { decision = "measure", on_enter = ["flush_inbox"] }\n',
        'start    = { decision = "measure" }\ntidy     = { effect = "tidy" }\n',
    )
    text = edit(
        text,
        'terminal = ["done", "failed"]\n',
        'terminal = ["done", "failed"]\nsignals = ["go"]\n',
    )
    text = edit(
        text,
        '[[transitions]]\ntrigger = "model_replied"\nsource = "call_llm"\n'
        'dest = "done"\n',
        '[[transitions]]\ntrigger = "model_replied"\nsource = "call_llm"\n'
        'dest = "start"\nconditions = ["has_injected_messages"]\n'
        'actions = ["record_reply", "flush_inbox"]\n\n'
        '[[transitions]]\ntrigger = "model_replied"\nsource = "call_llm"\n'
        'dest = "done"\n',
    )
    text = edit(
        text,
        '[[transitions]]\ntrigger = "measured"\nsource = "start"\n'
        'dest = "call_llm"\nactions = ["record_estimate"]\n',
        '[[transitions]]\ntrigger = "measured"\nsource = "start"\ndest = "tidy"\n'
        'conditions = ["is_over_threshold_line"]\nactions = ["record_estimate"]\n\n'
        '[[transitions]]\ntrigger = "measured"\nsource = "start"\n'
        'dest = "call_llm"\nactions = ["record_estimate"]\n\n'
        '[[transitions]]\ntrigger = "go"\nsource = "tidy"\ndest = "compact"\n'
        'reason = "threshold_exceeded"\n\n'
        '[[transitions]]\ntrigger = "message_injected"\nsource = "start"\n'
        'actions = ["record_injection", "flush_inbox"]\n\n'
        '[[transitions]]\ntrigger = "message_injected"\nsource = "*"\n'
        'actions = ["record_injection"]\n',
    )

    (problem,) = problems_of(text)
    assert "start -[measured]-> tidy -[go]-> compact" in problem
    assert (
        "its 'compaction_result' enters 'start', where 'message_injected' takes in"
        " injected messages at once, undoing what a pass saved" in problem
    )
    # Taken in only on entering a phase that measures before the model call,
    # as the stock machine does, the same cycle is still refused.
    entered = edit(
        text,
        'start    = { decision = "measure" }\n',
        'start    = { decision = "measure", on_enter = ["flush_inbox"] }\n',
    )
    assert len(problems_of(entered)) == 1


@pytest.mark.parametrize(
    ("old", "new", "said"),
    [
        (
            'dest = "start"\nconditions = ["has_output_retries_left"]\n',
            'conditions = ["has_output_retries_left"]\n',
            "phase 'call_llm' on 'output_rejected' stays in it for another model call",
        ),
        (
            'trigger = "run_started"\nsource = "start"\n',
            'trigger = "run_started"\nsource = "call_llm"\n',
            "phase 'call_llm' on 'run_started' stays in it for its first model call",
        ),
    ],
    ids=["re-ask in place", "first call"],
)
def test_a_model_call_made_by_staying_in_its_phase_is_refused(
    old: str, new: str, said: str
) -> None:
    # The re-asks made six calls on a max_turns of 1, none measured first.
    text = edit(turn_toml_text(), old, new)
    if "run_started" in old:
        text = text.replace('initial = "start"', 'initial = "call_llm"')

    problems = problems_of(text)

    assert any(
        p.startswith(said)
        and p.endswith(
            "unmeasured: a model call must follow 'measured' or 'compaction_result'"
            " (give it a dest that measures the request: a phase with decision ="
            ' "measure")'
        )
        for p in problems
    ), problems


def test_a_start_from_every_phase_and_a_shared_adoption_still_load() -> None:
    # Refused by the first version of these checks: a run's start written
    # for every phase (it only ever comes to the initial one), and a pass's
    # result adopted by one transition out of a compact phase and another.
    MachineSpec.from_toml(
        edit(
            turn_toml_text(),
            '[[transitions]]\ntrigger = "run_started"\nsource = "start"\n',
            '[[transitions]]\ntrigger = "run_started"\nsource = "*"\n',
        )
    )
    shared = MINI.replace('source = "compact"\n', 'source = ["compact", "redo"]\n')
    shared = edit(
        shared,
        'compact  = { decision = "compact" }\n',
        'compact  = { decision = "compact" }\nredo     = { decision = "compact" }\n',
    )
    shared = edit(
        shared,
        '[[transitions]]\ntrigger = "measured"\nsource = "start"\ndest = "call_llm"\n',
        '[[transitions]]\ntrigger = "measured"\nsource = "start"\ndest = "redo"\n'
        'conditions = ["is_over_threshold_line"]\n'
        'unless = ["is_compaction_limit_reached"]\nreason = "threshold_exceeded"\n'
        'actions = ["record_estimate"]\n\n'
        '[[transitions]]\ntrigger = "measured"\nsource = "start"\n'
        'dest = "call_llm"\n',
    )
    assert "redo" in MachineSpec.from_toml(shared).phases
