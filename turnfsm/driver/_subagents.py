"""Sub-agents: a driver given to another run as a tool, its run linked to the call.

The parent's model calls the tool with a ``task``; the child runs that task
to its end inside the tool call, with its own model, tools, window, context
settings and machine, in a new session of the parent's store. The parent
gets the child's final answer (its structured output is that answer, as
JSON) as the tool's result, never its transcript.

Three run-scoped values travel with the call, as `current_session` does:

- the link the child's run opens with (`ParentLink`: the parent's session,
  run and call, and the depth), written in the child's `RunOpened`;
- the depth, so that sub-agents of sub-agents (or an agent given itself)
  stop at the tool's `max_depth`;
- the parent run's tally of its children's usage, which its `RunResult`
  reports apart from its own (`RunResult.children_usage`).

The child runs in the call's own task: cancelling the parent's run (or the
call's timeout) ends the child's (failed, `Cancelled`), interrupting it
interrupts the child's, and the child's spans nest under the call's span
when tracing is on.

A runner that starts the child itself (a durable run starts it as a
Temporal child workflow) finds what the tool delegates to with
`Delegation.of`, and goes through the same steps: `Delegation.admit`
checks the limits and counts the child in the calling run,
`Delegation.child_run` opens the child's run linked to the call, and
`Delegation.answer` makes the child's result the call's, counting its usage.
A sub-agent phase's effect has its `PhaseDelegation` (`PhaseDelegation.of`):
the same steps, ending the phase with its signal.
"""

from __future__ import annotations

import contextvars
import hashlib
import logging
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Final, TypeAlias, final

import anyio
import attrs

from turnfsm import _checks
from turnfsm.core import (
    SUBAGENT_MAX_CHILDREN,
    SUBAGENT_MAX_DEPTH,
    Event,
    MachineSpec,
    Perform,
    Signal,
    Snapshot,
    SubagentSpec,
    TurnMachine,
)
from turnfsm.driver._arguments import InvalidArguments, Problem
from turnfsm.driver._audit import UNUSED, logged_cost
from turnfsm.driver._context import EffectContext
from turnfsm.driver._control import RunControl, RunResult
from turnfsm.driver._lease import lease_owner
from turnfsm.driver._recall import current_session
from turnfsm.driver._replay import rebuild
from turnfsm.driver._store_calls import read_session
from turnfsm.driver._tools import (
    Tool,
    current_tool_call,
    failed_result,
    step_timed_out,
)
from turnfsm.errors import (
    ConfigError,
    CorruptRecord,
    EffectFailed,
    PinnedTooLarge,
    ReplayError,
    RunCrashed,
    SubagentFailed,
    SubagentTooDeep,
    SubagentTooMany,
    SubagentWaiting,
)
from turnfsm.messages import Message, Role, ToolCallPart
from turnfsm.persistence import (
    MemoryStore,
    ParentLink,
    RunRecord,
    Session,
    SessionStore,
    event_messages,
    new_id,
)
from turnfsm.values import Usage

if TYPE_CHECKING:
    from turnfsm.driver._driver import Driver
    from turnfsm.driver._effects import Effect

_logger = logging.getLogger("turnfsm.driver")

__all__ = [
    "SUBAGENT_MAX_CHILDREN",
    "SUBAGENT_MAX_DEPTH",
    "ChildTally",
    "Delegation",
    "PhaseDelegation",
    "answering",
    "child_ids",
    "count_earlier_children",
    "declared_effects",
    "end_open_children",
    "opening_link",
    "run_scope",
    "subagent_effect",
    "subagent_tool",
]


@attrs.define(eq=False)
class ChildTally:
    """One run's children: the run's id, and what they used, summed as each ends.

    `taken_over` names the process whose lease the run took over on resume
    (it is gone): a child it left open is taken over from it too. `started`
    holds, by tool (or phase effect) name, the calls that started a child: a
    resumed run's call that carries its own child on is not counted again.
    """

    run_id: str
    control: RunControl | None = None
    usage: Usage = UNUSED
    cost: float | None = 0.0
    """What the children's model calls cost (None: one had no prices)."""
    taken_over: str | None = None
    started: dict[str, set[str]] = attrs.field(factory=dict)
    parent: ChildTally | None = None
    """The tally of the run this one runs inside (a sub-agent's caller's)."""

    @property
    def cancel_requested(self) -> bool:
        """Whether this run, or one it runs inside, was cancelled by its control.

        A sub-agent's run has no control of its own: cancelling its caller's
        (or its caller's caller's) run is what ends it.
        """
        tally: ChildTally | None = self
        while tally is not None:
            if tally.control is not None and tally.control.is_cancel_requested:
                return True
            tally = tally.parent
        return False

    def start(self, name: str, call_id: str | None, limit: int) -> None:
        """Count call `call_id`'s child against `name`'s `limit`.

        Raises:
            SubagentTooMany: `name` has started `limit` children, and this
                call is not one of them.
        """
        calls = self.started.setdefault(name, set())
        if call_id is not None and call_id in calls:
            return  # the call carries on the child it started
        if len(calls) >= limit:
            raise SubagentTooMany(name, len(calls), limit)
        calls.add(call_id if call_id is not None else new_id("call"))


