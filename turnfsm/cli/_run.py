"""``turnfsm run "task"``: one task on a real model, or on your own agent.

The agent is your own (``--agent MODULE:ATTR``: its model, tools, machine
and context), or one built from the options: ``--model``, ``--tools``,
``--machine``, ``--strategy``, ``--system``, ``--window``. Every reply is
printed once, as it streams in (or whole, from a model that does not
stream); a run that pauses prints the calls it waits on and how to answer.
"""

from __future__ import annotations

import contextlib
import difflib
import errno
import io
import json
import os
import re
import shlex
import signal
import sys
import threading
import time
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Final, TextIO, TypeGuard, TypeVar, final

import anyio
import attrs

from turnfsm import _checks
from turnfsm._lines import window_to_send
from turnfsm._resources import load_machine
from turnfsm.agent import Agent
from turnfsm.cli._agents import load_agent, load_tools
from turnfsm.cli._errors import (
    INTERRUPTED_STATUS,
    as_option,
    explain,
    stdout_to_devnull,
    stop_signals,
)
from turnfsm.cli._stores import (
    IN_MEMORY,
    close_store,
    open_cli_store,
    shown,
    store_option,
    where,
)
from turnfsm.cli._strategies import AGENT_STRATEGIES, not_offered
from turnfsm.context import ContextCompactor, ContextManager, strategy_named
from turnfsm.core import MachineSpec, Pause
from turnfsm.driver import Driver, RunResult, read_session
from turnfsm.errors import (
    ConfigError,
    ContextExceeded,
    LeaseLost,
    MaxTurnsExceeded,
    PinnedTooLarge,
    ProviderError,
    ReserveTooLarge,
    RunCrashed,
    SessionBusy,
    SessionConflict,
    SessionNotFound,
    StoreUnusable,
    SubagentWaiting,
    TurnFSMError,
    WindowTooLarge,
    busy_words,
)
from turnfsm.hooks import ConsoleHook
from turnfsm.persistence import MemoryStore, Session, SessionStore
from turnfsm.providers import ModelClient, known_window, server_window, window_for

if TYPE_CHECKING:
    from turnfsm.providers import LlamaServer

__all__ = [
    "STRATEGY_NAMES",
    "AgentOptions",
    "calibrates",
    "cli_words",
    "console_for",
    "interruptible",
    "left_open_words",
    "machine_option",
    "model_kind",
    "open_model",
    "open_run_only",
    "open_run_words",
    "report_interrupted",
    "report_result",
    "run_and_close",
    "run_async",
    "run_task",
    "start_local",
    "subagent_answer_hint",
    "write_end",
]

_KEYS = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY"}

DEFAULT_MAX_TOKENS = 256
"""The reply budget per model call when ``--max-tokens`` is not given."""

DEFAULT_N_CTX = 4096
"""The local server's window when neither ``--n-ctx`` nor ``--window`` is given."""

LOCAL_MAX_TURNS = 3
"""The model calls a run on the local model makes when ``--max-turns`` is not given.

Given a tool's result, the tiny base model seldom answers: it calls the same
tool with the same arguments again, turn after turn (at 5 to 30 seconds a
call, the library's 50 would take minutes to fail).
"""

STRATEGY_NAMES = AGENT_STRATEGIES
"""The compactors ``--strategy`` names (every shipped one but ``digest``)."""

# The errors a command reports on one line (exit status 2): a setting, a
# store, a missing extra, a local server that would not start.
REPORTED = (TurnFSMError, ImportError, RuntimeError, OSError)


@final
@attrs.frozen(kw_only=True)
class AgentOptions:
    """The options that choose the agent a command runs (its parsed arguments).

    `agent` (``MODULE:ATTR``) is your own agent; otherwise one is built of
    `model` and the other settings. `window` None: the model's own.
    """

    agent: str | None = None
    model: str | None = None
    tools: str | None = None
    machine: str | None = None
    strategy: str | None = None
    system: str | None = None
    window: int | None = None
    n_ctx: int | None = None
    max_tokens: int | None = None
    max_turns: int | None = None
    model_timeout: float | None = None
    store: str | None = None

    def flags(self) -> list[str]:
        """The options another command needs to build this agent again.

        Every option given, as the command line spells it: `resume`,
        `approve` and `reject` go on with the agent the run had.
        """
        return _flags(self, attrs.fields(AgentOptions))

    def store_flags(self) -> list[str]:
        """The options another command needs to find this agent's store.

        ``--store``, else ``--agent`` (your agent may keep its own store):
        what `abandon` needs, which goes on with no model.
        """
        fields = attrs.fields(AgentOptions)
        return _flags(self, (fields.store,) if self.store else (fields.agent,))


def _flags(options: AgentOptions, fields: Sequence[attrs.Attribute[Any]]) -> list[str]:
    flags: list[str] = []
    for field in fields:
        value = getattr(options, field.name)
        if value is not None:
            shown_value = shown(value) if field.name == "store" else str(value)
            flags += [f"--{field.name.replace('_', '-')}", shown_value]
    return flags


def _refuse_with_agent(options: AgentOptions) -> None:
    built = {
        "--model": options.model,
        "--tools": options.tools,
        "--machine": options.machine,
        "--strategy": options.strategy,
        "--system": options.system,
        "--window": options.window,
        "--n-ctx": options.n_ctx,
        "--max-tokens": options.max_tokens,
        "--max-turns": options.max_turns,
        "--model-timeout": options.model_timeout,
    }
    for flag, value in built.items():
        if value is not None:
            raise ConfigError(
                flag,
                value,
                f"no {flag} with --agent (your agent brings its own settings: "
                "set them where it is built)",
            )


def machine_option(value: str) -> MachineSpec:
    """The machine ``--machine VALUE`` names: a file, or a shipped machine's name.

    Raises:
        ConfigError: no such file nor shipped machine, or it cannot be read
            (named ``--machine``, with the shipped machines and the closest).
        DefinitionError: the file is not a valid machine.
    """
    try:
        return load_machine(value)
    except OSError as exc:
        raise ConfigError(
            "--machine",
            value,
            f"a machine file, or a shipped machine's name ({explain(exc)})",
        ) from None


