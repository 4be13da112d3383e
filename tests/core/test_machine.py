"""The stock Turn FSM, step by step: phase and decision after every event."""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.helpers import (
    REPO_ROOT,
    calling,
    load_turn_spec,
    machine_at,
    reply,
    result,
    results_for,
    run_script,
    start_machine,
    user,
)
from turnfsm.core import (
    GUARDS,
    REDUCERS,
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
    Finish,
    MachineSpec,
    Measure,
    Measured,
    MessageInjected,
    ModelFailed,
    ModelReplied,
    RunCancelled,
    RunStarted,
    RunTools,
    Signal,
    Snapshot,
    StateSpec,
    Step,
    ToolsFinished,
    TransitionSpec,
    TurnMachine,
)
from turnfsm.errors import (
    CONTEXT_CHECK,
    CONTEXT_OVERFLOW,
    Cancelled,
    CompactionCircuitOpen,
    CompactionFailed,
    CompactionStalled,
    ConfigError,
    ContextExceeded,
    IllegalEvent,
    InvalidMessage,
    MachineBroken,
    ProviderError,
    TurnFSMError,
)
from turnfsm.messages import Message, MessageLog

BUDGET = Budget(context_window=8_000, threshold=80, max_overflow_retries=2)
H1 = user("what is in notes.md?", id="h1")
H2 = reply("a shopping list", id="h2")
HISTORY = MessageLog([H1, H2])
U = user("and in todo.md?", id="u1")
ASKS = calling("c1", "c2", id="a1")
RESULTS = results_for(ASKS)
FINAL = reply("three items", id="a2")
SUMMARY = user("[summary] notes.md holds a shopping list", id="s1")
NOTE = user("also check the calendar", id="n1")
OVERFLOW = ErrorInfo(type="BadRequestError", message="context_length_exceeded")


def log(*messages: Message) -> MessageLog:
    return MessageLog(messages)


def play(machine: TurnMachine, steps: list[tuple[Event, str, Decision]]) -> None:
    """Feed each event; assert the phase and decision after it."""
    for i, (event, phase, decision) in enumerate(steps):
        actual = machine.handle(event)
        assert (i, machine.phase, actual) == (i, phase, decision)


INTO: dict[str, list[Event]] = {
    "start": [RunStarted(input=[U])],
    "call_llm": [RunStarted(input=[U]), Measured(estimate=1_000)],
    "run_tools": [
        RunStarted(input=[U]),
        Measured(estimate=1_000),
        ModelReplied(message=ASKS),
    ],
    "compact": [RunStarted(input=[U]), Measured(estimate=7_600)],
    "compact_and_retry": [
        RunStarted(input=[U]),
        Measured(estimate=5_000),
        ContextOverflowed(error=OVERFLOW),
    ],
}
"""How the driver reaches each non-terminal phase, from history H1, H2."""


def machine_in(phase: str, *, budget: Budget = BUDGET) -> TurnMachine:
    machine = start_machine(budget=budget, history=HISTORY)
    run_script(machine, INTO[phase])
    assert machine.phase == phase
    return machine


def test_tool_loop() -> None:
    machine = start_machine(budget=BUDGET, history=HISTORY)

    play(
        machine,
        [
            (RunStarted(input=[U]), "start", Measure(history=HISTORY, pending=log(U))),
            (
                Measured(estimate=1_000),
                "call_llm",
                CallLLM(history=HISTORY, pending=log(U), turn=1),
            ),
            (ModelReplied(message=ASKS), "run_tools", RunTools(calls=ASKS.tool_calls)),
            (
                ToolsFinished(results=RESULTS),
                "start",
                Measure(history=HISTORY, pending=log(U, ASKS, *RESULTS)),
            ),
            (
                Measured(estimate=2_000),
                "call_llm",
                CallLLM(history=HISTORY, pending=log(U, ASKS, *RESULTS), turn=2),
            ),
            (ModelReplied(message=FINAL), "done", Finish(text="three items")),
        ],
    )
    assert machine.snapshot.turns == 2


def test_reply_without_tool_calls_finishes_and_commits_pending() -> None:
    machine = machine_in("call_llm")

    decision = machine.handle(ModelReplied(message=FINAL))

    assert (decision, machine.phase, machine.is_finished) == (
        Finish(text="three items"),
        "done",
        True,
    )
    assert (machine.snapshot.history, machine.snapshot.pending) == (
        log(H1, H2, U, FINAL),
        log(),
    )


def test_a_reply_without_text_finishes_with_empty_text() -> None:
    machine = machine_in("call_llm")

    decision = machine.handle(ModelReplied(message=Message.assistant("")))

    assert decision == Finish(text="")


