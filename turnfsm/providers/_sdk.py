"""An SDK client bound to the event loop that uses it (the OpenAI, Anthropic models).

An SDK client keeps its connections bound to the event loop that opened
them: a client the model built is built again when another loop (a second
`anyio.run`, e.g. `Agent.run_sync`) uses the model, one client for each
thread (worker threads calling `Agent.run_sync` at once). A client passed in by the
caller is theirs to manage: it is used as it is, with the SDK's own retries
off (turnfsm's retry policy retries).
"""

from __future__ import annotations

import math
import ssl
import threading
from collections.abc import (
    AsyncGenerator,
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Mapping,
)
from contextlib import aclosing
from types import TracebackType
from typing import Any, Final, Generic, Protocol, Self, TypeVar, cast, final

import anyio
from anyio.lowlevel import current_token

from turnfsm._json import well_formed

__all__ = [
    "AFTER_STOP_WAIT",
    "LoopClient",
    "SDKModel",
    "each_event",
    "is_event_stream",
    "sent",
    "until_done",
    "whole_body",
    "without_bom",
]


class _Closable(Protocol):
    async def close(self) -> None: ...


C = TypeVar("C", bound=_Closable)


class _Slot(threading.local):
    """One thread's client, and the event loop it is bound to."""

    client: Any = None
    loop: object = None


@final
class LoopClient(Generic[C]):
    """The model's SDK client, for the event loop that calls `get`.

    Each thread keeps its own (a sync server's worker threads each run
    `Agent.run_sync` on an event loop of their own, at the same time): one
    thread's new loop, or its ``close()`` at the end of a run, never takes
    the client another thread's run is using.
    """

    __slots__ = ("_build", "_client", "_here", "_lock", "_owned", "_unused")

    def __init__(self, build: Callable[[], C], *, owned: bool) -> None:
        """Build the first client now; `owned`: the model built it (not the caller)."""
        self._build = build
        self._owned = owned
        self._client = build()
        self._unused: C | None = self._client  # the first loop's, when owned
        self._here = _Slot()
        self._lock = threading.Lock()

    @property
    def client(self) -> C:
        """The first client (no rebuild): for settings read once."""
        return self._client

    def get(self) -> C:
        """The client for the running event loop (rebuilt for a new one, if owned)."""
        if not self._owned:
            return self._client
        loop = current_token().native_token
        here = self._here
        if here.client is None or here.loop is not loop:
            with self._lock:
                first, self._unused = self._unused, None
            here.client = first if first is not None else self._build()
            here.loop = loop
        return cast(C, here.client)

    async def close(self) -> None:
        """Close this event loop's connections (an owned client is built anew)."""
        if not self._owned:
            await self._client.close()
            return
        here = self._here
        client, loop = here.client, here.loop
        here.client = here.loop = None
        if client is not None and loop is current_token().native_token:
            await client.close()


class SDKModel:
    """A model on an SDK client (`LoopClient`): closing it, ``async with`` it."""

    __slots__ = ()

    _sdk: LoopClient[Any]

    async def close(self) -> None:
        """Close the HTTP connections (a client passed in is closed for good).

        A client this model built is replaced by a fresh one, so the model
        stays usable, e.g. from a later event loop.
        """
        await self._sdk.close()

    async def __aenter__(self) -> Self:
        """Return the model; `__aexit__` closes it (see `close`)."""
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Close the model's connections, even in a block that was cancelled."""
        with anyio.CancelScope(shield=True):
            await self.close()


R = TypeVar("R")


async def sent(
    create: Callable[..., Awaitable[R]], options: dict[str, Any], **extra: Any
) -> R:
    """``create(**options, **extra)``: an SDK call that sends a request.

    Text decoded from bytes that were not UTF-8 (a file name, a tool's
    output) can hold lone surrogates, which the SDK cannot encode: such a
    request, refused before it was sent, goes again with U+FFFD in their
    place (`well_formed`). Only then is the request copied.
    """
    try:
        return await create(**options, **extra)
    except UnicodeEncodeError:
        return await create(**cast(dict[str, Any], well_formed(options)), **extra)


AFTER_STOP_WAIT: Final = 5.0
"""Seconds a stream is still read once its reply has said why it stopped.

What may still come then is bookkeeping, not generation: Anthropic's
``message_stop`` right after the ``message_delta`` that carries the stop
reason and the final usage; with OpenAI's ``include_usage``, the chunk of
usage right after the chunk with the ``finish_reason``, then ``[DONE]``.
A server sends them at once, so a well-behaved stream ends long before;
the wait bounds a server (a proxy, a gateway) that holds the connection
open after the reply, sending pings or nothing, which would otherwise hold
the run until its model timeout and have the whole reply asked for (and
billed) again. Five seconds leaves a loaded proxy time to pass the usage
on, and costs a hung stream no more than that.
"""

T = TypeVar("T")


