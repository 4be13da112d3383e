"""The hands: the async driver, its effects, tools, replay and run results."""

from __future__ import annotations

from turnfsm.driver._arguments import InvalidArguments
from turnfsm.driver._carry import EffectSettings, carry_out

# For durable runs (not in `__all__`): the event of an effect that did not
# end in time (a sub-agent phase's child workflow).
from turnfsm.driver._carry import timed_out as timed_out
from turnfsm.driver._context import (
    EffectContext,
    Reported,
    RunResources,
    ToolJournal,
    UsageTally,
)
from turnfsm.driver._context import request_extras as request_extras
from turnfsm.driver._context_settings import pin_rules
from turnfsm.driver._control import RunControl, RunResult

# For durable runs (not in `__all__`): why a machine takes no injected
# message, refused where the injection is sent.
from turnfsm.driver._control import injection_refusal as injection_refusal
from turnfsm.driver._driver import Driver

# For the agent and the command line (not in `__all__`): the hint a context
# manager's setting given to a driver gets, and a session read under a
# store's deadline; for simulate, the texts a request carries beside its
# messages (`request_extras`, above).
from turnfsm.driver._driver import context_hint as context_hint
from turnfsm.driver._effects import (
    BUILTIN_EFFECTS,
    Effect,
    call_model,
    compact,
    effect_key,
    measure,
    run_one_tool,
    run_tool_with_hooks,
    run_tools,
)
from turnfsm.driver._inputs import as_messages

# For durable runs (not in `__all__`): an answer to a paused run refused
# where it is sent, as resuming would refuse it.
from turnfsm.driver._inputs import check_answer as check_answer
from turnfsm.driver._output import OutputType
from turnfsm.driver._recall import RECALL_MAX_CHARS, current_session, recall_tool
from turnfsm.driver._replay import ReplayReport, rebuild, replay
from turnfsm.driver._retry import RetryPolicy, is_transient
from turnfsm.driver._store_calls import read_session as read_session
from turnfsm.driver._subagents import (
    SUBAGENT_MAX_CHILDREN,
    SUBAGENT_MAX_DEPTH,
    Delegation,
    PhaseDelegation,
    child_ids,
    subagent_effect,
    subagent_tool,
)
from turnfsm.driver._tools import Tool, current_tool_call, function_tool

# For durable runs (not in `__all__`): the result of a call that did not end
# in time (a sub-agent's child workflow); the approved calls whose tool a
# worker's agent lacks, refused where the approval is sent.
from turnfsm.driver._tools import late_result as late_result
from turnfsm.driver._tools import missing_tools as missing_tools
from turnfsm.persistence import (
    CompactionRecord,
    RunRecord,
    Session,
    TurnRecord,
)

__all__ = [
    "BUILTIN_EFFECTS",
    "RECALL_MAX_CHARS",
    "SUBAGENT_MAX_CHILDREN",
    "SUBAGENT_MAX_DEPTH",
    "CompactionRecord",
    "Delegation",
    "Driver",
    "Effect",
    "EffectContext",
    "EffectSettings",
    "InvalidArguments",
    "OutputType",
    "PhaseDelegation",
    "ReplayReport",
    "Reported",
    "RetryPolicy",
    "RunControl",
    "RunRecord",
    "RunResources",
    "RunResult",
    "Session",
    "Tool",
    "ToolJournal",
    "TurnRecord",
    "UsageTally",
    "as_messages",
    "call_model",
    "carry_out",
    "child_ids",
    "compact",
    "current_session",
    "current_tool_call",
    "effect_key",
    "function_tool",
    "is_transient",
    "measure",
    "pin_rules",
    "rebuild",
    "recall_tool",
    "replay",
    "run_one_tool",
    "run_tool_with_hooks",
    "run_tools",
    "subagent_effect",
    "subagent_tool",
]
