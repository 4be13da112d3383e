"""The machine-file loader: every problem in one DefinitionError, or a valid spec."""

from __future__ import annotations

import datetime
import json
import tomllib
from typing import Any

import pytest

from tests.hand_written_machines import HAND_WRITTEN
from tests.helpers import (
    REPO_ROOT,
    approval_toml,
    calling,
    load_turn_spec,
    machine_at,
    reply,
    results_for,
    start_machine,
    turn_toml_text,
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
    Decision,
    ErrorInfo,
    Event,
    Fail,
    MachineSpec,
    Measure,
    Measured,
    MessageInjected,
    ModelReplied,
    Perform,
    RunStarted,
    RunTools,
    Signal,
    Snapshot,
    ToolsFinished,
    TransitionSpec,
    TurnMachine,
    _spec,
)
from turnfsm.errors import Cancelled, CompactionStalled, DefinitionError, IllegalEvent
from turnfsm.messages import Message, MessageLog

STOCK = turn_toml_text()


def problems_of(text: str) -> tuple[str, ...]:
    with pytest.raises(DefinitionError) as error:
        MachineSpec.from_toml(text)
    return tuple(p.message for p in error.value.problems)


def never_fires(phase: str, trigger: str, into: str) -> str:
    """The problem of a transition after one without conditions into `into`."""
    return (
        f"phase {phase!r} on {trigger!r}: this transition never fires, as the one"
        f" without conditions before it (into {into!r}) takes every {trigger!r}"
        " there: move it before that one, or remove it"
    )


def edit(text: str, old: str, new: str) -> str:
    """Replace the one occurrence of `old` in `text`."""
    assert text.count(old) == 1, old
    return text.replace(old, new)


def test_stock_machine_loads() -> None:
    spec = load_turn_spec()

    assert (spec.name, spec.initial, spec.terminal, spec.signals) == (
        "turn",
        "start",
        ("done", "failed"),
        (),
    )
    assert spec.phases == (
        "start",
        "call_llm",
        "run_tools",
        "compact",
        "compact_and_retry",
        "done",
        "failed",
    )
    assert len(spec.transitions) == 33
    assert spec.triggers == {
        "run_started",
        "measured",
        "model_replied",
        "output_rejected",
        "model_failed",
        "context_overflowed",
        "tools_finished",
        "compaction_result",
        "compaction_noop",
        "compaction_overflowed",
        "compactor_failed",
        "compaction_circuit_opened",
        "message_injected",
        "run_cancelled",
    }
    assert spec.source.endswith("turn.toml")


def test_what_each_phase_accepts_is_worked_out_once_with_the_spec() -> None:
    # A run asks on every step: each answer was a fresh scan of the transitions.
    spec = load_turn_spec()

    assert spec.accepts("run_tools") == (
        "message_injected",
        "run_cancelled",
        "tools_finished",
    )
    assert spec.accepts("run_tools") is spec.accepts("run_tools")
    assert spec.accepts("done") == spec.accepts("no such phase") == ()
    assert spec.triggers is spec.triggers


@pytest.mark.parametrize(
    ("file", "digest"),
    [
        ("turn.toml", "ea5d7d9530f11623"),
        ("approval.toml", "8993484444e12963"),
        ("review.toml", "b88cfb87d8486d07"),
        ("compaction.toml", "e6a279b04807f09c"),
    ],
)
def test_the_shipped_machines_keep_the_digests_their_stored_runs_recorded(
    file: str, digest: str
) -> None:
    # What a spec works out for itself (the triggers each phase accepts) is
    # no part of what it decides by: a run stored earlier still resumes.
    from turnfsm import load_machine
    from turnfsm.persistence import machine_digest

    assert machine_digest(load_machine(REPO_ROOT / "machines" / file)) == digest


def test_stock_machine_reads_its_reasons_and_wildcards() -> None:
    spec = load_turn_spec()
    into_compact = [t for t in spec.transitions if t.reason is not None]
    cancel = next(t for t in spec.transitions if t.trigger == "run_cancelled")

    assert [(t.dest, t.reason) for t in into_compact] == [
        ("compact", CompactReason.EMERGENCY),
        ("compact", CompactReason.THRESHOLD_EXCEEDED),
        ("compact", CompactReason.MESSAGE_COUNT),
        ("compact_and_retry", CompactReason.OVERFLOW),
    ]
    assert (cancel.is_wildcard, cancel.sources, cancel.is_guarded) == (
        True,
        ("call_llm", "compact", "compact_and_retry", "run_tools", "start"),
        False,
    )


def test_invalid_toml_is_a_definition_error() -> None:
    with pytest.raises(DefinitionError) as error:
        MachineSpec.from_toml('name = "turn"\ninitial = ', source="broken.toml")

    assert error.value.source == "broken.toml"
    assert len(error.value.problems) == 1
    assert error.value.problems[0].message.startswith("not valid TOML: ")
    assert error.value.problems[0].line == 2


@pytest.mark.parametrize(
    ("written", "quoted"),
    [
        ('revue_人間 = { decision = "pause" }', '"revue_人間" = ...'),
        ('hu man = { decision = "pause" }', '"hu man" = ...'),
    ],
    ids=["not-ascii", "a-space"],
)
def test_a_name_toml_reads_only_quoted_is_shown_quoted(
    written: str, quoted: str
) -> None:
    # TOML said only "Expected '=' after a key" (or "Invalid statement").
    text = turn_toml_text().replace("[states]\n", f"[states]\n{written}\n")

    with pytest.raises(DefinitionError) as error:
        MachineSpec.from_toml(text)

    (problem,) = error.value.problems
    assert problem.line == text.splitlines().index(written) + 1
    assert problem.message.startswith("not valid TOML: ")
    assert problem.message.endswith(
        "; a name with characters other than A-Z, a-z, 0-9, _ and - must be"
        f" quoted: {quoted}"
    )


@pytest.mark.parametrize("line", [0, 3])
def test_a_line_outside_the_text_gets_no_quoting_hint(line: int) -> None:
    # TOML's own line count and Python's can differ (form feeds, line
    # separators): a line that is not the text's is no key to quote.
    assert _spec._line_of("hu man = 1\nb = 2", line) == ""
    assert _spec._bare_key_hint(_spec._line_of("hu man = 1\nb = 2", 1)) != ""


def test_a_value_toml_cannot_read_gets_no_quoting_hint() -> None:
    with pytest.raises(DefinitionError) as error:
        MachineSpec.from_toml('name = "turn"\ninitial = yes\n')

    assert "quoted" not in error.value.problems[0].message


@pytest.mark.parametrize(
    ("old", "new", "word"),
    [
        ('dest = "done"', "dest = done", "done"),
        (
            'conditions = ["has_tool_calls"]',
            "conditions = [has_tool_calls]",
            "has_tool_calls",
        ),
        ('{ decision = "run_tools" }', "{ decision = run_tools }", "run_tools"),
        ('source = "*"', "source = *", "*"),
    ],
    ids=["dest", "in-a-list", "in-an-inline-table", "wildcard"],
)
def test_a_name_written_without_quotes_is_shown_quoted(
    old: str, new: str, word: str
) -> None:
    # TOML said only "Invalid value (at line 96, column 8)".
    text = turn_toml_text()
    at = text.index(old)
    text = text[:at] + new + text[at + len(old) :]  # the first one written

    with pytest.raises(DefinitionError) as error:
        MachineSpec.from_toml(text)

    (problem,) = error.value.problems
    assert problem.line == text[:at].count("\n") + 1
    assert problem.message.startswith("not valid TOML: Invalid value")
    assert problem.message.endswith(f'; a name is written in quotes: "{word}"')


@pytest.mark.parametrize("value", ["@done", "+done", "1done"])
def test_a_value_that_is_no_bare_name_gets_no_quoting_hint(value: str) -> None:
    text = turn_toml_text().replace('name = "turn"', f"name = {value}", 1)

    with pytest.raises(DefinitionError) as error:
        MachineSpec.from_toml(text)

    (problem,) = error.value.problems
    assert problem.message.startswith("not valid TOML: ")
    assert "written in quotes" not in problem.message


def test_a_string_not_closed_on_its_line_says_how_to_close_it() -> None:
    # TOML said only "Illegal character '\\n' (at line 9, column 13)".
    text = turn_toml_text().replace('name = "turn"', 'name = "turn', 1)

    with pytest.raises(DefinitionError) as error:
        MachineSpec.from_toml(text)

    (problem,) = error.value.problems
    assert problem.message.endswith(
        "; a string ends on its line, with its closing quote (text over several"
        ' lines goes between """ and """)'
    )


