"""Human in the loop: the approval machine pauses, is stored, and resumes anywhere."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import anyio
import attrs
import pytest

from turnfsm import Agent, approval_machine
from turnfsm.context import ContextManager
from turnfsm.core import Event, MessageInjected, RunCancelled, Signal, ToolCallsReviewed
from turnfsm.driver import Driver, function_tool
from turnfsm.errors import Cancelled, ConfigError, SessionBusy
from turnfsm.hooks import Hook, RunEndInfo, RunStartInfo
from turnfsm.messages import Message
from turnfsm.persistence import (
    MachineStored,
    MemoryStore,
    Session,
    SessionStore,
    SQLiteStore,
    ToolResultRecorded,
    dump_session,
    load_session,
)
from turnfsm.providers import ModelRequest
from turnfsm.testing import FakeModelClient, ScriptedModel, reply, tool_call
from turnfsm.tokens import default_counter

pytestmark = pytest.mark.anyio

RAN: list[str] = []


def delete(path: str) -> str:
    """Delete a file.

    Args:
        path: the file.
    """
    RAN.append(path)
    return f"deleted {path}"


def _asking_model() -> ScriptedModel:
    return ScriptedModel.of(
        reply(
            "",
            tool_call("delete", "c1", path="/tmp/a"),
            tool_call("delete", "c2", path="/etc/passwd"),
        ),
        "cleaned up",
    )


def _agent(model: object, store: SessionStore, **options: object) -> Agent:
    return Agent(
        model=model, tools=[delete], machine=approval_machine(), store=store, **options
    )


async def test_a_run_pauses_for_approval_and_resumes_in_a_fresh_agent() -> None:
    RAN.clear()
    store = MemoryStore()
    first = await _agent(_asking_model(), store).run("clean up")
    assert first.outcome == "paused"
    assert first.waiting is not None
    assert [c.id for c in first.waiting.calls] == ["c1", "c2"]
    assert "tool_calls_reviewed" in first.waiting.accepts
    assert RAN == []  # nothing ran before the human answered
    # Another agent (say, a web handler the next day) on the same store.
    later = _agent(ScriptedModel.of("cleaned up"), store)
    done = await later.resume(
        first.session_id, first.run_id, ToolCallsReviewed.approve_all()
    )
    assert done.ok
    assert done.run_id == first.run_id
    assert done.text == "cleaned up"
    assert sorted(RAN) == ["/etc/passwd", "/tmp/a"]
    assert [r.outcome for r in later.session.runs] == ["done"]
    assert later.session.open_runs() == []


async def test_the_open_runs_are_the_paused_interrupted_and_unended_ones() -> None:
    store = MemoryStore()
    agent = _agent(_asking_model(), store)
    paused = await agent.run("clean up")
    session = agent.session
    assert [r.run_id for r in session.open_runs()] == [paused.run_id]
    record = session.run(paused.run_id)
    assert session.run(paused.run_id) is record  # built once while unchanged
    assert record.outcome == "paused"
    review = ToolCallsReviewed.reject({"c1": "no", "c2": "no"})
    await agent.resume(session.id, paused.run_id, review)
    assert session.open_runs() == []
    assert session.run(paused.run_id).outcome == "done"  # rebuilt
    reopened = await Session.load(store, session.id)
    assert reopened.open_runs() == [r for r in reopened.runs if r.is_open] == []


async def test_a_rejected_call_reaches_the_model_as_an_error_and_the_run_goes_on() -> (
    None
):
    RAN.clear()
    store = MemoryStore()
    first = await _agent(_asking_model(), store).run("clean up")
    seen: list[ModelRequest] = []

    def answer(request: ModelRequest) -> str:
        seen.append(request)
        return "kept /etc/passwd"

    later = _agent(FakeModelClient(answer), store)
    done = await later.resume(
        first.session_id,
        first.run_id,
        ToolCallsReviewed.reject({"c2": "never touch /etc"}),
    )
    assert done.ok
    assert RAN == ["/tmp/a"]
    results = {p.call_id: p for m in seen[0].messages for p in m.tool_results}
    assert results["c2"].is_error
    assert results["c2"].content == "rejected by the reviewer: never touch /etc"
    assert results["c1"].content == "deleted /tmp/a"
    assert later.session.history[-1].text == "kept /etc/passwd"


async def test_rejecting_the_run_cancels_it_and_commits_nothing() -> None:
    RAN.clear()
    store = MemoryStore()
    agent = _agent(_asking_model(), store)
    first = await agent.run("clean up")
    ended = await agent.resume(
        first.session_id, first.run_id, RunCancelled(reason="not today")
    )
    assert ended.outcome == "cancelled"
    assert isinstance(ended.error, Cancelled)
    assert list(agent.session.history) == []
    assert RAN == []
    nxt = await agent.run("something else")  # the session takes its next run
    assert (nxt.outcome, nxt.text) == ("done", "cleaned up")


async def test_resume_refuses_what_the_pause_does_not_accept() -> None:
    store = MemoryStore()
    agent = _agent(_asking_model(), store)
    first = await agent.run("clean up")
    with pytest.raises(ConfigError, match="tool_calls_reviewed"):
        await agent.resume(first.session_id, first.run_id, Signal(name="go"))
    with pytest.raises(ConfigError, match="run_id"):
        await agent.resume(first.session_id, "run_nope", None)
    with pytest.raises(SessionBusy, match="resume or abandon"):
        await agent.run("another task")
    # The refusals wrote nothing: the run still waits, and resumes.
    done = await agent.resume(
        first.session_id, first.run_id, ToolCallsReviewed.approve_all()
    )
    assert done.ok
    with pytest.raises(ConfigError, match="it is done"):
        await agent.resume(first.session_id, first.run_id, None)


async def _refused_then_answered(path: Path, wrong: object) -> ConfigError:
    """Pause a run on a SQLite file, answer it `wrong`, then answer it right.

    Returns the refusal, after checking that it wrote nothing and that a
    fresh agent on the same file then carries the run to its end.
    """
    RAN.clear()
    first = await _agent(_asking_model(), SQLiteStore(path)).run("clean up")
    assert first.outcome == "paused"
    before = await SQLiteStore(path).load(first.session_id)
    agent = _agent(ScriptedModel.of("never asked"), SQLiteStore(path))
    with pytest.raises(ConfigError) as refused:
        await agent.resume(first.session_id, first.run_id, wrong)  # type: ignore[arg-type]
    assert await SQLiteStore(path).load(first.session_id) == before
    assert RAN == []
    later = _agent(ScriptedModel.of("kept /etc/passwd"), SQLiteStore(path))
    done = await later.resume(
        first.session_id,
        first.run_id,
        ToolCallsReviewed.reject({"c2": "never touch /etc"}),
    )
    assert (done.outcome, done.text) == ("done", "kept /etc/passwd")
    assert RAN == ["/tmp/a"]
    session = await Session.load(SQLiteStore(path), first.session_id)
    assert [r.outcome for r in session.runs] == ["done"]
    return refused.value


@pytest.mark.parametrize(
    "wrong", ["approve", 5, {"approve": True}], ids=["str", "int", "dict"]
)
async def test_resume_refuses_an_answer_that_is_not_an_event(
    tmp_path: Path, wrong: object
) -> None:
    with anyio.fail_after(20):
        refused = await _refused_then_answered(tmp_path / "s.db", wrong)
    assert (refused.field, refused.value) == ("event", wrong)
    assert "accepts: message_injected, run_cancelled, tool_calls_reviewed" in str(
        refused
    )


@pytest.mark.parametrize(
    ("wrong", "hint"),
    [
        (ToolCallsReviewed.approve_all, "call it: ToolCallsReviewed.approve_all()"),
        (ToolCallsReviewed, "an instance, not the class"),
        ("approve", "ToolCallsReviewed.approve_all() lets every call run"),
    ],
    ids=["method not called", "class", "str"],
)
async def test_an_answer_that_is_almost_an_event_shows_the_event(
    tmp_path: Path, wrong: object, hint: str
) -> None:
    # `resume(s, r, ToolCallsReviewed.approve_all)` (no parentheses) said
    # only which triggers the phase accepts.
    with anyio.fail_after(20):
        refused = await _refused_then_answered(tmp_path / "s.db", wrong)
    assert (refused.field, refused.value) == ("event", wrong)
    assert str(refused).endswith(f"tool_calls_reviewed ({hint})")


LOOKS_FINE = Message.user("looks fine")


def _result(call_id: str) -> Message:
    return Message.tool_result(call_id, "no", is_error=True)


@pytest.mark.parametrize(
    ("wrong", "field", "value"),
    [
        (
            ToolCallsReviewed.reject({"c1x": "typo in the id"}),
            "event.results.call_id",
            "c1x",
        ),
        (
            ToolCallsReviewed.reject({"c1": "no", "c9": "no such call"}),
            "event.results.call_id",
            "c9",
        ),
        (
            ToolCallsReviewed(results=[_result("c1"), _result("c1")]),
            "event.results.call_id",
            "c1",
        ),
        (
            ToolCallsReviewed(results=[LOOKS_FINE]),
            "event.results[0]",
            LOOKS_FINE,
        ),
        (
            MessageInjected(message=Message.tool_result("c1", "done", id="m1")),
            "event.message",
            "m1",
        ),
    ],
    ids=["unknown id", "one unknown id", "answered twice", "no result", "injected"],
)
async def test_resume_refuses_an_answer_for_calls_the_run_does_not_wait_on(
    tmp_path: Path, wrong: Event, field: str, value: str
) -> None:
    """Fed, such an answer would end the paused run failed: it is refused first."""
    with anyio.fail_after(20):
        refused = await _refused_then_answered(tmp_path / "s.db", wrong)
    assert (refused.field, refused.value) == (field, value)
    if field != "event.message":  # and the ids it waits on
        assert "c1, c2" in refused.expected


async def test_a_run_resumes_on_the_machine_it_began_on_without_its_file() -> None:
    """The log keeps the approval machine: an agent built on the default one
    (no machine file) resumes the paused run on the machine it began on."""
    RAN.clear()
    store = MemoryStore()
    first = await _agent(_asking_model(), store).run("clean up")
    other = Agent(model=ScriptedModel.of("cleaned up"), tools=[delete], store=store)
    assert other.driver.machine.name == "turn"
    done = await other.resume(
        first.session_id, first.run_id, ToolCallsReviewed.approve_all()
    )
    assert done.ok, done.error
    assert sorted(RAN) == ["/etc/passwd", "/tmp/a"]  # run concurrently
    session = await Session.load(store, first.session_id)
    stored = [e for e in session.entries if isinstance(e, MachineStored)]
    assert [m.name for m in stored] == ["approval"]
    assert stored[0].spec() == attrs.evolve(
        approval_machine(), source=stored[0].spec().source
    )


async def test_resume_refuses_another_machine_when_the_log_keeps_none() -> None:
    """A log written before machines were kept: the run's machine is needed."""
    store = MemoryStore()
    first = await _agent(_asking_model(), store).run("clean up")
    kept = [
        e
        for e in await store.load(first.session_id)
        if not isinstance(e, MachineStored)
    ]
    old = MemoryStore()
    await old.append(first.session_id, kept, expected_version=0)
    other = Agent(model=ScriptedModel.of("x"), tools=[delete], store=old)
    with pytest.raises(ConfigError, match="which the log does not keep"):
        await other.resume(
            first.session_id, first.run_id, ToolCallsReviewed.approve_all()
        )


