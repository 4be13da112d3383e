"""Collects the code blocks of README.md and docs/ as tests (tests/docs_blocks.py)."""

from __future__ import annotations

import pytest
from sybil.integration.pytest import SybilItem

from tests import docs_blocks

pytest_collect_file = docs_blocks.docs_sybil().pytest()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A docs block may take as long as its commands may (not the test default)."""
    for item in items:
        if isinstance(item, SybilItem):
            item.add_marker(pytest.mark.timeout(docs_blocks.COMMAND_TIMEOUT + 30))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Say how many code blocks of the docs ran."""
    if docs_blocks.RUN:
        terminalreporter.write_line(docs_blocks.summary())