FEEDS = ["compaction_result", "compaction_noop"]
COMPACT_PHASES = ["compact", "compact_and_retry"]


def compaction_feed(feed: str, *, before: int, after: int) -> Event:
    if feed == "compaction_result":
        return CompactionResult(messages=[SUMMARY], before=before, after=after)
    return CompactionNoop(before=before, after=after)


@pytest.mark.parametrize("phase", COMPACT_PHASES)
@pytest.mark.parametrize("feed", FEEDS)
@pytest.mark.parametrize(
    ("before", "after"),
    [(7_600, 7_600), (7_600, 7_650)],
    ids=["saved-nothing", "grew"],
)
def test_no_progress_guard_fails_the_run(
    phase: str, feed: str, before: int, after: int
) -> None:
    machine = machine_in(phase)

    decision = machine.handle(compaction_feed(feed, before=before, after=after))

    assert (machine.phase, decision) == (
        "failed",
        Fail(error=CompactionStalled(used=after, limit=before)),
    )
    assert (machine.snapshot.history, machine.snapshot.pending) == (HISTORY, log())


@pytest.mark.parametrize(
    ("phase", "dest", "decision"),
    [
        ("compact", "start", Measure(history=log(SUMMARY), pending=log())),
        (
            "compact_and_retry",
            "call_llm",
            CallLLM(history=log(SUMMARY), pending=log(), turn=1),
        ),
    ],
    ids=COMPACT_PHASES,
)
def test_compaction_result_commits(phase: str, dest: str, decision: Decision) -> None:
    machine = machine_in(phase)

    actual = machine.handle(
        CompactionResult(messages=[SUMMARY], before=7_600, after=900)
    )

    assert (machine.phase, actual) == (dest, decision)
    assert (machine.snapshot.history, machine.snapshot.pending) == (
        log(SUMMARY),
        log(),
    )
    assert machine.snapshot.estimate == 900


@pytest.mark.parametrize("phase", COMPACT_PHASES)
def test_noop_with_progress_goes_back_to_start_untouched(phase: str) -> None:
    machine = machine_in(phase)

    decision = machine.handle(CompactionNoop(before=7_600, after=7_500))

    assert (machine.phase, decision) == (
        "start",
        Measure(history=HISTORY, pending=log(U)),
    )
    assert machine.snapshot.estimate == 7_500


def test_context_overflow_compacts_and_retries() -> None:
    machine = machine_in("call_llm")

    decision = machine.handle(ContextOverflowed(error=OVERFLOW))

    assert (machine.phase, decision) == (
        "compact_and_retry",
        Compact(reason=CompactReason.OVERFLOW, history=HISTORY, pending=log(U)),
    )
    assert machine.snapshot.overflow_retries == 1


@pytest.mark.parametrize("retries", [0, 1, 2, 3])
def test_overflow_retries_are_bounded(retries: int) -> None:
    budget = Budget(context_window=8_000, max_overflow_retries=retries)
    machine = machine_in("call_llm", budget=budget)
    retry = Compact(reason=CompactReason.OVERFLOW, history=HISTORY, pending=log(U))
    estimate = 1_000
    for k in range(retries):
        after = 900 - k
        play(
            machine,
            [
                (ContextOverflowed(error=OVERFLOW), "compact_and_retry", retry),
                (
                    CompactionResult(messages=[H1, H2], before=after + 1, after=after),
                    "call_llm",
                    CallLLM(history=HISTORY, pending=log(), turn=1),
                ),
            ],
        )
        retry = Compact(reason=CompactReason.OVERFLOW, history=HISTORY, pending=log())
        estimate = after

    decision = machine.handle(ContextOverflowed(error=OVERFLOW))

    assert (machine.phase, decision) == (
        "failed",
        Fail(error=ContextExceeded(used=estimate, limit=8_000)),
    )
    assert machine.snapshot.overflow_retries == retries


REFUSED = ErrorInfo(
    type=CONTEXT_OVERFLOW,
    message="maximum context length is 4096 tokens",
    status=400,
)


def test_a_stalled_pass_after_an_overflow_quotes_the_provider() -> None:
    machine = machine_in("call_llm")
    machine.handle(ContextOverflowed(error=REFUSED))

    decision = machine.handle(CompactionNoop(before=366, after=366))

    assert machine.phase == "failed"
    stalled = CompactionStalled(used=366, limit=366, provider_message=REFUSED.message)
    assert decision == Fail(error=stalled)
    assert isinstance(decision, Fail)
    assert str(decision.error).startswith("compaction stalled: 366 tokens after")
    assert "(the provider said: maximum context length is 4096 tokens)" in str(
        decision.error
    )


