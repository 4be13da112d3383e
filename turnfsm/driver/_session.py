"""Sessions, the audit trail of runs and turns, and run results."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator, Sequence
from typing import Literal, final

import attrs

from turnfsm.core import CompactReason, Event, MessageInjected, RunCancelled, Usage
from turnfsm.errors import InvalidMessage, RunFailed, SessionBusy, TurnFSMError
from turnfsm.messages import Joined, Message, MessageLog

__all__ = [
    "CompactionRecord",
    "RunControl",
    "RunRecord",
    "RunResult",
    "Session",
    "TurnRecord",
    "new_id",
]


def new_id(prefix: str) -> str:
    """Return a fresh id such as ``run_3f2a...``."""
    return f"{prefix}_{uuid.uuid4().hex[:20]}"


@final
@attrs.frozen(kw_only=True)
class TurnRecord:
    """One model call: the context it really saw, its output and usage."""

    turn: int
    history: MessageLog = attrs.field(repr=False)
    pending: MessageLog = attrs.field(repr=False)
    output: Message
    usage: Usage | None = None

    @property
    def context(self) -> Sequence[Message]:
        """The conversation the model saw on this turn (history + pending)."""
        return Joined(self.history, self.pending)


@final
@attrs.frozen(kw_only=True)
class CompactionRecord:
    """One compaction pass of a run."""

    reason: CompactReason
    tokens_before: int
    tokens_after: int
    messages_before: int
    messages_after: int
    compacted: bool
    vetoed: bool = False


@final
@attrs.frozen(kw_only=True)
class RunRecord:
    """The audit trail of one run; never rewritten by compaction."""

    run_id: str
    input: tuple[Message, ...]
    turns: tuple[TurnRecord, ...]
    compactions: tuple[CompactionRecord, ...]
    events: tuple[Event, ...] = attrs.field(repr=False)
    phase: str
    text: str
    error: TurnFSMError | None
    usage: Usage


@final
@attrs.define(eq=False)
class Session:
    """A conversation across runs: committed `history` and the `runs` audit trail."""

    id: str = attrs.field(factory=lambda: new_id("ses"))
    history: MessageLog = attrs.field(factory=MessageLog)
    runs: list[RunRecord] = attrs.field(factory=list)
    is_running: bool = attrs.field(default=False, init=False)

    @contextlib.contextmanager
    def claim(self) -> Iterator[Session]:
        """Hold the session for one run (the driver does this).

        Raises:
            SessionBusy: another run holds it: two runs on one history would
                each commit over the other.
        """
        if self.is_running:
            raise SessionBusy(self.id)
        self.is_running = True
        try:
            yield self
        finally:
            self.is_running = False


@final
@attrs.define(eq=False)
class RunControl:
    """Steer a run from outside while it runs (another task, a UI, a hook).

    `inject()` adds a message (human input, steering) and `cancel()` ends the
    run with `Cancelled`; both take effect between two effects, so a tool
    batch or model call in flight is never torn apart. A message injected
    while the model writes its final answer keeps the run going: the model is
    called again with it. Use one control per run: what is queued after the
    run ended stays queued.
    """

    _queue: list[Event] = attrs.field(factory=list, init=False)

    def inject(self, message: Message) -> None:
        """Queue `message`; it joins the conversation at the next safe point.

        Raises:
            InvalidMessage: `message` is not a `Message`, or carries tool calls
                or tool results (their other half could never follow).
        """
        if not isinstance(message, Message):
            raise InvalidMessage("message", message, "expected a Message")
        if message.tool_calls or message.tool_results:
            raise InvalidMessage(
                "message.parts",
                message.id,
                "an injected message cannot carry tool calls or tool results",
            )
        self._queue.append(MessageInjected(message=message))

    def cancel(self, reason: str = "cancelled") -> None:
        """End the run at its next step with `Cancelled(reason)`."""
        self._queue.append(RunCancelled(reason=reason))

    def drain(self) -> list[Event]:
        """Return and forget the queued events (the driver calls this)."""
        events, self._queue = self._queue, []
        return events


@final
@attrs.frozen(kw_only=True)
class RunResult:
    """What a run ended with; a failed run is an outcome, not an exception."""

    outcome: Literal["done", "failed"]
    text: str
    error: TurnFSMError | None
    usage: Usage
    session_id: str
    run_id: str
    turns: int

    @property
    def ok(self) -> bool:
        """Whether the run finished with an answer."""
        return self.outcome == "done"

    def raise_for_failure(self) -> RunResult:
        """Return self for a finished run; raise for a failed one.

        Raises:
            RunFailed: the run failed; `.error` is the typed cause.
        """
        if self.error is not None:
            raise RunFailed(self.error)
        return self
