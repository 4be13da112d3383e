"""Every machine that loads terminates, and every run can be stopped.

The loader proves that every cycle of a machine passes a model call entered
on `measured` (at most max_turns), the output re-asks' counter guard, or, on
a cycle with no reply (which starts the counts in a row again), the overflow
retries' guard, a compact phase never entered once max_compactions passes in
a row are spent or a compaction feed after the no-progress guard; and that
`run_cancelled` ends the run from every live phase. The brain enforces the
bounds at run time.
"""

from __future__ import annotations

import tomllib

import pytest

from tests.hand_written_machines import PASS_STRAIGHT_TO_THE_MODEL, TURN_LIMIT
from tests.helpers import (
    REPO_ROOT,
    calling,
    reply,
    results_for,
    turn_toml_text,
    user,
)
from turnfsm._resources import load_machine
from turnfsm.core import (
    Budget,
    CallLLM,
    Compact,
    CompactionNoop,
    CompactionResult,
    CompactReason,
    ContextOverflowed,
    Decision,
    Fail,
    Failure,
    MachineSpec,
    Measure,
    Measured,
    MessageInjected,
    ModelReplied,
    OutputRejected,
    RunStarted,
    Snapshot,
    ToolsFinished,
    TurnMachine,
)
from turnfsm.errors import (
    CONTEXT_OVERFLOW,
    CompactionLimitExceeded,
    ConfigError,
    ContextExceeded,
    DefinitionError,
    MaxTurnsExceeded,
    TurnFSMError,
)
from turnfsm.messages import MessageLog
from turnfsm.values import ErrorInfo

STOCK = turn_toml_text()
UNBOUNDED = "is not bounded by a model call, a retry counter or the no-progress guard"
CALL = '[[transitions]]\ntrigger = "measured"\nsource = "start"\ndest = "call_llm"\n'
"""The unconditional measurement that calls the model (the end of its group)."""


def edit(text: str, old: str, new: str) -> str:
    """Replace the one occurrence of `old` in `text`."""
    assert text.count(old) == 1, old
    return text.replace(old, new)


def problems_of(text: str) -> tuple[str, ...]:
    with pytest.raises(DefinitionError) as error:
        MachineSpec.from_toml(text)
    return tuple(p.message for p in error.value.problems)


def before_the_call(transition: str) -> str:
    """The stock file with `transition` just before the measured model call."""
    return edit(STOCK, CALL, transition + "\n" + CALL)


# -- cycles the loader rejects, named ------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            before_the_call(
                '[[transitions]]\ntrigger = "measured"\nsource = "start"\n'
                'dest = "start"\n'
            ),
            (
                f"cycle start -[measured]-> start {UNBOUNDED}",
                "phase 'start' on 'measured': this transition never fires, as the"
                " one without conditions before it (into 'start') takes every"
                " 'measured' there: move it before that one, or remove it",
            ),
        ),
        (
            before_the_call(
                '[[transitions]]\ntrigger = "measured"\nsource = "start"\n'
                'conditions = ["has_injected_messages"]\n'
            ),
            (f"cycle start -[measured]-> start {UNBOUNDED}",),
        ),
        (
            edit(
                STOCK,
                'source = "run_tools"\ndest = "start"',
                'source = "run_tools"\ndest = "run_tools"',
            ),
            (f"cycle run_tools -[tools_finished]-> run_tools {UNBOUNDED}",),
        ),
        (
            edit(
                STOCK,
                'source = "run_tools"\ndest = "start"\n',
                'source = "run_tools"\n',
            ),
            (
                "phase 'run_tools' is a dead end: no transition leaves it",
                f"cycle run_tools -[tools_finished]-> run_tools {UNBOUNDED}",
            ),
        ),
    ],
    ids=[
        "measured-start-to-start",
        "measured-internal-in-start",
        "tools-finished-run-tools-to-itself",
        "tools-finished-internal-in-run-tools",
    ],
)
def test_a_cycle_without_a_bound_is_rejected_by_name(
    text: str, expected: tuple[str, ...]
) -> None:
    assert problems_of(text) == expected


def with_custom_phase(*transitions: str) -> str:
    text = edit(
        STOCK,
        'terminal = ["done", "failed"]\n',
        'terminal = ["done", "failed"]\nsignals = ["retrieved"]\n',
    )
    text = edit(
        text,
        'done              = { decision = "finish"',
        'retrieve          = { effect = "retrieve" }\n'
        'done              = { decision = "finish"',
    )
    return text + "".join("\n" + t for t in transitions)


RETRIEVED = (
    '[[transitions]]\ntrigger = "retrieved"\nsource = "retrieve"\ndest = "start"\n'
)


def test_a_cycle_through_a_custom_phase_needs_a_bound_too() -> None:
    text = edit(
        with_custom_phase(RETRIEVED),
        CALL,
        '[[transitions]]\ntrigger = "measured"\nsource = "start"\n'
        'dest = "retrieve"\nconditions = ["has_injected_messages"]\n\n' + CALL,
    )

    problems = problems_of(text)

    assert problems == (
        f"cycle start -[measured]-> retrieve -[retrieved]-> start {UNBOUNDED}",
    )