def test_an_overflow_past_its_retries_quotes_the_provider() -> None:
    machine = machine_in(
        "call_llm", budget=attrs.evolve(BUDGET, max_overflow_retries=0)
    )

    decision = machine.handle(ContextOverflowed(error=REFUSED))

    assert isinstance(decision, Fail)
    assert type(decision.error) is ContextExceeded
    assert decision.error.provider_message == REFUSED.message


@pytest.mark.parametrize(
    ("refusal", "reason"),
    [
        (ErrorInfo(type=CONTEXT_CHECK, message="the reply is over the window"), None),
        (REFUSED, CompactReason.EMERGENCY),
    ],
    ids=["not-the-provider", "a-later-pass"],
)
def test_a_stall_quotes_only_the_provider_on_its_own_overflow(
    refusal: ErrorInfo, reason: CompactReason | None
) -> None:
    machine = machine_in("call_llm")
    machine.handle(ContextOverflowed(error=refusal))
    if reason is not None:  # the retry fits; a later pass stalls
        machine.handle(CompactionResult(messages=[H1, H2, U], before=900, after=800))
        machine.handle(ModelReplied(message=ASKS))
        machine.handle(ToolsFinished(results=RESULTS))
        machine.handle(Measured(estimate=7_600))
        assert machine.snapshot.compact_reason is reason

    decision = machine.handle(CompactionNoop(before=7_600, after=7_600))

    assert isinstance(decision, Fail)
    assert isinstance(decision.error, CompactionStalled)
    assert decision.error.provider_message == ""
    assert "the provider said" not in str(decision.error)
    # The run's own check is quoted as its own, on the pass run for it.
    checked = refusal.type == CONTEXT_CHECK and reason is None
    assert decision.error.window_check == (refusal.message if checked else "")
    said = "(the window check said: the reply is over the window)"
    assert (said in str(decision.error)) is checked


def test_model_failure_fails_the_run() -> None:
    machine = machine_in("call_llm")
    error = ErrorInfo(type="RateLimitError", message="slow down", retryable=True)

    decision = machine.handle(ModelFailed(error=error))

    assert (machine.phase, decision) == (
        "failed",
        Fail(
            error=ProviderError(
                message="slow down", retryable=True, kind="RateLimitError"
            )
        ),
    )


_SECONDS = st.none() | st.floats(0, 1e6, allow_nan=False, allow_infinity=False)


@given(
    error=st.builds(
        ErrorInfo,
        type=st.sampled_from(["rate_limit", "server", "timeout", "auth"]),
        message=st.text(max_size=20),
        retryable=st.booleans(),
        status=st.none() | st.integers(100, 599),
        retry_after=_SECONDS,
        attempts=st.none() | st.integers(0, 10),
        elapsed=_SECONDS,
    )
)
def test_a_model_failure_s_error_reaches_the_run_s_error_whole(
    error: ErrorInfo,
) -> None:
    # The run's error dropped the provider's retry_after (the log kept it).
    machine = machine_in("call_llm")

    decision = machine.handle(ModelFailed(error=error))

    assert isinstance(decision, Fail)
    assert isinstance(decision.error, ProviderError)
    assert attrs.asdict(decision.error) == attrs.asdict(
        ProviderError(
            message=error.message,
            retryable=error.retryable,
            kind=error.type,
            retry_after=error.retry_after,
            status=error.status,
            attempts=error.attempts,
            elapsed=error.elapsed,
        )
    )
    # And a snapshot stored with the failure reads back with it; without a
    # wait, it is stored as before (a turnfsm of before reads it).
    snapshot = machine.snapshot
    stored = snapshot.to_dict()
    assert ("retry_after" in stored["failure"]) == (error.retry_after is not None)
    assert Snapshot.from_dict(json.loads(json.dumps(stored))) == snapshot


@pytest.mark.parametrize("phase", COMPACT_PHASES)
@pytest.mark.parametrize(
    ("event", "error"),
    [
        (
            CompactionOverflowed(used=9_100, limit=8_000),
            ContextExceeded(used=9_100, limit=8_000),
        ),
        (
            CompactorFailed(
                used=7_600,
                limit=8_000,
                error=ErrorInfo(type="SummaryFailed", message="summary model down"),
            ),
            CompactionFailed(used=7_600, limit=8_000, cause="summary model down"),
        ),
        (CompactionCircuitOpened(failures=3), CompactionCircuitOpen(failures=3)),
    ],
    ids=["overflowed", "compactor-failed", "circuit-open"],
)
def test_compaction_failures_end_the_run_with_their_error(
    phase: str, event: Event, error: TurnFSMError
) -> None:
    machine = machine_in(phase)

    decision = machine.handle(event)

    assert (machine.phase, decision) == ("failed", Fail(error=error))
    assert (machine.snapshot.history, machine.snapshot.pending) == (HISTORY, log())


