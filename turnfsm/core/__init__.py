"""The brain: a pure, synchronous Turn FSM with no I/O.

`TurnMachine` decides; the driver (`turnfsm.driver`) acts. This package
imports only the standard library (no I/O modules), `attrs`, `transitions`
and turnfsm's pure value modules.
"""

from __future__ import annotations

from turnfsm.core._compiled import Step
from turnfsm.core._conversation_checks import finishes_before_an_answer
from turnfsm.core._decisions import (
    DECISION_TYPES,
    CallLLM,
    Compact,
    Decision,
    Fail,
    Finish,
    Measure,
    Pause,
    Perform,
    RunTools,
)
from turnfsm.core._events import (
    EVENT_TYPES,
    MEASURE_SOURCES,
    OMITTED_IF_DEFAULT,
    PASS_EVENT_TYPES,
    UNUSED_REPLY_TYPES,
    CompactionCircuitOpened,
    CompactionNoop,
    CompactionOverflowed,
    CompactionResult,
    CompactorFailed,
    ContextOverflowed,
    Event,
    Measured,
    MeasureSource,
    MessageInjected,
    ModelFailed,
    ModelReplied,
    OutputRejected,
    PassEvent,
    RunCancelled,
    RunStarted,
    Signal,
    ToolCallsReviewed,
    ToolsFinished,
    trigger_of,
)
from turnfsm.core._guards import GUARDS
from turnfsm.core._lines import (
    CompactReason,
    emergency_line,
    line_reason,
    threshold_line,
)
from turnfsm.core._machine import TurnMachine
from turnfsm.core._phases import Phase
from turnfsm.core._reducers import FAILURES, REDUCERS
from turnfsm.core._render import EdgeKey, Traffic, render_dot, render_mermaid, tally
from turnfsm.core._snapshot import SCHEMA_VERSION, Budget, Failure, Snapshot
from turnfsm.core._spec import (
    SUBAGENT_MAX_CHILDREN,
    SUBAGENT_MAX_DEPTH,
    TASK_FIELDS,
    MachineSpec,
    StateSpec,
    SubagentSpec,
    TransitionSpec,
)
from turnfsm.values import ErrorInfo, Usage

__all__ = [
    "DECISION_TYPES",
    "EVENT_TYPES",
    "FAILURES",
    "GUARDS",
    "MEASURE_SOURCES",
    "OMITTED_IF_DEFAULT",
    "PASS_EVENT_TYPES",
    "REDUCERS",
    "SCHEMA_VERSION",
    "SUBAGENT_MAX_CHILDREN",
    "SUBAGENT_MAX_DEPTH",
    "TASK_FIELDS",
    "UNUSED_REPLY_TYPES",
    "Budget",
    "CallLLM",
    "Compact",
    "CompactReason",
    "CompactionCircuitOpened",
    "CompactionNoop",
    "CompactionOverflowed",
    "CompactionResult",
    "CompactorFailed",
    "ContextOverflowed",
    "Decision",
    "EdgeKey",
    "ErrorInfo",
    "Event",
    "Fail",
    "Failure",
    "Finish",
    "MachineSpec",
    "Measure",
    "MeasureSource",
    "Measured",
    "MessageInjected",
    "ModelFailed",
    "ModelReplied",
    "OutputRejected",
    "PassEvent",
    "Pause",
    "Perform",
    "Phase",
    "RunCancelled",
    "RunStarted",
    "RunTools",
    "Signal",
    "Snapshot",
    "StateSpec",
    "Step",
    "SubagentSpec",
    "ToolCallsReviewed",
    "ToolsFinished",
    "Traffic",
    "TransitionSpec",
    "TurnMachine",
    "Usage",
    "emergency_line",
    "finishes_before_an_answer",
    "line_reason",
    "render_dot",
    "render_mermaid",
    "tally",
    "threshold_line",
    "trigger_of",
]