_LINK: Final[contextvars.ContextVar[ParentLink | None]] = contextvars.ContextVar(
    "turnfsm_parent_link", default=None
)
_DEPTH: Final[contextvars.ContextVar[int]] = contextvars.ContextVar(
    "turnfsm_subagent_depth", default=0
)
_TALLY: Final[contextvars.ContextVar[ChildTally | None]] = contextvars.ContextVar(
    "turnfsm_child_tally", default=None
)
_ANSWER: Final[contextvars.ContextVar[tuple[str, Event] | None]] = (
    contextvars.ContextVar("turnfsm_subagent_answer", default=None)
)
_ENDED: Final = ("done", "failed", "cancelled")


def opening_link() -> ParentLink | None:
    """Return the link the run opening now records (None: not a sub-agent's run)."""
    return _LINK.get()


@final
@attrs.frozen
class _Spent:
    """What a child used: its usage, and what its model calls cost (None: unknown)."""

    usage: Usage
    cost: float | None

    @staticmethod
    def of(result: RunResult[Any]) -> _Spent:
        """What an ended child run's result says it used, its sub-agents too."""
        return _Spent(
            result.usage + result.compaction_usage + result.children_usage,
            result.cost_with_children,
        )

    def __add__(self, other: _Spent) -> _Spent:
        cost = None
        if self.cost is not None and other.cost is not None:
            cost = self.cost + other.cost
        return _Spent(self.usage + other.usage, cost)

    def count_in(self, tally: ChildTally) -> None:
        """Add it to the calling run's tally of its children."""
        tally.usage = tally.usage + self.usage
        tally.cost = (
            None if tally.cost is None or self.cost is None else tally.cost + self.cost
        )


def run_scope(
    run_id: str,
    control: RunControl | None,
    spec: MachineSpec,
    *,
    taken_over: str | None = None,
) -> _RunScope:
    """Scope one run: take its parent link, give it a fresh tally of its children.

    The link is taken, not left for runs inside this one: a tool of the
    child that runs another agent by hand does not record this link.
    `taken_over`: the owner of the lease a resumed run took over. `control`
    is the run's until it ends (`RunControl.steering`), refusing injections
    its machine `spec` takes in no phase.
    """
    return _RunScope(run_id, control, spec, taken_over)


@final
class _RunScope:
    """`run_scope`'s context (a class, not a generator: every run enters one)."""

    __slots__ = (
        "_control",
        "_link",
        "_run_id",
        "_spec",
        "_steering",
        "_taken_over",
        "_tally",
    )

    def __init__(
        self,
        run_id: str,
        control: RunControl | None,
        spec: MachineSpec,
        taken_over: str | None,
    ) -> None:
        self._run_id = run_id
        self._control = control
        self._spec = spec
        self._taken_over = taken_over

    def __enter__(self) -> tuple[ParentLink | None, ChildTally]:
        control = self._control
        steering = None
        if control is not None:
            steering = control.steering(self._run_id, self._spec)
            steering.__enter__()
        self._steering = steering
        try:
            link = _LINK.get()
            tally = ChildTally(
                self._run_id, control, taken_over=self._taken_over, parent=_TALLY.get()
            )
            self._link = _LINK.set(None)
            self._tally = _TALLY.set(tally)
        except BaseException as exc:
            if steering is not None:
                steering.__exit__(type(exc), exc, exc.__traceback__)
            raise
        return link, tally

    def __exit__(self, *exc: Any) -> None:
        _TALLY.reset(self._tally)
        _LINK.reset(self._link)
        if self._steering is not None:
            self._steering.__exit__(*exc)


_check_name = _checks.string("name", non_empty=True)
_check_description = _checks.string("description", non_empty=True)
_check_depth = _checks.integer("max_depth", low=1, high=_checks.MAX_COUNT)
_check_children = _checks.integer("max_children", low=1, high=_checks.MAX_COUNT)

_BLANK_TASK: Final = "expected a text that is not blank"
"""Why a call's blank task is refused before any child starts."""

_PARAMETERS: Final = {
    "type": "object",
    "properties": {
        "task": {
            "type": "string",
            "minLength": 1,
            "description": "The whole task, self-contained: the sub-agent sees "
            "nothing of this conversation but this text.",
        }
    },
    "required": ["task"],
    "additionalProperties": False,
}


def subagent_tool(
    driver: Driver,
    *,
    name: str,
    description: str,
    max_depth: int = SUBAGENT_MAX_DEPTH,
    max_children: int = SUBAGENT_MAX_CHILDREN,
    store: SessionStore | None = None,
) -> Tool:
    """Return a tool that runs `driver` on a task, as a sub-agent (see `Agent.as_tool`).

    The tool carries its `Delegation`: a durable run whose worker serves
    the agent of `driver` runs the call as a child workflow instead.

    Args:
        driver: The child's driver: its model, tools, window, machine.
        name: The tool's name, as the model calls it.
        description: What the sub-agent does, for the model.
        max_depth: How deep sub-agents may nest; a call deeper gets an
            error result naming `SubagentTooDeep`.
        max_children: How many sub-agents one run may start (or carry on)
            with this tool; a call past it gets an error result naming
            `SubagentTooMany`.
        store: Where the child's session goes when the call runs outside a
            session (in the tool activity of a durable run whose worker does
            not serve the child); otherwise the parent's store.

    Raises:
        ConfigError: `name` or `description` is empty, or `max_depth` or
            `max_children` is not an int ≥ 1.
        ToolError: `name` is not 1-64 of ``A-Z a-z 0-9 _ -``.
    """
    _checks.check(name, "name", _check_name)
    _checks.check(description, "description", _check_description)
    _checks.check(max_depth, "max_depth", _check_depth)
    _checks.check(max_children, "max_children", _check_children)
    fallback = store

    async def delegate(task: str) -> str:
        if not task.strip():  # the schema's minLength lets a blank one through
            raise InvalidArguments([Problem(("task",), _BLANK_TASK, task)])
        call = current_tool_call()
        return await _child_answer(
            _Child(driver, name, max_depth, max_children, fallback),
            task,
            current_session(),
            call.id if call is not None else None,
        )

    _DELEGATES[delegate] = Delegation(driver, max_depth, max_children)
    return Tool(
        name=name,
        description=description,
        parameters=_PARAMETERS,
        fn=delegate,
        # Safe to run again: a parent resumed after a crash or an interrupt
        # runs the call again, which carries on the child it started
        # (whose finished tool calls do not run again) or takes its answer.
        idempotent=True,
    )