def test_failed_run_keeps_the_compacted_history_but_not_pending() -> None:
    machine = machine_in("compact")

    run_script(
        machine,
        [
            CompactionResult(messages=[SUMMARY], before=7_600, after=900),
            Measured(estimate=900),
            ModelReplied(message=ASKS),
            ToolsFinished(results=RESULTS),
            Measured(estimate=1_200),
        ],
    )
    assert machine.snapshot.pending == log(ASKS, *RESULTS)
    decision = machine.handle(ModelFailed(error=ErrorInfo(type="E", message="down")))

    assert isinstance(decision, Fail)
    assert (machine.snapshot.history, machine.snapshot.pending) == (
        log(SUMMARY),
        log(),
    )


def test_failed_run_without_compaction_leaves_history_untouched() -> None:
    machine = machine_in("run_tools")

    run_script(machine, [ToolsFinished(results=RESULTS), Measured(estimate=1_000)])
    machine.handle(ModelFailed(error=ErrorInfo(type="E", message="down")))

    assert (machine.phase, machine.snapshot.history, machine.snapshot.pending) == (
        "failed",
        HISTORY,
        log(),
    )


def test_decision_asked_twice_without_a_feed_is_the_same() -> None:
    machine = machine_in("compact")

    assert machine.decision == machine.decision
    assert machine.decision == Compact(
        reason=CompactReason.EMERGENCY, history=HISTORY, pending=log(U)
    )


def test_fail_decisions_compare_by_value() -> None:
    one = machine_in("call_llm")
    two = machine_in("call_llm")

    first = one.cancel("stop")
    second = two.cancel("stop")

    assert first == second
    assert hash(first) == hash(second)
    assert first != Fail(error=Cancelled(reason="other"))
    assert first != Fail(error=IllegalEvent(phase="stop", event="cancelled"))


def finished(outcome: str) -> TurnMachine:
    machine = machine_in("call_llm")
    if outcome == "done":
        machine.handle(ModelReplied(message=FINAL))
    else:
        machine.handle(ModelFailed(error=ErrorInfo(type="E", message="down")))
    assert machine.phase == outcome
    return machine


EVERY_EVENT: list[Event] = [
    RunStarted(input=[U]),
    Measured(estimate=7_900),
    ModelReplied(message=ASKS),
    ModelFailed(error=ErrorInfo(type="E", message="x")),
    ContextOverflowed(error=OVERFLOW),
    ToolsFinished(results=RESULTS),
    CompactionResult(messages=[SUMMARY], before=10, after=5),
    CompactionNoop(before=10, after=10),
    CompactionOverflowed(used=9_000, limit=8_000),
    CompactorFailed(used=1, limit=2, error=ErrorInfo(type="E", message="x")),
    CompactionCircuitOpened(failures=3),
    MessageInjected(message=NOTE),
    RunCancelled(reason="late"),
    Signal(name="approved"),
]


@pytest.mark.parametrize("outcome", ["done", "failed"])
def test_feeds_after_a_terminal_phase_are_noops(outcome: str) -> None:
    machine = finished(outcome)
    decision, snapshot = machine.decision, machine.snapshot

    for event in EVERY_EVENT:
        assert machine.handle(event) is decision
        assert (machine.phase, machine.snapshot, machine.last_step) == (
            outcome,
            snapshot,
            None,
        )
    assert machine.cancel() is decision
    assert machine.inject(NOTE) is decision
    assert machine.snapshot is snapshot


@pytest.mark.parametrize("phase", list(INTO))
def test_cancel_fails_the_run_from_any_phase(phase: str) -> None:
    machine = machine_in(phase)
    machine.inject(NOTE)

    decision = machine.cancel("user pressed stop")

    assert (machine.phase, decision) == (
        "failed",
        Fail(error=Cancelled(reason="user pressed stop")),
    )
    assert (
        machine.snapshot.history,
        machine.snapshot.pending,
        machine.snapshot.inbox,
    ) == (HISTORY, log(), ())


def test_cancel_without_a_reason() -> None:
    machine = machine_in("start")

    assert machine.cancel() == Fail(error=Cancelled(reason="cancelled"))


def test_cancel_is_a_noop_once_terminal() -> None:
    machine = finished("done")

    decision = machine.cancel("too late")

    assert (machine.phase, decision) == ("done", Finish(text="three items"))


