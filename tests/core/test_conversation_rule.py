"""Rule 4: whatever feeds the brain, its buffers stay a valid conversation."""

from __future__ import annotations

import json
import tomllib

import pytest

import turnfsm.messages._open_calls
from tests.helpers import (
    calling,
    load_turn_spec,
    machine_at,
    reply,
    result,
    results_for,
    run_script,
    start_machine,
    turn_toml_text,
    user,
)
from turnfsm.core import (
    Budget,
    CallLLM,
    CompactionResult,
    Event,
    MachineSpec,
    Measure,
    Measured,
    MessageInjected,
    ModelReplied,
    RunStarted,
    RunTools,
    Signal,
    Snapshot,
    ToolsFinished,
    TurnMachine,
)
from turnfsm.errors import ConfigError, InvalidMessage, MachineBroken
from turnfsm.messages import Message, MessageLog, OpenCalls

BUDGET = Budget(context_window=100_000)
U = user("look both up", id="u1")
ASKS = calling("c1", "c2", id="a1")


def in_run_tools() -> TurnMachine:
    machine = start_machine(budget=BUDGET)
    run_script(
        machine,
        [RunStarted(input=[U]), Measured(estimate=10), ModelReplied(message=ASKS)],
    )
    assert machine.decision == RunTools(calls=ASKS.tool_calls)
    return machine


def refused(machine: TurnMachine, event: Event) -> InvalidMessage:
    """Feed `event`; assert it is refused and the snapshot is kept."""
    before, phase = machine.snapshot, machine.phase
    with pytest.raises(InvalidMessage) as caught:
        machine.handle(event)
    assert (machine.snapshot, machine.phase) == (before, phase)
    with pytest.raises(MachineBroken):
        machine.handle(Measured(estimate=10))
    return caught.value


def test_a_result_for_the_wrong_call_id_is_refused() -> None:
    machine = in_run_tools()

    error = refused(
        machine, ToolsFinished(results=[result("c1"), result("c9", id="r9")])
    )

    assert (error.field, error.value) == ("tool_result.call_id", "c9")


def test_a_duplicated_result_is_refused() -> None:
    machine = in_run_tools()

    error = refused(
        machine, ToolsFinished(results=[result("c1"), result("c2"), result("c2")])
    )

    assert (error.field, error.value) == ("tool_result.call_id", "c2")


def test_a_missing_result_is_caught_before_the_model_call() -> None:
    machine = in_run_tools()
    decision = machine.handle(ToolsFinished(results=[result("c1", id="r1")]))
    assert isinstance(decision, Measure)  # calls may be open until sent on

    error = refused(machine, Measured(estimate=10))

    assert (error.field, error.value) == ("tool_call.id", "c2")
    assert machine.phase == "start"


def test_a_compaction_that_splits_a_call_from_its_result_is_refused() -> None:
    machine = start_machine(budget=Budget(context_window=1_000))
    run_script(machine, [RunStarted(input=[U]), Measured(estimate=990)])
    split = [ASKS, user("summary", id="s1"), *results_for(ASKS)]

    error = refused(machine, CompactionResult(messages=split, before=990, after=10))

    assert (error.field, error.value) == ("tool_call.id", "c1")


def test_a_compaction_that_keeps_pairs_whole_is_taken() -> None:
    machine = start_machine(budget=Budget(context_window=1_000))
    run_script(machine, [RunStarted(input=[U]), Measured(estimate=990)])
    kept = [user("summary", id="s1"), ASKS, *results_for(ASKS)]

    decision = machine.handle(CompactionResult(messages=kept, before=990, after=10))

    assert decision == Measure(history=MessageLog(kept), pending=MessageLog())


def test_an_injection_cannot_carry_tool_parts() -> None:
    machine = in_run_tools()

    for message in (result("c1"), calling("c3")):
        with pytest.raises(InvalidMessage) as caught:
            machine.inject(message)
        assert caught.value.field == "message.parts"
    assert machine.decision == RunTools(calls=ASKS.tool_calls)


def test_a_fed_injection_of_a_tool_result_is_refused_when_it_joins_pending() -> None:
    # `inject()` checks up front; a raw event is caught by Rule 4 instead.
    machine = start_machine(budget=BUDGET)
    machine.handle(RunStarted(input=[U]))

    error = refused(machine, MessageInjected(message=result("c1", id="r1")))

    assert (error.field, error.value) == ("tool_result.call_id", "c1")


def test_a_valid_tool_round_finishes_and_commits() -> None:
    machine = in_run_tools()
    run_script(
        machine,
        [ToolsFinished(results=results_for(ASKS)), Measured(estimate=10)],
    )

    machine.handle(ModelReplied(message=reply("both found", id="a2")))

    assert machine.phase == "done"
    assert OpenCalls.of(machine.snapshot.history).is_closed


