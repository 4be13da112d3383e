"""Hooks: observe a run, and veto or steer its compaction passes."""

from __future__ import annotations

from turnfsm import _deprecated
from turnfsm.hooks._check import check_hooks
from turnfsm.hooks._console import ConsoleHook
from turnfsm.hooks._dispatch import HookDispatcher
from turnfsm.hooks._hook import HOOK_METHODS, Hook
from turnfsm.hooks._infos import (
    CircuitInfo,
    DecisionInfo,
    ModelCallEnd,
    ModelCallInfo,
    OutcomeInfo,
    PreCompact,
    PreCompactInfo,
    RunEndInfo,
    RunStartInfo,
    TextDeltaInfo,
    TextDiscardedInfo,
    ToolCallEnd,
    ToolCallInfo,
    TransitionInfo,
)

__all__ = [
    "HOOK_METHODS",
    "CircuitInfo",
    "ConsoleHook",
    "DecisionInfo",
    "Hook",
    "HookDispatcher",
    "ModelCallEnd",
    "ModelCallInfo",
    "OutcomeInfo",
    "PreCompact",
    "PreCompactInfo",
    "RunEndInfo",
    "RunStartInfo",
    "TextDeltaInfo",
    "TextDiscardedInfo",
    "ToolCallEnd",
    "ToolCallInfo",
    "TransitionInfo",
    "check_hooks",
]

__getattr__ = _deprecated.moved(
    __name__,
    {
        name: (
            f"turnfsm.hooks._infos:{name}",
            "Hook.on_compaction_pass, which receives the pass's CompactionRecord",
        )
        for name in ("CompactionDone", "CompactionInfo")
    },
)
