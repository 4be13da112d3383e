"""Properties of the brain over every phase, every event class and random runs.

The stock machine, the shipped approval machine (a pause phase), a user
machine with a custom effect phase and the review machine whose review is a
sub-agent phase are all checked: the guarantees hold for every machine that
loads.
"""

from __future__ import annotations

import itertools
import json
import typing
from typing import TypeAlias

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers import REPO_ROOT, approval_toml, load_turn_spec
from tests.profiles import sized
from turnfsm._resources import load_machine
from turnfsm.core import (
    DECISION_TYPES,
    EVENT_TYPES,
    FAILURES,
    Budget,
    CallLLM,
    Compact,
    CompactionCircuitOpened,
    CompactionNoop,
    CompactionOverflowed,
    CompactionResult,
    CompactorFailed,
    CompactReason,
    ContextOverflowed,
    Decision,
    ErrorInfo,
    Event,
    Fail,
    Failure,
    Finish,
    MachineSpec,
    Measure,
    Measured,
    MessageInjected,
    ModelFailed,
    ModelReplied,
    OutputRejected,
    Pause,
    Perform,
    RunCancelled,
    RunStarted,
    RunTools,
    Signal,
    Snapshot,
    ToolCallsReviewed,
    ToolsFinished,
    TurnMachine,
    Usage,
    emergency_line,
)
from turnfsm.errors import IllegalEvent, InvalidMessage
from turnfsm.messages import Message, OpenCalls, ToolCallPart


def _reviewed_by_a_sub_agent() -> MachineSpec:
    """The shipped review machine, its review the sub-agent phase ``critic``."""
    text = (REPO_ROOT / "machines" / "review.toml").read_text()
    old = 'await_review      = { effect = "review" }'
    assert old in text
    text = text.replace(old, 'await_review      = { subagent = "critic" }')
    text += (
        '\n[subagents.critic]\nmachine = "turn.toml"\nsignal = "revise"\n'
        'key = "feedback"\nroutes = { approved = "APPROVED" }\n'
        'task = "Check {reply}"\n'
    )
    return MachineSpec.from_toml(text)


SPECS = {
    "turn": load_turn_spec(),
    "approval": load_machine(REPO_ROOT / "machines" / "approval.toml"),
    "custom": MachineSpec.from_toml(approval_toml()),
    "subagent": _reviewed_by_a_sub_agent(),
}
SPEC_IDS = list(SPECS)
SENDS_ON = {"call_llm", "compact", "finish"}
"""Decisions before which no tool call may be open (the brain's Rule 4)."""

# -- values --------------------------------------------------------------------

_made = itertools.count()


def fresh_id() -> str:
    """A message id no other message has: a driver never repeats one."""
    return f"m{next(_made)}"


ids = st.builds(fresh_id)
texts = st.text(alphabet="ab z", max_size=6)
counts = st.integers(0, 25_000)
call_ids = st.sampled_from(["c1", "c2", "c3"])
users = st.builds(
    lambda text, id: Message.user(text, id=id), texts.filter(str.strip), ids
)
calls = st.builds(
    lambda call_id, name: ToolCallPart(id=call_id, name=name),
    call_ids,
    st.sampled_from(["read_file", "grep"]),
)
replies = st.builds(
    lambda text, tool_calls, id: Message.assistant(text, tool_calls=tool_calls, id=id),
    texts,
    st.lists(calls, max_size=2),
    ids,
)
tool_replies = st.builds(
    lambda tool_calls, id: Message.assistant(tool_calls=tool_calls, id=id),
    st.lists(calls, min_size=1, max_size=2),
    ids,
)
tool_results = st.builds(
    lambda call_id, content, id: Message.tool_result(call_id, content, id=id),
    call_ids,
    texts,
    ids,
)
messages = st.one_of(users, replies, tool_results)
rejections = st.builds(
    lambda call_id, reason, id: Message.tool_result(
        call_id, f"rejected by the reviewer: {reason}", is_error=True, id=id
    ),
    call_ids,
    texts,
    ids,
)


def answered(reply: Message, count: int | None = None) -> list[Message]:
    """`reply` and results for its first `count` calls (all by default)."""
    calls = reply.tool_calls[:count]
    return [
        reply,
        *(Message.tool_result(c.id, "ok", id=fresh_id()) for c in calls),
    ]


