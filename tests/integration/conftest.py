"""Fixtures for the integration tests on real servers."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integration.phoenix import (
    Phoenix,
    phoenix_unavailable,
    require_phoenix,
    start_phoenix,
    stop_phoenix,
)


@pytest.fixture(scope="session")
def phoenix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Phoenix]:
    """Yield one Phoenix for the test session, on 127.0.0.1 (~15 s to start).

    Skips when Phoenix is not installed or cannot start, unless
    TURNFSM_REQUIRE_PHOENIX=1: then it fails.
    """
    require_phoenix()
    try:
        running = start_phoenix(tmp_path_factory.mktemp("phoenix"))
    except RuntimeError as error:
        phoenix_unavailable(str(error))
    try:
        yield running
    finally:
        stop_phoenix(running)
