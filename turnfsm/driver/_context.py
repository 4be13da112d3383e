"""What an effect is given: the run's resources and one step's frozen context.

An effect is a function of one `EffectContext` and one decision, returning
one event (httpx's request in, response out). The context is frozen and
made by the loop for each step: the run's `RunResources` (the same for the
whole run), the brain's snapshot as of the decision, and the step's two
explicit outlets, the `ToolJournal` (tool results as they finish) and the
`UsageTally` (what the step's summary calls cost, kept when the step is
cut short). Effects write nothing else: the loop appends to the log and
builds the audit trail from (decision, event).
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, final

import attrs

from turnfsm import _checks, _deprecated, _instrument
from turnfsm.context import CALIBRATION_CEILING, ContextManager
from turnfsm.core import Snapshot
from turnfsm.driver._output import OutputType
from turnfsm.driver._retry import RetryPolicy
from turnfsm.driver._tools import Tool
from turnfsm.hooks import Hook, HookDispatcher
from turnfsm.messages import Message, MessageLog
from turnfsm.persistence import Session, new_id
from turnfsm.providers import ModelClient, ModelRequest, OutputSpec, ToolSchema
from turnfsm.tokens import Meter
from turnfsm.values import Usage

if TYPE_CHECKING:
    from turnfsm.driver._driver import Driver

__all__ = [
    "EffectContext",
    "Reported",
    "RunResources",
    "ToolJournal",
    "UsageTally",
    "ending_time",
    "report_limit",
    "request_extras",
    "run_resources",
]


def report_limit(window: int) -> int | None:
    """The most input tokens a provider can report for a request held to `window`.

    The driver sends a request only when its measure fits `window`, so the
    provider's count of it can exceed `window` only by what the counter
    undercounts the provider's tokens, which a calibrating manager corrects
    up to `CALIBRATION_CEILING` times. A report past that is not the size
    of the request it came with (a client's bug), and read as a size it
    would make a conversation no pass can shrink. None: no window, no limit.
    """
    if not window:
        return None
    return int(window * CALIBRATION_CEILING)


def request_extras(
    system: str | None,
    schemas: Sequence[ToolSchema],
    output: OutputSpec | None = None,
) -> tuple[str, ...]:
    """The texts that ride a request besides its messages, as the meter counts them.

    The system prompt, the tool schemas (as JSON) and the structured output's
    schema (as JSON; the provider reads it as input, a response format or a
    forced tool): every request is measured with these, the run's own turns
    and the summary calls alike.
    """
    extras = [system or ""]
    if schemas:
        extras.append(json.dumps([attrs.asdict(s) for s in schemas]))
    if output is not None:
        extras.append(json.dumps(attrs.asdict(output)))
    return tuple(e for e in extras if e)


@final
@attrs.frozen(kw_only=True, eq=False)
class RunResources:
    """What every effect of one run may use; the same for the whole run.

    Attributes:
        run_id: The run.
        session_id: Its session.
        model: The `ModelClient`.
        tools: The registered tools, by name.
        tool_schemas: Their schemas, as sent with every request.
        system_prompt: Sent with every request.
        context: The context manager, or None (no compaction).
        meter: Measures requests with the one counter (the manager's).
        extras: Texts that ride every request (system prompt, tool schemas).
        reserved: Tokens the request needs besides its messages: the extras
            plus the reply budget (`max_output_tokens`).
        max_output_tokens: The reply budget asked of the model.
        retry: The policy for transient model errors.
        model_timeout: Seconds each model attempt may take (None: no limit).
        tool_timeout: Seconds each tool call may take (None: no limit).
        hooks: The run's hooks (for the effects that steer or stream).
        stream: Whether replies are streamed to the hooks.
        clock: Wall-clock seconds (``time.time`` unless replaced); each
            reading is checked (a finite number) before it is used.
        new_id: Makes a fresh id from a prefix.
        session: The session's log (read it; only the loop appends), or
            None: compaction passes read its circuit breaker and recorded
            summaries from it.
        ephemeral: The session is ephemeral: compaction passes change nothing.
        output: The run's output type, or None (the answer is plain text):
            a final reply that does not fit it is `OutputRejected`.
        window: The agent's context window (its context manager's, else
            its `context_window`; 0: none). A run resumed by an agent on a
            smaller window than the run began on sends no request over it.
        first_attempt: The number of the model call's first attempt here:
            a durable run's model call that Temporal tries again starts
            at the attempt its activity makes (2 for the first retry).
        first_wait: The seconds waited before that attempt (0 for the
            first), as the model-call hooks hear it.
    """

    run_id: str
    session_id: str
    model: ModelClient
    tools: Mapping[str, Tool]
    tool_schemas: tuple[ToolSchema, ...]
    system_prompt: str | None
    context: ContextManager | None
    meter: Meter
    extras: tuple[str, ...]
    reserved: int
    max_output_tokens: int | None
    retry: RetryPolicy
    model_timeout: float | None
    tool_timeout: float | None
    hooks: HookDispatcher
    stream: bool
    clock: Callable[[], float]
    new_id: Callable[[str], str]
    session: Session | None = None
    ephemeral: bool = False
    output: OutputType | None = None
    window: int = 0
    first_attempt: int = 1
    first_wait: float = 0.0

    def measure(self, *parts: Sequence[Message]) -> int:
        """Return the size of a request carrying `parts`: messages + reserved."""
        return self.meter.measure(*parts, extras=self.extras) + (
            self.max_output_tokens or 0
        )


@final
@attrs.frozen(kw_only=True)
class Reported:
    """The input tokens the provider reported for the run's last model call.

    Attributes:
        tokens: The reported input tokens.
        history: The history that call carried.
        pending: The pending messages that call carried.
        carried: Whether the call was an earlier run's (carried over).
    """

    tokens: int
    history: MessageLog
    pending: MessageLog
    carried: bool = False


@final
@attrs.frozen(kw_only=True, eq=False)
class ToolJournal:
    """Where the tool results of the batch in flight go as each call finishes.

    Attributes:
        recorded: Results a previous process recorded before it died, by
            call id: those calls are not run again.
        record: Hands one finished result to the loop, which logs it at
            once (None: nothing is journaled; a lone call's result is logged
            with its batch).
        interrupted: Ids of the `recorded` calls this process closed as
            interrupted (their process died before they finished): the hooks
            hear of each, as of a call that ran.
    """

    recorded: Mapping[str, Message] = attrs.field(factory=dict)
    record: Callable[[Message], Awaitable[None]] | None = None
    interrupted: frozenset[str] = frozenset()


@final
class UsageTally:
    """What one step's model calls cost so far (a compaction pass's summaries).

    Kept by the loop, so a pass cut short (a timeout, a cancel) still
    counts what its calls cost.
    """

    __slots__ = ("_spent",)

    def __init__(self) -> None:
        self._spent: list[Usage] = []

    def add(self, usage: Usage | None) -> None:
        """Count one call's usage (None: the call reported none)."""
        if usage is not None:
            self._spent.append(usage)

    @property
    def total(self) -> Usage | None:
        """The sum so far, or None when no call reported usage."""
        return sum(self._spent, Usage()) if self._spent else None


