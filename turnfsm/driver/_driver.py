"""The Driver: the hands that carry out the brain's decisions.

Theory of operation
-------------------
One loop per run. The brain (`TurnMachine`) answers every event with a
decision; the driver matches on the decision, awaits its effect, and feeds
the event the effect returns back into the brain:

    decision = machine.handle(RunStarted(input))
    while decision is not Finish / Fail:
        event = await effect(decision)      # measure, call model, run tools, compact
        decision = machine.handle(event)

Rule 1 - the driver measures, the brain decides. Every `Measure` decision is
answered with the size of the *whole* next request: history + pending + the
extras that ride it (system prompt, tool schemas), counted with the context
manager's counter. Extras are also the reserved budget handed to the manager,
so they still fit after shrinking. Counting is incremental (`Meter`).

Rule 2 - nothing oversized is ever sent. The brain's emergency line keeps
`CallLLM` under 95 % of the window; the driver re-checks the request right
before sending and turns an oversized one into `ContextOverflowed`.

Rule 3 - outside failures become events once, at the effect that met them.
Bugs (TypeError, AssertionError) and cancellation propagate unchanged; the
session is only updated when the run ends, so a cancelled run leaves the
committed history as it was.

Hooks see each transition, decision and outcome; only overridden hook
methods are called.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, final

import attrs

from turnfsm._resources import default_machine
from turnfsm.context import ContextManager
from turnfsm.core import (
    Budget,
    CallLLM,
    Compact,
    Decision,
    Event,
    Fail,
    Finish,
    MachineSpec,
    Measure,
    Measured,
    Perform,
    RunStarted,
    RunTools,
    Snapshot,
    TurnMachine,
    Usage,
)
from turnfsm.driver import _effects
from turnfsm.driver._retry import RetryPolicy
from turnfsm.driver._session import (
    CompactionRecord,
    RunControl,
    RunRecord,
    RunResult,
    Session,
    TurnRecord,
    new_id,
)
from turnfsm.driver._tools import Tool, tools_by_name
from turnfsm.errors import ConfigError, TurnFSMError
from turnfsm.hooks import (
    DecisionInfo,
    Hook,
    OutcomeInfo,
    RunEndInfo,
    RunStartInfo,
    TransitionInfo,
)
from turnfsm.hooks._dispatch import HookDispatcher
from turnfsm.messages import Message, MessageLog, check_history
from turnfsm.providers import ModelClient, ToolSchema
from turnfsm.tokens import Meter, TokenCounter, default_counter

__all__ = ["Driver", "Effect"]

Effect = Callable[[Snapshot], Awaitable[Event]]
"""A user effect for a custom phase: gets the snapshot, returns the next event."""


def _timeout(name: str) -> Any:
    def check(_inst: object, _attr: object, value: object) -> None:
        if value is None:
            return
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise ConfigError(name, value, "a number of seconds > 0, or None")

    return check


@final
@attrs.define(eq=False, kw_only=True)
class Driver:
    """Runs the Turn FSM against a model, tools and a context manager.

    Attributes:
        model: the `ModelClient` to call.
        tools: tools the model may call (functions are wrapped as `Tool`s).
        system_prompt: sent with every request and counted in every measure.
        context: the `ContextManager` (window, lines, compactor); None means
            no compaction: a pass over the line is a no-op and the run fails.
        context_window: the window when there is no context manager.
        max_turns: model calls per run.
        max_overflow_retries: compact-and-retry passes after provider overflows.
        tool_timeout: seconds each tool call may take (None: no limit).
        model_timeout: seconds each model attempt may take (None: no limit).
        retry: the policy for transient model errors.
        hooks: observers; see `Hook`.
        strict_hooks: re-raise hook errors instead of detaching the hook.
        machine: the machine definition (defaults to ``machines/turn.toml``).
        effects: async effects for custom phases, by effect name.
        max_output_tokens: the reply budget asked of the model.
    """

    model: ModelClient
    tools: Sequence[Tool | Callable[..., Any]] = ()
    system_prompt: str | None = None
    context: ContextManager | None = attrs.field(factory=ContextManager)
    context_window: int = 0
    max_turns: int = 50
    max_overflow_retries: int = 2
    tool_timeout: float | None = attrs.field(
        default=60.0, validator=_timeout("tool_timeout")
    )
    model_timeout: float | None = attrs.field(
        default=300.0, validator=_timeout("model_timeout")
    )
    retry: RetryPolicy = attrs.field(factory=RetryPolicy)
    hooks: Sequence[Hook] = ()
    strict_hooks: bool = False
    machine: MachineSpec = attrs.field(factory=default_machine)
    effects: Mapping[str, Effect] = attrs.field(factory=dict)
    max_output_tokens: int | None = None
    _tools: dict[str, Tool] = attrs.field(init=False)
    _budget: Budget = attrs.field(init=False)
    _schemas: tuple[ToolSchema, ...] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.model, ModelClient):
            raise ConfigError("model", self.model, "a ModelClient (async complete())")
        self._tools = tools_by_name(self.tools)
        self._schemas = tuple(t.schema for t in self._tools.values())
        ctx = self.context
        self._budget = Budget(
            context_window=ctx.context_window if ctx else self.context_window,
            threshold=ctx.threshold if ctx else 80,
            auto_compact=ctx.auto_compact if ctx else True,
            max_turns=self.max_turns,
            max_overflow_retries=self.max_overflow_retries,
        )
        for state in self.machine.states:
            if state.effect is not None and state.effect not in self.effects:
                raise ConfigError(
                    "effects",
                    sorted(self.effects),
                    f"an effect named {state.effect!r} for phase {state.name!r}",
                )

    @property
    def budget(self) -> Budget:
        """The limits each run works within."""
        return self._budget

    @property
    def counter(self) -> TokenCounter:
        """The one counter used everywhere: the context manager's."""
        return self.context.counter if self.context else default_counter()

    async def run(
        self,
        input: str | Message | Iterable[Message],
        *,
        session: Session | None = None,
        control: RunControl | None = None,
        hooks: Sequence[Hook] = (),
    ) -> RunResult:
        """Run the loop until the brain finishes or fails.

        Args:
            input: the run's new messages (a string becomes one user message).
            session: the conversation to continue; a new one if None. Its
                history and audit trail are updated when the run ends.
            control: a `RunControl` to inject messages or cancel while the
                run runs.
            hooks: extra hooks for this run only (after the driver's own).
                When one wants `on_text_delta` and the model can `stream`,
                replies are streamed.

        Returns:
            The `RunResult`; a failed run is an outcome (see
            `RunResult.raise_for_failure`).

        Raises:
            InvalidMessage: the input is malformed (nothing was changed).
            SessionBusy: another run is using `session`.
        """
        messages = _as_messages(input)
        session = session if session is not None else Session()
        check_history((*session.history, *messages))
        with session.claim():
            return await _Run(self, session, messages, control, hooks).execute()