async def test_the_run_end_hook_sees_the_pause() -> None:
    class Ends(Hook):
        def __init__(self) -> None:
            self.outcomes: list[str] = []

        def on_run_end(self, info: RunEndInfo) -> None:
            self.outcomes.append(info.outcome)

    hook = Ends()
    store = MemoryStore()
    agent = _agent(_asking_model(), store, hooks=[hook])
    first = await agent.run("clean up")
    await agent.resume(first.session_id, first.run_id, ToolCallsReviewed.approve_all())
    assert hook.outcomes == ["paused", "done"]


async def test_a_paused_run_resumes_in_another_process(tmp_path: object) -> None:
    store = MemoryStore()
    agent = _agent(_asking_model(), store)
    first = await agent.run("clean up")
    path = f"{tmp_path}/session.jsonl"
    dump_session(agent.session, path)
    script = textwrap.dedent(
        f"""
        import anyio
        from turnfsm import Agent, approval_machine
        from turnfsm.core import ToolCallsReviewed
        from turnfsm.persistence import dump_session, load_session
        from turnfsm.testing import ScriptedModel

        def delete(path: str) -> str:
            '''Delete a file.

            Args:
                path: the file.
            '''
            return "deleted " + path

        async def main():
            with open({path!r}) as lines:
                session = await load_session(lines)
            agent = Agent(model=ScriptedModel.of("resumed elsewhere"), tools=[delete],
                          machine=approval_machine(), store=session.store)
            result = await agent.resume({first.session_id!r}, {first.run_id!r},
                                        ToolCallsReviewed.reject({{"c2": "no"}}))
            dump_session(agent.session, {path!r})
            print(result.outcome, result.text)

        anyio.run(main)
        """
    )
    with anyio.fail_after(60):
        out = await anyio.run_process([sys.executable, "-c", script], check=True)
    assert out.stdout.decode().split("\n")[0] == "done resumed elsewhere"
    back = await load_session((await anyio.Path(path).read_text()).splitlines())
    assert [r.outcome for r in back.runs] == ["done"]
    assert back.history[-1].text == "resumed elsewhere"
    assert {p.call_id for m in back.history for p in m.tool_results} == {"c1", "c2"}