def test_a_custom_phase_on_a_model_call_cycle_is_bounded_by_the_turns() -> None:
    text = edit(
        with_custom_phase(RETRIEVED),
        'source = "run_tools"\ndest = "start"',
        'source = "run_tools"\ndest = "retrieve"',
    )

    spec = MachineSpec.from_toml(text)

    assert spec.state("retrieve").effect == "retrieve"


def with_approval(*, pause_decision: str, reply_actions: str) -> str:
    text = edit(
        STOCK,
        'terminal = ["done", "failed"]\n',
        'terminal = ["done", "failed"]\nsignals = ["approved"]\n',
    )
    text = edit(
        text,
        'done              = { decision = "finish"',
        f"await_approval    = {{ {pause_decision} }}\n"
        'done              = { decision = "finish"',
    )
    text = edit(
        text,
        'dest = "run_tools"\nconditions = ["has_tool_calls"]\n'
        'actions = ["record_reply"]',
        f'dest = "await_approval"\nconditions = ["has_tool_calls"]\n{reply_actions}',
    )
    return text + (
        '\n[[transitions]]\ntrigger = "approved"\nsource = "await_approval"\n'
        'dest = "run_tools"\n'
    )


@pytest.mark.parametrize(
    "pause_decision",
    ['decision = "pause"', 'effect = "approve"'],
    ids=["pause", "effect"],
)
def test_the_approval_cycle_is_bounded_by_the_model_call(pause_decision: str) -> None:
    text = with_approval(
        pause_decision=pause_decision, reply_actions='actions = ["record_reply"]'
    )

    spec = MachineSpec.from_toml(text)

    assert "await_approval" in spec.phases


KEEP_REPLY = (
    "a 'model_replied' transition that does not fail the run must keep the model's"
    " reply: add 'record_reply' to its actions"
)
UNANSWERED = (
    "phase 'call_llm' on 'model_replied' enters 'start' with the reply's tool calls"
    " unanswered: put before it a transition on 'model_replied' with conditions ="
    " ['has_tool_calls'] into a phase that answers them (a run_tools phase, or one"
    " that pauses for a review), or add 'has_tool_calls' to its unless"
)


def test_a_model_call_that_does_not_count_its_turn_bounds_nothing() -> None:
    text = with_approval(pause_decision='decision = "pause"', reply_actions="")

    problems = problems_of(text)

    assert problems == (
        "cycle start -[measured]-> call_llm -[model_replied]-> await_approval"
        f" -[approved]-> run_tools -[tools_finished]-> start {UNBOUNDED}",
        KEEP_REPLY,
    )


def test_a_model_call_not_entered_on_measured_bounds_nothing() -> None:
    """Staying in call_llm counts the turn but skips the turn-limit check."""
    text = edit(
        STOCK,
        '[[transitions]]\ntrigger = "model_replied"\nsource = "call_llm"\n'
        'dest = "start"\n',
        '[[transitions]]\ntrigger = "model_replied"\nsource = "call_llm"\n'
        'conditions = ["has_injected_messages"]\nactions = ["record_reply"]\n\n'
        '[[transitions]]\ntrigger = "model_replied"\nsource = "call_llm"\n'
        'dest = "start"\n',
    )

    problems = problems_of(text)

    assert problems == (
        f"cycle call_llm -[model_replied]-> call_llm {UNBOUNDED}",
        "phase 'call_llm' on 'model_replied' stays in it for another model call,"
        " unmeasured: a model call must follow 'measured' or 'compaction_result'"
        " (give it a dest that measures the request: a phase with decision ="
        ' "measure")',
    )


@pytest.mark.parametrize(
    ("trigger", "guard", "spender", "spend"),
    [
        (
            "model_replied",
            "has_output_retries_left",
            "output_rejected",
            "record_rejection",
        ),
        ("model_failed", "has_overflow_retries_left", "model_failed", "count_overflow"),
    ],
)
def test_a_retry_counter_bounds_only_the_transition_that_spends_it(
    trigger: str, guard: str, spender: str, spend: str
) -> None:
    """A guard that is never spent stays true: the step could be taken for ever."""

    def loop(trigger: str, actions: str = "") -> str:
        return before_the_call(
            f'[[transitions]]\ntrigger = "{trigger}"\nsource = "call_llm"\n'
            f'dest = "start"\nconditions = ["{guard}"]\n{actions}'
        )

    # A reply also has to be kept, and its calls answered: problems of their own.
    kept = (KEEP_REPLY, UNANSWERED) if trigger == "model_replied" else ()
    assert problems_of(loop(trigger)) == (
        f"cycle start -[measured]-> call_llm -[{trigger}]-> start {UNBOUNDED}",
        *kept,
    )
    spent = MachineSpec.from_toml(loop(spender, f'actions = ["{spend}"]\n'))
    assert "call_llm" in spent.phases


# -- every run can be stopped --------------------------------------------------

