"""Context management: when and how a conversation shrinks to fit the window.

`ContextManager` is the policy (window, threshold, target, counter), builds the
brain's `Budget` and judges each pass (`Compacted`, `NoAction`,
`ContextOverflow`, `CompactorError`, `CircuitOpen`); a `ContextCompactor` is
the strategy that shrinks.
`TruncatingCompactor` is the default strategy and `TokenSplitter` finds a
pair-safe old/recent boundary for custom ones. The pair-safety helpers
(`pair_tool_traffic`, `adjust_split`, `sanitize`) keep any compactor from
orphaning a tool call or result.
"""

from __future__ import annotations

from turnfsm.context._manager import ContextManager
from turnfsm.context._pairs import (
    PartRef,
    ToolPair,
    ToolTraffic,
    adjust_split,
    keep_parts,
    pair_tool_traffic,
    sanitize,
)
from turnfsm.context._protocol import ContextCompactor
from turnfsm.context._splitter import Split, TokenSplitter
from turnfsm.context._truncating import TruncatingCompactor
from turnfsm.context._values import (
    CircuitOpen,
    CompactBase,
    Compacted,
    CompactionContext,
    CompactionDecision,
    CompactionOutcome,
    CompactorError,
    ContextOverflow,
    NoAction,
)

__all__ = [
    "CircuitOpen",
    "CompactBase",
    "Compacted",
    "CompactionContext",
    "CompactionDecision",
    "CompactionOutcome",
    "CompactorError",
    "ContextCompactor",
    "ContextManager",
    "ContextOverflow",
    "NoAction",
    "PartRef",
    "Split",
    "TokenSplitter",
    "ToolPair",
    "ToolTraffic",
    "TruncatingCompactor",
    "adjust_split",
    "keep_parts",
    "pair_tool_traffic",
    "sanitize",
]