def compactor(name: str) -> ContextCompactor:
    """The compactor ``--strategy NAME`` names (its defaults).

    Raises:
        ConfigError: `name` is not one of `STRATEGY_NAMES`.
    """
    if name not in STRATEGY_NAMES:
        close = difflib.get_close_matches(name, STRATEGY_NAMES, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        if not_offered(name):
            hint = f" ({not_offered(name)})"
        raise ConfigError("--strategy", name, " | ".join(STRATEGY_NAMES) + hint)
    return strategy_named(name, field="--strategy")


@contextlib.contextmanager
def open_driver(
    options: AgentOptions,
    *,
    machine: MachineSpec | None = None,
    need_model: bool = True,
) -> Iterator[tuple[Driver, SessionStore | None]]:
    """Yield the driver the options name, and the agent's own store (if any).

    `machine` is the one to use when ``--machine`` is not given (a paused
    run's, from its log). Without `need_model`, a driver is built with no
    ``--model`` too: its model refuses to be called.

    Raises:
        ConfigError: a bad option (named with its value).
        DefinitionError: the ``--machine`` file is not a valid machine.
        ImportError: the SDK the model needs is not installed.
    """
    if options.agent is not None:
        _refuse_with_agent(options)
        agent = load_agent(options.agent)
        own = None if isinstance(agent.store, MemoryStore) else agent.store
        yield agent.driver, own
        return
    tokens = _checks.integer(
        low=1,
        high=_checks.MAX_TOKENS,
        optional=True,
        expected=f"an int in 1..{_checks.MAX_TOKENS:,}",
    )
    for flag, value in (
        ("--window", options.window),
        ("--n-ctx", options.n_ctx),
        ("--max-tokens", options.max_tokens),
    ):
        _checks.check(value, flag, tokens)
    turns = _checks.integer(low=1, optional=True, expected="an int > 0")
    _checks.check(options.max_turns, "--max-turns", turns)
    if options.model_timeout is not None:  # None: not given (no None to type)
        _checks.check(
            options.model_timeout, "--model-timeout", _checks.seconds(optional=False)
        )
    tools = load_tools(options.tools) if options.tools else []
    if options.machine is not None:
        machine = machine_option(options.machine)
    if options.model is None:
        if need_model:
            raise ConfigError(
                "--model",
                None,
                "a model (openai:MODEL, anthropic:MODEL, local, or a URL), "
                "or your own agent with --agent MODULE:ATTR",
                missing=True,
            )
        yield _driver(NoModel(), None, tools, machine, options), None
        return
    if options.n_ctx is not None and model_kind(options.model) in _KEYS:
        raise ConfigError(
            "--n-ctx",
            options.n_ctx,
            f"no --n-ctx with --model {options.model} (it sizes the local "
            "model's server, and the window of a URL server that does not "
            "tell its own): --window sets the window a run works within",
        )
    n_ctx = options.n_ctx or options.window or DEFAULT_N_CTX
    n_ctx_option = "--window" if options.window and not options.n_ctx else "--n-ctx"
    with open_model(
        options.model,
        n_ctx=n_ctx,
        window=options.window,
        n_ctx_option=n_ctx_option,
        # The settings a local model would refuse are named before it starts:
        # a driver is built on a stand-in, in the window the model will have.
        before_start=lambda window: _driver(NoModel(), window, tools, machine, options),
    ) as (model, window):
        yield _driver(model, window, tools, machine, options), None


def _driver(
    model: ModelClient,
    window: int | None,
    tools: list[Any],
    machine: MachineSpec | None,
    options: AgentOptions,
) -> Driver:
    settings: dict[str, Any] = {}
    if window is not None:  # the model's, or --window (checked against it)
        settings["context_window"] = window
    if calibrates(options.model):
        settings["calibrate"] = True
    strategy = [compactor(options.strategy)] if options.strategy else []
    extra: dict[str, Any] = {} if machine is None else {"machine": machine}
    if options.model_timeout is not None:
        extra["model_timeout"] = options.model_timeout
    if options.max_turns is not None or options.model == "local":
        extra["max_turns"] = options.max_turns or LOCAL_MAX_TURNS
    try:
        return Driver(
            model=model,
            tools=tools,
            system_prompt=options.system,
            context=ContextManager(*strategy, **settings),
            max_output_tokens=(
                DEFAULT_MAX_TOKENS if options.max_tokens is None else options.max_tokens
            ),
            **extra,
        )
    except ConfigError as exc:
        if exc.field == "max_output_tokens" and options.max_tokens is not None:
            raise as_option(exc, "--max-tokens") from None
        # Named by the option given that set the window: --window, else
        # --n-ctx (unless the server told its own), else --window.
        window_option = (
            "--n-ctx"
            if options.window is None and options.n_ctx and window == options.n_ctx
            else "--window"
        )
        if exc.field == "max_output_tokens":  # the default reply budget
            least = window_to_send(DEFAULT_MAX_TOKENS)
            raise ConfigError(
                window_option,
                window,
                f"a window well over {least:,} tokens: the default reply budget "
                f"(--max-tokens {DEFAULT_MAX_TOKENS}) and the request must fit "
                "under 95 % of it; or give a smaller --max-tokens",
            ) from None
        if isinstance(exc, ReserveTooLarge):  # what rides every request
            raise ConfigError(
                window_option,
                exc.window,
                f"a window of at least {window_to_send(exc.reserved):,} tokens, whose"
                " emergency line (95 %) is over what rides every request"
                " (the system prompt --system, the tools' schemas, the reply"
                " budget --max-tokens): or shorten --system, or lower --max-tokens",
            ) from None
        if exc.field not in ("effects", "subagents"):
            raise
        # Only code brings an effect or a sub-agent's agent: an agent of yours.
        raise ConfigError(
            "--machine",
            options.machine,
            "a machine the command line can run alone; this one needs "
            f"{exc.expected}: give --agent MODULE:ATTR, an Agent built on it "
            "with its effects= (or subagents=)",
        ) from None


def calibrates(spec: str | None) -> bool:
    """Whether an agent on the model `spec` scales its estimates by its reports.

    The default counter errs high against OpenAI's tokenizers only: a
    local model, a server of any model, or an Anthropic model counts its
    own way (the bundled local model reads up to 1.7 times the estimate on
    tool traffic), so the agent learns the ratio from the usage each call
    reports (`ContextManager(calibrate=True)`).
    """
    return spec is not None and not spec.startswith("openai:")


class NoModel:
    """The model of a command that must not call one (no ``--model`` given)."""

    async def complete(self, request: Any) -> Any:
        """Refuse: name the options that give a model."""
        raise ConfigError(
            "--model",
            None,
            "a model to continue the run with (--model SPEC, or --agent MODULE:ATTR)",
            missing=True,
        )


@contextlib.contextmanager
def open_model(
    spec: str,
    *,
    n_ctx: int = DEFAULT_N_CTX,
    window: int | None = None,
    field: str = "--model",
    n_ctx_option: str = "--n-ctx",
    before_start: Callable[[int], object] | None = None,
) -> Iterator[tuple[ModelClient, int]]:
    """Yield the model named by `spec` and its context window.

    `spec` is ``openai:MODEL``, ``anthropic:MODEL``, ``local`` (starts the
    bundled llama.cpp model, stopped on exit) or an OpenAI-compatible base
    URL (``http://host:port/v1``; ``URL#MODEL`` names the model).

    The window is `window` when given, else the model's: a known model's
    (`known_window`), the local server's ``n_ctx``, a URL server's own
    when it tells it (`server_window`), else `n_ctx` for a URL server and
    200,000 for an unknown ``openai:`` or ``anthropic:`` model. A `window`
    larger than the model's known one is refused (`WindowTooLarge`, naming
    ``--window``).

    `field` is the option that gave `spec`, as an error names it, and
    `n_ctx_option` the one that gave `n_ctx`. `before_start` is called with
    the window before the local server is started (it takes seconds): what
    it raises is raised with no server started.

    Only the provider `spec` needs is imported: a missing SDK is named with
    the extra that brings it, before a missing API key.

    Raises:
        ConfigError: an unknown spec, or a missing API key (named).
        WindowTooLarge: `window` is larger than the model's window.
        ImportError: the SDK `spec` needs is not installed (names the extra).
    """
    kind = model_kind(spec, field)
    if kind in _KEYS:
        name = spec.partition(":")[2].strip()
        client: ModelClient
        if kind == "openai":
            from turnfsm.providers import OpenAIModel

            maker: Any = OpenAIModel
        else:
            from turnfsm.providers import AnthropicModel

            maker = AnthropicModel
        key = _KEYS[kind]
        if not os.environ.get(key):
            expected = (
                f"the API key for {kind}:{name} in the environment (export {key}=...)"
            )
            raise ConfigError(key, None, expected, missing=True)
        client = maker(model=name)
        yield client, window_for(client, window, field="--window")
        return
    if kind == "local":
        from turnfsm.providers import LlamaServer

        local_client()  # the SDK first: no server is started for nothing
        try:
            server = LlamaServer(n_ctx=n_ctx)
        except ConfigError as exc:  # named as the option that gave it
            raise as_option(exc, n_ctx_option) from None
        if before_start is not None:  # its window: the n_ctx it is started with
            before_start(window_for(server, window, field="--window"))
        start_local(server, sys.stderr)  # a server that fails to start is stopped
        try:
            local = local_client(server.base_url, window=server.context_window)
            assert local is not None
            yield local, window_for(local, window, field="--window")
        finally:
            server.stop()
        return
    from turnfsm.providers import OpenAIModel

    url, _, model = spec.partition("#")
    remote = OpenAIModel(
        model=model or "default", base_url=url, context_window=server_window(url)
    )
    default = None if remote.context_window else n_ctx
    given = window if window is not None else default
    yield remote, window_for(remote, given, field="--window")


def model_kind(spec: str, field: str = "--model") -> str:
    """What a model spec names: ``openai``, ``anthropic``, ``local`` or ``url``.

    Checks the spec's form only: nothing is imported, started or reached.

    Raises:
        ConfigError: `spec` is none of the forms (named as `field`, with the
            spec it is close to), or a URL without a host.
    """
    kind, _, name = spec.partition(":")
    if kind in _KEYS and name.strip():
        return kind
    if spec == "local":
        return spec
    if spec.startswith(("http://", "https://")):
        if not urllib.parse.urlsplit(spec.partition("#")[0]).hostname:
            raise ConfigError(
                field, spec, "a base URL with a host (http://127.0.0.1:8080/v1)"
            )
        return "url"
    expected = "openai:MODEL, anthropic:MODEL, local, or an http(s) base URL"
    meant = _spec_meant(spec)
    if meant is not None:
        expected += f" (did you mean {meant}?)"
    raise ConfigError(field, spec, expected)


_HOST_PORT: Final = re.compile(r"^[\w.-]+:\d+(/\S*)?$")
"""A server's address without its scheme: ``localhost:8080``, ``host:80/v1``."""


def _spec_meant(spec: str) -> str | None:
    """Return the ``--model`` spec that `spec` is close to (None: none is).

    A known model's bare name with its provider's prefix, ``openai/MODEL``
    (LiteLLM's spelling) or ``OpenAI:MODEL`` with ``openai:``, a misspelt
    ``local``, a server's address with ``http://``.
    """
    text = spec.strip()
    for sep in (":", "/"):
        kind, _, name = text.partition(sep)
        if kind.lower() in _KEYS and name.strip():
            return f"{kind.lower()}:{name.strip()}"
    if difflib.get_close_matches(text.lower(), ["local"], n=1, cutoff=0.6):
        return "local"
    if _HOST_PORT.match(text):
        return f"http://{text}" if "/" in text else f"http://{text}/v1"
    for kind in _KEYS:  # a known model's bare name: say which prefix it takes
        if text and ":" not in text and known_window(text, provider=kind):
            return f"{kind}:{text}"
    return None


def start_local(server: LlamaServer, out: TextIO) -> LlamaServer:
    """Start the bundled model's `server`, saying so on `out`; return it.

    Loading the model takes seconds (more on a busy machine, and the first
    time its file is assembled): a line says what is starting before, and
    one how long it took after, so that the wait is not silent.

    Raises:
        ImportError: llama-cpp-python's server is not installed.
        ModelServerFailed: the server did not start (see `LlamaServer.start`).
    """
    _say(
        f"starting the local model (Gemma 3 270M on llama.cpp, a "
        f"{server.n_ctx:,}-token window) ...",
        out,
    )
    began = time.monotonic()
    server.start()
    _say(f"local model ready in {time.monotonic() - began:.1f} s", out)
    return server


def local_client(
    base_url: str | None = None, *, window: int | None = None
) -> ModelClient | None:
    """The OpenAI-compatible client of the bundled local model's server.

    With no `base_url`, only check that it can be made (before a server is
    started for it) and return None. `window` is the server's ``n_ctx``.

    Raises:
        ImportError: the ``local`` extra (which brings the OpenAI SDK) is
            not installed.
    """
    try:
        from turnfsm.providers import OpenAIModel
    except ImportError:
        raise ImportError(
            "the local model needs the local extra: pip install 'turnfsm[local]'"
        ) from None
    if base_url is None:
        return None
    # llama-cpp-python's server takes a JSON schema as a grammar through
    # `json_object` (its `json_schema` mode is not the OpenAI one).
    return OpenAIModel(
        model="local",
        base_url=base_url,
        structured_output="json_object",
        context_window=window,
        tool_choice="auto",
    )


async def run_and_close(agent: Agent, task: str) -> RunResult:
    """Run `task`, then close the model's connections (if it has `close()`)."""
    try:
        return await agent.run(task)
    finally:
        await close_model(agent.driver)


async def close_model(driver: Driver) -> None:
    """Close the driver's model's connections (if it has ``close()``)."""
    close = getattr(driver.model, "close", None)
    if close is not None:
        with anyio.CancelScope(shield=True):
            await close()


@contextlib.asynccontextmanager
async def cli_store(
    spec: str | None, own: SessionStore | None
) -> AsyncIterator[SessionStore]:
    """The store a command uses (`spec`, else the agent's `own`, else the CLI's).

    Closed on exit, unless it is the agent's own.
    """
    store = own if spec is None and own is not None else open_cli_store(spec)
    try:
        yield store
    finally:
        if store is not own:
            with anyio.CancelScope(shield=True):
                await close_store(store)


async def load_cli_session(
    store: SessionStore, session_id: str, *, seconds: float | None = None
) -> Session:
    """`session_id` from `store`; a missing one names the store and close ids.

    A store of your agent's (``--agent``) may take its `store_timeout`
    (`seconds`) to answer.

    Raises:
        SessionNotFound: no such session (with suggestions).
        StoreUnusable: the store did not answer within `seconds`.
    """
    from turnfsm.cli._sessions import not_found

    try:
        return await read_session(store, session_id, seconds=seconds, must_exist=True)
    except SessionNotFound as exc:
        raise await not_found(exc, store) from None


def console_for(out: TextIO) -> ConsoleHook:
    """The hook a command prints a run with: phases, tools, and the replies.

    On a terminal, a live status line too (see `ConsoleHook`).
    """
    return ConsoleHook(out, replies=True)


def run_task(
    task: str,
    options: AgentOptions,
    *,
    session_id: str | None = None,
    out: TextIO | None = None,
) -> int:
    """Run `task` with the agent `options` name; print it as it happens.

    The session is kept in ``--store`` (else your agent's own store, unless
    it is a memory store; else ``TURNFSM_STORE``, else the SQLite file in the
    user data directory); `session_id` continues a stored session.

    Returns 0 when the run is done, 1 when it failed, 3 when it paused (it
    waits for an answer: ``turnfsm approve``), 2 when it could not start,
    130 when Ctrl-C interrupted it.
    """
    stream = out or sys.stdout
    try:
        if not task.strip():  # named as the command line calls it
            raise ConfigError("task", task, "what the agent should do (it is blank)")
        if options.model == "local":
            # A store that cannot be used, or a session the run cannot go on
            # with, is named before the local model is started for nothing
            # (it takes seconds).
            run_async(_check_session, options.store, session_id)
        with open_driver(options) as (driver, own):
            result, place, session = run_async(
                _run, driver, own, task, options, session_id, stream
            )
    except Crashed as crash:
        return crash.report(stream)
    except StoreStopped as stopped:
        return stopped.report("turnfsm run", options, stream, sys.stderr)
    except REPORTED as exc:
        print(f"turnfsm run: {cli_words(exc, options)}", file=sys.stderr)
        return 2
    if result is None:  # Ctrl-C: the run is logged interrupted
        resume = _resume_command(session, options)
        return report_interrupted(session, place, options, stream, resume=resume)
    return report_result(result, place, options, stream)


async def _check_session(spec: str | None, session_id: str | None) -> None:
    """Open the store `spec` names; refuse `session_id` if a run cannot go on it.

    Raises:
        SessionNotFound: no such session (with suggestions).
        SessionBusy: the session has an open run (paused, or unfinished), as
            the run would be refused.
    """
    async with cli_store(spec, None) as store:
        if session_id is None:
            return
        session = await load_cli_session(store, session_id)
        if waiting := session.open_runs():
            raise SessionBusy(session.id, run_id=waiting[-1].run_id)


def _resume_command(session_id: str, options: AgentOptions) -> str:
    """The `turnfsm resume` that carries on the run of `session_id`."""
    return shlex.join(["turnfsm", "resume", session_id, *options.flags()])


def _abandon_command(session_id: str, options: AgentOptions) -> str:
    """The `turnfsm abandon` that ends the run of `session_id`."""
    return shlex.join(["turnfsm", "abandon", session_id, *options.store_flags()])


@final
class Crashed(Exception):
    """A run that began and crashed on an exception: its log says so (internal).

    Not a run that could not start (exit status 2): the command names the
    session that keeps it, and the exception with its traceback, since it
    came from code of yours (a model client, a tool wrapper, a hook, a
    store) or a bug.
    """

    def __init__(self, cause: Exception, session_id: str, place: str) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.session_id = session_id
        self.place = place

    def report(self, out: TextIO, err: TextIO | None = None) -> int:
        """Print what crashed and where the run is kept; return 1 (failed).

        The traceback goes to `err` (None: standard error).
        """
        import traceback

        traceback.print_exception(self.cause, file=err or sys.stderr)
        print(f"\nsession {self.session_id} stored in {self.place}", file=out)
        print(
            f"run failed: it crashed on {type(self.cause).__name__}: "
            f"{_checks.message_of(self.cause)} (the traceback is on standard error)",
            file=out,
        )
        return 1


@final
class StoreStopped(Exception):
    """A run that began and stopped because its store could not be used (internal).

    Its log could not be written on: the command names the session, so the
    run can be carried on once the store works again (or seen where another
    process took it over; or, removed under it, is gone). `store` is where
    the run was kept.
    """

    def __init__(
        self,
        cause: StoreUnusable | LeaseLost | SessionConflict,
        session_id: str,
        store: SessionStore,
    ) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.session_id = session_id
        self.store = store

    def report(
        self,
        name: str,
        options: AgentOptions,
        out: TextIO,
        err: TextIO,
        *,
        resumable: bool = True,
    ) -> int:
        """Print the store's error and how to carry the run on; return 1.

        A run whose session another process took over (or wrote to) is
        carried on, or was ended, there: the words say where to see what it
        did (``sessions show`` takes the store, and no agent option). A run
        whose session was removed under it has nothing left to carry on. A
        run `turnfsm resume` cannot carry on (the demo's: its agent is no
        option's) is told how to end it instead.
        """
        place = where(self.store)
        cause = self.cause
        if isinstance(cause, SessionConflict) and not _removed(cause):
            # The run began, and may have run tools: not to be run again.
            said = (
                f"session {cause.session_id!r} changed under this run: another "
                f"writer appended to its log (version {cause.actual}, where the "
                f"run expected {cause.expected}), and nothing more of the run "
                "was written"
            )
        else:
            said = cli_words(self.cause, options)
        print(f"{name}: {said}", file=err)
        if _removed(self.cause):
            print(f"\nsession {self.session_id} was in {place}", file=out)
            print(
                "run stopped: its session was removed from the store while it "
                "ran (turnfsm sessions rm); nothing more of it is kept",
                file=out,
            )
            return 1
        print(f"\nsession {self.session_id} stored in {place}", file=out)
        if not isinstance(self.cause, StoreUnusable):
            show = show_command(self.session_id, self.store, options)
            print(
                f"run stopped: {_taken_words(self.cause)}; see what it did: {show}",
                file=out,
            )
            return 1
        what, command = (
            ("carry it on", "resume") if resumable else ("end it", "abandon")
        )
        then = shlex.join(["turnfsm", command, self.session_id, *options.flags()])
        print(
            "run stopped where its store failed; once the store works again, "
            f"{what}: {then}",
            file=out,
        )
        return 1


def _taken_words(cause: LeaseLost | SessionConflict) -> str:
    """What another process did to a run's session, as `cause` tells it."""
    if isinstance(cause, SessionConflict):  # a store that keeps no leases
        return "another process wrote to its session while it ran"
    if cause.holder is not None:
        # It holds the lease: it goes on with the run, or is ending it.
        return "another process took its session over"
    return (
        "another process took its session over and has let it go: it ended the "
        "run (finished or abandoned it), or removed the session"
    )


def show_command(session_id: str, store: SessionStore, options: AgentOptions) -> str:
    """The ``turnfsm sessions show`` of `session_id`, kept in `store`.

    With the ``--store`` it needs: the one given, or your agent's own store
    (``sessions show`` takes no agent option) unless it is the default one.
    """
    given = store_option(store, options.store)
    return shlex.join(["turnfsm", "sessions", "show", session_id, *given])


def raise_if_crashed(
    exc: Exception, session: Session, started: int, store: SessionStore
) -> None:
    """Raise `Crashed` if `exc` ended a run of `session`'s from `started` on.

    `started` is the index among its runs of the run that went on, or their
    count before a new one; `store` is where it is kept. A run that crashes
    is logged failed with `RunCrashed`, then its exception propagates; an
    error raised before the run began (a setting, a session another process
    holds) is left as it is. A run that began and whose store then could not
    be used, or whose session another process then took over, wrote to or
    removed, raises `StoreStopped`.
    """
    if isinstance(exc, BaseExceptionGroup):  # the Ctrl-C watch's task group
        leaves = _leaves(exc)
        if len(leaves) == 1 and isinstance(leaves[0], Exception):
            exc = leaves[0]
    if any(isinstance(run.error, RunCrashed) for run in session.runs[started:]):
        raise Crashed(exc, session.id, where(store)) from None
    if len(session.runs) > started and (
        isinstance(exc, StoreUnusable | LeaseLost)
        or (isinstance(exc, SessionConflict) and not exc.loading)
    ):
        raise StoreStopped(exc, session.id, store) from None


def _removed(exc: Exception) -> TypeGuard[SessionConflict]:
    """Whether `exc` says the session was removed while the run wrote to it."""
    return (
        isinstance(exc, SessionConflict)
        and not exc.loading
        and exc.actual == 0 < exc.expected
    )


T = TypeVar("T")


def run_async(func: Callable[..., Awaitable[T]], *args: Any) -> T:
    """`anyio.run` for a command: an error a task group wrapped is raised as itself.

    A task group raises what failed inside it in an `ExceptionGroup`; a
    command reports the one error it holds (a typed turnfsm error, say) on
    one line, as it would had no task group been there. A group of several
    errors is raised as it is.
    """
    try:
        return anyio.run(func, *args)
    except BaseExceptionGroup as group:
        leaves = _leaves(group)
        if len(leaves) == 1:
            raise leaves[0] from None
        raise


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    found: list[BaseException] = []
    for exc in group.exceptions:
        found += _leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc]
    return found


