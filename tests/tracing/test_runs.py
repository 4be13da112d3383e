"""What a trace shows of a run beyond its shape: summary calls, resumed and
concurrent runs, and transition events that point at the machine file."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.helpers import REPO_ROOT, approval_toml, turn_toml_text
from tests.tracing._spans import (
    COMPACTED,
    STARTED,
    STATUS,
    Named,
    Node,
    Traced,
    agent,
    chat,
    echo,
    file_transitions,
    history,
    masks,
    said,
    tool,
    traced_driver,
    transitions,
    turn,
)
from turnfsm import Agent, approval_machine
from turnfsm.context import ContextManager, PinRules, SummarizingCompactor
from turnfsm.core import (
    MachineSpec,
    Perform,
    Signal,
    ToolCallsReviewed,
    ToolsFinished,
    trigger_of,
)
from turnfsm.driver import EffectContext, RunControl, Session, run_tool_with_hooks
from turnfsm.hooks import Hook, ToolCallEnd, ToolCallInfo
from turnfsm.messages import Message
from turnfsm.persistence import EventRecorded, machine_digest
from turnfsm.providers import ModelRequest, ModelResponse
from turnfsm.testing import (
    ExtractiveSummaryModel,
    FakeModelClient,
    ScriptedModel,
    reply,
    tool_call,
)
from turnfsm.tokens import HeuristicTokenCounter
from turnfsm.tracing import attributes as A
from turnfsm.values import Usage

pytestmark = pytest.mark.anyio


def summarizing(window: int = 4_000) -> ContextManager:
    summaries = Named(
        ExtractiveSummaryModel(), model="summarizer", provider_name="local"
    )
    return ContextManager(
        SummarizingCompactor(model=summaries, keep_recent_turns=2),
        context_window=window,
        threshold=60,
        counter=HeuristicTokenCounter(),
        # The summary call is what is checked: the first user message goes
        # into it, so the rule that pins that message is off.
        pins=PinRules(first_user=False),
    )


async def test_summary_calls_are_chat_spans_under_their_compaction() -> None:
    traced = Traced.create()
    model = ScriptedModel.of(
        said("", tool_call("echo", "c1", text="x"), usage=(900, 5)),
        said("ok", usage=(950, 1)),
    )
    driver = traced_driver(traced, model, tools=[echo], context=summarizing())
    result = await driver.run(history(10, 500))
    [(_, _, _, [_, first, second])] = traced.tree(masks(result))
    first_turn = turn(1, "start", 1_093, usage=(900, 5))
    assert first == ("turnfsm.turn 1", "INTERNAL", first_turn, [
        "measured: start -> compact #4 [is_over_threshold_line, "
        "not is_compaction_limit_reached, not is_threshold_line_spent] "
        "reason=threshold_exceeded estimate=2709",
        "compaction_result: compact -> start #18 estimate=1093",
        "measured: start -> call_llm #6 estimate=1093",
        "model_replied: call_llm -> run_tools #7 [has_tool_calls] estimate=1093",
        "tools_finished: run_tools -> start #13 estimate=1093",
        ("turnfsm.compaction", "INTERNAL", {
            A.COMPACTION_REASON: "threshold_exceeded",
            A.COMPACTION_STRATEGY: "SummarizingCompactor",
            A.COMPACTION_OUTCOME: "compacted",
            A.TOKENS_BEFORE: 2_709,
            A.TOKENS_AFTER: 1_093,
            A.TOKENS_SAVED: 1_616,
            A.TOKENS_SOURCE: "estimated",
            # The summary calls' usage, summed (each call's chat span has
            # its own as gen_ai.usage: a sum over the trace counts it once).
            A.TOTAL_INPUT_TOKENS: 2_301,
            A.TOTAL_OUTPUT_TOKENS: 435,
            # What the pass invalidates in the prompt cache (no prices).
            A.CACHE_INVALIDATED: 2_650,
            A.CACHE_REWRITTEN: 1_034,
            A.CACHE_DECLINED: False,
        }, [
            ("chat summarizer", "CLIENT", {
                A.OPERATION_NAME: "chat",
                A.CONVERSATION_ID: "<session>",
                A.ATTEMPT: 1,
                A.PURPOSE: "summary",
                A.PROVIDER_NAME: "local",
                A.REQUEST_MODEL: "summarizer",
                A.REQUEST_MAX_TOKENS: 625,
                A.REQUEST_TEMPERATURE: 0.3,
                A.RESPONSE_MODEL: "summarizer-0613",
                A.USAGE_INPUT_TOKENS: 2_301,
                A.USAGE_OUTPUT_TOKENS: 435,
            }, []),
        ]),
        # The first call after the pass says so; no later one does.
        ("chat gpt-test", "CLIENT", chat(usage=(900, 5)) | COMPACTED, []),
        ("execute_tool echo", "INTERNAL", tool("echo", "c1"), []),
    ])  # fmt: skip
    second_turn = turn(2, "done", 1_108, usage=(950, 1))
    assert second == ("turnfsm.turn 2", "INTERNAL", second_turn, [
        "measured: start -> call_llm #6 estimate=1108",
        "model_replied: call_llm -> done #9 estimate=1108",
        ("chat gpt-test", "CLIENT", chat(usage=(950, 1)), []),
    ])  # fmt: skip


def _usage_in(spans: Any) -> dict[str, int]:
    """Every ``gen_ai.usage.*`` attribute of `spans`, summed (as a dashboard does)."""
    keys = (A.USAGE_INPUT_TOKENS, A.USAGE_OUTPUT_TOKENS)
    return {k: sum((s.attributes or {}).get(k, 0) for s in spans) for k in keys}


async def test_summing_usage_over_a_trace_counts_each_model_call_once() -> None:
    traced = Traced.create()
    helper = Agent(
        model=ScriptedModel.of(said("seven", usage=(40, 3))),
        hooks=[traced.hook],
        name="helper",
    )
    model = ScriptedModel.of(
        said(
            "",
            tool_call("echo", "c1", text="x"),
            tool_call("helper", "c2", task="count"),
            usage=(900, 5),
        ),
        said("ok", usage=(950, 1)),
    )
    tools = [echo, helper.as_tool(name="helper", description="Counts.")]
    driver = traced_driver(traced, model, tools=tools, context=summarizing())
    result = await driver.run(history(10, 500))
    assert result.outcome == "done", result.error
    spent = result.usage + result.compaction_usage + result.children_usage
    assert result.compaction_usage.input_tokens > 0  # a summary pass ran
    assert result.children_usage == Usage(input_tokens=40, output_tokens=3)
    spans = traced.spans
    (root,) = [s for s in spans if s.parent is None]  # the helper's run nests
    assert {s.context.trace_id for s in spans if s.context} == {root.context.trace_id}
    assert _usage_in(spans) == {
        A.USAGE_INPUT_TOKENS: spent.input_tokens,
        A.USAGE_OUTPUT_TOKENS: spent.output_tokens,
    }
    # Only the model calls' spans carry it; the spans that hold calls say
    # what those reported, summed, as turnfsm.usage.
    carriers = {s.name for s in spans if A.USAGE_INPUT_TOKENS in (s.attributes or {})}
    assert carriers == {"chat gpt-test", "chat summarizer", "chat"}
    totals = {s.name: s.attributes or {} for s in spans}
    assert totals["invoke_agent assistant"][A.TOTAL_INPUT_TOKENS] == 1_850
    assert totals["turnfsm.compaction"][A.TOTAL_INPUT_TOKENS] == (
        result.compaction_usage.input_tokens
    )
    assert totals["invoke_agent helper"][A.TOTAL_INPUT_TOKENS] == 40


KILLED_WORKER = """
import sys, time
from turnfsm import Agent
from turnfsm.testing import FakeModelClient, reply, tool_call

