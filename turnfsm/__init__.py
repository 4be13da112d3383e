"""turnfsm: LLM agent loops on an explicit, declarative finite-state machine.

The brain (`TurnMachine`, in `turnfsm.core`) decides when to call the model,
run tools, compact, finish or fail; the hands (`Driver`, in
`turnfsm.driver`) carry each decision out; the policy (`ContextManager`)
judges every compaction pass; the strategy (`TruncatingCompactor` and
friends) shrinks the conversation. `Agent` is the small façade over them.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from turnfsm import _instrument
from turnfsm._lazy import lazy_getattr

if TYPE_CHECKING:
    from turnfsm._resources import approval_machine, default_machine, load_machine
    from turnfsm.agent import Agent
    from turnfsm.context import (
        CompactBase,
        ContextCompactor,
        ContextManager,
        LayeredCompactor,
        SummarizingCompactor,
        TokenSplitter,
        ToolResultDigest,
        TruncatingCompactor,
    )
    from turnfsm.core import (
        Budget,
        CompactReason,
        MachineSpec,
        Phase,
        Snapshot,
        TurnMachine,
    )
    from turnfsm.driver import (
        Driver,
        EffectContext,
        RetryPolicy,
        RunControl,
        RunResult,
        Tool,
        function_tool,
        replay,
    )
    from turnfsm.errors import (
        Cancelled,
        CompactionCircuitOpen,
        CompactionFailed,
        CompactionLimitExceeded,
        CompactionStalled,
        ConfigError,
        ContextExceeded,
        CorruptRecord,
        DefinitionError,
        DuplicateRecord,
        IllegalEvent,
        InvalidMessage,
        InvalidReturn,
        MachineBroken,
        MaxTurnsExceeded,
        OutputInvalid,
        ProviderError,
        ReplayDiverged,
        RunCrashed,
        RunFailed,
        SessionBusy,
        SessionConflict,
        StoreError,
        StoreUnusable,
        ToolError,
        TurnFSMError,
    )
    from turnfsm.hooks import Hook, PreCompact
    from turnfsm.messages import Message, Role
    from turnfsm.persistence import (
        MemoryStore,
        Session,
        SessionStore,
        SQLiteStore,
        open_store,
    )
    from turnfsm.providers import (
        ModelClient,
        ModelRequest,
        ModelResponse,
        OutputSpec,
    )
    from turnfsm.tokens import (
        ConservativeTokenCounter,
        HeuristicTokenCounter,
        RatioTokenCounter,
        TiktokenCounter,
        TokenCounter,
    )
    from turnfsm.values import Usage

__version__ = "0.1.0"

# Public names load lazily (PEP 562), so that importing the pure brain
# (`turnfsm.core`) does not pull in anyio, tenacity or OpenTelemetry through
# this package's __init__.
_LAZY: dict[str, str] = {
    "Agent": "turnfsm.agent",
    "Budget": "turnfsm.core",
    "Cancelled": "turnfsm.errors",
    "CompactBase": "turnfsm.context",
    "CompactReason": "turnfsm.core",
    "CompactionCircuitOpen": "turnfsm.errors",
    "CompactionFailed": "turnfsm.errors",
    "CompactionLimitExceeded": "turnfsm.errors",
    "CompactionStalled": "turnfsm.errors",
    "ConfigError": "turnfsm.errors",
    "ConservativeTokenCounter": "turnfsm.tokens",
    "ContextCompactor": "turnfsm.context",
    "ContextExceeded": "turnfsm.errors",
    "ContextManager": "turnfsm.context",
    "CorruptRecord": "turnfsm.errors",
    "DefinitionError": "turnfsm.errors",
    "DuplicateRecord": "turnfsm.errors",
    "Driver": "turnfsm.driver",
    "EffectContext": "turnfsm.driver",
    "HeuristicTokenCounter": "turnfsm.tokens",
    "Hook": "turnfsm.hooks",
    "IllegalEvent": "turnfsm.errors",
    "InvalidMessage": "turnfsm.errors",
    "InvalidReturn": "turnfsm.errors",
    "MachineBroken": "turnfsm.errors",
    "MachineSpec": "turnfsm.core",
    "MaxTurnsExceeded": "turnfsm.errors",
    "MemoryStore": "turnfsm.persistence",
    "Message": "turnfsm.messages",
    "ModelClient": "turnfsm.providers",
    "ModelRequest": "turnfsm.providers",
    "ModelResponse": "turnfsm.providers",
    "OutputInvalid": "turnfsm.errors",
    "OutputSpec": "turnfsm.providers",
    "Phase": "turnfsm.core",
    "PreCompact": "turnfsm.hooks",
    "ProviderError": "turnfsm.errors",
    "RatioTokenCounter": "turnfsm.tokens",
    "ReplayDiverged": "turnfsm.errors",
    "RetryPolicy": "turnfsm.driver",
    "Role": "turnfsm.messages",
    "RunControl": "turnfsm.driver",
    "RunCrashed": "turnfsm.errors",
    "RunFailed": "turnfsm.errors",
    "RunResult": "turnfsm.driver",
    "SQLiteStore": "turnfsm.persistence",
    "Session": "turnfsm.persistence",
    "SessionBusy": "turnfsm.errors",
    "SessionConflict": "turnfsm.errors",
    "SessionStore": "turnfsm.persistence",
    "Snapshot": "turnfsm.core",
    "StoreError": "turnfsm.errors",
    "StoreUnusable": "turnfsm.errors",
    "TiktokenCounter": "turnfsm.tokens",
    "TokenCounter": "turnfsm.tokens",
    "TokenSplitter": "turnfsm.context",
    "Tool": "turnfsm.driver",
    "ToolError": "turnfsm.errors",
    "TruncatingCompactor": "turnfsm.context",
    "SummarizingCompactor": "turnfsm.context",
    "LayeredCompactor": "turnfsm.context",
    "ToolResultDigest": "turnfsm.context",
    "TurnFSMError": "turnfsm.errors",
    "TurnMachine": "turnfsm.core",
    "Usage": "turnfsm.values",
    "approval_machine": "turnfsm._resources",
    "default_machine": "turnfsm._resources",
    "function_tool": "turnfsm.driver",
    "load_machine": "turnfsm._resources",
    "open_store": "turnfsm.persistence",
    "replay": "turnfsm.driver",
}


__getattr__ = lazy_getattr(__name__, _LAZY, globals())


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])


__all__ = [
    "Agent",
    "Budget",
    "Cancelled",
    "CompactBase",
    "CompactReason",
    "CompactionCircuitOpen",
    "CompactionFailed",
    "CompactionLimitExceeded",
    "CompactionStalled",
    "ConfigError",
    "ConservativeTokenCounter",
    "ContextCompactor",
    "ContextExceeded",
    "ContextManager",
    "CorruptRecord",
    "DefinitionError",
    "Driver",
    "DuplicateRecord",
    "EffectContext",
    "HeuristicTokenCounter",
    "Hook",
    "IllegalEvent",
    "InvalidMessage",
    "InvalidReturn",
    "LayeredCompactor",
    "MachineBroken",
    "MachineSpec",
    "MaxTurnsExceeded",
    "MemoryStore",
    "Message",
    "ModelClient",
    "ModelRequest",
    "ModelResponse",
    "OutputInvalid",
    "OutputSpec",
    "Phase",
    "PreCompact",
    "ProviderError",
    "RatioTokenCounter",
    "ReplayDiverged",
    "RetryPolicy",
    "Role",
    "RunControl",
    "RunCrashed",
    "RunFailed",
    "RunResult",
    "SQLiteStore",
    "Session",
    "SessionBusy",
    "SessionConflict",
    "SessionStore",
    "Snapshot",
    "StoreError",
    "StoreUnusable",
    "SummarizingCompactor",
    "TiktokenCounter",
    "TokenCounter",
    "TokenSplitter",
    "Tool",
    "ToolError",
    "ToolResultDigest",
    "TruncatingCompactor",
    "TurnFSMError",
    "TurnMachine",
    "Usage",
    "approval_machine",
    "default_machine",
    "function_tool",
    "load_machine",
    "open_store",
    "replay",
]


def _tracing(hooks: Sequence[Any], setting: bool | None) -> Any:
    """The tracing hook a run gets besides `hooks`, or None (see `Driver.tracing`).

    OpenTelemetry is looked at only when something imported it: a process
    that never set up a tracer provider pays nothing.
    """
    if setting is False or any(getattr(h, "traces_runs", False) for h in hooks):
        return None
    if setting is None and "opentelemetry.trace" not in sys.modules:
        return None
    from turnfsm import tracing

    return tracing.global_hook(force=setting is True)


_instrument.wire(_tracing)