_DELEGATES: Final[
    weakref.WeakKeyDictionary[Callable[..., Any], Delegation | PhaseDelegation]
] = weakref.WeakKeyDictionary()
"""What each sub-agent tool's function and sub-agent phase's effect delegates to."""


def _delegate_of(fn: Callable[..., Any]) -> Delegation | PhaseDelegation | None:
    try:
        return _DELEGATES.get(fn)
    except TypeError:  # not weakly referable: no sub-agent's
        return None


@final
@attrs.frozen
class Delegation:
    """What a sub-agent tool hands its task to: the child's driver and its limits.

    For a runner that starts the child itself, as a durable run does (a
    Temporal child workflow): `of` finds it on a tool, and the steps the
    tool takes in-process are these methods, so the child is linked,
    limited and counted the same way.

    Attributes:
        driver: The child's driver (its `name` is the agent's name).
        max_depth: How deep sub-agents may nest.
        max_children: How many sub-agents one run may start with the tool.
    """

    driver: Driver
    max_depth: int
    max_children: int

    @staticmethod
    def of(tool: Tool) -> Delegation | None:
        """Return what `tool` delegates to (None: not a sub-agent tool)."""
        found = _delegate_of(tool.fn)
        return found if isinstance(found, Delegation) else None

    @staticmethod
    def task(call: ToolCallPart) -> str | None:
        """Return the task of `call` (None: its arguments do not fit the tool)."""
        arguments = call.arguments
        task = arguments.get("task")
        if set(arguments) != {"task"} or not isinstance(task, str) or not task.strip():
            return None
        return task

    def admit(
        self, call: ToolCallPart, session_id: str, run_id: str
    ) -> ParentLink | Message:
        """Count the child of `call` in the calling run; return its link.

        Called in the calling run, in call order, before any child starts.
        A call past `max_depth` or `max_children` gets its error result
        instead (naming `SubagentTooDeep` or `SubagentTooMany`).
        """
        try:
            depth, _ = _admit(call.name, self.max_depth, self.max_children, call.id)
        except (SubagentTooDeep, SubagentTooMany) as exc:
            return failed_result(call, exc)
        return ParentLink(
            session_id=session_id, run_id=run_id, call_id=call.id, depth=depth
        )

    @staticmethod
    @contextmanager
    def child_run(link: ParentLink | None) -> Iterator[None]:
        """Open the runs inside as the child run of `link` (None: a top-level run).

        The first run opened records the link; the sub-agents it starts are
        one deeper.
        """
        if link is None:
            yield
            return
        link_token = _LINK.set(link)
        depth_token = _DEPTH.set(link.depth)
        try:
            yield
        finally:
            _DEPTH.reset(depth_token)
            _LINK.reset(link_token)

    def answer(self, call: ToolCallPart, result: RunResult[Any]) -> Message:
        """Return the call's result: the child's answer, or an error result.

        The child's usage (its passes' and its own sub-agents' too) counts in
        the calling run's `children_usage`. A child that did not end done
        is an error result naming `SubagentFailed`.
        """
        try:
            text = _ended_answer(call.name, self.driver, result)
        except SubagentFailed as exc:
            return failed_result(call, exc)
        return Message.tool_result(call.id, text)

    async def answer_from_log(
        self, call: ToolCallPart, session: Session, run_id: str
    ) -> Message:
        """Return the call's result from the child's log: its run `run_id`.

        For a child that ran before its caller's call could take its answer
        (an earlier attempt at the call): an ended run answers, and what it
        used counts; one still open, or missing, is an error result naming
        `SubagentFailed`.
        """
        try:
            text = await _logged_answer(call.name, self.driver, session, run_id)
        except SubagentFailed as exc:
            return failed_result(call, exc)
        return Message.tool_result(call.id, text)

    @staticmethod
    def failed(
        call: ToolCallPart, session_id: str, outcome: str, cause: str
    ) -> Message:
        """Return the call's error result naming `SubagentFailed`: no answer came."""
        return failed_result(
            call, SubagentFailed(call.name, session_id, outcome, cause)
        )


def _ended_answer(name: str, driver: Driver, result: RunResult[Any]) -> str:
    """The answer of a child's ended run `result`; what it used counts.

    Raises:
        SubagentFailed: the run did not end done.
    """
    _count(_Spent.of(result))
    if result.outcome != "done":
        cause = _cause(result.error, result.waiting)
        raise SubagentFailed(name, result.session_id, result.outcome, cause)
    return _answer(driver, result.text)


def _answer(driver: Driver, text: str) -> str:
    """The child's final reply `text` as its caller gets it.

    With an output type, the structured answer as JSON (a fenced or
    wrapped reply is the same answer); else the text.
    """
    output = driver._output
    return text if output is None else output.answer_json(text)