def orphan_snapshot() -> Snapshot:
    return Snapshot(phase="start", history=[user(id="h1"), result("c1", id="r1")])


def test_snapshot_from_dict_rejects_an_orphaned_result() -> None:
    data = json.loads(json.dumps(orphan_snapshot().to_dict()))

    with pytest.raises(InvalidMessage) as caught:
        Snapshot.from_dict(data)

    assert (caught.value.field, caught.value.value) == ("tool_result.call_id", "c1")


def test_snapshot_from_dict_rejects_an_unanswered_call_in_history() -> None:
    snapshot = Snapshot(phase="start", history=[calling("c7"), user()])

    with pytest.raises(InvalidMessage) as caught:
        Snapshot.from_dict(snapshot.to_dict())

    assert (caught.value.field, caught.value.value) == ("tool_call.id", "c7")


def test_snapshot_from_dict_keeps_open_calls_of_the_last_reply_in_pending() -> None:
    snapshot = Snapshot(phase="run_tools", pending=[U, ASKS], last_reply=ASKS)

    assert Snapshot.from_dict(snapshot.to_dict()) == snapshot


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"history": [user(), result("c1")]}, ("tool_result.call_id", "c1")),
        ({"history": [ASKS]}, ("tool_call.id", "c1")),
        ({"pending": [U, ASKS, user()]}, ("tool_call.id", "c1")),
        ({"phase": "call_llm", "pending": [U, ASKS]}, ("tool_call.id", "c1")),
    ],
    ids=["orphan-result", "open-history", "user-between", "open-before-model"],
)
def test_from_snapshot_rejects_invalid_buffers(
    fields: dict[str, object], expected: tuple[str, str]
) -> None:
    with pytest.raises(InvalidMessage) as caught:
        machine_at(**{"phase": "start", **fields})  # type: ignore[arg-type]

    assert (caught.value.field, caught.value.value) == expected


def test_from_snapshot_with_an_unknown_phase_is_a_config_error() -> None:
    with pytest.raises(ConfigError) as caught:
        TurnMachine.from_snapshot(load_turn_spec(), Snapshot(phase="elsewhere"))

    assert (caught.value.field, caught.value.value) == ("phase", "elsewhere")


def test_start_checks_a_message_log_history() -> None:
    with pytest.raises(InvalidMessage) as caught:
        TurnMachine.start(load_turn_spec(), history=MessageLog([calling("c5")]))

    assert (caught.value.field, caught.value.value) == ("tool_call.id", "c5")


def test_run_tools_runs_only_the_unanswered_calls() -> None:
    machine = machine_at(
        "run_tools", pending=[U, ASKS, result("c1", id="r1")], last_reply=ASKS
    )

    assert machine.decision == RunTools(calls=ASKS.tool_calls[1:])


def test_run_tools_with_every_call_answered_runs_nothing() -> None:
    machine = machine_at(
        "run_tools", pending=[U, ASKS, *results_for(ASKS)], last_reply=ASKS
    )

    assert machine.decision == RunTools(calls=())
    assert machine.handle(ToolsFinished(results=[])) == Measure(
        history=MessageLog(), pending=MessageLog([U, ASKS, *results_for(ASKS)])
    )


def test_run_tools_without_a_reply_runs_nothing() -> None:
    assert machine_at("run_tools").decision == RunTools(calls=())


# -- cost: O(new messages) per event, not O(history) ---------------------------


