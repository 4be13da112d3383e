"""Collects the code blocks of README.md and docs/ as tests (tests/docs_blocks.py)."""

from __future__ import annotations

import pytest

from tests import docs_blocks

pytest_collect_file = docs_blocks.docs_sybil().pytest()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Say how many code blocks of the docs ran."""
    if docs_blocks.RUN:
        terminalreporter.write_line(docs_blocks.summary())
