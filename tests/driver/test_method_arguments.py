"""A wrong argument to resume, abandon or compact is named; nothing is written.

`Driver.run` checked its session and control; the others took a session's
id, a string as the control or ``force="no"`` and failed deep inside with
an `AttributeError` (or, on a store with no leases, took ``"no"`` as true
and went on).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from turnfsm import Agent, approval_machine
from turnfsm.core import ToolCallsReviewed
from turnfsm.errors import ConfigError
from turnfsm.persistence import MemoryStore, Session
from turnfsm.testing import ScriptedModel, reply, tool_call

pytestmark = pytest.mark.anyio


def delete(path: str) -> str:
    """Delete a file.

    Args:
        path: the file.
    """
    return f"deleted {path}"


async def _paused(store: MemoryStore) -> tuple[Agent, Session, str]:
    """An agent, and its session with a run paused for approval."""
    model = ScriptedModel.of(
        reply("", tool_call("delete", "c1", path="/tmp/a")), "done", "done"
    )
    agent = Agent(model=model, tools=[delete], machine=approval_machine(), store=store)
    first = await agent.run("clean up")
    assert first.outcome == "paused"
    return agent, await agent.open_session(first.session_id), first.run_id


async def _stored(store: MemoryStore, session_id: str) -> tuple[Any, ...]:
    """What the store holds of the session: its version and its runs' outcomes."""
    session = await Session.open(store, session_id)
    return session.version, [(r.run_id, r.outcome) for r in session.runs]


# The driver (or agent) as Any: the calls pass what the signatures refuse.
_Call = Callable[[Any, Session, str], Awaitable[object]]
_APPROVE = ToolCallsReviewed.approve_all()

DRIVER_CALLS: list[tuple[str, _Call, str, object]] = [
    ("resume-an-id", lambda d, s, r: d.resume("ses_1", r), "session", "ses_1"),
    ("resume-none", lambda d, s, r: d.resume(None, r), "session", None),
    ("abandon-an-id", lambda d, s, r: d.abandon("ses_1", r), "session", "ses_1"),
    ("compact-an-id", lambda d, s, r: d.compact("ses_1"), "session", "ses_1"),
    (
        "resume-control",
        lambda d, s, r: d.resume(s, r, _APPROVE, control="x"),
        "control",
        "x",
    ),
    ("compact-control", lambda d, s, r: d.compact(s, control="x"), "control", "x"),
    ("resume-force", lambda d, s, r: d.resume(s, r, _APPROVE, force=1), "force", 1),
    ("abandon-force", lambda d, s, r: d.abandon(s, r, force="no"), "force", "no"),
    ("compact-force", lambda d, s, r: d.compact(s, force="yes"), "force", "yes"),
    ("resume-run-id", lambda d, s, r: d.resume(s, ["r"]), "run_id", ["r"]),
    ("abandon-run-id", lambda d, s, r: d.abandon(s, ["r"]), "run_id", ["r"]),
]


@pytest.mark.parametrize(
    ("call", "field", "value"),
    [c[1:] for c in DRIVER_CALLS],
    ids=[c[0] for c in DRIVER_CALLS],
)
async def test_a_wrong_argument_of_a_driver_method_is_named_before_any_write(
    call: _Call, field: str, value: object
) -> None:
    store = MemoryStore()
    agent, session, run_id = await _paused(store)
    before = await _stored(store, session.id)
    with pytest.raises(ConfigError) as caught:
        await call(agent.driver, session, run_id)
    assert (caught.value.field, caught.value.value) == (field, value)
    assert await _stored(store, session.id) == before
    assert session.open_runs()[-1].run_id == run_id  # still paused


async def test_a_sessions_id_given_to_resume_shows_how_to_open_it() -> None:
    agent, _, run_id = await _paused(MemoryStore())
    with pytest.raises(ConfigError) as caught:
        await agent.driver.resume("ses_1", run_id)  # type: ignore[arg-type]
    assert str(caught.value) == (
        "invalid session='ses_1': expected a Session, not a session's id: "
        "await Session.open(agent.store, 'ses_1') (the stored session)"
    )


_AgentCall = Callable[[Any, str, str], Awaitable[object]]

AGENT_CALLS: list[tuple[str, _AgentCall, str]] = [
    ("resume-force", lambda a, s, r: a.resume(s, r, _APPROVE, force="no"), "force"),
    ("resume-control", lambda a, s, r: a.resume(s, r, _APPROVE, control=1), "control"),
    ("abandon-force", lambda a, s, r: a.abandon(s, r, force="no"), "force"),
    ("compact-force", lambda a, s, r: a.compact(s, force="yes"), "force"),
]


@pytest.mark.parametrize(
    ("call", "field"), [c[1:] for c in AGENT_CALLS], ids=[c[0] for c in AGENT_CALLS]
)
async def test_a_wrong_argument_of_an_agent_method_is_named_before_any_write(
    call: _AgentCall, field: str
) -> None:
    store = MemoryStore()
    agent, session, run_id = await _paused(store)
    before = await _stored(store, session.id)
    with pytest.raises(ConfigError) as caught:
        await call(agent, session.id, run_id)
    assert caught.value.field == field
    assert await _stored(store, session.id) == before


@pytest.mark.parametrize("session", [0, "", [], False], ids=repr)
async def test_a_falsy_session_given_to_an_agents_run_is_refused(
    session: object,
) -> None:
    # `session or self.session` ran it in the agent's own session.
    agent: Any = Agent(model=ScriptedModel.of("ok", "ok"))
    with pytest.raises(ConfigError) as caught:
        await agent.run("hi", session=session)
    assert (caught.value.field, caught.value.value) == ("session", session)
    with pytest.raises(ConfigError) as streamed:
        async with agent.run_stream("hi", session=session):
            pass
    assert (streamed.value.field, streamed.value.value) == ("session", session)
    assert not agent.session.runs
