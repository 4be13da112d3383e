"""``--store`` wins over ``TURNFSM_STORE`` for the agent a command imports too."""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

import pytest

from turnfsm.cli import main
from turnfsm.persistence import STORE_ENV

MODULE = """
from turnfsm import Agent
from turnfsm.testing import FakeModelClient

agent = Agent(model=FakeModelClient(lambda request: "hello"))
"""


@pytest.mark.parametrize("variable", ["bad", "other"])
def test_an_agent_module_builds_its_agent_on_the_store_given(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    variable: str,
) -> None:
    # The module's Agent opened TURNFSM_STORE when imported: a bad one failed
    # the command, naming --agent; a good one made a file never used.
    name = f"store_wins_{uuid.uuid4().hex}"
    (tmp_path / f"{name}.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    elsewhere = tmp_path / "other.db"
    unusable = tmp_path / "a-file" / "x.db"
    (tmp_path / "a-file").write_text("not a directory")
    before = str(unusable if variable == "bad" else elsewhere)
    monkeypatch.setenv(STORE_ENV, before)
    given = tmp_path / "given.db"
    try:
        status = main(["run", "hi", "--agent", f"{name}:agent", "--store", str(given)])
    finally:
        sys.modules.pop(name, None)
    out = capsys.readouterr()
    assert status == 0, out.err
    assert "hello" in out.out
    assert given.exists()
    assert not elsewhere.exists()
    assert os.environ[STORE_ENV] == before  # as it was, after the command
