"""A machine written back as a file's data reads back as the same machine."""

from __future__ import annotations

from collections.abc import Callable

import attrs
import pytest

from tests.helpers import approval_toml
from turnfsm import approval_machine, default_machine
from turnfsm.core import MachineSpec


@pytest.mark.parametrize(
    "spec",
    [
        default_machine(),
        approval_machine(),
        MachineSpec.from_toml(approval_toml()),
    ],
    ids=["turn", "approval", "signals and a custom effect"],
)
def test_to_dict_reads_back_as_the_same_machine(spec: MachineSpec) -> None:
    data = spec.to_dict()
    back = MachineSpec.from_dict(data, source="back")
    assert attrs.evolve(back, source=spec.source) == spec
    assert back.to_dict() == data


def test_to_dict_writes_what_a_file_would() -> None:
    data = MachineSpec.from_toml(approval_toml()).to_dict()
    assert data["signals"] == ["approved", "rejected"]
    cancel = next(t for t in data["transitions"] if t["trigger"] == "run_cancelled")
    assert cancel["source"] == ["*"]  # a wildcard stays a wildcard
    assert cancel["error"] == "cancelled"
    reasons = {t.get("reason") for t in data["transitions"]}
    assert "emergency" in reasons  # an enum as its value
    assert data["states"]["await_approval"] == {"effect": "await_approval"}
    assert "signals" not in default_machine().to_dict()


@pytest.mark.parametrize(
    ("name", "stock"),
    [("turn", default_machine), ("approval", approval_machine)],
)
def test_machines_dir_holds_the_shipped_files_to_copy(
    name: str, stock: Callable[[], MachineSpec]
) -> None:
    from turnfsm import load_machine, machines_dir

    copied = load_machine(machines_dir() / f"{name}.toml")
    assert copied.to_dict() == stock().to_dict()
