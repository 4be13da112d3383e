"""The threshold and emergency lines, as pure integer arithmetic."""

from __future__ import annotations

from enum import StrEnum

from turnfsm._lines import EMERGENCY_PERCENT, emergency_line

__all__ = [
    "EMERGENCY_PERCENT",
    "CompactReason",
    "emergency_line",
    "is_over_emergency_line",
    "is_over_threshold_line",
    "line_reason",
    "threshold_line",
]


class CompactReason(StrEnum):
    """Why a compaction pass runs."""

    THRESHOLD_EXCEEDED = "threshold_exceeded"
    EMERGENCY = "emergency"
    OVERFLOW = "overflow"
    MANUAL = "manual"
    MESSAGE_COUNT = "message_count"


def threshold_line(window: int, threshold: int, tokens: int | None = None) -> int:
    """Return the threshold line: `tokens`, else ``window * threshold // 100``.

    `tokens` is an absolute line, in place of the percentage.
    """
    return tokens if tokens is not None else window * threshold // 100


def is_over_emergency_line(estimate: int, window: int) -> bool:
    """Return whether `estimate` is on or over the emergency line (inclusive)."""
    return window > 0 and estimate >= emergency_line(window)


def is_over_threshold_line(
    estimate: int,
    window: int,
    threshold: int,
    *,
    auto_compact: bool,
    tokens: int | None = None,
) -> bool:
    """Return whether `estimate` is strictly over the threshold line.

    `tokens` is an absolute line, in place of the percentage `threshold`.
    """
    return (
        auto_compact
        and window > 0
        and (threshold > 0 or tokens is not None)
        and estimate > threshold_line(window, threshold, tokens)
    )


def line_reason(
    estimate: int,
    window: int,
    threshold: int,
    *,
    auto_compact: bool,
    tokens: int | None = None,
) -> CompactReason | None:
    """Return the reason to compact before a model call, or None to call.

    The emergency line wins over the threshold line (first hit wins);
    `tokens` is an absolute threshold line, in place of the percentage.
    """
    if is_over_emergency_line(estimate, window):
        return CompactReason.EMERGENCY
    if is_over_threshold_line(
        estimate, window, threshold, auto_compact=auto_compact, tokens=tokens
    ):
        return CompactReason.THRESHOLD_EXCEEDED
    return None