@final
@attrs.frozen(kw_only=True, eq=False)
class EffectContext:
    """What an effect gets for one step of a run (frozen; made per step).

    Attributes:
        run: The run's resources (model, tools, context manager, hooks, ...).
        snapshot: The brain's state as of the decision being carried out.
        journal: Where tool results go as they finish (a `run_tools` step).
        spent: What the step's own model calls cost so far.
        reported: The provider's count of the run's last call, or None.
        ratio: The session's largest ratio of reported to estimated input
            tokens so far, of the run's counter
            (`Session.reported_ratio_for`), or None.
    """

    run: RunResources
    snapshot: Snapshot
    journal: ToolJournal | None = None
    spent: UsageTally = attrs.field(factory=UsageTally)
    reported: Reported | None = None
    ratio: float | None = None

    @property
    def run_id(self) -> str:
        """The run."""
        return self.run.run_id

    @property
    def session_id(self) -> str:
        """The run's session."""
        return self.run.session_id

    @property
    def session(self) -> Session | None:
        """The session's log (read only), or None."""
        return self.run.session

    @property
    def turn(self) -> int:
        """Model calls the run has made so far."""
        return self.snapshot.turns

    @property
    def window(self) -> int:
        """The context window the run works within (0: unlimited).

        The window the run began on, or the agent's own when it is smaller
        (a run resumed by an agent on a smaller model): no request over
        either is sent.
        """
        began = self.snapshot.budget.context_window
        own = self.run.window
        if own and (not began or own < began):
            return own
        return began

    def measure(self, *parts: Sequence[Message]) -> int:
        """Return the size of a request carrying `parts`: messages + reserved.

        As the lines and the window check see it: the estimate of its input
        (messages and extras), calibrated by the manager against `ratio`
        (unchanged unless it calibrates), plus the reply budget.
        """
        run = self.run
        estimate = run.meter.measure(*parts, extras=run.extras)
        if run.context is not None:
            estimate = run.context.calibrated(estimate, self.ratio)
        return estimate + (run.max_output_tokens or 0)

    def measure_request(self, request: ModelRequest) -> int:
        """Return the size of a summary `request`, in the manager's tokens.

        Its messages, its system prompt and tool schemas, with the run's
        counter, plus its reply budget (`max_tokens`): the unit a compactor
        sizes its requests in (`CompactionContext.counter`), uncalibrated.
        A request to the agent's own model is held to the window calibrated,
        as its turns are (`_over_window`).
        """
        extras = request_extras(request.system, request.tools, request.output)
        estimate = self.run.meter.measure(request.messages, extras=extras)
        return estimate + (request.max_tokens or 0)

    def __getattr__(self, name: str) -> Any:
        # The run's resources were the context's own fields before it was
        # frozen per step: read them through `run`, with a warning.
        if name in _RESOURCES:
            _deprecated.warn(f"EffectContext.{name}", f"EffectContext.run.{name}")
            return getattr(self.run, name)
        raise AttributeError(f"{type(self).__name__!r} has no attribute {name!r}")