def cli_words(exc: BaseException, options: AgentOptions | None = None) -> str:
    """`exc`'s message, its advice in the options a command line user can change.

    A run whose pinned messages cannot fit is told to raise ``--window`` or
    lower ``--max-tokens`` (pin rules are set only in code: in your own
    agent, given with ``--agent``, where the error's own advice holds). A
    session another process holds is taken over with ``turnfsm resume
    SESSION ... --force``, with the agent and store options the command was
    given (``turnfsm run`` takes none over); one another
    process wrote to since the command read it is read anew by running the
    command again. A run out of model calls is told to raise ``--max-turns``,
    one whose model call timed out ``--model-timeout``.
    """
    flags = options.flags() if options else []
    if isinstance(exc, SessionBusy) and open_run_only(exc):
        return open_run_words(exc, flags, "then run the task again")
    if isinstance(exc, SessionBusy):
        take = shlex.join(["turnfsm", "resume", exc.session_id, *flags, "--force"])
        return busy_words(exc, f"`{take}`")
    if isinstance(exc, SessionConflict):  # a command reads the session anew
        if exc.actual == 0 and not exc.loading:  # removed: nothing to run again
            return str(exc)
        said = str(exc).split(" - reload the session and retry")[0]
        if exc.expected == 0:  # a command opens what it runs on: another began
            said = f"session {exc.session_id!r} was started by another writer"
        return f"{said} - run it again"
    if isinstance(exc, PinnedTooLarge) and options is not None and not options.agent:
        budget = options.max_tokens or DEFAULT_MAX_TOKENS
        flag = _window_flag(options, exc.limit)
        fix = f"raise {flag} or lower --max-tokens" if flag else "lower --max-tokens"
        where = (
            f"on or over the {exc.line}-token emergency line of the "
            f"{exc.limit}-token window"
            if exc.line
            else f"over the {exc.limit}-token window"
        )
        return (
            f"pinned messages do not fit: {exc.pinned} pinned tokens plus "
            f"{exc.reserved} reserved (the reply budget, --max-tokens {budget}, and "
            f"the system prompt and tool schemas) is {exc.used}{exc.counted_as}, "
            f"{where}: {fix}"
        )
    if (
        isinstance(exc, WindowTooLarge)
        and options is not None
        and options.model == "local"
        and exc.field == "--window"
    ):
        return (
            f"--window={exc.value} is larger than the local server's window of "
            f"{exc.window} tokens (--n-ctx): give at most {exc.window}, leave "
            f"--window unset, or raise --n-ctx"
        )
    if (
        isinstance(exc, ContextExceeded)
        and exc.provider_message
        and options is not None
        and not options.agent
    ):
        return _option_words(explain(exc))
    if isinstance(exc, MaxTurnsExceeded) and options is not None and not options.agent:
        said = (
            f"the run reached --max-turns {exc.max_turns} without a final answer: "
            "raise --max-turns or check the tools for a loop"
        )
        if options.model == "local" and options.max_turns is None:
            said += (
                f" (the local model's default is {LOCAL_MAX_TURNS}: given a "
                "tool's result, the tiny model seldom answers, it calls the "
                "tool again)"
            )
        return said
    if (
        isinstance(exc, ProviderError)
        and exc.kind == "max_tokens"  # a reply cut off by its budget
        and options is not None
        and not options.agent
    ):
        return explain(exc).replace("max_output_tokens", "--max-tokens")
    if isinstance(exc, ProviderError) and options is not None and not options.agent:
        # A call that timed out: its advice names the option that sets it.
        return explain(exc).replace("model_timeout=", "--model-timeout ")
    return explain(exc)