def _not_blank(name: str, session_id: str, answer: str) -> str:
    """A phase's child's `answer`, which must say something.

    A phase ends on its child's answer (routed by it, or added to the
    conversation): a blank one (a model that replied nothing, a child's
    machine that ends after its tools) is no answer, and ends the phase as
    a child that failed does.

    Raises:
        SubagentFailed: `answer` is blank.
    """
    if answer.strip():
        return answer
    cause = (
        f"its answer is blank ({answer!r}: the text of its last reply), and a"
        " sub-agent phase ends on its answer"
    )
    raise SubagentFailed(name, session_id, "done", cause)


async def _logged_answer(
    name: str, driver: Driver, session: Session, run_id: str
) -> str:
    """The answer of the child's run `run_id` from its log; what it used counts.

    Raises:
        SubagentFailed: the run is missing, still open, or did not end done.
    """
    run = next((r for r in session.runs if r.run_id == run_id), None)
    if run is None:
        cause = "it ran before, and its session holds no run of it"
        raise SubagentFailed(name, session.id, "failed", cause)
    if run.outcome not in _ENDED:
        cause = f"it ran before, and its run is still {run.outcome}"
        raise SubagentFailed(name, session.id, run.outcome, cause)
    _count(await _spent(driver, session, run))
    if run.outcome != "done":
        raise SubagentFailed(name, session.id, run.outcome, _cause(run.error, None))
    return _answer(driver, run.text)


@final
@attrs.frozen
class PhaseDelegation:
    """What a sub-agent phase hands its task to, and how the phase ends.

    For a runner that starts the child itself, as a durable run does (a
    Temporal child workflow): `of` finds it on an effect (`subagent_effect`,
    or a phase a machine file declares), and the steps the effect takes
    in-process are these methods, so the child gets the same ids, link and
    limits, and the phase ends with the same signal.

    Attributes:
        delegation: The child's driver and limits (`max_children` counts
            the runs of this phase's child in one run).
        signal: The signal the phase ends with, or a function of the
            child's answer that names it.
        task: The child's task: a text, a function of the conversation, or
            None (the latest user message).
        key: The key of the answer in the signal's data.
        on_failure: The signal to end with when the child does not answer;
            None: the run fails with `EffectFailed`.
    """

    delegation: Delegation
    signal: str | Callable[[str], str]
    task: str | Task | None
    key: str
    on_failure: str | None

    @staticmethod
    def of(effect: Callable[..., Any]) -> PhaseDelegation | None:
        """Return what `effect` delegates to (None: not a sub-agent phase's)."""
        found = _delegate_of(effect)
        return found if isinstance(found, PhaseDelegation) else None

    def mark(self, effect: Effect) -> None:
        """Record that `effect` runs this phase too (a durable run's copy).

        A resumed run finds the children its phase started through it, and
        counts them against `max_children`.
        """
        _DELEGATES[effect] = self

    @staticmethod
    def call_id(decision: Perform, snapshot: Snapshot) -> str:
        """The "call" of the phase: where in the run it runs, the same on resume."""
        return _phase_call(decision, snapshot)

    def task_of(self, snapshot: Snapshot, phase: str) -> str:
        """The child's task, from the conversation (history, then pending).

        Raises:
            SubagentFailed: there is no task (an empty text, or a task
                function that returned none): no child runs.
        """
        conversation = [*snapshot.history, *snapshot.pending]
        if self.task is None:
            task: object = _latest_request(conversation)
        elif isinstance(self.task, str):
            task = self.task
        else:
            task = self.task(conversation)
        if not isinstance(task, str) or not task.strip():
            cause = f"its task is {task!r}, and a sub-agent needs a task to run"
            raise SubagentFailed(phase, "", "failed", cause)
        return task

    def admit(
        self, decision: Perform, session_id: str, run_id: str, call_id: str
    ) -> ParentLink | Event:
        """Count the phase's child in the calling run; return its link.

        A child past `max_depth` or `max_children` ends the phase as
        `failed` does instead.

        Raises:
            EffectFailed: a limit is reached and there is no `on_failure`.
        """
        limits = self.delegation
        try:
            depth, _ = _admit(
                decision.effect, limits.max_depth, limits.max_children, call_id
            )
        except (SubagentTooDeep, SubagentTooMany) as exc:
            return self.failed(decision, exc)
        return ParentLink(
            session_id=session_id, run_id=run_id, call_id=call_id, depth=depth
        )

    def answered(self, answer: str) -> Event:
        """The signal the phase ends with when the child answers `answer`."""
        name = self.signal(answer) if callable(self.signal) else self.signal
        return Signal(name, {self.key: answer})

    def answer(self, decision: Perform, result: RunResult[Any]) -> Event:
        """End the phase with the child's ended run `result`; what it used counts.

        Raises:
            EffectFailed: the child did not end done, and there is no
                `on_failure`.
        """
        try:
            answer = _ended_answer(decision.effect, self.delegation.driver, result)
            return self.answered(_not_blank(decision.effect, result.session_id, answer))
        except SubagentFailed as exc:
            return self.failed(decision, exc)

    async def answer_from_log(
        self, decision: Perform, session: Session, run_id: str
    ) -> Event:
        """End the phase with the child's run `run_id` from its log.

        For a child that ran before its phase could take its answer (see
        `Delegation.answer_from_log`).

        Raises:
            EffectFailed: the run did not end done, and there is no
                `on_failure`.
        """
        name, driver = decision.effect, self.delegation.driver
        try:
            answer = await _logged_answer(name, driver, session, run_id)
            return self.answered(_not_blank(name, session.id, answer))
        except SubagentFailed as exc:
            return self.failed(decision, exc)

    def failed(self, decision: Perform, error: Exception) -> Event:
        """End the phase whose child did not answer: `on_failure`'s signal.

        Raises:
            EffectFailed: there is no `on_failure` (naming `error`'s type).
        """
        if self.on_failure is None:
            raise EffectFailed(
                effect=decision.effect, type=type(error).__name__, message=str(error)
            ) from None
        return Signal(self.on_failure, {self.key: f"{type(error).__name__}: {error}"})