store, marker = sys.argv[1], sys.argv[2]

def work(name: str) -> str:
    \"\"\"Do one piece of work.

    Args:
        name: which piece.
    \"\"\"
    with open(marker, "w") as f:
        f.write(agent.session.id)
    time.sleep(600)  # killed meanwhile
    return "never"

calls = FakeModelClient(lambda r: reply("", tool_call("work", "c1", name="a")))
agent = Agent(model=calls, tools=[work], store=store)
agent.run_sync("do the work")
"""


class _HeardTools(Hook):
    """A user's hook written before calls were closed as interrupted."""

    def __init__(self) -> None:
        self.heard: list[tuple[str, str, bool, bool]] = []

    def on_tool_start(self, info: ToolCallInfo) -> None:
        self.heard.append(("start", info.call.id, info.interrupted, False))

    def on_tool_end(self, info: ToolCallEnd) -> None:
        self.heard.append(("end", info.call.call.id, info.interrupted, info.is_error))


def _killed_mid_call(store: Path, marker: Path) -> str:
    """Run `KILLED_WORKER` and SIGKILL it while its tool call runs; its session."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    worker = subprocess.Popen(
        [sys.executable, "-c", KILLED_WORKER, str(store), str(marker)], env=env
    )
    try:
        deadline = time.monotonic() + 60
        while not marker.exists() or not marker.read_text():
            assert worker.poll() is None, "the worker ended before its tool ran"
            assert time.monotonic() < deadline, "the worker's tool never ran"
            time.sleep(0.05)
    finally:
        worker.send_signal(signal.SIGKILL)  # mid-call: no hook heard it end
        worker.wait()
    return marker.read_text()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_call_a_killed_process_left_is_in_the_resumed_trace(
    tmp_path: Path,
) -> None:
    store = tmp_path / "s.db"
    session_id = await anyio.to_thread.run_sync(
        _killed_mid_call, store, tmp_path / "session"
    )

    def work(name: str) -> str:
        """Do one piece of work.

        Args:
            name: which piece.
        """
        raise AssertionError("a call cut short is not run again")

    traced, heard = Traced.create(), _HeardTools()
    agent = Agent(
        model=Named(FakeModelClient(lambda r: reply("it was cut short"))),
        tools=[work],
        store=store,
        hooks=[traced.hook, heard],
        strict_hooks=True,
        name="assistant",
    )
    session = await agent.open_session(session_id)
    (run,) = [r for r in session.runs if r.is_open]
    # Its process is known gone: its lease is taken over.
    result = await agent.resume(session_id, run.run_id, force=True)
    assert result.outcome == "done", result.error

    # Every hook hears the call, closed: it starts and ends at once.
    assert heard.heard == [("start", "c1", True, False), ("end", "c1", True, True)]
    [(name, _, root, [first, _second])] = traced.tree(masks(result))
    assert name == "invoke_agent assistant"
    assert root[A.RUN_RESUMED] is True
    assert root[A.RUN_ID] == "<run>"  # the run it goes on with: the same id
    assert root[A.RUN_RESUMED_FROM] == "running"  # its process died as it ran
    # In the turn whose reply asked for it, an execute_tool span in error.
    assert first[0] == "turnfsm.turn 1"
    assert first[3][-1] == ("execute_tool work", "INTERNAL", {
        **tool("work", "c1"),
        A.ERROR_TYPE: "tool_interrupted",
        STATUS: "ERROR: closed as interrupted: the run stopped before this "
        "call finished, so its effects are unknown",
    }, [])  # fmt: skip


APPROVAL_DIGEST = machine_digest(approval_machine())


def delete(path: str) -> str:
    """Delete a file.

    Args:
        path: the file.
    """
    return f"deleted {path}"


async def test_a_resumed_run_is_a_root_of_its_own_marked_resumed() -> None:
    traced = Traced.create()
    model = ScriptedModel.of(
        said("", tool_call("delete", "c1", path="/tmp/a"), usage=(40, 9)),
        said("cleaned up", usage=(60, 2)),
    )
    driver = traced_driver(traced, model, tools=[delete], machine=approval_machine())
    session = Session()
    paused = await driver.run("clean up", session=session)
    assert paused.outcome == "paused"
    done = await driver.resume(session, paused.run_id, ToolCallsReviewed.approve_all())
    assert (done.outcome, done.run_id) == ("done", paused.run_id)
    approval = {A.MACHINE_NAME: "approval"}
    assert traced.tree(masks(done) | {APPROVAL_DIGEST: "<digest>"}) == [
        ("invoke_agent assistant", "INTERNAL", agent(
            outcome="paused", phase="await_approval", usage=(40, 9)
        ) | approval, [
            STARTED,
            ("turnfsm.turn 1", "INTERNAL", turn(
                1, "await_approval", 122, usage=(40, 9)
            ), [
                "measured: start -> call_llm #6 estimate=122",
                "model_replied: call_llm -> await_approval #7 [has_tool_calls] "
                "estimate=122",
                ("chat gpt-test", "CLIENT", chat(usage=(40, 9)), []),
            ]),
        ]),
        ("invoke_agent assistant", "INTERNAL", agent(
            turns=2, usage=(100, 11)
        ) | approval | {A.RUN_RESUMED: True, A.RUN_RESUMED_FROM: "paused"}, [
            "tool_calls_reviewed: await_approval -> run_tools #13 estimate=122",
            # The tools belong to the turn whose call asked for them.
            ("turnfsm.turn 1", "INTERNAL", turn(1, "start", 122), [
                "tools_finished: run_tools -> start #14 estimate=122",
                ("execute_tool delete", "INTERNAL", tool("delete", "c1"), []),
            ]),
            ("turnfsm.turn 2", "INTERNAL", turn(2, "done", 154, usage=(60, 2)), [
                "measured: start -> call_llm #6 estimate=154",
                "model_replied: call_llm -> done #9 estimate=154",
                ("chat gpt-test", "CLIENT", chat(usage=(60, 2)), []),
            ]),
        ]),
    ]  # fmt: skip


async def test_each_model_call_has_its_own_turn_when_an_injection_goes_on() -> None:
    traced = Traced.create()
    control = RunControl()
    calls = 0

    async def answer(request: ModelRequest) -> ModelResponse:
        nonlocal calls
        calls += 1
        if calls == 1:  # the user says more while the model answers
            control.inject(Message.user("one more thing"))
            return said("first answer", usage=(5, 2))
        return said("second answer", usage=(9, 2))

    driver = traced_driver(traced, FakeModelClient(answer))
    result = await driver.run("hello", control=control)
    assert result.text == "second answer"
    [(_, _, _, [_, *turns])] = traced.tree(masks(result))
    assert turns == [
        ("turnfsm.turn 1", "INTERNAL", turn(1, "start", 6, usage=(5, 2)), [
            "measured: start -> call_llm #6 estimate=6",
            "message_injected: call_llm -> call_llm #31 estimate=6",
            "model_replied: call_llm -> start #8 [has_injected_messages] estimate=6",
            ("chat gpt-test", "CLIENT", chat(usage=(5, 2)), []),
        ]),
        ("turnfsm.turn 2", "INTERNAL", turn(2, "done", 21, usage=(9, 2)), [
            "measured: start -> call_llm #6 estimate=21",
            "model_replied: call_llm -> done #9 estimate=21",
            ("chat gpt-test", "CLIENT", chat(usage=(9, 2)), []),
        ]),
    ]  # fmt: skip


def _shape(node: Node) -> tuple[str, list[Any]]:
    """A node's span names, nested (events and attributes left out)."""
    name, _, _, children = node
    return (name, [_shape(c) for c in children if isinstance(c, tuple) and len(c) == 4])


