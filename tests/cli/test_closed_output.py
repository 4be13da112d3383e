"""A command started with its standard output closed (``>&-``).

Python leaves `sys.stdout` None then, and `print` writes nothing: the
commands ended 0 with their output lost (``sessions export`` crashed with
"'NoneType' object has no attribute 'write'"). Each now fails as it does
on a full disk (``> /dev/full``): one line on standard error, status 2.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT
from turnfsm.cli import main

Capture = pytest.CaptureFixture[str]


@pytest.mark.parametrize(
    "command",
    [
        ["sessions", "export", "{session}"],
        ["sessions", "show", "{session}"],
        ["sessions", "list"],
        ["replay", "--session", "{session}"],
        ["check", str(REPO_ROOT / "machines")],
    ],
    ids=["export", "show", "list", "replay", "check"],
)
def test_a_closed_standard_output_is_an_error_as_a_full_one_is(
    tmp_path: Path, capsys: Capture, monkeypatch: pytest.MonkeyPatch, command: list[str]
) -> None:
    store = ["--store", str(tmp_path / "s.db")]
    assert main(["demo", *store]) == 0
    found = re.search(r"session (ses_\w+) stored in", capsys.readouterr().out)
    assert found is not None
    argv = [part.format(session=found.group(1)) for part in command]
    if argv[0] != "check":
        argv += store
    monkeypatch.setattr("sys.stdout", None)

    assert main(argv) == 2

    name = " ".join(argv[:2] if argv[0] == "sessions" else argv[:1])
    assert capsys.readouterr().err == f"turnfsm {name}: standard output is closed\n"