ENTRY_PROBLEMS = """
terminal = ["done", "failed", "limbo", "nowhere"]
signals = ["approved", "measured"]
colour = "blue"

[states]
start = { decision = "measure", on_enter = ["flush_inbox", "tidy_up"] }
call_llm = { decision = "call_llm", timeout = 30 }
run_tools = { decision = "run_tools" }
compact = { decision = "compact" }
ponder = { decision = "ponder" }
both = { decision = "call_llm", effect = "ask" }
neither = {}
done = { decision = "finish" }
failed = { decision = "fail" }
limbo = { decision = "call_llm" }
finale = { decision = "finish" }

[[transitions]]
trigger = "measured"
source = "start"
dest = "call_llm"
conditions = ["is_over_budget"]
unless = ["is_tired"]
actions = ["record_estimate", "record_everything"]
priority = 1

[[transitions]]
trigger = "measured"
source = "strat"
dest = "cal_llm"

[[transitions]]
trigger = "model_answered"
source = "call_llm"
dest = "done"

[[transitions]]
trigger = "measured"
source = "start"
dest = "compact"

[[transitions]]
trigger = "measured"
source = "start"
dest = "compact"
reason = "tidy"

[[transitions]]
trigger = "model_replied"
source = "call_llm"
dest = "run_tools"
reason = "emergency"

[[transitions]]
trigger = "model_failed"
source = "call_llm"
dest = "failed"

[[transitions]]
trigger = "model_failed"
source = "call_llm"
dest = "failed"
error = "oops"

[[transitions]]
trigger = "tools_finished"
source = "run_tools"
dest = "start"
error = "provider_error"

[[transitions]]
trigger = "run_cancelled"
source = "done"
dest = "failed"
error = "cancelled"

[[transitions]]
trigger = "approved"
source = []
"""
"""One file with every problem an entry can have (graph checks come later)."""


def test_entry_problems_are_all_reported_at_once_and_first() -> None:
    reasons = "threshold_exceeded, emergency, overflow, manual, message_count"
    errors = (
        "cancelled, compaction_circuit_open, compaction_failed,"
        " compaction_limit_exceeded, compaction_stalled, context_exceeded,"
        " max_turns_exceeded, output_invalid, provider_error"
    )
    decisions = "call_llm, compact, fail, finish, measure, pause, run_tools"

    problems = problems_of(ENTRY_PROBLEMS)

    entries, graph = problems[:27], problems[27:]
    assert sorted(entries) == sorted(
        [
            "unknown key 'colour'",
            "'name' must be a non-empty string, got None",
            "'initial' must be a non-empty string, got None",
            "unknown phase 'nowhere' named by initial/terminal",
            "signal 'measured' shadows the built-in trigger",
            "state 'start': unknown reducer 'tidy_up'",
            "state 'call_llm': unknown key 'timeout'",
            f"state 'ponder': unknown decision 'ponder' (known: {decisions};"
            " use effect = NAME for a custom one)",
            "state 'both': give exactly one of decision / effect / subagent",
            "state 'neither': give exactly one of decision / effect / subagent",
            "terminal phase 'limbo' must emit finish or fail: give it"
            ' decision = "finish" or "fail", or take it out of terminal',
            "phase 'finale' emits finish but is not terminal: add it to terminal"
            ' (terminal = ["done", "failed", "finale"])',
            "transition #1: unknown key 'priority'",
            "transition #1 (measured): unknown guard 'is_over_budget'",
            "transition #1 (measured): unknown guard 'is_tired'",
            "transition #1 (measured): unknown reducer 'record_everything'",
            "transition #2 (measured): unknown source phase 'strat'",
            "transition #2 (measured): unknown dest phase 'cal_llm'",
            "transition #3: unknown trigger 'model_answered' (declare it in signals)",
            f"transition #4 (measured): into 'compact' needs a reason ({reasons}),"
            " got None",
            f"transition #5 (measured): into 'compact' needs a reason ({reasons}),"
            " got 'tidy'",
            "transition #6 (model_replied): reason is only for transitions into a"
            " compact phase",
            f"transition #7 (model_failed): into 'failed' needs an error ({errors}),"
            " got None",
            f"transition #8 (model_failed): into 'failed' needs an error ({errors}),"
            " got 'oops'",
            "transition #9 (tools_finished): error is only for transitions into a"
            " fail phase",
            "transition #10 (run_cancelled): terminal phase 'done' cannot have exits",
            "transition #11 (approved): no source phase",
        ]
    )
    assert "phase 'compact' is a dead end: no transition leaves it" in graph


BAD_GRAPH = """\
name = "bad"
initial = "start"
terminal = ["done", "failed"]

[states]
start    = { decision = "measure" }
call_llm = { decision = "call_llm" }
compact  = { decision = "compact" }
done     = { decision = "finish" }
failed   = { decision = "fail" }

[[transitions]]
trigger = "measured"
source = "start"
dest = "compact"
conditions = ["is_over_threshold_line"]
reason = "threshold_exceeded"

[[transitions]]
trigger = "compaction_result"
source = "compact"
dest = "start"
actions = ["record_compaction"]
"""
"""The example of docs/concepts/machine.md: sound entries, a broken graph."""


BAD_GRAPH_OUTPUT = (
    "bad.toml:6: cycle start -[measured]-> compact -[compaction_result]-> start"
    " is not bounded by a model call, a retry counter or the no-progress guard\n"
    "bad.toml:6: 'run_cancelled' cannot stop the run in 'start', 'call_llm',"
    " 'compact': give every non-terminal phase a 'run_cancelled' transition"
    ' without conditions into a fail phase (source = "*")\n'
    "bad.toml:6: the initial phase 'start' has no 'run_started' transition:"
    " no run could start\n"
    "bad.toml:7: phase 'call_llm' is unreachable from 'start'\n"
    "bad.toml:7: phase 'call_llm' is a dead end: no transition leaves it\n"
    "bad.toml:8: phase 'compact' emits compact but has no transition on"
    " 'compaction_noop', 'compaction_overflowed', 'compactor_failed',"
    " 'compaction_circuit_opened': each outcome of its step needs one, or a run"
    " stops on it\n"
    "bad.toml:9: phase 'done' is unreachable from 'start'\n"
    "bad.toml:9: finish phase 'done' does not commit the run's messages: add"
    " 'commit_pending' to its on_enter (a run that ends done keeps what was"
    " said)\n"
    "bad.toml:10: phase 'failed' is unreachable from 'start'\n"
    "bad.toml:12: phase 'start' on 'measured' can fall through: end the group"
    " with a transition without conditions\n"
    "bad.toml:12: phase 'start' on 'measured' enters 'compact' without first"
    " checking 'is_compaction_limit_reached' (into a terminal phase)\n"
    "bad.toml:19: phase 'compact' on 'compaction_result' leaves for 'start'"
    " without counting the pass: add 'count_compaction' to its actions"
)
"""What `turnfsm check` says of BAD_GRAPH (docs/concepts/machine.md shows it)."""


def test_graph_problems_are_all_reported_at_once() -> None:
    with pytest.raises(DefinitionError) as error:
        MachineSpec.from_toml(BAD_GRAPH, source="bad.toml")

    assert str(error.value) == BAD_GRAPH_OUTPUT


def test_graph_checks_run_on_what_resolved() -> None:
    text = edit(BAD_GRAPH, '"is_over_threshold_line"', '"is_over_treshold_line"')

    with pytest.raises(DefinitionError) as error:
        MachineSpec.from_toml(text, source="bad.toml")

    assert str(error.value) == (
        "bad.toml:16: transition #1 (measured): unknown guard"
        " 'is_over_treshold_line' (did you mean 'is_over_threshold_line'?)\n"
        + BAD_GRAPH_OUTPUT
    )