def test_inject_in_start_goes_straight_to_pending() -> None:
    machine = machine_in("start")

    decision = machine.inject(NOTE)

    assert (machine.phase, decision) == (
        "start",
        Measure(history=HISTORY, pending=log(U, NOTE)),
    )
    assert machine.snapshot.inbox == ()


def test_inject_during_call_llm_is_queued_until_the_reply() -> None:
    machine = machine_in("call_llm")
    final = reply("noted", id="a3")

    play(
        machine,
        [
            (
                MessageInjected(message=NOTE),
                "call_llm",
                CallLLM(history=HISTORY, pending=log(U), turn=1),
            ),
            (
                ModelReplied(message=FINAL),
                "start",
                Measure(history=HISTORY, pending=log(U, FINAL, NOTE)),
            ),
            (
                Measured(estimate=1_000),
                "call_llm",
                CallLLM(history=HISTORY, pending=log(U, FINAL, NOTE), turn=2),
            ),
            (ModelReplied(message=final), "done", Finish(text="noted")),
        ],
    )
    assert machine.snapshot.history == log(H1, H2, U, FINAL, NOTE, final)


def test_inject_during_run_tools_joins_after_the_results() -> None:
    machine = machine_in("run_tools")

    play(
        machine,
        [
            (
                MessageInjected(message=NOTE),
                "run_tools",
                RunTools(calls=ASKS.tool_calls),
            ),
            (
                ToolsFinished(results=RESULTS),
                "start",
                Measure(history=HISTORY, pending=log(U, ASKS, *RESULTS, NOTE)),
            ),
        ],
    )


def test_inject_during_compaction_survives_the_commit() -> None:
    machine = machine_in("compact")
    machine.inject(NOTE)

    decision = machine.handle(
        CompactionResult(messages=[SUMMARY], before=7_600, after=900)
    )

    assert (machine.phase, decision) == (
        "start",
        Measure(history=log(SUMMARY), pending=log(NOTE)),
    )


def test_inject_with_tool_calls_in_the_reply_runs_the_tools_first() -> None:
    machine = machine_in("call_llm")
    machine.inject(NOTE)

    decision = machine.handle(ModelReplied(message=ASKS))

    assert (machine.phase, decision) == ("run_tools", RunTools(calls=ASKS.tool_calls))
    assert machine.snapshot.inbox == (NOTE,)


@pytest.mark.parametrize(
    "value", [None, "measured", Measured, {"estimate": 10}], ids=repr
)
def test_a_value_that_is_not_an_event_is_refused_and_the_machine_goes_on(
    value: object,
) -> None:
    machine = machine_in("call_llm")
    snapshot, decision = machine.snapshot, machine.decision

    with pytest.raises(ConfigError) as refused:
        machine.handle(value)  # type: ignore[arg-type]

    assert (refused.value.field, refused.value.value) == ("event", value)
    assert (machine.phase, machine.snapshot, machine.decision) == (
        "call_llm",
        snapshot,
        decision,
    )
    machine.handle(ModelReplied(message=FINAL))
    assert machine.phase == "done"


@pytest.mark.parametrize(
    ("phase", "event", "trigger"),
    [
        ("start", ModelReplied(message=FINAL), "model_replied"),
        ("call_llm", Measured(estimate=10), "measured"),
        ("run_tools", ModelReplied(message=FINAL), "model_replied"),
        ("compact", ToolsFinished(results=RESULTS), "tools_finished"),
        ("compact_and_retry", ContextOverflowed(error=OVERFLOW), "context_overflowed"),
        ("call_llm", Signal(name="approved"), "approved"),
        ("call_llm", Signal(name="model_replied"), "model_replied"),
        ("start", Signal(name="measured"), "measured"),
    ],
    ids=[
        "reply-in-start",
        "measured-in-call_llm",
        "reply-in-run_tools",
        "tools-in-compact",
        "overflow-in-compact_and_retry",
        "undeclared-signal",
        "signal-posing-as-reply",
        "signal-posing-as-measured",
    ],
)
def test_illegal_event_breaks_the_machine(
    phase: str, event: Event, trigger: str
) -> None:
    machine = machine_in(phase)
    snapshot, decision = machine.snapshot, machine.decision

    with pytest.raises(IllegalEvent) as illegal:
        machine.handle(event)

    assert (illegal.value.phase, illegal.value.event) == (phase, trigger)
    later: list[Callable[[], Decision]] = [
        lambda: machine.handle(Measured(estimate=1)),
        lambda: machine.handle(event),
        machine.cancel,
        lambda: machine.inject(NOTE),
    ]
    for call in later:
        with pytest.raises(MachineBroken) as broken:
            call()
        assert broken.value.phase == phase
    assert (machine.phase, machine.snapshot, machine.decision) == (
        phase,
        snapshot,
        decision,
    )


