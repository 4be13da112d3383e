"""How turnfsm says the wait a model provider asked for (its ``Retry-After``)."""

from __future__ import annotations

from typing import Final

__all__ = ["WAIT_ASKED", "waited_for"]

WAIT_ASKED: Final = "the provider asked to wait"
"""The words before the wait, in a provider error's message."""


def waited_for(seconds: float) -> str:
    """Say the wait a provider asked for: to a tenth of a second, or two digits.

    A wait read from an HTTP date is no round number (5.44659 s), and one
    under a tenth of a second still says what it was.
    """
    said = f"{round(seconds, 1):g}" if seconds >= 0.1 else f"{seconds:.2g}"
    return f"{WAIT_ASKED} {said} s before trying again"