exchanges = st.one_of(
    users.map(lambda m: [m]),
    replies.filter(lambda m: not m.tool_calls).map(lambda m: [m]),
    tool_replies.map(answered),
)


@st.composite
def conversations(draw: st.DrawFn, *, closed: bool = True) -> list[Message]:
    """A valid conversation; unless `closed`, the last reply's calls may be open."""
    out = [m for exchange in draw(st.lists(exchanges, max_size=2)) for m in exchange]
    if not closed and draw(st.booleans()):
        reply = draw(tool_replies)
        out.extend(answered(reply, draw(st.integers(0, len(reply.tool_calls)))))
    return out


errors = st.builds(
    ErrorInfo,
    type=st.sampled_from(["APIError", "TimeoutError"]),
    message=texts,
    retryable=st.booleans(),
)
signal_names = st.sampled_from(
    sorted(set().union(*(spec.triggers for spec in SPECS.values())))
) | st.text(alphabet="abz_", min_size=1, max_size=8)

EVENT_STRATEGIES: dict[type[Event], st.SearchStrategy[Event]] = {
    RunStarted: st.builds(RunStarted, input=st.lists(users, max_size=2)),
    Measured: st.builds(Measured, estimate=counts),
    ModelReplied: st.builds(
        ModelReplied,
        message=replies,
        usage=st.none() | st.builds(Usage, input_tokens=counts, output_tokens=counts),
    ),
    OutputRejected: st.builds(
        OutputRejected,
        message=replies.filter(lambda m: not m.tool_calls),
        errors=st.lists(texts, max_size=2),
        feedback=users,
    ),
    ModelFailed: st.builds(ModelFailed, error=errors),
    ContextOverflowed: st.builds(ContextOverflowed, error=errors),
    ToolsFinished: st.builds(ToolsFinished, results=st.lists(tool_results, max_size=2)),
    ToolCallsReviewed: st.builds(
        ToolCallsReviewed, results=st.lists(rejections, max_size=2)
    ),
    CompactionResult: st.builds(
        CompactionResult,
        messages=st.lists(messages, max_size=3),
        before=counts,
        after=counts,
    ),
    CompactionNoop: st.builds(CompactionNoop, before=counts, after=counts),
    CompactionOverflowed: st.builds(CompactionOverflowed, used=counts, limit=counts),
    CompactorFailed: st.builds(
        CompactorFailed, used=counts, limit=counts, error=errors
    ),
    CompactionCircuitOpened: st.builds(
        CompactionCircuitOpened, failures=st.integers(0, 5)
    ),
    MessageInjected: st.builds(MessageInjected, message=users),
    RunCancelled: st.builds(RunCancelled, reason=texts),
    Signal: st.builds(
        Signal, name=signal_names, data=st.dictionaries(texts, texts, max_size=1)
    ),
}
"""One strategy per event class; `test_every_event_class_has_a_strategy` keeps it so."""

events = st.sampled_from(EVENT_TYPES).flatmap(lambda cls: EVENT_STRATEGIES[cls])

budgets = st.builds(
    Budget,
    context_window=st.sampled_from([0, 8_000, 20_000]) | st.integers(0, 20_000),
    threshold=st.integers(0, 100),
    auto_compact=st.booleans(),
    max_turns=st.integers(1, 6),
    max_overflow_retries=st.integers(0, 3),
)
failures = st.builds(
    Failure,
    kind=st.sampled_from(sorted(FAILURES)),
    used=counts,
    limit=counts,
    detail=texts,
    error_type=texts,
    retryable=st.booleans(),
)


@st.composite
def snapshots_in(draw: st.DrawFn, spec: MachineSpec, phase: str) -> Snapshot:
    """Snapshots in `phase` with every field drawn (a failure where one is due).

    The buffers are a valid conversation, as `from_snapshot` demands: calls
    may be open only in a phase that does not send the conversation on.
    """
    pending = draw(
        conversations(closed=spec.state(phase).decision in SENDS_ON), label="pending"
    )
    tail = [m for m in pending[-3:] if m.tool_calls]
    return draw(
        st.builds(
            Snapshot,
            phase=st.just(phase),
            budget=budgets,
            history=conversations(),
            pending=st.just(pending),
            inbox=st.lists(users, max_size=2),
            estimate=st.none() | counts,
            turns=st.integers(0, 5),
            overflow_retries=st.integers(0, 4),
            compact_reason=st.none() | st.sampled_from(CompactReason),
            last_reply=st.sampled_from(tail[-1:]) if tail else st.none() | replies,
            failure=failures if phase == "failed" else st.none() | failures,
            is_started=st.booleans(),
        )
    )