def test_second_run_started_is_illegal() -> None:
    machine = machine_in("run_tools")
    machine.handle(ToolsFinished(results=RESULTS))
    snapshot = machine.snapshot

    with pytest.raises(IllegalEvent) as illegal:
        machine.handle(RunStarted(input=[user("again")]))

    assert (illegal.value.phase, illegal.value.event) == ("start", "run_started")
    assert machine.snapshot == snapshot
    with pytest.raises(MachineBroken, match="IllegalEvent"):
        machine.handle(Measured(estimate=1))


def test_a_reducer_that_raises_after_another_leaves_the_snapshot_as_it_was() -> None:
    # The actions of one transition change one copy of the snapshot: when a
    # later one raises, what the earlier ones changed is thrown away with it.
    text = (REPO_ROOT / "machines" / "turn.toml").read_text(encoding="utf-8")
    old = 'actions = ["record_start"]'
    assert text.count(old) == 1
    spec = MachineSpec.from_toml(
        text.replace(old, 'actions = ["count_compaction", "record_start"]')
    )
    machine = TurnMachine.start(spec, budget=BUDGET)
    machine.handle(RunStarted(input=[U]))
    snapshot = machine.snapshot
    fields = dict(vars(snapshot))

    with pytest.raises(IllegalEvent) as illegal:
        machine.handle(RunStarted(input=[user("again")]))

    assert (illegal.value.phase, illegal.value.event) == ("start", "run_started")
    assert machine.snapshot is snapshot
    assert vars(snapshot) == fields
    assert (snapshot.compactions, machine.phase) == (1, "start")
    with pytest.raises(MachineBroken, match="IllegalEvent"):
        machine.handle(Measured(estimate=1))


@pytest.mark.parametrize("name", sorted(REDUCERS))
def test_a_reducer_keeps_its_signature_and_its_words(name: str) -> None:
    # A reducer is the fields it changes applied to a copy; what a user
    # calls is still ``(snapshot, event) -> Snapshot``, with its own docstring.
    reducer = REDUCERS[name]
    signature = inspect.signature(reducer)

    assert list(signature.parameters) == ["s", "e"]
    assert signature.return_annotation == "Snapshot"
    assert reducer.__name__ == name
    assert inspect.getdoc(reducer)
    assert f"def {name}(" in inspect.getsource(reducer)


def test_broken_machine_can_be_replaced_from_its_last_good_snapshot() -> None:
    machine = machine_in("call_llm")
    with pytest.raises(IllegalEvent):
        machine.handle(Measured(estimate=1))

    fresh = TurnMachine.from_snapshot(machine.spec, machine.snapshot)

    assert fresh.handle(ModelReplied(message=FINAL)) == Finish(text="three items")


RICH_RUN: list[Event] = [
    RunStarted(input=[U]),
    MessageInjected(message=NOTE),
    Measured(estimate=6_500),
    CompactionResult(messages=[SUMMARY, U], before=6_500, after=2_000),
    Measured(estimate=2_000),
    ModelReplied(message=ASKS),
    MessageInjected(message=user("hurry", id="n2")),
    ToolsFinished(results=RESULTS),
    Measured(estimate=3_000),
    ContextOverflowed(error=OVERFLOW),
    CompactionNoop(before=3_000, after=2_900),
    Measured(estimate=2_900),
    ModelReplied(message=FINAL),
]
"""A run through compaction, injection, tools, an overflow and a noop."""


def test_rich_run_finishes() -> None:
    machine = start_machine(budget=BUDGET, history=HISTORY)

    decisions = run_script(machine, RICH_RUN)

    assert decisions[-1] == Finish(text="three items")
    assert machine.snapshot.history == log(
        SUMMARY, U, ASKS, *RESULTS, user("hurry", id="n2"), FINAL
    )


@pytest.mark.parametrize("split", range(len(RICH_RUN) + 1))
def test_snapshot_round_trip_continues_identically(split: int) -> None:
    spec = load_turn_spec()
    uninterrupted = start_machine(budget=BUDGET, history=HISTORY)
    run_script(uninterrupted, RICH_RUN[:split])
    paused = start_machine(budget=BUDGET, history=HISTORY)
    run_script(paused, RICH_RUN[:split])

    data = json.loads(json.dumps(paused.snapshot.to_dict()))
    restored = Snapshot.from_dict(data)
    resumed = TurnMachine.from_snapshot(spec, restored)

    assert restored == uninterrupted.snapshot
    assert resumed.decision == uninterrupted.decision
    rest = RICH_RUN[split:]
    assert run_script(resumed, rest) == run_script(uninterrupted, rest)
    assert resumed.snapshot == uninterrupted.snapshot


