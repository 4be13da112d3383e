"""`LayeredCompactor`'s statuses: `Applied`, `Skipped`, `Failed` (never content)."""

from __future__ import annotations

from typing import TypeAlias, final

import attrs

__all__ = ["Applied", "CompactionStatus", "Failed", "Skipped"]


@final
@attrs.frozen(kw_only=True)
class Applied:
    """Layers ran; sizes in the counter's tokens (no message content).

    Attributes:
        layers: The layers that changed something, in order.
        tokens_before: The size before.
        tokens_after: The size after.
    """

    layers: tuple[str, ...]
    tokens_before: int
    tokens_after: int


@final
@attrs.frozen(kw_only=True)
class Skipped:
    """Nothing was done, and why."""

    reason: str


@final
@attrs.frozen(kw_only=True)
class Failed:
    """The pass failed; the messages came back as they were.

    `error` is the failure's kind and turnfsm's own explanation, never
    message content.
    """

    error: str


CompactionStatus: TypeAlias = Applied | Skipped | Failed
"""What `LayeredCompactor.compact_deterministic` / `manual_compact` report."""
