"""An SDK client bound to the event loop that uses it (the OpenAI, Anthropic models).

An SDK client keeps its connections bound to the event loop that opened
them: a client the model built is built again when another loop (a second
`anyio.run`, e.g. `Agent.run_sync`) uses the model. A client passed in by the
caller is theirs to manage: it is used as it is, with the SDK's own retries
off (turnfsm's retry policy retries).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Generic, Protocol, TypeVar, cast, final

from anyio.lowlevel import current_token

from turnfsm._json import well_formed

__all__ = ["LoopClient", "sent"]


class _Closable(Protocol):
    async def close(self) -> None: ...


C = TypeVar("C", bound=_Closable)


@final
class LoopClient(Generic[C]):
    """The model's SDK client, for the event loop that calls `get`."""

    __slots__ = ("_build", "_client", "_loop", "_owned")

    def __init__(self, build: Callable[[], C], *, owned: bool) -> None:
        """Build the first client now; `owned`: the model built it (not the caller)."""
        self._build = build
        self._owned = owned
        self._client = build()
        self._loop: object = None

    @property
    def client(self) -> C:
        """The client as it is (no rebuild): for settings read once."""
        return self._client

    def get(self) -> C:
        """The client for the running event loop (rebuilt for a new one, if owned)."""
        loop = current_token().native_token
        if self._loop is not None and loop is not self._loop and self._owned:
            self._client = self._build()
        self._loop = loop
        return self._client

    async def close(self) -> None:
        """Close the connections; an owned client is replaced by a fresh one."""
        await self.get().close()
        if self._owned:
            self._client = self._build()
            self._loop = None


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