_OPTION_WORDS: Final = (
    (
        "context_window to the model's real window",
        "--window to the model's real window",
    ),
    ("real window as its context_window", "real window as --window"),
    ("reply budget (max_output_tokens)", "reply budget (--max-tokens)"),
)
"""The library's settings in a refused request's advice, as the options say them."""


def _option_words(said: str) -> str:
    """`said` with the window and reply budget settings named as options.

    A request the server refused as too long was sent because the run's
    window was larger than the server's: on the command line the window is
    ``--window`` (a server that does not tell its own is given ``--n-ctx``,
    or 4096, otherwise) and the reply budget ``--max-tokens``.
    """
    for library, option in _OPTION_WORDS:
        said = said.replace(library, option)
    return said


def _window_flag(options: AgentOptions, window: int) -> str | None:
    """The option that makes a run's `window` larger (None: the model's own).

    The local server's window is ``--n-ctx`` (``--window`` only narrows it);
    a URL server that does not tell its window is given ``--n-ctx`` unless
    ``--window`` is; a known model's window is its own.
    """
    n_ctx = options.n_ctx or options.window or DEFAULT_N_CTX
    if options.model == "local":
        given = options.window
        return "--window" if given is not None and given < n_ctx else "--n-ctx"
    if options.window is not None:
        return "--window"
    if (options.model or "").startswith(("http://", "https://")) and window == n_ctx:
        return "--n-ctx"
    return None


