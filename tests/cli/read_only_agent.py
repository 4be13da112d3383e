"""An agent whose model leaves a mark when it is called (for the read-only tests).

The mark is the file ``TURNFSM_TEST_MARK`` names: a command refused before
any model call leaves none.
"""

from __future__ import annotations

import os
from pathlib import Path

from turnfsm import Agent
from turnfsm.messages import Message
from turnfsm.providers import ModelRequest
from turnfsm.testing import FakeModelClient, reply


def _marking(request: ModelRequest) -> Message:
    Path(os.environ["TURNFSM_TEST_MARK"]).write_text("the model was called")
    return reply("done")


def marking() -> Agent:
    """An agent of one model call, which leaves the mark."""
    return Agent(model=FakeModelClient(_marking))
