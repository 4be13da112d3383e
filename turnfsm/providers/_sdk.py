"""An SDK client bound to the event loop that uses it (the OpenAI, Anthropic models).

An SDK client keeps its connections bound to the event loop that opened
them: a client the model built is built again when another loop (a second
`anyio.run`, e.g. `Agent.run_sync`) uses the model, one client for each
thread (worker threads calling `Agent.run_sync` at once). A client passed in by the
caller is theirs to manage: it is used as it is, with the SDK's own retries
off (turnfsm's retry policy retries).
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable
from typing import Any, Generic, Protocol, TypeVar, cast, final

from anyio.lowlevel import current_token

from turnfsm._json import well_formed

__all__ = ["LoopClient", "sent"]


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