CANCEL = (
    '[[transitions]]\ntrigger = "run_cancelled"\nsource = "*"\ndest = "failed"\n'
    'error = "cancelled"\n'
)
ALL_LIVE = "'start', 'call_llm', 'run_tools', 'compact', 'compact_and_retry'"


def cannot_stop(phases: str) -> str:
    return (
        f"'run_cancelled' cannot stop the run in {phases}: give every non-terminal"
        " phase a 'run_cancelled' transition without conditions into a fail phase"
        ' (source = "*")'
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (edit(STOCK, CANCEL, ""), ALL_LIVE),
        (
            edit(
                STOCK,
                'source = "*"\ndest = "failed"',
                'source = "start"\ndest = "failed"',
            ),
            "'call_llm', 'run_tools', 'compact', 'compact_and_retry'",
        ),
        (
            edit(
                STOCK,
                CANCEL,
                '[[transitions]]\ntrigger = "run_cancelled"\nsource = "run_tools"\n'
                'dest = "failed"\nconditions = ["has_tool_calls"]\n'
                'error = "cancelled"\n\n' + CANCEL,
            ),
            "'run_tools'",
        ),
        (
            edit(
                STOCK,
                CANCEL,
                '[[transitions]]\ntrigger = "run_cancelled"\nsource = "call_llm"\n'
                'dest = "done"\n\n' + CANCEL,
            ),
            "'call_llm'",
        ),
    ],
    ids=["no-cancel", "only-in-start", "guarded-first", "into-done"],
)
def test_a_phase_that_cancel_cannot_stop_is_named(text: str, expected: str) -> None:
    assert problems_of(text) == (cannot_stop(expected),)


# -- compaction passes are bounded per run --------------------------------------

SUMMARY = user("[summary]", id="s1")
SHIPPED = pytest.mark.parametrize(
    "spec",
    [
        MachineSpec.from_toml(STOCK),
        load_machine(REPO_ROOT / "machines" / "approval.toml"),
    ],
    ids=["turn", "approval"],
)


@SHIPPED
def test_an_injection_after_every_pass_ends_at_the_compaction_limit(
    spec: MachineSpec,
) -> None:
    """Each pass lowers the estimate, each injection raises it to the emergency line.

    (8_000 * 95 % = 7_600: on the line.)
    """
    budget = Budget(context_window=8_000, max_compactions=3)
    machine = TurnMachine.start(spec, budget=budget)
    machine.handle(RunStarted(input=[user(id="u1")]))
    decisions: list[Decision] = []
    for i in range(10):
        decision = machine.handle(Measured(estimate=7_600))
        decisions.append(decision)
        if machine.is_finished:
            break
        machine.inject(user(f"note {i}", id=f"n{i}"))
        machine.handle(CompactionResult(messages=[SUMMARY], before=7_600, after=900))

    passes = [d for d in decisions if isinstance(d, Compact)]
    assert (len(passes), machine.snapshot.compactions) == (3, 3)
    assert decisions[-1] == Fail(error=CompactionLimitExceeded(max_compactions=3))
    assert machine.phase == "failed"


def test_a_model_call_between_passes_starts_the_count_again() -> None:
    """A long run compacts as often as its length needs: 10 passes, a limit of 2."""
    budget = Budget(context_window=8_000, max_compactions=2, max_turns=100)
    machine = TurnMachine.start(MachineSpec.from_toml(STOCK), budget=budget)
    machine.handle(RunStarted(input=[user(id="u1")]))
    passes = 0
    for i in range(10):
        decision = machine.handle(Measured(estimate=7_000))
        assert isinstance(decision, Compact)
        machine.handle(CompactionResult(messages=[SUMMARY], before=7_000, after=900))
        passes += 1
        assert isinstance(machine.handle(Measured(estimate=900)), CallLLM)
        ask = calling(f"c{i}", id=f"a{i}")
        machine.handle(ModelReplied(message=ask))
        machine.handle(ToolsFinished(results=results_for(ask)))

    assert (passes, machine.snapshot.compactions, machine.phase) == (10, 0, "start")


def test_passes_in_a_row_without_a_model_call_still_end_at_the_limit() -> None:
    budget = Budget(context_window=8_000, max_compactions=2, max_turns=100)
    machine = TurnMachine.start(MachineSpec.from_toml(STOCK), budget=budget)
    machine.handle(RunStarted(input=[user(id="u1")]))
    ask = calling("c0", id="a0")
    machine.handle(Measured(estimate=900))
    machine.handle(ModelReplied(message=ask))
    machine.handle(ToolsFinished(results=results_for(ask)))
    decisions = []
    for _ in range(4):
        decisions.append(machine.handle(Measured(estimate=7_600)))
        if machine.is_finished:
            break
        machine.handle(CompactionResult(messages=[SUMMARY], before=7_600, after=7_500))

    assert [type(d) for d in decisions] == [Compact, Compact, Fail]
    assert decisions[-1] == Fail(error=CompactionLimitExceeded(max_compactions=2))


