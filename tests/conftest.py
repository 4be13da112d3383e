from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

# Two hypothesis profiles: "ci" (thorough; what .ci/run uses) and "dev" (quick,
# for local iteration). Pick one with HYPOTHESIS_PROFILE; tests that need a
# minimum number of examples set it on their own @settings.
settings.register_profile(
    "ci", deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "dev", max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(autouse=True)
def _private_cwd_and_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep whatever a test writes inside its tmp dir, which is also its cwd.

    Every default store (the user data dir) lives there, and so does a file
    written by relative path: the repository stays as it was. Tests reach the
    repository's files through `tests.helpers.REPO_ROOT`, never through the cwd.
    """
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg-data"))
    monkeypatch.delenv("TURNFSM_STORE", raising=False)
