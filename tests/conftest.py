from __future__ import annotations

from pathlib import Path

import pytest

from tests import profiles

# The hypothesis profile HYPOTHESIS_PROFILE names: "ci" (thorough; the default,
# what .ci/run uses) or "dev" (quick, for local iteration); see tests/profiles.py.
profiles.load()


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