def open_run_only(exc: SessionBusy) -> bool:
    """Whether `exc` is a session's open run that no live process holds."""
    return exc.run_id is not None and (exc.owner is None or exc.alive is None)


def open_run_words(exc: SessionBusy, flags: Sequence[str], then: str) -> str:
    """`exc` (an open run, `open_run_only`) in commands: answer or resume it, `then`.

    The library says "resume or abandon it" in Python; a paused run refuses
    resume, so the words name the commands that answer it too.
    """
    target = shlex.join([exc.session_id, *flags])
    return (
        f"session {exc.session_id!r} has an open run {exc.run_id!r}: answer it "
        f"with turnfsm approve|reject|abandon {target} if it is paused, or "
        f"carry it on with turnfsm resume {target} if its process died; {then}"
    )


async def _run(
    driver: Driver,
    own: SessionStore | None,
    task: str,
    options: AgentOptions,
    session_id: str | None,
    out: TextIO,
) -> tuple[RunResult | None, str, str]:
    """Run `task`; None for a run that Ctrl-C interrupted (it is logged so)."""
    try:
        async with cli_store(options.store, own) as store:
            if session_id is None:
                session = Session(store=store)
            else:
                session = await load_cli_session(
                    store, session_id, seconds=driver.store_timeout
                )
            started = len(session.runs)
            left = left_open_words(
                session.id,
                where(store),
                options,
                resume=_resume_command(session.id, options),
                lease_ttl=driver.lease_ttl,
            )
            console = console_for(out)
            try:
                result = await interruptible(
                    lambda: driver.run(task, session=session, hooks=[console]),
                    out,
                    left=left,
                    console=console,
                )
            except Exception as exc:
                raise_if_crashed(exc, session, started, store)
                raise
            return result, where(store), session.id
    finally:
        await close_model(driver)


