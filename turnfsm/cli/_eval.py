"""``turnfsm eval``: replay sessions under each strategy and check their probes."""

from __future__ import annotations

import contextlib
import difflib
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, TextIO

import anyio
import attrs

from turnfsm import _checks
from turnfsm._prices import priced
from turnfsm.cli._agents import load_object, made_by
from turnfsm.cli._errors import as_option, explain, terminal_text
from turnfsm.cli._run import run_async
from turnfsm.context import ContextCompactor, ContextManager
from turnfsm.errors import ConfigError, SessionNotFound, StoreError
from turnfsm.evals import (
    STRATEGIES,
    EvalProgress,
    Evaluation,
    Probe,
    corpus_probes,
    evaluate,
    load_probes,
    shipped_strategy,
    store_corpus,
)
from turnfsm.persistence import MemoryStore, Session
from turnfsm.providers import ModelClient
from turnfsm.testing import ExtractiveSummaryModel

__all__ = ["EvalCommand", "run_eval"]

DEFAULT_WINDOW: Final = 16_384
"""The window sessions are replayed on when ``--window`` is not given."""

Maker = Callable[[ModelClient], ContextCompactor]


@attrs.frozen(kw_only=True)
class EvalCommand:
    """The options of ``turnfsm eval``."""

    sessions: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    probes: str | None = None
    strategies: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    window: int = attrs.field(
        default=DEFAULT_WINDOW,
        validator=_checks.integer("--window", low=1, high=_checks.MAX_TOKENS),
    )
    summary_model: str | None = None
    judge: str | None = None
    floor: float | None = attrs.field(
        default=None,
        validator=_checks.number(
            "--floor", low=0, high=1, optional=True, expected="a share in 0..1 (0.8)"
        ),
    )
    store: str | None = None
    prices: str | None = None
    progress: bool | None = None