@attrs.frozen
class _Child:
    """What a sub-agent tool or phase runs, and its limits."""

    driver: Driver
    name: str
    max_depth: int
    max_children: int
    fallback: SessionStore | None


Task: TypeAlias = Callable[[Sequence[Message]], str]
"""Builds a sub-agent phase's task from the conversation (history, then pending)."""


def _latest_request(messages: Sequence[Message]) -> str:
    """The text of the latest user message (the request being worked on)."""
    return _latest(messages, Role.USER)


def _latest(messages: Sequence[Message], role: Role) -> str:
    """The text of the latest message of `role` that has any."""
    for message in reversed(messages):
        if message.role is role and message.text.strip():
            return message.text
    return ""


def _template_task(template: str) -> Task:
    """A phase's task from its file's template: ``{request}`` and ``{reply}``."""

    def task(messages: Sequence[Message]) -> str:
        return template.format(
            request=_latest(messages, Role.USER),
            reply=_latest(messages, Role.ASSISTANT),
        )

    return task


def declared_effects(
    machine: MachineSpec, subagents: object, effects: Mapping[str, object]
) -> dict[str, Effect]:
    """The effects of the sub-agent phases `machine` declares, one per sub-agent.

    Args:
        machine: The machine whose ``[subagents]`` are run.
        subagents: The drivers given for them, by name.
        effects: The effects given by name (none may take a sub-agent's).

    Raises:
        ConfigError: a declared sub-agent has no driver, a driver is given
            for none, is no driver, or runs another machine than the file
            names; or an effect takes a sub-agent's name.
    """
    from turnfsm.driver._driver import Driver  # the driver module imports this one

    if not isinstance(subagents, Mapping):
        raise ConfigError("subagents", subagents, "a mapping of name to agent")
    declared = {s.name: s for s in machine.subagents}
    for name, child in subagents.items():
        if name not in declared:
            known = ", ".join(sorted(declared)) or "none"
            raise ConfigError(
                f"subagents[{name!r}]",
                _shown(child, Driver),
                f"a sub-agent the machine {machine.name!r} declares ({known})",
            )
        if not isinstance(child, Driver):
            raise ConfigError(f"subagents[{name!r}]", child, "an Agent or a Driver")
    built: dict[str, Effect] = {}
    for name, spec in declared.items():
        phase = next(s.name for s in machine.states if s.subagent == name)
        if name in effects:
            raise ConfigError(
                f"effects[{name!r}]",
                effects[name],
                f"no effect: phase {phase!r} runs the sub-agent {name!r}",
            )
        child = subagents.get(name)
        if child is None:
            raise ConfigError(
                "subagents",
                sorted(subagents),
                f"an agent for the sub-agent {name!r} that phase {phase!r} runs",
            )
        built[name] = _declared_effect(machine, spec, child)
    return built


def _shown(value: object, kind: type) -> object:
    """What an error shows of a value: a driver by its name, not its settings."""
    if isinstance(value, kind):
        return f"<{kind.__name__} {getattr(value, 'name', '?')!r}>"
    return value


def _declared_effect(machine: MachineSpec, spec: SubagentSpec, child: Driver) -> Effect:
    expected = machine.children.get(spec.name)
    if expected is not None and child.machine.to_dict() != expected.to_dict():
        raise ConfigError(
            f"subagents[{spec.name!r}].machine",
            child.machine.name,
            f"the machine the file names ({spec.machine}: {expected.name!r})",
        )
    return subagent_effect(
        child,
        signal=spec.route if spec.routes else spec.signal,
        task=_template_task(spec.task),
        key=spec.key,
        on_failure=spec.on_failure,
        max_depth=spec.max_depth,
        max_children=spec.max_children,
    )


_check_signal = _checks.string("signal", non_empty=True)
_check_key = _checks.string("key", non_empty=True)
_check_on_failure = _checks.string("on_failure", non_empty=True, optional=True)