THRESHOLD_PASS = (
    '[[transitions]]\ntrigger = "measured"\nsource = "start"\ndest = "compact"\n'
    'conditions = ["is_over_threshold_line"]\n'
    'unless = ["is_compaction_limit_reached", "is_threshold_line_spent"]\n'
    'reason = "threshold_exceeded"\nactions = ["record_estimate"]\n'
)


def test_a_reply_that_starts_the_count_again_on_a_cycle_needs_another_bound() -> None:
    """A pass taken before the turn-limit check, that goes straight to the model.

    The reply starts the count of passes again, so the compact phase's limit
    bounds nothing on this cycle, and no turn-limit check is on it.
    """
    text = edit(
        PASS_STRAIGHT_TO_THE_MODEL, TURN_LIMIT, THRESHOLD_PASS + "\n" + TURN_LIMIT
    )

    problems = problems_of(text)

    assert problems == (
        "cycle call_llm -[model_replied]-> run_tools -[tools_finished]-> start"
        f" -[measured]-> compact -[compaction_result]-> call_llm {UNBOUNDED}",
    )


def test_a_pass_straight_to_the_model_after_the_turn_limit_check_ends() -> None:
    """The pass is taken only under the turn limit: each round counts a turn.

    It was refused as an unbounded cycle, though every way into the pass
    passed the turn-limit check first.
    """
    budget = Budget(context_window=8_000, max_turns=3, max_compactions=1)
    spec = MachineSpec.from_toml(PASS_STRAIGHT_TO_THE_MODEL)
    machine = TurnMachine.start(spec, budget=budget)
    machine.handle(RunStarted(input=[user(id="u1")]))
    decisions: list[Decision] = []
    for i in range(10):
        decisions.append(machine.handle(Measured(estimate=7_000)))
        if machine.is_finished:
            break
        after = CompactionResult(messages=[user(id=f"s{i}")], before=7_000, after=900)
        assert isinstance(machine.handle(after), CallLLM)
        ask = calling(f"c{i}", id=f"a{i}")
        machine.handle(ModelReplied(message=ask))
        machine.handle(ToolsFinished(results=results_for(ask)))

    assert [type(d) for d in decisions] == [Compact, Compact, Compact, Fail]
    assert decisions[-1] == Fail(error=MaxTurnsExceeded(max_turns=3))


# -- overflow retries count in a row ---------------------------------------------

TOO_LONG = ErrorInfo(type=CONTEXT_OVERFLOW, message="too long", status=400)


def overflow_after_each_reply(machine: TurnMachine, replies: int) -> list[Decision]:
    """Overflow once before each of `replies` tool turns; each pass recovers."""
    machine.handle(RunStarted(input=[user(id="u1")]))
    decisions: list[Decision] = []
    for i in range(replies):
        assert isinstance(machine.handle(Measured(estimate=900 - i)), CallLLM)
        decisions.append(machine.handle(ContextOverflowed(error=TOO_LONG)))
        if machine.is_finished:
            break
        machine.handle(
            CompactionResult(messages=[SUMMARY], before=900 - i, after=800 - i)
        )
        ask = calling(f"c{i}", id=f"a{i}")
        machine.handle(ModelReplied(message=ask))
        machine.handle(ToolsFinished(results=results_for(ask)))
    return decisions


def test_a_reply_between_overflows_starts_their_count_again() -> None:
    """A long run recovers from as many overflows as it meets, one at a time."""
    budget = Budget(max_overflow_retries=2, max_turns=100)
    machine = TurnMachine.start(MachineSpec.from_toml(STOCK), budget=budget)

    decisions = overflow_after_each_reply(machine, 4)

    assert [type(d) for d in decisions] == [Compact] * 4
    assert (machine.phase, machine.snapshot.overflow_retries) == ("start", 0)


def test_a_run_logged_before_counts_its_overflows_over_the_whole_run() -> None:
    """As a run logged before the count in a row ran: it fails on its third."""
    snapshot = Snapshot(
        phase="start",
        budget=Budget(max_overflow_retries=2, max_turns=100),
        overflow_retries_in_a_row=False,
    )
    machine = TurnMachine.from_snapshot(MachineSpec.from_toml(STOCK), snapshot)

    decisions = overflow_after_each_reply(machine, 4)

    assert [type(d) for d in decisions] == [Compact, Compact, Fail]
    assert machine.snapshot.overflow_retries == 2


def test_overflows_in_a_row_still_end_at_the_limit() -> None:
    budget = Budget(max_overflow_retries=2, max_turns=100)
    machine = TurnMachine.start(MachineSpec.from_toml(STOCK), budget=budget)
    machine.handle(RunStarted(input=[user(id="u1")]))
    machine.handle(Measured(estimate=900))
    decisions = []
    for i in range(3):
        decisions.append(machine.handle(ContextOverflowed(error=TOO_LONG)))
        if machine.is_finished:
            break
        machine.handle(
            CompactionResult(messages=[SUMMARY], before=900 - i, after=800 - i)
        )

    assert [type(d) for d in decisions] == [Compact, Compact, Fail]
    assert isinstance(decisions[-1], Fail)
    assert type(decisions[-1].error) is ContextExceeded