@pytest.mark.parametrize("outcome", ["done", "failed"])
def test_snapshot_round_trip_of_a_finished_run(outcome: str) -> None:
    machine = finished(outcome)

    data = json.loads(json.dumps(machine.snapshot.to_dict()))
    resumed = TurnMachine.from_snapshot(machine.spec, Snapshot.from_dict(data))

    assert (resumed.phase, resumed.snapshot, resumed.decision) == (
        outcome,
        machine.snapshot,
        machine.decision,
    )


@pytest.mark.parametrize("version", [None, 0, 2, "1"], ids=repr)
def test_snapshot_from_dict_rejects_an_unknown_schema_version(
    version: object,
) -> None:
    data = machine_in("start").snapshot.to_dict()
    data["schema_version"] = version

    with pytest.raises(ConfigError) as error:
        Snapshot.from_dict(data)

    assert (error.value.field, error.value.value) == ("schema_version", version)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"threshold": 0.8}, "threshold"),
        ({"threshold": 101}, "threshold"),
        ({"threshold": -1}, "threshold"),
        ({"context_window": -1}, "context_window"),
        ({"context_window": 8_000.0}, "context_window"),
        ({"max_turns": 0}, "max_turns"),
        ({"max_turns": True}, "max_turns"),
        ({"max_overflow_retries": -1}, "max_overflow_retries"),
        ({"auto_compact": "yes"}, "auto_compact"),
        ({"auto_compact": 1}, "auto_compact"),
    ],
    ids=lambda v: repr(v) if isinstance(v, dict) else v,
)
def test_budget_rejects_out_of_range_settings(
    kwargs: dict[str, object], field: str
) -> None:
    with pytest.raises(ConfigError) as error:
        Budget(**kwargs)  # type: ignore[arg-type]  # deliberately ill-typed

    assert (error.value.field, error.value.value) == (field, kwargs[field])
    assert field in str(error.value)


def test_budget_accepts_the_edges_of_its_ranges() -> None:
    budget = Budget(
        context_window=0, threshold=100, max_turns=1, max_overflow_retries=0
    )

    assert (budget.context_window, budget.threshold) == (0, 100)


def test_last_step_names_the_fired_transition() -> None:
    machine = start_machine(budget=BUDGET)

    steps: list[Step | None] = []
    script: list[Event] = [RunStarted(input=[U]), Measured(estimate=7_600)]
    for event in script:
        machine.handle(event)
        steps.append(machine.last_step)
    machine.handle(CompactionNoop(before=7_600, after=7_600))
    steps.append(machine.last_step)
    machine.handle(Measured(estimate=1))
    steps.append(machine.last_step)

    spec = load_turn_spec()
    fired = [s for s in steps if s is not None]
    # Each step names the file's transition that fired, and the guards it passed.
    for step in fired:
        t = spec.transitions[step.index]
        assert (t.trigger, t.dest or step.source) == (step.trigger, step.dest)
        assert step.source in t.sources
        assert step.guards == (*t.conditions, *(f"not {g}" for g in t.unless))
    assert fired[1].guards  # the emergency line is a guarded transition
    plain = [None if s is None else attrs.evolve(s, index=-1, guards=()) for s in steps]
    assert plain == [
        Step(source="start", dest="start", trigger="run_started"),
        Step(
            source="start",
            dest="compact",
            trigger="measured",
            reason=CompactReason.EMERGENCY,
        ),
        Step(
            source="compact",
            dest="failed",
            trigger="compaction_noop",
            error="compaction_stalled",
        ),
        None,
    ]


def test_start_rejects_a_history_with_an_orphan_tool_result() -> None:
    with pytest.raises(InvalidMessage) as error:
        start_machine(history=[user(), result("nobody-called")])

    assert error.value.field == "tool_result.call_id"


def test_start_takes_a_message_log_as_history() -> None:
    machine = TurnMachine.start(load_turn_spec(), history=HISTORY)

    assert (machine.snapshot.history, machine.snapshot.budget) == (HISTORY, Budget())


def test_from_snapshot_rejects_an_unknown_phase() -> None:
    with pytest.raises(ConfigError) as error:
        TurnMachine.from_snapshot(load_turn_spec(), Snapshot(phase="nowhere"))

    assert (error.value.field, error.value.value) == ("phase", "nowhere")
    assert "a phase of 'turn' (start, call_llm," in str(error.value)


def test_restored_failed_phase_without_a_failure_still_fails() -> None:
    machine = machine_at("failed")

    assert machine.decision == Fail(error=IllegalEvent(phase="failed", event="?"))


