"""turnfsm: LLM agent loops on an explicit, declarative finite-state machine."""

from __future__ import annotations

__version__ = "0.1.0"
