"""The Driver: the hands that carry out the brain's decisions.

`Driver.run` opens a run in a session and hands it to its loop
(`turnfsm.driver._loop`, where the theory of operation is); `resume` and
`abandon` pick an open run up from the session's log.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final, TypeVar, final, overload

import attrs

from turnfsm import _checks
from turnfsm._prices import to_prices
from turnfsm._resources import compaction_machine, default_machine
from turnfsm.context import ContextManager, counter_at_fault
from turnfsm.core import (
    Budget,
    Event,
    MachineSpec,
    emergency_line,
)
from turnfsm.driver._carry import EffectSettings
from turnfsm.driver._context import RunResources, request_extras, run_resources
from turnfsm.driver._context_settings import context_settings
from turnfsm.driver._control import RunControl, RunResult
from turnfsm.driver._effects import BUILTIN_EFFECTS, Effect
from turnfsm.driver._inputs import (
    as_messages,
    check_effects,
    is_tool,
    run_hooks,
    tools_tuple,
)
from turnfsm.driver._interrupted import close_input
from turnfsm.driver._opening import abandon_run, resume_run, start_run
from turnfsm.driver._output import OutputType, check_machine
from turnfsm.driver._pins_fit import check_pins_fit
from turnfsm.driver._retry import RetryPolicy
from turnfsm.driver._store_calls import read_session
from turnfsm.driver._subagents import declared_effects
from turnfsm.driver._tools import Tool, tools_by_name
from turnfsm.errors import (
    ConfigError,
    ReserveTooLarge,
)
from turnfsm.hooks import Hook, check_hooks
from turnfsm.messages import Message, OpenCalls, require_new_ids
from turnfsm.persistence import (
    Session,
    machine_digest,
)
from turnfsm.providers import (
    ModelClient,
    ModelPrices,
    ToolSchema,
    known_window,
    window_for,
)
from turnfsm.tokens import Meter, TokenCounter, default_counter

__all__ = ["Driver"]

T = TypeVar("T")

logger = logging.getLogger("turnfsm.driver")

_TRANSITIONS_LOGGER = "transitions.core"
"""The `transitions` library's logger: INFO lines for every state entered, left."""


def _quiet_transitions() -> None:
    """Keep the `transitions` library's per-step INFO lines out of an INFO log.

    Its ``transitions.core`` logger is set to WARNING, unless the
    application chose a level for it (or for ``transitions``) first; a level
    the application sets later wins as well.
    """
    for name in (_TRANSITIONS_LOGGER, "transitions"):
        if logging.getLogger(name).level != logging.NOTSET:
            return
    logging.getLogger(_TRANSITIONS_LOGGER).setLevel(logging.WARNING)


def _count(low: int) -> _checks.Check:
    return _checks.integer(low=low, high=_checks.MAX_COUNT)


def _windowed(context: ContextManager, window: int) -> ContextManager:
    """`context` on the driver's `context_window`, where that one is given.

    A manager that sets no window takes it; one that sets the same keeps
    it; one that sets another is refused, naming both.
    """
    if not window or context.context_window == window:
        return context
    if context.context_window:
        raise ConfigError(
            "context_window",
            window,
            f"the context manager's window ({context.context_window:,}), or 0 "
            "(the manager says the window): give it in one place",
        )
    return attrs.evolve(context, context_window=window)


def _passes_the_checks(_inst: object, _attr: object, spec: MachineSpec) -> None:
    """Refuse a machine no file could load (one built or changed by hand)."""
    spec.validated()


def _not_a_name(_driver: Any, _attr: Any, value: Any) -> None:
    """Refuse a model's name where its client is expected, showing the client."""
    if isinstance(value, str):
        # The command line's spellings: provider:MODEL names its client, a
        # base URL (URL#MODEL) a compatible server's.
        named = [
            f"model={client}({value.removeprefix(f'{provider}:')!r})"
            for provider, client in _CLIENTS
            if value.startswith(f"{provider}:")
        ]
        if value.startswith(("http://", "https://")):
            url, _, name = value.partition("#")
            named = [f"model=OpenAIModel({name or 'MODEL'!r}, base_url={url!r})"]
        if value == "local":  # the command line's bundled model, on its server
            named = [
                "model=OpenAIModel('local', base_url=server.base_url) for "
                "server = LlamaServer().start(), the bundled local model"
            ]
        clients = (
            named
            or [
                f"model={client}({value!r})"
                for provider, client in _CLIENTS
                if known_window(value, provider=provider) is not None
            ]
            or [f"model={client}({value!r})" for _, client in _CLIENTS]
        )
        raise ConfigError(
            "model",
            value,
            f"a ModelClient, not a model's name: {' or '.join(clients)} "
            "(from turnfsm.providers), or a client of your own (async complete())",
        )


