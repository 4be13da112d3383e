"""The `Agent` façade: a driver plus the conversation it continues."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import os
import types
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from typing import (
    TYPE_CHECKING,
    Any,
    Final,
    Never,
    NoReturn,
    TypeVar,
    cast,
    final,
    overload,
)

import anyio
import attrs
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from turnfsm import _checks, _deprecated
from turnfsm.core import (
    ContextOverflowed,
    Event,
    ModelFailed,
    ModelReplied,
    OutputRejected,
)
from turnfsm.driver import (
    SUBAGENT_MAX_CHILDREN,
    SUBAGENT_MAX_DEPTH,
    Driver,
    RunControl,
    RunResult,
    Tool,
    context_hint,
    read_session,
    subagent_tool,
)
from turnfsm.errors import ConfigError, OutputInvalid, ProviderError
from turnfsm.hooks import (
    Hook,
    ModelCallInfo,
    OutcomeInfo,
    TextDeltaInfo,
    TextDiscardedInfo,
)
from turnfsm.messages import Message
from turnfsm.persistence import (
    MemoryStore,
    Session,
    SessionStore,
    SQLiteStore,
    env_store,
    open_store,
)

__all__ = ["Agent", "RunStream"]

T = TypeVar("T")


class _Forward(Hook):
    """Forwards streamed text (or, without streaming, each reply) to a channel.

    A streamed answer that is rejected (it does not fit the run's output
    type, and is asked for again), or refused once it came (over the
    window, cut off at the server's window, withheld by a filter), is
    followed by a `TextDiscardedInfo`, as a broken-off attempt is: its
    pieces are no part of the answer.
    """

    def __init__(self, send: MemoryObjectSendStream[str | TextDiscardedInfo]) -> None:
        self.send = send
        self.streamed = False
        self.sent: list[str] = []  # the pieces of the attempt under way
        self.call: ModelCallInfo | None = None

    def on_model_call_start(self, info: ModelCallInfo) -> None:
        if info.purpose == "turn":
            self.call = info
            self.sent.clear()

    def on_text_delta(self, info: TextDeltaInfo) -> None:
        self.streamed = True
        self.sent.append(info.text)
        self.send.send_nowait(info.text)

    def on_text_discarded(self, info: TextDiscardedInfo) -> None:
        self.sent.clear()
        self.send.send_nowait(info)

    def on_outcome(self, info: OutcomeInfo) -> None:
        event = info.event
        void: Exception | None = None
        if isinstance(event, OutputRejected):
            void = OutputInvalid(errors=event.errors)
        elif isinstance(event, ContextOverflowed | ModelFailed):
            # The reply came, and was refused: the run never takes it.
            void = ProviderError(event.error.message, kind=event.error.type)
        if void is not None and self.sent and self.call is not None:
            self.send.send_nowait(
                TextDiscardedInfo(
                    run_id=info.run_id,
                    turn=self.call.turn,
                    attempt=self.call.attempt,
                    text="".join(self.sent),
                    error=void,
                )
            )
        elif isinstance(event, ModelReplied) and not self.streamed:
            text = event.message.text
            if text:
                self.send.send_nowait(text)
        self.streamed = False
        self.sent.clear()


@final
class RunStream:
    """The text of a streamed run, piece by piece; `result` once it ended.

    Iterating it yields the text pieces only. A streamed attempt that fails
    after sending text and is retried streams again from the beginning, so
    those pieces come twice, and a structured answer that did not fit its
    output type is followed by the one asked for again; `pieces()` yields,
    between the two, the `TextDiscardedInfo` that says the pieces before it
    are void.
    """

    def __init__(
        self, receive: MemoryObjectReceiveStream[str | TextDiscardedInfo]
    ) -> None:
        self._receive = receive
        self._result: RunResult | None = None
        self._closed = False

    def __aiter__(self) -> AsyncIterator[str]:
        return cast("AsyncIterator[str]", _Pieces(self, text_only=True))

    def pieces(self) -> AsyncIterator[str | TextDiscardedInfo]:
        """Yield the text pieces, and a `TextDiscardedInfo` where some were void.

        A `TextDiscardedInfo` comes when a streamed attempt failed after
        sending text: its `text` is the pieces of that attempt, which are
        no part of any reply (drop what you showed of them); a retry then
        streams its reply from the beginning. It comes too after a
        structured answer that did not fit the run's output type (its
        `error` an `OutputInvalid` listing why), before the answer asked
        for again.

        Raises:
            ConfigError: the stream is read after its ``async with`` block
                ended (its pieces are gone then; `result` is kept).
        """
        return _Pieces(self, text_only=False)

    @property
    def result(self) -> RunResult:
        """The run's `RunResult`; available once the stream is exhausted.

        Raises:
            RuntimeError: the run has not ended yet.
        """
        if self._result is None:
            raise RuntimeError("the run has not ended yet: read the stream to its end")
        return self._result


@final
class _Pieces:
    """One reading of a `RunStream`: an iterator, not an async generator.

    A reader that stops early (a web client gone, the server closing its
    response) leaves nothing to finalise, where a generator left
    unfinished warns on trio and is closed late on asyncio.
    """

    __slots__ = ("_stream", "_text_only")

    def __init__(self, stream: RunStream, *, text_only: bool) -> None:
        self._stream = stream
        self._text_only = text_only

    def __aiter__(self) -> _Pieces:
        return self

    async def __anext__(self) -> str | TextDiscardedInfo:
        while True:
            if self._stream._closed:
                raise _misused(
                    "reading the stream after its async with block",
                    "a read inside the block",
                )
            try:
                piece = await self._stream._receive.receive()
            except anyio.EndOfStream:
                raise StopAsyncIteration from None
            if isinstance(piece, str) or not self._text_only:
                return piece


def _misused(how: str, fix: str) -> ConfigError:
    """The refusal of `run_stream` used `how`, saying how it is used."""
    return ConfigError(
        "run_stream",
        how,
        f"{fix}: async with agent.run_stream(...) as stream: "
        "async for text in stream: ... (then stream.result)",
    )


@final
class _StreamOpening(contextlib.AbstractAsyncContextManager[RunStream]):
    """What `Agent.run_stream` returns: the run starts in ``async with``, only."""

    __slots__ = ("_context", "_opener")

    def __init__(
        self, opener: Callable[[], contextlib.AbstractAsyncContextManager[RunStream]]
    ) -> None:
        self._opener = opener
        self._context: contextlib.AbstractAsyncContextManager[RunStream] | None = None

    async def __aenter__(self) -> RunStream:
        if self._context is not None:
            raise _misused("entered twice", "call run_stream once for each run")
        self._context = self._opener()
        return await self._context.__aenter__()

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: types.TracebackType | None,
    ) -> bool | None:
        assert self._context is not None  # entered
        return await self._context.__aexit__(kind, error, trace)

    # The ways a newcomer reaches for first: each refused, nothing started.
    def __aiter__(self) -> NoReturn:
        raise _misused("async for ... in agent.run_stream(...)", "async with first")

    def __await__(self) -> NoReturn:
        raise _misused("await agent.run_stream(...)", "async with, not await")

    def __enter__(self) -> NoReturn:
        raise _misused("with agent.run_stream(...)", "async with, not with")

    def __exit__(self, *exc_info: object) -> None:  # pragma: no cover - never entered
        return None


def _check_options(options: Mapping[str, Any]) -> None:
    """Name an unknown or missing `Driver` setting the way a user wrote it."""
    known = [f.alias or f.name for f in attrs.fields(Driver) if f.init]
    for name, value in options.items():
        if name not in known:
            raise _checks.unknown_argument(
                "Agent",
                name,
                value,
                known,
                context_hint(name, value),
                fallback="see Driver",
            )
    if "model" not in options:
        raise ConfigError(
            "model", None, "a ModelClient (model= is required)", missing=True
        )


def _running_loop() -> str | None:
    """Return the name of the event loop running in this thread, if any.

    `anyio.run` would refuse to start in one too, but with a bare
    `RuntimeError`; sniffio (when installed, as with trio) names any
    library, asyncio is checked directly.
    """
    try:
        import sniffio
    except ImportError:  # pragma: no cover - anyio no longer requires it
        pass
    else:
        try:
            return sniffio.current_async_library()
        except sniffio.AsyncLibraryNotFoundError:
            pass
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return None
    return "asyncio"


_OTHER_AGENT_NAMES: Final = {
    "invoke": "a task runs with agent.run_sync('...') (await agent.run('...') "
    "in async code); the conversation so far is the agent's session",
    "ainvoke": "a task runs with await agent.run('...'); the conversation so "
    "far is the agent's session",
    "stream": "a run streams with async with agent.run_stream('...') as "
    "stream: async for text in stream",
    "astream": "a run streams with async with agent.run_stream('...') as "
    "stream: async for text in stream",
    "run_streamed": "a run streams with async with agent.run_stream('...') as "
    "stream: async for text in stream",
}
"""Other agent frameworks' names for running an agent, and turnfsm's."""


def _driver_of(agent: object) -> object:
    """An `Agent`'s driver; anything else as it is (the driver checks it)."""
    return agent.driver if isinstance(agent, Agent) else agent