async def test_a_run_replays_on_the_machine_the_log_keeps() -> None:
    from turnfsm.driver import replay

    store = MemoryStore()
    first = await _agent(_asking_model(), store).run("clean up")
    session = await Session.load(store, first.session_id)
    assert replay(None, session, first.run_id).ok  # no machine file needed


@pytest.mark.parametrize(
    "review",
    [
        ToolCallsReviewed.approve_all(),
        ToolCallsReviewed.reject({"c1": "no"}),  # c2 is approved
    ],
    ids=["approve-all", "approve-some"],
)
async def test_approving_a_call_whose_tool_the_agent_lacks_is_refused(
    review: ToolCallsReviewed,
) -> None:
    RAN.clear()
    store = MemoryStore()
    first = await _agent(_asking_model(), store).run("clean up")
    lacking = Agent(
        model=ScriptedModel.of("cleaned up"), machine=approval_machine(), store=store
    )

    with pytest.raises(ConfigError, match=r"the tools the run calls \(delete\)") as e:
        await lacking.resume(first.session_id, first.run_id, review)

    assert e.value.field == "tools"
    # A tool the model made up has no agent to resume with: the way out is
    # named too, the calls the review would let run.
    unanswered = "c1, c2" if not review.results else "c2"
    assert f"or reject the calls to them ({unanswered})" in str(e.value)
    reopened = await Session.load(store, first.session_id)
    assert reopened.run(first.run_id).outcome == "paused"  # the approval not used up
    later = _agent(ScriptedModel.of("cleaned up"), store)
    done = await later.resume(first.session_id, first.run_id, review)
    assert done.ok
    assert "/etc/passwd" in RAN


