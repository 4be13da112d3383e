"""Steering a run from outside (`RunControl`) and what a run ends with (`RunResult`)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, Final, Generic, Literal, final

import anyio
import anyio.from_thread
import anyio.lowlevel
import attrs
from typing_extensions import TypeVar

from turnfsm import _checks
from turnfsm.core import Event, MachineSpec, MessageInjected, Pause, RunCancelled
from turnfsm.errors import ConfigError, InvalidMessage, RunFailed, TurnFSMError
from turnfsm.messages import Message
from turnfsm.values import Usage

__all__ = ["OutputT", "RunControl", "RunResult"]

OutputT = TypeVar("OutputT", default=Any)
"""The type of a run's structured answer (`RunResult.output`)."""


@final
@_checks.keyword_checked
@attrs.define(eq=False)
class RunControl:
    """Steer a run from outside while it runs (another task, a UI, a hook).

    `inject()` adds a message (human input, steering); it joins the
    conversation between two effects, so a tool batch or model call in
    flight is never torn apart. A message injected while the model writes
    its final answer keeps the run going: the model is called again with it.
    `cancel()` ends the run with `Cancelled` at once: the effect in flight
    (a model call, a tool batch, a compaction pass) is interrupted, and the
    run is recorded as cancelled, from whatever thread `cancel()` is called
    (a UI's, a sync tool's). Use one control per run: what is queued
    after the run ended stays queued, and a run given a control another
    run still has is refused (`ConfigError`).
    """

    _queue: list[Event] = attrs.field(factory=list, init=False)
    _scope: anyio.CancelScope | None = attrs.field(default=None, init=False)
    _run_id: str | None = attrs.field(default=None, init=False)
    # The event loop of the run it steers, and its thread: a cancel from
    # another thread (a UI's, a sync tool's) interrupts the run through it.
    _loop: anyio.lowlevel.EventLoopToken | None = attrs.field(default=None, init=False)
    _thread: int | None = attrs.field(default=None, init=False)
    # Why the run it steers takes no injected message (None: it takes them).
    _refusal: str | None = attrs.field(default=None, init=False)

    def inject(self, message: Message) -> None:
        """Queue `message`; it joins the conversation at the next safe point.

        A message the conversation already has (the same id) fails the run
        with `InvalidMessage` when it would join; nothing of the run is
        committed. Build a new `Message` to say the same again.

        Raises:
            InvalidMessage: `message` is not a `Message`, carries tool calls
                or tool results (their other half could never follow), is
                queued already (a send retried), or the run this control
                steers has a machine none of whose phases takes an injected
                message: refused here, the run goes on.
        """
        if not isinstance(message, Message):
            raise InvalidMessage("message", message, "expected a Message")
        if self._refusal is not None:
            raise InvalidMessage("message", message.id, self._refusal)
        if message.tool_calls or message.tool_results:
            raise InvalidMessage(
                "message.parts",
                message.id,
                "an injected message cannot carry tool calls or tool results",
            )
        if any(
            type(e) is MessageInjected and e.message.id == message.id
            for e in self._queue
        ):
            raise InvalidMessage(
                "message.id",
                message.id,
                "a message not queued already: it joins the conversation once "
                "(build a new Message, Message.user(text), to say the same again)",
            )
        self._queue.append(MessageInjected(message=message))

    def cancel(self, reason: str = "cancelled") -> None:
        """End the run now with `Cancelled(reason)`, interrupting the effect running.

        A cancel while one is queued (a stop pressed twice) adds nothing: the
        run ends once, with the first reason, and no cancel is left for the
        next run this control steers. It may be called from any thread (a
        user interface's, a sync tool's): the effect in flight is
        interrupted all the same.
        """
        if not self.is_cancel_requested:
            self._queue.append(RunCancelled(reason=reason))
        if self._scope is None:
            return
        loop, thread = self._loop, self._thread
        if loop is None or thread == threading.get_ident():
            self._interrupt()
            return
        # RuntimeError: its event loop has ended, and the run with it.
        with contextlib.suppress(RuntimeError):
            anyio.from_thread.run_sync(self._interrupt, token=loop)

    def _interrupt(self) -> None:
        """Cancel the effect in flight, if any (in the run's event loop)."""
        if self._scope is not None:
            self._scope.cancel()

    def queued(self) -> tuple[Event, ...]:
        """What is queued and no run has taken yet (injected messages, a cancel)."""
        return tuple(self._queue)

    def requeue(self, events: Iterable[Event]) -> None:
        """Queue again what `queued` gave (another control's), in its order.

        Raises:
            InvalidMessage: an event is not an injected message or a cancel,
                or its message could not be injected (see `inject`).
        """
        for event in events:
            if isinstance(event, MessageInjected):
                self.inject(event.message)
            elif isinstance(event, RunCancelled):
                self.cancel(event.reason)
            else:
                raise InvalidMessage(
                    "events", event, "injected messages and cancels (queued())"
                )

    @property
    def is_cancel_requested(self) -> bool:
        """Whether `cancel()` was called and the run has not taken it yet."""
        return any(isinstance(e, RunCancelled) for e in self._queue)

    @contextlib.contextmanager
    def interrupting(self, scope: anyio.CancelScope) -> Iterator[None]:
        """Let `cancel()` interrupt what runs inside `scope` (the driver calls this)."""
        self._scope = scope
        try:
            yield
        finally:
            self._scope = None

    @contextlib.contextmanager
    def steering(self, run_id: str, spec: MachineSpec | None = None) -> Iterator[None]:
        """Give this control to run `run_id` until it ends (the driver calls this).

        While it steers a run whose machine `spec` takes no injected message,
        `inject` refuses at the call.

        Raises:
            ConfigError: another run has it and has not ended: a cancel
                through it could stop only one of the two.
        """
        if self._run_id is not None:
            raise ConfigError(
                "control",
                f"a RunControl in use by run {self._run_id!r}",
                "a RunControl of its own for each run running at once (one "
                "may steer another run once its run has ended)",
            )
        self._run_id = run_id
        self._loop = anyio.lowlevel.current_token()
        self._thread = threading.get_ident()
        self._refusal = None if spec is None else injection_refusal(spec)
        try:
            yield
        finally:
            self._run_id = self._refusal = None
            self._loop = self._thread = None

    def take_cancel(self) -> RunCancelled | None:
        """Remove and return the queued cancel, if any (the driver calls this)."""
        for index, event in enumerate(self._queue):
            if isinstance(event, RunCancelled):
                del self._queue[index]
                return event
        return None

    def drain(self) -> list[Event]:
        """Return and forget the queued events (the driver calls this)."""
        events, self._queue = self._queue, []
        return events

    def put_back(self, events: list[Event]) -> None:
        """Queue `events` again, before any queued since (the driver calls this)."""
        self._queue[:0] = events