def test_a_problem_without_a_line_names_only_the_file() -> None:
    with pytest.raises(DefinitionError) as error:
        MachineSpec.from_toml(edit(STOCK, 'name = "turn"\n', ""), source="t.toml")

    assert str(error.value) == "t.toml: 'name' must be a non-empty string, got None"


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (
            {"states": "start", "transitions": "none"},
            [
                "'states' must be a non-empty table",
                "'transitions' must be a non-empty array of tables",
            ],
        ),
        (
            {"states": ["start", "done"]},
            [
                "'states' must be a non-empty table",
                "unknown phase 'start' named by initial/terminal",
                "unknown phase 'done' named by initial/terminal",
                "transition #1 (measured): unknown source phase 'start'",
                "transition #1 (measured): unknown dest phase 'done'",
            ],
        ),
        (
            {"states": {}, "transitions": []},
            [
                "'states' must be a non-empty table",
                "'transitions' must be a non-empty array of tables",
            ],
        ),
        (
            {"states": {"start": "measure"}, "transitions": ["measured"]},
            ["state 'start' must be a table", "transition #1 must be a table"],
        ),
        (
            {"terminal": 7, "signals": [1]},
            [
                "terminal must be a string or a list of strings, got 7",
                "signals must be a string or a list of strings, got [1]",
            ],
        ),
        (
            {"name": "", "initial": 3},
            [
                "'name' must be a non-empty string, got ''",
                "'initial' must be a non-empty string, got 3",
            ],
        ),
    ],
    ids=[
        "not-tables",
        "states-not-a-table",
        "empty",
        "not-tables-inside",
        "not-string-lists",
        "bad-names",
    ],
)
def test_malformed_sections(data: dict[str, Any], expected: list[str]) -> None:
    base: dict[str, Any] = {
        "name": "m",
        "initial": "start",
        "terminal": ["done"],
        "states": {
            "start": {"decision": "measure"},
            "done": {"decision": "finish"},
        },
        "transitions": [{"trigger": "measured", "source": "start", "dest": "done"}],
    }

    with pytest.raises(DefinitionError) as error:
        MachineSpec.from_dict({**base, **data})

    assert error.value.source == "<dict>"
    messages = [p.message for p in error.value.problems]
    assert [m for m in messages if m in expected] == expected


@pytest.mark.parametrize(
    ("transition", "expected"),
    [
        # A list or a number was reported as an unknown name, as if it were
        # one: "unknown trigger ['measured'] (declare it in signals)".
        (
            {"trigger": ["measured"], "source": "start", "dest": "done"},
            "transition #1: trigger must be one trigger's name (a transition has"
            " one; write one transition for each), got ['measured']",
        ),
        (
            {"source": "start", "dest": "done"},
            "transition #1: trigger is missing",
        ),
        (
            {"trigger": "measured", "source": "start", "dest": ["done"]},
            "transition #1 (measured): dest must be one phase's name (a transition"
            " goes to one phase), got ['done']",
        ),
        (
            {"trigger": "measured", "source": "start", "dest": 3},
            "transition #1 (measured): dest must be one phase's name (a transition"
            " goes to one phase), got 3",
        ),
        (
            {"trigger": "measured", "source": "start", "dest": "done", "error": ["x"]},
            "transition #1 (measured): error is only for transitions into a fail phase",
        ),
        (
            {"trigger": "measured", "source": "start", "actions": 5},
            "transition #1 (measured) actions must be a string or a list of"
            " strings, got 5",
        ),
    ],
    ids=[
        "trigger-list",
        "trigger-missing",
        "dest-list",
        "dest-number",
        "error-list",
        "actions-not-a-list",
    ],
)
def test_ill_typed_transitions_are_problems_not_crashes(
    transition: dict[str, Any], expected: str
) -> None:
    data = {
        "name": "m",
        "initial": "start",
        "terminal": ["done"],
        "states": {
            "start": {"decision": "measure"},
            "done": {"decision": "finish"},
        },
        "transitions": [
            transition,
            {"trigger": "measured", "source": "start", "dest": "done"},
        ],
    }

    with pytest.raises(DefinitionError) as error:
        MachineSpec.from_dict(data)

    assert expected in [p.message for p in error.value.problems]


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        (
            {"decision": ["call_llm"]},
            "state 'extra': decision must be one name, a string"
            " (decision = \"call_llm\"), not a list: got ['call_llm']",
        ),
        (
            {"decision": {"name": "call_llm"}},
            "state 'extra': decision must be one name, a string"
            " (decision = \"NAME\"), not a table: got {'name': 'call_llm'}",
        ),
        (
            {"effect": 42},
            "state 'extra': effect must be one name, a string (effect = \"NAME\"),"
            " not a number: got 42",
        ),
        (
            {"decision": True},
            "state 'extra': decision must be one name, a string"
            ' (decision = "NAME"), not a boolean: got True',
        ),
        (
            {"effect": datetime.date(2026, 1, 2)},
            "state 'extra': effect must be one name, a string (effect = \"NAME\"),"
            " not a value of type date: got datetime.date(2026, 1, 2)",
        ),
        (
            {"subagent": ["reader", "writer"]},
            "state 'extra': subagent must be one name, a string"
            " (subagent = \"reader\"), not a list: got ['reader', 'writer']",
        ),
        ({"effect": ""}, "state 'extra': effect must be a non-empty name, got ''"),
        ({"effect": " "}, "state 'extra': effect must be a non-empty name, got ' '"),
    ],
    ids=[
        "decision-list",
        "decision-table",
        "effect-number",
        "decision-boolean",
        "effect-date",
        "subagent-list",
        "effect-empty",
        "effect-blank",
    ],
)
def test_ill_typed_states_are_problems_not_crashes(
    state: dict[str, Any], expected: str
) -> None:
    data = {
        "name": "m",
        "initial": "start",
        "terminal": ["done"],
        "states": {
            "start": {"decision": "measure"},
            "extra": state,
            "done": {"decision": "finish"},
        },
        "transitions": [{"trigger": "measured", "source": "start", "dest": "done"}],
    }

    with pytest.raises(DefinitionError) as error:
        MachineSpec.from_dict(data)

    messages = [p.message for p in error.value.problems]
    assert expected in messages
    # Said once: not also as an unknown name, nor as a phase with no kind.
    assert [m for m in messages if m.startswith("state 'extra'")] == [expected]


def test_a_blank_or_wildcard_phase_name_is_refused_where_a_run_would_stick() -> None:
    # A phase named "" loaded, and a run that entered it ended in IllegalEvent.
    for name in ("", " ", "*"):
        text = edit(STOCK, "call_llm          =", f'"{name}" =')
        for key in ("source", "dest"):
            text = text.replace(f'{key} = "call_llm"', f'{key} = "{name}"')
        with pytest.raises(DefinitionError) as error:
            MachineSpec.from_toml(text)
        assert (
            f"state {name!r}: a phase needs a name (not blank, not '*', which a"
            " source reads as every phase)"
        ) in [p.message for p in error.value.problems]


@pytest.mark.parametrize("name", ["", " "])
def test_a_blank_signal_is_refused_since_no_signal_can_carry_it(name: str) -> None:
    text = edit(
        STOCK,
        'terminal = ["done", "failed"]',
        f'terminal = ["done", "failed"]\nsignals = ["{name}"]',
    )

    with pytest.raises(DefinitionError) as error:
        MachineSpec.from_toml(text)

    assert f"signal {name!r}: a signal needs a non-empty name" in [
        p.message for p in error.value.problems
    ]


DUPLICATES = [
    (
        'terminal = ["done", "failed"]',
        'terminal = ["done", "failed", "done"]',
        ("terminal[2]", "terminal: 'done' is listed more than once"),
    ),
    (
        'terminal = ["done", "failed"]',
        'terminal = ["done", "failed"]\nsignals = ["x", "x"]',
        ("signals[1]", "signals: 'x' is listed more than once"),
    ),
    (
        'on_enter = ["commit_pending"]',
        'on_enter = ["commit_pending", "commit_pending"]',
        (
            "states.done.on_enter[1]",
            "done.on_enter: 'commit_pending' is listed more than once",
        ),
    ),
    (
        'conditions = ["is_turn_limit_reached"]',
        'conditions = ["is_turn_limit_reached", "is_turn_limit_reached"]',
        (
            "transitions[1].conditions[1]",
            "transition #2 (measured) conditions: 'is_turn_limit_reached' is"
            " listed more than once",
        ),
    ),
    (
        'unless = ["is_compaction_limit_reached", "is_threshold_line_spent"]',
        'unless = ["is_compaction_limit_reached", "is_threshold_line_spent",'
        ' "is_threshold_line_spent"]',
        (
            "transitions[4].unless[2]",
            "transition #5 (measured) unless: 'is_threshold_line_spent' is"
            " listed more than once",
        ),
    ),
    (
        'dest = "run_tools"\nconditions = ["has_tool_calls"]\n'
        'actions = ["record_reply"]',
        'dest = "run_tools"\nconditions = ["has_tool_calls"]\n'
        'actions = ["record_reply", "record_reply"]',
        (
            "transitions[7].actions[1]",
            "transition #8 (model_replied) actions: 'record_reply' is listed"
            " more than once",
        ),
    ),
    (
        'trigger = "tools_finished"\nsource = "run_tools"',
        'trigger = "tools_finished"\nsource = ["run_tools", "run_tools"]',
        (
            "transitions[13].source[1]",
            "transition #14 (tools_finished) source: 'run_tools' is listed"
            " more than once",
        ),
    ),
]


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    DUPLICATES,
    ids=[
        "terminal",
        "signals",
        "on_enter",
        "conditions",
        "unless",
        "actions",
        "source",
    ],
)
def test_a_name_listed_twice_is_refused_on_its_line(
    old: str, new: str, expected: tuple[str, str]
) -> None:
    # These loaded: a terminal phase or a signal twice, a reducer run twice.
    text = edit(STOCK, old, new)
    written = new.splitlines()[-1]
    line = next(n for n, at in enumerate(text.splitlines(), 1) if written in at)

    with pytest.raises(DefinitionError) as error:
        MachineSpec.from_toml(text)

    found = [(p.field, p.message, p.line) for p in error.value.problems]
    assert found == [(*expected, line)]