def _not_a_session(value: object, *, optional: bool = True) -> ConfigError:
    """The refusal of `value` as a run's session; a session's id is shown opened.

    `optional`: None is taken too (a new session), as by `Driver.run`.
    """
    expected = "a Session or None" if optional else "a Session"
    if isinstance(value, str) and value.strip():
        opened = f"await Session.open(agent.store, {value!r})"
        return ConfigError(
            "session",
            value,
            f"{expected}, not a session's id: "
            + (
                f"session={opened} (the stored session, or a new one under that id)"
                if optional
                else f"{opened} (the stored session)"
            ),
        )
    return ConfigError("session", value, expected)


_CONTROL: Final = _checks.instance(RunControl, "a RunControl or None", optional=True)
_FORCE: Final = _checks.boolean()
_REASON: Final = _checks.string()


def _check_session_call(session: object, control: object, force: object) -> None:
    """Refuse the arguments of a call on a stored session, before anything is written.

    What `Driver.resume`, `Driver.abandon` and `Driver.compact` take, as
    `Driver.run` takes them: `session` a `Session`, `control` a
    `RunControl` or None, and `force` True or False (a store with no
    leases would take ``force="no"`` as true).

    Raises:
        ConfigError: one of them is not that; names it and its value.
    """
    if not isinstance(session, Session):
        raise _not_a_session(session, optional=False)
    _checks.check(control, "control", _CONTROL)
    _checks.check(force, "force", _FORCE)


_MANAGER: Final = _checks.instance(
    ContextManager, "a ContextManager or None", optional=True
)


_PLAUSIBLE_WINDOW: Final = 256
"""The fewest tokens an int given as `context` is read as a window of."""


def _a_manager(inst: object, attr: Any, value: object) -> None:
    """A context manager or None; a window's size given shows the manager."""
    try:
        _MANAGER(inst, attr, value)
    except ConfigError:
        # A number of tokens a window could have is read as one (not 3).
        if type(value) is int and _PLAUSIBLE_WINDOW <= value <= _checks.MAX_TOKENS:
            raise ConfigError(
                "context",
                value,
                f"a ContextManager or None (a window of {value} tokens: "
                f"context=ContextManager(context_window={value}))",
            ) from None
        raise


_MACHINE: Final = _checks.instance(
    MachineSpec, "a MachineSpec (load a machine file with turnfsm.load_machine(path))"
)


def _a_machine(inst: object, attr: Any, value: object) -> None:
    """A machine; its file's path, or a function making one, shows the call."""
    try:
        _MACHINE(inst, attr, value)
    except ConfigError:
        if isinstance(value, str | os.PathLike):
            how = f"load it: machine=load_machine({os.fspath(value)!r})"
        elif (
            callable(value)
            and not isinstance(value, type)
            and hasattr(value, "__name__")
        ):
            how = f"call it: machine={value.__name__}()"
        else:
            raise
        raise ConfigError("machine", value, f"a MachineSpec ({how})") from None


_CLIENTS: Final = (("openai", "OpenAIModel"), ("anthropic", "AnthropicModel"))
"""The shipped clients of a model named by its provider's name for it."""


def context_hint(name: str, value: object) -> str | None:
    """Where `name`, given to an agent or a driver, belongs.

    A context manager's setting, or the setting that does the job of
    another agent framework's argument of that name.
    """
    if name in _OTHER_NAMES:
        return _OTHER_NAMES[name]
    if name == "strategy":
        made = _checks.compactor_of(value, "context=ContextManager({})")
        return f"a compaction strategy is the context manager's compactor: {made}"
    if name not in _CONTEXT_SETTINGS:
        return None
    return f"it is a ContextManager setting: context=ContextManager({name}={value!r})"


_SESSION_BY_ID: Final = (
    "a conversation is a Session, given to each run: "
    "agent.run(..., session=await Session.open(agent.store, ID))"
)

_APPROVAL: Final = (
    "a run that pauses for approval before its tools run is "
    "machine=approval_machine(); answer it with agent.resume(...)"
)

_CLIENT_SETTING: Final = (
    "it is a model client's setting: model=OpenAIModel('...', {name}=...)"
)