async def interruptible(
    run: Callable[[], Awaitable[RunResult]],
    out: TextIO,
    *,
    left: str | None = None,
    console: ConsoleHook | None = None,
) -> RunResult | None:
    """Await `run()`; None when Ctrl-C interrupted it (the run logs itself so).

    The first Ctrl-C (or SIGTERM, or SIGHUP) cancels the run, which keeps
    what it finished; a second exits the process at once (status 130),
    printing `left` first (`left_open_words`: the session and how to go on).
    The notices go through `console`, the run's `ConsoleHook` printing to
    `out`, when it has one: above its live status line, which a second
    Ctrl-C stops (else the terminal is left with no cursor). Signals reach
    the main thread only: elsewhere (`turnfsm view` answers its page's form
    in a thread of its own) the run is awaited as it is.
    """
    if threading.current_thread() is not threading.main_thread():
        return await run()
    result: RunResult | None = None
    run_scope = anyio.CancelScope()
    say = _Notices(out, console)
    async with anyio.create_task_group() as watchers:
        watchers.start_soon(_on_ctrl_c, run_scope, say, left)
        with run_scope:
            result = await run()
        watchers.cancel_scope.cancel()
    return result


@attrs.frozen
class _Notices:
    """Prints what Ctrl-C does: through the run's console, else to `out`."""

    out: TextIO
    console: ConsoleHook | None

    def __call__(self, text: str) -> None:
        if self.console is None:
            _say(text, self.out)
            return
        for line in text.split("\n"):
            self.console.print(line)

    def stop(self) -> None:
        """Stop the console's live status line (the process exits at once)."""
        if self.console is not None:
            self.console.stop()