def test_a_phase_written_twice_is_refused_on_its_line() -> None:
    # TOML itself refuses a key written twice: `[states]` and `[subagents]`.
    text = edit(STOCK, "run_tools         =", "call_llm = {}\nrun_tools         =")

    with pytest.raises(DefinitionError) as error:
        MachineSpec.from_toml(text)

    (problem,) = error.value.problems
    assert problem.message.startswith("not valid TOML: Cannot overwrite a value")
    assert problem.line == text.splitlines().index("call_llm = {}") + 1


@pytest.mark.parametrize(
    ("old", "new", "message", "field", "value"),
    [
        (
            "run_tools         =",
            "call_llm = {}\nrun_tools         =",
            "'call_llm' is written twice in states: write each key once",
            "states.call_llm",
            "call_llm",
        ),
        (
            'dest = "run_tools"',
            'dest = "run_tools"\ndest = "start"',
            "'dest' is written twice in transitions[7]: write each key once",
            "transitions[7].dest",
            "dest",
        ),
        (
            'initial = "start"',
            'initial = "start"\ninitial = "call_llm"',
            "'initial' is written twice in the file: write each key once",
            "initial",
            "initial",
        ),
    ],
    ids=["phase", "transition-key", "top-key"],
)
def test_a_key_written_twice_is_named_with_its_field(
    old: str, new: str, message: str, field: str, value: str
) -> None:
    # TOML's own message said only "Cannot overwrite a value (at line N,
    # column M)", with no field and no value.
    with pytest.raises(DefinitionError) as error:
        MachineSpec.from_toml(edit(STOCK, old, new))

    (problem,) = error.value.problems
    assert problem.message.endswith(message)
    assert (problem.field, problem.value) == (field, value)


def test_a_dotted_key_written_twice_on_one_line_keeps_tomls_own_words() -> None:
    # Only keys written as `key =` are named; TOML's message still says where.
    text = edit(STOCK, 'initial = "start"', 'initial = "start"\nx.a = 1\nx.a = 2')

    with pytest.raises(DefinitionError) as error:
        MachineSpec.from_toml(text)

    (problem,) = error.value.problems
    assert problem.message.startswith("not valid TOML: Cannot overwrite a value")
    assert "written twice" not in problem.message
    assert problem.line == text.splitlines().index("x.a = 2") + 1


def test_group_ending_in_an_unless_guard_can_fall_through() -> None:
    text = edit(
        STOCK,
        'dest = "call_llm"\nactions = ["record_estimate"]',
        'dest = "call_llm"\nunless = ["is_turn_limit_reached"]\n'
        'actions = ["record_estimate"]',
    )

    problems = problems_of(text)

    assert problems == (
        "phase 'start' on 'measured' can fall through: end the group with a"
        " transition without conditions",
    )


def test_custom_effect_phase_driven_by_signals() -> None:
    spec = MachineSpec.from_toml(approval_toml())
    machine = TurnMachine.start(spec, budget=Budget(context_window=8_000))
    u = user(id="u1")
    asks = calling("c1", id="a1")

    decisions = [
        machine.handle(RunStarted(input=[u])),
        machine.handle(Measured(estimate=100)),
        machine.handle(ModelReplied(message=asks)),
        machine.handle(Signal(name="approved", data={"by": "ops"})),
        machine.handle(ToolsFinished(results=results_for(asks))),
    ]

    assert (len(spec.phases), len(spec.transitions), spec.signals) == (
        8,
        35,
        ("approved", "rejected"),
    )
    assert decisions == [
        Measure(history=MessageLog(), pending=MessageLog([u])),
        CallLLM(history=MessageLog(), pending=MessageLog([u]), turn=1),
        Perform(effect="await_approval", phase="await_approval"),
        RunTools(calls=asks.tool_calls),
        Measure(
            history=MessageLog(),
            pending=MessageLog([u, asks, *results_for(asks)]),
        ),
    ]


def approval_machine_waiting() -> TurnMachine:
    machine = TurnMachine.start(MachineSpec.from_toml(approval_toml()))
    script: list[Event] = [
        RunStarted(input=[user(id="u1")]),
        Measured(estimate=100),
        ModelReplied(message=calling("c1", id="a1")),
    ]
    for event in script:
        machine.handle(event)
    assert machine.phase == "await_approval"
    return machine


def test_custom_phase_rejection_ends_the_run() -> None:
    machine = approval_machine_waiting()

    decision = machine.handle(Signal(name="rejected"))

    assert (machine.phase, decision) == (
        "failed",
        Fail(error=Cancelled(reason="cancelled")),
    )


def test_wildcards_cover_a_custom_phase() -> None:
    machine = approval_machine_waiting()
    note = user("only read, never delete", id="n1")

    queued = machine.handle(MessageInjected(message=note))
    cancelled = machine.cancel("operator left")

    assert queued == Perform(effect="await_approval", phase="await_approval")
    assert cancelled == Fail(error=Cancelled(reason="operator left"))


def test_undeclared_signal_is_illegal() -> None:
    machine = approval_machine_waiting()

    with pytest.raises(IllegalEvent) as illegal:
        machine.handle(Signal(name="approve"))

    assert (illegal.value.phase, illegal.value.event) == ("await_approval", "approve")


def test_declared_signal_is_illegal_where_no_transition_takes_it() -> None:
    machine = TurnMachine.start(MachineSpec.from_toml(approval_toml()))

    with pytest.raises(IllegalEvent) as illegal:
        machine.handle(Signal(name="approved"))

    assert (illegal.value.phase, illegal.value.event) == ("start", "approved")


def test_a_bare_string_is_a_one_item_list() -> None:
    text = edit(
        STOCK,
        'conditions = ["has_tool_calls"]\nactions = ["record_reply"]',
        'conditions = "has_tool_calls"\nactions = "record_reply"',
    )

    spec = MachineSpec.from_toml(text)

    assert spec.transitions == load_turn_spec().transitions


STALL_EXITS = """[[transitions]]
trigger = "compaction_result"
source = ["compact", "compact_and_retry"]
dest = "failed"
conditions = ["is_no_progress"]
error = "compaction_stalled"
"""
NOOP_STALL_EXIT = STALL_EXITS.replace("compaction_result", "compaction_noop")
LIMIT_CHECK = """[[transitions]]
trigger = "measured"
source = "start"
dest = "failed"
conditions = ["is_over_emergency_line", "is_compaction_limit_reached"]
error = "compaction_limit_exceeded"

"""
THRESHOLD_ONLY = 'conditions = ["is_over_threshold_line"]\n'
THRESHOLD_UNLESS = (
    THRESHOLD_ONLY
    + 'unless = ["is_compaction_limit_reached", "is_threshold_line_spent"]\n'
)
"""What keeps the threshold compaction out once the passes are spent."""
MESSAGE_ONLY = 'conditions = ["is_over_message_line"]\n'
MESSAGE_UNLESS = (
    MESSAGE_ONLY + 'unless = ["is_compaction_limit_reached", "is_message_line_spent"]\n'
)
"""What keeps the message-count compaction out once the passes are spent."""
UNBOUNDED = "is not bounded by a model call, a retry counter or the no-progress guard"
STALL_CYCLE = (
    f"cycle start -[measured]-> compact -[compaction_result]-> start {UNBOUNDED}"
)
NO_LIMIT_CHECK = (
    "phase 'start' on 'measured' enters 'compact' without first checking"
    " 'is_compaction_limit_reached' (into a terminal phase)"
)


