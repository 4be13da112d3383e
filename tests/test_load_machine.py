"""`load_machine` takes a shipped machine by its name where no file has it."""

from __future__ import annotations

from pathlib import Path

import pytest

from turnfsm import approval_machine, load_machine, review_machine
from turnfsm.errors import ConfigError, DefinitionError
from turnfsm.persistence import machine_digest


def test_a_shipped_machine_loads_by_its_name_where_no_file_has_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `--machine approval` and load_machine("approval") were "no such file"
    # outside the repository: the docs' machines/approval.toml is not there
    # for an installed turnfsm.
    monkeypatch.chdir(tmp_path)
    assert machine_digest(load_machine("approval")) == machine_digest(
        approval_machine()
    )
    assert machine_digest(load_machine("review.toml")) == machine_digest(
        review_machine()
    )
    with pytest.raises(FileNotFoundError):
        load_machine("aproval")
    with pytest.raises(FileNotFoundError):  # a path is a path
        load_machine(Path("nowhere") / "approval.toml")


def test_a_file_here_of_a_shipped_machine_s_name_is_that_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "approval").write_text("not = [a machine", encoding="utf-8")
    with pytest.raises(DefinitionError) as caught:
        load_machine("approval")
    assert caught.value.source == "approval"


def test_a_misspelt_shipped_name_is_not_found_naming_the_one_meant(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # It said only "[Errno 2] No such file or directory: 'aproval'".
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError) as caught:
        load_machine("aproval")
    assert caught.value.filename == "aproval"
    assert str(caught.value) == (
        "[Errno 2] No such file or directory, nor a shipped machine of that "
        "name (approval, compaction, review, turn; did you mean 'approval'?): "
        "'aproval'"
    )
    with pytest.raises(FileNotFoundError) as caught:
        load_machine("mine.toml")
    assert "(approval, compaction, review, turn)" in str(caught.value)


@pytest.mark.parametrize("path", [5, None, b"turn.toml"])
def test_a_path_that_is_no_path_is_refused_naming_it(path: object) -> None:
    # It was a bare TypeError from pathlib, naming no argument.
    with pytest.raises(ConfigError) as caught:
        load_machine(path)  # type: ignore[arg-type]
    assert (caught.value.field, caught.value.value) == ("path", path)