_OTHER_NAMES: Final = {
    "instructions": "the system prompt is system_prompt='...'",
    "system_message": "the system prompt is system_prompt='...'",
    "recursion_limit": "the model calls a run may make are max_turns=...",
    "callbacks": "what watches a run is a Hook: hooks=[...]",
    "thread_id": _SESSION_BY_ID,
    "session_id": _SESSION_BY_ID,
    "memory": "sessions are kept in a store: Agent(store='sessions.db')",
    "timeout": (
        "each kind of call has its own: tool_timeout, model_timeout, "
        "compaction_timeout, effect_timeout, store_timeout"
    ),
    "tool_choice": _CLIENT_SETTING.format(name="tool_choice"),
    "parallel_tool_calls": _CLIENT_SETTING.format(name="parallel_tool_calls"),
    "model_settings": _CLIENT_SETTING.format(name="temperature"),
    "handoffs": (
        "to hand the conversation over, run the other agent on this one's "
        "session (Agent(..., session=agent.session)); to hand it a task, "
        "tools=[other_agent.as_tool(name=..., description=...)]"
    ),
    "checkpointer": (
        "sessions are kept in a store: Agent(store='sessions.db'), and each "
        "run continues a Session"
    ),
    "response_format": "a structured answer's type is output_type=YourClass",
    "output_schema": "a structured answer's type is output_type=YourClass",
    "temperature": _CLIENT_SETTING.format(name="temperature"),
    "interrupt_before": _APPROVAL,
    "interrupt_after": _APPROVAL,
    "state_modifier": "the system prompt is system_prompt='...'",
    "prompt": "the system prompt is system_prompt='...'",
    "tool_use_behavior": (
        "what follows the tools is the machine's: a machine file whose "
        "tools_finished goes to done ends the run once they ran (machine=...)"
    ),
    "max_iterations": "the model calls a run may make are max_turns=...",
}
"""Other agent frameworks' names for a setting, and what does their job here."""


_CONTEXT_SETTINGS: Final = frozenset(
    f.alias or f.name for f in attrs.fields(ContextManager) if f.init
)
"""The settings of the context manager, which a driver takes as `context`."""


def _check_reply_budget(budget: int | None, window: int) -> None:
    """Refuse a reply budget that leaves no request under the emergency line.

    The reply budget is part of every request's size, and a request on or
    over the emergency line is compacted, never sent: with a budget that
    big alone, every run would fail without calling the model.

    Raises:
        ConfigError: `budget` is on or over the emergency line of `window`
            (a window of 0 has no line).
    """
    if budget is None or not window:
        return
    line = emergency_line(window)
    if budget >= line:
        raise ConfigError(
            "max_output_tokens",
            budget,
            f"an int under {line:,} tokens, 95 % of the {window:,}-token context "
            "window (the reply budget is part of every request, which must fit "
            "under that line to be sent): lower it, or use a bigger window",
        )


def _rebuilt(driver: Driver, attribute: attrs.Attribute[Any], value: Any) -> Any:
    """Set a setting of a built `driver` as its constructor would take it.

    What the driver built from its settings (the tools by name, their
    schemas, the limits, the window) is built again, so the next run uses
    the new value; a value the constructor would refuse beside the others
    (a reply budget over a smaller window) is refused, and nothing changes.
    Its private state (`init=False`) is set as it is.
    """
    if not attribute.init or attribute.alias is None:
        return value
    changes: dict[str, Any] = {attribute.alias: value}
    if attribute.name != "context":
        # The manager as it was given: the window it took from the driver
        # or the model is worked out again, from the new settings.
        changes["context"] = driver._given_context
    fresh = attrs.evolve(driver, **changes)
    for field in attrs.fields(Driver):
        if not field.init and field.name not in ("_meter", "_compacting"):
            object.__setattr__(driver, field.name, getattr(fresh, field.name))
    object.__setattr__(driver, "_compacting", None)  # made again from the new
    object.__setattr__(driver, "context", fresh.context)
    return fresh.context if attribute.name == "context" else value