def uncounted(phase: str, trigger: str, dest: str = "start") -> str:
    return (
        f"phase {phase!r} on {trigger!r} leaves for {dest!r} without counting the"
        " pass: add 'count_compaction' to its actions"
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            edit(
                edit(edit(STOCK, STALL_EXITS, ""), NOOP_STALL_EXIT, ""), LIMIT_CHECK, ""
            ),
            (
                STALL_CYCLE,
                NO_LIMIT_CHECK,
            ),
        ),
        (
            edit(edit(STOCK, STALL_EXITS, ""), LIMIT_CHECK, ""),
            (
                STALL_CYCLE,
                NO_LIMIT_CHECK,
            ),
        ),
        (edit(STOCK, LIMIT_CHECK, ""), (STALL_CYCLE, NO_LIMIT_CHECK)),
        (edit(STOCK, THRESHOLD_UNLESS, THRESHOLD_ONLY), (STALL_CYCLE, NO_LIMIT_CHECK)),
        (edit(STOCK, MESSAGE_UNLESS, MESSAGE_ONLY), (STALL_CYCLE, NO_LIMIT_CHECK)),
        (
            edit(
                edit(STOCK, THRESHOLD_UNLESS, THRESHOLD_ONLY),
                MESSAGE_UNLESS,
                MESSAGE_ONLY,
            ),
            (STALL_CYCLE, NO_LIMIT_CHECK),
        ),
        (
            edit(edit(STOCK, LIMIT_CHECK, ""), THRESHOLD_UNLESS, THRESHOLD_ONLY),
            (STALL_CYCLE, NO_LIMIT_CHECK),
        ),
        (
            edit(
                edit(edit(STOCK, STALL_EXITS, ""), NOOP_STALL_EXIT, ""),
                THRESHOLD_UNLESS,
                THRESHOLD_ONLY,
            ),
            (STALL_CYCLE, NO_LIMIT_CHECK),
        ),
        (
            edit(
                STOCK,
                LIMIT_CHECK,
                LIMIT_CHECK.replace(
                    '"is_over_emergency_line"', '"is_over_threshold_line"'
                ),
            ),
            (STALL_CYCLE, NO_LIMIT_CHECK),
        ),
        (
            edit(
                STOCK,
                LIMIT_CHECK,
                LIMIT_CHECK.replace(
                    'error = "', 'unless = ["has_injected_messages"]\nerror = "'
                ),
            ),
            (STALL_CYCLE, NO_LIMIT_CHECK),
        ),
        (
            STOCK + '\n[[transitions]]\ntrigger = "measured"\nsource = "compact"\n'
            'dest = "start"\n',
            (uncounted("compact", "measured"),),
        ),
        (
            edit(
                STOCK,
                "# -- after a compaction pass",
                '[[transitions]]\ntrigger = "compaction_noop"\nsource = "*"\n'
                'dest = "start"\nactions = ["record_noop"]\n\n'
                "# -- after a compaction pass",
            ),
            (
                f"cycle start -[compaction_noop]-> start {UNBOUNDED}",
                uncounted("compact", "compaction_noop"),
                uncounted("compact_and_retry", "compaction_noop"),
                never_fires("compact", "compaction_noop", "start"),
            ),
        ),
    ],
    ids=[
        "no-stall-exits-no-limit",
        "no-stall-exit-on-result-no-limit",
        "no-limit-check",
        "threshold-compact-not-unless-the-limit",
        "message-compact-not-unless-the-limit",
        "neither-line-compact-unless-the-limit-reported-once",
        "no-limit-check-nor-unless-reported-once",
        "threshold-compact-not-unless-the-limit-no-stall-exits",
        "limit-check-on-a-condition-the-compaction-lacks",
        "limit-check-with-an-unless-the-compaction-lacks",
        "uncounted-measured-out-of-compact",
        "wildcard-before-the-stall-exit",
    ],
)
def test_unbounded_compaction_is_rejected(text: str, expected: tuple[str, ...]) -> None:
    problems = problems_of(text)

    assert problems == expected


def test_the_compaction_limit_alone_bounds_passes_without_stall_exits() -> None:
    text = edit(edit(STOCK, STALL_EXITS, ""), NOOP_STALL_EXIT, "")

    spec = MachineSpec.from_toml(text)

    assert len(spec.transitions) == 31


def test_an_unconditional_limit_check_covers_every_compaction() -> None:
    text = edit(
        edit(
            edit(STOCK, THRESHOLD_UNLESS, THRESHOLD_ONLY), MESSAGE_UNLESS, MESSAGE_ONLY
        ),
        'conditions = ["is_over_emergency_line", "is_compaction_limit_reached"]',
        'conditions = ["is_compaction_limit_reached"]',
    )

    spec = MachineSpec.from_toml(text)

    assert spec.transitions[2].conditions == ("is_compaction_limit_reached",)
    assert [(t.reason, t.unless) for t in spec.transitions[4:6]] == [
        (CompactReason.THRESHOLD_EXCEEDED, ()),
        (CompactReason.MESSAGE_COUNT, ()),
    ]


def test_unbounded_retry_cycle_is_named() -> None:
    text = edit(STOCK, STALL_EXITS, "")
    text = edit(text, 'conditions = ["has_overflow_retries_left"]\n', "")

    problems = problems_of(text)

    assert problems == (
        "cycle call_llm -[context_overflowed]-> compact_and_retry"
        f" -[compaction_result]-> call_llm {UNBOUNDED}",
        never_fires("call_llm", "context_overflowed", "compact_and_retry"),
    )


def test_wildcard_after_the_stall_exit_is_bounded_only_in_compact_phases() -> None:
    text = STOCK + (
        '\n[[transitions]]\ntrigger = "compaction_result"\nsource = "*"\n'
        'dest = "start"\nactions = ["record_compaction", "count_compaction"]\n'
    )

    problems = problems_of(text)

    assert problems == (f"cycle start -[compaction_result]-> start {UNBOUNDED}",)


def test_self_loop_through_compact_is_rejected() -> None:
    text = STOCK + (
        '\n[[transitions]]\ntrigger = "tools_finished"\nsource = "compact"\n'
        'dest = "compact"\nreason = "manual"\nactions = ["record_results"]\n'
    )

    problems = problems_of(text)

    assert problems == (
        f"cycle compact -[tools_finished]-> compact {UNBOUNDED}",
        uncounted("compact", "tools_finished", "compact"),
    )


def test_transition_spec_is_guarded_by_conditions_or_unless() -> None:
    def spec(conditions: tuple[str, ...], unless: tuple[str, ...]) -> TransitionSpec:
        return TransitionSpec(
            trigger="measured",
            sources=("start",),
            dest=None,
            conditions=conditions,
            unless=unless,
        )

    actual = [
        spec((), ()).is_guarded,
        spec(("is_no_progress",), ()).is_guarded,
        spec((), ("is_no_progress",)).is_guarded,
    ]

    assert actual == [False, True, True]


def test_a_reducer_on_the_wrong_event_is_a_problem() -> None:
    text = edit(
        turn_toml_text(),
        'trigger = "tools_finished"\nsource = "run_tools"\ndest = "start"\n'
        'actions = ["record_results"]',
        'trigger = "tools_finished"\nsource = "run_tools"\ndest = "start"\n'
        'actions = ["record_results", "record_estimate"]',
    )
    assert problems_of(text) == (
        "transition #14 (tools_finished): 'record_estimate' only applies to measured",
    )


def test_an_error_builder_on_the_wrong_event_is_a_problem() -> None:
    text = edit(
        turn_toml_text(), 'error = "provider_error"', 'error = "compaction_failed"'
    )
    assert problems_of(text) == (
        "transition #13 (model_failed): 'compaction_failed' only applies to "
        "compactor_failed",
    )


def test_cancelled_on_an_outcome_of_the_runs_own_step_is_a_problem() -> None:
    # The run would end "cancelled" on the compaction limit, though no one
    # cancelled it.
    text = edit(
        turn_toml_text(),
        'conditions = ["is_over_emergency_line", "is_compaction_limit_reached"]\n'
        'error = "compaction_limit_exceeded"',
        'conditions = ["is_over_emergency_line", "is_compaction_limit_reached"]\n'
        'error = "cancelled"',
    )
    assert problems_of(text) == (
        "transition #3 (measured): error 'cancelled' says the run was stopped"
        " from outside (its cancel(), a reviewer's answer or a signal), but"
        " 'measured' is what the run's own step came to: name what went wrong"
        " ('compaction_limit_exceeded', 'context_exceeded' or"
        " 'max_turns_exceeded')",
    )


def test_cancelled_on_an_answer_from_outside_loads() -> None:
    # A reviewer may stop the run: a signal, or a review, into a fail phase.
    review = '[[transitions]]\ntrigger = "tool_calls_reviewed"\n'
    text = (REPO_ROOT / "machines" / "approval.toml").read_text()
    text = text.replace(
        review,
        review + 'source = "await_approval"\ndest = "failed"\n'
        'conditions = ["has_injected_messages"]\nerror = "cancelled"\n\n' + review,
        1,
    )
    assert MachineSpec.from_toml(text).name == "approval"
    signalled = MachineSpec.from_toml(approval_toml())  # `rejected` cancels it
    assert "rejected" in signalled.signals