_RESOURCES = frozenset(a.name for a in attrs.fields(RunResources)) - {"session"}


def run_resources(
    driver: Driver,
    run_id: str,
    *,
    session: Session | None,
    session_id: str,
    hooks: Sequence[Hook],
    output: OutputType | None,
    retry: RetryPolicy | None,
) -> RunResources:
    """What the effects of run `run_id` may use (see `Driver.resources`)."""
    listed = _instrument.hooks_for([*driver.hooks, *hooks], driver.tracing)
    dispatcher = HookDispatcher.of(listed, strict=driver.strict_hooks)
    meter = driver._run_meter()
    kept = driver._extras_for(output)
    reserved = (meter.measure(extras=kept) if kept else 0) + (
        driver.max_output_tokens or 0
    )
    return RunResources(
        run_id=run_id,
        session_id=session_id,
        model=driver.model,
        tools=driver._tools,
        tool_schemas=driver._schemas,
        system_prompt=driver.system_prompt,
        context=driver.context,
        meter=meter,
        extras=kept,
        reserved=reserved,
        max_output_tokens=driver.max_output_tokens,
        retry=driver.retry if retry is None else retry,
        model_timeout=driver.model_timeout,
        tool_timeout=driver.tool_timeout,
        hooks=dispatcher,
        stream=dispatcher.wants("on_text_delta")
        and callable(getattr(driver.model, "stream", None)),
        clock=_checked_clock(driver.clock),
        new_id=new_id,
        ephemeral=session.is_ephemeral if session is not None else False,
        session=session,
        output=output,
        window=driver.budget.context_window,
    )


def _checked_clock(clock: Callable[[], float]) -> Callable[[], float]:
    """`clock`, each reading checked before it reaches a record or a hook.

    A clock of yours that returns None, a string or a `datetime` is named
    where it is read; the records it would have stamped are not written, so
    the session's log stays readable.
    """
    return _CheckedClock(clock)


@final
class _CheckedClock:
    """A run's clock, checked; keeps its last good reading (`ending_time`)."""

    __slots__ = ("clock", "last")

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.last: float | None = None

    def __call__(self) -> float:
        self.last = _checks.clock_reading(self.clock(), self.clock)
        return self.last


def ending_time(clock: Callable[[], float]) -> float:
    """Read `clock` for a run's end, whatever the clock does.

    A run ending because its clock failed still logs its end (a run left
    open would hold its session): it is stamped with the last time the
    clock told, or the system's time when it told none.
    """
    try:
        return clock()
    except Exception:
        if isinstance(clock, _CheckedClock) and clock.last is not None:
            return clock.last
        return time.time()