def injection_refusal(spec: MachineSpec) -> str | None:
    """Why a run of `spec` takes no injected message (None: a phase takes them)."""
    trigger = "message_injected"
    if trigger in spec.triggers:
        return None
    return (
        f"machine {spec.name!r} takes no injected message"
        f" (none of its phases has a {trigger!r} transition)"
    )


_OTHER_RESULT_NAMES: Final = {
    "final_output": "the answer is .text, or .output with an output_type",
    "output_text": "the answer is .text",
    "messages": (
        "the conversation is the session's: agent.session.history (the "
        "messages the model saw on each turn: agent.session.run(run_id))"
    ),
    "new_items": "what the run did is agent.session.run(result.run_id)",
}
"""Other agent frameworks' names for a run result's parts, and where they are."""


@final
@attrs.frozen(kw_only=True)
class RunResult(Generic[OutputT]):
    """What a run ended with; a failed run is an outcome, not an exception.

    ``RunResult[T]`` is the result of a run with ``output_type=T``: `output`
    is the final answer read as a `T`.

    Attributes:
        outcome: done, failed, cancelled, or paused (the run waits for an
            answer: see `waiting` and `Agent.resume`).
        text: The final answer ("" unless done).
        error: Why the run failed or was cancelled, or None.
        usage: Provider usage summed over the run's model calls (the
            agent's turns).
        session_id: The session the run belongs to.
        run_id: The run.
        turns: Model calls made.
        waiting: What a paused run waits for (the phase, the tool calls, the
            triggers it accepts), else None.
        compaction_usage: Provider usage of the run's compaction passes (the
            summary model's calls), apart from `usage`.
        output: The final answer as a value of the run's output type
            (validated; re-read from `text` for a resumed run), or None (the
            run did not finish, or asked for no output type).
        children_usage: Provider usage of the sub-agents this run delegated
            to (their turns, passes and own sub-agents; see
            `Agent.as_tool`), apart from `usage`; a resumed run's counts
            the sub-agents it started before it was resumed too.
        cost: What the run's own model calls cost in US dollars, at the
            driver's `prices` (each call's reported usage: the input its
            prompt cache served at the cached price, the input written to
            the cache at the write price); None: the driver has no prices,
            or a reply came whose usage the provider did not report (a
            figure that leaves a call out is no cost).
        children_cost: What its sub-agents' model calls cost (theirs, their
            sub-agents', at each one's own prices); None when the cost of
            one of them is not known (no prices, or a reply with no usage;
            its usage is in `children_usage` all the same).
        reported_calls: How many of the run's model calls that got a reply
            (its `turns`, and the replies it could not use: cut off, withheld
            or over the window, which `usage` counts too) the provider
            reported usage for: when it is 0, `usage` is no count at all
            (some OpenAI-compatible servers report none); None: not known.
    """

    outcome: Literal["done", "failed", "cancelled", "interrupted", "paused"]
    text: str
    error: TurnFSMError | None
    usage: Usage
    session_id: str
    run_id: str
    turns: int
    waiting: Pause | None = None
    compaction_usage: Usage = attrs.field(factory=Usage)
    output: OutputT | None = None
    children_usage: Usage = attrs.field(factory=Usage)
    cost: float | None = None
    children_cost: float | None = 0.0
    reported_calls: int | None = None

    if not TYPE_CHECKING:  # a type checker names a wrong attribute itself

        def __getattr__(self, name: str) -> Any:
            # Called only for a name the result does not have.
            hint = _OTHER_RESULT_NAMES.get(name)
            said = f"'RunResult' object has no attribute {name!r}"
            raise AttributeError(f"{said}: {hint}" if hint else said)

    @property
    def cost_with_children(self) -> float | None:
        """The run's own `cost` plus its sub-agents' (None: one is not known)."""
        if self.cost is None or self.children_cost is None:
            return None
        return self.cost + self.children_cost

    @property
    def usage_with_children(self) -> Usage:
        """The run's own `usage` plus its sub-agents' (`children_usage`)."""
        return self.usage + self.children_usage

    @property
    def ok(self) -> bool:
        """Whether the run finished with an answer."""
        return self.outcome == "done"

    def raise_for_failure(self) -> RunResult[OutputT]:
        """Return self for a finished or paused run; raise if it failed or was stopped.

        Raises:
            RunFailed: the run failed or was cancelled; `.error` is the typed cause.
        """
        if self.error is not None:
            raise RunFailed(self.error)
        return self
