"""What each phase decides, given the snapshot and the calls left open."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeAlias, TypeVar

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


_D = TypeVar("_D", Measure, CallLLM, RunTools)

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


def _made(cls: type[_D], /, **fields: object) -> _D:
    """`cls(**fields)` without its validators: a decision of the snapshot's values.

    The brain makes a decision per event from its snapshot, whose fields were
    checked when they were set (the logs, the turn count, the last reply's
    calls): checking them again would cost more than the rest of the
    decision (`Snapshot.replace` skips them likewise).
    """
    decision = object.__new__(cls)
    for name, value in fields.items():
        object.__setattr__(decision, name, value)
    return decision


def _decider(spec: MachineSpec, state: StateSpec) -> Decide:
    """Return how the phase `state` decides (built once per spec)."""
    kind = state.decision
    phase = state.name
    if kind == "measure":
        return lambda s, _o: _made(Measure, history=s.history, pending=s.pending)
    if kind == "call_llm":
        return lambda s, _o: _made(
            CallLLM, history=s.history, pending=s.pending, turn=s.turns + 1
        )
    if kind == "run_tools":
        return lambda s, o: _made(RunTools, calls=_unanswered(s, o))
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
