"""Collects the code blocks of README.md and docs/ as tests (tests/docs_blocks.py)."""

from __future__ import annotations

import pytest
from sybil.integration.pytest import SybilItem

from tests import docs_blocks

pytest_collect_file = docs_blocks.docs_sybil().pytest()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A docs block may take as long as its commands may (not the test default).

    The real-model tests, the longest group (see `pytest_xdist_make_scheduler`),
    run first, then the files that hold a slow test, each file's tests in
    their order: on several workers, no long file is then left to run alone
    at the end. The docs run last, as they always have: their blocks set up
    process-wide state (tracing, environment variables) that no test after
    them expects. Workers take groups in this order, so a worker that takes
    a page has no test left to run after it.
    """
    for item in items:
        if isinstance(item, SybilItem):
            item.add_marker(pytest.mark.timeout(docs_blocks.COMMAND_TIMEOUT + 30))
    slow = {_file(item.nodeid) for item in items if item.get_closest_marker("slow")}
    items.sort(
        key=lambda item: (
            _rank(item.nodeid),
            _file(item.nodeid) not in slow,
        )
    )


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """Give pytest-xdist's workers whole groups of tests, a group at a time.

    A group is a test file (its fixtures start once), or a page of the docs
    (its blocks run in order, in its own directory and environment), except
    two: the real-model tests (``tests/integration/test_local_*``), whose
    llama.cpp servers would slow each other down; and the Phoenix tests,
    which share one Phoenix. The docs' pages are groups of their own, not one
    group: as one, the worker that took it ran every page at the end while
    the other, with nothing left in the queue, stopped.
    """
    from xdist.scheduler import LoadScopeScheduling

    class Groups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _group(nodeid)

    return Groups(config, log)


_LOCAL_MODEL = "local-model"


def _file(nodeid: str) -> str:
    return nodeid.partition("::")[0]


def _is_docs(path: str) -> bool:
    return path.startswith("docs/") or path == "README.md"


def _rank(nodeid: str) -> int:
    """0 for the real-model tests (first), 2 for the docs (last), else 1."""
    if _group(nodeid) == _LOCAL_MODEL:
        return 0
    return 2 if _is_docs(_file(nodeid)) else 1


def _group(nodeid: str) -> str:
    path = _file(nodeid)
    if path.startswith("tests/integration/test_local_"):
        return _LOCAL_MODEL
    if path.startswith("tests/integration/test_phoenix_"):
        return "phoenix"
    return path  # a test file, or a page of the docs


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Say how many code blocks of the docs ran."""
    if docs_blocks.RUN:
        terminalreporter.write_line(docs_blocks.summary())
