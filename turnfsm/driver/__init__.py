"""The hands: the async driver, tools, sessions and run results."""

from __future__ import annotations

from turnfsm.driver._driver import Driver, Effect
from turnfsm.driver._retry import RetryPolicy, is_transient
from turnfsm.driver._session import (
    CompactionRecord,
    RunControl,
    RunRecord,
    RunResult,
    Session,
    TurnRecord,
)
from turnfsm.driver._tools import Tool, function_tool

__all__ = [
    "CompactionRecord",
    "Driver",
    "Effect",
    "RetryPolicy",
    "RunControl",
    "RunRecord",
    "RunResult",
    "Session",
    "Tool",
    "TurnRecord",
    "function_tool",
    "is_transient",
]