def _as_messages(value: str | Message | Iterable[Message]) -> tuple[Message, ...]:
    if isinstance(value, str):
        return (Message.user(value),)
    if isinstance(value, Message):
        return (value,)
    return check_history(value)


class _Run:
    """The state of one run inside the driver (internal)."""

    def __init__(
        self,
        driver: Driver,
        session: Session,
        messages: tuple[Message, ...],
        control: RunControl | None,
        hooks: Sequence[Hook] = (),
    ) -> None:
        self.driver = driver
        self.control = control
        self.session = session
        self.input = messages
        self.run_id = new_id("run")
        self.budget = driver.budget
        self.tools = driver._tools
        self.tool_schemas = driver._schemas
        self.hooks = HookDispatcher.of(
            [*driver.hooks, *hooks], strict=driver.strict_hooks
        )
        self.wants_stream = self.hooks.wants("on_text_delta") and callable(
            getattr(driver.model, "stream", None)
        )
        self.meter = Meter(driver.counter)
        extras = [driver.system_prompt or ""]
        if self.tool_schemas:
            extras.append(json.dumps([attrs.asdict(s) for s in self.tool_schemas]))
        self.extras = tuple(e for e in extras if e)
        self.reserved = self.meter.measure(extras=self.extras) if self.extras else 0
        self.turns: list[TurnRecord] = []
        self.compactions: list[CompactionRecord] = []
        self.events: list[Event] = []
        self.usage = Usage()
        self.turn = 0

    def measure(self, history: MessageLog, pending: MessageLog) -> int:
        """Measure the whole request: history + pending + extras."""
        return self.meter.measure(history, pending, extras=self.extras)

    def record_turn(
        self, decision: CallLLM, output: Message, usage: Usage | None
    ) -> None:
        """Add a turn to the audit trail."""
        self.turns.append(
            TurnRecord(
                turn=decision.turn,
                history=decision.history,
                pending=decision.pending,
                output=output,
                usage=usage,
            )
        )
        if usage is not None:
            self.usage = self.usage + usage

    async def execute(self) -> RunResult:
        machine = TurnMachine.start(
            self.driver.machine, budget=self.budget, history=self.session.history
        )
        if self.hooks.wants("on_run_start"):
            self.hooks.call(
                "on_run_start",
                RunStartInfo(
                    session_id=self.session.id, run_id=self.run_id, input=self.input
                ),
            )
        event: Event = RunStarted(input=self.input)
        decision = self.feed(machine, event)
        while not isinstance(decision := self.steer(machine, decision), Finish | Fail):
            if self.hooks.wants("on_decision"):
                self.hooks.call(
                    "on_decision",
                    DecisionInfo(
                        run_id=self.run_id,
                        phase=machine.phase,
                        decision=decision,
                        turn=self.turn,
                    ),
                )
            event = await self.effect(machine, decision)
            if self.hooks.wants("on_outcome"):
                self.hooks.call(
                    "on_outcome",
                    OutcomeInfo(
                        run_id=self.run_id,
                        phase=machine.phase,
                        decision=decision,
                        event=event,
                    ),
                )
            # Steering that arrived while the effect ran is applied before its
            # outcome, so a final reply still sees an injected message (it
            # waits in the inbox). Not after a measurement: the estimate must
            # be of the request as it is.
            if not isinstance(decision, Measure) and isinstance(
                self.steer(machine, decision), Finish | Fail
            ):
                decision = machine.decision
                break
            decision = self.feed(machine, event)
        assert isinstance(decision, Finish | Fail)
        return self.finish(machine, decision)

    def steer(self, machine: TurnMachine, decision: Decision) -> Decision:
        """Feed what the `RunControl` queued (injections, a cancel)."""
        if self.control is not None:
            for queued in self.control.drain():
                decision = self.feed(machine, queued)
        return decision

    def feed(self, machine: TurnMachine, event: Event) -> Decision:
        self.events.append(event)
        decision = machine.handle(event)
        step = machine.last_step
        if step is not None and self.hooks.wants("on_transition"):
            self.hooks.call(
                "on_transition", TransitionInfo(run_id=self.run_id, step=step)
            )
        return decision

    async def effect(self, machine: TurnMachine, decision: Decision) -> Event:
        match decision:
            case Measure(history=history, pending=pending):
                return Measured(estimate=self.measure(history, pending))
            case CallLLM():
                self.turn = decision.turn
                return await _effects.call_model(self, decision)
            case RunTools():
                return await _effects.run_tools(self, decision)
            case Compact():
                return await _effects.compact(self, decision)
            case Perform(effect=name):
                return await self.driver.effects[name](machine.snapshot)
            case Finish() | Fail():  # pragma: no cover - the loop stops first
                raise AssertionError("terminal decisions have no effect")

    def finish(self, machine: TurnMachine, decision: Finish | Fail) -> RunResult:
        snapshot = machine.snapshot
        error: TurnFSMError | None = (
            decision.error if isinstance(decision, Fail) else None
        )
        text = decision.text if isinstance(decision, Finish) else ""
        self.session.history = snapshot.history
        self.session.runs.append(
            RunRecord(
                run_id=self.run_id,
                input=self.input,
                turns=tuple(self.turns),
                compactions=tuple(self.compactions),
                events=tuple(self.events),
                phase=snapshot.phase,
                text=text,
                error=error,
                usage=self.usage,
            )
        )
        if self.hooks.wants("on_run_end"):
            self.hooks.call(
                "on_run_end",
                RunEndInfo(
                    run_id=self.run_id, phase=snapshot.phase, text=text, error=error
                ),
            )
        return RunResult(
            outcome="done" if error is None else "failed",
            text=text,
            error=error,
            usage=self.usage,
            session_id=self.session.id,
            run_id=self.run_id,
            turns=snapshot.turns,
        )
