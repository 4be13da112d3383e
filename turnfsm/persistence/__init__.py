"""Sessions as append-only logs in a `SessionStore`.

A session's log holds, in order, every run's opening, every event fed to
the brain, every turn and compaction pass, every commit point and every
run's end. The working history and the audit trail are projections of it.
Every shipped store also keeps owner leases (`LeasingStore`): which process
holds a session, and whether it is still alive; and it lists the sessions
sub-agents ran in at once (`LinkingStore`).
"""

from __future__ import annotations

from turnfsm.persistence._context_settings import (
    STRATEGY_KINDS,
    ContextSettings,
    StrategyKind,
)

# For the commands (not in `__all__`): what a compressed log is.
from turnfsm.persistence._jsonl import compressed as compressed
from turnfsm.persistence._jsonl import dump_session, load_session, session_lines
from turnfsm.persistence._lease import Lease, LeasingStore

# For the commands and the live view (not in `__all__`): who holds a session.
from turnfsm.persistence._lease import holder_of as holder_of
from turnfsm.persistence._links import (
    LinkingStore,
    child_sessions,
    descendants,
    parent_of,
)

# For the live view (not in `__all__`): the sub-agents' sessions read again,
# only those that changed.
from turnfsm.persistence._links import read_descendants as read_descendants
from turnfsm.persistence._open import (
    STORE_ENV,
    default_store_path,
    env_store,
    open_store,
)
from turnfsm.persistence._open import is_connection_string as is_connection_string
from turnfsm.persistence._open import meant_store as meant_store
from turnfsm.persistence._open import names_memory as names_memory
from turnfsm.persistence._parent_link import ParentLink
from turnfsm.persistence._records import (
    ENTRY_TYPES,
    OUTCOMES,
    BreakerChanged,
    Committed,
    CompactionRecord,
    Entry,
    EventRecorded,
    MachineStored,
    Outcome,
    RunEnded,
    RunOpened,
    SummaryRecorded,
    ToolResultRecorded,
    TurnRecord,
    Verdict,
    decision_key,
    event_messages,
    machine_digest,
)
from turnfsm.persistence._run_record import RunRecord
from turnfsm.persistence._session import Session, new_id
from turnfsm.persistence._store import (
    MemoryStore,
    SessionInfo,
    SessionStore,
    store_label,
)
from turnfsm.persistence.sqlite import SQLiteStore

__all__ = [
    "ENTRY_TYPES",
    "OUTCOMES",
    "STORE_ENV",
    "STRATEGY_KINDS",
    "BreakerChanged",
    "Committed",
    "CompactionRecord",
    "ContextSettings",
    "Entry",
    "EventRecorded",
    "Lease",
    "LeasingStore",
    "LinkingStore",
    "MachineStored",
    "MemoryStore",
    "Outcome",
    "ParentLink",
    "RunEnded",
    "RunOpened",
    "RunRecord",
    "SQLiteStore",
    "Session",
    "SessionInfo",
    "SessionStore",
    "StrategyKind",
    "SummaryRecorded",
    "ToolResultRecorded",
    "TurnRecord",
    "Verdict",
    "child_sessions",
    "decision_key",
    "default_store_path",
    "descendants",
    "dump_session",
    "env_store",
    "event_messages",
    "load_session",
    "machine_digest",
    "new_id",
    "open_store",
    "parent_of",
    "session_lines",
    "store_label",
]
