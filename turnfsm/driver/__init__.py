"""The hands: the async driver, its effects, tools, replay and run results."""

from __future__ import annotations

from turnfsm.driver._control import RunControl, RunResult
from turnfsm.driver._driver import Driver
from turnfsm.driver._effects import (
    BUILTIN_EFFECTS,
    Effect,
    EffectContext,
    call_model,
    compact,
    measure,
    run_tools,
)
from turnfsm.driver._replay import ReplayReport, rebuild, replay
from turnfsm.driver._retry import RetryPolicy, is_transient
from turnfsm.driver._tools import Tool, current_tool_call, function_tool
from turnfsm.persistence import (
    CompactionRecord,
    RunRecord,
    Session,
    TurnRecord,
)

__all__ = [
    "BUILTIN_EFFECTS",
    "CompactionRecord",
    "Driver",
    "Effect",
    "EffectContext",
    "ReplayReport",
    "RetryPolicy",
    "RunControl",
    "RunRecord",
    "RunResult",
    "Session",
    "Tool",
    "TurnRecord",
    "call_model",
    "compact",
    "current_tool_call",
    "function_tool",
    "is_transient",
    "measure",
    "rebuild",
    "replay",
    "run_tools",
]