def test_a_re_ask_starts_the_count_of_overflows_again_too() -> None:
    machine = TurnMachine.from_snapshot(
        MachineSpec.from_toml(STOCK),
        Snapshot(phase="call_llm", overflow_retries=2, is_started=True, estimate=9),
    )

    machine.handle(OutputRejected(message=reply("no"), errors=("not a number",)))

    assert (machine.phase, machine.snapshot.overflow_retries) == ("start", 0)


def test_how_overflows_count_survives_a_snapshot_round_trip() -> None:
    before = Snapshot(phase="start", overflow_retries_in_a_row=False)
    now = Snapshot(phase="start", overflow_retries=1)
    data = now.to_dict()

    assert "overflow_retries_in_a_row" not in data  # the form of before
    assert Snapshot.from_dict(data) == now
    assert Snapshot.from_dict(before.to_dict()) == before
    assert not Snapshot.from_dict(before.to_dict()).overflow_retries_in_a_row


OVERFLOW_RETRY = (
    '[[transitions]]\ntrigger = "compaction_result"\n'
    'source = ["compact", "compact_and_retry"]\ndest = "failed"\n'
    'conditions = ["is_no_progress"]\nerror = "compaction_stalled"\n'
)
"""The no-progress check of a pass, in both compact phases."""


def without_the_retry_pass_check() -> str:
    """The stock file whose retry pass goes to the model whatever it saved.

    The overflow retries are then the only bound of the way between the
    model call and the retry pass.
    """
    return edit(
        STOCK,
        OVERFLOW_RETRY,
        OVERFLOW_RETRY.replace('["compact", "compact_and_retry"]', '"compact"'),
    )


def test_overflow_retries_through_a_reply_are_bounded_by_the_turn_limit() -> None:
    """A reply after a retry comes back through the measured, turn-checked call."""
    spec = MachineSpec.from_toml(without_the_retry_pass_check())

    assert "compact_and_retry" in spec.phases


REPLY_AS_A_RETRY = edit(
    without_the_retry_pass_check(),
    '[[transitions]]\ntrigger = "model_replied"\nsource = "call_llm"\ndest = "done"\n',
    '[[transitions]]\ntrigger = "model_replied"\nsource = "call_llm"\n'
    'dest = "compact_and_retry"\nconditions = ["has_overflow_retries_left"]\n'
    'unless = ["has_tool_calls"]\nreason = "overflow"\n'
    'actions = ["record_reply", "count_overflow"]\n\n'
    '[[transitions]]\ntrigger = "model_replied"\nsource = "call_llm"\n'
    'dest = "done"\n',
)
"""A final reply counted as an overflow retry, and compacted before the next call."""


def test_overflow_retries_through_a_reply_that_skips_the_turn_limit_are_refused() -> (
    None
):
    """A reply counted as an overflow retry starts the count again at once.

    Each reply resets the count and spends one retry: the guard always holds,
    and the cycle through the retry pass never meets the turn-limit check.
    """
    problems = problems_of(REPLY_AS_A_RETRY)

    assert problems == (
        "cycle call_llm -[model_replied]-> compact_and_retry"
        f" -[compaction_result]-> call_llm {UNBOUNDED}",
    )


def test_a_recorded_machine_bounded_by_its_overflows_over_the_run_reads_back() -> None:
    """A log keeps the machine its runs began on, when overflows counted per run.

    Those runs are bounded by the overflow retries that nothing reset; they
    replay so. A new run on the machine is refused: it counts them in a row.
    """
    data = tomllib.loads(REPLY_AS_A_RETRY)
    with pytest.raises(DefinitionError):
        MachineSpec.from_dict(data)

    spec = MachineSpec.from_dict(data, recorded=True)

    with pytest.raises(DefinitionError):
        spec.validated()


NOOP_ON = (
    '[[transitions]]\ntrigger = "compaction_noop"\n'
    'source = ["compact", "compact_and_retry"]\ndest = "failed"\n'
    'conditions = ["is_no_progress"]\n'
)
NOOP_AGAIN = (
    '[[transitions]]\ntrigger = "compaction_noop"\n'
    'source = ["compact", "compact_and_retry"]\ndest = "start"\n'
    'actions = ["record_noop", "count_compaction"]\n'
)


RESULT_ON = (
    '[[transitions]]\ntrigger = "compaction_result"\n'
    'source = ["compact", "compact_and_retry"]\ndest = "failed"\n'
    'conditions = ["is_no_progress"]\n'
)
RETRY_CALLS = (
    '[[transitions]]\ntrigger = "compaction_result"\n'
    'source = "compact_and_retry"\ndest = "call_llm"\n'
)


