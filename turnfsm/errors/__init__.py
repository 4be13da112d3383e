"""Every exception turnfsm raises, in one tree.

```
TurnFSMError                 base class; never raised directly
├── DefinitionError          (ValueError) a machine file is invalid; .problems
├── ConfigError              (ValueError) a setting is out of range; field, value
│   ├── ReserveTooLarge      what rides every request fills the window; .reserved
│   └── WindowTooLarge       a window larger than the model's; .model, .window
├── InvalidMessage           (ValueError) a malformed message or history; field
├── IllegalEvent             event not accepted in this phase (a driver bug)
├── MachineBroken            an earlier handle() raised; no further input
├── ContextExceeded          the run could not fit the window; .used, .limit, .largest
│   ├── CompactionStalled    no-progress guard fired; .limit is the size before the pass
│   ├── CompactionFailed     the compactor failed; .cause
│   └── PinnedTooLarge       the pinned messages alone overflow; .pinned, .reserved
├── CompactionCircuitOpen    the compaction circuit breaker is open
├── CompactionLimitExceeded  the run used all its compaction passes
├── PinnedMessageLost        a pass dropped or altered a pinned message; .message_id
├── MaxTurnsExceeded         the run used all its model calls
├── OutputInvalid            the final answer never fit the output type; .errors
├── Cancelled                the run was cancelled through ``TurnMachine.cancel()``
├── ProviderError            the model API failed after retries; .retryable
├── ModelServerFailed        (RuntimeError) a local model server did not start
├── SessionBusy              another run or process holds the session; .owner, .alive
├── ReplayError              a logged run cannot be replayed; .run_id, .index, .entry
│   ├── ReplayDiverged       the brain answers differently from the log
│   └── LogInconsistent      the run's log contradicts itself (order, replies, history)
├── RunCrashed               a run ended on an unexpected exception (logged)
├── SubagentFailed           a sub-agent's run ended without an answer; .session_id
├── SubagentTooDeep          a sub-agent past its tool's max_depth; .depth, .max_depth
├── SubagentTooMany          a run past a sub-agent tool's max_children; .max_children
├── SubagentWaiting          a sub-agent paused for an answer; its caller stops too
├── ContinuedAsNew           a durable run's history grew long; it goes on in a new one
├── PayloadTooLarge          a durable run's step is past Temporal's payload limit
├── TemporalUnreachable      a durable run's Temporal server did not answer; .address
├── WaitTimedOut             (TimeoutError) a durable run did not end in the wait asked
├── EffectFailed             an effect of yours raised; .effect, .type, .message
├── InvalidReturn            (TypeError) an effect or a model returned the wrong type
├── ToolError                a tool could not be registered or described
├── StoreError               a record could not be loaded or saved
│   ├── CorruptRecord        (ValueError) stored data does not read back; .path
│   ├── SessionConflict      another writer appended to the session first
│   ├── SessionNotFound      (LookupError) no session of that id is stored
│   ├── DuplicateRecord      an append repeats a compaction's idempotency key
│   ├── LeaseLost            a session's lease is no longer its owner's; .holder
│   ├── StoreUnusable        a store file or database cannot be used; .path, .reason
│   └── StoreDirectoryUnusable  a store file's directory cannot be used; .directory
└── RunFailed                raised by ``RunResult.raise_for_failure()``; .outcome
```

Expected failures of a run (a compaction that cannot shrink, a provider that
keeps failing) are *outcomes*: the run ends in the ``failed`` phase and the
error is carried on the `RunResult`. Only misuse and bad configuration raise at
the call site.

`LargeItem` and `Problem` are not errors: they are the plain values a
`ContextExceeded` lists in `largest` to say what filled the window, and a
`DefinitionError` in `problems` to say what is wrong with a machine file, where.

This package imports no other turnfsm module, so every module may import it;
its private modules hold the families of the tree (`_misuse`, `_context`,
`_run`, `_store`), on the base class in `_base`.
"""

from __future__ import annotations

from turnfsm.errors._base import TurnFSMError

# How the window check says a reply would not fit (not in __all__).
from turnfsm.errors._context import REPLY_OVER_WINDOW as REPLY_OVER_WINDOW
from turnfsm.errors._context import (
    CompactionCircuitOpen,
    CompactionFailed,
    CompactionLimitExceeded,
    CompactionStalled,
    ContextExceeded,
    LargeItem,
    PinnedMessageLost,
    PinnedTooLarge,
)
from turnfsm.errors._misuse import (
    ConfigError,
    DefinitionError,
    EffectFailed,
    IllegalEvent,
    InvalidMessage,
    InvalidReturn,
    MachineBroken,
    Problem,
    ReserveTooLarge,
    ToolError,
    WindowTooLarge,
)
from turnfsm.errors._run import (
    CONTENT_FILTER,
    CONTEXT_CHECK,
    CONTEXT_OVERFLOW,
    Cancelled,
    ContinuedAsNew,
    LogInconsistent,
    MaxTurnsExceeded,
    ModelServerFailed,
    OutputInvalid,
    PayloadTooLarge,
    ProviderError,
    ReplayDiverged,
    ReplayError,
    RunCrashed,
    RunFailed,
    SessionBusy,
    SubagentFailed,
    SubagentTooDeep,
    SubagentTooMany,
    SubagentWaiting,
    TemporalUnreachable,
    WaitTimedOut,
)

# How a durable run's workflow names itself as a lease owner, and a busy
# session's words with the take-over a command gives (not in __all__).
from turnfsm.errors._run import DURABLE_OWNER as DURABLE_OWNER
from turnfsm.errors._run import busy_words as busy_words
from turnfsm.errors._store import (
    CorruptRecord,
    DuplicateRecord,
    LeaseLost,
    SessionConflict,
    SessionNotFound,
    StoreDirectoryUnusable,
    StoreError,
    StoreUnusable,
)

__all__ = [
    "CONTENT_FILTER",
    "CONTEXT_CHECK",
    "CONTEXT_OVERFLOW",
    "Cancelled",
    "CompactionCircuitOpen",
    "CompactionFailed",
    "CompactionLimitExceeded",
    "CompactionStalled",
    "ConfigError",
    "ContextExceeded",
    "ContinuedAsNew",
    "CorruptRecord",
    "DefinitionError",
    "DuplicateRecord",
    "EffectFailed",
    "IllegalEvent",
    "InvalidMessage",
    "InvalidReturn",
    "LargeItem",
    "LeaseLost",
    "LogInconsistent",
    "MachineBroken",
    "MaxTurnsExceeded",
    "ModelServerFailed",
    "OutputInvalid",
    "PayloadTooLarge",
    "PinnedMessageLost",
    "PinnedTooLarge",
    "Problem",
    "ProviderError",
    "ReplayDiverged",
    "ReplayError",
    "ReserveTooLarge",
    "RunCrashed",
    "RunFailed",
    "SessionBusy",
    "SessionConflict",
    "SessionNotFound",
    "StoreDirectoryUnusable",
    "StoreError",
    "StoreUnusable",
    "SubagentFailed",
    "SubagentTooDeep",
    "SubagentTooMany",
    "SubagentWaiting",
    "TemporalUnreachable",
    "ToolError",
    "TurnFSMError",
    "WaitTimedOut",
    "WindowTooLarge",
]