def test_an_event_specific_reducer_cannot_run_on_entry() -> None:
    text = edit(
        turn_toml_text(),
        'done              = { decision = "finish", on_enter = ["commit_pending"] }',
        'done              = { decision = "finish",'
        ' on_enter = ["commit_pending", "record_reply"] }',
    )
    assert problems_of(text) == (
        "state 'done': 'record_reply' needs a specific event and cannot run on entry",
    )


def test_a_model_call_must_follow_a_measurement_or_a_compaction() -> None:
    text = edit(
        turn_toml_text(),
        'trigger = "tools_finished"\nsource = "run_tools"\ndest = "start"',
        'trigger = "tools_finished"\nsource = "run_tools"\ndest = "call_llm"',
    )
    assert problems_of(text) == (
        "cycle call_llm -[model_replied]-> run_tools -[tools_finished]-> call_llm"
        f" {UNBOUNDED}",
        "phase 'run_tools' on 'tools_finished' enters 'call_llm' unmeasured: a model "
        "call must follow 'measured' or 'compaction_result'",
    )


def unchecked(guard: str, kind: str) -> str:
    """The problem of a model call on `measured` that does not check `guard` first."""
    return (
        "phase 'start' on 'measured' enters 'call_llm' without first checking"
        f" {guard!r}: put before it a 'measured' transition with conditions ="
        f" [{guard!r}] into {kind}, or add {guard!r} to its unless"
    )


def test_measured_must_check_the_turn_limit_and_emergency_line_first() -> None:
    text = edit(
        turn_toml_text(),
        'conditions = ["is_turn_limit_reached"]\nerror = "max_turns_exceeded"',
        'conditions = ["is_over_threshold_line"]\nerror = "max_turns_exceeded"',
    )
    text = edit(
        text,
        'conditions = ["is_over_emergency_line"]',
        'conditions = ["is_over_threshold_line"]\n'
        'unless = ["is_compaction_limit_reached"]',
    )
    assert problems_of(text) == (
        unchecked("is_turn_limit_reached", "a terminal phase"),
        unchecked("is_over_emergency_line", "a compact or terminal phase"),
    )


@pytest.mark.parametrize(
    ("old", "narrowed", "guard", "kind"),
    [
        (
            'conditions = ["is_turn_limit_reached"]\n',
            'conditions = ["is_turn_limit_reached", "has_injected_messages"]\n',
            "is_turn_limit_reached",
            "a terminal phase",
        ),
        (
            'conditions = ["is_turn_limit_reached"]\n',
            'conditions = ["is_turn_limit_reached"]\n'
            'unless = ["is_over_threshold_line"]\n',
            "is_turn_limit_reached",
            "a terminal phase",
        ),
        (
            'conditions = ["is_over_emergency_line"]\nreason',
            'conditions = ["is_over_emergency_line", "has_injected_messages"]\nreason',
            "is_over_emergency_line",
            "a compact or terminal phase",
        ),
    ],
    ids=["turn-limit-and-more", "turn-limit-unless", "emergency-and-more"],
)
def test_a_check_before_the_model_call_narrowed_by_another_guard_is_no_check(
    old: str, narrowed: str, guard: str, kind: str
) -> None:
    """One that holds only sometimes lets the rest through to the model call."""
    problems = problems_of(edit(turn_toml_text(), old, narrowed))

    assert unchecked(guard, kind) in problems


def test_a_check_narrowed_by_an_unless_an_earlier_one_takes_is_still_a_check() -> None:
    """The stock file fails on the emergency line once the passes are spent."""
    text = edit(
        turn_toml_text(),
        'conditions = ["is_over_emergency_line"]\nreason',
        'conditions = ["is_over_emergency_line"]\n'
        'unless = ["is_compaction_limit_reached"]\nreason',
    )

    assert "call_llm" in MachineSpec.from_toml(text).phases


@pytest.mark.parametrize("name", sorted(HAND_WRITTEN))
def test_a_machine_that_keeps_the_promises_its_own_way_loads(name: str) -> None:
    """Each loads, as no run of it breaks a promise (most were refused once).

    The checks in the `unless` of the model call, the failure that covers
    the emergency pass after it, a failure on the emergency line with no
    compaction at all, a pass whose result goes straight to the model after
    the turn-limit check, a fail phase that only the wildcard
    `run_cancelled` enters (it was "unreachable"), and a run that ends done
    once its tools ran (a structured output type refuses it, not the loader).
    """
    assert MachineSpec.from_toml(HAND_WRITTEN[name]).states


def test_a_phase_only_a_cancel_leaves_is_a_dead_end() -> None:
    """A cancel of its own before the wildcard one hid it: the file loaded."""
    check = '[states]\ncheck = { effect = "check" }\n'
    text = edit(
        edit(turn_toml_text(), "[states]\n", check),
        'source = "run_tools"\ndest = "start"',
        'source = "run_tools"\ndest = "check"',
    )
    text = edit(
        text,
        '[[transitions]]\ntrigger = "run_cancelled"\nsource = "*"',
        '[[transitions]]\ntrigger = "run_cancelled"\nsource = "check"\n'
        'dest = "failed"\nerror = "cancelled"\n\n'
        '[[transitions]]\ntrigger = "run_cancelled"\nsource = "*"',
    )

    assert problems_of(text) == (
        "phase 'check' is a dead end: no transition leaves it",
    )


# -- the message-count line (is_over_message_line, reason MESSAGE_COUNT) -----


def conversation(count: int) -> tuple[MessageLog, MessageLog]:
    """Return a committed history and a one-message input, `count` in all."""
    history = MessageLog(
        [
            user(id=f"h{i}") if i % 2 == 0 else reply(id=f"h{i}")
            for i in range(count - 1)
        ]
    )
    return history, MessageLog([user("and now?", id="u1")])


def measure(
    budget: Budget, count: int, estimate: int = 100
) -> tuple[TurnMachine, Decision]:
    """Start a stock run over `count` messages and feed one measurement."""
    history, pending = conversation(count)
    machine = start_machine(budget=budget, history=history)
    machine.handle(RunStarted(input=list(pending)))
    return machine, machine.handle(Measured(estimate=estimate))


@pytest.mark.parametrize(
    ("history", "pending", "expected"),
    [(3, 0, False), (2, 1, False), (4, 0, True), (2, 2, True), (0, 4, True)],
)
def test_the_message_line_guard_counts_history_and_pending(
    history: int, pending: int, expected: bool
) -> None:
    snapshot = Snapshot(
        phase="start",
        budget=Budget(max_messages=3),
        history=[user(id=f"h{i}") for i in range(history)],
        pending=[user(id=f"p{i}") for i in range(pending)],
    )

    assert GUARDS["is_over_message_line"](snapshot, Measured(estimate=0)) is expected


def test_at_the_message_line_the_model_is_called() -> None:
    history, pending = conversation(3)

    machine, decision = measure(Budget(max_messages=3), 3)

    assert (machine.phase, decision) == (
        "call_llm",
        CallLLM(history=history, pending=pending, turn=1),
    )


def test_over_the_message_line_compacts_for_message_count() -> None:
    history, pending = conversation(4)

    machine, decision = measure(Budget(max_messages=3), 4)

    assert (machine.phase, decision) == (
        "compact",
        Compact(reason=CompactReason.MESSAGE_COUNT, history=history, pending=pending),
    )
    assert machine.snapshot.estimate == 100


@pytest.mark.parametrize("budget", [Budget(max_messages=0), Budget()])
def test_a_zero_message_line_never_compacts(budget: Budget) -> None:
    machine, decision = measure(budget, 500)

    assert (machine.phase, type(decision)) == ("call_llm", CallLLM)


@pytest.mark.parametrize(
    ("estimate", "auto_compact", "reason"),
    [
        (7_600, True, CompactReason.EMERGENCY),
        (7_600, False, CompactReason.EMERGENCY),
        (6_401, True, CompactReason.THRESHOLD_EXCEEDED),
        (6_400, True, CompactReason.MESSAGE_COUNT),
    ],
)
def test_the_token_lines_win_over_the_message_line(
    estimate: int, auto_compact: bool, reason: CompactReason
) -> None:
    budget = Budget(
        context_window=8_000, threshold=80, auto_compact=auto_compact, max_messages=3
    )

    machine, decision = measure(budget, 4, estimate)

    assert machine.phase == "compact"
    assert isinstance(decision, Compact)
    assert decision.reason is reason