def subagent_effect(
    driver: Driver,
    *,
    signal: str | Callable[[str], str],
    task: str | Task | None = None,
    key: str = "answer",
    on_failure: str | None = None,
    max_depth: int = SUBAGENT_MAX_DEPTH,
    max_children: int = SUBAGENT_MAX_CHILDREN,
    store: SessionStore | None = None,
) -> Effect:
    """Return an effect that runs `driver` as a sub-agent: a phase of your machine.

    For a fixed step (plan, review, research) declared in a machine file as
    a phase with ``effect = "NAME"``: give this effect under that name
    (``Driver(effects={"NAME": subagent_effect(...)})``). The phase runs the
    child on a task, as a sub-agent tool does (a session of its own in the
    run's store, linked to the phase; the limits, the usage roll-up, the
    resume and the approval as there), and ends with ``Signal(signal,
    {key: answer})``; a transition on `signal` with ``message = KEY`` adds the
    answer to the conversation as a user message.

    The effect carries its `PhaseDelegation`: a durable run whose worker
    serves the agent of `driver` runs the phase's child as a child workflow.

    Args:
        driver: The child's driver: its model, tools, window, machine.
        signal: The signal the phase ends with (declared in the machine's
            ``signals``), or a function of the child's answer that names it
            (a reviewer's verdict routes the run: ``approved`` or ``revise``).
        task: The child's task: a text, or a function of the conversation
            (history, then pending) that returns it; None: the latest user
            message.
        key: The key of the answer in the signal's data.
        on_failure: A signal to end with when the child does not answer (its
            data's `key` says why: the error's type and message); None: the
            run fails with `EffectFailed` naming that error.
        max_depth: How deep sub-agents may nest.
        max_children: How many times one run may run this phase's child.
        store: Where the child's session goes outside a session.

    Raises:
        ConfigError: A name is empty, `task` is neither text nor callable, or
            a limit is not an int ≥ 1.
    """
    if not callable(signal):
        _checks.check(signal, "signal", _check_signal)
    _checks.check(key, "key", _check_key)
    _checks.check(
        on_failure, "on_failure", _checks.string(non_empty=True, optional=True)
    )
    _checks.check(max_depth, "max_depth", _check_depth)
    _checks.check(max_children, "max_children", _check_children)
    if task is not None and not isinstance(task, str) and not callable(task):
        raise ConfigError(
            "task", task, "a text, a function of the conversation, or None"
        )

    phase = PhaseDelegation(
        Delegation(driver, max_depth, max_children), signal, task, key, on_failure
    )

    async def run_child(ctx: EffectContext, decision: Perform) -> Event:
        snapshot = ctx.snapshot
        call_id = _phase_call(decision, snapshot)
        child = _Child(driver, decision.effect, max_depth, max_children, store)
        try:
            task = phase.task_of(snapshot, decision.effect)
            answer = await _child_answer(child, task, ctx.session, call_id, phase=True)
        except (SubagentFailed, SubagentTooDeep, SubagentTooMany) as exc:
            return phase.failed(decision, exc)
        return phase.answered(answer)

    phase.mark(run_child)
    return run_child


def _phase_call(decision: Perform, snapshot: Snapshot) -> str:
    """The "call" of a sub-agent phase: where in the run it ran, the same on resume."""
    conversation = len(snapshot.history) + len(snapshot.pending)
    return f"{decision.phase}-{snapshot.turns}-{conversation}"


async def _child_answer(
    child: _Child,
    task: str,
    parent: Session | None,
    call_id: str | None,
    *,
    phase: bool = False,
) -> str:
    """Run (or carry on) the child of call `call_id` of `parent`; its answer.

    A `phase`'s child must answer something (`_not_blank`).

    Raises:
        SubagentTooDeep, SubagentTooMany: a limit is reached (nothing runs).
        SubagentWaiting: the child's run paused for an answer.
        SubagentFailed: the child's run ended without an answer, or could
            not start (its pinned task is over its window).
    """
    driver, name = child.driver, child.name
    depth, tally = _admit(
        name,
        child.max_depth,
        child.max_children,
        call_id if parent is not None else None,
    )
    where = parent.store if parent is not None else child.fallback
    link = (
        ParentLink(
            session_id=parent.id,
            run_id=tally.run_id,
            call_id=call_id,
            depth=depth,
        )
        if parent is not None and call_id is not None and tally is not None
        else None
    )
    if link is not None:
        # The call's child has ids of its own: a parent resumed after a
        # crash finds the child it started, and carries it on.
        session_id, run_id = child_ids(link.session_id, link.run_id, link.call_id)
        session = await read_session(
            where or MemoryStore(), session_id, seconds=driver.store_timeout
        )
    else:
        session = Session(store=where if where is not None else MemoryStore())
        run_id = new_id("run")
    earlier = next((r for r in session.runs if r.run_id == run_id), None)
    if earlier is not None and earlier.outcome in _ENDED:
        # Ended before the parent's result was logged: what it used counts
        # now, and its answer is the call's (a failure is the call's error).
        if tally is not None:
            (await _spent(driver, session, earlier)).count_in(tally)
        if earlier.outcome == "done":
            said = _answer(driver, earlier.text)
            return _not_blank(name, session.id, said) if phase else said
        raise SubagentFailed(
            name, session.id, earlier.outcome, _cause(earlier.error, None)
        )
    answer = _ANSWER.get()
    link_token = _LINK.set(link)
    depth_token = _DEPTH.set(depth)
    try:
        if earlier is None:
            try:
                result = await driver.run(task, session=session, run_id=run_id)
            except PinnedTooLarge as exc:
                # Refused before anything was written: the task (or what
                # rides every request) is over the child's window. The
                # caller's call fails as any child's failure does.
                raise SubagentFailed(name, "", "failed", _cause(exc, None)) from None
        elif earlier.outcome == "paused":
            if answer is None or answer[0] != session.id:  # still unanswered
                if tally is not None:  # what it used so far counts, as it did
                    (await _spent(driver, session, earlier)).count_in(tally)
                raise _waiting(name, session.id, earlier)
            result = await driver.resume(session, run_id, answer[1])
        elif earlier.outcome in ("running", "interrupted"):
            gone = tally.taken_over if tally is not None else None
            force = (
                gone is not None
                and await lease_owner(session, driver.store_timeout) == gone
            )
            result = await driver.resume(session, run_id, force=force)
        else:  # an outcome this version does not know
            raise SubagentFailed(
                name, session.id, earlier.outcome, _cause(earlier.error, None)
            )
    except Exception as exc:
        crashed = _crashed(session, run_id, exc)
        if crashed is None:
            raise
        # The child's run crashed, and its log says so: to its caller that
        # is a child that did not answer, whose use counts as any child's.
        # The crash is a bug of the child's: its traceback is logged.
        _logger.warning(
            "sub-agent %r crashed (session %s); its caller is told it failed",
            name,
            session.id,
            exc_info=exc,
        )
        if tally is not None:
            (await _spent(driver, session, crashed)).count_in(tally)
        raise SubagentFailed(
            name, session.id, crashed.outcome, _cause(crashed.error, None)
        ) from exc
    except anyio.get_cancelled_exc_class():
        # The parent's run was cancelled (not interrupted), or the call
        # timed out (its result says so): no one waits on the child any
        # more, so its run ends too, not left to resume.
        reason = None
        if tally is not None and tally.cancel_requested:
            reason = "its parent's run was cancelled"
        elif step_timed_out():
            reason = f"its call {call_id!r}, or a call above it, timed out"
        if reason is not None:
            with anyio.CancelScope(shield=True):
                await driver.abandon(session, run_id, reason=reason)
                if tally is not None:  # what it used before it ended counts
                    # too, its own sub-agents' with it, answered or not.
                    record = session.run(run_id)
                    (await _spent(driver, session, record)).count_in(tally)
        raise
    finally:
        _DEPTH.reset(depth_token)
        _LINK.reset(link_token)
    if tally is not None:
        _Spent.of(result).count_in(tally)
    waits = result.outcome == "paused" or (
        result.outcome == "interrupted" and isinstance(result.error, SubagentWaiting)
    )
    if waits and link is None:
        # Not linked to a caller's run (the tool activity of a durable run
        # whose worker does not serve the child): no one can hand it an
        # answer through its caller.
        cause = "it waits for an answer, and a sub-agent run outside a session cannot"
        raise SubagentFailed(name, session.id, result.outcome, cause)
    if result.outcome == "paused":
        raise _waiting(name, session.id, result)
    if isinstance(result.error, SubagentWaiting):
        raise result.error  # a sub-agent of the sub-agent waits
    if result.outcome != "done":
        cause = _cause(result.error, result.waiting)
        raise SubagentFailed(name, session.id, result.outcome, cause)
    said = _answer(driver, result.text)
    return _not_blank(name, session.id, said) if phase else said


