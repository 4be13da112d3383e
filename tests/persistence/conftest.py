"""A PostgreSQL server for the store tests, and a fresh schema for each store.

The server is `TURNFSM_TEST_POSTGRES_URL` when set (`.ci/run` starts one);
otherwise a private cluster that `scripts/pg-test-cluster` starts for this
test session and stops at its end. With neither (no PostgreSQL installed,
or no psycopg) the PostgreSQL tests skip, except when
`TURNFSM_REQUIRE_POSTGRES=1`: then they fail.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Callable, Iterator

import pytest

from tests.helpers import REPO_ROOT

CLUSTER = REPO_ROOT / "scripts" / "pg-test-cluster"


def _unavailable(reason: str) -> None:
    if os.environ.get("TURNFSM_REQUIRE_POSTGRES") == "1":
        pytest.fail(f"PostgreSQL is required (TURNFSM_REQUIRE_POSTGRES=1): {reason}")
    pytest.skip(f"no PostgreSQL server: {reason}")


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """Yield the URL of a PostgreSQL database whose role may create schemas."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        _unavailable("psycopg is not installed (pip install 'turnfsm[postgres]')")
    url = os.environ.get("TURNFSM_TEST_POSTGRES_URL")
    if url:
        yield url
        return
    if shutil.which("bash") is None:
        _unavailable("no bash to run scripts/pg-test-cluster")
    directory = tempfile.mkdtemp(prefix="turnfsm-pg-")
    started = subprocess.run(
        ["bash", str(CLUSTER), "start", directory],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if started.returncode != 0:
        shutil.rmtree(directory, ignore_errors=True)
        _unavailable(f"scripts/pg-test-cluster start: {started.stderr.strip()}")
    try:
        yield started.stdout.strip()
    finally:
        subprocess.run(
            ["bash", str(CLUSTER), "stop", directory], timeout=60, check=False
        )


@pytest.fixture
def postgres_url(postgres_server: str) -> Iterator[Callable[[], str]]:
    """Yield a function that makes a fresh schema and returns a conninfo for it.

    The conninfo selects the schema through `search_path`, so a store made
    from it sees only its own tables. The schemas are dropped afterwards.
    """
    import psycopg
    from psycopg.conninfo import make_conninfo

    schemas: list[str] = []

    def fresh() -> str:
        schema = f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(postgres_server, autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {schema}")
        schemas.append(schema)
        return make_conninfo(postgres_server, options=f"-csearch_path={schema}")

    yield fresh
    if schemas:
        with psycopg.connect(postgres_server, autocommit=True) as conn:
            for schema in schemas:
                conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
