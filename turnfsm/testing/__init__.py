"""The public test kit: fake models and conformance checks for your strategies.

A scripted model is a test double for unit tests, never the only proof that
an agent works: run the same agent against a real model server too.
"""

from __future__ import annotations

from turnfsm.testing._conformance import check_compactor
from turnfsm.testing._fake import FakeModelClient, ScriptedModel, reply, tool_call

__all__ = ["FakeModelClient", "ScriptedModel", "check_compactor", "reply", "tool_call"]
