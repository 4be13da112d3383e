"""A store file whose directory cannot be used is refused by name, in the library."""

from __future__ import annotations

from pathlib import Path

import pytest

from turnfsm import Agent
from turnfsm.errors import StoreDirectoryUnusable
from turnfsm.persistence import SQLiteStore, open_store
from turnfsm.testing import ScriptedModel


def _missing(tmp: Path) -> tuple[Path, str]:
    return tmp / "nowhere" / "s.db", "it does not exist"


def _a_file(tmp: Path) -> tuple[Path, str]:
    (tmp / "plain").write_text("x")
    return tmp / "plain" / "s.db", "it is not a directory"


@pytest.mark.parametrize("case", [_missing, _a_file], ids=["missing", "a-file"])
@pytest.mark.parametrize(
    "opener",
    [
        SQLiteStore,
        lambda path: open_store(str(path)),
        lambda path: open_store(f"sqlite:///{path}"),
        lambda path: Agent(model=ScriptedModel.of("hi"), store=str(path)),
    ],
    ids=["SQLiteStore", "open_store", "sqlite-url", "Agent"],
)
def test_a_store_directory_that_cannot_be_used_is_named(
    tmp_path: Path, case: object, opener: object
) -> None:
    path, reason = case(tmp_path)  # type: ignore[operator]

    with pytest.raises(StoreDirectoryUnusable) as refused:
        opener(path)  # type: ignore[operator]

    error = refused.value
    assert (error.directory, error.reason) == (str(path.parent), reason)
    assert error.setting == "the store's path"
    assert str(error).startswith(f"cannot keep sessions in the directory {path.parent}")
    assert not path.exists()  # nothing was written


@pytest.mark.parametrize(
    ("reason", "advice"),
    [
        ("it does not exist", "create it, or change --store"),
        ("it cannot be created (Permission denied)", "create it, or change --store"),
        ("it is not a directory", "move that file away, or change --store"),
        ("it cannot be written", "let this user write it, or change --store"),
    ],
)
def test_a_store_directory_refusal_says_what_would_mend_it(
    reason: str, advice: str
) -> None:
    # A directory on a read-only disk was told to be created.
    said = str(StoreDirectoryUnusable("/srv/ro", reason, "--store"))
    assert said == (
        f"cannot keep sessions in the directory /srv/ro: {reason}; {advice} "
        "(nothing was written)"
    )
