"""What a `Driver` takes in, checked: its hooks, tools and effects; a run's input."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, cast

from turnfsm import _checks
from turnfsm.core import (
    Event,
    MachineSpec,
    Pause,
    Signal,
    TurnMachine,
)
from turnfsm.driver._effects import BUILTIN_EFFECTS
from turnfsm.driver._replay import rebased, rebuild
from turnfsm.driver._tools import Tool
from turnfsm.errors import ConfigError, InvalidMessage
from turnfsm.hooks import Hook, check_hooks
from turnfsm.messages import Message
from turnfsm.persistence import RunRecord, Session

if TYPE_CHECKING:
    from turnfsm.driver._driver import Driver

__all__ = [
    "as_messages",
    "check_answer",
    "check_effects",
    "is_tool",
    "open_run",
    "reopen",
    "run_hooks",
    "tools_tuple",
]


def is_tool(tool: object) -> bool:
    return isinstance(tool, Tool) or callable(tool)


_EFFECT_CALL: Final = _checks.Shape(("ctx", "decision"))
"""How the driver calls an effect: ``await effect(ctx, decision)``."""


def _unknown_effect(inst: Driver, named: set[str], name: object) -> ConfigError:
    """The refusal of `name` as a key of `effects`: no effect is named so."""
    known = sorted(named | set(BUILTIN_EFFECTS))
    return ConfigError(
        "effects",
        name,
        ("" if isinstance(name, str) else "a string: ")
        + f"the name of an effect of machine {inst.machine.name!r}'s phases"
        f" or of a built-in effect: {', '.join(known)}",
    )


def check_effects(inst: Driver, _attr: object, effects: object) -> None:
    """Effects by name, and one for every custom phase of the driver's machine.

    An effect must be an async function that can be called with the step's
    context and the decision: one whose parameters cannot take that call is
    refused here, rather than failing the run at its first call.
    """
    if not isinstance(effects, Mapping):
        raise ConfigError("effects", effects, "a mapping of name to effect")
    named = {s.effect for s in inst.machine.states if s.effect is not None}
    for name, effect in effects.items():
        if not isinstance(name, str):  # the key is at fault, not the effect
            raise _unknown_effect(inst, named, name)
        if not callable(effect):
            raise ConfigError(f"effects[{name!r}]", effect, "an async function")
        if _checks.is_plain_function(effect):  # it would fail at its first await
            raise ConfigError(
                f"effects[{name!r}]",
                effect,
                "an async function: it is a plain def, and it is awaited "
                "(write it as `async def`)",
            )
        unfit = _checks.cannot_take(effect, _EFFECT_CALL)
        if unfit is not None:  # it would fail the run at its first call
            raise ConfigError(
                f"effects[{name!r}]",
                effect,
                f"an effect called as effect({_EFFECT_CALL.spelled()}): {unfit}",
            )
        if name not in named and name not in BUILTIN_EFFECTS:
            # A misspelt name would leave the effect it meant to replace as it is.
            raise _unknown_effect(inst, named, name)
    for state in inst.machine.states:
        effect = state.effect
        if (
            effect is not None
            and state.subagent is None  # given in `subagents`
            and effect not in effects
            and effect not in BUILTIN_EFFECTS
        ):
            raise ConfigError(
                "effects",
                sorted(effects),
                f"an effect named {effect!r} for phase {state.name!r}",
            )


def tools_tuple(
    value: Iterable[Tool | Callable[..., Any]],
) -> tuple[Tool | Callable[..., Any], ...]:
    return _checks.as_tuple(value, "tools", "tools or functions")


def run_hooks(value: Iterable[Hook], own: Sequence[Hook]) -> tuple[Hook, ...]:
    """The hooks given to one run, checked as the driver's are (`own`).

    Raises:
        ConfigError: not a sequence of hooks; a hook as `check_hooks`
            refuses it; or one of the driver's own (`own`), which watch
            every run already: it would be called twice.
    """
    if type(value) is tuple and not value:  # the usual run: no hooks of its own
        return ()
    hooks = check_hooks(value)
    for i, hook in enumerate(hooks):
        if any(h is hook for h in own):
            raise ConfigError(
                f"hooks[{i}]",
                hook,
                "a hook the driver does not have: the driver's own hooks watch "
                "every run already, so it would be called twice for everything",
            )
    return hooks


def as_messages(value: str | Message | Iterable[Message]) -> tuple[Message, ...]:
    """Return a run's input as messages: a string is one user message.

    Raises:
        InvalidMessage: `value` is not a string, a `Message` or a non-empty
            sequence of them.
    """
    if isinstance(value, str):
        return (Message.user(value),)
    if isinstance(value, Message):
        return (value,)
    if (
        value is None
        or isinstance(value, bytes | Mapping)
        or not isinstance(value, Iterable)
    ):
        raise InvalidMessage(
            "input",
            value,
            "expected a string, a Message or a list of Messages" + _as_message(value),
        )
    messages = tuple(value)
    if not messages:
        # A model call with nothing new to answer is never what was meant.
        raise InvalidMessage("input", value, "expected at least one message")
    for i, item in enumerate(cast(tuple[object, ...], messages)):
        if isinstance(item, str):
            raise InvalidMessage(
                f"input[{i}]",
                item,
                "expected a Message: a list holds Messages "
                "(Message.user(text)), and one string is a message as it is",
            )
        if not isinstance(item, Message):
            raise InvalidMessage(
                f"input[{i}]", item, "expected a Message" + _as_message(item)
            )
    # The pairing is checked once, in `run`, as the continuation of the
    # session's history.
    return messages


def _as_message(value: object) -> str:
    """The `Message` a chat API's message would be: a dict, or LangChain's pair."""
    if isinstance(value, Mapping):
        role, content, form = value.get("role"), value.get("content"), "dict"
    elif isinstance(value, tuple) and len(value) == 2:
        (role, content), form = value, "(role, text) pair"
    else:
        return ""
    if role not in ("user", "assistant", "system") or not isinstance(content, str):
        return ""
    return (
        f", not a chat API's {form}: Message.{role}({content!r}) "
        "(from turnfsm.messages)"
    )


def open_run(session: Session, run_id: str) -> RunRecord:
    try:
        record = session.run(run_id)
    except KeyError:
        raise ConfigError(
            "run_id", run_id, f"a run of session {session.id!r}"
        ) from None
    if not record.is_open:
        raise ConfigError(
            "run_id", run_id, f"a paused or unfinished run (it is {record.outcome})"
        )
    return record


def reopen(
    spec: MachineSpec,
    digest: str,
    effects: Mapping[str, Any],
    session: Session,
    run_id: str,
    event: Event | None,
    *,
    check: bool = True,
) -> tuple[RunRecord, TurnMachine]:
    """The open run `run_id` of `session`, its brain rebuilt, ready for `event`.

    The brain runs the machine the run began on: `spec` when its `digest` is
    that machine's, else the one the session's log keeps (a process without
    the machine's file resumes a run all the same); `effects` must carry out
    its custom phases.

    Args:
        spec: The driver's machine.
        digest: Its digest.
        effects: The driver's effects, by name.
        session: The run's session.
        run_id: The run.
        event: The answer a paused run waits for (None: the run is not
            paused; its process died).
        check: Check each logged decision against the rebuilt brain's.

    An abandoned run (`check` False) of a log that keeps no machine is
    rebuilt on `spec`, unchecked: it only ends.

    Raises:
        ConfigError: no such run; the run is not open; the machine it began
            on is neither `spec` nor in the log; an effect it needs is
            missing; `event` is not an answer the paused run takes
            (`Pause.check_answer`), or not None when the run is not paused.
        ReplayDiverged: the log does not replay on the machine.
    """
    record = open_run(session, run_id)
    opened = record.opened
    stored = session.machine(opened.digest) if opened.digest != digest else None
    if stored is None and opened.digest != digest and check:
        raise ConfigError(
            "machine",
            f"{spec.name} ({digest})",
            f"the machine run {run_id!r} began on "
            f"({opened.machine} {opened.digest}), which the log does not keep",
        )
    if stored is not None:
        spec = stored
        for state in spec.states:
            if state.effect is not None and state.effect not in effects:
                raise ConfigError(
                    "effects",
                    sorted(effects),
                    f"an effect named {state.effect!r} for phase {state.name!r} "
                    f"of the machine run {run_id!r} began on ({opened.machine})",
                )
    machine = rebuild(spec, session, run_id, check=check)
    history = session.rebases(run_id).get(len(record.events))
    if history is not None:  # the session was compacted while the run waited
        machine = rebased(spec, machine, history)
    decision = machine.decision
    if event is None and not check:
        return record, machine
    if isinstance(decision, Pause):
        decision.check_answer(event)  # None is no answer
        if isinstance(event, Signal):
            _check_message(machine, event)
    elif event is not None:
        raise ConfigError("event", event, "None: the run is not paused")
    return record, machine


def check_answer(driver: Driver, session: Session, run_id: str, event: Event) -> None:
    """Refuse `event` as the answer to the paused run `run_id`, as resuming would.

    For a durable run, which takes its answers where they are sent: every
    check `Driver.resume` makes of an answer before it writes anything.

    Raises:
        ConfigError: `event` is no answer the run takes, or its text that
            the machine adds to the conversation is missing or blank.
    """
    reopen(driver.machine, driver._digest, driver._effects, session, run_id, event)


def _check_message(machine: TurnMachine, event: Signal) -> None:
    """Refuse an answer whose text the machine adds is missing or blank.

    Fed, it would fail the run (the brain refuses the signal); refused
    here, nothing is written and the run waits for a good answer.
    """
    key = machine.message_key(event)
    if key is None:
        return
    text = event.data.get(key)
    if text is None or not text.strip():
        raise ConfigError(
            "event.data",
            dict(event.data),
            f"{{{key!r}: TEXT}}: the machine file adds the signal's data "
            f"{key!r} to the conversation, and it is "
            + ("missing" if text is None else "blank")
            + "; nothing was written, and the run still waits",
        )