def test_unvalidated_spec_whose_guards_all_fail_refuses_the_event() -> None:
    # Bypass the loader, which would reject a group that can fall through.
    spec = MachineSpec(
        name="leaky",
        initial="start",
        terminal=("done",),
        states=(
            StateSpec(name="start", decision="measure"),
            StateSpec(name="done", decision="finish"),
        ),
        transitions=(
            TransitionSpec(
                trigger="measured",
                sources=("start",),
                dest="done",
                conditions=("is_over_emergency_line",),
            ),
        ),
    )
    machine = TurnMachine.start(spec, budget=BUDGET)

    with pytest.raises(IllegalEvent) as illegal:
        machine.handle(Measured(estimate=10))

    assert (illegal.value.phase, illegal.value.event) == ("start", "measured")


def test_line_guards_read_the_recorded_estimate_on_other_events() -> None:
    over = Snapshot(phase="run_tools", budget=BUDGET, estimate=7_600)
    unknown = Snapshot(phase="run_tools", budget=BUDGET)
    event = ToolsFinished(results=())

    actual = [
        GUARDS["is_over_emergency_line"](over, event),
        GUARDS["is_over_threshold_line"](over, event),
        GUARDS["is_over_emergency_line"](unknown, event),
    ]

    assert actual == [True, True, False]


def test_no_progress_guard_reads_only_compaction_feeds() -> None:
    snapshot = Snapshot(phase="compact", budget=BUDGET, estimate=7_600)

    assert GUARDS["is_no_progress"](snapshot, Measured(estimate=9_000)) is False


def test_a_malformed_snapshot_dict_is_a_config_error() -> None:
    from turnfsm.core import Snapshot
    from turnfsm.errors import ConfigError

    good = Snapshot(phase="start").to_dict()
    missing = {k: v for k, v in good.items() if k != "turns"}
    with pytest.raises(ConfigError) as caught:
        Snapshot.from_dict(missing)
    assert caught.value.field == "turns"
    bad_failure = {**good, "failure": {"kind": "no_such_kind"}}
    with pytest.raises(ConfigError):
        Snapshot.from_dict(bad_failure)
    bad_budget = {**good, "budget": {**good["budget"], "threshold": 0.8}}
    with pytest.raises(ConfigError) as caught:
        Snapshot.from_dict(bad_budget)
    assert caught.value.field == "threshold"


def test_inject_refuses_tool_traffic_and_leaves_the_machine_as_it_was() -> None:
    from turnfsm.core import Budget, RunStarted, TurnMachine
    from turnfsm.errors import InvalidMessage
    from turnfsm.messages import Message

    machine = TurnMachine.start(load_turn_spec(), budget=Budget())
    machine.handle(RunStarted(input=[Message.user("hi")]))
    before = machine.snapshot
    with pytest.raises(InvalidMessage) as caught:
        machine.inject(Message.tool_result("c1", "x"))
    assert caught.value.field == "message.parts"
    assert machine.snapshot == before
    machine.inject(Message.user("more"))  # still accepts input
    assert [m.text for m in machine.snapshot.pending] == ["hi", "more"]


def test_on_enter_runs_on_entry_not_on_an_internal_transition() -> None:
    # `gate` flushes the inbox when entered: by a transition into it from
    # elsewhere or from itself (dest = gate), never by one that names no dest.
    # Built without the loader, which refuses these unbounded cycles.
    gate = ("gate",)
    spec = MachineSpec(
        name="gate",
        initial="start",
        terminal=("done",),
        signals=("stay", "again"),
        states=(
            StateSpec(name="start", decision="measure"),
            StateSpec(name="gate", decision="pause", on_enter=("flush_inbox",)),
            StateSpec(name="done", decision="finish"),
        ),
        transitions=(
            TransitionSpec(
                trigger="run_started",
                sources=("start",),
                dest="gate",
                actions=("record_start",),
            ),
            TransitionSpec(
                trigger="message_injected",
                sources=gate,
                dest=None,
                actions=("record_injection",),
            ),
            TransitionSpec(trigger="stay", sources=gate, dest=None),
            TransitionSpec(trigger="again", sources=gate, dest="gate"),
        ),
    )
    machine = TurnMachine.start(spec)
    machine.handle(RunStarted(input=(U,)))
    note = user("by the way")
    machine.inject(note)
    assert machine.snapshot.inbox == (note,)

    machine.handle(Signal(name="stay"))
    assert (machine.snapshot.inbox, list(machine.snapshot.pending)) == ((note,), [U])

    machine.handle(Signal(name="again"))
    assert (machine.snapshot.inbox, list(machine.snapshot.pending)) == ((), [U, note])
    assert machine.last_step == Step(
        source="gate", dest="gate", trigger="again", index=3
    )
