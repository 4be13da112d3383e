"""Ports to model APIs: the `ModelClient` protocol and its request/response values."""

from __future__ import annotations

from turnfsm.providers._protocol import (
    ModelClient,
    ModelRequest,
    ModelResponse,
    ToolSchema,
)

__all__ = ["ModelClient", "ModelRequest", "ModelResponse", "ToolSchema"]