def _sessions(node: Node) -> set[object]:
    """Every conversation id in the node's subtree."""
    _, _, attributes, children = node
    found = (
        {attributes[A.CONVERSATION_ID]} if A.CONVERSATION_ID in attributes else set()
    )
    for child in children:
        if isinstance(child, tuple) and len(child) == 4:
            found |= _sessions(child)
    return found


async def test_concurrent_runs_sharing_one_hook_keep_their_own_traces() -> None:
    traced = Traced.create()
    runs = 3
    arrived = 0
    everyone = anyio.Event()

    class Meeting:
        """Asks for a tool once, then answers; the first call waits for every run."""

        def __init__(self) -> None:
            self.calls = 0

        async def complete(self, request: ModelRequest) -> ModelResponse:
            nonlocal arrived
            self.calls += 1
            arrived += 1
            if arrived == runs * self.calls:
                everyone.set()
            await everyone.wait()  # all runs are in a model call at once
            if self.calls == 1:
                return said("", tool_call("echo", "c1", text="x"))
            return said("done")

    sessions = [Session() for _ in range(runs)]
    with anyio.fail_after(5):
        async with anyio.create_task_group() as group:
            for session in sessions:
                driver = traced_driver(traced, Meeting(), tools=[echo])
                group.start_soon(partial(driver.run, "go", session=session))
    labels = {s.id: f"<session {i}>" for i, s in enumerate(sessions)}
    trees = traced.tree(labels)  # each span in its root's trace (checked)
    assert len(trees) == runs
    # Each tree holds one session's spans, and each session has a tree.
    found = sorted(sorted(map(str, _sessions(t))) for t in trees)
    assert found == [[label] for label in sorted(labels.values())]
    assert {str(_shape(t)) for t in trees} == {
        str(
            ("invoke_agent assistant", [
                ("turnfsm.turn 1", [("chat gpt-test", []), ("execute_tool echo", [])]),
                ("turnfsm.turn 2", [("chat gpt-test", [])]),
            ])
        )
    }  # fmt: skip
    assert len({s.context.trace_id for s in traced.spans if s.parent is None}) == runs


