"""The `Hook` base class: a run's observer, which overrides what it needs."""

from __future__ import annotations

from typing import Final

from turnfsm.hooks._infos import (
    CircuitInfo,
    CompactionDone,
    CompactionInfo,
    DecisionInfo,
    ModelCallEnd,
    ModelCallInfo,
    OutcomeInfo,
    PreCompact,
    PreCompactInfo,
    RunEndInfo,
    RunStartInfo,
    TextDeltaInfo,
    TextDiscardedInfo,
    ToolCallEnd,
    ToolCallInfo,
    TransitionInfo,
)
from turnfsm.persistence import CompactionRecord

__all__ = ["DEPRECATED_METHODS", "HOOK_METHODS", "Hook"]


class Hook:
    """Observe (and, for compaction, steer) a run; override what you need.

    Every method takes one frozen record, so new fields never break a
    subclass. Hooks are synchronous and must not block; the driver calls
    only the methods a subclass overrides. A hook that raises is logged on
    the ``turnfsm.hooks`` logger and detached (``strict_hooks=True``
    re-raises instead, for tests); so is one that returns what would be
    ignored (`InvalidReturn`: an awaitable, or a `pre_compact` answer that
    is not a `PreCompact`). An ``async def`` method, a generator method
    (one with ``yield``: none of its body would run) and one that is not
    callable are refused where the hook is given (`ConfigError`).
    """

    def on_run_start(self, info: RunStartInfo) -> None:
        """Called once when a run begins, and when it is resumed or abandoned."""

    def on_transition(self, info: TransitionInfo) -> None:
        """Called after each transition the brain fires."""

    def on_decision(self, info: DecisionInfo) -> None:
        """Called before the driver carries out a decision."""

    def on_outcome(self, info: OutcomeInfo) -> None:
        """Called with the event a decision produced, before it is fed back."""

    def on_model_call_start(self, info: ModelCallInfo) -> None:
        """Called before each model-call attempt (retries and summary calls too)."""

    def on_model_call_end(self, info: ModelCallEnd) -> None:
        """Called after each model-call attempt, however it ended."""

    def on_tool_start(self, info: ToolCallInfo) -> None:
        """Called before each tool call runs (or, resumed, is closed as interrupted)."""

    def on_tool_end(self, info: ToolCallEnd) -> None:
        """Called after each tool call, however it ended (cancelled too).

        A call a resumed run closes as interrupted (`info.interrupted`) did
        not run: its `result` is the error result that says so.
        """

    def on_text_delta(self, info: TextDeltaInfo) -> None:
        """Called for each piece of streamed model text.

        Overriding it is what turns streaming on: the driver then calls the
        model's ``stream()`` (when it has one) instead of ``complete()``.
        """

    def on_text_discarded(self, info: TextDiscardedInfo) -> None:
        """Called when a streamed attempt failed after sending text: drop that text.

        It comes after the attempt's `on_model_call_end` and before a
        retry's `on_model_call_start`; the retry streams from the beginning.
        """

    def pre_compact(self, info: PreCompactInfo) -> PreCompact | None:
        """Called before a compaction pass; return a `PreCompact` to veto or steer."""
        return None

    def on_compaction_pass(self, record: CompactionRecord) -> None:
        """Called after every compaction pass with its record, once it is logged.

        Real compactions, no-ops, vetoes, and passes that failed alike:
        `record.verdict` is the pass's `Verdict` (`record.compacted` is True
        only for a real compaction); `record.covers` and
        `record.replacement` name the messages it was given and those that
        replace them.
        """

    def post_compact(self, info: CompactionInfo) -> None:
        """Deprecated: override `on_compaction_pass` (every pass, its record)."""

    def on_compaction(self, info: CompactionInfo) -> None:
        """Deprecated: override `on_compaction_pass` and read `record.compacted`."""

    def on_compaction_done(self, info: CompactionDone) -> None:
        """Deprecated: override `on_compaction_pass` and read `record.compacted`."""

    def on_circuit_opened(self, info: CircuitInfo) -> None:
        """Called once when a session's compaction circuit breaker opens (logged)."""

    def on_run_end(self, info: RunEndInfo) -> None:
        """Called once when a run ends."""


HOOK_METHODS: Final = (
    "on_run_start",
    "on_transition",
    "on_decision",
    "on_outcome",
    "on_model_call_start",
    "on_model_call_end",
    "on_tool_start",
    "on_tool_end",
    "on_text_delta",
    "on_text_discarded",
    "pre_compact",
    "on_compaction_pass",
    "post_compact",
    "on_compaction",
    "on_compaction_done",
    "on_circuit_opened",
    "on_run_end",
)
"""Every method of `Hook` the driver calls (a hook overrides what it needs)."""

DEPRECATED_METHODS: Final = ("post_compact", "on_compaction", "on_compaction_done")
"""Hook methods kept one release; `on_compaction_pass` replaces them."""
