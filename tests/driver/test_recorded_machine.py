"""A run begun on a machine an earlier version accepted outlives new checks.

The log keeps the machine each run began on. When a later version of the
library checks machine files more strictly, a paused or interrupted run of
such a machine is still resumed, abandoned and replayed on it; new runs still
need a machine that passes every check.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from turnfsm import Agent, approval_machine
from turnfsm.core import MachineSpec, ToolCallsReviewed, _loader
from turnfsm.driver import replay
from turnfsm.errors import ConfigError, DefinitionError
from turnfsm.messages import Message, Role, ToolCallPart
from turnfsm.persistence import Session, SQLiteStore
from turnfsm.providers import ModelRequest, ModelResponse

pytestmark = pytest.mark.anyio


def delete_file(path: str) -> str:
    """Delete a file.

    Args:
        path: the file to delete.
    """
    return f"deleted {path}"


class Cleaner:
    async def complete(self, request: ModelRequest) -> ModelResponse:
        if request.messages[-1].role is not Role.TOOL:
            call = ToolCallPart(id="c1", name="delete_file", arguments={"path": "x"})
            return ModelResponse(message=Message.assistant(tool_calls=[call]))
        return ModelResponse(message=Message.assistant("deleted x"))


def older_machine() -> dict[str, Any]:
    """The approval machine with a finish phase that commits nothing."""
    data = approval_machine().to_dict()
    data["name"] = "older"
    data["states"]["done"] = {"decision": "finish"}
    return data


def agent(store: SQLiteStore, machine: MachineSpec) -> Agent:
    return Agent(model=Cleaner(), tools=[delete_file], machine=machine, store=store)


async def paused_run(path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    # What an earlier version accepted: the check that refuses it is not there.
    with monkeypatch.context() as earlier:
        earlier.setattr(_loader, "check_conversation", lambda spec, report, **_: None)
        machine = MachineSpec.from_dict(older_machine(), source="older.toml")
        async with SQLiteStore(path) as store:
            result = await agent(store, machine).run("Free some disk space.")
    assert result.outcome == "paused"
    return result.session_id, result.run_id


def test_the_machine_is_refused_today() -> None:
    with pytest.raises(DefinitionError, match="does not commit"):
        MachineSpec.from_dict(older_machine())


async def test_its_paused_run_resumes_on_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    session_id, run_id = await paused_run(tmp_path / "s.db", monkeypatch)

    async with SQLiteStore(tmp_path / "s.db") as store:
        later = agent(store, approval_machine())
        result = await later.resume(session_id, run_id, ToolCallsReviewed.approve_all())
        session = await Session.load(store, session_id)

    assert (result.outcome, result.text) == ("done", "deleted x")
    # It ran as that machine says: its done phase commits nothing.
    assert list(session.history) == []
    report = replay(None, session, run_id)
    assert report.divergence is None
    assert report.history_matches


async def test_its_paused_run_is_abandoned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    session_id, run_id = await paused_run(tmp_path / "s.db", monkeypatch)

    async with SQLiteStore(tmp_path / "s.db") as store:
        ended = await agent(store, approval_machine()).abandon(session_id, run_id)
        session = await Session.load(store, session_id)

    assert ended.outcome == "failed"
    assert not session.open_runs()
    assert replay(None, session, run_id).divergence is None


async def test_a_new_run_still_needs_a_machine_that_passes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    session_id, run_id = await paused_run(tmp_path / "s.db", monkeypatch)
    async with SQLiteStore(tmp_path / "s.db") as store:
        session = await Session.load(store, session_id)
    stored = session.machine(session.run(run_id).opened.digest)
    assert stored is not None

    with pytest.raises(DefinitionError, match="does not commit"):
        Agent(model=Cleaner(), tools=[delete_file], machine=stored)


def test_recorded_must_be_a_bool() -> None:
    with pytest.raises(ConfigError, match="recorded"):
        MachineSpec.from_dict(older_machine(), recorded="yes")  # type: ignore[arg-type]


def test_a_recorded_machine_still_has_its_entries_checked() -> None:
    data = older_machine()
    data["states"]["done"] = {"decision": "finnish"}

    with pytest.raises(DefinitionError, match="finnish"):
        MachineSpec.from_dict(data, recorded=True)


def test_a_recorded_machine_may_list_a_signal_twice() -> None:
    # Files are refused for it now; an earlier version wrote such machines.
    data = approval_machine().to_dict()
    data["signals"] = ["stop", "stop"]
    stop = {"trigger": "stop", "source": "await_approval", "dest": "failed"}
    data["transitions"].append({**stop, "error": "cancelled"})
    with pytest.raises(DefinitionError, match="listed more than once"):
        MachineSpec.from_dict(data)

    spec = MachineSpec.from_dict(data, recorded=True)

    assert spec.to_dict()["signals"] == ["stop", "stop"]


def test_a_recorded_machine_is_still_bounded() -> None:
    # A cycle no model call bounds would be a run that never ends.
    data = approval_machine().to_dict()
    data["transitions"].insert(
        0, {"trigger": "measured", "source": "start", "dest": "start"}
    )

    with pytest.raises(DefinitionError, match="not bounded"):
        MachineSpec.from_dict(data, recorded=True)
