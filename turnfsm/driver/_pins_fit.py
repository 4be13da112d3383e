"""The check before a run's first model call: its pinned messages must fit."""

from __future__ import annotations

from collections.abc import Sequence

from turnfsm import _checks
from turnfsm._lines import emergency_line
from turnfsm.context import ContextManager, counter_at_fault
from turnfsm.errors import PinnedTooLarge
from turnfsm.messages import Message
from turnfsm.tokens import IncrementalCounter, Meter

__all__ = ["check_pins_fit"]


def check_pins_fit(
    manager: ContextManager | None,
    history: Sequence[Message],
    messages: Sequence[Message],
    *,
    meter: Meter,
    extras: Sequence[str],
    reply: int,
    ratio: float | None = None,
) -> None:
    """Refuse a run whose pinned messages plus the reserved budget overflow.

    They overflow on or over the window's emergency line, where a request is
    compacted, never sent: no pass may drop a pinned message, so such a run
    could never send one.

    When the whole conversation fits with the reserved budget, its pinned
    part does too, and the pins are not looked for: with an incremental
    counter that costs O(new messages) on a long session, whose history is
    measured from its log's memo.

    Args:
        manager: The run's context manager (None: nothing is checked).
        history: The session's history.
        messages: The run's input.
        meter: The run's meter (of the manager's counter).
        extras: The texts that ride every request (system prompt, tool schemas).
        reply: The reply budget (``max_output_tokens``, 0 if none).
        ratio: The session's learned ratio of reported to estimated tokens
            (`Session.reported_ratio_for`): a calibrating manager's run
            measures its requests scaled by it, and so does this check.

    Raises:
        PinnedTooLarge: the pinned messages plus the reserved budget reach
            the window's emergency line, with the figures (naming the
            counter when its count is more than any tokenizer makes of
            their text).
    """
    if manager is None or manager.window == 0:
        return
    texts = meter.measure(extras=extras) if extras else 0

    def size(tokens: int) -> int:
        """A request of `tokens` of messages, as the run's lines measure it."""
        return manager.calibrated(tokens + texts, ratio) + reply

    # A request on or over the emergency line is compacted, never sent.
    line = emergency_line(manager.window)
    # A sum of per-message units grows with every message: the pinned
    # messages cost at most what all of them cost.
    if (
        _checks.is_instance(manager.counter, IncrementalCounter)
        and size(meter.measure(history, messages)) < line
    ):
        return
    conversation = [*history, *messages]
    pinned = manager.pinned(conversation)
    kept = [m for m in conversation if m.id in pinned]
    tokens = meter.measure(kept) if kept else 0
    used = size(tokens)
    if used >= line:
        # A count past what any tokenizer makes of the text names the
        # counter: the pins are not at fault.
        blame = counter_at_fault(
            kept, manager.counter, extras=extras, tokens=tokens + texts
        )
        # Calibrated, each part as the run counts it (its sum is `used`).
        reserved = min(used, manager.calibrated(texts, ratio) + reply)
        raise PinnedTooLarge(
            used,
            manager.window,
            pinned=used - reserved,
            reserved=reserved,
            line=line,
            scale=manager.calibration_factor(ratio),
            reply=reply,
            counter=blame,
        )
