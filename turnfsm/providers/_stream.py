"""Streaming replies: text as it arrives, then the whole response."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol, TypeAlias, final, runtime_checkable

import attrs

from turnfsm import _checks
from turnfsm.providers._protocol import ModelClient, ModelRequest, ModelResponse

__all__ = ["StreamDone", "StreamEvent", "StreamingModelClient", "TextDelta"]


@final
@_checks.keyword_checked
@attrs.frozen(kw_only=True)
class TextDelta:
    """A piece of the reply's text, as the model produced it."""

    text: str


@final
@_checks.keyword_checked
@attrs.frozen(kw_only=True)
class StreamDone:
    """The end of a stream: the assembled reply (tool calls, usage included)."""

    response: ModelResponse


StreamEvent: TypeAlias = TextDelta | StreamDone
"""What `StreamingModelClient.stream` yields."""


@runtime_checkable
class StreamingModelClient(ModelClient, Protocol):
    """A `ModelClient` that can also stream its reply.

    `stream` yields `TextDelta`s in order, then exactly one `StreamDone`
    whose response equals what `complete` would have returned. It raises the
    same `turnfsm.errors.ProviderError`s as `complete`.
    """

    def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        """Send `request` and yield the reply as it arrives."""
        ...