async def _on_ctrl_c(
    run_scope: anyio.CancelScope, say: _Notices, left: str | None
) -> None:
    """The first Ctrl-C interrupts the run (it is logged); a second exits at once.

    SIGTERM (``kill``, a container or a service stopped) and SIGHUP (its
    terminal closed, its ssh connection dropped) interrupt it the same way:
    the run ends ``interrupted`` in the log and lets its session go, so it
    can be resumed at once. A terminal that hung up takes no more output:
    the run is interrupted all the same. A signal ignored when the run
    begins (``nohup``) is left so.
    """
    with anyio.open_signal_receiver(*stop_signals()) as signals:
        async for signum in signals:
            if run_scope.cancel_called:
                if left is not None:
                    say(f"\n{left}")
                say.stop()
                os._exit(INTERRUPTED_STATUS)
            again = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
            say(
                "\ninterrupting: the run keeps what it finished "
                f"({again} again to exit at once)"
            )
            run_scope.cancel()


def _say(line: str, out: TextIO) -> None:
    """Print `line` unless the stream is gone (a closed terminal, ``| head``)."""
    with contextlib.suppress(OSError, ValueError):
        print(line, file=out, flush=True)


def left_open_words(
    session_id: str,
    place: str,
    options: AgentOptions,
    *,
    resume: str | None,
    lease_ttl: float,
) -> str:
    """What a run left open by a second Ctrl-C is, and how to go on with it.

    The process exits without ending the run: the run stays open in the
    log, its session held by the process's lease until it runs out.
    `resume` is as `report_interrupted`'s.
    """
    if place == IN_MEMORY:
        return f"exited at once; no command can go on with it: {_GONE}"
    abandon = _abandon_command(session_id, options)
    said = (
        f"exited at once: session {session_id} stored in {place}: its run stays "
        f"open, held for up to {lease_ttl:g} s (its lease); then "
    )
    if resume is None:
        return said + f"end it with: {abandon}"
    return said + f"go on with: {resume} (or end it: {abandon})"


def report_interrupted(
    session_id: str,
    place: str,
    options: AgentOptions,
    out: TextIO,
    *,
    resume: str | None,
    command: str = "turnfsm run",
) -> int:
    """Print where an interrupted run is kept and how to go on; return 130.

    `resume` is the command that carries the run on (None: none does, only
    `turnfsm abandon` ends it). Output that cannot be written (its terminal
    closed: SIGHUP) changes nothing: the run is interrupted, and logged so
    (see `write_end`).
    """
    abandon = _abandon_command(session_id, options)
    if place == IN_MEMORY:
        said = f"run interrupted; no command can go on with it: {_GONE}"
    elif resume is None:
        said = f"run interrupted: what it finished is kept; end it with: {abandon}"
    else:
        said = (
            f"run interrupted: what it finished is kept; go on with: {resume} "
            f"(or end it: {abandon})"
        )
    write_end(f"\nsession {session_id} stored in {place}\n{said}\n", out, command)
    return INTERRUPTED_STATUS