async def _path(session: Session, run_id: str) -> list[tuple[str, str, str]]:
    """The run's path as its log has it: (from, to, trigger) per event fed."""
    entries = await session.store.load(session.id)
    phase = "start"
    path = []
    for entry in entries:
        if isinstance(entry, EventRecorded) and entry.run_id == run_id:
            path.append((phase, entry.phase, trigger_of(entry.event)))
            phase = entry.phase
    return path


def _check_against_file(events: list[dict[str, Any]], machine: Path) -> None:
    """Each event names the file's transition that fired, as written there."""
    written = file_transitions(machine)
    for event in events:
        entry = written[event[A.TRANSITION_INDEX]]
        sources = (
            entry["source"] if isinstance(entry["source"], list) else [entry["source"]]
        )
        assert entry["trigger"] == event[A.TRANSITION_TRIGGER]
        assert event[A.TRANSITION_FROM] in sources or sources == ["*"]
        assert entry.get("dest", event[A.TRANSITION_FROM]) == event[A.TRANSITION_TO]
        guards = [
            *entry.get("conditions", []),
            *(f"not {g}" for g in entry.get("unless", [])),
        ]
        assert list(event[A.TRANSITION_GUARDS]) == guards
        assert event.get(A.TRANSITION_REASON) == entry.get("reason")
        assert event.get(A.TRANSITION_ERROR) == entry.get("error")


