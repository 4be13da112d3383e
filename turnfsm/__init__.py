"""turnfsm: LLM agent loops on an explicit, declarative finite-state machine.

The brain (`TurnMachine`, in `turnfsm.core`) decides when to call the model,
run tools, compact, finish or fail; the hands (`Driver`, in
`turnfsm.driver`) carry each decision out; the policy (`ContextManager`)
judges every compaction pass; the strategy (`TruncatingCompactor` and
friends) shrinks the conversation. `Agent` is the small façade over them.
"""

from __future__ import annotations

from turnfsm._resources import default_machine, load_machine
from turnfsm.agent import Agent
from turnfsm.context import (
    CompactBase,
    ContextCompactor,
    ContextManager,
    TokenSplitter,
    TruncatingCompactor,
)
from turnfsm.core import (
    Budget,
    CompactReason,
    MachineSpec,
    Phase,
    Snapshot,
    TurnMachine,
    Usage,
)
from turnfsm.driver import (
    Driver,
    RetryPolicy,
    RunResult,
    Session,
    Tool,
    function_tool,
)
from turnfsm.errors import (
    Cancelled,
    CompactionCircuitOpen,
    CompactionFailed,
    CompactionStalled,
    ConfigError,
    ContextExceeded,
    DefinitionError,
    IllegalEvent,
    InvalidMessage,
    MachineBroken,
    MaxTurnsExceeded,
    ProviderError,
    RunFailed,
    ToolError,
    TurnFSMError,
)
from turnfsm.hooks import Hook, PreCompact
from turnfsm.messages import Message, Role
from turnfsm.providers import ModelClient, ModelRequest, ModelResponse
from turnfsm.tokens import (
    ConservativeTokenCounter,
    HeuristicTokenCounter,
    RatioTokenCounter,
    TiktokenCounter,
    TokenCounter,
)

__version__ = "0.1.0"

__all__ = [
    "Agent",
    "Budget",
    "Cancelled",
    "CompactBase",
    "CompactReason",
    "CompactionCircuitOpen",
    "CompactionFailed",
    "CompactionStalled",
    "ConfigError",
    "ConservativeTokenCounter",
    "ContextCompactor",
    "ContextExceeded",
    "ContextManager",
    "DefinitionError",
    "Driver",
    "HeuristicTokenCounter",
    "Hook",
    "IllegalEvent",
    "InvalidMessage",
    "MachineBroken",
    "MachineSpec",
    "MaxTurnsExceeded",
    "Message",
    "ModelClient",
    "ModelRequest",
    "ModelResponse",
    "Phase",
    "PreCompact",
    "ProviderError",
    "RatioTokenCounter",
    "RetryPolicy",
    "Role",
    "RunFailed",
    "RunResult",
    "Session",
    "Snapshot",
    "TiktokenCounter",
    "TokenCounter",
    "TokenSplitter",
    "Tool",
    "ToolError",
    "TruncatingCompactor",
    "TurnFSMError",
    "TurnMachine",
    "Usage",
    "default_machine",
    "function_tool",
    "load_machine",
]