async def until_done(
    events: AsyncIterable[T], done: Callable[[], bool]
) -> AsyncGenerator[T]:
    """Yield `events` until they end, or `AFTER_STOP_WAIT` seconds after `done()`.

    `done` is asked before each event is read: once it holds (the reply is
    whole), the events that arrive within the wait are still yielded (the
    usage that follows a stop), and the stream is then left unread. The
    caller closes it (its ``async with``), which drops a held connection.
    """
    events = aiter(events)
    deadline = math.inf
    while True:
        if deadline == math.inf and done():
            deadline = anyio.current_time() + AFTER_STOP_WAIT
        with anyio.CancelScope(deadline=deadline) as scope:
            try:
                event = await anext(events)
            except StopAsyncIteration:
                return
        if scope.cancelled_caught:
            return  # whole, and nothing more came in time
        yield event


_BOM: Final = b"\xef\xbb\xbf"
"""UTF-8's byte-order mark."""


def without_bom(response: Any) -> None:
    """Have `response`'s body read without a UTF-8 byte-order mark at its start.

    An event stream may begin with one, and its reader ignores it; the
    SDKs read it as part of the first line's field name, and so drop the
    first event (the OpenAI reply's first chunk of text, the Anthropic
    ``message_start``). `response` is the SDK stream's HTTP response,
    not read yet: its ``aiter_bytes`` (the decoded body, which the SDKs'
    event readers read) is wrapped. A mark split across reads is found too.
    """
    read: Callable[..., AsyncGenerator[bytes]] = response.aiter_bytes

    async def aiter_bytes(chunk_size: int | None = None) -> AsyncGenerator[bytes]:
        head: bytes | None = b""
        async with aclosing(read(chunk_size)) as chunks:
            async for chunk in chunks:
                if head is None:
                    yield chunk
                    continue
                head += chunk
                if len(head) < len(_BOM) and _BOM.startswith(head):
                    continue  # maybe a mark, split
                if rest := head.removeprefix(_BOM):
                    yield rest
                head = None
        if head:
            yield head  # a body shorter than a mark

    response.aiter_bytes = aiter_bytes


async def whole_body(
    response: Any,
    timed_out: Callable[..., BaseException],
    connection: Callable[..., BaseException],
) -> bytes:
    """Read the whole body of `response`, an SDK stream's HTTP response.

    A body read here, not by the SDK (one JSON body where a stream was
    asked for), fails as the SDK's own reads do: the HTTP library's timeout
    as the SDK's timeout error (`timed_out`), its other request errors (a
    connection that broke off mid-body, a body that does not decode), a TLS
    error or a stream that ended early as its `connection` error, each
    caused by the one raised, so that they are read as those of an
    unstreamed reply.
    """
    try:
        body: bytes = await response.aread()
    except Exception as exc:
        kinds = {kind.__name__ for kind in type(exc).__mro__}
        request = response.request
        if "TimeoutException" in kinds:
            raise timed_out(request=request) from exc
        if "RequestError" in kinds or isinstance(exc, _DROPPED):
            raise connection(request=request) from exc
        raise
    return body


_DROPPED: Final = (ssl.SSLError, anyio.EndOfStream)
"""What else the SDKs read as a connection error (their HTTP library's
errors are told by name: the SDKs ship their own copy of it)."""


def each_event(stream: Any, look: Callable[[Any], Any]) -> None:
    """Have `stream` read each server-sent event as `look` returns it.

    `stream` is an SDK's event stream (``AsyncStream``), not read yet; its
    reader gets, in place of each event it decodes, ``look(event)``: the
    same event, or one `look` builds in its place (of the event's own
    class), and `look` may raise. What the SDK alone cannot tell its caller
    is seen so: an event it would skip, the end marker it stops at.
    The SDK's own reader is wrapped, not re-read in a generator of ours: the
    SDK leaves its reader unclosed when an event fails, and a second
    generator left so would be one more for the event loop to finalize.
    A stream with no such reader (another version of the SDK) is left as
    it is: its events are read as the SDK reads them.
    """
    decoded: Callable[[], AsyncIterator[Any]] | None = getattr(
        stream, "_iter_events", None
    )
    if decoded is None:  # an SDK that reads its events otherwise: as it does
        return
    stream._iter_events = lambda: _Looked(decoded(), look)


@final
class _Looked:
    """The events of `events`, each as `look` returns it (see `each_event`)."""

    __slots__ = ("_events", "_look")

    def __init__(self, events: AsyncIterator[Any], look: Callable[[Any], Any]):
        self._events = events
        self._look = look

    def __aiter__(self) -> _Looked:
        return self

    async def __anext__(self) -> Any:
        return self._look(await anext(self._events))


def is_event_stream(headers: Mapping[str, str]) -> bool:
    """Whether a response's body is server-sent events (else one body).

    A server that ignores the request's ``stream`` (or a proxy's error)
    answers a streamed request with one JSON body; no content type at all
    is read as the stream asked for.
    """
    kind = headers.get("content-type", "")
    return not kind or kind.split(";")[0].strip().lower() == "text/event-stream"