def test_every_event_class_has_a_strategy() -> None:
    assert set(EVENT_STRATEGIES) == set(EVENT_TYPES)


def test_every_decision_class_is_listed() -> None:
    assert set(DECISION_TYPES) == set(typing.get_args(Decision))


def assert_rule_4(machine: TurnMachine) -> None:
    """The buffers are a valid conversation; none is open when sent on."""
    s, decision = machine.snapshot, machine.decision
    assert OpenCalls.of(s.history).is_closed
    left_open = OpenCalls.of(s.pending)
    if isinstance(decision, CallLLM | Compact | Finish):
        assert left_open.is_closed
    if isinstance(decision, RunTools | Pause):
        assert {c.id for c in decision.calls} <= set(left_open.ids)


# -- totality ------------------------------------------------------------------


@pytest.mark.parametrize("name", SPEC_IDS)
@settings(max_examples=sized(300), deadline=None)
@given(data=st.data())
def test_handle_returns_a_decision_or_raises_illegal_event(
    name: str, data: st.DataObject
) -> None:
    spec = SPECS[name]
    phase = data.draw(st.sampled_from(spec.phases), label="phase")
    machine = TurnMachine.from_snapshot(spec, data.draw(snapshots_in(spec, phase)))
    before = machine.snapshot
    event = data.draw(events, label="event")

    outcome: Decision | IllegalEvent | InvalidMessage
    try:
        outcome = machine.handle(event)
    except (IllegalEvent, InvalidMessage) as refused:
        outcome = refused

    if isinstance(outcome, IllegalEvent | InvalidMessage):
        assert (machine.phase, machine.snapshot) == (phase, before)
        assert phase not in spec.terminal
    else:
        assert isinstance(outcome, DECISION_TYPES)
        assert machine.phase in spec.phases
        assert outcome == machine.decision
    assert_rule_4(machine)


@pytest.mark.parametrize("name", SPEC_IDS)
@settings(max_examples=sized(100), deadline=None)
@given(data=st.data())
def test_terminal_phases_absorb_every_event(name: str, data: st.DataObject) -> None:
    spec = SPECS[name]
    phase = data.draw(st.sampled_from(spec.terminal), label="phase")
    machine = TurnMachine.from_snapshot(spec, data.draw(snapshots_in(spec, phase)))
    decision, snapshot = machine.decision, machine.snapshot

    for event in data.draw(st.lists(events, min_size=1, max_size=8), label="events"):
        assert machine.handle(event) is decision
    assert (machine.phase, machine.snapshot, machine.is_finished) == (
        phase,
        snapshot,
        True,
    )


STOCK_PHASES = [p for p in SPECS["turn"].phases if p not in SPECS["turn"].terminal]
BUILTIN_TRIGGERS = sorted(SPECS["turn"].triggers)


@pytest.mark.parametrize("trigger", BUILTIN_TRIGGERS)
@pytest.mark.parametrize("phase", STOCK_PHASES)
def test_a_signal_never_poses_as_a_builtin_event(phase: str, trigger: str) -> None:
    snapshot = Snapshot(
        phase=phase,
        estimate=100,
        compact_reason=CompactReason.MANUAL,
        last_reply=Message.assistant("", tool_calls=[ToolCallPart(id="c1", name="t")]),
    )
    machine = TurnMachine.from_snapshot(SPECS["custom"], snapshot)

    with pytest.raises(IllegalEvent) as illegal:
        machine.handle(Signal(name=trigger))

    assert (illegal.value.phase, illegal.value.event) == (phase, trigger)


# -- runs a driver could feed ----------------------------------------------------


def results_for_calls(calls: tuple[ToolCallPart, ...]) -> st.SearchStrategy[Event]:
    return st.builds(
        lambda contents: ToolsFinished(
            results=[
                Message.tool_result(c.id, text, id=fresh_id())
                for c, text in zip(calls, contents, strict=True)
            ]
        ),
        st.lists(texts, min_size=len(calls), max_size=len(calls)),
    )


