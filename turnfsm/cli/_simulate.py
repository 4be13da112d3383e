"""``turnfsm simulate SESSION``: a stored session again under other settings."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any, Final, TextIO

import attrs

from turnfsm._prices import priced
from turnfsm.cli._errors import as_option, explain, terminal_text
from turnfsm.cli._run import machine_option, run_async
from turnfsm.context import ContextCompactor, ContextManager, MaskingCompactor
from turnfsm.core import MachineSpec
from turnfsm.errors import ConfigError, DefinitionError, StoreError
from turnfsm.persistence import Session
from turnfsm.providers import ModelClient
from turnfsm.simulate import Simulation, simulate, stored_context

__all__ = ["SimulateCommand", "run_simulate"]


@attrs.frozen(kw_only=True)
class SimulateCommand:
    """The options of ``turnfsm simulate``, as given."""

    session_id: str
    store: str | None = None
    strategy: str | None = None
    compactor: str | None = None
    newest_exchange: bool = False
    window: int | None = None
    threshold: int | None = None
    machine: str | None = None
    prices: str | None = None
    summary_model: str | None = None
    cache_payback: int | None = None


def run_simulate(command: SimulateCommand, out: TextIO | None = None) -> int:
    """Simulate the stored session; print its per-call table and passes.

    Returns 0 when every run went as the log says, 1 when a simulated run
    ended otherwise (the settings would have broken or changed it), 2 when
    an option, the store or the session cannot be used (named on stderr).
    """
    stream = out or sys.stdout
    try:
        sim, context = run_async(_simulate, command)
    except (OSError, StoreError, ConfigError, DefinitionError, ImportError) as exc:
        print(f"turnfsm simulate: {explain(exc)}", file=sys.stderr)
        return 2
    compactor = type(context.compactor).__name__
    print(
        f"session {terminal_text(sim.session_id)} simulated with {compactor}, "
        f"{_lines(context)}",
        file=stream,
    )
    print(file=stream)
    print(sim.table(), file=stream)
    return 1 if sim.differences else 0


def _lines(context: ContextManager) -> str:
    """The window and the threshold line, as the header says them (0: off)."""
    if context.window == 0:
        return "window 0 (no lines)"
    if context.threshold_tokens is not None:
        line = f"{context.threshold_tokens} tokens"
    else:
        line = f"{context.threshold}%" if context.threshold else "off"
    return f"window {context.window}, threshold {line}"


async def _simulate(command: SimulateCommand) -> tuple[Simulation, ContextManager]:
    from turnfsm.cli._run import load_cli_session
    from turnfsm.cli._stores import close_store, open_cli_store

    if command.prices is not None:
        priced(command.prices, "--prices")
    store = open_cli_store(command.store, read_only=True)
    try:
        session = await load_cli_session(store, command.session_id)
    finally:
        await close_store(store)
    contexts = _contexts(session, command)
    machine = _machine(command.machine)
    with _summary_model(command.summary_model) as model:
        try:
            sim = await simulate(
                session,
                context=contexts,
                machine=machine,
                summary_model=model,
                prices=command.prices,
            )
        except ConfigError as exc:
            flags = {
                "summary_model": "--summary-model",
                "compactor": "--compactor",
                "context_window": "--window",
            }
            if exc.field in flags:
                raise as_option(exc, flags[exc.field]) from None
            if exc.field in ("effects", "subagents"):  # no option gives code
                raise ConfigError(
                    "--machine",
                    command.machine,
                    f"a machine a simulation can run; this one needs "
                    f"{exc.expected}, code of your own that a simulation has not",
                ) from None
            raise
    first = session.runs[0].run_id
    context = stored_context(session) if contexts is None else contexts[first]
    return sim, context


_SIZING: Final = ("strategy", "compactor", "window", "threshold", "cache_payback")


def _contexts(
    session: Session, command: SimulateCommand
) -> dict[str, ContextManager] | None:
    """Each run's stored settings, with the options given in their place.

    None when no option changes them: each run is simulated under its own
    settings, and its passes must then be the recorded ones.
    """
    given = [getattr(command, name) is not None for name in _SIZING]
    if not any(given) and not command.newest_exchange:
        return None
    return {run.run_id: _context(session, run.run_id, command) for run in session.runs}


def _context(session: Session, run_id: str, command: SimulateCommand) -> ContextManager:
    """Run `run_id`'s stored settings, with the options given in their place."""
    from turnfsm.cli._agents import load_object
    from turnfsm.cli._run import compactor

    if command.strategy is not None and command.compactor is not None:
        raise ConfigError(
            "--compactor", command.compactor, "no --strategy with it (one of them)"
        )
    chosen: Any = None
    option = "--strategy"
    if command.strategy is not None:
        chosen = compactor(command.strategy)
    elif command.compactor is not None:
        option = "--compactor"
        chosen = _user_compactor(
            command.compactor, load_object(option, command.compactor)
        )
    if isinstance(chosen, ContextManager):
        context, chosen = chosen, None
    else:
        context = _stored(session, run_id, given=chosen is not None)
    if command.newest_exchange:
        chosen = chosen if chosen is not None else context.compactor
        if not hasattr(chosen, "compact_newest_exchange"):
            # MaskingCompactor has no such setting: it always cuts there.
            why = (
                ": it cuts inside the newest exchange already"
                if isinstance(chosen, MaskingCompactor)
                else ""
            )
            raise ConfigError(
                "--newest-exchange",
                True,
                f"a compactor with a compact_newest_exchange setting "
                f"({type(chosen).__name__} has none{why})",
            )
        chosen = attrs.evolve(chosen, compact_newest_exchange=True)
    changes: dict[str, Any] = {}
    if command.cache_payback is not None:
        if command.prices is None:
            raise ConfigError(
                "--cache-payback",
                command.cache_payback,
                "--prices MODEL with it (the prices a pass is weighed at)",
            )
        changes["prices"] = command.prices
        changes["cache_payback_calls"] = command.cache_payback
    if chosen is not None:
        changes["compactor"] = chosen
    if command.window is not None:
        changes["context_window"] = command.window
    if command.threshold is not None:
        changes["threshold"] = command.threshold
        changes["threshold_tokens"] = None
    try:
        return attrs.evolve(context, **changes)
    except ConfigError as exc:
        flags = {
            "compactor": option,
            "context_window": "--window",
            "threshold": "--threshold",
            "cache_payback_calls": "--cache-payback",
            "prices": "--prices",
        }
        if exc.field == "compactor" and command.compactor is not None:
            # Named as typed, not as the object it names.
            raise attrs.evolve(exc, field=option, value=command.compactor) from None
        raise as_option(exc, flags.get(exc.field, exc.field)) from None


