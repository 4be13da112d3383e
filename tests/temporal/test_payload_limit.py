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

from tests.temporal.test_durable import _paused
from turnfsm import Agent, ContextManager, TruncatingCompactor, approval_machine, serde
from turnfsm.core import ToolsFinished
from turnfsm.driver import RunResult
from turnfsm.errors import (
    ConfigError,
    ContinuedAsNew,
    MaxTurnsExceeded,
    PayloadTooLarge,
)
from turnfsm.persistence import EventRecorded, RunEnded, Session, SQLiteStore
from turnfsm.providers import ModelRequest, ModelResponse
from turnfsm.temporal import DurableOptions, create_worker, start_durable
from turnfsm.temporal._payloads import payload_size
from turnfsm.testing import FakeModelClient, ScriptedModel, reply, tool_call

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


def fetch_page(n: int) -> str:
    """Fetch a page.

    Args:
        n: the page.
    """
    return f"page {n}"


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


async def _payloads_within(client: Client, workflow_id: str, limit: int) -> None:
    """Every activity input and result the workflow's history holds is in `limit`."""
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    for event in history.events:
        if event.HasField("activity_task_scheduled_event_attributes"):
            what = event.activity_task_scheduled_event_attributes
            sizes = [len(p.data) for p in what.input.payloads]
            name = what.activity_type.name
        elif event.HasField("activity_task_completed_event_attributes"):
            sizes = [
                len(p.data)
                for p in event.activity_task_completed_event_attributes.result.payloads
            ]
            name = f"the result of event {event.event_id}"
        else:
            continue
        assert max(sizes, default=0) <= limit, (name, sizes)


