"""turnfsm: LLM agent loops on an explicit, declarative finite-state machine.

The brain (`TurnMachine`, in `turnfsm.core`) decides when to call the model,
run tools, compact, finish or fail; the hands (`Driver`, in
`turnfsm.driver`) carry each decision out; the policy (`ContextManager`)
judges every compaction pass; the strategy (`MaskingCompactor`, the default,
and friends) shrinks the conversation. `Agent` is the small façade over them.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from turnfsm import _instrument
from turnfsm._lazy import lazy_getattr

if TYPE_CHECKING:
    from turnfsm._resources import (
        approval_machine as approval_machine,
    )
    from turnfsm._resources import (
        default_machine as default_machine,
    )
    from turnfsm._resources import (
        load_machine as load_machine,
    )
    from turnfsm._resources import (
        machines_dir as machines_dir,
    )
    from turnfsm._resources import (
        review_machine as review_machine,
    )
    from turnfsm.agent import Agent as Agent
    from turnfsm.context import (
        CompactBase as CompactBase,
    )
    from turnfsm.context import (
        ContextCompactor as ContextCompactor,
    )
    from turnfsm.context import (
        ContextManager as ContextManager,
    )
    from turnfsm.context import (
        LayeredCompactor as LayeredCompactor,
    )
    from turnfsm.context import (
        MaskingCompactor as MaskingCompactor,
    )
    from turnfsm.context import (
        SummarizingCompactor as SummarizingCompactor,
    )
    from turnfsm.context import (
        TokenSplitter as TokenSplitter,
    )
    from turnfsm.context import (
        ToolResultDigest as ToolResultDigest,
    )
    from turnfsm.context import (
        TruncatingCompactor as TruncatingCompactor,
    )
    from turnfsm.core import (
        Budget as Budget,
    )
    from turnfsm.core import (
        CompactReason as CompactReason,
    )
    from turnfsm.core import (
        MachineSpec as MachineSpec,
    )
    from turnfsm.core import (
        Phase as Phase,
    )
    from turnfsm.core import (
        Snapshot as Snapshot,
    )
    from turnfsm.core import (
        TurnMachine as TurnMachine,
    )
    from turnfsm.driver import (
        Driver as Driver,
    )
    from turnfsm.driver import (
        EffectContext as EffectContext,
    )
    from turnfsm.driver import (
        RetryPolicy as RetryPolicy,
    )
    from turnfsm.driver import (
        RunControl as RunControl,
    )
    from turnfsm.driver import (
        RunResult as RunResult,
    )
    from turnfsm.driver import (
        Tool as Tool,
    )
    from turnfsm.driver import (
        function_tool as function_tool,
    )
    from turnfsm.driver import (
        recall_tool as recall_tool,
    )
    from turnfsm.driver import (
        replay as replay,
    )
    from turnfsm.errors import (
        Cancelled as Cancelled,
    )
    from turnfsm.errors import (
        CompactionCircuitOpen as CompactionCircuitOpen,
    )
    from turnfsm.errors import (
        CompactionFailed as CompactionFailed,
    )
    from turnfsm.errors import (
        CompactionLimitExceeded as CompactionLimitExceeded,
    )
    from turnfsm.errors import (
        CompactionStalled as CompactionStalled,
    )
    from turnfsm.errors import (
        ConfigError as ConfigError,
    )
    from turnfsm.errors import (
        ContextExceeded as ContextExceeded,
    )
    from turnfsm.errors import (
        CorruptRecord as CorruptRecord,
    )
    from turnfsm.errors import (
        DefinitionError as DefinitionError,
    )
    from turnfsm.errors import (
        DuplicateRecord as DuplicateRecord,
    )
    from turnfsm.errors import (
        IllegalEvent as IllegalEvent,
    )
    from turnfsm.errors import (
        InvalidMessage as InvalidMessage,
    )
    from turnfsm.errors import (
        InvalidReturn as InvalidReturn,
    )
    from turnfsm.errors import (
        LogInconsistent as LogInconsistent,
    )
    from turnfsm.errors import (
        MachineBroken as MachineBroken,
    )
    from turnfsm.errors import (
        MaxTurnsExceeded as MaxTurnsExceeded,
    )
    from turnfsm.errors import (
        OutputInvalid as OutputInvalid,
    )
    from turnfsm.errors import (
        ProviderError as ProviderError,
    )
    from turnfsm.errors import (
        ReplayDiverged as ReplayDiverged,
    )
    from turnfsm.errors import (
        ReplayError as ReplayError,
    )
    from turnfsm.errors import (
        RunCrashed as RunCrashed,
    )
    from turnfsm.errors import (
        RunFailed as RunFailed,
    )
    from turnfsm.errors import (
        SessionBusy as SessionBusy,
    )
    from turnfsm.errors import (
        SessionConflict as SessionConflict,
    )
    from turnfsm.errors import (
        SessionNotFound as SessionNotFound,
    )
    from turnfsm.errors import (
        StoreError as StoreError,
    )
    from turnfsm.errors import (
        StoreUnusable as StoreUnusable,
    )
    from turnfsm.errors import (
        ToolError as ToolError,
    )
    from turnfsm.errors import (
        TurnFSMError as TurnFSMError,
    )
    from turnfsm.hooks import Hook as Hook
    from turnfsm.hooks import PreCompact as PreCompact
    from turnfsm.messages import Message as Message
    from turnfsm.messages import Role as Role
    from turnfsm.persistence import (
        MemoryStore as MemoryStore,
    )
    from turnfsm.persistence import (
        Session as Session,
    )
    from turnfsm.persistence import (
        SessionStore as SessionStore,
    )
    from turnfsm.persistence import (
        SQLiteStore as SQLiteStore,
    )
    from turnfsm.persistence import (
        open_store as open_store,
    )
    from turnfsm.providers import (
        ModelClient as ModelClient,
    )
    from turnfsm.providers import (
        ModelRequest as ModelRequest,
    )
    from turnfsm.providers import (
        ModelResponse as ModelResponse,
    )
    from turnfsm.providers import (
        OutputSpec as OutputSpec,
    )
    from turnfsm.tokens import (
        ConservativeTokenCounter as ConservativeTokenCounter,
    )
    from turnfsm.tokens import (
        HeuristicTokenCounter as HeuristicTokenCounter,
    )
    from turnfsm.tokens import (
        RatioTokenCounter as RatioTokenCounter,
    )
    from turnfsm.tokens import (
        TiktokenCounter as TiktokenCounter,
    )
    from turnfsm.tokens import (
        TokenCounter as TokenCounter,
    )
    from turnfsm.values import Usage as Usage

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
    "LogInconsistent": "turnfsm.errors",
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
    "ReplayError": "turnfsm.errors",
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
    "SessionNotFound": "turnfsm.errors",
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
    "MaskingCompactor": "turnfsm.context",
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
    "machines_dir": "turnfsm._resources",
    "open_store": "turnfsm.persistence",
    "recall_tool": "turnfsm.driver",
    "replay": "turnfsm.driver",
    "review_machine": "turnfsm._resources",
}


__getattr__ = lazy_getattr(__name__, _LAZY, globals())


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])


# The one list of the package's public names is `_LAZY`: `__all__` is made
# from it (the imports above only tell type checkers; a test keeps them equal).
__all__ = sorted(_LAZY)


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
