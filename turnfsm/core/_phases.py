"""The phases of the stock Turn FSM (``machines/turn.toml``)."""

from __future__ import annotations

from enum import StrEnum

__all__ = ["Phase"]


class Phase(StrEnum):
    """A state of the stock Turn FSM.

    User machines may add phases of their own; `TurnMachine.phase` is then a
    plain string. The stock phases compare equal to their string values.
    """

    START = "start"
    CALL_LLM = "call_llm"
    RUN_TOOLS = "run_tools"
    COMPACT = "compact"
    COMPACT_AND_RETRY = "compact_and_retry"
    DONE = "done"
    FAILED = "failed"