@attrs.frozen
class _Linked:
    """A child a run's call started, as the store holds it."""

    name: str  # the sub-agent tool's, or the phase's effect
    call_id: str
    driver: Driver  # the child's
    session: Session
    run: RunRecord
    answered: bool  # the run's log holds the call's result


async def _linked(
    driver: Driver, session: Session, run_id: str, machine: MachineSpec | None
) -> list[_Linked]:
    """The children the calls of run `run_id` started, found by their ids.

    Only the calls to `driver`'s sub-agent tools and phases are looked up (a
    driver without any reads nothing); a phase's calls are found by
    replaying the run on `machine` (None: not looked for).
    """
    tools = {
        t.name: delegation.driver
        for t in driver.tools
        if isinstance(t, Tool) and (delegation := Delegation.of(t)) is not None
    }
    effects = {
        name: phase.delegation.driver
        for name, effect in driver.effects_by_name.items()
        if (phase := PhaseDelegation.of(effect)) is not None
    }
    if not tools and not effects:
        return []
    entries = session.run_entries(run_id)
    calls: dict[str, tuple[str, Driver]] = {}
    answered: set[str] = set()
    if tools:
        answered.update(session.recorded_results(run_id))
        for entry in entries:
            for message in event_messages(entry.event):
                for call in message.tool_calls:
                    if call.name in tools:
                        calls.setdefault(call.id, (call.name, tools[call.name]))
                answered.update(r.call_id for r in message.tool_results)
    performs = {f"perform:{name}" for name in effects}
    if machine is not None and any(e.decision in performs for e in entries):
        for call_id, name, done in _phase_calls(machine, session, run_id, effects):
            calls.setdefault(call_id, (name, effects[name]))
            if done:
                answered.add(call_id)
    found: list[_Linked] = []
    for call_id, (name, child) in calls.items():
        kid_id, kid_run = child_ids(session.id, run_id, call_id)
        try:
            kid = await read_session(
                session.store, kid_id, seconds=driver.store_timeout
            )
        except CorruptRecord:  # a damaged log: not counted (the run goes on)
            continue
        run = next((r for r in kid.runs if r.run_id == kid_run), None)
        if run is not None:
            found.append(_Linked(name, call_id, child, kid, run, call_id in answered))
    return found


def _phase_calls(
    machine: MachineSpec, session: Session, run_id: str, effects: Mapping[str, Any]
) -> list[tuple[str, str, bool]]:
    """The sub-agent phases run `run_id` ran: call id, effect, whether it ended."""
    ran: list[tuple[str, str]] = []

    def step(brain: TurnMachine) -> None:
        decision = brain.decision
        if isinstance(decision, Perform) and decision.effect in effects:
            ran.append((_phase_call(decision, brain.snapshot), decision.effect))

    try:
        last = rebuild(machine, session, run_id, check=False, on_step=step)
    except ReplayError:  # a log the machine does not take: no phases found
        return []
    decision = last.decision
    open_call = (
        _phase_call(decision, last.snapshot) if isinstance(decision, Perform) else None
    )
    return [(call_id, name, call_id != open_call) for call_id, name in ran]


