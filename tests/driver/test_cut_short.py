"""A run killed in the middle of a tool call resumes with the call closed.

A real process (`cut_short_worker.py`) is killed with SIGKILL inside a tool,
after the tool's side effect and before its result reached the log. Another
process resumes the run: the call, whose effects are unknown, is closed with
an error result saying it was interrupted (logged like any result), and the
tool is not run again; a tool marked safe to run twice (``idempotent``) runs
again instead. A conversation given from elsewhere that ends in calls with
no result is closed the same way when a run carries it on. Either way no
call is left open: the run finishes, every run replays, and the next
compaction pass folds the history.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.driver import cut_short_worker as worker
from tests.helpers import run_killed
from turnfsm import Driver
from turnfsm.core import ToolsFinished
from turnfsm.driver import Tool, function_tool, replay
from turnfsm.errors import ConfigError, InvalidMessage
from turnfsm.messages import Message, ToolCallPart, check_history
from turnfsm.persistence import (
    EventRecorded,
    Session,
    SQLiteStore,
    ToolResultRecorded,
    Verdict,
)
from turnfsm.testing import ScriptedModel

pytestmark = pytest.mark.anyio


def _kill_mid_tool(tmp: Path) -> tuple[Path, Path, str]:
    path, effects, session_file = tmp / "s.db", tmp / "effects", tmp / "session"
    run_killed(
        "tests.driver.cut_short_worker", str(path), str(effects), str(session_file)
    )
    assert effects.read_text().split() == ["p1"]  # the side effect happened
    return path, effects, session_file.read_text()


def _nothing() -> None:
    pass


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("idempotent", [False, True])
async def test_a_call_killed_mid_tool_is_closed_as_interrupted_on_resume(
    tmp_path: Path, idempotent: bool
) -> None:
    path, effects, session_id = _kill_mid_tool(tmp_path)
    store = SQLiteStore(path)
    session = await Session.load(store, session_id)
    (run,) = session.open_runs()
    assert run.outcome == "running"
    driver = worker.driver(str(effects), idempotent=idempotent, then=_nothing)

    # The dead process's lease is still live: force takes it over.
    result = await driver.resume(session, run.run_id, force=True)

    assert result.outcome == "done", result.error
    (closing,) = [p for m in session.history for p in m.tool_results]
    if idempotent:  # safe to run twice: it ran again
        assert effects.read_text().split() == ["p1", "p1"]
        assert (closing.content, closing.is_error) == ("p1 delivered", False)
        assert result.text == "delivery: p1 delivered"
    else:  # ran once: closed as interrupted, the model told so
        assert effects.read_text().split() == ["p1"]
        assert closing.is_error
        assert closing.content == (
            "tool 'deliver' was interrupted: the run stopped before this call "
            "finished, so its effects are unknown (it may have done all, some "
            "or none of its work); call it again if it is still needed"
        )
        assert result.text.startswith("delivery: tool 'deliver' was interrupted")
        # Logged like a result, in the run that made the call.
        (logged,) = [e for e in session.entries if isinstance(e, ToolResultRecorded)]
        assert (logged.run_id, logged.result.tool_results) == (run.run_id, (closing,))
    check_history(session.history)
    assert all(replay(None, session, r.run_id).ok for r in session.runs)

    # No call is left open: the next pass folds the history.
    compacted = await driver.compact(session)
    assert compacted.ok, compacted.error
    (record,) = session.runs[-1].compactions
    assert record.verdict is Verdict.COMPACTED
    assert record.tokens_after < record.tokens_before
    check_history(session.history)
    reopened = await Session.load(store, session_id)
    assert list(reopened.history) == list(session.history)
    assert all(replay(None, reopened, r.run_id).ok for r in reopened.runs)
    assert len(effects.read_text().split()) == (2 if idempotent else 1)
    await store.aclose()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("idempotent", [False, True])
async def test_a_run_killed_while_the_model_reads_a_result_loses_no_call_it_cannot_redo(
    tmp_path: Path, idempotent: bool
) -> None:
    # The tool finished; the process died in the model call that followed.
    # A result of a tool not safe to run twice was logged before that call:
    # the resumed run does not run it again. One of a tool safe to run twice
    # rides the reply's append: lost with the process, the call runs again.
    path, effects, session_file = tmp_path / "s.db", tmp_path / "fx", tmp_path / "id"
    where = "model-idempotent" if idempotent else "model"
    run_killed(
        "tests.driver.cut_short_worker",
        str(path),
        str(effects),
        str(session_file),
        where,
    )
    assert effects.read_text().split() == ["p1"]  # the tool ran, and finished
    store = SQLiteStore(path)
    session = await Session.load(store, session_file.read_text())
    (run,) = session.open_runs()
    logged = [
        e.event
        for e in session.entries
        if isinstance(e, EventRecorded) and e.run_id == run.run_id
    ]
    assert [type(e) is ToolsFinished for e in logged].count(True) == (
        0 if idempotent else 1
    )
    driver = worker.driver(str(effects), idempotent=idempotent, then=_nothing)

    result = await driver.resume(session, run.run_id, force=True)

    assert result.outcome == "done", result.error
    assert result.text == "delivery: p1 delivered"  # never closed as interrupted
    assert effects.read_text().split() == ["p1", "p1"] if idempotent else ["p1"]
    (closing,) = [p for m in session.history for p in m.tool_results]
    assert (closing.content, closing.is_error) == ("p1 delivered", False)
    check_history(session.history)
    reopened = await Session.load(store, session.id)
    assert list(reopened.history) == list(session.history)
    assert all(replay(None, reopened, r.run_id).ok for r in reopened.runs)
    await store.aclose()


async def test_a_conversation_given_cut_short_mid_tool_is_closed_as_interrupted() -> (
    None
):
    """A history from elsewhere that ends in calls with no result (its process
    died mid-tool) is carried on: each call is closed as interrupted, in the
    run's logged input, and the model decides what to do."""
    call = Message.assistant(
        tool_calls=[
            ToolCallPart(id="m1", name="send_mail", arguments={"to": "ada"}),
            ToolCallPart(id="m2", name="send_mail", arguments={"to": "bob"}),
        ]
    )
    session = Session()
    driver = Driver(model=ScriptedModel.of("I will ask before sending again."))

    result = await driver.run([Message.user("mail ada and bob"), call], session=session)

    assert result.outcome == "done", result.error
    closing = [p for m in session.history for p in m.tool_results]
    assert [(p.call_id, p.is_error) for p in closing] == [("m1", True), ("m2", True)]
    assert all(
        p.content.startswith("tool 'send_mail' was interrupted") for p in closing
    )
    (run,) = session.runs
    assert [m.id for m in run.input] == [m.id for m in session.history[:4]]
    check_history(session.history)
    assert replay(None, session, run.run_id).ok