@pytest.fixture
def steps(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the messages the conversation checker steps over."""
    count = [0]
    step = turnfsm.messages._open_calls._step

    def counting(open_ids: tuple[str, ...], message: object) -> tuple[str, ...]:
        count[0] += 1
        return step(open_ids, message)

    monkeypatch.setattr(turnfsm.messages._open_calls, "_step", counting)
    return count


def long_history(n: int) -> list[Message]:
    out: list[Message] = []
    for i in range(n // 3):
        asks = calling(f"c{i}", id=f"a{i}")
        out += [user(f"q{i}", id=f"u{i}"), asks, *results_for(asks)]
    return out


def test_each_event_checks_only_the_new_messages(steps: list[int]) -> None:
    history = long_history(5_000)
    machine = TurnMachine.start(load_turn_spec(), budget=BUDGET, history=tuple(history))
    assert steps[0] == len(history)  # the one full check, at the start

    per_event = []
    for _ in range(3):  # three runs of two tool rounds each, committed
        if machine.is_finished:
            machine = TurnMachine.from_snapshot(
                load_turn_spec(),
                Snapshot(
                    phase="start", budget=BUDGET, history=machine.snapshot.history
                ),
            )
        asks = calling("c1", "c2")  # each run's reply is a message of its own
        script: list[Event] = [
            RunStarted(input=[user("again")]),
            Measured(estimate=10),
            ModelReplied(message=asks),
            ToolsFinished(results=results_for(asks)),
            Measured(estimate=10),
            ModelReplied(message=calling("c3")),
            ToolsFinished(results=[result("c3")]),
            Measured(estimate=10),
            ModelReplied(message=reply()),
        ]
        for event in script:
            before = steps[0]
            machine.handle(event)
            per_event.append(steps[0] - before)
    assert machine.phase == "done"
    assert len(machine.snapshot.history) > 5_000

    assert max(per_event) <= 10, per_event


def test_a_restored_long_history_is_checked_once(steps: list[int]) -> None:
    history = MessageLog(long_history(5_000))
    snapshot = Snapshot(phase="start", budget=BUDGET, history=history)
    TurnMachine.from_snapshot(load_turn_spec(), snapshot)
    first = steps[0]

    machine = TurnMachine.from_snapshot(load_turn_spec(), snapshot)
    machine.handle(RunStarted(input=[user("go on")]))
    decision = machine.handle(Measured(estimate=10))

    assert first == len(history)
    assert isinstance(decision, CallLLM)
    assert steps[0] - first <= 2


# -- a message joins the conversation once --------------------------------------


def test_a_result_under_an_id_the_conversation_has_is_refused() -> None:
    machine = in_run_tools()

    error = refused(
        machine, ToolsFinished(results=[result("c1", id="u1"), result("c2")])
    )

    assert (error.field, error.value) == ("message.id", "u1")


def test_an_injection_under_an_id_the_conversation_has_is_refused() -> None:
    machine = in_run_tools()
    machine.handle(MessageInjected(message=user("steer", id="s1")))  # waits

    for taken in ("a1", "s1"):  # in pending, in the inbox
        error = refused(
            TurnMachine.from_snapshot(load_turn_spec(), machine.snapshot),
            MessageInjected(message=user("again", id=taken)),
        )
        assert (error.field, error.value) == ("message.id", taken)


def test_a_run_input_under_an_id_the_history_has_is_refused() -> None:
    machine = TurnMachine.start(load_turn_spec(), budget=BUDGET, history=[U, reply()])

    error = refused(machine, RunStarted(input=[user("again", id=U.id)]))

    assert (error.field, error.value) == ("message.id", U.id)


@pytest.mark.parametrize("taken", ["u1", "a1", "h1"])
def test_a_final_reply_under_an_id_the_conversation_has_is_refused(taken: str) -> None:
    # The final reply is committed as it comes: it joined the history unchecked.
    earlier = [user("hello", id="h0"), reply("hi", id="h1")]
    machine = TurnMachine.start(load_turn_spec(), budget=BUDGET, history=earlier)
    run_script(machine, [RunStarted(input=[U]), Measured(estimate=10)])
    run_script(machine, [ModelReplied(message=ASKS)])
    run_script(machine, [ToolsFinished(results=results_for(ASKS))])
    run_script(machine, [Measured(estimate=10)])

    error = refused(machine, ModelReplied(message=reply("done", id=taken)))

    assert (error.field, error.value) == ("message.id", taken)


def _checking_machine() -> TurnMachine:
    """Stock, but a reply's tool calls go to `check_tools`, whose `stop` ends it."""
    text = turn_toml_text()
    text = text.replace(
        'terminal = ["done", "failed"]\n',
        'terminal = ["done", "failed"]\nsignals = ["stop"]\n',
    )
    text = text.replace("[states]\n", '[states]\ncheck_tools = { effect = "check" }\n')
    text = text.replace(
        'source = "call_llm"\ndest = "run_tools"',
        'source = "call_llm"\ndest = "check_tools"',
    )
    text += (
        '\n[[transitions]]\ntrigger = "tool_calls_reviewed"\nsource = "check_tools"'
        '\ndest = "run_tools"\nactions = ["record_review"]\n'
        '\n[[transitions]]\ntrigger = "stop"\nsource = "check_tools"\ndest = "start"'
        '\nconditions = ["has_injected_messages"]\n'
        '\n[[transitions]]\ntrigger = "stop"\nsource = "check_tools"\ndest = "done"\n'
    )
    # The loader refuses it now (`stop` leaves the calls unanswered); a log
    # may keep one recorded before, which is read as it ran.
    spec = MachineSpec.from_dict(tomllib.loads(text), recorded=True)
    machine = TurnMachine.start(spec, budget=BUDGET)
    run_script(
        machine,
        [RunStarted(input=[U]), Measured(estimate=10), ModelReplied(message=ASKS)],
    )
    assert machine.phase == "check_tools"
    return machine


def test_ending_done_with_a_call_unanswered_names_the_phase() -> None:
    # It said only "a tool call with no result before the next message".
    error = refused(_checking_machine(), Signal("stop"))

    assert (error.field, error.value) == ("tool_call.id", "c1")
    assert error.reason == (
        "a tool call with no result before the next message: phase 'done' would"
        " end the run with it unanswered (each call of a reply needs its result"
        " first: from a run_tools phase, or from a review that rejects it)"
    )