@pytest.mark.parametrize(
    "narrowed",
    [
        'conditions = ["is_no_progress", "is_threshold_pass"]\n',
        'conditions = ["is_no_progress"]\nunless = ["is_over_emergency_line"]\n',
    ],
    ids=["with-another-condition", "with-an-unless"],
)
def test_a_no_progress_guard_taken_only_sometimes_bounds_nothing(
    narrowed: str,
) -> None:
    """A pass that saved nothing and misses the narrowed guard comes round again."""
    # Each result the guard lets through lowers the estimate: a pass again
    # on it is bounded, the guard taken every time.
    text = edit(
        STOCK,
        RETRY_CALLS,
        RETRY_CALLS.replace(
            'dest = "call_llm"', 'dest = "compact_and_retry"\nreason = "overflow"'
        ),
    )
    assert "compact_and_retry" in MachineSpec.from_toml(text).phases  # guarded: loads
    narrowed_text = edit(
        text,
        RESULT_ON + 'error = "compaction_stalled"\n',
        RESULT_ON.replace('conditions = ["is_no_progress"]\n', narrowed)
        + 'error = "compaction_stalled"\n',
    )

    assert problems_of(narrowed_text) == (
        f"cycle compact_and_retry -[compaction_result]-> compact_and_retry {UNBOUNDED}",
    )


def test_a_no_op_after_the_no_progress_guard_bounds_a_cycle() -> None:
    """A no-op changed nothing: it passes the guard only if it says it saved.

    The built-in pass never says so of a no-op (it reports `after` at least
    `before`), and the driver refuses one of the user's that does, so a
    cycle through a no-op past the guard ends there.
    """
    text = edit(
        STOCK,
        NOOP_AGAIN,
        NOOP_AGAIN.replace(
            'source = ["compact", "compact_and_retry"]\ndest = "start"\n',
            'source = "compact"\ndest = "start"\n',
        )
        + (
            '\n[[transitions]]\ntrigger = "compaction_noop"\n'
            'source = "compact_and_retry"\ndest = "compact_and_retry"\n'
            'reason = "overflow"\nactions = ["record_noop", "count_compaction"]\n'
        ),
    )
    assert "compact_and_retry" in MachineSpec.from_toml(text).phases


def test_noop_passes_count_too() -> None:
    machine = TurnMachine.start(
        MachineSpec.from_toml(STOCK),
        budget=Budget(context_window=8_000, max_compactions=1),
    )
    machine.handle(RunStarted(input=[user(id="u1")]))
    machine.handle(Measured(estimate=7_900))

    machine.handle(CompactionNoop(before=7_900, after=7_700))
    decision = machine.handle(Measured(estimate=7_700))

    assert decision == Fail(error=CompactionLimitExceeded(max_compactions=1))


@SHIPPED
def test_with_the_passes_spent_the_threshold_line_alone_calls_the_model(
    spec: MachineSpec,
) -> None:
    """Over the soft line (6_400) but under the emergency line (7_600)."""
    machine = TurnMachine.start(
        spec,
        budget=Budget(context_window=8_000, threshold=80, max_compactions=1),
    )
    machine.handle(RunStarted(input=[user(id="u1")]))
    first = machine.handle(Measured(estimate=7_000))
    machine.handle(CompactionResult(messages=[SUMMARY], before=7_000, after=6_900))

    decision = machine.handle(Measured(estimate=6_900))

    assert isinstance(first, Compact)
    assert first.reason is CompactReason.THRESHOLD_EXCEEDED
    assert machine.snapshot.compactions == 1
    assert decision == CallLLM(
        history=MessageLog([SUMMARY]), pending=MessageLog(), turn=1
    )
    assert (machine.phase, machine.snapshot.failure) == ("call_llm", None)


def test_with_passes_left_the_threshold_line_still_compacts() -> None:
    machine = TurnMachine.start(
        MachineSpec.from_toml(STOCK),
        budget=Budget(context_window=8_000, threshold=80, max_compactions=2),
    )
    machine.handle(RunStarted(input=[user(id="u1")]))
    machine.handle(Measured(estimate=7_000))
    machine.handle(CompactionResult(messages=[SUMMARY], before=7_000, after=6_900))

    decision = machine.handle(Measured(estimate=6_900))

    assert isinstance(decision, Compact)
    assert decision.reason is CompactReason.THRESHOLD_EXCEEDED


def test_the_limit_is_checked_after_the_turn_limit() -> None:
    machine = TurnMachine.from_snapshot(
        MachineSpec.from_toml(STOCK),
        Snapshot(
            phase="start",
            budget=Budget(max_turns=1, max_compactions=1),
            turns=1,
            compactions=1,
            is_started=True,
        ),
    )

    machine.handle(Measured(estimate=10))

    assert machine.snapshot.failure is not None
    assert machine.snapshot.failure.kind == "max_turns_exceeded"


def test_the_compaction_limit_failure_and_error() -> None:
    failure = Failure(kind="compaction_limit_exceeded", used=20, limit=20)

    error = failure.to_error()

    assert isinstance(error, CompactionLimitExceeded)
    assert isinstance(error, TurnFSMError)
    assert error.max_compactions == 20
    assert str(error) == (
        "the run made max_compactions=20 compaction passes in a row, with no"
        " model call between them, and still has no request that fits; raise"
        " max_compactions, or check for a hook that adds a message after every"
        " pass"
    )


