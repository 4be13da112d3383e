"""Hooks: observe a run, and veto or steer its compaction passes."""

from __future__ import annotations

from turnfsm.hooks._hook import (
    CompactionInfo,
    DecisionInfo,
    Hook,
    OutcomeInfo,
    PreCompact,
    PreCompactInfo,
    RunEndInfo,
    RunStartInfo,
    TextDeltaInfo,
    TransitionInfo,
)

__all__ = [
    "CompactionInfo",
    "DecisionInfo",
    "Hook",
    "OutcomeInfo",
    "PreCompact",
    "PreCompactInfo",
    "RunEndInfo",
    "RunStartInfo",
    "TextDeltaInfo",
    "TransitionInfo",
]