def test_with_auto_compact_off_the_message_line_is_off_too() -> None:
    budget = Budget(
        context_window=8_000, threshold=80, auto_compact=False, max_messages=3
    )

    machine, decision = measure(budget, 4, 6_401)

    assert (machine.phase, type(decision)) == ("call_llm", CallLLM)


def test_past_the_compaction_limit_the_message_line_calls_the_model() -> None:
    history, pending = conversation(4)
    kept = (*history, *pending)
    machine, first = measure(Budget(max_messages=3, max_compactions=1), 4)

    after = [
        machine.handle(CompactionResult(messages=kept, before=1_000, after=900)),
        machine.handle(Measured(estimate=900)),
    ]

    assert isinstance(first, Compact)
    assert first.reason is CompactReason.MESSAGE_COUNT
    assert (machine.phase, machine.snapshot.compactions) == ("call_llm", 1)
    assert after == [
        Measure(history=MessageLog(kept), pending=MessageLog()),
        CallLLM(history=MessageLog(kept), pending=MessageLog(), turn=1),
    ]


# -- a message-count pass never fails the run (is_message_count_pass) --------


def message_count_pass() -> tuple[TurnMachine, tuple[Message, ...]]:
    """Return a stock run in `compact` for the message-count line, and its input.

    Four tiny messages over `max_messages=3`: the token lines hold.
    """
    history, pending = conversation(4)
    machine, decision = measure(Budget(max_messages=3), 4)
    assert isinstance(decision, Compact)
    assert decision.reason is CompactReason.MESSAGE_COUNT
    return machine, (*history, *pending)


def test_a_message_count_noop_spends_the_line_instead_of_failing() -> None:
    history, pending = conversation(4)
    machine, _ = message_count_pass()

    decision = machine.handle(CompactionNoop(before=100, after=100))

    assert (machine.phase, decision) == (
        "start",
        Measure(history=history, pending=pending),
    )
    snapshot = machine.snapshot
    assert (snapshot.message_line_spent, snapshot.compactions, snapshot.failure) == (
        True,
        1,
        None,
    )


@pytest.mark.parametrize(
    "event",
    [
        CompactorFailed(
            used=100, limit=1_000, error=ErrorInfo(type="APIError", message="down")
        ),
        CompactionCircuitOpened(failures=3),
        CompactionOverflowed(used=2_000, limit=1_000),
    ],
    ids=["compactor-failed", "circuit-open", "overflowed"],
)
def test_a_message_count_pass_that_fails_calls_the_model_as_it_was(
    event: Event,
) -> None:
    """The token lines held, so the request fits: no pass is no reason to fail."""
    history, pending = conversation(4)
    machine, _ = message_count_pass()

    decision = machine.handle(event)

    assert (machine.phase, decision) == (
        "start",
        Measure(history=history, pending=pending),
    )
    snapshot = machine.snapshot
    assert (snapshot.message_line_spent, snapshot.compactions, snapshot.failure) == (
        True,
        1,
        None,
    )
    assert isinstance(machine.handle(Measured(estimate=100)), CallLLM)


@pytest.mark.parametrize(
    "event",
    [
        CompactorFailed(
            used=100, limit=1_000, error=ErrorInfo(type="APIError", message="down")
        ),
        CompactionCircuitOpened(failures=3),
    ],
    ids=["compactor-failed", "circuit-open"],
)
def test_a_threshold_pass_that_fails_still_fails_the_run(event: Event) -> None:
    machine, decision = measure(Budget(context_window=1_000, threshold=50), 2, 600)
    assert isinstance(decision, Compact)
    assert decision.reason is CompactReason.THRESHOLD_EXCEEDED

    decision = machine.handle(event)

    assert (machine.phase, type(decision)) == ("failed", Fail)


def test_a_spent_message_line_calls_the_model_over_the_line() -> None:
    history, pending = conversation(4)
    machine, _ = message_count_pass()
    machine.handle(CompactionNoop(before=100, after=100))

    decision = machine.handle(Measured(estimate=100))

    assert len(history) + len(pending) == 4
    assert (machine.phase, decision) == (
        "call_llm",
        CallLLM(history=history, pending=pending, turn=1),
    )


@pytest.mark.parametrize(
    ("before", "after"), [(100, 100), (100, 120)], ids=["saved-nothing", "grew"]
)
def test_a_message_count_result_without_progress_is_committed(
    before: int, after: int
) -> None:
    machine, kept = message_count_pass()

    decision = machine.handle(
        CompactionResult(messages=kept, before=before, after=after)
    )

    assert (machine.phase, decision) == (
        "start",
        Measure(history=MessageLog(kept), pending=MessageLog()),
    )
    snapshot = machine.snapshot
    assert (snapshot.estimate, snapshot.compactions, snapshot.message_line_spent) == (
        after,
        1,
        False,
    )


def test_a_threshold_pass_that_changed_messages_without_progress_stalls() -> None:
    history, pending = conversation(4)
    budget = Budget(context_window=8_000, threshold=80, max_messages=3)
    machine, first = measure(budget, 4, 7_000)
    event = CompactionResult(messages=(*history, *pending), before=7_000, after=7_000)

    decision = machine.handle(event)

    assert isinstance(first, Compact)
    assert first.reason is CompactReason.THRESHOLD_EXCEEDED
    assert (machine.phase, decision) == (
        "failed",
        Fail(error=CompactionStalled(used=7_000, limit=7_000)),
    )
    assert machine.snapshot.message_line_spent is False


def test_a_threshold_pass_that_cannot_shrink_a_request_that_fits_calls_the_model() -> (
    None
):
    """Under the emergency line (7,600) the request fits: the model is called."""
    budget = Budget(context_window=8_000, threshold=80)
    machine, first = measure(budget, 4, 7_000)

    after_pass = machine.handle(CompactionNoop(before=7_000, after=7_000))
    served = machine.handle(Measured(estimate=7_000))

    assert isinstance(first, Compact)
    assert isinstance(after_pass, Measure)
    assert isinstance(served, CallLLM)
    assert machine.snapshot.threshold_line_spent is True
    assert machine.snapshot.failure is None


def test_a_spent_threshold_line_still_leaves_the_emergency_line_on() -> None:
    budget = Budget(context_window=8_000, threshold=80)
    machine, _ = measure(budget, 4, 7_000)
    machine.handle(CompactionNoop(before=7_000, after=7_000))

    decision = machine.handle(Measured(estimate=7_600))

    assert isinstance(decision, Compact)
    assert decision.reason is CompactReason.EMERGENCY


def test_a_threshold_pass_without_progress_over_the_emergency_line_stalls() -> None:
    """A pass whose result grew onto the emergency line does not fit: it fails."""
    budget = Budget(context_window=8_000, threshold=80)
    machine, _ = measure(budget, 4, 7_000)

    decision = machine.handle(CompactionNoop(before=7_000, after=7_700))

    assert (machine.phase, decision) == (
        "failed",
        Fail(error=CompactionStalled(used=7_700, limit=7_000)),
    )


def test_a_commit_turns_the_threshold_line_on_again() -> None:
    history, pending = conversation(4)
    budget = Budget(context_window=8_000, threshold=80)
    machine, _ = measure(budget, 4, 7_000)
    machine.handle(CompactionNoop(before=7_000, after=7_000))
    emergency = machine.handle(Measured(estimate=7_600))
    machine.handle(
        CompactionResult(messages=(*history, *pending), before=7_600, after=6_500)
    )

    decision = machine.handle(Measured(estimate=6_500))

    assert isinstance(emergency, Compact)
    assert machine.snapshot.threshold_line_spent is False
    assert isinstance(decision, Compact)
    assert decision.reason is CompactReason.THRESHOLD_EXCEEDED


@pytest.mark.parametrize(
    ("phase", "reason"),
    [
        ("compact", CompactReason.MESSAGE_COUNT),
        ("compact", CompactReason.THRESHOLD_EXCEEDED),
        ("compact", CompactReason.EMERGENCY),
        ("compact_and_retry", CompactReason.OVERFLOW),
    ],
)
def test_any_committed_pass_turns_the_message_line_back_on(
    phase: str, reason: CompactReason
) -> None:
    kept = (user(id="s1"),)
    machine = machine_at(
        phase,
        budget=Budget(context_window=8_000, threshold=80, max_messages=3),
        history=[user(id="h0")],
        compact_reason=reason,
        message_line_spent=True,
    )

    machine.handle(CompactionResult(messages=kept, before=7_000, after=1_000))

    assert machine.snapshot.history == MessageLog(kept)
    assert machine.snapshot.message_line_spent is False