@final
@_checks.keyword_checked(hint=context_hint)
@attrs.define(
    eq=False,
    kw_only=True,
    on_setattr=[attrs.setters.convert, attrs.setters.validate, _rebuilt],
)
class Driver:
    """Runs the Turn FSM against a model, tools and a context manager.

    A setting changed on a built driver (``driver.max_turns = 10``) is
    checked as the constructor checks it, beside the others, and the next
    run uses it; a run already running keeps the settings it began with.

    Attributes:
        model: the `ModelClient` to call.
        tools: tools the model may call (functions are wrapped as `Tool`s).
        system_prompt: sent with every request and counted in every measure.
        context: the `ContextManager` (window, lines, compactor); None means
            no compaction: a pass over the line is a no-op and the run fails.
            A manager without a window gets the model's (see `window_for`);
            one with a window larger than the model's known one is refused
            (`WindowTooLarge`).
        context_window: the window (tokens, at most 100,000,000 and at most
            the model's known window). It is the context manager's when the
            manager sets none (the default manager), and the brain's when
            there is no manager (0: no lines). A manager with another window
            is refused: say the window in one place.
        max_turns: model calls per run. This and every other count (retries,
            passes) is at most 1,000,000.
        max_overflow_retries: compact-and-retry passes after provider overflows
            in a row, without a reply in between (each reply starts the count
            again).
        max_compactions: compaction passes in a row, with no model call
            between them.
        tool_timeout: seconds each tool call may take (None: no limit).
        model_timeout: seconds each model attempt may take (None: no limit).
        compaction_timeout: seconds a compaction pass may take (None: no limit).
        effect_timeout: seconds a custom effect may take (None: no limit),
            and one of yours in place of a built-in step (`effects=`), or
            what that step may take when longer.
        store_timeout: seconds each call a run makes to its session store
            may take (None: no limit): an append, a lease's renewal, a
            read of the log. A store that does not answer in time stops
            the run with `StoreUnusable` (a write given up may still have
            been written: read the session again to see). The shipped
            stores bound their own waits, and are called without it.
        lease_ttl: seconds a run's hold on its session outlives its process:
            in a store several processes share (SQLite, PostgreSQL), a run
            renews its lease every third of this; another process may take
            a run over once its lease has expired.
        retry: the policy for transient model errors.
        hooks: observers; see `Hook`.
        strict_hooks: re-raise hook errors instead of detaching the hook.
        machine: the machine definition (defaults to ``machines/turn.toml``);
            one built or changed by hand (``attrs.evolve``) must pass the
            checks a machine file gets (`DefinitionError`).
        effects: effects by name: one for every custom phase of `machine`
            (its ``effect = NAME``); a built-in name (``measure``,
            ``call_llm``, ``run_tools``, ``compact``) replaces that effect.
        subagents: the agents that run the sub-agent phases of `machine`
            (its ``[subagents.NAME]``), by name: one for each, on the
            machine file the declaration names.
        max_output_tokens: the reply budget asked of the model; it is part
            of the reserved budget, so a request always leaves room for it.
            It must be under the emergency line (95 % of the window): a
            budget that reaches it leaves no request that could be sent.
        clock: wall-clock seconds for the log's timestamps; each reading
            must be a finite int or float (a `ConfigError` naming the clock
            and the value fails the run, and never reaches the log; the
            run's end is stamped with the clock's last good reading).
        name: the agent's name, as traces show it (``invoke_agent NAME``).
        tracing: trace runs with OpenTelemetry (`turnfsm.tracing`): None
            (the default) traces when a tracer provider is set up (by
            `turnfsm.tracing.configure` or the application), True always
            (through the global provider), False never. A `TracingHook`
            among `hooks` replaces the automatic one.
        output_type: the type of the final answer (a dataclass, an attrs
            class, a pydantic model, a `TypedDict`, or a primitive, a list,
            a `Literal`, an enum), asked of the model in its provider's
            structured mode and validated; `RunResult.output` is the value.
            None (the default): the answer is the text. `run` may override it.
            Refused with a machine that calls no model (no answer to read).
        max_output_retries: re-asks, listing the validation errors, after a
            final answer that does not fit `output_type`; then the run fails
            with `OutputInvalid`.
        prices: the model's prices (``known_prices("gpt-4o")``, a known
            model's name such as ``"gpt-4o"``, or your own `ModelPrices`):
            `RunResult.cost` says what each run's model calls cost, and a
            caller's `children_cost` what its sub-agents' did. None: not
            known.

    Raises:
        ConfigError: a setting is out of range (the field is named), or
            `max_output_tokens` is on or over the emergency line, or what
            rides every request (the system prompt, the tool schemas, the
            output type's schema and the reply budget) alone reaches the
            emergency line (`ReserveTooLarge`, naming the largest part).
        WindowTooLarge: the context manager's window (or `context_window`)
            is larger than the model's known window.
    """

    model: ModelClient = attrs.field(
        validator=[
            _not_a_name,
            _checks.instance(
                ModelClient, "a ModelClient (async complete())", awaited=("complete",)
            ),
        ]
    )
    tools: Sequence[Tool | Callable[..., Any]] = attrs.field(
        default=(),
        converter=tools_tuple,
        validator=_checks.satisfies(is_tool, "a Tool or a function", each=True),
    )
    system_prompt: str | None = attrs.field(
        default=None,
        validator=_checks.string(expected="a string or None", optional=True),
    )
    context: ContextManager | None = attrs.field(
        factory=ContextManager,
        validator=_a_manager,
    )
    context_window: int = attrs.field(
        default=0, validator=_checks.integer(low=0, high=_checks.MAX_TOKENS)
    )
    max_turns: int = attrs.field(default=50, validator=_count(1))
    max_overflow_retries: int = attrs.field(default=2, validator=_count(0))
    max_compactions: int = attrs.field(default=20, validator=_count(1))
    tool_timeout: float | None = attrs.field(default=60.0, validator=_checks.seconds())
    model_timeout: float | None = attrs.field(
        default=300.0, validator=_checks.seconds()
    )
    compaction_timeout: float | None = attrs.field(
        default=120.0, validator=_checks.seconds()
    )
    effect_timeout: float | None = attrs.field(
        default=300.0, validator=_checks.seconds()
    )
    store_timeout: float | None = attrs.field(default=60.0, validator=_checks.seconds())
    lease_ttl: float = attrs.field(
        default=30.0, validator=_checks.seconds(optional=False)
    )
    retry: RetryPolicy = attrs.field(
        factory=RetryPolicy, validator=_checks.instance(RetryPolicy, "a RetryPolicy")
    )
    hooks: Sequence[Hook] = attrs.field(default=(), converter=check_hooks)
    strict_hooks: bool = attrs.field(default=False, validator=_checks.boolean())
    machine: MachineSpec = attrs.field(
        factory=default_machine,
        validator=[_a_machine, _passes_the_checks],
    )
    effects: Mapping[str, Effect] = attrs.field(factory=dict, validator=check_effects)
    subagents: Mapping[str, Driver] = attrs.field(factory=dict)
    max_output_tokens: int | None = attrs.field(
        default=None,
        validator=_checks.integer(low=1, high=_checks.MAX_TOKENS, optional=True),
    )
    clock: Callable[[], float] = attrs.field(
        default=time.time, validator=_checks.callable_()
    )
    name: str = attrs.field(default="turnfsm", validator=_checks.string(non_empty=True))
    tracing: bool | None = attrs.field(
        default=None,
        validator=_checks.instance(bool, "True, False or None", optional=True),
    )
    output_type: Any = attrs.field(default=None)
    max_output_retries: int = attrs.field(default=2, validator=_count(0))
    prices: ModelPrices | None = attrs.field(
        default=None,
        converter=to_prices,
        validator=_checks.instance(
            ModelPrices,
            "ModelPrices (known_prices), a model with known prices, or None",
            optional=True,
        ),
    )
    _output: OutputType | None = attrs.field(init=False)
    _tools: dict[str, Tool] = attrs.field(init=False)
    _budget: Budget = attrs.field(init=False)
    _schemas: tuple[ToolSchema, ...] = attrs.field(init=False)
    _effects: dict[str, Effect] = attrs.field(init=False)
    _digest: str = attrs.field(init=False)
    _extras: tuple[str, ...] = attrs.field(init=False)
    _settings: EffectSettings = attrs.field(init=False)
    _compacting: Driver | None = attrs.field(init=False, default=None)
    # The context manager as given, before it took the window (`_rebuilt`).
    _given_context: ContextManager | None = attrs.field(init=False, default=None)
    # The meter of the runs, and the context manager it was made for: kept
    # across runs, so the prices of the extras (tool schemas, the system
    # prompt) outlive each run instead of being counted again by the next.
    _meter: tuple[ContextManager | None, Meter] | None = attrs.field(
        init=False, default=None
    )

    def __attrs_post_init__(self) -> None:
        _quiet_transitions()  # its machine's steps are the trace's, not the log's
        # The window: the model's known one unless given; refused if larger.
        object.__setattr__(self, "_given_context", self.context)
        if self.context is not None:
            context = _windowed(self.context, self.context_window)
            # Not through the setter: it builds a driver again from this one.
            object.__setattr__(self, "context", context.for_model(self.model))
        elif self.context_window:
            window_for(self.model, self.context_window)
        window = (
            self.context.window if self.context is not None else self.context_window
        )
        _check_reply_budget(self.max_output_tokens, window)
        self._tools = tools_by_name(self.tools)
        self._schemas = tuple(t.schema for t in self._tools.values())
        self._budget = (
            self.context.budget(
                max_turns=self.max_turns,
                max_overflow_retries=self.max_overflow_retries,
                max_compactions=self.max_compactions,
            )
            if self.context is not None
            else Budget(
                context_window=self.context_window,
                max_turns=self.max_turns,
                max_overflow_retries=self.max_overflow_retries,
                max_compactions=self.max_compactions,
            )
        )
        self._budget = attrs.evolve(
            self._budget, max_output_retries=self.max_output_retries
        )
        self._output = self._output_type(self.output_type)
        self._effects = {
            **BUILTIN_EFFECTS,
            **self.effects,
            **declared_effects(self.machine, self.subagents, self.effects),
        }
        self._digest = machine_digest(self.machine)
        self._settings = EffectSettings(
            machine_name=self.machine.name,
            digest=self._digest,
            definition=self.machine.to_dict(),
            agent=self.name,
            effects=self._effects,
            context=self.context,
            compaction_timeout=self.compaction_timeout,
            effect_timeout=self.effect_timeout,
            store_timeout=self.store_timeout,
            prices=self.prices,
        )
        self._extras = request_extras(self.system_prompt, self._schemas)
        self._check_reserve(window)

    def _check_reserve(self, window: int) -> None:
        """Refuse a window that what rides every request cannot fit beside.

        The system prompt, the tool schemas, the output type's schema and
        the reply budget ride every request: when they alone reach the
        window's emergency line (where a request is compacted, never sent),
        no run could send one (each would raise `PinnedTooLarge`).
        """
        extras = self._extras_for(self._output)
        if not window or not extras:
            return  # a reply budget alone is checked on its own
        meter = self._run_meter()
        reply = self.max_output_tokens or 0
        try:
            total = meter.measure(extras=extras)
        except ConfigError:
            return  # a counter that gives no count: the first run names it
        line = emergency_line(window)
        # Uncalibrated, even for a manager that calibrates: a session's
        # first run has learned no scale, and these ride its requests too.
        if total + reply < line:
            return
        blame = counter_at_fault((), self.counter, extras=extras, tokens=total)
        if blame:  # no text is at fault: the counter's count is
            raise ReserveTooLarge(
                "counter",
                f"<{blame}>",
                "a count a tokenizer could make of the system prompt and the"
                " schemas: the token counter is at fault, not what rides every"
                " request - fix the counter (its count, count_text or units)",
                reserved=total + reply,
                window=window,
            )
        prompt = (
            meter.measure(extras=(self.system_prompt,)) if self.system_prompt else 0
        )
        schemas = request_extras(None, self._schemas)
        tools = meter.measure(extras=schemas) if schemas else 0
        output = max(0, total - prompt - tools)
        field, tokens = max(
            (("system_prompt", prompt), ("tools", tools), ("output_type", output)),
            key=lambda part: part[1],
        )
        raise ReserveTooLarge(
            field,
            f"<{tokens:,} tokens>",
            f"what fits under the {line:,}-token emergency line of the"
            f" {window:,}-token context window (a request on or over it is"
            " compacted, never sent) beside the rest that rides every request"
            f" (system prompt {prompt:,} tokens, tool schemas"
            f" {tools:,}, output schema {output:,}, reply budget {reply:,}):"
            " shorten the system prompt or the tools' descriptions, give fewer"
            " tools or a smaller output type, lower max_output_tokens, or use a"
            " bigger window",
            reserved=total + reply,
            window=window,
        )

    def _output_type(self, tp: Any) -> OutputType | None:
        """Describe `tp` for a run; the machine must be able to re-ask.

        Raises:
            ConfigError: `tp` has no JSON form, or the machine calls no
                model, or it has no `output_rejected` transition out of its
                model-call phases.
        """
        if tp is None:
            return None
        output = OutputType.of(tp)
        check_machine(self.machine, output)
        return output

    @property
    def budget(self) -> Budget:
        """The limits each run works within (built by the context manager)."""
        return self._budget

    @property
    def counter(self) -> TokenCounter:
        """The one counter used everywhere: the context manager's."""
        return self.context.counter if self.context else default_counter()

    def _run_meter(self) -> Meter:
        """The meter a run measures with (made again if `context` was replaced)."""
        context = self.context
        kept = self._meter
        if kept is None or kept[0] is not context:
            kept = self._meter = (context, Meter(self.counter))
        return kept[1]

    def _extras_for(self, output: OutputType | None) -> tuple[str, ...]:
        """The texts that ride each request of a run with `output`, as measured.

        The system prompt and the tool schemas, and the output type's schema
        when the run asks for a structured answer: it is sent with every
        request, so it counts against the window like the tool schemas.
        """
        if output is None or output.spec is None:
            return self._extras
        return request_extras(self.system_prompt, self._schemas, output.spec)

    @overload
    async def run(
        self,
        input: str | Message | Iterable[Message],
        *,
        session: Session | None = None,
        control: RunControl | None = None,
        hooks: Sequence[Hook] = (),
        output_type: type[T],
        run_id: str | None = None,
    ) -> RunResult[T]: ...

    @overload
    async def run(
        self,
        input: str | Message | Iterable[Message],
        *,
        session: Session | None = None,
        control: RunControl | None = None,
        hooks: Sequence[Hook] = (),
        output_type: Any = None,
        run_id: str | None = None,
    ) -> RunResult[Any]: ...

    async def run(
        self,
        input: str | Message | Iterable[Message],
        *,
        session: Session | None = None,
        control: RunControl | None = None,
        hooks: Sequence[Hook] = (),
        output_type: Any = None,
        run_id: str | None = None,
    ) -> RunResult[Any]:
        """Run the loop until the brain finishes, fails or pauses.

        Args:
            input: the run's new messages (a string becomes one user message).
            session: the conversation to continue; a new one if None. Its
                log is appended to as the run goes.
            control: a `RunControl` to inject messages or cancel while the
                run runs.
            hooks: extra hooks for this run only (after the driver's own).
                When one wants `on_text_delta` and the model can `stream`,
                replies are streamed.
            output_type: the final answer's type for this run only (see
                `Driver.output_type`; ``str`` asks for plain text).
            run_id: the run's id (default: a fresh ``run_...``); a durable
                run's is chosen by whoever starts it, so that its workflow
                and its log name the same run.

        Returns:
            The `RunResult`; a failed run is an outcome (see
            `RunResult.raise_for_failure`). With an output type ``T``, a
            ``RunResult[T]`` whose `output` is the validated answer.

        Raises:
            ConfigError: `output_type` has no JSON form, or the machine
                calls no model (no answer to read), or it cannot re-ask for
                it (no `output_rejected` transition).
            InvalidMessage: the input is malformed: a tool result for no
                call, a message after a call with no result, a message the
                session's history already has or one given twice (the same
                id; nothing was written). An input that ends in calls with no result (a
                conversation cut short mid-tool) is not refused: each call
                gets an error result saying it was interrupted.
            SessionBusy: another run is using `session`, or a run of it is
                paused or unfinished (resume or abandon it first).
            ConfigError: `run_id` is not a usable id, or a run of `session`
                has it already; `control` is another run's, still running;
                a hook of `hooks` is not one, or the driver has it already.
            SessionConflict: another writer appended to the session's log.
            PinnedTooLarge: the pinned messages (`ContextManager.pins`,
                `Message.pin`) plus the system prompt, the tool schemas and
                the reply budget reach the window's emergency line: no pass
                could make a request the run can send (nothing was written).
        """
        messages = as_messages(input)
        output = self._output if output_type is None else self._output_type(output_type)
        hooks = run_hooks(hooks, self.hooks)
        session = session if session is not None else Session()
        if not isinstance(session, Session):
            raise _not_a_session(session)
        _checks.check(control, "control", _CONTROL)
        if run_id is not None:
            _checks.check_id("run_id", run_id)
            if session.has_run(run_id):
                raise ConfigError("run_id", run_id, "an id no run of the session has")
        # O(new messages): the history's own state is memoised on its log.
        require_new_ids(messages, session.history, field="input")
        left_open = OpenCalls.of(session.history).then(messages)
        if not left_open.is_closed:  # cut short mid-tool: closed as interrupted
            messages = close_input(messages, left_open.ids)
        manager = self.context
        check_pins_fit(
            manager,
            session.history,
            messages,
            meter=self._run_meter(),
            extras=self._extras_for(output),
            reply=self.max_output_tokens or 0,
            ratio=None
            if manager is None or not manager.calibrate
            else session.reported_ratio_for(context_settings(manager)),
        )
        return await start_run(self, session, messages, run_id, control, hooks, output)

    async def compact(
        self,
        session: Session,
        *,
        control: RunControl | None = None,
        hooks: Sequence[Hook] = (),
        force: bool = False,
        run_id: str | None = None,
    ) -> RunResult[Any]:
        """Compact `session`'s history now, outside any run (a manual pass).

        The operator's ``/compact``: one pass of this driver's context
        manager over the session's history, whatever the token lines say,
        logged as a run of the ``compaction`` machine (its pass, its commit,
        its summaries and the circuit breaker, as in any run). A pass that
        saves nothing changes nothing; an ephemeral session never compacts.

        A compaction whose process died mid-pass is carried on, not begun
        again: calling this again is the retry (the pass is redone, and a
        summary the log already holds is not written twice). Until the dead
        process's lease expires (`lease_ttl`), the retry needs `force`, as
        `resume` does.

        A run paused for an answer (an approval), or stopped for its
        sub-agent's (`SubagentWaiting`), does not stop the pass: it compacts
        only the committed history, never the waiting run's own messages
        (the calls awaiting approval among them); when the run goes on, it
        continues from the compacted history.

        `run_id` names the pass's run, as in `run` (default: a fresh
        ``run_...``); a simulation replays a stored pass under its own id.

        Returns:
            The run's result: ``done`` (the pass's record says what it came
            to), or ``failed`` with the pass's error.

        Raises:
            SessionNotFound: `session` has no log yet (no run ever ran in
                it): there is nothing to compact, and nothing is written.
            SessionBusy: another run is using `session`, or a run of it (not
                a compaction) is unfinished (its process died: resume or
                abandon it first), or another process holds its lease (take
                a dead one's over with `force`).
            SessionConflict: another writer appended to the session's log.
            ConfigError: `session` is not a `Session`, `control` not a
                `RunControl` or None, `force` not True or False, a hook of
                `hooks` is not one (or the driver has it already), or
                `run_id` is not a usable id, or a run of `session` has it
                already (the error names the argument; nothing is written).
        """
        _check_session_call(session, control, force)
        if run_id is not None:
            _checks.check_id("run_id", run_id)
        hooks = run_hooks(hooks, self.hooks)
        if not session.version:
            # A session is created by its first run: with no log, there is
            # nothing to compact (one another process wrote meanwhile is
            # this one's conflict, below).
            await read_session(
                session.store, session.id, seconds=self.store_timeout, must_exist=True
            )
        compacting = self._compacting
        if compacting is None:
            compacting = self._compacting = attrs.evolve(
                self, machine=compaction_machine(), output_type=None
            )
        waiting = session.open_runs()
        if waiting and waiting[-1].opened.digest == compacting._digest:
            return await compacting.resume(
                session, waiting[-1].run_id, control=control, hooks=hooks, force=force
            )
        if run_id is not None and session.has_run(run_id):
            raise ConfigError("run_id", run_id, "an id no run of the session has")
        return await start_run(
            compacting, session, (), run_id, control, hooks, None, beside_paused=True
        )

    async def resume(
        self,
        session: Session,
        run_id: str,
        event: Event | None = None,
        *,
        control: RunControl | None = None,
        hooks: Sequence[Hook] = (),
        output_type: Any = None,
        force: bool = False,
    ) -> RunResult[Any]:
        """Continue a paused (or unfinished) run of `session` from its log.

        The brain is rebuilt by replaying the run's logged events (checking
        every decision against the log), then `event` — the answer the run
        waits for, e.g. `ToolCallsReviewed.approve_all()` — is fed next.
        Without `event`, an unfinished run (its process died) redoes the
        decision it was carrying out. A paused run also takes a
        `RunCancelled`: it ends ``cancelled`` (where `abandon` ends it
        failed). `output_type` is the run's (see `run`; default: the
        driver's): a run begun with one is resumed with the same; the
        answer is read again from the final text.

        Raises:
            ConfigError: `session` is not a `Session`, `run_id` not a usable
                id, `control` not a `RunControl` or None, or `force` not True
                or False (the error names the argument); no such run; the
                run is not open; the machine is not the one the run began
                on; `event` is not an answer the paused run takes: not an
                event its phase accepts, or tool results for calls it does
                not wait on (`Pause.check_answer`); or it approves a call
                whose tool this driver lacks; a hook of
                `hooks` is not one, or the driver has it already; the run
                began with an output type other than `output_type`. Nothing
                is written: the run stays paused, to be answered again.
            ReplayDiverged: the log does not replay on this machine.
            SessionBusy: another run is using `session`, or another process
                holds it and is alive (its lease is live): resume with
                `force` only if that process is known to be gone.
        """
        _check_session_call(session, control, force)
        _checks.check_id("run_id", run_id)
        hooks = run_hooks(hooks, self.hooks)
        output = self._output if output_type is None else self._output_type(output_type)
        return await resume_run(
            self, session, run_id, event, control, hooks, output, force=force
        )

    async def abandon(
        self,
        session: Session,
        run_id: str,
        *,
        reason: str = "abandoned",
        force: bool = False,
    ) -> RunResult:
        """End a paused or unfinished run as failed; nothing it said is committed.

        The run's outcome is ``failed``, its error `Cancelled(reason)`: it did
        not finish, and no one is waiting on it any more.

        Raises:
            ConfigError: `session` is not a `Session`, `run_id` not a usable
                id, `reason` not a string, or `force` not True or False (the
                error names the argument; nothing is written); no such run,
                or the run is not open.
            SessionBusy: another run is using `session`, or another process
                holds it and is alive (not with `force`).
        """
        _check_session_call(session, None, force)
        _checks.check_id("run_id", run_id)
        _checks.check(reason, "reason", _REASON)
        return await abandon_run(self, session, run_id, reason, force=force)

    @property
    def digest(self) -> str:
        """The machine's digest, as the log records the machine a run began on."""
        return self._digest

    @property
    def effects_by_name(self) -> Mapping[str, Effect]:
        """Every effect the driver carries decisions out with, by name."""
        return self._effects

    @property
    def effect_settings(self) -> EffectSettings:
        """The effects and their limits, as `carry_out` takes them."""
        return self._settings

    def resources(
        self,
        run_id: str,
        *,
        session: Session | None,
        session_id: str,
        hooks: Sequence[Hook] = (),
        output: OutputType | None = None,
        retry: RetryPolicy | None = None,
    ) -> RunResources:
        """Return what the effects of run `run_id` may use.

        The loop's run gets them, and so does each Temporal activity that
        carries out one of a durable run's effects.

        Args:
            run_id: The run.
            session: The session's log, or None (an effect that needs no log).
            session_id: The session's id.
            hooks: Hooks for this run only, after the driver's own.
            output: The run's output type (default: none, plain text).
            retry: The retry policy instead of the driver's.
        """
        return run_resources(
            self,
            run_id,
            session=session,
            session_id=session_id,
            hooks=hooks,
            output=output,
            retry=retry,
        )
