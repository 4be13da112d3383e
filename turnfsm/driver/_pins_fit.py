"""The check before a run's first model call: its pinned messages must fit."""

from __future__ import annotations

from collections.abc import Sequence

from turnfsm.context import ContextManager
from turnfsm.errors import PinnedTooLarge
from turnfsm.messages import Message
from turnfsm.tokens import Meter

__all__ = ["check_pins_fit"]


def check_pins_fit(
    manager: ContextManager | None,
    messages: Sequence[Message],
    *,
    extras: Sequence[str],
    reply: int,
) -> None:
    """Refuse a run whose pinned messages plus the reserved budget overflow.

    No pass may drop a pinned message, so such a run could never fit.

    Args:
        manager: The run's context manager (None: nothing is checked).
        messages: The run's conversation: the session's history and its input.
        extras: The texts that ride every request (system prompt, tool schemas).
        reply: The reply budget (``max_output_tokens``, 0 if none).

    Raises:
        PinnedTooLarge: the pinned messages plus the reserved budget are over
            the window, with the figures.
    """
    if manager is None or manager.window == 0:
        return
    pinned = manager.pinned(messages)
    meter = Meter(manager.counter)
    kept = [m for m in messages if m.id in pinned]
    tokens = meter.measure(kept) if kept else 0
    reserved = (meter.measure(extras=extras) if extras else 0) + reply
    if tokens + reserved > manager.window:
        raise PinnedTooLarge(
            tokens + reserved, manager.window, pinned=tokens, reserved=reserved
        )