def reviews(calls: tuple[ToolCallPart, ...]) -> st.SearchStrategy[Event]:
    """A reviewer's answer: some of `calls` rejected, the others approved."""
    return st.builds(
        lambda rejected: ToolCallsReviewed(
            results=[
                Message.tool_result(c.id, "rejected by the reviewer: no", id=fresh_id())
                for i, c in enumerate(calls)
                if i in rejected
            ]
        ),
        st.sets(st.integers(0, max(len(calls) - 1, 0)), max_size=len(calls)),
    )


def weighted(
    *choices: tuple[int, st.SearchStrategy[Event]],
) -> st.SearchStrategy[Event]:
    """Pick among strategies with integer weights."""
    pool = [strategy for weight, strategy in choices for _ in range(weight)]
    return st.sampled_from(pool).flatmap(lambda strategy: strategy)


def passes(before: int) -> st.SearchStrategy[Event]:
    """Compaction feeds for a pass over a request of `before` tokens."""
    saved = st.integers(0, max(before - 1, 0))
    return weighted(
        (
            6,
            st.builds(
                lambda after, new: CompactionResult(
                    messages=new, before=before, after=after
                ),
                saved,
                conversations(),
            ),
        ),
        (2, st.builds(lambda after: CompactionNoop(before=before, after=after), saved)),
        (  # may make no progress
            1,
            st.builds(
                CompactionResult, messages=conversations(), before=counts, after=counts
            ),
        ),
        (1, EVENT_STRATEGIES[CompactionNoop]),
        (1, EVENT_STRATEGIES[CompactionOverflowed]),
        (1, EVENT_STRATEGIES[CompactorFailed]),
        (1, EVENT_STRATEGIES[CompactionCircuitOpened]),
    )


def answer(machine: TurnMachine) -> st.SearchStrategy[Event]:
    """The events a driver may feed back after the machine's decision."""
    window = machine.snapshot.budget.context_window
    estimate = machine.snapshot.estimate or 0
    main: st.SearchStrategy[Event]
    match machine.decision:
        case Measure():
            # around the lines of the window, or anywhere when there is none
            top = window + window // 10 if window else 25_000
            main = st.builds(Measured, estimate=st.integers(0, top))
        case CallLLM():
            main = weighted(
                (8, st.builds(ModelReplied, message=tool_replies)),
                (2, EVENT_STRATEGIES[ModelReplied]),
                (1, EVENT_STRATEGIES[ModelFailed]),
                (2, EVENT_STRATEGIES[ContextOverflowed]),
            )
        case RunTools(calls=calls):
            main = results_for_calls(calls)
        case Pause(calls=calls):
            main = reviews(calls)
        case Compact():
            main = passes(estimate)
        case Perform(phase=phase):
            # The signals the phase ends with (an effect's, or a sub-agent's
            # answer routed), mostly the one that goes on; one whose
            # transition adds its data to the conversation carries the message.
            spec = machine.spec
            names = sorted(set(spec.accepts(phase)) & set(spec.signals))
            keys = {
                t.trigger: t.message
                for t in spec.transitions
                if t.message is not None and phase in t.sources
            }

            def signal(name: str, text: str) -> Signal:
                if name not in keys:
                    return Signal(name=name)
                said = Message.user(text, id=fresh_id())
                return Signal(name=name, data={keys[name]: text}, message=said)

            main = st.builds(
                signal,
                st.sampled_from(names + ["approved"] * 3 * ("approved" in names)),
                texts.filter(str.strip),
            )
        case Finish() | Fail():
            raise AssertionError("a finished run takes no more events")
    return weighted(
        (9, main),
        (1, EVENT_STRATEGIES[MessageInjected]),
        (1, EVENT_STRATEGIES[RunCancelled]),
        (9, main),
    )


