"""Finding a user's agent for the command line: ``--agent MODULE:ATTR``."""

from __future__ import annotations

import importlib
from typing import Any

from turnfsm.agent import Agent
from turnfsm.errors import ConfigError

__all__ = ["load_agents"]


def load_agents(spec: str) -> list[Agent]:
    """Import ``MODULE:ATTR``: an `Agent`, a list of them, or a function making them.

    Raises:
        ConfigError: the spec does not name agents (the reason is given).
    """
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigError("--agent", spec, "MODULE:ATTR (e.g. myapp.agents:support)")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError("--agent", spec, f"an importable module ({exc})") from None
    value: Any = module
    for part in attr.split("."):
        value = getattr(value, part, None)
        if value is None:
            raise ConfigError("--agent", spec, f"a name {module_name} defines")
    if callable(value) and not isinstance(value, Agent):
        value = value()
    if isinstance(value, Agent):
        agents = [value]
    elif isinstance(value, list | tuple):
        agents = list(value)
    else:
        agents = []
    if not agents or not all(isinstance(a, Agent) for a in agents):
        raise ConfigError(
            "--agent", spec, "an Agent, Agents, or a function making them"
        )
    return agents
