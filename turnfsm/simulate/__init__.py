"""Simulate: re-run a stored session's context policy under other settings.

`simulate` replays a stored session with its recorded replies and tool
results held fixed, under a context manager, a machine or prices of your
choice, and reports per model call the tokens that would be sent, each
compaction pass and where the prompt cache would break. With the session's
own settings it reproduces the stored figures.
"""

from __future__ import annotations

from turnfsm.simulate._simulate import (
    SimulatedCall,
    Simulation,
    simulate,
    stored_context,
)

__all__ = ["SimulatedCall", "Simulation", "simulate", "stored_context"]
