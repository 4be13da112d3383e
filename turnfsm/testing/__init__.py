"""The public test kit: fake models, conformance checks for strategies and stores.

A scripted model is a test double for unit tests, never the only proof that
an agent works: run the same agent against a real model server too.
"""

from __future__ import annotations

from turnfsm.testing._conformance import check_compactor
from turnfsm.testing._fake import FakeModelClient, ScriptedModel, reply, tool_call
from turnfsm.testing._stores import check_store, sample_entries
from turnfsm.testing._summary import ExtractiveSummaryModel

__all__ = [
    "ExtractiveSummaryModel",
    "FakeModelClient",
    "ScriptedModel",
    "check_compactor",
    "check_store",
    "reply",
    "sample_entries",
    "tool_call",
]