async def end_open_children(
    driver: Driver,
    session: Session,
    run_id: str,
    machine: MachineSpec | None,
    reason: str,
    *,
    tally: ChildTally | None = None,
) -> None:
    """End the open runs of the sub-agents run `run_id` started, theirs first.

    Each ends failed with `Cancelled(reason)`: no one waits on it any more.
    What each used counts in `tally` (its call has no result to count it).
    """
    for linked in await _linked(driver, session, run_id, machine):
        if linked.run.outcome in _ENDED:
            continue
        kid, kid_run = linked.session, linked.run
        await end_open_children(
            linked.driver,
            kid,
            kid_run.run_id,
            _run_machine(linked.driver, kid, kid_run),
            reason,
        )
        ended = await linked.driver.abandon(kid, kid_run.run_id, reason=reason)
        if tally is not None:
            _Spent.of(ended).count_in(tally)


def _run_machine(
    driver: Driver, session: Session, run: RunRecord
) -> MachineSpec | None:
    """The machine `run` began on: `driver`'s, or the one the log keeps."""
    if run.opened.digest == driver.digest:
        return driver.machine
    return session.machine(run.opened.digest)


async def _spent(driver: Driver, session: Session, run: RunRecord) -> _Spent:
    """What the ended `run` (of `driver`) used: its turns, passes and children."""
    total = _Spent(
        sum((c.usage for c in run.compactions if c.usage), run.usage),
        logged_cost(driver.prices, run),
    )
    machine = _run_machine(driver, session, run)
    for child in await _linked(driver, session, run.run_id, machine):
        total = total + await _spent(child.driver, child.session, child.run)
    return total


async def count_earlier_children(
    tally: ChildTally, driver: Driver, session: Session, machine: MachineSpec
) -> None:
    """Count in `tally` the children its run started before it was resumed.

    Each counts against its tool's (or phase's) `max_children` once: a call
    that carries its child on is not counted again. What a child used is
    counted now if the run's log holds the call's result; else the call
    runs again on resume and counts it when the child ends.
    """
    for child in await _linked(driver, session, tally.run_id, machine):
        tally.started.setdefault(child.name, set()).add(child.call_id)
        if child.answered:
            (await _spent(child.driver, child.session, child.run)).count_in(tally)


def _count(spent: _Spent) -> None:
    """Count what a child used in the calling run's children's usage and cost."""
    tally = _TALLY.get()
    if tally is not None:
        spent.count_in(tally)


def _admit(
    name: str, max_depth: int, max_children: int, call_id: str | None
) -> tuple[int, ChildTally | None]:
    """Check the limits of call `call_id`'s child of `name`, count it.

    Returns the child's depth and the calling run's tally (None: outside a
    run).

    Raises:
        SubagentTooDeep, SubagentTooMany: a limit is reached (nothing counted).
    """
    depth = _DEPTH.get() + 1
    if depth > max_depth:
        raise SubagentTooDeep(name, depth, max_depth)
    tally = _TALLY.get()
    if tally is not None:  # counted before any wait: calls of a batch in order
        tally.start(name, call_id, max_children)
    return depth, tally


def child_ids(session_id: str, run_id: str, call_id: str) -> tuple[str, str]:
    """Return the session id and run id of the child that call `call_id` starts.

    Derived from the parent's session, run and call, so the same call finds
    the same child again (a resumed parent carries its child on), and a
    model that gives its calls the same ids in every run (some local
    servers do) still starts a new child each run.
    """
    key = "\x1f".join((session_id, run_id, call_id))
    # Any id: a lone surrogate (a store keeps one) hashes by its code point.
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()
    return f"ses_{digest[:20]}", f"run_{digest[20:40]}"


def _crashed(session: Session, run_id: str, exc: Exception) -> RunRecord | None:
    """The child's run `run_id` if `exc` is its crash, as its log keeps it.

    A strict hook's error (``is_crash``) crashes its caller too, at every
    depth; an error raised before the run was logged (a setting, a busy
    session) is not the child's answer either.
    """
    if getattr(exc, "is_crash", False) or not session.has_run(run_id):
        return None
    run = session.run(run_id)
    return run if isinstance(run.error, RunCrashed) else None


def _cause(error: object, waiting: Any) -> str:
    if error is not None:
        return f"{type(error).__name__}: {error}"
    phase = waiting.phase if waiting is not None else "?"
    return f"it waits in {phase}"


def _waiting(name: str, session_id: str, run: RunRecord | RunResult) -> SubagentWaiting:
    """The error that stops the caller of a paused sub-agent's run."""
    pause = run.waiting
    return SubagentWaiting(
        name,
        session_id,
        run.run_id,
        pause.phase if pause is not None else "?",
        tuple(call.id for call in pause.calls) if pause is not None else (),
    )


@contextmanager
def answering(session_id: str, event: Event) -> Iterator[None]:
    """Hand `event` to the paused sub-agent run of session `session_id`.

    A caller resumed with the answer its paused sub-agent waits for carries
    its open call on; the call finds the sub-agent's run paused and resumes
    it with `event`.
    """
    token = _ANSWER.set((session_id, event))
    try:
        yield
    finally:
        _ANSWER.reset(token)
