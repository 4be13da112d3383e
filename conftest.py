"""Collects the code blocks of README.md and docs/ as tests (tests/docs_blocks.py)."""

from __future__ import annotations

import pytest
from sybil.integration.pytest import SybilItem

from tests import docs_blocks

pytest_collect_file = docs_blocks.docs_sybil().pytest()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A docs block may take as long as its commands may (not the test default).

    The tests are also grouped for several workers (``scripts/check`` runs
    ``pytest -n N --dist loadgroup``; a group runs on one worker, in order):
    each file is a group, so its fixtures start once, except that the
    real-model tests and the docs (whose blocks run the local model too) are
    one group, so that one llama.cpp server runs at a time, and the tests
    that start Phoenix are another. The longest group runs first, then the
    files that hold a slow test, so that no long file is left to run alone
    at the end.
    """
    for item in items:
        if isinstance(item, SybilItem):
            item.add_marker(pytest.mark.timeout(docs_blocks.COMMAND_TIMEOUT + 30))
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    groups = {item: _group(item) for item in items}
    for item, group in groups.items():
        item.add_marker(pytest.mark.xdist_group(group))
    items.sort(key=lambda item: (groups[item] != _LOCAL, item.path not in slow))


_LOCAL = "local-model"


def _group(item: pytest.Item) -> str:
    if isinstance(item, SybilItem) or item.get_closest_marker("local_model"):
        return _LOCAL
    if "phoenix" in getattr(item, "fixturenames", ()):
        return "phoenix"
    return str(item.path)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Say how many code blocks of the docs ran."""
    if docs_blocks.RUN:
        terminalreporter.write_line(docs_blocks.summary())
