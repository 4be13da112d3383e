"""Sub-agents as tools: a child run with its own window, linked to its parent's call."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import attrs
import pytest

from tests.helpers import request_text
from tests.tracing._spans import Traced
from turnfsm import Agent
from turnfsm.cli._sessions import SessionsCommand, run_sessions
from turnfsm.context import ContextManager
from turnfsm.driver import RunControl, Tool, replay
from turnfsm.driver._recall import session_scope
from turnfsm.driver._subagents import child_ids, run_scope
from turnfsm.driver._tools import run_tool_call
from turnfsm.errors import Cancelled, ConfigError, ProviderError, ToolError
from turnfsm.messages import Message
from turnfsm.persistence import (
    MemoryStore,
    ParentLink,
    RunOpened,
    Session,
    SessionStore,
    SQLiteStore,
    child_sessions,
    parent_of,
)
from turnfsm.providers import ModelRequest, ModelResponse
from turnfsm.serde import from_json, to_json
from turnfsm.testing import FakeModelClient, reply, tool_call
from turnfsm.values import Usage

pytestmark = pytest.mark.anyio

FILLER = "a filler line of the quarterly ledger that the parent must never see\n"
TOTALS = {"north.txt": 120, "south.txt": 45, "east.txt": 7}
CHILD_USAGE = Usage(input_tokens=40, output_tokens=3)
PARENT_USAGE = Usage(input_tokens=100, output_tokens=5)


def write_files() -> None:
    for name, total in TOTALS.items():
        Path(name).write_text(FILLER * 80 + f"total: {total}\n" + FILLER * 80)


def read_file(path: str) -> str:
    """Read a text file.

    Args:
        path: The file to read.
    """
    return Path(path).read_text()


def child_model() -> FakeModelClient:
    """Reads the file the task names, then answers with the total it found."""

    def answer(request: ModelRequest) -> ModelResponse:
        last = request.messages[-1]
        if last.tool_results:
            found = re.search(r"total: (\d+)", last.tool_results[0].content)
            assert found is not None
            message = reply(f"the total is {found.group(1)}")
        else:
            path = re.search(r"\S+\.txt", last.text)
            assert path is not None
            message = reply("", tool_call("read_file", path=path.group(0)))
        return ModelResponse(message=message, usage=CHILD_USAGE)

    return FakeModelClient(answer)


def parent_model() -> FakeModelClient:
    """Delegates the three reads at once, then adds up what the children said."""

    def answer(request: ModelRequest) -> ModelResponse:
        last = request.messages[-1]
        if last.tool_results:
            results = [p.content for m in request.messages for p in m.tool_results]
            numbers = [int(n) for r in results for n in re.findall(r"\d+", r)]
            message = reply(f"the grand total is {sum(numbers)}")
        else:
            calls = [
                tool_call("reader", f"call_{name[:-4]}", task=f"Read {name}: total?")
                for name in TOTALS
            ]
            message = reply("", *calls)
        return ModelResponse(message=message, usage=PARENT_USAGE)

    return FakeModelClient(answer)


def reader(store: SessionStore | None = None, **options: Any) -> Agent:
    return Agent(
        model=options.pop("model", child_model()),
        tools=[read_file],
        context=ContextManager(context_window=6_000),
        store=store,
        **options,
    )


async def test_the_parent_delegates_three_reads_and_never_sees_the_files() -> None:
    write_files()
    store = MemoryStore()
    child = reader()
    model = parent_model()
    parent = Agent(
        model=model,
        tools=[child.as_tool(name="reader", description="Read a file, say its total")],
        store=store,
    )
    result = await parent.run("What is the grand total of the three ledgers?")

    assert result.outcome == "done"
    assert result.text == "the grand total is 172"
    assert len(model.requests) == 2
    assert all(FILLER.strip() not in request_text(r) for r in model.requests)
    results = [p for m in model.requests[-1].messages for p in m.tool_results]
    assert sorted(p.content for p in results) == [
        "the total is 120",
        "the total is 45",
        "the total is 7",
    ]
    assert not any(p.is_error for p in results)
    # The child's own requests held the file: its window was the one filled.
    assert any(FILLER.strip() in request_text(r) for r in child.driver.model.requests)  # type: ignore[attr-defined]
    assert child.driver.budget.context_window == 6_000


async def test_the_child_sessions_are_in_the_parents_store_linked_both_ways() -> None:
    write_files()
    store = MemoryStore()
    child_store = MemoryStore()
    parent = Agent(
        model=parent_model(),
        tools=[reader(child_store).as_tool(name="reader", description="Read")],
        store=store,
    )
    result = await parent.run("the grand total?")

    assert await child_store.list_sessions() == ()
    children = await child_sessions(store, result.session_id)
    assert len(children) == 3
    links = sorted((parent_of(c) for c in children), key=lambda x: str(x))
    assert links == [
        ParentLink(
            session_id=result.session_id,
            run_id=result.run_id,
            call_id=f"call_{name[:-4]}",
            depth=1,
        )
        for name in sorted(["east.txt", "north.txt", "south.txt"])
    ]
    for session in children:
        (run,) = session.runs
        assert run.outcome == "done"
        assert run.text.startswith("the total is ")
        # The child's transcript is its own: the file is in its history only.
        assert any(
            FILLER.strip() in m.content for h in session.history for m in h.tool_results
        )
        assert await child_sessions(store, session.id) == []
    parent_session = await Session.load(store, result.session_id)
    assert parent_of(parent_session) is None
    assert all(
        FILLER.strip() not in p.content
        for m in parent_session.history
        for p in m.tool_results
    )


async def test_usage_rolls_up_apart_from_the_parents_own() -> None:
    write_files()
    parent = Agent(
        model=parent_model(),
        tools=[reader().as_tool(name="reader", description="Read")],
        store=MemoryStore(),
    )
    result = await parent.run("the grand total?")

    # Two parent turns; three children of two turns each.
    assert result.usage == PARENT_USAGE + PARENT_USAGE
    assert result.children_usage == Usage(input_tokens=240, output_tokens=18)
    assert result.usage_with_children == Usage(input_tokens=440, output_tokens=28)


def delegating_model(tool: str) -> FakeModelClient:
    """Delegates the task once, then answers with what came back."""

    def answer(request: ModelRequest) -> ModelResponse:
        last = request.messages[-1]
        if last.tool_results:
            part = last.tool_results[0]
            flag = "error" if part.is_error else "ok"
            message = reply(f"{flag}: {part.content}")
        else:
            message = reply("", tool_call(tool, task=f"go deeper: {last.text}"))
        return ModelResponse(message=message, usage=Usage(input_tokens=1))

    return FakeModelClient(answer)


def self_delegating(store: SessionStore, **options: Any) -> Agent:
    """An agent given itself as a tool (through a late-bound wrapper)."""
    holder: list[Tool] = []

    async def delegate(task: str) -> Any:
        return await holder[0].fn(task=task)

    agent = Agent(
        model=delegating_model("myself"),
        tools=[
            Tool(
                name="myself",
                description="Hand the task to a fresh copy of yourself",
                parameters={
                    "type": "object",
                    "properties": {"task": {"type": "string"}},
                    "required": ["task"],
                },
                fn=delegate,
            )
        ],
        store=store,
    )
    holder.append(agent.as_tool(name="myself", description="copy", **options))
    return agent


@pytest.mark.parametrize(("max_depth", "children"), [(1, 1), (3, 3)])
async def test_an_agent_given_itself_stops_at_the_depth_limit(
    max_depth: int, children: int
) -> None:
    store = MemoryStore()
    agent = self_delegating(store, max_depth=max_depth)
    result = await agent.run("count the stars")

    assert result.outcome == "done"
    sessions = await store.list_sessions()
    assert len(sessions) == 1 + children
    # The deepest child's call got an error result naming the limit; each
    # level above got its child's answer.
    chain = [await Session.load(store, result.session_id)]
    while kids := await child_sessions(store, chain[-1].id):
        (kid,) = kids
        chain.append(kid)
    assert [parent_of(s).depth for s in chain[1:]] == list(range(1, children + 1))  # type: ignore[union-attr]
    deepest = chain[-1].runs[0].text
    assert deepest.startswith("error: tool 'myself' failed: SubagentTooDeep: ")
    assert f"depth {children + 1}, over its max_depth of {max_depth}" in deepest
    assert result.text.startswith("ok: ")


async def test_the_default_depth_limit_is_three() -> None:
    store = MemoryStore()
    agent = self_delegating(store)
    await agent.run("count the stars")

    assert len(await store.list_sessions()) == 4


async def test_a_failed_child_is_an_error_result_naming_its_typed_error() -> None:
    looping = FakeModelClient(lambda _r: reply("", tool_call("read_file", path="x")))
    child = Agent(model=looping, tools=[read_file], max_turns=1)
    store = MemoryStore()
    parent = Agent(
        model=delegating_model("reader"),
        tools=[child.as_tool(name="reader", description="Read")],
        store=store,
    )
    result = await parent.run("read x")

    assert result.outcome == "done"  # the parent's run goes on
    (kid,) = await child_sessions(store, result.session_id)
    assert kid.runs[0].outcome == "failed"
    assert result.text == (
        "error: tool 'reader' failed: SubagentFailed: the sub-agent 'reader' "
        f"ended failed: MaxTurnsExceeded: {kid.runs[0].error} (its run is kept as "
        f"session {kid.id!r}, in the parent agent's store)"
    )
    last = (await Session.load(store, result.session_id)).history[-2]
    assert last.tool_results[0].is_error


def stuck_child_parent(store: SessionStore) -> tuple[Agent, anyio.Event]:
    """A parent that delegates to a child whose model never answers.

    The event is set once the child's model has been called.
    """
    started = anyio.Event()

    async def stuck(_request: ModelRequest) -> Message:
        started.set()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    child = Agent(model=FakeModelClient(stuck))
    parent = Agent(
        model=delegating_model("reader"),
        tools=[child.as_tool(name="reader", description="Read")],
        store=store,
    )
    return parent, started


async def test_cancelling_the_parent_cancels_the_child() -> None:
    store = MemoryStore()
    parent, started = stuck_child_parent(store)
    control = RunControl()
    outcome: list[Any] = []

    async def run() -> None:
        outcome.append(await parent.run("read x", control=control))

    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            group.start_soon(run)
            await started.wait()
            control.cancel("the user stopped it")

    (result,) = outcome
    assert result.outcome == "cancelled"
    # No one waits on the child any more: its run is ended, not left open.
    (kid,) = await child_sessions(store, result.session_id)
    (run,) = kid.runs
    assert run.outcome == "failed"
    assert isinstance(run.error, Cancelled)
    assert run.error.reason == "its parent's run was cancelled"
    assert not kid.open_runs()
    link = parent_of(kid)
    assert link is not None
    assert (link.session_id, link.run_id) == (result.session_id, result.run_id)


async def test_cancelling_the_parent_ends_its_sub_agents_all_the_way_down() -> None:
    from turnfsm.persistence import descendants

    store = MemoryStore()
    started = anyio.Event()

    async def stuck(_request: ModelRequest) -> Message:
        started.set()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    leaf = Agent(model=FakeModelClient(stuck))
    middle = Agent(
        model=delegating_model("leaf"),
        tools=[leaf.as_tool(name="leaf", description="Leaf")],
    )
    parent = Agent(
        model=delegating_model("middle"),
        tools=[middle.as_tool(name="middle", description="Middle")],
        store=store,
    )
    control = RunControl()
    outcome: list[Any] = []

    async def run() -> None:
        outcome.append(await parent.run("read x", control=control))

    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            group.start_soon(run)
            await started.wait()
            control.cancel("the user stopped it")

    (result,) = outcome
    assert result.outcome == "cancelled"
    kids = await descendants(store, result.session_id)
    assert [parent_of(k).depth for k in kids] == [1, 2]  # type: ignore[union-attr]
    # No one waits on the sub-agent's own sub-agent either: none is left open.
    for kid in kids:
        (run,) = kid.runs
        assert run.outcome == "failed", (parent_of(kid), run.error)
        assert isinstance(run.error, Cancelled)
        assert not kid.open_runs()
        assert replay(None, kid, run.run_id).ok


async def test_a_sub_agent_past_its_calls_timeout_is_ended_not_left_open() -> None:
    store = MemoryStore()
    parent, _started = stuck_child_parent(store)
    parent.driver = attrs.evolve(parent.driver, tool_timeout=0.2)
    with anyio.fail_after(10):
        result = await parent.run("read x")
    # The call's result says it timed out, and the caller goes on: no one
    # will carry the sub-agent on, so its run is ended, not left open.
    assert result.outcome == "done", result.error
    assert "timed out after 0.2s" in result.text
    (kid,) = await child_sessions(store, result.session_id)
    (run,) = kid.runs
    assert run.outcome == "failed"
    assert isinstance(run.error, Cancelled)
    assert "timed out" in run.error.reason
    assert not kid.open_runs()
    assert replay(None, kid, run.run_id).ok


async def test_a_sub_agent_phase_past_its_effect_timeout_is_ended_not_left_open() -> (
    None
):
    from turnfsm import Driver, review_machine
    from turnfsm.driver import subagent_effect

    async def stuck(_request: ModelRequest) -> Message:
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    store = MemoryStore()
    review = subagent_effect(
        Agent(model=FakeModelClient(stuck)).driver, signal="approved", key="feedback"
    )
    writer = Driver(
        model=FakeModelClient(lambda _request: reply("draft")),
        machine=review_machine(),
        effects={"review": review},
        effect_timeout=0.2,
    )
    session = Session(store=store)
    with anyio.fail_after(10):
        result = await writer.run("go", session=session)
    assert result.outcome == "cancelled"
    (kid,) = await child_sessions(store, session.id)
    (run,) = kid.runs
    assert run.outcome == "failed"
    assert isinstance(run.error, Cancelled)
    assert "timed out" in run.error.reason
    assert not kid.open_runs()


async def test_a_caller_that_crashes_mid_batch_ends_the_sub_agents_it_stopped() -> None:
    from turnfsm.hooks import Hook, ToolCallEnd

    class Breaks(Hook):
        def on_tool_end(self, info: ToolCallEnd) -> None:
            raise RuntimeError("the hook broke")

    store = MemoryStore()
    started = anyio.Event()

    async def answer(request: ModelRequest) -> Message:
        if request.messages[-1].text == "slow":
            started.set()
            await anyio.sleep_forever()
        return reply("quick answer")

    child = Agent(model=FakeModelClient(answer))
    parent = Agent(
        model=FakeModelClient(
            lambda _request: reply(
                "",
                tool_call("reader", "c1", task="quick"),
                tool_call("reader", "c2", task="slow"),
            )
        ),
        tools=[child.as_tool(name="reader", description="Read")],
        hooks=[Breaks()],
        strict_hooks=True,
        store=store,
    )
    with anyio.fail_after(10), pytest.raises(RuntimeError, match="the hook broke"):
        await parent.run("go")
    assert [r.outcome for r in parent.session.runs] == ["failed"]
    # The caller's run is over: the sub-agent it stopped is not left open.
    for kid in await child_sessions(store, parent.session.id):
        assert not kid.open_runs(), [(r.outcome, r.error) for r in kid.runs]


async def test_interrupting_the_parent_interrupts_the_child() -> None:
    store = MemoryStore()
    parent, started = stuck_child_parent(store)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            group.start_soon(parent.run, "read x")
            await started.wait()
            group.cancel_scope.cancel()  # as Ctrl-C or a cancelled task does

    # Both runs are left as a stopped process leaves them: open, to resume.
    (top,) = [s for s in await store.list_sessions() if s.id == parent.session.id]
    parent_session = await Session.load(store, top.id)
    assert [r.outcome for r in parent_session.runs] == ["interrupted"]
    (kid,) = await child_sessions(store, top.id)
    assert [r.outcome for r in kid.runs] == ["interrupted"]
    assert kid.open_runs()


async def test_the_childs_spans_nest_under_the_delegating_tool_span() -> None:
    write_files()
    traced = Traced.create()
    child = reader(hooks=[traced.hook], name="reader-agent")
    parent = Agent(
        model=parent_model(),
        tools=[child.as_tool(name="reader", description="Read")],
        hooks=[traced.hook],
        name="lead",
        store=MemoryStore(),
    )
    await parent.run("the grand total?")

    spans = traced.spans
    by_id = {s.context.span_id: s for s in spans}
    (root,) = [s for s in spans if s.parent is None]
    assert root.name == "invoke_agent lead"
    children = [s for s in spans if s.name == "invoke_agent reader-agent"]
    assert len(children) == 3
    for span in children:
        assert span.parent is not None
        above = by_id[span.parent.span_id]
        assert above.name == "execute_tool reader"
        assert span.context.trace_id == root.context.trace_id
    assert traced.unended() == []


async def test_a_run_not_delegated_records_no_parent_and_old_logs_load() -> None:
    result = await Agent(model=FakeModelClient(lambda _r: "hi")).run("hello")
    assert result.children_usage == Usage()
    opened = RunOpened(
        run_id="run_1", machine="turn", digest="d", budget=result_budget(), at=1.0
    )
    data = to_json(opened)
    assert "parent" not in data  # type: ignore[operator]
    assert from_json(RunOpened, data) == opened
    linked = RunOpened(
        run_id="run_1",
        machine="turn",
        digest="d",
        budget=result_budget(),
        at=1.0,
        parent=ParentLink(session_id="ses_1", run_id="run_0", call_id="call_1"),
    )
    assert from_json(RunOpened, to_json(linked)) == linked


def result_budget() -> Any:
    from turnfsm.core import Budget

    return Budget()


@pytest.mark.parametrize(
    ("options", "error", "named"),
    [
        ({"name": "", "description": "d"}, ConfigError, "name"),
        ({"name": "r", "description": ""}, ConfigError, "description"),
        ({"name": "r", "description": "d", "max_depth": 0}, ConfigError, "max_depth"),
        (
            {"name": "r", "description": "d", "max_depth": True},
            ConfigError,
            "max_depth",
        ),
        (
            {"name": "r", "description": "d", "max_children": 0},
            ConfigError,
            "max_children",
        ),
        ({"name": "r w", "description": "d"}, ToolError, "r w"),
    ],
)
def test_bad_tool_settings_are_refused_naming_the_field(
    options: dict[str, Any], error: type[Exception], named: str
) -> None:
    agent = Agent(model=FakeModelClient(lambda _r: "hi"))
    with pytest.raises(error, match=re.escape(named)):
        agent.as_tool(**options)


async def test_sessions_show_lists_the_children_indented_and_the_parent() -> None:
    write_files()
    path = "links.db"
    store = SQLiteStore(path)
    try:
        grandchild = reader(model=child_model())
        middle = Agent(
            model=delegating_model("reader"),
            tools=[grandchild.as_tool(name="reader", description="Read")],
        )
        top = Agent(
            model=delegating_model("middle"),
            tools=[middle.as_tool(name="middle", description="Delegate")],
            session=Session("ses_top", store=store),
        )
        result = await top.run("north.txt")
        (kid,) = await child_sessions(store, "ses_top")
        (grandkid,) = await child_sessions(store, kid.id)
    finally:
        await store.aclose()
    assert result.text.startswith("ok: ok: the total is 120")

    out = io.StringIO()
    command = SessionsCommand(action="show", store=str(path), session_id="ses_top")
    assert await anyio.to_thread.run_sync(lambda: run_sessions(command, out=out)) == 0
    tail = out.getvalue().split("\nsub-agent sessions (2):\n")[1]
    assert re.fullmatch(
        rf"  {kid.id}  done  2 turn\(s\)  usage 2 in / 0 out  for call call_\w+\n"
        rf"    {grandkid.id}  done  2 turn\(s\)  usage 80 in / 6 out  "
        r"for call call_\w+\n",
        tail,
    )
    out = io.StringIO()
    command = SessionsCommand(action="show", store=str(path), session_id=grandkid.id)
    assert await anyio.to_thread.run_sync(lambda: run_sessions(command, out=out)) == 0
    link = parent_of(grandkid)
    assert link is not None
    assert (
        f"\ndelegated by: session {kid.id} run {link.run_id} call {link.call_id} "
        "(depth 2)\n"
    ) in out.getvalue()
    assert "sub-agent sessions" not in out.getvalue()


async def test_sessions_show_says_a_child_s_usage_was_not_reported() -> None:
    path = "silent.db"
    store = SQLiteStore(path)
    try:
        quiet = Agent(model=FakeModelClient(lambda _r: "hi"))  # reports no usage
        top = Agent(
            model=delegating_model("quiet"),
            tools=[quiet.as_tool(name="quiet", description="Ask")],
            session=Session("ses_top", store=store),
        )
        await top.run("x")
    finally:
        await store.aclose()
    out = io.StringIO()
    command = SessionsCommand(action="show", store=str(path), session_id="ses_top")
    assert await anyio.to_thread.run_sync(lambda: run_sessions(command, out=out)) == 0
    tail = out.getvalue().split("\nsub-agent sessions (1):\n")[1]
    assert re.fullmatch(
        r"  ses_\w+  done  1 turn\(s\)  usage not reported  for call call_\w+\n", tail
    )


async def test_the_parent_and_its_children_replay_from_the_log() -> None:
    write_files()
    store = MemoryStore()
    parent = Agent(
        model=parent_model(),
        tools=[reader().as_tool(name="reader", description="Read")],
        store=store,
    )
    result = await parent.run("the grand total?")

    sessions = [await Session.load(store, result.session_id)]
    sessions += await child_sessions(store, result.session_id)
    assert len(sessions) == 4
    for session in sessions:
        for run in session.runs:
            assert replay(None, session, run.run_id).ok


async def test_an_agent_run_by_hand_inside_a_child_records_no_parent() -> None:
    store = MemoryStore()
    by_hand: list[str] = []

    async def consult(task: str) -> str:
        """Ask a helper by hand.

        Args:
            task: What to ask.
        """
        helper = Agent(model=FakeModelClient(lambda _r: "42"), store=store)
        answer = await helper.run(task)
        by_hand.append(answer.session_id)
        return answer.text

    child = Agent(model=delegating_model("consult"), tools=[consult])
    parent = Agent(
        model=delegating_model("child"),
        tools=[child.as_tool(name="child", description="Ask the child")],
        store=store,
    )
    result = await parent.run("the answer?")

    assert result.text == "ok: ok: 42"
    (kid,) = await child_sessions(store, result.session_id)
    assert parent_of(kid) is not None
    (helper_id,) = by_hand
    assert parent_of(await Session.load(store, helper_id)) is None
    assert await child_sessions(store, kid.id) == []


async def test_resuming_an_interrupted_parent_carries_its_child_on() -> None:
    ran: list[str] = []

    def count(label: str) -> str:
        """Count a label.

        Args:
            label: What to count.
        """
        ran.append(label)
        return f"counted {label}"

    stuck_once = anyio.Event()
    calls = {"n": 0}

    async def child_answer(request: ModelRequest) -> Message:
        calls["n"] += 1
        if not any(m.tool_results for m in request.messages):
            return reply("", tool_call("count", "k1", label="one"))
        if calls["n"] == 2:  # after the tool: the process "stops" here
            stuck_once.set()
            await anyio.sleep_forever()
        return reply("counted once")

    store = MemoryStore()
    child = Agent(model=FakeModelClient(child_answer), tools=[count])
    tool = child.as_tool(name="reader", description="Read")
    assert tool.idempotent  # a resumed parent runs the call again
    parent = Agent(model=delegating_model("reader"), tools=[tool], store=store)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            group.start_soon(parent.run, "read x")
            await stuck_once.wait()
            group.cancel_scope.cancel()
    (kid,) = await child_sessions(store, parent.session.id)
    assert [r.outcome for r in kid.runs] == ["interrupted"]

    # Another process: the same agents, on the same store.
    again = Agent(model=delegating_model("reader"), tools=[tool], store=store)
    (run,) = (await Session.load(store, parent.session.id)).runs
    result = await again.resume(parent.session.id, run.run_id)

    assert result.outcome == "done", result.error
    assert result.text == "ok: counted once"
    assert ran == ["one"]  # the child's finished tool call did not run again
    (kid,) = await child_sessions(store, parent.session.id)
    assert [r.outcome for r in kid.runs] == ["done"]  # the same run, carried on
    assert not kid.open_runs()


async def test_a_parent_resumed_after_its_child_finished_takes_the_answer() -> None:
    store = MemoryStore()
    child = Agent(model=FakeModelClient(lambda _r: reply("the answer")))
    tool = child.as_tool(name="reader", description="Read")
    parent = Agent(model=delegating_model("reader"), tools=[tool], store=store)
    first = await parent.run("read x")
    assert first.text == "ok: the answer"
    (kid,) = await child_sessions(store, parent.session.id)
    link = parent_of(kid)
    assert link is not None
    # The same call runs again (as a resumed parent runs it): no new child run.
    session = await Session.load(store, parent.session.id)
    (call,) = [c for m in session.history for c in m.tool_calls]
    assert kid.id == child_ids(session.id, first.run_id, call.id)[0]
    with session_scope(session), run_scope(first.run_id, None, parent.driver.machine):
        again = await run_tool_call(call, {"reader": tool}, limit=None)
    assert again.tool_results[0].content == "the answer"
    (kid,) = await child_sessions(store, parent.session.id)
    assert len(kid.runs) == 1


async def test_a_model_that_reuses_call_ids_still_starts_a_child_per_run() -> None:
    answers = iter(["first answer", "second answer"])
    child = Agent(model=FakeModelClient(lambda _r: reply(next(answers))))

    def same_ids(request: ModelRequest) -> Message:
        last = request.messages[-1]
        if last.tool_results:
            return reply(last.tool_results[0].content)
        return reply("", tool_call("reader", "call_0", task="go"))

    store = MemoryStore()
    parent = Agent(
        model=FakeModelClient(same_ids),
        tools=[child.as_tool(name="reader", description="Read")],
        store=store,
    )
    assert (await parent.run("one")).text == "first answer"
    assert (await parent.run("two")).text == "second answer"
    assert len(await child_sessions(store, parent.session.id)) == 2


def careful_child(**options: Any) -> tuple[Agent, list[str]]:
    """A sub-agent on the approval machine: it asks before deleting two files."""
    from turnfsm import approval_machine

    deleted: list[str] = []

    def delete_file(path: str) -> str:
        """Delete a file.

        Args:
            path: The file.
        """
        deleted.append(path)
        return f"deleted {path}"

    def plan(request: ModelRequest) -> ModelResponse:
        results = [p.content for m in request.messages for p in m.tool_results]
        if results:
            message = reply("Report: " + "; ".join(results))
        else:
            message = reply(
                "",
                tool_call("delete_file", "c1", path="a.tmp"),
                tool_call("delete_file", "c2", path="b.tmp"),
            )
        return ModelResponse(message=message, usage=CHILD_USAGE)

    agent = Agent(
        model=FakeModelClient(plan),
        tools=[delete_file],
        machine=approval_machine(),
        **options,
    )
    return agent, deleted


async def _waiting_parent(store: SessionStore) -> tuple[Agent, list[str], Any]:
    child, deleted = careful_child()
    parent = Agent(
        model=delegating_model("cleaner"),
        tools=[child.as_tool(name="cleaner", description="Deletes, asking first")],
        store=store,
    )
    result = await parent.run("clean up")
    return parent, deleted, result


async def test_a_sub_agent_that_pauses_is_no_error_in_its_callers_trace() -> None:
    # Waiting for an answer is not a failure: the caller's call to it ends
    # cut short, as the caller's turn and run do, not as a tool that failed.
    from opentelemetry.trace import StatusCode

    from turnfsm.tracing import attributes as A

    traced = Traced.create()
    child, _ = careful_child(hooks=[traced.hook])
    parent = Agent(
        model=delegating_model("cleaner"),
        tools=[child.as_tool(name="cleaner", description="Deletes, asking first")],
        hooks=[traced.hook],
        store=MemoryStore(),
    )
    result = await parent.run("clean up")
    assert result.outcome == "interrupted"
    assert traced.unended() == []
    (call,) = [s for s in traced.spans if s.name == "execute_tool cleaner"]
    attributes = call.attributes or {}
    assert call.status.status_code is not StatusCode.ERROR, call.status
    assert A.ERROR_TYPE not in attributes
    assert [e.name for e in call.events] == []
    assert attributes.get(A.CANCELLED) is True
    errors = [s.name for s in traced.spans if s.status.status_code is StatusCode.ERROR]
    assert errors == []
    durations = traced.metric(A.METRIC_OPERATION_DURATION, field="count")
    assert all(A.ERROR_TYPE not in dict(key) for key in durations)


async def test_a_sub_agent_that_pauses_stops_its_caller_until_answered() -> None:
    from turnfsm.core import ToolCallsReviewed
    from turnfsm.errors import SubagentWaiting

    store = MemoryStore()
    parent, deleted, result = await _waiting_parent(store)
    assert result.outcome == "interrupted"
    waiting = result.error
    assert isinstance(waiting, SubagentWaiting)
    assert (waiting.tool, waiting.phase, waiting.calls) == (
        "cleaner",
        "await_approval",
        ("c1", "c2"),
    )
    (kid,) = await child_sessions(store, result.session_id)
    assert waiting.session_id == kid.id
    assert [r.outcome for r in kid.runs] == ["paused"]
    assert deleted == []

    # Resumed with no answer, the caller stops again; nothing runs.
    again = await parent.resume(result.session_id, result.run_id)
    assert again.outcome == "interrupted"
    assert isinstance(again.error, SubagentWaiting)
    assert str(again.error) == str(waiting)
    assert deleted == []

    # The answer goes to the sub-agent; both go on, each tool once.
    done = await parent.resume(
        result.session_id, result.run_id, ToolCallsReviewed.approve_all()
    )
    assert done.outcome == "done", done.error
    assert done.text == "ok: Report: deleted a.tmp; deleted b.tmp"
    assert sorted(deleted) == ["a.tmp", "b.tmp"]
    (kid,) = await child_sessions(store, result.session_id)
    assert [r.outcome for r in kid.runs] == ["done"]
    for session in (await Session.load(store, result.session_id), kid):
        for run in session.runs:
            assert replay(None, session, run.run_id).ok


async def test_a_rejection_reaches_the_sub_agent_through_its_caller() -> None:
    from turnfsm.core import ToolCallsReviewed

    store = MemoryStore()
    parent, deleted, result = await _waiting_parent(store)
    done = await parent.resume(
        result.session_id,
        result.run_id,
        ToolCallsReviewed.reject({"c2": "not that one"}),
    )
    assert done.outcome == "done", done.error
    assert deleted == ["a.tmp"]
    assert "not that one" in done.text


async def test_an_answer_the_sub_agent_cannot_take_leaves_both_waiting() -> None:
    from turnfsm.core import ToolCallsReviewed
    from turnfsm.errors import ConfigError, SubagentWaiting

    store = MemoryStore()
    parent, deleted, result = await _waiting_parent(store)
    before = await Session.load(store, result.session_id)
    # "c9" is no call the sub-agent waits on (it waits on c1 and c2).
    with pytest.raises(ConfigError) as refused:
        await parent.resume(
            result.session_id,
            result.run_id,
            ToolCallsReviewed.reject({"c9": "no"}),
        )
    assert refused.value.field == "event.results.call_id"
    assert "c9" in str(refused.value)
    # Nothing was written: the caller still waits, its sub-agent too.
    after = await Session.load(store, result.session_id)
    assert len(after.entries) == len(before.entries)
    (kid,) = await child_sessions(store, result.session_id)
    assert [r.outcome for r in kid.runs] == ["paused"]
    assert deleted == []
    # Answered again, rightly, both go on.
    done = await parent.resume(
        result.session_id, result.run_id, ToolCallsReviewed.approve_all()
    )
    assert done.outcome == "done", done.error
    assert isinstance(result.error, SubagentWaiting)
    assert sorted(deleted) == ["a.tmp", "b.tmp"]


async def test_a_waiting_caller_resumed_with_a_cancel_ends_cancelled() -> None:
    from turnfsm.core import RunCancelled

    store = MemoryStore()
    parent, deleted, result = await _waiting_parent(store)
    calls = len(parent.driver.model.requests)
    stopped = await parent.resume(
        result.session_id, result.run_id, RunCancelled(reason="the user said stop")
    )
    # The caller ends as asked, its model not called again, nothing run;
    # no one waits on its sub-agent any more: that ends too.
    assert stopped.outcome == "cancelled", stopped.error
    assert isinstance(stopped.error, Cancelled)
    assert stopped.error.reason == "the user said stop"
    assert len(parent.driver.model.requests) == calls
    assert deleted == []
    # What the sub-agent used before it ended counts.
    assert stopped.children_usage == CHILD_USAGE
    (kid,) = await child_sessions(store, result.session_id)
    assert not kid.open_runs()
    (run,) = kid.runs
    assert isinstance(run.error, Cancelled)
    for session in (await Session.load(store, result.session_id), kid):
        for each in session.runs:
            assert replay(None, session, each.run_id).ok


async def test_a_caller_still_waiting_counts_what_its_waiting_sub_agents_used() -> None:
    from turnfsm.core import ToolCallsReviewed

    child, _deleted = careful_child()

    def two_at_once(request: ModelRequest) -> Message:
        if request.messages[-1].tool_results:
            return reply("both done")
        return reply(
            "",
            tool_call("cleaner", "w1", task="clean here"),
            tool_call("cleaner", "w2", task="clean there"),
        )

    parent = Agent(
        model=FakeModelClient(two_at_once),
        tools=[child.as_tool(name="cleaner", description="Deletes, asking first")],
        store=MemoryStore(),
    )
    first = await parent.run("clean up")
    assert first.children_usage == CHILD_USAGE + CHILD_USAGE
    # Resumed with no answer: each sub-agent made one model call and waits;
    # both count, as they did when the caller first stopped.
    stopped = await parent.resume(first.session_id, first.run_id)
    assert stopped.children_usage == first.children_usage
    # One answered (two calls, done), the other still waiting (one call).
    again = await parent.resume(
        stopped.session_id, stopped.run_id, ToolCallsReviewed.approve_all()
    )
    assert again.outcome == "interrupted"
    assert again.children_usage == CHILD_USAGE + CHILD_USAGE + CHILD_USAGE


async def test_a_run_past_max_children_gets_an_error_result_and_goes_on() -> None:
    write_files()
    store = MemoryStore()
    tool = reader().as_tool(name="reader", description="Read", max_children=2)
    seen: list[str] = []

    def lead(request: ModelRequest) -> ModelResponse:
        last = request.messages[-1]
        if last.tool_results:
            seen.extend(p.content for m in request.messages for p in m.tool_results)
            return ModelResponse(message=reply("done"))
        calls = [
            tool_call("reader", f"call_{name[:-4]}", task=f"Read {name}: total?")
            for name in TOTALS
        ]
        return ModelResponse(message=reply("", *calls))

    parent = Agent(model=FakeModelClient(lead), tools=[tool], store=store)
    result = await parent.run("add up the totals")
    assert result.ok, result.error
    # Three calls in one batch: two sub-agents ran, the third was refused
    # (which one is the scheduler's choice: the calls run side by side).
    answered = [s for s in seen if s.startswith("the total is ")]
    refused = [s for s in seen if "SubagentTooMany" in s]
    assert (len(answered), len(refused), len(seen)) == (2, 1, 3)
    assert "started 2 sub-agent(s) with 'reader', its max_children" in refused[0]
    assert len(await child_sessions(store, result.session_id)) == 2


async def test_a_machine_phase_runs_a_sub_agent_and_routes_on_its_answer() -> None:
    from turnfsm import Driver, review_machine
    from turnfsm.driver import subagent_effect

    drafts = iter(["a draft with no source", "a draft, source: the ledger"])

    def writer(request: ModelRequest) -> Message:
        return reply(next(drafts))

    def reviewer(request: ModelRequest) -> Message:
        task = request.messages[-1].text
        return reply("approved" if "source:" in task else "cite your source")

    review = subagent_effect(
        Agent(model=FakeModelClient(reviewer)).driver,
        signal=lambda answer: "approved" if answer == "approved" else "revise",
        task=lambda conversation: f"Review this: {conversation[-1].text}",
        key="feedback",
    )
    store = MemoryStore()
    driver = Driver(
        model=FakeModelClient(writer),
        machine=review_machine(),
        effects={"review": review},
    )
    session = Session(store=store)
    result = await driver.run("write it", session=session)

    assert result.outcome == "done", result.error
    assert result.text == "a draft, source: the ledger"
    # The first review's answer joined the conversation as a user message.
    texts_ = [m.text for m in session.history]
    assert texts_ == [
        "write it",
        "a draft with no source",
        "cite your source",
        "a draft, source: the ledger",
    ]
    reviews = await child_sessions(store, session.id)
    assert [k.runs[0].text for k in reviews] == ["cite your source", "approved"]
    links = [parent_of(k) for k in reviews]
    assert [link.call_id.split("-")[0] for link in links if link] == [
        "await_review",
        "await_review",
    ]
    assert result.children_usage == sum(
        (k.runs[0].usage for k in reviews), start=Usage()
    )
    for run in (await Session.load(store, session.id)).runs:
        assert replay(None, session, run.run_id).ok


async def test_a_phase_whose_sub_agent_fails_routes_or_fails_typed() -> None:
    from turnfsm import Driver, review_machine
    from turnfsm.driver import subagent_effect
    from turnfsm.errors import EffectFailed

    def broken(request: ModelRequest) -> Message:
        raise ProviderError("down", retryable=False)

    def writer(request: ModelRequest) -> Message:
        return reply("a draft")

    child = Agent(model=FakeModelClient(broken)).driver
    failing = Driver(
        model=FakeModelClient(writer),
        machine=review_machine(),
        effects={"review": subagent_effect(child, signal="approved")},
    )
    result = await failing.run("write it")
    assert result.outcome == "failed"
    assert isinstance(result.error, EffectFailed)
    assert result.error.type == "SubagentFailed"

    routed = Driver(
        model=FakeModelClient(writer),
        machine=review_machine(),
        effects={
            "review": subagent_effect(child, signal="revise", on_failure="approved")
        },
    )
    assert (await routed.run("write it")).outcome == "done"


async def test_a_task_over_the_sub_agents_window_fails_its_call_not_the_caller() -> (
    None
):
    from turnfsm import Driver, review_machine
    from turnfsm.driver import subagent_effect
    from turnfsm.errors import EffectFailed

    task = "word " * 3_000  # pinned (the child's first request), over its window
    child = Agent(
        model=FakeModelClient(lambda _r: reply("unreachable")),
        context=ContextManager(context_window=2_000),
        max_output_tokens=200,
    )
    store = MemoryStore()
    model = FakeModelClient(
        lambda r: (
            reply(r.messages[-1].tool_results[0].content)
            if r.messages[-1].tool_results
            else reply("", tool_call("reader", task=task))
        )
    )
    parent = Agent(
        model=model,
        tools=[child.as_tool(name="reader", description="Read")],
        store=store,
    )
    result = await parent.run("read it")

    assert result.outcome == "done"  # the model was told, and went on
    assert result.text.startswith(
        "tool 'reader' failed: SubagentFailed: the sub-agent 'reader' did not "
        "run: PinnedTooLarge: pinned messages do not fit"
    )
    assert "emergency line of the 2000-token window" in result.text
    assert await child_sessions(store, result.session_id) == []  # none started

    def routed(on_failure: str | None) -> Driver:
        return Driver(
            model=FakeModelClient(lambda _r: reply("a draft")),
            machine=review_machine(),
            effects={
                "review": subagent_effect(
                    child.driver, signal="revise", task=task, on_failure=on_failure
                )
            },
        )

    assert (await routed("approved").run("write it")).outcome == "done"
    failed = await routed(None).run("write it")
    assert failed.outcome == "failed"
    assert isinstance(failed.error, EffectFailed)
    assert failed.error.type == "SubagentFailed"
    assert "PinnedTooLarge" in failed.error.message


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"signal": ""}, "signal"),
        ({"signal": "x", "key": ""}, "key"),
        ({"signal": "x", "on_failure": ""}, "on_failure"),
        ({"signal": "x", "task": 3}, "task"),
        ({"signal": "x", "max_children": 0}, "max_children"),
    ],
)
def test_bad_phase_settings_are_refused_naming_the_field(
    options: dict[str, Any], named: str
) -> None:
    from turnfsm.driver import subagent_effect

    child = Agent(model=FakeModelClient(lambda _r: "hi")).driver
    with pytest.raises(ConfigError) as caught:
        subagent_effect(child, **options)
    assert caught.value.field == named


async def test_a_waiting_caller_resumed_without_its_sub_agent_tool_is_refused() -> None:
    from turnfsm.core import ToolCallsReviewed

    store = MemoryStore()
    _parent, deleted, result = await _waiting_parent(store)
    bare = Agent(model=delegating_model("cleaner"), store=store)  # no cleaner tool
    with pytest.raises(ConfigError) as caught:
        await bare.resume(
            result.session_id, result.run_id, ToolCallsReviewed.approve_all()
        )
    assert caught.value.field == "tools"
    assert "the sub-agent tool the run waits in (cleaner)" in str(caught.value)
    # Nothing was written: both runs still wait, and nothing ran.
    (run,) = (await Session.load(store, result.session_id)).runs
    assert run.outcome == "interrupted"
    (kid,) = await child_sessions(store, result.session_id)
    assert [r.outcome for r in kid.runs] == ["paused"]
    assert deleted == []


async def test_a_sub_agent_outside_a_session_that_pauses_is_a_failure() -> None:
    from turnfsm.errors import SubagentFailed

    child, deleted = careful_child()
    tool = child.as_tool(name="cleaner", description="Deletes, asking first")
    with pytest.raises(SubagentFailed) as caught:
        await tool.fn(task="clean up")  # no caller's run: no one can answer it
    assert caught.value.outcome == "paused"
    assert "outside a session cannot" in caught.value.cause
    assert deleted == []


async def test_a_session_id_with_a_lone_surrogate_delegates_like_any_other(
    tmp_path: Path,
) -> None:
    # The sub-agent's ids are hashed from its caller's: the call's result
    # was "UnicodeEncodeError: ... surrogates not allowed", nothing delegated.
    def lead(request: ModelRequest) -> Message:
        results = request.messages[-1].tool_results
        if results:
            return reply("done: " + results[0].content)
        return reply("", tool_call("helper", "c1", task="look"))

    async with SQLiteStore(tmp_path / "s.db") as store:
        helper = Agent(model=FakeModelClient(lambda _r: reply("found")))
        session = Session("ses_caf\udce9", store=store)
        agent = Agent(
            model=FakeModelClient(lead),
            tools=[helper.as_tool(name="helper", description="Look")],
            session=session,
        )
        result = await agent.run("go")
        assert result.text == "done: found"
        (kid,) = await child_sessions(store, session.id)
        assert kid.id == child_ids(session.id, result.run_id, "c1")[0]
    # Ids without one are derived as they always were: resumed callers
    # find the sub-agents they started.
    assert child_ids("ses_a", "run_b", "c1") == (
        "ses_b8bc9917e46509ee82b7",
        "run_5f9b7b817752e377aecb",
    )


async def test_a_blank_task_is_an_invalid_argument_and_starts_no_child() -> None:
    # The schema's minLength lets " " through; the child would be started
    # on a blank user message and fail as an invalid message.
    child = Agent(model=FakeModelClient(lambda _r: "never asked"))
    store = MemoryStore()
    replies = iter([reply("", tool_call("reader", "call_blank", task=" \n ")), "ok"])
    parent = Agent(
        model=FakeModelClient(lambda _r: next(replies)),
        tools=[child.as_tool(name="reader", description="Read", max_children=1)],
        store=store,
    )
    result = await parent.run("read x")
    assert result.outcome == "done"
    (said,) = parent.session.history[-2].tool_results
    assert said.is_error
    assert said.content == (
        "invalid arguments for tool 'reader'; it did not run:\n"
        '- task: expected a text that is not blank, got " \\n " (string)\n'
        "Call 'reader' again with corrected arguments."
    )
    assert await child_sessions(store, result.session_id) == []


async def test_a_caller_waiting_on_its_sub_agent_lets_its_session_compact() -> None:
    # A person may take a day to answer the sub-agent; meanwhile the
    # operator compacts the caller's session, as for a paused run. The
    # caller goes on from the compacted history when answered.
    from turnfsm.context import TruncatingCompactor
    from turnfsm.core import ToolCallsReviewed
    from turnfsm.testing import ScriptedModel

    store = MemoryStore()
    child, deleted = careful_child()
    parent = Agent(
        model=delegating_model("cleaner"),
        tools=[child.as_tool(name="cleaner", description="Deletes, asking first")],
        store=store,
        context=ContextManager(TruncatingCompactor(preserve_recent=1, min_messages=2)),
    )
    chat = Agent(model=ScriptedModel.of("noted 1", "noted 2"), session=parent.session)
    for text in ("first", "second"):
        assert (await chat.run(text)).ok
    result = await parent.run("clean up")
    assert result.outcome == "interrupted"

    compacted = await parent.compact()
    assert compacted.ok, compacted.error
    (record,) = parent.session.runs[-1].compactions
    assert record.compacted

    done = await parent.resume(
        result.session_id, result.run_id, ToolCallsReviewed.approve_all()
    )
    assert done.outcome == "done", done.error
    assert done.text == "ok: Report: deleted a.tmp; deleted b.tmp"
    assert sorted(deleted) == ["a.tmp", "b.tmp"]
    session = await Session.load(store, result.session_id)
    said = [m.text for m in session.history]
    assert "noted 1" not in said
    assert said[-1] == done.text
    for each in (session, *(await child_sessions(store, session.id))):
        for run in each.runs:
            assert replay(None, each, run.run_id).ok


async def test_a_child_whose_run_crashed_failed_and_what_it_used_counts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The child's crash went up as the tool's own error: the caller was not
    # told a sub-agent failed, nor its session, and what it used was lost.
    def look(x: str) -> str:
        """Look.

        Args:
            x: What.
        """
        return "ok"

    def child_model(request: ModelRequest) -> ModelResponse:
        if sum(len(m.tool_results) for m in request.messages) >= 1:
            raise RuntimeError("the client has a bug")
        used = Usage(input_tokens=100, output_tokens=10)
        return ModelResponse(message=reply("", tool_call("look", x="a")), usage=used)

    def lead_model(request: ModelRequest) -> Message:
        said = [p.content for m in request.messages for p in m.tool_results]
        return (
            reply("saw: " + said[0]) if said else reply("", tool_call("kid", task="t"))
        )

    child = Agent(model=FakeModelClient(child_model), tools=[look], name="kid")
    lead = Agent(
        model=FakeModelClient(lead_model),
        tools=[child.as_tool(name="kid", description="Ask the kid")],
        store=MemoryStore(),
    )

    result = await lead.run("go")

    assert result.ok
    assert result.text.startswith(
        "saw: tool 'kid' failed: SubagentFailed: the sub-agent 'kid' ended failed:"
        " RunCrashed: run crashed on RuntimeError: the client has a bug"
    )
    assert result.children_usage == Usage(input_tokens=100, output_tokens=10)
    assert "sub-agent 'kid' crashed" in caplog.text
    assert "the client has a bug" in caplog.text


async def test_a_call_that_times_out_ends_its_sub_agents_at_every_depth() -> None:
    # The grandchild was left interrupted, a run no one would resume, and
    # what it used was counted nowhere.
    async def wait(x: str) -> str:
        """Wait.

        Args:
            x: What for.
        """
        await anyio.sleep(30)
        return "ok"

    def calls(name: str, tokens: int) -> FakeModelClient:
        used = Usage(input_tokens=tokens, output_tokens=1)
        call = tool_call(
            name, "x1", **({"x": "1"} if name == "wait" else {"task": "t"})
        )
        return FakeModelClient(
            lambda r: ModelResponse(message=reply("", call), usage=used)
        )

    store = MemoryStore()
    grandchild = Agent(model=calls("wait", 7), tools=[wait], name="g")
    child = Agent(
        model=calls("g", 100), tools=[grandchild.as_tool(name="g", description="G")]
    )

    def lead_model(request: ModelRequest) -> Message:
        if request.messages[-1].tool_results:
            return reply("done")
        return reply("", tool_call("k", "c1", task="t"))

    lead = Agent(
        model=FakeModelClient(lead_model),
        tools=[child.as_tool(name="k", description="K")],
        store=store,
        tool_timeout=0.5,
    )

    with anyio.fail_after(20):
        result = await lead.run("go")

    assert result.ok
    assert result.children_usage == Usage(input_tokens=107, output_tokens=2)
    (middle,) = await child_sessions(store, result.session_id)
    (bottom,) = await child_sessions(store, middle.id)
    for below in (middle, bottom):
        (run,) = below.runs
        assert run.outcome == "failed"
        assert "or a call above it, timed out" in str(run.error)


@attrs.define
class City:
    """A city.

    Attributes:
        name: Its name.
        population: How many live there.
    """

    name: str
    population: int


@attrs.define
class Ranked:
    """A ranked city.

    Attributes:
        name: Its name.
        rank: Its rank (0: none).
    """

    name: str
    rank: int = 0


@pytest.mark.parametrize(
    ("output_type", "said", "answer"),
    [
        (
            City,
            '```json\n{"name": "Tokyo", "population": 37400000}\n```',
            {"name": "Tokyo", "population": 37400000},
        ),
        (int, '{"result": 42}', 42),
        (int, "42", 42),
        (int, "1.0", 1),  # the value the type reads, not the number as written
        (Ranked, '{"name": "Lyon"}', {"name": "Lyon", "rank": 0}),  # its default
        (str, "just words", None),
    ],
    ids=["fenced", "wrapped", "bare", "read-as-the-type", "default", "plain-text"],
)
async def test_a_structured_sub_agent_answers_its_caller_with_the_value_as_json(
    output_type: Any, said: str, answer: Any
) -> None:
    def lead(request: ModelRequest) -> Message:
        last = request.messages[-1]
        if last.tool_results:
            return reply(last.tool_results[0].content)
        return reply("", tool_call("finder", "k1", task="Name a big city."))

    finder = Agent(model=FakeModelClient(lambda r: said), output_type=output_type)
    boss = Agent(
        model=FakeModelClient(lead),
        tools=[finder.as_tool(name="finder", description="Finds a city.")],
    )

    result = await boss.run("go")

    assert result.ok, result.error
    if answer is None:
        assert result.text == said
    else:
        loaded = json.loads(result.text)
        assert (loaded, type(loaded)) == (answer, type(answer))