@final
class Agent:
    """An LLM agent on the Turn FSM.

    Takes the same keyword arguments as `Driver` (model, tools, system_prompt,
    context, max_turns, hooks, ...) and keeps a `session`, so consecutive
    runs continue one conversation.

    Example:
        ```python
        agent = Agent(model=my_model, tools=[search], system_prompt="Be brief.")
        result = agent.run_sync("What is in notes.md?")  # or: await agent.run(...)
        print(result.raise_for_failure().text)
        ```
    """

    __slots__ = ("driver", "session", "store")

    if not TYPE_CHECKING:  # a type checker names a wrong attribute itself

        def __getattr__(self, name: str) -> Any:
            # Called only for a name the agent does not have.
            hint = _OTHER_AGENT_NAMES.get(name)
            said = f"'Agent' object has no attribute {name!r}"
            raise AttributeError(f"{said}: {hint}" if hint else said)

    def __init__(
        self,
        *positional: Never,
        session: Session | None = None,
        store: SessionStore | str | os.PathLike[str] | None = None,
        **driver_options: Any,
    ) -> None:
        """Build the driver from `driver_options`; start or continue `session`.

        Args:
            *positional: None is taken: each setting is given by its name,
                ``Agent(model=...)`` (one given raises `ConfigError`).
            session: The conversation to continue (a new one if None).
            store: Where sessions live: a `SessionStore`, ``"memory:"``, a
                file path or ``"sqlite:///PATH"`` (an `SQLiteStore`), or a
                ``postgresql://`` URL (see `open_store`). If None:
                `session`'s own store, else the store the ``TURNFSM_STORE``
                environment variable names, else a private `MemoryStore`
                (sessions live as long as the process).
            **driver_options: The `Driver`'s settings.

        Raises:
            ConfigError: a setting is out of range or unknown (the field is
                named), `store` names no store, or another store than
                `session`'s own.
            WindowTooLarge: the context window is larger than the model's
                known one (see `turnfsm.providers.window_for`).
            StoreUnusable: the store's file cannot be used (see `open_store`).
            ImportError: a PostgreSQL URL without the ``postgres`` extra.
        """
        if positional:  # Agent(model): each setting is given by its name
            raise ConfigError(
                "Agent",
                positional[0],
                "keyword arguments (Agent(model=...)): Agent takes none by position",
            )
        _check_options(driver_options)
        if session is not None and not isinstance(session, Session):
            raise ConfigError("session", session, "a Session or None")
        children = driver_options.get("subagents")
        if isinstance(children, Mapping):  # an Agent runs on its driver
            driver_options["subagents"] = {
                name: _driver_of(c) for name, c in children.items()
            }
        self.driver = Driver(**driver_options)
        if store is not None:
            opened = open_store(store)
            if session is not None and not _same_store(session.store, opened):
                raise ConfigError(
                    "store",
                    store,
                    f"the store session {session.id!r} is kept in (its runs "
                    "would be written there, where this agent would not find "
                    "them): leave store out to use the session's own, or open "
                    "the session in this store (await Session.open(store, ID))",
                )
            store = opened
        elif session is not None:
            store = session.store
        else:
            named = env_store()
            store = named if named is not None else MemoryStore()
        self.store: SessionStore = store
        self.session = session if session is not None else Session(store=store)

    async def open_session(self, session_id: str) -> Session:
        """Reopen `session_id` from the agent's store and continue it.

        The following runs continue that conversation. The agent's own
        session is read again too: when another process wrote to it since
        (after a `SessionConflict`, this is the reload), the agent goes on
        from the log as it is now, in a new `Session`; else it keeps the one
        it has (a run of it going on in this process keeps it too).

        The store's read may take the agent's `store_timeout`.

        Raises:
            SessionNotFound: the store holds no session `session_id` (a
                conversation under an id of your choosing, a new user's, is
                started by a run on ``await Session.open(agent.store, id)``).
            StoreUnusable: the store did not answer within `store_timeout`.
        """
        seconds = self.driver.store_timeout
        current = self.session
        if current.id != session_id:
            self.session = await read_session(
                self.store, session_id, seconds=seconds, must_exist=True
            )
            return self.session
        if current.is_running or current.store is not self.store:
            return current
        stored = await read_session(self.store, session_id, seconds=seconds)
        if stored.version != current.version:
            self.session = stored
        return self.session

    @overload
    async def resume(
        self,
        session_id: str,
        run_id: str,
        event: Event | None = None,
        *,
        control: RunControl | None = None,
        output_type: type[T],
        force: bool = False,
    ) -> RunResult[T]: ...

    @overload
    async def resume(
        self,
        session_id: str,
        run_id: str,
        event: Event | None = None,
        *,
        control: RunControl | None = None,
        output_type: Any = None,
        force: bool = False,
    ) -> RunResult[Any]: ...

    async def resume(
        self,
        session_id: str,
        run_id: str,
        event: Event | None = None,
        *,
        control: RunControl | None = None,
        output_type: Any = None,
        force: bool = False,
    ) -> RunResult[Any]:
        """Continue a paused run with the answer it waits for (see `Driver.resume`).

        Works from a fresh `Agent` (another process) on the same store: the
        session is loaded and the run rebuilt from its log. `output_type`
        is the run's (default: the agent's): a run given one by
        ``run(..., output_type=T)`` is resumed with the same. `force` takes
        the session over from a process that holds it (its lease is live)
        but is known to be gone.

        Example:
            ```python
            async def clean_up(agent: Agent) -> RunResult:
                result = await agent.run("delete the temp files")
                if result.outcome == "paused":  # the approval machine asks first
                    result = await agent.resume(
                        result.session_id,
                        result.run_id,
                        ToolCallsReviewed.approve_all(),
                    )
                return result
            ```
        """
        session = await self.open_session(session_id)
        return await self.driver.resume(
            session,
            run_id,
            event,
            control=control,
            output_type=output_type,
            force=force,
        )

    async def compact(
        self, session_id: str | None = None, *, force: bool = False
    ) -> RunResult:
        """Compact a stored session now, outside any run (see `Driver.compact`).

        The operator's ``/compact``: one pass of the agent's context manager
        over the session's history (default: the agent's session), logged
        as a run of its own. Twice in a row, the second changes nothing.
        `force` takes over the lease of a process that died mid-pass.

        Raises:
            SessionNotFound: the store holds no session `session_id` (or the
                agent's own session has not run yet): nothing is written.

        Example:
            ```python
            async def compact_now(agent: Agent, session_id: str) -> None:
                await agent.compact(session_id)
                session = await agent.open_session(session_id)
                (record,) = session.runs[-1].compactions
                print(record.verdict, record.tokens_before, "->", record.tokens_after)
            ```
        """
        session = (
            self.session if session_id is None else await self.open_session(session_id)
        )
        return await self.driver.compact(session, force=force)

    async def abandon(
        self,
        session_id: str,
        run_id: str,
        *,
        reason: str = "abandoned",
        force: bool = False,
    ) -> RunResult:
        """End a paused or unfinished run as failed (see `Driver.abandon`).

        `force` takes the session over from a process that holds it (its
        lease is live) but is known to be gone.
        """
        session = await self.open_session(session_id)
        return await self.driver.abandon(session, run_id, reason=reason, force=force)

    @overload
    async def run(
        self,
        input: str | Message | Iterable[Message],
        *,
        session: Session | None = None,
        control: RunControl | None = None,
        output_type: type[T],
    ) -> RunResult[T]: ...

    @overload
    async def run(
        self,
        input: str | Message | Iterable[Message],
        *,
        session: Session | None = None,
        control: RunControl | None = None,
        output_type: Any = None,
    ) -> RunResult[Any]: ...

    async def run(
        self,
        input: str | Message | Iterable[Message],
        *,
        session: Session | None = None,
        control: RunControl | None = None,
        output_type: Any = None,
    ) -> RunResult[Any]:
        """Run one task to a final answer or a typed failure (see `Driver.run`).

        `output_type` overrides the agent's own for this run: the answer is
        validated and read into `RunResult.output`.
        """
        return await self.driver.run(
            input,
            session=self.session if session is None else session,
            control=control,
            output_type=output_type,
        )

    async def start_durable(
        self,
        input: str | Message | Iterable[Message],
        *,
        client: Any,
        task_queue: str,
        session_id: str | None = None,
        run_id: str | None = None,
        options: Any = None,
    ) -> Any:
        """Start a durable run (deprecated: use `turnfsm.temporal.start_durable`).

        Needs the ``temporal`` extra and a worker serving this agent on
        `task_queue` (`turnfsm.temporal.create_worker`, or ``turnfsm
        worker``). The run continues `session_id` (default: the agent's
        session) in the workers' store; ``await run.result()`` waits for it.

        Args:
            input: The run's new messages.
            client: A connected ``temporalio.client.Client``.
            task_queue: The queue the workers serve.
            session_id: The session to continue (default: this agent's).
            run_id: The run's id (default: a fresh one).
            options: `turnfsm.temporal.DurableOptions` (timeouts, retries).

        Raises:
            SessionBusy: a durable run of the session is still open.
            ConfigError: a setting is not what it should be (named).
        """
        _deprecated.warn(
            "Agent.start_durable", "turnfsm.temporal.start_durable(agent, ...)"
        )
        # The one import of turnfsm.temporal from below it, until this
        # deprecated method goes.
        from turnfsm.temporal import start_durable

        return await start_durable(
            self,
            input,
            client=client,
            task_queue=task_queue,
            session_id=session_id,
            run_id=run_id,
            options=options,
        )

    def run_stream(
        self,
        input: str | Message | Iterable[Message],
        *,
        session: Session | None = None,
        control: RunControl | None = None,
        output_type: Any = None,
    ) -> contextlib.AbstractAsyncContextManager[RunStream]:
        """Run one task and stream the model's text as it arrives.

        Takes `run`'s arguments: with `output_type`, the pieces are the
        answer's JSON as it comes, and ``stream.result.output`` the value.

        Use it with ``async with``: the run starts in it, and the block
        ends when the run ends. The brain still sees one `ModelReplied` per
        model call; only the observers see the pieces. The model must have
        a ``stream()`` method (`OpenAIModel` and `AnthropicModel` do);
        otherwise each whole reply arrives as one piece.

        ``async for`` or ``await`` straight on ``agent.run_stream(...)``, or
        a plain ``with``, raises `ConfigError` showing the use below;
        nothing is started.

        Example:
            ```python
            async def show(agent: Agent) -> None:
                async with agent.run_stream("Summarise notes.md") as stream:
                    async for text in stream:
                        print(text, end="", flush=True)
                print(stream.result.text)
            ```
        """
        return _StreamOpening(
            functools.partial(
                self._stream,
                input,
                session=session,
                control=control,
                output_type=output_type,
            )
        )

    @contextlib.asynccontextmanager
    async def _stream(
        self,
        input: str | Message | Iterable[Message],
        *,
        session: Session | None,
        control: RunControl | None,
        output_type: Any,
    ) -> AsyncIterator[RunStream]:
        send, receive = anyio.create_memory_object_stream[str | TextDiscardedInfo](
            math.inf
        )
        stream = RunStream(receive)
        forward = _Forward(send)

        async def runner() -> None:
            async with send:
                stream._result = await self.driver.run(
                    input,
                    session=self.session if session is None else session,
                    control=control,
                    hooks=[forward],
                    output_type=output_type,
                )

        try:
            async with anyio.create_task_group() as group:
                group.start_soon(runner)
                yield stream
        except BaseExceptionGroup as group_error:
            # One failure (the run's, or the caller's own in the `async with`
            # body) surfaces as itself, as it would from `run()`.
            if len(group_error.exceptions) == 1:
                raise group_error.exceptions[0] from None
            raise
        finally:
            stream._closed = True
            receive.close()

    @overload
    def run_sync(
        self,
        input: str | Message | Iterable[Message],
        *,
        session: Session | None = None,
        control: RunControl | None = None,
        output_type: type[T],
        backend: str = "asyncio",
    ) -> RunResult[T]: ...

    @overload
    def run_sync(
        self,
        input: str | Message | Iterable[Message],
        *,
        session: Session | None = None,
        control: RunControl | None = None,
        output_type: Any = None,
        backend: str = "asyncio",
    ) -> RunResult[Any]: ...

    def run_sync(
        self,
        input: str | Message | Iterable[Message],
        *,
        session: Session | None = None,
        control: RunControl | None = None,
        output_type: Any = None,
        backend: str = "asyncio",
    ) -> RunResult[Any]:
        """Run from synchronous code: `anyio.run` around `run` (no second code path).

        Takes `run`'s arguments. The event loop ends with the call, so the
        model's connections are closed at the end (through its ``close()``,
        when it has one).

        Raises:
            ConfigError: it was called from async code, with an event loop
                already running in this thread (``await agent.run(...)``
                there instead); `session` is a session's id (shown opened
                from synchronous code); nothing was started or written.
        """
        running = _running_loop()
        if running is not None:
            raise ConfigError(
                "run_sync",
                running,
                "a call from synchronous code: run_sync cannot be called "
                f"from a running event loop (here: {running}); "
                "await agent.run(...) instead",
            )
        given: object = session  # typed a Session; code of yours may pass an id
        if isinstance(given, str) and given.strip():
            # `run` would show it opened with an await, which this code has not.
            raise ConfigError(
                "session",
                session,
                "a Session or None, not a session's id: session=anyio.run("
                f"Session.open, agent.store, {given!r}) (the stored session, "
                "or a new one under that id)",
            )
        return anyio.run(
            functools.partial(
                self._run_and_close,
                input,
                session=session,
                control=control,
                output_type=output_type,
            ),
            backend=backend,
        )

    async def _run_and_close(
        self,
        input: str | Message | Iterable[Message],
        *,
        session: Session | None,
        control: RunControl | None,
        output_type: Any,
    ) -> RunResult[Any]:
        try:
            return await self.run(
                input, session=session, control=control, output_type=output_type
            )
        finally:
            # The event loop ends with the call: let go of what is bound to it
            # (the model's connections; a store's pool, which reopens on use).
            # (The shipped stores need nothing: a store's connections close
            # with their event loop.)
            for release in (getattr(self.driver.model, "close", None),):
                if release is not None:
                    with anyio.CancelScope(shield=True):
                        await release()

    def as_tool(
        self,
        *,
        name: str,
        description: str,
        max_depth: int = SUBAGENT_MAX_DEPTH,
        max_children: int = SUBAGENT_MAX_CHILDREN,
    ) -> Tool:
        """Return a tool that hands a task to this agent, as a sub-agent.

        Give it to another agent's `tools`. Its model calls it with a
        ``task`` (the whole task: the sub-agent sees nothing else of the
        conversation); this agent runs the task to its end, with its own
        model, tools, window, context settings and machine, in a new session
        of the calling run's store, linked to the call (`ParentLink`;
        `child_sessions` lists a session's children). The caller gets this
        agent's final answer as the tool's result (its structured output,
        with an `output_type`, as JSON), never its transcript. A run that
        does not end with an answer is an error result naming
        `SubagentFailed`; past `max_depth` nested sub-agents, one naming
        `SubagentTooDeep`; past `max_children` sub-agents in one run, one
        naming `SubagentTooMany`. The caller's `RunResult.children_usage` sums
        what its sub-agents used. Cancelling the caller's run, or the call
        timing out, ends the sub-agent's (failed, `Cancelled`); interrupting
        it interrupts the sub-agent's.

        In a durable run (`turnfsm.temporal`) whose worker serves this agent
        too, the call runs it as a child workflow of the caller's, linked,
        limited and counted the same way; a pause waits in the child's
        workflow, answered on its own `DurableRun`. A worker that does not
        serve it runs it inside the tool's activity, unlinked.

        Args:
            name: The tool's name, as the model calls it.
            description: What the sub-agent does, for the model.
            max_depth: How deep sub-agents may nest (1: only a top-level
                run may call this tool).
            max_children: How many sub-agents one run may start with this
                tool (16 by default).

        Raises:
            ConfigError: `name` or `description` is empty, or `max_depth`
                or `max_children` is not an int ≥ 1.
            ToolError: `name` is not 1-64 of ``A-Z a-z 0-9 _ -``.

        Example:
            ```python
            reader = Agent(
                model=small_model,
                tools=[read_file],
                context=ContextManager(context_window=8_000),
            )
            lead = Agent(
                model=model,
                tools=[reader.as_tool(name="read", description="Read a file")],
            )
            ```
        """
        return subagent_tool(
            self.driver,
            name=name,
            description=description,
            max_depth=max_depth,
            max_children=max_children,
            store=self.store,
        )

    def new_session(self) -> Session:
        """Start a fresh conversation (in the agent's store) and return it."""
        self.session = Session(store=self.store)
        return self.session


def _same_store(kept: SessionStore, given: SessionStore) -> bool:
    """Whether `given` is the store `kept` is: the same object, file or server."""
    if kept is given:
        return True
    if isinstance(kept, SQLiteStore) and isinstance(given, SQLiteStore):
        return kept.path.resolve() == given.path.resolve()
    server = getattr(kept, "server", None)  # a PostgreSQL database, named
    return (
        type(kept) is type(given)
        and server is not None
        and server == getattr(given, "server", None)
    )
