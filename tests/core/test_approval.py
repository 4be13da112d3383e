"""The shipped approval machine: a review of the tool calls before they run."""

from __future__ import annotations

import json

import pytest

from tests.helpers import REPO_ROOT, calling, reply, result, run_script, user
from turnfsm import approval_machine
from turnfsm._resources import load_machine
from turnfsm.core import (
    Budget,
    CallLLM,
    Fail,
    Finish,
    MachineSpec,
    Measure,
    Measured,
    MessageInjected,
    ModelReplied,
    Pause,
    RunCancelled,
    RunStarted,
    RunTools,
    Signal,
    Snapshot,
    ToolCallsReviewed,
    ToolsFinished,
    TurnMachine,
)
from turnfsm.errors import Cancelled, ConfigError, InvalidMessage
from turnfsm.messages import Message, MessageLog, Role, ToolResultPart

SPEC = load_machine(REPO_ROOT / "machines" / "approval.toml")
BUDGET = Budget(context_window=100_000)
U = user("clean up the repo", id="u1")
ASKS = calling("rm", "ls", id="a1")
RM, LS = ASKS.tool_calls
ACCEPTS = ("message_injected", "run_cancelled", "tool_calls_reviewed")
WAITING = Pause(phase="await_approval", calls=(RM, LS), accepts=ACCEPTS)


def paused() -> TurnMachine:
    machine = TurnMachine.start(SPEC, budget=BUDGET)
    decisions = run_script(
        machine,
        [RunStarted(input=[U]), Measured(estimate=10), ModelReplied(message=ASKS)],
    )
    assert decisions[-1] == WAITING
    return machine


def test_the_shipped_machine_loads_with_a_pause_phase() -> None:
    assert approval_machine() == SPEC
    assert SPEC.name == "approval"
    assert SPEC.state("await_approval").decision == "pause"
    assert "await_approval" not in SPEC.terminal


def test_a_reply_with_two_calls_pauses_for_both() -> None:
    machine = paused()

    assert machine.phase == "await_approval"
    assert machine.decision == WAITING
    assert machine.decision is machine.decision  # asked twice, same answer


def test_approve_all_runs_both_calls() -> None:
    machine = paused()

    decision = machine.handle(ToolCallsReviewed.approve_all())

    assert decision == RunTools(calls=(RM, LS))
    assert machine.snapshot.pending == MessageLog([U, ASKS])


def test_reject_one_runs_the_other_and_answers_the_model() -> None:
    machine = paused()
    review = ToolCallsReviewed.reject({"rm": "destructive"})

    decision = machine.handle(review)

    assert decision == RunTools(calls=(LS,))
    (rejection,) = review.results
    assert machine.snapshot.pending == MessageLog([U, ASKS, rejection])
    assert (rejection.role, rejection.parts) == (
        Role.TOOL,
        (
            ToolResultPart(
                call_id="rm",
                content="rejected by the reviewer: destructive",
                is_error=True,
            ),
        ),
    )


def test_reject_all_runs_nothing() -> None:
    machine = paused()

    decision = machine.handle(ToolCallsReviewed.reject({"rm": "no", "ls": "no"}))

    assert decision == RunTools(calls=())


def test_rejections_are_committed_when_the_run_finishes() -> None:
    machine = paused()
    review = ToolCallsReviewed.reject({"rm": "destructive"})
    listing = result("ls", "README.md", id="r-ls")
    final = reply("I only listed the files", id="a2")

    decisions = run_script(
        machine,
        [
            review,
            ToolsFinished(results=[listing]),
            Measured(estimate=20),
            ModelReplied(message=final),
        ],
    )

    history = [U, ASKS, *review.results, listing, final]
    assert decisions == [
        RunTools(calls=(LS,)),
        Measure(history=MessageLog(), pending=MessageLog(history[:-1])),
        CallLLM(history=MessageLog(), pending=MessageLog(history[:-1]), turn=2),
        Finish(text="I only listed the files"),
    ]
    assert list(machine.snapshot.history) == history


def test_a_rejection_for_a_call_that_is_not_open_is_refused() -> None:
    machine = paused()
    before = machine.snapshot

    with pytest.raises(InvalidMessage) as caught:
        machine.handle(ToolCallsReviewed.reject({"mv": "unknown"}))

    assert (caught.value.field, caught.value.value) == ("tool_result.call_id", "mv")
    assert machine.snapshot == before


