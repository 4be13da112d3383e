"""How big the provider found a request it refused as too long.

A provider refuses a request over its window; when the run's window check
let that request through, the counter read it lower than the provider's
tokenizer does (digits, hex, another vocabulary), and a pass aimed at the
usual target, which the counter says the request is under already, would
cut nothing. `refused_size` is the smallest size the provider can have
found: what its words say it counted, and at least one token over the
window, so the pass can aim lower in the same proportion.
"""

from __future__ import annotations

import re
from typing import Final

from turnfsm.errors import CONTEXT_OVERFLOW
from turnfsm.values import ErrorInfo

__all__ = ["refused_size"]

_SIZES: Final = (
    # OpenAI, vLLM, llama-cpp-python: "However, you requested 1400 tokens
    # (1376 in the messages, 24 in the completion)".
    re.compile(r"requested (\d+) tokens"),
    # OpenAI: "However, your messages resulted in 5000 tokens".
    re.compile(r"resulted in (\d+) tokens"),
    # vLLM: "However, your request has 5000 input tokens".
    re.compile(r"request has (\d+) input tokens"),
    # A reply a server cut off at its window (the run's words): "by its count
    # the request is 999 input + 64 reply = 1063 tokens > the 1024 window".
    re.compile(r"= (\d+) tokens > "),
    # Anthropic: "prompt is too long: 210345 tokens > 200000 maximum".
    re.compile(r"(\d+) tokens > \d+ maximum"),
    # Anthropic: "input length and `max_tokens` exceed context limit:
    # 197682 + 21333 > 200000".
    re.compile(r"(\d+) \+ (\d+) > \d+"),
)
"""What providers say they counted, in their refusals' words."""

_WINDOWS: Final = (
    # OpenAI, vLLM, llama-cpp-python: "maximum context length is 4096 tokens".
    re.compile(r"maximum context length is (\d+) tokens"),
    # Anthropic: "210345 tokens > 200000 maximum", "197682 + 21333 > 200000".
    re.compile(r"tokens > (\d+) maximum"),
    re.compile(r"\d+ \+ \d+ > (\d+)"),
)
"""What providers say their window is, in their refusals' words."""


def _stated(patterns: tuple[re.Pattern[str], ...], text: str) -> int:
    """The largest figure `patterns` find in `text` (a match's groups summed), or 0."""
    return max(
        (
            sum(int(group) for group in match.groups())
            for pattern in patterns
            for match in pattern.finditer(text)
        ),
        default=0,
    )


def refused_size(overflow: ErrorInfo | None, window: int) -> int | None:
    """Return the least size the provider found a refused request, or None.

    Args:
        overflow: The refusal that started the pass (the run's own window
            check's is no provider's count: None).
        window: The window the run checked the request against (0: none).

    Returns:
        The largest count the provider's words state, and at least one
        token over the window (the provider's, when its words say it is
        smaller than `window`: a run told a window bigger than its model's
        is no counter reading low); None when `overflow` is not the
        provider's.
    """
    if overflow is None or overflow.type != CONTEXT_OVERFLOW:
        return None
    said = _stated(_SIZES, overflow.message)
    stated = _stated(_WINDOWS, overflow.message)
    if stated and (not window or stated < window):
        # The model's window is smaller than the run's: the refusal says the
        # request is over the model's, not that the counter read it low.
        window = stated
    least = window + 1 if window else 0
    return max(said, least) or None
