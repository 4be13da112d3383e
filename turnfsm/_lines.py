"""The emergency line's arithmetic, below every package.

The brain's lines (`turnfsm.core`) and the errors' advice (the window a run
needs) both read it here, so the line is computed one way.
"""

from __future__ import annotations

from typing import Final

__all__ = ["EMERGENCY_PERCENT", "emergency_line", "window_to_send"]

EMERGENCY_PERCENT: Final = 95
"""The emergency line, in percent of the window; always active."""


def emergency_line(window: int) -> int:
    """Return ``window * 95 // 100``."""
    return window * EMERGENCY_PERCENT // 100


def window_to_send(tokens: int) -> int:
    """Return the smallest window whose emergency line is over `tokens`.

    A request of `tokens` is sent only under the line: a window of exactly
    `tokens`, or a little more, would still compact it.
    """
    return -(-(tokens + 1) * 100 // EMERGENCY_PERCENT)