def rejected(call_id: str, *, id: str) -> Message:
    return result(call_id, "rejected by the reviewer", is_error=True, id=id)


TAKEN = [
    ToolCallsReviewed.approve_all(),
    ToolCallsReviewed.reject({"ls": "no"}),
    ToolCallsReviewed(results=[rejected("rm", id="r1"), rejected("ls", id="r2")]),
    ToolCallsReviewed(
        results=[rejected("rm", id="r1"), rejected("ls", id="r2"), user("thanks")]
    ),
    RunCancelled(reason="no"),
    MessageInjected(message=user("and be careful")),
]


@pytest.mark.parametrize("answer", TAKEN, ids=lambda e: type(e).__name__)
def test_the_pause_takes_every_answer_the_brain_takes(answer: object) -> None:
    WAITING.check_answer(answer)
    paused().handle(answer)  # type: ignore[arg-type]


NOT_A_RESULT = user("ok", id="u9")

REFUSED = [
    (ToolCallsReviewed.reject({"mv": "unknown"}), "event.results.call_id", "mv"),
    (
        ToolCallsReviewed(results=[rejected("rm", id="r1"), rejected("rm", id="r2")]),
        "event.results.call_id",
        "rm",
    ),
    # It named the call id ('rm'), not the message given where a result belongs.
    (ToolCallsReviewed(results=[NOT_A_RESULT]), "event.results[0]", NOT_A_RESULT),
]


