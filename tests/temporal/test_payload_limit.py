"""A durable run never schedules a payload Temporal would refuse.

Temporal refuses an activity's input or result past its limit for one
payload (2 MB by default); the workflow task that scheduled it then fails
again and again, and the run never ends. A durable run checks first
(`DurableOptions.payload_limit`): a tool result past half of it becomes an
error result saying so, the log is written in parts, and a step whose
conversation is past it fails the run with `PayloadTooLarge`. These tests run
on the real dev server with a small limit.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from temporalio.client import Client

from turnfsm import Agent
from turnfsm.core import ToolsFinished
from turnfsm.driver import RunResult
from turnfsm.errors import ConfigError, PayloadTooLarge
from turnfsm.persistence import EventRecorded, Session, SQLiteStore
from turnfsm.temporal import DurableOptions, create_worker, start_durable
from turnfsm.testing import ScriptedModel, reply, tool_call

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

LIMIT = 40_000


def _agent(store: SQLiteStore, size: int, turns: int) -> Agent:
    def fetch(n: int) -> str:
        """Fetch a page.

        Args:
            n: the page.
        """
        return f"page {n}: " + "lorem ipsum " * (size // 12)

    script = [reply("", tool_call("fetch", f"c{n}", n=n)) for n in range(turns)]
    return Agent(
        model=ScriptedModel.of(*script, "read them all"),
        tools=[fetch],
        store=store,
        name=f"fetcher-{size}",
    )


async def _ran(client: Client, agent: Agent) -> tuple[str, RunResult]:
    """Run `agent` durably under the small limit: its session id and result."""
    queue = f"test-{uuid.uuid4().hex[:10]}"
    async with create_worker(client, queue, agent):
        run = await start_durable(
            agent,
            "read",
            client=client,
            task_queue=queue,
            options=DurableOptions(payload_limit=LIMIT),
        )
        return run.session_id, await run.result()


async def test_a_tool_result_past_the_limit_is_an_error_result_saying_so(
    temporal_client: Client, tmp_path: Path
) -> None:
    agent = _agent(SQLiteStore(tmp_path / "big.db"), size=100_000, turns=1)
    session_id, result = await _ran(temporal_client, agent)
    assert (result.outcome, result.text) == ("done", "read them all")
    session = await Session.load(SQLiteStore(tmp_path / "big.db"), session_id)
    [answer] = [r for m in session.history for r in m.tool_results]
    assert answer.is_error
    assert answer.content.startswith("tool 'fetch' returned ")
    assert f"({LIMIT // 2:,} bytes: half of DurableOptions.payload_limit" in (
        answer.content
    )


async def test_a_conversation_past_the_limit_fails_the_run_instead_of_hanging(
    temporal_client: Client, tmp_path: Path
) -> None:
    # Each page fits; after a few of them the conversation does not.
    agent = _agent(SQLiteStore(tmp_path / "long.db"), size=12_000, turns=8)
    session_id, result = await _ran(temporal_client, agent)
    assert result.outcome == "failed"
    error = result.error
    assert isinstance(error, PayloadTooLarge)
    assert (error.effect, error.limit) == ("call_llm", LIMIT)
    assert error.size > LIMIT
    assert f"over DurableOptions.payload_limit={LIMIT:,}" in str(error)
    # Everything the run did is in the store, its pages included (the log
    # was written in parts, each within the limit), and its end.
    session = await Session.load(SQLiteStore(tmp_path / "long.db"), session_id)
    [record] = session.runs
    assert record.outcome == "failed"
    pages = [
        r.content
        for e in session.entries
        if isinstance(e, EventRecorded) and isinstance(e.event, ToolsFinished)
        for m in e.event.results
        for r in m.tool_results
    ]
    assert 2 <= len(pages) < 8
    assert all(p.startswith(f"page {n}: ") for n, p in enumerate(pages))


def test_payload_limit_is_checked_where_it_is_given() -> None:
    for bad in (0, 4095, 2.5e6, "2MB", None):
        with pytest.raises(ConfigError, match="payload_limit"):
            DurableOptions(payload_limit=bad)  # type: ignore[arg-type]
    assert DurableOptions().payload_limit == 2_000_000


async def test_the_log_is_taken_in_parts_within_a_budget() -> None:
    from turnfsm.messages import Message
    from turnfsm.persistence import ToolResultRecorded
    from turnfsm.temporal._payloads import RunSpec, payload_size
    from turnfsm.temporal._remote import _WorkflowLog

    log = _WorkflowLog(RunSpec(agent="a", session_id="ses_1", run_id="r", input=()))
    entries = [
        ToolResultRecorded(
            run_id="r", index=1, result=Message.tool_result(f"c{n}", "x" * 5_000)
        )
        for n in range(5)
    ]
    await log.append("ses_1", entries, expected_version=0)
    one = payload_size(log.take(None)["entries"][0])  # type: ignore[index]
    taken = []
    while (part := log.take(2 * one + 10)) is not None:
        taken.append(len(part["entries"]))
        assert part["version"] == sum(taken[:-1])
        log.done(part)
    assert taken == [2, 2, 1]
    await log.append("ses_1", entries[:1], expected_version=5)
    assert len(log.take(10)["entries"]) == 1  # type: ignore[index]  # one at least


def test_a_tool_request_of_an_earlier_workflow_reads_its_turn_from_it() -> None:
    # Activities an earlier version of the workflow scheduled carry the
    # whole snapshot, not the turn: a worker upgraded mid-run still runs them.
    import attrs

    from tests.helpers import load_turn_spec
    from turnfsm import serde
    from turnfsm.core import TurnMachine
    from turnfsm.temporal._activities import _turn

    snapshot = attrs.evolve(TurnMachine.start(load_turn_spec()).snapshot, turns=3)
    assert _turn({"turn": 4}) == 4
    assert _turn({"snapshot": serde.to_json(snapshot)}) == 3