def report_result(
    result: RunResult,
    place: str,
    options: AgentOptions,
    out: TextIO,
    *,
    abandoned: bool = False,
    command: str = "turnfsm run",
) -> int:
    """Print how a run ended (the reply itself was printed as it came).

    Returns 0 (done, or `abandoned` as asked), 1 (failed or cancelled) or 3
    (paused, itself or a sub-agent of its), whether or not `out` takes the
    words (see `write_end`).
    """
    said = io.StringIO()
    status = _report_result(result, place, options, said, abandoned=abandoned)
    write_end(said.getvalue(), out, command)
    return status


def write_end(text: str, out: TextIO, command: str) -> None:
    """Write how a run ended (`text`: its session, the next command) to `out`.

    A reader gone (``| head``) ends the command quietly, as everywhere: the
    `BrokenPipeError` goes on. Any other failure (``> /dev/full``) would
    lose the session's id and what to do next, which the run's log cannot
    tell: they go to standard error, after what failed, and the command
    keeps the run's exit status. A terminal that hung up takes neither.
    """
    try:
        out.write(text)
        out.flush()
    except BrokenPipeError:
        raise
    except (OSError, ValueError, AttributeError) as exc:  # None: stdout closed
        stdout_to_devnull()
        closed = not isinstance(exc, OSError) or exc.errno == errno.EBADF
        failed = "it is closed" if closed else explain(exc)
        said = f"{command}: standard output failed ({failed}); how the run ended:"
        _say(f"{said}\n{text.lstrip()}".rstrip("\n"), sys.stderr)


def _report_result(
    result: RunResult,
    place: str,
    options: AgentOptions,
    out: TextIO,
    *,
    abandoned: bool = False,
) -> int:
    """Print how a run ended to `out`; see `report_result`.

    Returns 0 (done, or `abandoned` as asked), 1 (failed or cancelled) or 3
    (paused, itself or a sub-agent of its).
    """
    print(f"\nsession {result.session_id} stored in {place}", file=out)
    command = shlex.join([result.session_id, *options.flags()])
    if isinstance(result.error, SubagentWaiting):
        print(f"run {result.outcome}: {result.error}", file=out)
        if place == IN_MEMORY:
            print(f"no command can answer it: {_GONE}", file=out)
        else:
            print("answer it with: " + subagent_answer_hint(command), file=out)
        return 3
    if result.outcome == "paused":
        print_waiting(result, out)
        assert result.waiting is not None
        if place == IN_MEMORY:
            print(f"no command can answer it: {_GONE}", file=out)
        else:
            hint = answer_hint(result.waiting, command)
            print("answer it with: " + hint, file=out)
        return 3
    if abandoned:
        print(f"run {result.run_id} abandoned: {result.error}", file=out)
        return 0
    if not result.ok:
        said = result.error and cli_words(result.error, options)
        print(f"run {result.outcome}: {said}", file=out)
        return 1
    print(f"run done: {result.turns} model call(s), {_usage(result)}", file=out)
    return 0


_GONE = (
    "its store, memory:, ends with this command (keep the session in a file "
    "to go on with it later: --store FILE, or TURNFSM_STORE)"
)
"""Why a run kept in memory cannot be answered or carried on by a later command."""


def _usage(result: RunResult) -> str:
    """The run's token usage in words; never a count the provider did not give."""
    usage, calls, reported = result.usage, result.turns, result.reported_calls
    if reported == 0 and calls:
        return "token usage not reported by the provider"
    tokens = f"tokens {usage.describe()}"
    if reported is not None and reported < calls:
        return f"{tokens} (reported for {reported} of the {calls} calls)"
    return tokens


def print_waiting(result: RunResult, out: TextIO) -> None:
    """Print what a paused run waits on: its phase and tool calls."""
    waiting = result.waiting
    assert waiting is not None
    print(
        f"run {result.run_id} paused in {waiting.phase}, {waiting_for(waiting)}",
        file=out,
    )
    for call in waiting.calls:
        print(f"  {call.id}  {call_text(call.name, call.arguments)}", file=out)


def waiting_for(pause: Pause) -> str:
    """What `pause` waits for: ``waiting on 2 tool call(s):`` (listed next).

    A pause of a machine file of your own that takes only signals waits on
    no tool call: it waits ``for an answer`` (`answer_hint` says which).
    """
    if not pause.calls:
        return "waiting for an answer"
    return f"waiting on {len(pause.calls)} tool call(s):"


def answer_hint(pause: Pause, target: str) -> str:
    """How to answer `pause`: the commands that can, for the run `target` names.

    ``turnfsm approve`` and ``reject`` send a review of the tool calls; a
    pause that takes only signals (a machine file of your own) is answered
    from Python.
    """
    if pause.takes_review:
        return f"turnfsm approve|reject|abandon {target}"
    return (
        f"Agent.resume from Python, with one of {', '.join(pause.answers)}; "
        f"or end it: turnfsm abandon {target}"
    )


def subagent_answer_hint(target: str) -> str:
    """How to answer a run stopped by its sub-agent's pause, `target` naming it.

    The answer goes to the paused sub-agent, then the run goes on: it is
    answered, not resumed (``turnfsm resume`` refuses it).
    """
    return f"turnfsm approve|reject {target}"


def call_text(name: str, arguments: Any) -> str:
    """``name({"arg": value})``: a tool call as a person reads it."""
    return f"{name}({json.dumps(arguments, ensure_ascii=False, sort_keys=True)})"
