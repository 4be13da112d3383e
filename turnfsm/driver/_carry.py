"""Carrying one decision out: its effect, under its timeout, interruptible.

`carry_out` is the one way an effect runs, by the loop and by a Temporal
activity alike.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from typing import Any, final

import anyio
import attrs

from turnfsm.context import ContextManager
from turnfsm.core import (
    EVENT_TYPES,
    Compact,
    CompactorFailed,
    Decision,
    Event,
    Perform,
    RunCancelled,
)
from turnfsm.driver._context import EffectContext
from turnfsm.driver._control import RunControl
from turnfsm.driver._effects import BUILTIN_EFFECTS, Effect, effect_key
from turnfsm.driver._subagents import PhaseDelegation
from turnfsm.driver._tools import is_late, timed_step, warn_if_held
from turnfsm.errors import InvalidReturn
from turnfsm.providers import ModelPrices
from turnfsm.values import ErrorInfo

__all__ = ["EffectSettings", "carry_out", "timed_out"]

logger = logging.getLogger("turnfsm.driver")


@final
@attrs.frozen(kw_only=True)
class EffectSettings:
    """What a run's loop takes from its `Driver`: the effects and their limits.

    Attributes:
        machine_name: The machine's name, as the log records it.
        digest: The machine's digest.
        definition: The machine as a file's data (the log keeps it once).
        agent: The agent's name (`Driver.name`).
        effects: Every effect, by the decision kind it carries out.
        context: The context manager, or None.
        compaction_timeout: Seconds a compaction pass may take (None: no limit).
        effect_timeout: Seconds a custom effect may take (None: no limit).
        store_timeout: Seconds each call to the session store may take
            (None: no limit).
        prices: The model's prices, for what the run's calls cost (None:
            not known).
    """

    machine_name: str
    digest: str
    definition: Mapping[str, Any]
    agent: str
    effects: Mapping[str, Effect]
    context: ContextManager | None
    compaction_timeout: float | None
    effect_timeout: float | None
    store_timeout: float | None = None
    prices: ModelPrices | None = None
    # The names whose effect is the user's, not the built-in one (made from
    # `effects`, once per driver): their events are checked against the phase.
    _own_effects: frozenset[str] = attrs.field(init=False, repr=False)

    @_own_effects.default
    def _own(self) -> frozenset[str]:
        # A durable run's stand-in for a built-in step (``runs_builtin``) runs
        # that step in an activity: not the user's.
        return frozenset(
            key
            for key, effect in self.effects.items()
            if effect is not BUILTIN_EFFECTS.get(key)
            and not getattr(effect, "runs_builtin", False)
        )


async def carry_out(
    settings: EffectSettings,
    ctx: EffectContext,
    decision: Decision,
    control: RunControl | None = None,
) -> Event:
    """Carry `decision` out with its effect, under its timeout; return the event.

    The one way an effect is run, by the loop and by a Temporal activity
    alike: a compaction pass past `compaction_timeout` is `CompactorFailed`
    (with what its summary calls cost so far), a custom effect past
    `effect_timeout` cancels the run, and a `control`'s cancel interrupts the
    effect (its `RunCancelled` is returned).

    Raises:
        InvalidReturn: the effect returned something other than an event.
    """
    key = effect_key(decision)
    effect = settings.effects[key]
    limit = _limit(settings, ctx, decision, key)
    if limit is None and control is None:
        return _event_of(key, await effect(ctx, decision))
    with anyio.CancelScope() as scope:
        timed: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
        if limit is not None:
            scope.deadline = anyio.current_time() + limit
            timed = timed_step(scope.deadline)
        with timed:
            if control is None:
                event = _event_of(key, await effect(ctx, decision))
            else:
                with control.interrupting(scope):
                    event = _event_of(key, await effect(ctx, decision))
        if not is_late(scope):
            return event
    cancel = control.take_cancel() if control is not None else None
    if cancel is not None:
        return cancel
    if limit is not None:
        what = (
            "the compaction pass"
            if isinstance(decision, Compact)
            else f"effect {key!r}"
        )
        warn_if_held(what, scope, limit, logger)
    return timed_out(ctx, decision, key, limit, effect)


def _limit(
    settings: EffectSettings, ctx: EffectContext, decision: Decision, key: str
) -> float | None:
    """The seconds `decision`'s effect may take (None: its own limits bound it).

    A built-in model call or batch of tools is bounded inside, per attempt
    and per call; an effect of yours in their place (or a measurement's) is
    bounded by `effect_timeout`, or by what the built-in step may take when
    that is longer (a wrapper around it keeps its retries).
    """
    kind = type(decision)
    if kind is Compact:
        return settings.compaction_timeout
    if kind is Perform:
        return settings.effect_timeout
    if key not in settings._own_effects or settings.effect_timeout is None:
        return None
    run = ctx.run
    step: float | None = 0.0
    if key == "call_llm":
        retry = run.retry
        waits = retry.max_total if retry.max_attempts > 1 else 0.0
        step = (
            None
            if run.model_timeout is None
            else run.model_timeout * retry.max_attempts + waits
        )
    elif key == "run_tools":
        step = run.tool_timeout
    return None if step is None else max(settings.effect_timeout, step)


def timed_out(
    ctx: EffectContext,
    decision: Decision,
    key: str,
    limit: float | None,
    effect: Effect | None = None,
) -> Event:
    """The event of effect `key` that did not end within `limit` seconds.

    A compaction pass fails; a sub-agent phase with ``on_failure`` ends
    with it, as for any child that did not answer; any other effect ends
    the run cancelled, naming the timeout.
    """
    snapshot = ctx.snapshot
    if isinstance(decision, Compact):
        # The size the pass measured, as a pass that fails otherwise says it
        # (a pass outside a run, on a session, follows no measurement).
        return CompactorFailed(
            used=ctx.run.measure(decision.history, decision.pending),
            limit=snapshot.budget.context_window,
            error=ErrorInfo(
                type="TimeoutError",
                message=f"the compaction pass timed out after {limit}s - "
                f"compaction_timeout={limit}; raise it for a summary model "
                "that answers slowly",
            ),
            usage=ctx.spent.total,
        )
    said = f"effect {key!r} timed out after {limit}s"
    if key in ("call_llm", "run_tools"):  # an effect of yours for a built-in step
        said += " (effect_timeout, or the step's own limits when longer)"
    elif not isinstance(decision, Perform):
        said += " (effect_timeout)"
    delegated = PhaseDelegation.of(effect) if effect is not None else None
    if (
        isinstance(decision, Perform)
        and delegated is not None
        and delegated.on_failure is not None
    ):
        # A sub-agent phase whose child did not answer in time: the phase
        # ends as for any child that did not answer (its run is ended).
        return delegated.failed(decision, TimeoutError(f"{said} - effect_timeout"))
    return RunCancelled(reason=said)


def _event_of(key: str, value: object) -> Event:
    """Return what effect `key` returned if it is an event; else raise."""
    if not isinstance(value, EVENT_TYPES):
        text = repr(value)
        raise InvalidReturn(
            f"effect {key!r}",
            text if len(text) <= 200 else text[:197] + "...",
            "an event (turnfsm.core.EVENT_TYPES)",
        )
    return value
