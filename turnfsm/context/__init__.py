"""Context management: when and how a conversation shrinks to fit the window.

`ContextManager` is the policy (window, threshold, target, counter), builds the
brain's `Budget` and judges each pass: `ContextManager.compact` takes one
`CompactionRequest` and answers with the event the brain takes next. A
`ContextCompactor` is the strategy that shrinks: it answers with a
`CompactionProposal`.
`MaskingCompactor` is the default strategy: with no model call it caps
oversized tool results, digests old ones, keeps the last result per call, then
drops the middle (`TruncatingCompactor`, which also works alone);
`SummarizingCompactor` summarises old turns with a model; `LayeredCompactor`
shrinks in five layers, cheapest first, the last two with a model;
`ToolResultDigest` replaces old, oversized tool results with one-line
digests. `STRATEGIES` names the shipped strategies by their short name
(``"layered"``), and `strategy_named` makes one by it. Every replacement a
shipped strategy makes names what it covers (`REPLACES`, a ``[recall ...]``
note: `mark_replacements`), so that the originals, kept in the session's
log, can be fetched back. `TokenSplitter` finds a pair-safe old/recent
boundary for custom strategies. Pinned messages (`Message.pin`, `PinRules`,
calls in flight: `pinned_ids`) survive every pass word for word: shipped
strategies keep them (`keep_pinned`), and the manager refuses a pass that
loses one (`pin_loss`). The pair-safety helpers (`pair_tool_traffic`,
`adjust_split`, `sanitize`) keep any compactor from orphaning a tool call or
result; the manager refuses a pass that breaks a pair (`pairing_problem`).
`CacheRules` (by provider in `CACHE_RULES`) and `pass_payback` work out
what a pass costs against what it saves by the prompt cache
(`turnfsm.values.PassPayback`); `first_change` finds where a change breaks
that cache.
"""

from __future__ import annotations

from turnfsm import _deprecated
from turnfsm.context._cache import (
    CACHE_RULES,
    CacheRules,
    Invalidates,
    cache_rules_for,
    first_change,
    pass_payback,
)
from turnfsm.context._diagnose import counter_at_fault, explain
from turnfsm.context._digest import ToolResultDigest, digest_line, digest_results
from turnfsm.context._layered import (
    Applied,
    CompactionStatus,
    Failed,
    LayeredCompactor,
    Skipped,
)
from turnfsm.context._manager import (
    CALIBRATION_CEILING,
    CALIBRATION_FLOOR,
    CALIBRATION_HEADROOM,
    ContextManager,
)
from turnfsm.context._masking import MaskingCompactor, cut_result
from turnfsm.context._pairs import (
    PartRef,
    ToolPair,
    ToolTraffic,
    adjust_split,
    keep_parts,
    pair_tool_traffic,
    pairing_problem,
    result_problem,
    sanitize,
)
from turnfsm.context._pins import PinRules, keep_pinned, pin_loss, pinned_ids
from turnfsm.context._protocol import ContextCompactor
from turnfsm.context._recall_marks import (
    REPLACES,
    call_handle,
    handle,
    mark_replacements,
    recall_note,
    replaced_ids,
    unmark,
)
from turnfsm.context._registry import STRATEGIES, strategy_named
from turnfsm.context._splitter import Split, TokenSplitter
from turnfsm.context._summarizing import SummarizingCompactor, SummaryPlan
from turnfsm.context._summary_model import MIN_SUMMARY_TOKENS, SummaryFailed
from turnfsm.context._transcript import SUMMARY_PREFIX, SUMMARY_SECTIONS
from turnfsm.context._truncating import TruncatingCompactor
from turnfsm.context._values import (
    CompactBase,
    CompactionContext,
    CompactionProposal,
    CompactionRequest,
    ModelCall,
)

__all__ = [
    "CACHE_RULES",
    "CALIBRATION_CEILING",
    "CALIBRATION_FLOOR",
    "CALIBRATION_HEADROOM",
    "MIN_SUMMARY_TOKENS",
    "REPLACES",
    "STRATEGIES",
    "SUMMARY_PREFIX",
    "SUMMARY_SECTIONS",
    "Applied",
    "CacheRules",
    "CompactBase",
    "CompactionContext",
    "CompactionProposal",
    "CompactionRequest",
    "CompactionStatus",
    "ContextCompactor",
    "ContextManager",
    "Failed",
    "Invalidates",
    "LayeredCompactor",
    "MaskingCompactor",
    "ModelCall",
    "PartRef",
    "PinRules",
    "Skipped",
    "Split",
    "SummarizingCompactor",
    "SummaryFailed",
    "SummaryPlan",
    "TokenSplitter",
    "ToolPair",
    "ToolResultDigest",
    "ToolTraffic",
    "TruncatingCompactor",
    "adjust_split",
    "cache_rules_for",
    "call_handle",
    "counter_at_fault",
    "cut_result",
    "digest_line",
    "digest_results",
    "explain",
    "first_change",
    "handle",
    "keep_parts",
    "keep_pinned",
    "mark_replacements",
    "pair_tool_traffic",
    "pairing_problem",
    "pass_payback",
    "pin_loss",
    "pinned_ids",
    "recall_note",
    "replaced_ids",
    "result_problem",
    "sanitize",
    "strategy_named",
    "unmark",
]

__getattr__ = _deprecated.moved(
    __name__,
    {
        "CompactionOutcome": (
            "turnfsm.context._values:CompactionProposal",
            "turnfsm.context.CompactionProposal",
        ),
        **{
            name: (
                f"turnfsm.context._verdicts:{name}",
                "ContextManager.compact, which answers with the brain's event "
                "(turnfsm.core.PassEvent)",
            )
            for name in (
                "CircuitOpen",
                "Compacted",
                "CompactionDecision",
                "CompactorError",
                "ContextOverflow",
                "NoAction",
            )
        },
    },
)
