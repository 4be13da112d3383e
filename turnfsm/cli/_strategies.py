"""The compaction strategies the commands' ``--strategy`` options take, by name.

All of them come from `turnfsm.context.STRATEGIES`: this module only says
which of them each command offers, and words a list of them for help.
"""

from __future__ import annotations

from typing import Final

from attrs import fields_dict

from turnfsm.context import STRATEGIES

__all__ = [
    "AGENT_STRATEGIES",
    "DEMO_STRATEGIES",
    "EVAL_STRATEGIES",
    "not_offered",
    "spoken",
]

AGENT_STRATEGIES: Final[tuple[str, ...]] = tuple(
    name for name in STRATEGIES if name != "digest"
)
"""The compactors an agent's ``--strategy`` names (``run``, ``simulate``).

Every shipped strategy but ``digest``: on its own it only shortens old tool
results, which cannot bring a long run back under its window (``turnfsm
eval`` measures it).
"""

DEMO_STRATEGIES: Final[tuple[str, ...]] = tuple(
    name
    for name in AGENT_STRATEGIES
    if "compact_newest_exchange" in fields_dict(STRATEGIES[name])  # type: ignore[arg-type]
)
"""The compactors ``turnfsm demo --strategy`` names.

The ones that can cut inside the newest exchange (``compact_newest_exchange``),
as the demo's one long tool-using run needs: masking cannot, and leaves the
demo's answer only cut-short logs to count.
"""

EVAL_STRATEGIES: Final[tuple[str, ...]] = tuple(STRATEGIES)
"""The shipped compactors ``turnfsm eval --strategy`` names: every one."""


def spoken(names: tuple[str, ...]) -> str:
    """`names` as a sentence says them: ``a, b or c``."""
    return f"{', '.join(names[:-1])} or {names[-1]}"


def not_offered(name: str) -> str:
    """Why an agent's ``--strategy`` does not offer the shipped `name` ('' if none)."""
    if name == "digest":
        return (
            "digest alone only shortens old tool results, which cannot bring a "
            "long run back under its window; `turnfsm eval --strategy digest` "
            "measures it"
        )
    return ""