@pytest.mark.parametrize(
    ("answer", "field", "value"), REFUSED, ids=["unknown", "twice", "no result"]
)
def test_the_pause_refuses_what_the_brain_would_fail_on(
    answer: ToolCallsReviewed, field: str, value: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        WAITING.check_answer(answer)

    assert (caught.value.field, caught.value.value) == (field, value)
    assert "rm, ls" in caught.value.expected
    with pytest.raises(InvalidMessage):
        paused().handle(answer)


def test_a_review_that_answers_a_call_with_a_success_is_refused() -> None:
    # It was taken: the call never ran, and the model read the reviewer's
    # text as the tool's own successful result.
    fake = result("rm", "fake ok", id="r1")
    with pytest.raises(ConfigError) as caught:
        WAITING.check_answer(ToolCallsReviewed(results=[rejected("ls", id="r2"), fake]))
    assert (caught.value.field, caught.value.value) == ("event.results[1]", fake)
    assert "error tool result" in caught.value.expected


@pytest.mark.parametrize("answer", ["approve", 5, None, Signal(name="go")])
def test_the_pause_refuses_what_its_phase_does_not_accept(answer: object) -> None:
    with pytest.raises(ConfigError) as caught:
        WAITING.check_answer(answer)

    assert (caught.value.field, caught.value.value) == ("event", answer)
    listed = "accepts: " + ", ".join(ACCEPTS)
    if isinstance(answer, Signal):  # an event, of a trigger it does not take
        assert caught.value.expected.endswith(listed)
    else:  # no event: how to approve follows the list
        assert caught.value.expected.endswith(
            f"{listed} (ToolCallsReviewed.approve_all() lets every call run)"
        )


def test_a_result_missing_after_the_review_never_reaches_the_model() -> None:
    machine = paused()
    run_script(
        machine,
        [ToolCallsReviewed.reject({"rm": "no"}), ToolsFinished(results=[])],
    )

    with pytest.raises(InvalidMessage) as caught:
        machine.handle(Measured(estimate=10))

    assert (caught.value.field, caught.value.value) == ("tool_call.id", "ls")
    # It said only "a tool call with no result before the next message",
    # naming neither where the run was nor what answers a call.
    assert str(caught.value) == (
        "invalid message tool_call.id='ls': a tool call with no result before the"
        " next message: phase 'call_llm' would call the model with it unanswered"
        " (each call of a reply needs its result first: from a run_tools phase,"
        " or from a review that rejects it)"
    )


def test_cancelling_the_paused_run_fails_it_and_drops_pending() -> None:
    machine = paused()

    decision = machine.handle(RunCancelled(reason="rejected by the reviewer"))

    assert decision == Fail(error=Cancelled(reason="rejected by the reviewer"))
    assert machine.snapshot.pending == MessageLog()


def test_an_injection_while_paused_waits_in_the_inbox() -> None:
    machine = paused()
    note = user("only list, never delete", id="n1")

    decision = machine.handle(MessageInjected(message=note))

    assert decision == WAITING
    assert machine.snapshot.inbox == (note,)


def test_a_paused_run_resumes_from_its_snapshot_in_another_process() -> None:
    machine = paused()
    stored = json.loads(json.dumps(machine.snapshot.to_dict()))

    resumed = TurnMachine.from_snapshot(SPEC, Snapshot.from_dict(stored))

    assert resumed.decision == WAITING
    assert resumed.handle(ToolCallsReviewed.approve_all()) == RunTools(calls=(RM, LS))


def test_reject_builds_one_error_result_per_call_with_fresh_ids() -> None:
    review = ToolCallsReviewed.reject({"a": "x", "b": "y"})

    assert [m.tool_results for m in review.results] == [
        (
            ToolResultPart(
                call_id=c, content=f"rejected by the reviewer: {r}", is_error=True
            ),
        )
        for c, r in [("a", "x"), ("b", "y")]
    ]
    assert len({m.id for m in review.results}) == 2
    assert ToolCallsReviewed.approve_all() == ToolCallsReviewed(results=())


@pytest.mark.parametrize(
    ("reasons", "field"),
    [
        ({}, "reasons"),
        (["c1"], "reasons"),
        ("c1", "reasons"),
        ({"c1": None}, "reasons['c1']"),
    ],
    ids=["empty", "list of ids", "one id", "reason not a string"],
)
def test_a_rejection_naming_no_call_is_refused(reasons: object, field: str) -> None:
    # reject({}) approved every call; reject(["c1"]) raised AttributeError.
    with pytest.raises(ConfigError) as caught:
        ToolCallsReviewed.reject(reasons)  # type: ignore[arg-type]
    assert caught.value.field == field
    if field == "reasons":
        assert "naming at least one call (approve_all() lets every call run)" in str(
            caught.value
        )


@pytest.mark.parametrize("call_id", [1, None, ""], ids=["int", "None", "blank"])
def test_a_rejection_keyed_by_what_is_no_call_id_names_the_reasons(
    call_id: object,
) -> None:
    # It was an InvalidMessage about a tool result's call_id, which the
    # caller never wrote.
    with pytest.raises(ConfigError) as caught:
        ToolCallsReviewed.reject({call_id: "no"})  # type: ignore[dict-item]
    assert caught.value.field == "reasons"
    assert caught.value.value == call_id
    assert "call ids" in str(caught.value)


@pytest.mark.parametrize("reason", ["", "  "], ids=["empty", "blank"])
def test_a_rejection_without_a_reason_reads_as_one(reason: str) -> None:
    # It read "rejected by the reviewer: " with nothing after the colon.
    (result,) = ToolCallsReviewed.reject({"c1": reason}).results
    assert result.tool_results[0].content == "rejected by the reviewer"
    assert result.tool_results[0].is_error


def test_a_user_machine_may_pause_anywhere() -> None:
    spec = MachineSpec.from_dict(
        {
            "name": "gate",
            "initial": "start",
            "terminal": ["done", "failed"],
            "signals": ["approved"],
            "states": {
                "start": {"decision": "measure"},
                "gate": {"decision": "pause"},
                "done": {"decision": "finish", "on_enter": ["commit_pending"]},
                "failed": {"decision": "fail"},
            },
            "transitions": [
                {
                    "trigger": "run_started",
                    "source": "start",
                    "dest": "gate",
                    "actions": ["record_start"],
                },
                {"trigger": "approved", "source": "gate", "dest": "done"},
                {
                    "trigger": "run_cancelled",
                    "source": ["start", "gate"],
                    "dest": "failed",
                    "error": "cancelled",
                },
            ],
        }
    )
    machine = TurnMachine.start(spec)

    assert machine.handle(RunStarted(input=(user(),))) == Pause(
        phase="gate", calls=(), accepts=("approved", "run_cancelled")
    )
    assert isinstance(machine.handle(Signal(name="approved")), Finish)
