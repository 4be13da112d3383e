"""Machine files a user might write by hand, all of which the loader takes.

Each is the stock file written another way: the checks before a model call
in the `unless` of the transition that calls it, the emergency pass before
the failure that covers it once the passes are spent, no compaction at all
(the run fails on the emergency line), a pass whose result goes straight
to the model, a fail phase of its own that only a cancel enters, and a run
that ends done once its tools ran (which a structured output type refuses).
`tests/driver/test_driver_properties.py` runs each through its adversarial
scenarios; `tests/core/test_spec.py` and `tests/core/test_termination.py`
check how they load.
"""

from __future__ import annotations

from tests.helpers import turn_toml_text

__all__ = ["HAND_WRITTEN", "edit"]


def edit(text: str, old: str, new: str) -> str:
    """Replace the one occurrence of `old` in `text`."""
    assert text.count(old) == 1, old
    return text.replace(old, new)


STOCK = turn_toml_text()

TURN_LIMIT = (
    '[[transitions]]\ntrigger = "measured"\nsource = "start"\ndest = "failed"\n'
    'conditions = ["is_turn_limit_reached"]\nerror = "max_turns_exceeded"\n'
)
EMERGENCY_FAIL = (
    '[[transitions]]\ntrigger = "measured"\nsource = "start"\ndest = "failed"\n'
    'conditions = ["is_over_emergency_line", "is_compaction_limit_reached"]\n'
    'error = "compaction_limit_exceeded"\n'
)
EMERGENCY_PASS = (
    '[[transitions]]\ntrigger = "measured"\nsource = "start"\ndest = "compact"\n'
    'conditions = ["is_over_emergency_line"]\nreason = "emergency"\n'
    'actions = ["record_estimate"]\n'
)

CALL_FIRST = edit(
    STOCK,
    TURN_LIMIT,
    '[[transitions]]\ntrigger = "measured"\nsource = "start"\ndest = "call_llm"\n'
    'unless = ["is_turn_limit_reached", "is_over_emergency_line",'
    ' "is_over_threshold_line", "is_over_message_line"]\n'
    'actions = ["record_estimate"]\n\n' + TURN_LIMIT,
)
"""The model call on the usual size written first, its checks in its `unless`."""

EMERGENCY_PASS_FIRST = edit(
    STOCK,
    EMERGENCY_FAIL + "\n" + EMERGENCY_PASS,
    EMERGENCY_PASS.replace("reason", 'unless = ["is_compaction_limit_reached"]\nreason')
    + "\n"
    + EMERGENCY_FAIL,
)
"""The emergency pass `unless` the passes are spent, then the failure covering it."""

NO_COMPACTION = """\
# No compaction: a request over the emergency line fails the run.
name = "no-compaction"
initial = "start"
terminal = ["done", "failed"]

[states]
start     = { decision = "measure", on_enter = ["flush_inbox"] }
call_llm  = { decision = "call_llm" }
run_tools = { decision = "run_tools" }
done      = { decision = "finish", on_enter = ["commit_pending"] }
failed    = { decision = "fail", on_enter = ["discard_pending"] }

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
conditions = ["is_over_emergency_line"]
error = "context_exceeded"

[[transitions]]
trigger = "measured"
source = "start"
dest = "call_llm"
actions = ["record_estimate"]

[[transitions]]
trigger = "model_replied"
source = "call_llm"
dest = "run_tools"
conditions = ["has_tool_calls"]
actions = ["record_reply"]

[[transitions]]
trigger = "model_replied"
source = "call_llm"
dest = "start"
conditions = ["has_injected_messages"]
actions = ["record_reply"]

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
trigger = "tools_finished"
source = "run_tools"
dest = "start"
actions = ["record_results"]

[[transitions]]
trigger = "output_rejected"
source = "call_llm"
dest = "start"
conditions = ["has_output_retries_left"]
actions = ["record_rejection"]

[[transitions]]
trigger = "output_rejected"
source = "call_llm"
dest = "failed"
error = "output_invalid"

[[transitions]]
trigger = "message_injected"
source = "start"
actions = ["record_injection", "flush_inbox"]

[[transitions]]
trigger = "message_injected"
source = "*"
actions = ["record_injection"]

[[transitions]]
trigger = "run_cancelled"
source = "*"
dest = "failed"
error = "cancelled"
"""
"""A machine without compaction: the emergency line fails the run."""

PASS_STRAIGHT_TO_THE_MODEL = edit(
    STOCK,
    '[[transitions]]\ntrigger = "compaction_result"\nsource = "compact"\n'
    'dest = "start"\nactions = ["record_compaction", "count_compaction"]\n',
    '[[transitions]]\ntrigger = "compaction_result"\nsource = "compact"\n'
    'dest = "call_llm"\nactions = ["record_compaction", "count_compaction"]\n',
)
"""A pass's result goes straight to the model (the manager sized it)."""

CANCELLED_PHASE = edit(
    edit(
        edit(
            STOCK,
            "[states]\n",
            '[states]\ncancelled = { decision = "fail",'
            ' on_enter = ["discard_pending"] }\n',
        ),
        'terminal = ["done", "failed"]',
        'terminal = ["done", "failed", "cancelled"]',
    ),
    'trigger = "run_cancelled"\nsource = "*"\ndest = "failed"',
    'trigger = "run_cancelled"\nsource = "*"\ndest = "cancelled"',
)
"""A fail phase of its own for a cancelled run, that only the cancel enters."""

DONE_AFTER_TOOLS = edit(
    STOCK,
    '[[transitions]]\ntrigger = "tools_finished"\nsource = "run_tools"\n'
    'dest = "start"\nactions = ["record_results"]\n',
    '[[transitions]]\ntrigger = "tools_finished"\nsource = "run_tools"\n'
    'dest = "start"\nconditions = ["has_injected_messages"]\n'
    'actions = ["record_results"]\n\n'
    '[[transitions]]\ntrigger = "tools_finished"\nsource = "run_tools"\n'
    'dest = "done"\nactions = ["record_results"]\n',
)
"""The run ends done once its tools ran, with no reply after them (unless a
message was injected): its answer is the text of the reply that called them,
so an agent with a structured output type refuses it."""

HAND_WRITTEN = {
    "cancelled-phase": CANCELLED_PHASE,
    "call-first": CALL_FIRST,
    "done-after-tools": DONE_AFTER_TOOLS,
    "emergency-pass-first": EMERGENCY_PASS_FIRST,
    "no-compaction": NO_COMPACTION,
    "pass-straight-to-the-model": PASS_STRAIGHT_TO_THE_MODEL,
}
"""Each hand-written machine's text, by a short name."""