def test_budget_needs_at_least_one_compaction() -> None:
    with pytest.raises(ConfigError) as error:
        Budget(max_compactions=0)

    assert (error.value.field, Budget().max_compactions) == ("max_compactions", 20)


def test_the_compaction_count_survives_a_snapshot_round_trip() -> None:
    snapshot = Snapshot(phase="start", compactions=4)
    data = snapshot.to_dict()
    older = {k: v for k, v in data.items() if k != "compactions"}

    assert Snapshot.from_dict(data).compactions == 4
    assert Snapshot.from_dict(older).compactions == 0


# -- injections reach the request wherever the file says -----------------------

NOTE = user("also check the calendar", id="n1")


def renamed_start() -> MachineSpec:
    """The stock machine with `start` renamed `begin`."""
    text = STOCK.replace('"start"', '"begin"')
    text = edit(text, "start             = {", "begin             = {")
    return MachineSpec.from_toml(text)


@pytest.mark.parametrize(
    "spec",
    [MachineSpec.from_toml(STOCK), renamed_start()],
    ids=["stock", "renamed"],
)
def test_an_injection_in_the_measuring_phase_joins_pending(spec: MachineSpec) -> None:
    machine = TurnMachine.start(spec)
    u = user(id="u1")
    machine.handle(RunStarted(input=[u]))

    decision = machine.handle(MessageInjected(message=NOTE))

    assert (machine.phase, decision) == (
        spec.initial,
        Measure(history=MessageLog(), pending=MessageLog([u, NOTE])),
    )
    assert machine.snapshot.inbox == ()


def test_an_injection_elsewhere_waits_in_the_inbox() -> None:
    machine = TurnMachine.start(renamed_start(), budget=Budget(context_window=8_000))
    u = user(id="u1")
    machine.handle(RunStarted(input=[u]))
    machine.handle(Measured(estimate=7_600))

    queued = machine.handle(MessageInjected(message=NOTE))
    after = machine.handle(
        CompactionResult(messages=[SUMMARY], before=7_600, after=900)
    )

    assert queued == Compact(
        reason=CompactReason.EMERGENCY,
        history=MessageLog(),
        pending=MessageLog([u]),
    )
    assert (machine.phase, after) == (
        "begin",
        Measure(history=MessageLog([SUMMARY]), pending=MessageLog([NOTE])),
    )


BOUND_IT = (
    "bound it another way, such as 'is_compaction_limit_reached' checked on the "
    "way into its compact phase)"
)
"""How a cycle a step that adds undoes is told to be bounded."""

RESULT_TO_START = (
    '[[transitions]]\ntrigger = "compaction_result"\nsource = "compact"\n'
    'dest = "start"\nactions = ["record_compaction", "count_compaction"]\n'
)


def with_a_note(more: str = 'message = "text"\n') -> str:
    """The stock machine whose passes go to a phase `note`, which may pass again.

    `note`'s ``more`` signal goes back to `compact` (its transition ends
    with `more`); ``ok`` goes on to `start`.
    """
    text = edit(STOCK, 'name = "turn"\n', 'name = "turn"\nsignals = ["more", "ok"]\n')
    text = edit(
        text,
        "[states]\n",
        '[states]\nnote              = { effect = "note" }\n',
    )
    text = edit(text, RESULT_TO_START, RESULT_TO_START.replace('"start"', '"note"'))
    text += (
        '\n[[transitions]]\ntrigger = "more"\nsource = "note"\ndest = "compact"\n'
        f'reason = "manual"\n{more}'
    )
    if "unless" in more:  # the group's end, once the limit is reached
        text += (
            '\n[[transitions]]\ntrigger = "more"\nsource = "note"\n'
            'dest = "failed"\nerror = "compaction_limit_exceeded"\n'
        )
    return text + '\n[[transitions]]\ntrigger = "ok"\nsource = "note"\ndest = "start"\n'


def test_a_message_on_a_cycle_of_passes_undoes_the_no_progress_bound() -> None:
    """Each pass saves what the signal's message added, then it is added again.

    It loaded, bounded by the no-progress guard, and a run made thousands of
    passes a second until it was stopped from outside.
    """
    assert problems_of(with_a_note()) == (
        f"cycle note -[more]-> compact -[compaction_result]-> note {UNBOUNDED} "
        "(its 'more' adds the signal's 'text' to the conversation, undoing what a "
        "pass saved: " + BOUND_IT,
    )
    # Without the message, each pass lowers the estimate for good: bounded.
    assert "note" in MachineSpec.from_toml(with_a_note(more="")).phases
    # Entered only under the compaction limit, the passes in a row end it.
    limited = with_a_note(
        more='message = "text"\nunless = ["is_compaction_limit_reached"]\n'
    )
    assert "note" in MachineSpec.from_toml(limited).phases


