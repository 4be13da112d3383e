"""The `Hook` base class and the frozen records its methods receive."""

from __future__ import annotations

from typing import final

import attrs

from turnfsm.core import CompactReason, Decision, Event, Step
from turnfsm.messages import Message
from turnfsm.values import Usage

__all__ = [
    "CircuitInfo",
    "CompactionDone",
    "CompactionInfo",
    "DecisionInfo",
    "Hook",
    "OutcomeInfo",
    "PreCompact",
    "PreCompactInfo",
    "RunEndInfo",
    "RunStartInfo",
    "TextDeltaInfo",
    "TransitionInfo",
]


@final
@attrs.frozen(kw_only=True)
class RunStartInfo:
    """A run began."""

    session_id: str
    run_id: str
    input: tuple[Message, ...]


@final
@attrs.frozen(kw_only=True)
class TransitionInfo:
    """The brain moved from one phase to another (or stayed, internally)."""

    run_id: str
    step: Step


@final
@attrs.frozen(kw_only=True)
class DecisionInfo:
    """The brain decided; the driver is about to carry the decision out."""

    run_id: str
    phase: str
    decision: Decision
    turn: int


@final
@attrs.frozen(kw_only=True)
class OutcomeInfo:
    """The driver carried a decision out and is feeding `event` back."""

    run_id: str
    phase: str
    decision: Decision
    event: Event


@final
@attrs.frozen(kw_only=True)
class TextDeltaInfo:
    """A piece of streamed model text."""

    run_id: str
    turn: int
    text: str


@final
@attrs.frozen(kw_only=True)
class RunEndInfo:
    """A run ended (or paused) in `phase`; `outcome` says how.

    `outcome` is done, failed, cancelled or paused; `error` is the typed
    cause of a failed or cancelled run.
    """

    run_id: str
    phase: str
    text: str
    error: Exception | None
    outcome: str = "done"


@final
@attrs.frozen(kw_only=True)
class PreCompactInfo:
    """A compaction pass is about to run over `messages`."""

    run_id: str
    reason: CompactReason
    turn: int
    tokens_before: int
    messages: tuple[Message, ...]


@final
@attrs.frozen(kw_only=True)
class PreCompact:
    """A `pre_compact` hook's answer: veto the pass, or steer the compactor.

    `instructions` and `additional_context` reach the compactor through its
    `CompactionContext`.
    """

    veto: bool = False
    instructions: str | None = None
    additional_context: str | None = None


@final
@attrs.frozen(kw_only=True)
class CompactionInfo:
    """A compaction pass finished; `compacted` is False for a no-op or veto."""

    run_id: str
    reason: CompactReason
    turn: int
    tokens_before: int
    tokens_after: int
    messages_before: int
    messages_after: int
    compacted: bool
    vetoed: bool = False

    @property
    def tokens_saved(self) -> int:
        """Tokens the pass saved (0 for a no-op)."""
        return max(0, self.tokens_before - self.tokens_after)


@final
@attrs.frozen(kw_only=True)
class CompactionDone:
    """A pass compacted a session's conversation (seed 004's CompactionDone).

    Its logged form is the run's `CompactionRecord` (outcome "compacted").

    Attributes:
        session_id: The session.
        run_id: The run the pass ran in.
        turn: The turns the run had taken.
        trigger: Why the pass ran.
        strategy: The compactor's class name.
        covers: Ids of the messages the pass was given.
        replacement: Ids of the messages that replace them.
        tokens_before: The request's size before the pass (reserved included).
        tokens_after: Its size after.
        usage: What the pass's summary-model calls reported, or None.
    """

    session_id: str
    run_id: str
    turn: int
    trigger: CompactReason
    strategy: str
    covers: tuple[str, ...]
    replacement: tuple[str, ...]
    tokens_before: int
    tokens_after: int
    usage: Usage | None = None

    @property
    def tokens_saved(self) -> int:
        """Tokens the pass saved."""
        return max(0, self.tokens_before - self.tokens_after)


@final
@attrs.frozen(kw_only=True)
class CircuitInfo:
    """A session's compaction circuit breaker opened after `failures` failures."""

    session_id: str
    run_id: str
    failures: int


class Hook:
    """Observe (and, for compaction, steer) a run; override what you need.

    Every method takes one frozen record, so new fields never break a
    subclass. Hooks are synchronous and must not block; the driver calls
    only the methods a subclass overrides. A hook that raises is logged on
    the ``turnfsm.hooks`` logger and detached (``strict_hooks=True``
    re-raises instead, for tests).
    """

    def on_run_start(self, info: RunStartInfo) -> None:
        """Called once when a run begins."""

    def on_transition(self, info: TransitionInfo) -> None:
        """Called after each transition the brain fires."""

    def on_decision(self, info: DecisionInfo) -> None:
        """Called before the driver carries out a decision."""

    def on_outcome(self, info: OutcomeInfo) -> None:
        """Called with the event a decision produced, before it is fed back."""

    def on_text_delta(self, info: TextDeltaInfo) -> None:
        """Called for each piece of streamed model text.

        Overriding it is what turns streaming on: the driver then calls the
        model's ``stream()`` (when it has one) instead of ``complete()``.
        """

    def pre_compact(self, info: PreCompactInfo) -> PreCompact | None:
        """Called before a compaction pass; return a `PreCompact` to veto or steer."""
        return None

    def post_compact(self, info: CompactionInfo) -> None:
        """Called after every compaction pass, whatever it came to.

        Real compactions, no-ops, vetoes, and passes that failed (the
        compactor raised, or its result still did not fit) alike;
        `info.compacted` is True only for a real compaction.
        """

    def on_compaction(self, info: CompactionInfo) -> None:
        """Called only after a pass that really compacted the conversation."""

    def on_compaction_done(self, info: CompactionDone) -> None:
        """Called after a pass that compacted: the session, what it covered."""

    def on_circuit_opened(self, info: CircuitInfo) -> None:
        """Called once when a session's compaction circuit breaker opens."""

    def on_run_end(self, info: RunEndInfo) -> None:
        """Called once when a run ends."""
