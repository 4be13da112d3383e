"""Hooks: observe a run, and veto or steer its compaction passes."""

from __future__ import annotations

from turnfsm.hooks._hook import (
    CircuitInfo,
    CompactionDone,
    CompactionInfo,
    DecisionInfo,
    Hook,
    ModelCallEnd,
    ModelCallInfo,
    OutcomeInfo,
    PreCompact,
    PreCompactInfo,
    RunEndInfo,
    RunStartInfo,
    TextDeltaInfo,
    ToolCallEnd,
    ToolCallInfo,
    TransitionInfo,
)

__all__ = [
    "CircuitInfo",
    "CompactionDone",
    "CompactionInfo",
    "DecisionInfo",
    "Hook",
    "ModelCallEnd",
    "ModelCallInfo",
    "OutcomeInfo",
    "PreCompact",
    "PreCompactInfo",
    "RunEndInfo",
    "RunStartInfo",
    "TextDeltaInfo",
    "ToolCallEnd",
    "ToolCallInfo",
    "TransitionInfo",
]
