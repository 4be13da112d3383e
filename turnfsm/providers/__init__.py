"""Ports to model APIs: the `ModelClient` protocol and real clients.

`OpenAIModel` (OpenAI and any OpenAI-compatible server: vLLM, llama.cpp,
Ollama), `AnthropicModel`, and `LlamaServer` (a local llama.cpp server on a
small GGUF model) load lazily, so their SDKs are only needed when used:
``pip install 'turnfsm[openai]'``, ``'turnfsm[anthropic]'``, ``'turnfsm[local]'``.

`known_window` gives a known model's context window (from the catalogue
bundled with ``genai-prices``), `server_window` a llama.cpp server's, and
`window_for` the window a run on a model works in.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from turnfsm._lazy import lazy_getattr
from turnfsm.providers._protocol import (
    ModelClient,
    ModelRequest,
    ModelResponse,
    OutputSpec,
    ToolSchema,
)
from turnfsm.providers._stream import (
    StreamDone,
    StreamEvent,
    StreamingModelClient,
    TextDelta,
)
from turnfsm.providers._windows import (
    FALLBACK_WINDOW,
    ModelPrices,
    known_prices,
    known_window,
    server_window,
    window_for,
)

if TYPE_CHECKING:
    from turnfsm.providers._anthropic import AnthropicModel
    from turnfsm.providers._local import LlamaServer, local_model_path
    from turnfsm.providers._openai import OpenAIModel

__all__ = [
    "FALLBACK_WINDOW",
    "AnthropicModel",
    "LlamaServer",
    "ModelClient",
    "ModelPrices",
    "ModelRequest",
    "ModelResponse",
    "OpenAIModel",
    "OutputSpec",
    "StreamDone",
    "StreamEvent",
    "StreamingModelClient",
    "TextDelta",
    "ToolSchema",
    "known_prices",
    "known_window",
    "local_model_path",
    "server_window",
    "window_for",
]

_LAZY = {
    "AnthropicModel": "turnfsm.providers._anthropic",
    "LlamaServer": "turnfsm.providers._local",
    "OpenAIModel": "turnfsm.providers._openai",
    "local_model_path": "turnfsm.providers._local",
}


__getattr__ = lazy_getattr(__name__, _LAZY, globals())