async def test_a_message_after_a_call_with_no_result_is_still_refused() -> None:
    call = Message.assistant(tool_calls=[ToolCallPart(id="m1", name="send_mail")])
    session = Session()
    with pytest.raises(InvalidMessage) as caught:
        await Driver(model=ScriptedModel.of("x")).run(
            [Message.user("hi"), call, Message.user("and?")], session=session
        )
    assert (caught.value.field, caught.value.value) == ("tool_call.id", "m1")
    assert session.entries == ()  # nothing written


def _lookup(key: str) -> str:
    """Look a key up.

    Args:
        key: the key.
    """
    return key


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_idempotent_is_true_or_false(value: object) -> None:
    with pytest.raises(ConfigError) as caught:
        Tool(
            name="lookup",
            description="Look a key up.",
            parameters={"type": "object"},
            fn=_lookup,
            idempotent=value,  # type: ignore[arg-type]
        )
    assert (caught.value.field, caught.value.value) == ("idempotent", value)
    assert "True or False" in str(caught.value)


def test_idempotent_defaults_to_off_and_is_kept_by_every_way_to_build_a_tool() -> None:
    assert not Tool.from_function(_lookup).idempotent
    assert Tool.from_function(_lookup, idempotent=True).idempotent
    assert function_tool(idempotent=True)(_lookup).idempotent
    assert function_tool(_lookup, idempotent=True).idempotent