def _events_in_order(traced: Traced) -> list[dict[str, Any]]:
    timed = [
        (event.timestamp, dict(event.attributes or {}))
        for span in traced.spans
        for event in span.events
        if event.name == A.EVENT_TRANSITION
    ]
    return [attributes for _, attributes in sorted(timed, key=lambda t: t[0])]


def _steps(events: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    return [
        (e[A.TRANSITION_FROM], e[A.TRANSITION_TO], e[A.TRANSITION_TRIGGER])
        for e in events
    ]


async def test_transition_events_are_the_runs_path_through_the_machine_file() -> None:
    traced = Traced.create()
    model = ScriptedModel.of(said("", tool_call("echo", "c1", text="x")), said("ok"))
    session = Session()
    driver = traced_driver(traced, model, tools=[echo], context=summarizing())
    result = await driver.run(history(10, 500), session=session)
    assert result.ok, result.error
    events = _events_in_order(traced)
    path = await _path(session, result.run_id)
    assert _steps(events) == path
    assert path == [
        ("start", "start", "run_started"),
        ("start", "compact", "measured"),
        ("compact", "start", "compaction_result"),
        ("start", "call_llm", "measured"),
        ("call_llm", "run_tools", "model_replied"),
        ("run_tools", "start", "tools_finished"),
        ("start", "call_llm", "measured"),
        ("call_llm", "done", "model_replied"),
    ]
    _check_against_file(events, REPO_ROOT / "machines" / "turn.toml")
    assert transitions(traced.spans[0]) == [events[0]]  # run_started, on the root


async def test_a_resumed_runs_events_continue_its_path_on_its_machine() -> None:
    traced = Traced.create()
    model = ScriptedModel.of(said("", tool_call("delete", "c1", path="/a")), said("ok"))
    driver = traced_driver(traced, model, tools=[delete], machine=approval_machine())
    session = Session()
    paused = await driver.run("clean up", session=session)
    await driver.resume(session, paused.run_id, ToolCallsReviewed.approve_all())
    events = _events_in_order(traced)
    assert _steps(events) == await _path(session, paused.run_id)
    _check_against_file(events, REPO_ROOT / "machines" / "approval.toml")


def _delegating_toml() -> str:
    """The stock machine with tool calls handed to a custom `delegate` phase.

    Its effect (a sub-agent, say) runs the calls itself and reports their
    results (`ToolsFinished`), which ends the turn as `run_tools` would.
    """
    text = turn_toml_text()
    for old, new in (
        (
            'run_tools         = { decision = "run_tools" }\n',
            'delegate          = { effect = "delegate" }\n',
        ),
        (
            'dest = "run_tools"\nconditions = ["has_tool_calls"]',
            'dest = "delegate"\nconditions = ["has_tool_calls"]',
        ),
        (
            'trigger = "tools_finished"\nsource = "run_tools"',
            'trigger = "tools_finished"\nsource = "delegate"',
        ),
    ):
        assert text.count(old) == 1
        text = text.replace(old, new)
    return text


async def test_a_custom_phase_is_an_effect_span_in_its_turn() -> None:
    traced = Traced.create()

    async def await_approval(ctx: EffectContext, decision: Perform) -> Signal:
        return Signal(name="approved")

    model = ScriptedModel.of(said("", tool_call("echo", "c1", text="x")), said("ok"))
    driver = traced_driver(
        traced,
        model,
        tools=[echo],
        machine=MachineSpec.from_toml(approval_toml()),
        effects={"await_approval": await_approval},
    )
    result = await driver.run("go")
    [(_, _, _, [_, first, _])] = traced.tree(masks(result))
    first_turn = turn(1, "start", 124, usage=(0, 0))
    assert first == ("turnfsm.turn 1", "INTERNAL", first_turn, [
        "measured: start -> call_llm #6 estimate=124",
        "model_replied: call_llm -> await_approval #7 [has_tool_calls] estimate=124",
        "approved: await_approval -> run_tools #33 estimate=124",
        "tools_finished: run_tools -> start #13 estimate=124",
        ("chat gpt-test", "CLIENT", chat(usage=(0, 0)), []),
        ("turnfsm.effect", "INTERNAL", {
            A.EFFECT: "await_approval", A.PHASE: "await_approval"
        }, []),
        ("execute_tool echo", "INTERNAL", tool("echo", "c1"), []),
    ])  # fmt: skip


async def test_an_effect_span_ends_with_its_effect_when_that_ends_the_turn() -> None:
    traced = Traced.create()

    async def delegate(ctx: EffectContext, decision: Perform) -> ToolsFinished:
        reply = ctx.snapshot.last_reply
        assert reply is not None
        return ToolsFinished(
            results=[
                Message.tool_result(c.id, "done elsewhere") for c in reply.tool_calls
            ]
        )

    model = ScriptedModel.of(said("", tool_call("echo", "c1", text="x")), said("ok"))
    driver = traced_driver(
        traced,
        model,
        machine=MachineSpec.from_toml(_delegating_toml()),
        effects={"delegate": delegate},
    )
    result = await driver.run("go")
    assert result.ok, result.error
    [(_, _, _, [_, first, _])] = traced.tree(masks(result))
    assert first[3][-1] == (
        "turnfsm.effect",
        "INTERNAL",
        {A.EFFECT: "delegate", A.PHASE: "delegate"},
        [],
    )
    [effect] = [s for s in traced.spans if s.name == "turnfsm.effect"]
    [_, turn_two] = [s for s in traced.spans if s.name.startswith("turnfsm.turn ")]
    assert effect.end_time is not None
    assert turn_two.start_time is not None
    assert effect.end_time <= turn_two.start_time  # not held open to the run's end


async def test_a_run_resumed_in_the_same_process_links_to_its_paused_trace() -> None:
    # Its trace was a root of its own, with nothing leading back to the
    # trace of the run's first part but its run id.
    traced = Traced.create()
    model = ScriptedModel.of(
        said("", tool_call("delete", "c1", path="/tmp/a"), usage=(40, 9)),
        said("cleaned up", usage=(60, 2)),
        said("", tool_call("delete", "c2", path="/tmp/b"), usage=(70, 9)),
    )
    driver = traced_driver(traced, model, tools=[delete], machine=approval_machine())
    session = Session()
    paused = await driver.run("clean up", session=session)
    await driver.resume(session, paused.run_id, ToolCallsReviewed.approve_all())
    first, then = (s for s in traced.spans if s.name == "invoke_agent assistant")
    assert first.links == ()
    (link,) = then.links
    assert link.context == first.context
    assert then.context.trace_id != first.context.trace_id
    # A run that is not a resumption links to nothing.
    again = await driver.run("and again", session=session)
    assert again.outcome == "paused"
    last = [s for s in traced.spans if s.name == "invoke_agent assistant"][-1]
    assert last.links == ()


def test_calls_made_outside_their_run_get_spans_of_their_own() -> None:
    # A durable run's model and tool calls are made in a worker's activities,
    # where the run (its workflow) is not open. Before, the hook dropped
    # them: a worker traced nothing at all. Now each call is a span of its
    # own, tied to the others by the session id.
    traced = Traced.create()
    driver = traced_driver(
        traced,
        ScriptedModel.of(reply("", tool_call("echo", "call_1", text="hi"))),
        tools=[echo],
    )
    run = driver.resources("run_1", session=None, session_id="ses_1")

    call = tool_call("echo", "call_1", text="hi")
    anyio.run(partial(run_tool_with_hooks, run, call, turn=1))
    (span,) = traced.spans
    assert span.name == "execute_tool echo"
    assert span.parent is None
    assert span.attributes[A.TOOL_CALL_ID] == "call_1"
    assert span.attributes[A.CONVERSATION_ID] == "ses_1"
    # With no run span above it, it says its run and turn itself (a search
    # for the run's id found none of a durable run's calls).
    assert span.attributes[A.RUN_ID] == "run_1"
    assert span.attributes[A.TURN_NUMBER] == 1
    assert traced.unended() == []
