"""A signal's data joins the conversation where the machine file says so.

The review machine's ``revise`` transition has ``message = "feedback"``: the
driver builds the user message from the signal's data, logs it on the event,
the next model request carries it, the run commits it, and a replay of the
log gives the same history.
"""

from __future__ import annotations

import anyio
import pytest

from turnfsm import Agent, machines_dir, review_machine
from turnfsm.core import Event, MachineSpec, Perform, Signal
from turnfsm.driver import EffectContext, replay
from turnfsm.errors import ConfigError, InvalidMessage
from turnfsm.messages import Message, Role
from turnfsm.persistence import (
    Committed,
    EventRecorded,
    MemoryStore,
    dump_session,
    load_session,
)
from turnfsm.testing import ScriptedModel

pytestmark = pytest.mark.anyio

FEEDBACK = "Cite the source of the figure."


async def _reviewer(ctx: EffectContext, decision: Perform) -> Event:
    """Ask once for a source, then approve."""
    answer = ctx.snapshot.last_reply
    assert answer is not None
    if "source" not in answer.text:
        return Signal("revise", {"feedback": FEEDBACK, "by": "reviewer"})
    return Signal("approved")


def _agent(model: ScriptedModel, store: MemoryStore, review: object) -> Agent:
    return Agent(
        model=model, machine=review_machine(), store=store, effects={"review": review}
    )


async def test_the_feedback_reaches_the_next_model_request() -> None:
    model = ScriptedModel.of("It is 42.", "It is 42 (source: the 2024 census).")
    store = MemoryStore()
    agent = _agent(model, store, _reviewer)

    with anyio.fail_after(10):
        result = await agent.run("How many?")

    assert (result.outcome, result.text) == (
        "done",
        "It is 42 (source: the 2024 census).",
    )
    first, second = model.requests
    assert [(m.role, m.text) for m in first.messages[-1:]] == [(Role.USER, "How many?")]
    assert [(m.role, m.text) for m in second.messages[-3:]] == [
        (Role.USER, "How many?"),
        (Role.ASSISTANT, "It is 42."),
        (Role.USER, FEEDBACK),
    ]


async def test_the_feedback_is_logged_on_its_event_and_committed() -> None:
    model = ScriptedModel.of("It is 42.", "It is 42 (source: the 2024 census).")
    store = MemoryStore()
    agent = _agent(model, store, _reviewer)

    with anyio.fail_after(10):
        result = await agent.run("How many?")

    session = agent.session
    signals = [
        entry.event
        for entry in session.entries
        if isinstance(entry, EventRecorded) and isinstance(entry.event, Signal)
    ]
    revise, approved = signals
    (index,) = [
        e.index
        for e in session.entries
        if isinstance(e, EventRecorded) and e.event is revise
    ]
    assert revise.name == "revise"
    assert revise.message is not None
    assert (revise.message.role, revise.message.text) == (Role.USER, FEEDBACK)
    assert approved.message is None  # its transition adds nothing
    committed = [e for e in session.entries if isinstance(e, Committed)]
    assert revise.message.id == f"msg_{result.run_id}_{index}"  # deterministic
    assert revise.message.id in committed[-1].messages
    assert [(m.role, m.text) for m in session.history] == [
        (Role.USER, "How many?"),
        (Role.ASSISTANT, "It is 42."),
        (Role.USER, FEEDBACK),
        (Role.ASSISTANT, "It is 42 (source: the 2024 census)."),
    ]
    report = replay(review_machine(), session, result.run_id)
    assert (report.ok, report.divergence, report.history_matches) == (True, None, True)
    stored = replay(None, session, result.run_id)  # the machine the log keeps
    assert stored.ok


async def test_a_run_read_back_from_its_json_log_replays_with_the_same_message() -> (
    None
):
    model = ScriptedModel.of("It is 42.", "It is 42 (source: the 2024 census).")
    store = MemoryStore()
    agent = _agent(model, store, _reviewer)
    with anyio.fail_after(10):
        result = await agent.run("How many?")
    dump_session(agent.session, "review.jsonl")  # the log as JSON lines
    reopened = await load_session(await anyio.Path("review.jsonl").read_text())

    report = replay(None, reopened, result.run_id)

    assert report.ok
    assert [m.id for m in reopened.history] == [m.id for m in agent.session.history]


async def test_a_signal_that_carries_its_message_keeps_it() -> None:
    given = Message.user("Use metric units.", id="msg_given")

    async def reviewer(ctx: EffectContext, decision: Perform) -> Event:
        if ctx.snapshot.turns == 1:
            return Signal("revise", {"feedback": "ignored"}, given)
        return Signal("approved")

    model = ScriptedModel.of("5 miles", "8 km")
    agent = _agent(model, MemoryStore(), reviewer)

    with anyio.fail_after(10):
        result = await agent.run("How far?")

    assert result.outcome == "done"
    assert model.requests[1].messages[-1] == given


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        ({}, "give the signal data {'feedback': TEXT}"),
        ({"feedback": "  "}, "it is blank"),
    ],
    ids=["missing", "blank"],
)
async def test_a_signal_without_the_data_fails_the_run_naming_the_key(
    data: dict[str, str], reason: str
) -> None:
    async def reviewer(ctx: EffectContext, decision: Perform) -> Event:
        return Signal("revise", data)

    model = ScriptedModel.of("It is 42.")
    agent = _agent(model, MemoryStore(), reviewer)

    with anyio.fail_after(10):
        result = await agent.run("How many?")

    assert result.outcome == "failed"
    assert isinstance(result.error, InvalidMessage)
    assert "'feedback'" in str(result.error)
    assert reason in str(result.error)
    assert list(agent.session.history) == []  # nothing of the run is committed


@pytest.mark.parametrize(
    ("data", "reason"), [({}, "it is missing"), ({"feedback": " "}, "it is blank")]
)
async def test_an_answer_to_a_paused_run_without_the_data_is_refused(
    data: dict[str, str], reason: str
) -> None:
    # It was fed, and the brain's refusal failed the run: what the run had
    # done was lost, and it could not be answered again.
    text = (machines_dir() / "review.toml").read_text(encoding="utf-8")
    paused = MachineSpec.from_toml(
        text.replace('{ effect = "review" }', '{ decision = "pause" }')
    )
    model = ScriptedModel.of("It is 42.", "It is 42 (source: the census).")
    agent = Agent(model=model, machine=paused, store=MemoryStore())
    waiting = await agent.run("How many?")
    assert waiting.outcome == "paused"
    entries = len(agent.session.entries)

    with pytest.raises(ConfigError) as caught:
        await agent.resume(waiting.session_id, waiting.run_id, Signal("revise", data))

    assert caught.value.field == "event.data"
    assert reason in str(caught.value)
    session = await agent.open_session(waiting.session_id)
    assert len(session.entries) == entries  # nothing was written
    answered = await agent.resume(
        waiting.session_id, waiting.run_id, Signal("revise", {"feedback": FEEDBACK})
    )
    assert answered.outcome == "paused"
    assert model.requests[-1].messages[-1].text == FEEDBACK
