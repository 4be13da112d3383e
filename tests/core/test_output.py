"""A final answer that does not fit the output type: a bounded re-ask."""

from __future__ import annotations

import pytest

from tests.helpers import REPO_ROOT, load_turn_spec, reply, run_script, user
from turnfsm._resources import load_machine
from turnfsm.core import (
    Budget,
    CallLLM,
    Fail,
    Finish,
    MachineSpec,
    Measure,
    Measured,
    ModelReplied,
    OutputRejected,
    RunStarted,
    Snapshot,
    TurnMachine,
)
from turnfsm.errors import OutputInvalid
from turnfsm.messages import Message, MessageLog, Role

SPECS = {
    "turn": load_turn_spec(),
    "approval": load_machine(REPO_ROOT / "machines" / "approval.toml"),
}
U = user("how old is Ada?", id="u1")
ERRORS = ('age: expected integer, got "old" (string)',)


def rejected(n: int) -> OutputRejected:
    return OutputRejected(
        message=reply('{"age": "old"}', id=f"bad{n}"),
        errors=ERRORS,
        feedback=Message.user(f"fix it {n}", id=f"ask{n}"),
    )


def started(spec: MachineSpec, retries: int) -> TurnMachine:
    machine = TurnMachine.start(spec, budget=Budget(max_output_retries=retries))
    run_script(machine, [RunStarted(input=[U]), Measured(estimate=10)])
    return machine


@pytest.mark.parametrize("name", sorted(SPECS))
def test_a_rejected_answer_is_kept_and_the_model_asked_again(name: str) -> None:
    machine = started(SPECS[name], retries=2)

    decisions = run_script(machine, [rejected(1), Measured(estimate=20)])

    pending = MessageLog([U, rejected(1).message, rejected(1).feedback])
    assert decisions == [
        Measure(history=MessageLog(), pending=pending),
        CallLLM(history=MessageLog(), pending=pending, turn=2),
    ]
    assert (machine.snapshot.turns, machine.snapshot.output_retries) == (1, 1)
    assert machine.last_step is not None


@pytest.mark.parametrize("name", sorted(SPECS))
def test_a_valid_answer_after_a_rejection_commits_the_whole_exchange(
    name: str,
) -> None:
    machine = started(SPECS[name], retries=2)
    good = reply('{"age": 36}', id="good")

    decisions = run_script(
        machine, [rejected(1), Measured(estimate=20), ModelReplied(message=good)]
    )

    assert decisions[-1] == Finish(text='{"age": 36}')
    assert list(machine.snapshot.history) == [
        U,
        rejected(1).message,
        rejected(1).feedback,
        good,
    ]


@pytest.mark.parametrize("retries", [0, 1, 3])
def test_the_re_asks_are_bounded_by_max_output_retries(retries: int) -> None:
    machine = started(SPECS["turn"], retries=retries)
    decisions = []
    for n in range(retries + 1):
        decisions.append(machine.handle(rejected(n)))
        if n < retries:
            machine.handle(Measured(estimate=20))

    last = decisions[-1]
    assert isinstance(last, Fail)
    assert isinstance(last.error, OutputInvalid)
    assert (last.error.errors, last.error.retries) == (ERRORS, retries)
    assert "expected integer" in str(last.error)
    assert machine.snapshot.phase == "failed"
    assert list(machine.snapshot.history) == []
    assert all(not isinstance(d, Fail) for d in decisions[:-1])


def test_the_feedback_lists_every_error_by_default() -> None:
    event = OutputRejected(message=reply("x"), errors=["a: bad", "b: worse"])

    assert event.feedback.role is Role.USER
    assert "- a: bad\n- b: worse" in event.feedback.text


def test_the_retry_count_round_trips_in_the_snapshot() -> None:
    machine = started(SPECS["turn"], retries=2)
    machine.handle(rejected(1))

    snapshot = Snapshot.from_dict(machine.snapshot.to_dict())

    assert snapshot == machine.snapshot
    assert snapshot.output_retries == 1
    assert Budget().max_output_retries == 2