async def test_a_batch_of_results_together_past_the_limit_is_cut_to_fit(
    temporal_client: Client, tmp_path: Path
) -> None:
    # Each page is under half the limit; the four together are not, and the
    # batch is one entry of the log and one step of the conversation.
    def fetch(n: int) -> str:
        """Fetch a page.

        Args:
            n: the page.
        """
        return f"page {n}: " + "lorem ipsum " * (12_000 // 12)

    calls = [tool_call("fetch", f"c{n}", n=n) for n in range(4)]
    agent = Agent(
        model=ScriptedModel.of(reply("", *calls), "read them all"),
        tools=[fetch],
        store=SQLiteStore(tmp_path / "batch.db"),
        name="batch-fetcher",
    )
    queue = f"test-{uuid.uuid4().hex[:10]}"
    async with create_worker(temporal_client, queue, agent):
        run = await start_durable(
            agent,
            "read",
            client=temporal_client,
            task_queue=queue,
            options=DurableOptions(payload_limit=LIMIT),
        )
        result = await run.result()
    assert (result.outcome, result.text) == ("done", "read them all")
    await _payloads_within(temporal_client, run.workflow_id, LIMIT)
    session = await Session.load(SQLiteStore(tmp_path / "batch.db"), run.session_id)
    answers = [r for m in session.history for r in m.tool_results]
    assert [a.call_id for a in answers] == ["c0", "c1", "c2", "c3"]
    kept = [a for a in answers if not a.is_error]
    cut = [a for a in answers if a.is_error]
    assert kept
    assert cut
    assert all(a.content.startswith("page ") for a in kept)
    for answer in cut:
        assert answer.content.startswith("tool 'fetch' returned ")
        assert "with the other results of its batch" in answer.content


async def test_a_lone_call_with_long_arguments_writes_the_log_on_its_own(
    temporal_client: Client, tmp_path: Path
) -> None:
    # The reply holding the call is in the log, and the log rode with the
    # call's activity: the arguments twice. (One turn: the conversation
    # would be past the limit for a second model call.)
    wrote: list[int] = []

    def write(path: str, text: str) -> str:
        """Write a file.

        Args:
            path: the file.
            text: what to write.
        """
        wrote.append(len(text))
        return f"wrote {len(text)} characters to {path}"

    text = "lorem ipsum " * (25_000 // 12)
    agent = Agent(
        model=ScriptedModel.of(
            reply("", tool_call("write", "w1", path="/a", text=text)), "written"
        ),
        tools=[write],
        store=SQLiteStore(tmp_path / "write.db"),
        name="writer-long",
        max_turns=1,
    )
    queue = f"test-{uuid.uuid4().hex[:10]}"
    async with create_worker(temporal_client, queue, agent):
        run = await start_durable(
            agent,
            "write",
            client=temporal_client,
            task_queue=queue,
            options=DurableOptions(payload_limit=LIMIT),
        )
        result = await run.result()
    assert wrote == [len(text)]
    assert isinstance(result.error, MaxTurnsExceeded)
    await _payloads_within(temporal_client, run.workflow_id, LIMIT)
    session = await Session.load(SQLiteStore(tmp_path / "write.db"), run.session_id)
    [answer] = [
        r.content
        for e in session.entries
        if isinstance(e, EventRecorded) and isinstance(e.event, ToolsFinished)
        for m in e.event.results
        for r in m.tool_results
    ]
    assert answer == f"wrote {len(text)} characters to /a"


async def test_a_model_reply_past_the_limit_fails_the_run_after_one_call(
    temporal_client: Client, tmp_path: Path
) -> None:
    # Its activity's result would be refused, and Temporal would run the
    # activity, the model call, again and again.
    asked: list[int] = []

    def answer(request: ModelRequest) -> ModelResponse:
        asked.append(len(request.messages))
        return ModelResponse(message=reply("lorem ipsum " * (50_000 // 12)))

    agent = Agent(
        model=FakeModelClient(answer),
        store=SQLiteStore(tmp_path / "reply.db"),
        name="talker",
    )
    queue = f"test-{uuid.uuid4().hex[:10]}"
    async with create_worker(temporal_client, queue, agent):
        run = await start_durable(
            agent,
            "talk",
            client=temporal_client,
            task_queue=queue,
            options=DurableOptions(payload_limit=LIMIT),
        )
        result = await run.result()
    assert len(asked) == 1
    assert result.outcome == "failed"
    error = result.error
    assert isinstance(error, PayloadTooLarge)
    assert (error.effect, error.limit, error.returned) == ("call_llm", LIMIT, True)
    assert error.size > LIMIT
    assert str(error).startswith("the 'call_llm' step of this durable run returned ")
    await _payloads_within(temporal_client, run.workflow_id, LIMIT)
    session = await Session.load(SQLiteStore(tmp_path / "reply.db"), run.session_id)
    [record] = session.runs
    assert record.outcome == "failed"


async def test_a_log_past_the_limit_is_read_in_parts(
    temporal_client: Client, tmp_path: Path
) -> None:
    # Compaction keeps the conversation small; the log keeps everything. A
    # durable run reads it when it starts and each time it continues as new.
    def fetch(n: int) -> str:
        """Fetch a page.

        Args:
            n: the page.
        """
        return f"page {n}: " + "lorem ipsum " * 830

    def answer(request: ModelRequest) -> ModelResponse:
        if request.messages[-1].tool_results:
            return ModelResponse(message=reply("read"))
        call = tool_call("fetch", f"c{len(request.messages)}", n=1)
        return ModelResponse(message=reply("", call))

    def agent(store: SQLiteStore) -> Agent:
        return Agent(
            model=FakeModelClient(answer),
            tools=[fetch],
            store=store,
            name="long-log",
            context=ContextManager(
                TruncatingCompactor(), context_window=12_000, threshold=80
            ),
        )

    limit = 60_000
    earlier = agent(SQLiteStore(tmp_path / "log.db"))
    for n in range(25):
        assert (await earlier.run(f"read page {n}")).ok
    session = await Session.load(SQLiteStore(tmp_path / "log.db"), earlier.session.id)
    assert sum(payload_size(serde.envelope(e)) for e in session.entries) > 3 * limit
    later = agent(SQLiteStore(tmp_path / "log.db"))
    queue = f"test-{uuid.uuid4().hex[:10]}"
    async with create_worker(temporal_client, queue, later):
        run = await start_durable(
            later,
            "read one more",
            client=temporal_client,
            task_queue=queue,
            session_id=earlier.session.id,
            options=DurableOptions(payload_limit=limit, history_limit=10),
        )
        result = await run.result()
    assert (result.outcome, result.text) == ("done", "read"), result.error
    await _payloads_within(temporal_client, run.workflow_id, limit)
    session = await Session.load(SQLiteStore(tmp_path / "log.db"), run.session_id)
    assert session.runs[-1].outcome == "done"
    assert len(session.runs) == 26
    assert any(
        isinstance(e, RunEnded) and isinstance(e.error, ContinuedAsNew)
        for e in session.entries
    )


async def test_a_message_injected_past_half_the_limit_is_refused_when_sent(
    temporal_client: Client, tmp_path: Path
) -> None:
    # Past half the limit, it would ride in every later step and fail the run
    # there; it is refused where it is sent, and the run goes on.

    agent = Agent(
        model=ScriptedModel.of(reply("", tool_call("fetch_page", "c1", n=1)), "done"),
        tools=[fetch_page],
        machine=approval_machine(),
        store=SQLiteStore(tmp_path / "inject.db"),
        name="injected",
    )
    queue = f"test-{uuid.uuid4().hex[:10]}"
    async with create_worker(temporal_client, queue, agent):
        run = await start_durable(
            agent,
            "read",
            client=temporal_client,
            task_queue=queue,
            options=DurableOptions(payload_limit=LIMIT),
        )
        await _paused(run)
        with pytest.raises(ConfigError) as refused:
            await run.inject("x" * 30_000)
        assert str(refused.value).startswith(
            "invalid inject='" + "x" * 80 + "... (30,000 characters)': expected a "
            f"message of at most {LIMIT // 2:,} bytes (half of "
            "DurableOptions.payload_limit"
        )
        await run.inject("a short note")
        await run.approve()
        result = await run.result()
    assert (result.outcome, result.text) == ("done", "done")


async def test_a_payload_limit_past_the_servers_is_refused_the_default_lowered(
    temporal_client: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every step's activity past the server's limit would be refused, and
    # the run would never end: a limit chosen past it is refused before the
    # run starts; the default, past it, becomes the server's.
    from turnfsm.temporal import _client

    async def small(client: Client) -> int:
        return 100_000

    monkeypatch.setattr(_client, "server_payload_limit", small)
    agent = Agent(
        model=ScriptedModel.of(reply("", tool_call("fetch_page", "c1", n=1)), "done"),
        tools=[fetch_page],
        machine=approval_machine(),
        store=SQLiteStore(tmp_path / "s.db"),
        name="lowered",
    )
    with pytest.raises(ConfigError) as refused:
        await start_durable(
            agent,
            "hi",
            client=temporal_client,
            task_queue="nowhere",
            options=DurableOptions(payload_limit=150_000),
        )
    assert str(refused.value) == (
        "invalid payload_limit=150000: expected at most 100,000 bytes, what this "
        "Temporal server takes in one payload (its limit.blobSize.error, less a "
        "margin): give DurableOptions(payload_limit=100_000) or less"
    )
    queue = f"test-{uuid.uuid4().hex[:10]}"
    async with create_worker(temporal_client, queue, agent):
        run = await start_durable(
            agent,
            "read",
            client=temporal_client,
            task_queue=queue,
            options=DurableOptions(history_limit=1000),
        )
        await _paused(run)
        with pytest.raises(ConfigError) as refused:
            await run.inject("x" * 60_000)  # within the server's, past half of it
        assert "a message of at most 50,000 bytes" in str(refused.value)
        await run.approve()
        assert (await run.result()).text == "done"


async def test_answers_past_the_limits_are_refused_when_sent(
    temporal_client: Client, tmp_path: Path
) -> None:
    # A reason becomes a tool result riding every later step; a cancel
    # past the server's limit is refused by it: each is a ConfigError naming
    # its size, and the run goes on.

    agent = Agent(
        model=ScriptedModel.of(reply("", tool_call("fetch_page", "c1", n=1)), "done"),
        tools=[fetch_page],
        machine=approval_machine(),
        store=SQLiteStore(tmp_path / "answers.db"),
        name="answered",
    )
    queue = f"test-{uuid.uuid4().hex[:10]}"
    async with create_worker(temporal_client, queue, agent):
        run = await start_durable(
            agent,
            "read",
            client=temporal_client,
            task_queue=queue,
            options=DurableOptions(payload_limit=LIMIT),
        )
        await _paused(run)
        with pytest.raises(ConfigError) as refused:
            await run.reject({"c1": "y" * 30_000})
        assert f"reasons of at most {LIMIT // 2:,} bytes" in str(refused.value)
        assert "(30,010 characters)" in str(refused.value)  # not all of it
        with pytest.raises(ConfigError) as refused:
            await run.cancel("z" * 2_200_000)
        assert str(refused.value).startswith(
            "invalid cancel='" + "z" * 80 + "... (2,200,000 characters)': expected "
            "at most "
        )
        assert str(refused.value).endswith("this one is 2,200,002")
        await run.approve()
        result = await run.result()
    assert (result.outcome, result.text) == ("done", "done")


async def test_an_input_past_the_servers_limit_is_refused_before_the_start(
    temporal_client: Client, tmp_path: Path
) -> None:
    # The server refused the start with its own RPCError ("Blob data size
    # exceeds limit"), untyped. Refused before it is sent, naming the input.
    from turnfsm.temporal._client import server_payload_limit

    limit = await server_payload_limit(temporal_client)
    assert limit is not None
    agent = Agent(
        model=ScriptedModel.of("done"),
        store=SQLiteStore(tmp_path / "i.db"),
        name="input",
    )
    with pytest.raises(ConfigError) as refused:
        await start_durable(
            agent,
            "x" * (limit + 2_000),
            client=temporal_client,
            task_queue=f"test-{uuid.uuid4().hex[:10]}",
        )
    assert str(refused.value).startswith(
        f"invalid input='{'x' * 80}... ({limit + 2_000:,} characters)': expected "
        f"at most "
        f"{limit:,} bytes, what this Temporal server takes in one payload"
    )
    assert await SQLiteStore(tmp_path / "i.db").list_sessions() == ()