@st.composite
def runs(
    draw: st.DrawFn, spec: MachineSpec, *, any_event: bool = False
) -> tuple[Budget, list[Event]]:
    """A budget and an event log for `spec`, fed as a driver would feed it.

    With `any_event`, some events are drawn from every class instead, so a log
    may end with an illegal event.
    """
    budget = draw(budgets)
    machine = TurnMachine.start(spec, budget=budget)
    log: list[Event] = [draw(EVENT_STRATEGIES[RunStarted])]
    machine.handle(log[0])
    while not machine.is_finished and len(log) < 60:
        choice = answer(machine)
        if any_event:
            choice = weighted((9, choice), (1, events))
        log.append(draw(choice))
        try:
            machine.handle(log[-1])
        except (IllegalEvent, InvalidMessage) as refused:
            # A driver's feeds keep the conversation valid; only a drawn
            # event of any class may break it.
            if isinstance(refused, InvalidMessage) and not any_event:
                raise
            break
    return budget, log


Outcome: TypeAlias = Decision | str


def replay(
    spec: MachineSpec, budget: Budget, log: list[Event]
) -> tuple[list[Outcome], TurnMachine]:
    machine = TurnMachine.start(spec, budget=budget)
    outcomes: list[Outcome] = []
    for event in log:
        try:
            outcomes.append(machine.handle(event))
        except (IllegalEvent, InvalidMessage) as refused:
            outcomes.append(repr(refused))
    return outcomes, machine


@pytest.mark.parametrize("name", SPEC_IDS)
@settings(max_examples=sized(100), deadline=None)
@given(data=st.data())
def test_same_log_gives_same_decisions(name: str, data: st.DataObject) -> None:
    spec = SPECS[name]
    budget, log = data.draw(runs(spec, any_event=True), label="run")

    first, one = replay(spec, budget, log)
    second, two = replay(spec, budget, log)

    assert first == second
    assert (one.phase, one.snapshot) == (two.phase, two.snapshot)


@pytest.mark.parametrize("name", SPEC_IDS)
@settings(max_examples=sized(100), deadline=None)
@given(data=st.data())
def test_snapshot_round_trip_at_any_point_equals_the_uninterrupted_run(
    name: str, data: st.DataObject
) -> None:
    spec = SPECS[name]
    budget, log = data.draw(runs(spec), label="run")
    split = data.draw(st.integers(0, len(log)), label="split")
    uninterrupted, whole = replay(spec, budget, log)
    _, paused = replay(spec, budget, log[:split])

    restored = Snapshot.from_dict(json.loads(json.dumps(paused.snapshot.to_dict())))
    resumed = TurnMachine.from_snapshot(spec, restored)
    first = resumed.decision
    rest = [resumed.handle(event) for event in log[split:]]

    assert (restored, first) == (paused.snapshot, paused.decision)
    assert rest == uninterrupted[split:]
    assert resumed.snapshot == whole.snapshot


@pytest.mark.parametrize("name", SPEC_IDS)
@settings(max_examples=sized(200), deadline=None)
@given(data=st.data())
def test_no_model_call_on_or_over_the_emergency_line(
    name: str, data: st.DataObject
) -> None:
    spec = SPECS[name]
    budget, log = data.draw(runs(spec), label="run")
    window = budget.context_window

    outcomes, _ = replay(spec, budget, log)

    over_the_line = [
        (event.estimate, outcome)
        for event, outcome in zip(log, outcomes, strict=True)
        if isinstance(event, Measured)
        and isinstance(outcome, CallLLM)
        and window > 0
        and event.estimate >= emergency_line(window)
    ]
    assert over_the_line == []


@pytest.mark.parametrize("name", SPEC_IDS)
@settings(max_examples=sized(200), deadline=None)
@given(data=st.data())
def test_overflow_retries_and_turns_stay_within_the_budget(
    name: str, data: st.DataObject
) -> None:
    spec = SPECS[name]
    budget, log = data.draw(runs(spec), label="run")
    machine = TurnMachine.start(spec, budget=budget)

    # Overflow passes are counted in a row: a model reply starts the count
    # again, and the turn limit bounds the replies, so the run still ends.
    in_a_row = 0
    for event in log:
        decision = machine.handle(event)
        step = machine.last_step
        if isinstance(event, (ModelReplied, OutputRejected)):
            in_a_row = 0
        if step is not None and step.reason is CompactReason.OVERFLOW:
            in_a_row += 1
        assert in_a_row <= budget.max_overflow_retries
        assert machine.snapshot.overflow_retries <= budget.max_overflow_retries
        assert machine.snapshot.turns <= budget.max_turns
        if isinstance(decision, CallLLM):
            assert decision.turn == machine.snapshot.turns + 1 <= budget.max_turns