async def test_rejecting_every_call_needs_none_of_their_tools() -> None:
    store = MemoryStore()
    first = await _agent(_asking_model(), store).run("clean up")
    lacking = Agent(
        model=ScriptedModel.of("kept them"), machine=approval_machine(), store=store
    )
    review = ToolCallsReviewed.reject({"c1": "no", "c2": "no"})
    done = await lacking.resume(first.session_id, first.run_id, review)
    assert (done.ok, done.text) == (True, "kept them")


async def test_a_run_cut_off_after_its_answer_is_running_not_paused() -> None:
    # The process resumed a paused run, logged the answer (and a call's
    # result), then died: the run goes on, so it reads as running (not
    # paused, which would ask for an answer it already has) and resumes
    # without one.
    RAN.clear()
    store = MemoryStore()
    first = await _agent(_asking_model(), store).run("clean up")
    done = await _agent(ScriptedModel.of("cleaned up"), store).resume(
        first.session_id, first.run_id, ToolCallsReviewed.approve_all()
    )
    assert done.ok
    entries = await store.load(first.session_id)
    cut = next(i for i, e in enumerate(entries) if isinstance(e, ToolResultRecorded))
    crashed = MemoryStore()
    view = Session(first.session_id, store=crashed)
    for entry in entries[: cut + 1]:
        await view.append(entry)
    assert view.run(first.run_id).outcome == "running"
    assert view.run(first.run_id).waiting is None
    assert [r.run_id for r in view.open_runs()] == [first.run_id]

    RAN.clear()
    later = _agent(ScriptedModel.of("cleaned up"), crashed)
    again = await later.resume(first.session_id, first.run_id)
    assert again.ok, again.error
    assert RAN == []  # neither call runs again: the cut-off one is closed
    logged = entries[cut].result.tool_results[0].call_id
    results = {p.call_id: p for m in later.session.history for p in m.tool_results}
    (closed,) = [r for call_id, r in results.items() if call_id != logged]
    assert not results[logged].is_error
    assert closed.is_error
    assert "was interrupted" in closed.content
    assert later.session.run(first.run_id).outcome == "done"


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_a_run_answered_in_this_process_is_not_carried_on_twice_beside_it(
    kind: str, tmp_path: Path
) -> None:
    # Two handlers of one web process: one approves, the other, seeing the
    # run open and not paused, carries it on (or abandons it) while it runs.
    started, release = anyio.Event(), anyio.Event()
    ran: list[str] = []

    async def delete(path: str) -> str:
        """Delete a file.

        Args:
            path: the file.
        """
        ran.append(path)
        started.set()
        await release.wait()
        return f"deleted {path}"

    store: SessionStore = (
        MemoryStore() if kind == "memory" else SQLiteStore(tmp_path / "s.db")
    )

    def agent(*replies: object) -> Agent:
        return Agent(
            model=ScriptedModel.of(*(replies or ["cleaned up"])),
            tools=[delete],
            machine=approval_machine(),
            store=store,
        )

    asking = reply("", tool_call("delete", "c1", path="/tmp/a"))
    paused = await agent(asking).run("clean up")
    results: list[object] = []

    async def approve() -> None:
        results.append(
            await agent().resume(
                paused.session_id, paused.run_id, ToolCallsReviewed.approve_all()
            )
        )

    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            group.start_soon(approve)
            await started.wait()
            with pytest.raises(SessionBusy, match="running another run"):
                await agent().resume(paused.session_id, paused.run_id)
            with pytest.raises(SessionBusy, match="running another run"):
                await agent().abandon(paused.session_id, paused.run_id)
            release.set()
    (done,) = results
    assert done.ok, done.error  # type: ignore[attr-defined]
    assert ran == ["/tmp/a"]
    session = await agent().open_session(paused.session_id)
    (result,) = [p for m in session.history for p in m.tool_results]
    assert result.content == "deleted /tmp/a"  # what ran, not "interrupted"


