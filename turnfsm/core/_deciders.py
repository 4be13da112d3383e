"""What each phase decides, given the snapshot and the calls left open."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeAlias

from turnfsm.core._decisions import (
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
from turnfsm.core._lines import CompactReason
from turnfsm.core._snapshot import Snapshot
from turnfsm.core._spec import MachineSpec, StateSpec
from turnfsm.errors import IllegalEvent, TurnFSMError
from turnfsm.messages import OpenCalls, ToolCallPart

__all__ = ["Decide", "_decider"]


Decide: TypeAlias = Callable[[Snapshot, OpenCalls], Decision]
"""The decision a phase emits, given the snapshot and its pending's open calls."""


def _unanswered(s: Snapshot, left_open: OpenCalls) -> tuple[ToolCallPart, ...]:
    """The last reply's tool calls that have no result in pending yet."""
    if s.last_reply is None:
        return ()
    open_ids = list(left_open.ids)
    calls = []
    for call in s.last_reply.tool_calls:
        if call.id in open_ids:
            open_ids.remove(call.id)
            calls.append(call)
    return tuple(calls)


# The brain makes a decision per event from its snapshot, whose fields were
# checked when they were set (the logs, the turn count, the last reply's
# calls): checking them again in the decision's validators would cost more
# than the rest of the decision (`Snapshot.replace` skips them likewise), so
# the three decisions of every tool turn are built field by field.
_new = object.__new__
_set = object.__setattr__


def _measure(s: Snapshot, _o: OpenCalls) -> Measure:
    decision: Measure = _new(Measure)
    _set(decision, "history", s.history)
    _set(decision, "pending", s.pending)
    return decision


def _call_llm(s: Snapshot, _o: OpenCalls) -> CallLLM:
    decision: CallLLM = _new(CallLLM)
    _set(decision, "history", s.history)
    _set(decision, "pending", s.pending)
    _set(decision, "turn", s.turns + 1)
    return decision


def _run_tools(s: Snapshot, o: OpenCalls) -> RunTools:
    decision: RunTools = _new(RunTools)
    _set(decision, "calls", _unanswered(s, o))
    return decision


def _decider(spec: MachineSpec, state: StateSpec) -> Decide:
    """Return how the phase `state` decides (built once per spec)."""
    kind = state.decision
    phase = state.name
    if kind == "measure":
        return _measure
    if kind == "call_llm":
        return _call_llm
    if kind == "run_tools":
        return _run_tools
    if kind == "pause":
        accepts = spec.accepts(phase)
        return lambda s, o: Pause(phase=phase, calls=_unanswered(s, o), accepts=accepts)
    if kind == "compact":
        return lambda s, _o: Compact(
            reason=s.compact_reason or CompactReason.MANUAL,
            history=s.history,
            pending=s.pending,
        )
    if kind == "finish":
        return lambda s, _o: Finish(
            text=s.last_reply.text if s.last_reply is not None else ""
        )
    if kind == "fail":
        return lambda s, _o: Fail(error=_error_of(s))
    effect = state.effect or ""
    return lambda _s, _o: Perform(effect=effect, phase=phase)


def _error_of(s: Snapshot) -> TurnFSMError:
    if s.failure is not None:
        return s.failure.to_error()
    return IllegalEvent(phase=s.phase, event="?")
