"""What the simulate tests read from a stored run."""

from __future__ import annotations

from turnfsm.core import Measured, ModelReplied
from turnfsm.persistence import RunRecord

__all__ = ["measured"]


def measured(run: RunRecord) -> list[int]:
    """The size the log measured before each model call of `run`, in order."""
    sizes, last = [], 0
    for event in run.events:
        if isinstance(event, Measured):
            last = event.estimate
        elif isinstance(event, ModelReplied):
            sizes.append(last)
    return sizes