def strategy_maker(spec: str) -> Maker:
    """The compactor ``--strategy SPEC`` names: a shipped one, or ``MODULE:ATTR``.

    ``MODULE:ATTR`` is a `ContextCompactor`, or a class or function of no
    arguments making one.

    Raises:
        ConfigError: `spec` names no strategy (the option and value named).
    """
    if spec in STRATEGIES:
        return lambda model: shipped_strategy(spec, model)
    if ":" not in spec:
        close = difflib.get_close_matches(spec, list(STRATEGIES), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(
            "--strategy", spec, " | ".join(STRATEGIES) + ", or MODULE:ATTR" + hint
        )
    value = load_object("--strategy", spec)
    if isinstance(value, ContextCompactor) and not isinstance(value, type):
        compactor = _usable(spec, value)
        return lambda _model: compactor
    if callable(value):
        return lambda _model: _made(spec, value)
    raise ConfigError(
        "--strategy", spec, "a ContextCompactor, or a function making one"
    )


def _made(spec: str, make: Callable[[], object]) -> ContextCompactor:
    made = made_by("--strategy", spec, make, "a compactor")
    if not isinstance(made, ContextCompactor):
        raise ConfigError(
            "--strategy", spec, f"a ContextCompactor (it made {type(made).__name__})"
        )
    return _usable(spec, made)


def _usable(spec: str, compactor: ContextCompactor) -> ContextCompactor:
    """`compactor`, if a context manager takes it; refused naming `spec` if not.

    Raises:
        ConfigError: it is no compactor a run can use (a plain ``def
            compact``, say): ``--strategy`` and `spec` named, as typed.
    """
    try:
        ContextManager(compactor)
    except ConfigError as exc:
        raise attrs.evolve(exc, field="--strategy", value=spec) from None
    return compactor


def run_eval(options: Mapping[str, Any], out: TextIO | None = None) -> int:
    """Run ``turnfsm eval`` with `options` (`EvalCommand`'s fields); print the table.

    Returns the exit status: 0, every strategy at or over the floor (or no
    floor); 1, one is under it; 2, the options, sessions, probes or models
    cannot be used (nothing is measured).
    """
    stream = out or sys.stdout
    try:
        command = EvalCommand(**options)
        if command.prices is not None:
            priced(command.prices, "--prices")
        makers = {s: strategy_maker(s) for s in (command.strategies or STRATEGIES)}
        probes = _probes(command)
        with contextlib.ExitStack() as stack:
            summary, summary_name = _summary_model(stack, command.summary_model)
            judge = _judge(stack, command, summary)
            evaluation = run_async(
                _evaluate, command, probes, makers, summary, summary_name, judge
            )
    except (ConfigError, StoreError, OSError, ImportError) as exc:
        print(f"turnfsm eval: {explain(exc)}", file=sys.stderr)
        return 2
    # The sessions' ids, as a terminal shows them safely (a table line each).
    table = evaluation.table().splitlines()
    print("\n".join(map(terminal_text, table)), file=stream)
    stream.flush()  # the table first, then any floor line on stderr
    if command.floor is None:
        return 0
    under = evaluation.below(command.floor)
    for result in under:
        print(
            f"turnfsm eval: {result.strategy} keeps {result.score:.0%} of the "
            f"probes, under the floor of {command.floor:.0%}",
            file=sys.stderr,
        )
    return 1 if under else 0


def _probes(command: EvalCommand) -> tuple[Probe, ...]:
    if command.probes is not None:
        try:
            return load_probes(command.probes)
        except ConfigError as exc:  # the file is this option's
            if exc.field != "path":
                raise
            raise attrs.evolve(exc, field="--probes") from None
    if command.sessions:
        raise ConfigError(
            "--probes",
            None,
            "a probe file for your own sessions (TOML or JSON)",
            missing=True,
        )
    return corpus_probes()


def _summary_model(
    stack: contextlib.ExitStack, spec: str | None
) -> tuple[ModelClient, str]:
    if spec is None:
        return (
            ExtractiveSummaryModel(),
            "SIMULATED (ExtractiveSummaryModel, no language model)",
        )
    from turnfsm.cli._run import open_model

    model, _window = stack.enter_context(open_model(spec, field="--summary-model"))
    return model, spec


def _judge(
    stack: contextlib.ExitStack, command: EvalCommand, summary: ModelClient
) -> ModelClient | None:
    if command.judge is None:
        return None
    if command.judge == command.summary_model:
        return summary
    from turnfsm.cli._run import open_model

    model, _window = stack.enter_context(open_model(command.judge, field="--judge"))
    return model


async def _evaluate(
    command: EvalCommand,
    probes: Sequence[Probe],
    makers: dict[str, Maker],
    summary: ModelClient,
    summary_name: str,
    judge: ModelClient | None,
) -> Evaluation:
    try:
        return await _measure(command, probes, makers, summary, summary_name, judge)
    finally:  # in this event loop: the clients' connections belong to it
        for model in {id(m): m for m in (summary, judge) if m is not None}.values():
            close = getattr(model, "close", None)
            if close is not None:
                with anyio.CancelScope(shield=True):
                    await close()


async def _measure(
    command: EvalCommand,
    probes: Sequence[Probe],
    makers: dict[str, Maker],
    summary: ModelClient,
    summary_name: str,
    judge: ModelClient | None,
) -> Evaluation:
    caveats = [f"Summary model: {summary_name}."]
    if command.sessions:
        sessions = await _load(command.store, command.sessions)
    else:
        sessions = list(await store_corpus(MemoryStore()))
    if judge is not None:
        caveats.append(
            f"Judge: {command.judge}; right = its answer holds every expected string."
        )
    try:
        return await evaluate(
            sessions,
            probes,
            strategies=makers,
            window=command.window,
            summary_model=summary,
            judge=judge,
            prices=command.prices,
            caveats=caveats,
            progress=_progress(command.progress),
        )
    except ConfigError as exc:
        if exc.field.startswith("sessions["):  # a session given twice
            raise attrs.evolve(exc, field="SESSION") from None
        if exc.field != "window":
            raise
        raise as_option(exc, "--window") from None


def _progress(wanted: bool | None) -> Callable[[EvalProgress], None] | None:
    """Progress lines on stderr: with ``--progress``, or when it is a terminal."""
    if wanted is None:
        wanted = sys.stderr.isatty()
    if not wanted:
        return None

    def tell(where: EvalProgress) -> None:
        print(f"turnfsm eval: {terminal_text(str(where))}", file=sys.stderr, flush=True)

    return tell


async def _load(store: str | None, ids: Sequence[str]) -> list[Session]:
    from turnfsm.cli._sessions import not_found
    from turnfsm.cli._stores import close_store, open_cli_store

    sessions = open_cli_store(store, read_only=True)
    try:
        loaded = []
        for session_id in ids:
            try:
                loaded.append(await Session.load(sessions, session_id))
            except SessionNotFound as exc:
                raise await not_found(exc, sessions) from None
        return loaded
    finally:
        await close_store(sessions)