def test_tool_results_on_a_cycle_of_passes_undo_the_no_progress_bound() -> None:
    finished = (
        '[[transitions]]\ntrigger = "tools_finished"\nsource = "run_tools"\n'
        'dest = "start"\n'
    )
    text = edit(
        with_a_note(more=""),
        finished,
        finished.replace('"start"', '"compact"\nreason = "manual"'),
    )
    text = edit(
        text,
        '\n[[transitions]]\ntrigger = "ok"\nsource = "note"\ndest = "start"\n',
        '\n[[transitions]]\ntrigger = "ok"\nsource = "note"\ndest = "run_tools"\n',
    )
    assert problems_of(text) == (
        "cycle run_tools -[tools_finished]-> compact -[compaction_result]-> note "
        f"-[ok]-> run_tools {UNBOUNDED} (its 'tools_finished' adds tool results to "
        "the conversation, undoing what a pass saved: " + BOUND_IT,
    )


NOOP_STAYS = (
    '[[transitions]]\ntrigger = "compaction_noop"\nsource = "compact"\n'
    'unless = ["is_compaction_limit_reached"]\nactions = ["record_noop"]\n\n'
)


def test_staying_in_a_compact_phase_counts_the_pass() -> None:
    """A no-op that stays for another pass, uncounted: the limit never came."""
    text = edit(STOCK, NOOP_ON, NOOP_STAYS + NOOP_ON)
    assert problems_of(text) == (
        "phase 'compact' on 'compaction_noop' stays in it for another pass without "
        "counting the pass: add 'count_compaction' to its actions",
    )
    counted = text.replace(
        'actions = ["record_noop"]\n', 'actions = ["record_noop", "count_compaction"]\n'
    )
    assert "compact" in MachineSpec.from_toml(counted).phases
    # A log that holds such a machine is read as its runs ran.
    assert MachineSpec.from_dict(tomllib.loads(text), recorded=True).phases


def test_a_guarded_twin_before_the_step_that_adds_hides_nothing() -> None:
    """The step is the same (phase, trigger, phase): either transition takes it.

    The second, which adds its message, was left out of the proof once the
    first (guarded, adding nothing) had put the step in.
    """
    text = with_a_note(more='conditions = ["has_injected_messages"]\n') + (
        '\n[[transitions]]\ntrigger = "more"\nsource = "note"\ndest = "compact"\n'
        'reason = "manual"\nmessage = "text"\n'
    )
    assert problems_of(text) == (
        f"cycle note -[more]-> compact -[compaction_result]-> note {UNBOUNDED} "
        "(its 'more' adds the signal's 'text' to the conversation, undoing what a "
        "pass saved: " + BOUND_IT,
    )


OVERFLOW = (
    '[[transitions]]\ntrigger = "context_overflowed"\nsource = "call_llm"\n'
    'dest = "compact_and_retry"\nconditions = ["has_overflow_retries_left"]\n'
    'reason = "overflow"\nactions = ["count_overflow"]\n\n'
    '[[transitions]]\ntrigger = "context_overflowed"\nsource = "call_llm"\n'
    'dest = "failed"\nerror = "context_exceeded"\n'
)


def every_overflow_passes() -> str:
    """The stock machine whose overflows go to a pass with no retry counter.

    A no-op of that pass ends the run (the stock one goes back to `start`).
    """
    text = edit(
        STOCK,
        OVERFLOW,
        '[[transitions]]\ntrigger = "context_overflowed"\nsource = "call_llm"\n'
        'dest = "compact_and_retry"\nreason = "overflow"\n',
    )
    return edit(
        text,
        NOOP_AGAIN,
        NOOP_AGAIN.replace('["compact", "compact_and_retry"]', '"compact"')
        + '\n[[transitions]]\ntrigger = "compaction_noop"\n'
        'source = "compact_and_retry"\ndest = "failed"\n'
        'error = "compaction_stalled"\n',
    )


def test_messages_injected_on_a_cycle_of_passes_undo_the_no_progress_bound() -> None:
    """A hook that injects a message at every step: each pass saves it, for ever.

    Every overflow goes to a pass, whose result is measured again: bounded by
    the no-progress guard alone, and `start` takes in what was injected.
    """
    text = every_overflow_passes()
    text = edit(text, RETRY_CALLS, RETRY_CALLS.replace('"call_llm"', '"start"'))
    assert problems_of(text) == (
        "cycle compact_and_retry -[compaction_result]-> start -[measured]-> call_llm "
        f"-[context_overflowed]-> compact_and_retry {UNBOUNDED} (its "
        "'compaction_result' enters 'start', which takes in injected messages, "
        "undoing what a pass saved: " + BOUND_IT,
    )


def test_a_cycle_that_adds_and_counts_a_turn_under_the_limit_loads() -> None:
    """A reply that counts a turn, and a call made only under the turn limit.

    Each round adds injected messages, but it also counts a turn that the
    limit bounds: the proof of the passes need not bound it. It was refused.
    """
    assert "compact_and_retry" in MachineSpec.from_toml(every_overflow_passes()).phases
