"""The root of the tree: `TurnFSMError`, the base class of every turnfsm error."""

from __future__ import annotations

__all__ = ["TurnFSMError"]


class TurnFSMError(Exception):
    """Base class of every turnfsm exception; never raised directly."""