def read_log() -> str:
    """Read the log."""
    return "disk full at /var " * 400


async def test_a_run_resumed_on_a_smaller_window_sends_no_request_over_it() -> None:
    """The run's lines are the window it began on; the request check is the agent's.

    A run paused on a 100,000-token window and resumed by an agent on a
    1,000-token one (a smaller model) sent its 6,000-token request: the
    check before sending read the window the run began with.
    """
    store = MemoryStore()
    asks = ScriptedModel.of(reply("", tool_call("read_log", "c1")))
    first = await Agent(
        model=asks,
        tools=[read_log],
        machine=approval_machine(),
        store=store,
        context=ContextManager(context_window=100_000),
    ).run("Why is the disk full?")
    assert first.outcome == "paused"

    window = 1_000
    later = ScriptedModel.of("The log fills /var.", "The log fills /var.")
    done = await Agent(
        model=later,
        tools=[read_log],
        machine=approval_machine(),
        store=store,
        context=ContextManager(context_window=window),
    ).resume(first.session_id, first.run_id, ToolCallsReviewed.approve_all())

    counter = default_counter()
    sizes = [counter.count(list(r.messages)) for r in later.requests]
    assert all(size <= window for size in sizes), sizes
    assert done.ok, done.error  # the tool result cut down to fit, and answered


async def test_an_abandoned_run_is_told_as_resumed_then_ended_failed() -> None:
    # What the hooks page says of an abandon: a start (resumed, no input),
    # then its end, failed with Cancelled; the pair a span needs.
    heard: list[tuple[str, object]] = []

    class Hears(Hook):
        def on_run_start(self, info: RunStartInfo) -> None:
            heard.append(("start", (info.resumed, info.input)))

        def on_run_end(self, info: RunEndInfo) -> None:
            heard.append(("end", (info.outcome, type(info.error).__name__)))

    hook = Hears()
    driver = Driver(
        model=ScriptedModel.of(reply("", tool_call("rm", "c1", path="/x"))),
        tools=[function_tool(_rm)],
        machine=approval_machine(),
        hooks=[hook],
    )
    session = Session()
    paused = await driver.run("remove /x", session=session)
    assert paused.outcome == "paused"
    heard.clear()
    ended = await driver.abandon(session, paused.run_id, reason="no one answers")
    assert ended.outcome == "failed"
    assert heard == [("start", (True, ())), ("end", ("failed", "Cancelled"))]


def _rm(path: str) -> str:
    """Remove a file.

    Args:
        path: the file.
    """
    return f"removed {path}"