def _stored(session: Session, run_id: str, *, given: bool) -> ContextManager:
    """A run's own settings; its compactor may be replaced (`given`)."""
    try:
        return stored_context(session, run_id=run_id)
    except ConfigError as exc:
        if exc.field != "compactor":
            raise
        if not given:
            raise attrs.evolve(exc, field="--compactor") from None
    # Its compactor cannot be made again, and another is given: the rest of
    # its settings still hold.
    return stored_context(session, compactor=MaskingCompactor(), run_id=run_id)


def _user_compactor(spec: str, value: Any) -> ContextCompactor | ContextManager:
    """A compactor or context manager, or what a function of no arguments makes."""
    from turnfsm.cli._agents import made_by

    if isinstance(value, type) or (
        callable(value) and not hasattr(value, "compact") and not _is_context(value)
    ):
        value = made_by("--compactor", spec, value, "a compactor")
    return value  # type: ignore[no-any-return]


def _is_context(value: object) -> bool:
    return isinstance(value, ContextManager)


def _machine(path: str | None) -> MachineSpec | None:
    return None if path is None else machine_option(path)


@contextlib.contextmanager
def _summary_model(spec: str | None) -> Iterator[ModelClient | None]:
    """The model ``--summary-model`` names (``demo``: the demo's), or None."""
    if spec is None:
        yield None
        return
    if spec == "demo":
        from turnfsm.cli._demo_model import SimulatedModel

        yield SimulatedModel()
        return
    from turnfsm.cli._run import open_model

    with open_model(spec, field="--summary-model") as (model, _window):
        yield model