def test_a_spent_line_counts_again_after_a_threshold_commit() -> None:
    history, pending = conversation(4)
    kept = (*history, *pending)
    budget = Budget(context_window=8_000, threshold=80, max_messages=3)
    machine, _ = measure(budget, 4)
    machine.handle(CompactionNoop(before=100, after=100))

    decisions = [
        machine.handle(Measured(estimate=7_000)),
        machine.handle(CompactionResult(messages=kept, before=7_000, after=100)),
        machine.handle(Measured(estimate=100)),
    ]

    assert decisions == [
        Compact(
            reason=CompactReason.THRESHOLD_EXCEEDED, history=history, pending=pending
        ),
        Measure(history=MessageLog(kept), pending=MessageLog()),
        Compact(
            reason=CompactReason.MESSAGE_COUNT,
            history=MessageLog(kept),
            pending=MessageLog(),
        ),
    ]
    assert machine.snapshot.compactions == 2


@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        (CompactReason.MESSAGE_COUNT, True),
        (CompactReason.THRESHOLD_EXCEEDED, False),
        (CompactReason.EMERGENCY, False),
        (CompactReason.OVERFLOW, False),
        (None, False),
    ],
)
def test_the_message_count_pass_guard_reads_the_reason(
    reason: CompactReason | None, expected: bool
) -> None:
    snapshot = Snapshot(phase="compact", compact_reason=reason)

    guard = GUARDS["is_message_count_pass"]

    assert guard(snapshot, CompactionNoop(before=1, after=1)) is expected


@pytest.mark.parametrize("spent", [True, False])
def test_the_spent_line_guard_reads_the_snapshot(spent: bool) -> None:
    snapshot = Snapshot(phase="start", message_line_spent=spent)

    assert GUARDS["is_message_line_spent"](snapshot, Measured(estimate=0)) is spent


def test_the_spend_message_line_reducer_sets_only_the_flag() -> None:
    snapshot = Snapshot(phase="compact", compactions=2)

    spent = REDUCERS["spend_message_line"](snapshot, CompactionNoop(before=1, after=1))

    assert spent == snapshot.replace(message_line_spent=True)


@pytest.mark.parametrize("spent", [True, False])
def test_the_spent_line_round_trips_through_a_dict(spent: bool) -> None:
    snapshot = Snapshot(phase="start", message_line_spent=spent)

    data = json.loads(json.dumps(snapshot.to_dict()))

    assert data["message_line_spent"] is spent
    assert Snapshot.from_dict(data) == snapshot


def test_a_stored_snapshot_without_the_spent_line_loads_it_off() -> None:
    data = Snapshot(phase="start", message_line_spent=True).to_dict()
    del data["message_line_spent"]

    assert Snapshot.from_dict(data).message_line_spent is False


def test_a_transition_after_one_without_conditions_never_fires_and_is_refused() -> None:
    # Appended at the end of a copy of the stock file, meant to fail a run
    # over the threshold line: the stock `measured` -> `call_llm` without
    # conditions comes first and takes every `measured`, so it never fires.
    text = STOCK + (
        '\n[[transitions]]\ntrigger = "measured"\nsource = "start"\n'
        'dest = "failed"\nconditions = ["is_over_threshold_line"]\n'
        'error = "context_exceeded"\n'
    )

    with pytest.raises(DefinitionError) as error:
        MachineSpec.from_toml(text)

    (problem,) = error.value.problems
    assert problem.message == (
        "phase 'start' on 'measured': this transition never fires, as the one"
        " without conditions before it (into 'call_llm') takes every 'measured'"
        " there: move it before that one, or remove it"
    )
    assert (problem.field, problem.value) == ("transitions[33]", "measured")
    assert problem.line == len(STOCK.splitlines()) + 2


def test_a_transition_written_twice_is_refused_on_the_second() -> None:
    entry = '[[transitions]]\ntrigger = "tools_finished"'
    at = STOCK.index(entry)
    end = STOCK.index("[[transitions]]", at + len(entry))
    text = STOCK[:end] + STOCK[at:end] + STOCK[end:]

    problems = problems_of(text)

    assert problems == (
        "phase 'run_tools' on 'tools_finished': this transition never fires, as"
        " the one without conditions before it (into 'start') takes every"
        " 'tools_finished' there: move it before that one, or remove it",
    )


def test_a_transition_that_fires_for_some_of_its_phases_loads() -> None:
    # The stock `message_injected` for `start` comes first; the wildcard
    # after it still fires in every other phase.
    spec = MachineSpec.from_toml(STOCK)

    assert [t.trigger for t in spec.transitions].count("message_injected") == 2


@pytest.mark.parametrize(
    ("old", "new", "message", "field", "value"),
    [
        (
            "run_tools         =",
            '"run\\u0000tools" =',
            "states: the name 'run\\x00tools' holds a control character ('\\x00'):"
            " a name is printable text (no line break, tab or NUL)",
            "states.run\x00tools",
            "run\x00tools",
        ),
        (
            'name = "turn"',
            'name = "turn\\nv2"',
            "name: the name 'turn\\nv2' holds a control character ('\\n'): a name"
            " is printable text (no line break, tab or NUL)",
            "name",
            "turn\nv2",
        ),
        (
            'name = "turn"',
            'name = "turn"\nsignals = ["ok\\t"]',
            "signals[0]: the name 'ok\\t' holds a control character ('\\t'): a"
            " name is printable text (no line break, tab or NUL)",
            "signals[0]",
            "ok\t",
        ),
        (
            "[states]\n",
            '[states]\ncheck = { effect = "che\\rck" }\n',
            "states.check.effect: the name 'che\\rck' holds a control character"
            " ('\\r'): a name is printable text (no line break, tab or NUL)",
            "states.check.effect",
            "che\rck",
        ),
    ],
    ids=["phase", "machine", "signal", "effect"],
)
def test_a_name_with_a_control_character_is_refused(
    old: str, new: str, message: str, field: str, value: str
) -> None:
    # Such a name loaded, and `turnfsm diagram` then failed on it (Graphviz
    # reads no NUL) or drew a label broken over lines.
    with pytest.raises(DefinitionError) as error:
        MachineSpec.from_toml(STOCK.replace(old, new, 1))

    problem = error.value.problems[0]
    assert (problem.message, problem.field, problem.value) == (message, field, value)


@pytest.mark.parametrize(
    ("old", "new", "message", "field", "value"),
    [
        (
            'name = "turn"',
            'name = "tur\\u202en"',
            "name: the name 'tur\\u202en' holds an invisible character ('\\u202e',"
            " right-to-left override): a name is text you can see (write it again"
            " without it)",
            "name",
            "tur\u202en",
        ),
        (
            "run_tools         =",
            '"run_to\\u200bols" =',
            "states: the name 'run_to\\u200bols' holds an invisible character"
            " ('\\u200b', zero width space): a name is text you can see (write it"
            " again without it)",
            "states.run_to\u200bols",
            "run_to\u200bols",
        ),
    ],
    ids=["direction-mark", "zero-width-space"],
)
def test_a_name_with_an_invisible_character_is_refused(
    old: str, new: str, message: str, field: str, value: str
) -> None:
    # Such a name loaded: a right-to-left mark printed `turnfsm check` and
    # the logs' lines backwards, and a zero-width space made a phase
    # 'run_to\u200bols' that every problem printed as if it were 'run_tools'.
    with pytest.raises(DefinitionError) as error:
        MachineSpec.from_toml(STOCK.replace(old, new, 1))

    problem = error.value.problems[0]
    assert (problem.message, problem.field, problem.value) == (message, field, value)


def test_a_recorded_machine_is_read_as_it_ran_though_such_a_file_is_refused() -> None:
    # A session's log keeps the machine its runs began on: one that loaded
    # before these rules (a transition written twice, a phase name with a
    # tab) still reads back, so its runs can be finished, abandoned, replayed.
    entry = '[[transitions]]\ntrigger = "tools_finished"'
    at = STOCK.index(entry)
    end = STOCK.index("[[transitions]]", at + len(entry))
    text = STOCK[:end] + STOCK[at:end] + STOCK[end:]
    text = (
        text.replace('"run_tools"', '"run\\ttools"')
        .replace("run_tools         =", '"run\\ttools" =')
        .replace('decision = "run\\ttools"', 'decision = "run_tools"')
    )
    data = tomllib.loads(text)
    with pytest.raises(DefinitionError):
        MachineSpec.from_dict(data)

    spec = MachineSpec.from_dict(data, recorded=True)

    assert "run\ttools" in spec.phases
