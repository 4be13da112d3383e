"""Each problem of a machine file names its line, its field, and a likely fix.

The loader reports every problem of a file in one `DefinitionError`: names
first, then the graph checks on what resolved. A misspelt name is reported
once, with the known name closest to it, and the checks after it read it as
that name, so one typo is one problem.
"""

from __future__ import annotations

import json
import re
import tomllib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers import REPO_ROOT, turn_toml_text
from tests.profiles import sized
from turnfsm.core import FAILURES, GUARDS, REDUCERS, CompactReason, MachineSpec
from turnfsm.core._spec import BUILTIN_TRIGGERS, DECISION_KINDS
from turnfsm.errors import DefinitionError, Problem

STOCK = turn_toml_text()
MACHINES = sorted((REPO_ROOT / "machines").glob("*.toml"))


def problems_of(text: str, source: str = "m.toml") -> tuple[Problem, ...]:
    with pytest.raises(DefinitionError) as error:
        MachineSpec.from_toml(text, source=source)
    return error.value.problems


def edit(text: str, old: str, new: str) -> str:
    """Replace the one occurrence of `old` in `text`."""
    assert text.count(old) == 1, old
    return text.replace(old, new)


def line_with(text: str, marker: str) -> int:
    """The 1-based line of the one occurrence of `marker` in `text`."""
    assert text.count(marker) == 1, marker
    return text[: text.index(marker)].count("\n") + 1


# -- one typo, one problem, on its line ----------------------------------------


@pytest.mark.parametrize(
    ("old", "new", "marker", "message", "suggestion"),
    [
        (
            'conditions = ["is_over_emergency_line"]',
            'conditions = ["is_over_emergncy_line"]',
            "is_over_emergncy_line",
            "unknown guard 'is_over_emergncy_line'",
            "is_over_emergency_line",
        ),
        (
            'unless = ["is_compaction_limit_reached", "is_threshold_line_spent"]\n'
            'reason = "threshold_exceeded"',
            'unless = ["is_compaction_limit_reachd", "is_threshold_line_spent"]\n'
            'reason = "threshold_exceeded"',
            "is_compaction_limit_reachd",
            "unknown guard 'is_compaction_limit_reachd'",
            "is_compaction_limit_reached",
        ),
        (
            'conditions = ["is_over_emergency_line", "is_compaction_limit_reached"]',
            'conditions = [\n  "is_over_emergency_line",\n'
            '  "is_compaction_limit_reachd",  # a comment\n]',
            "is_compaction_limit_reachd",
            "unknown guard 'is_compaction_limit_reachd'",
            "is_compaction_limit_reached",
        ),
        (
            'actions = ["record_start"]',
            'actions = ["record_strat"]',
            "record_strat",
            "unknown reducer 'record_strat'",
            "record_start",
        ),
        (
            'on_enter = ["commit_pending"]',
            'on_enter = ["comit_pending"]',
            "comit_pending",
            "state 'done': unknown reducer 'comit_pending'",
            "commit_pending",
        ),
        (
            'dest = "run_tools"',
            'dest = "run_tool"',
            '"run_tool"',
            "unknown dest phase 'run_tool'",
            "run_tools",
        ),
        (
            'source = "run_tools"',
            'source = ["run_tols"]',
            "run_tols",
            "unknown source phase 'run_tols'",
            "run_tools",
        ),
        (
            'trigger = "run_started"',
            'trigger = "run_startd"',
            "run_startd",
            "unknown trigger 'run_startd' (declare it in signals)",
            "run_started",
        ),
        (
            'reason = "emergency"',
            'reason = "emergancy"',
            "emergancy",
            "got 'emergancy'",
            "emergency",
        ),
        (
            'error = "max_turns_exceeded"',
            'error = "max_turns_exeeded"',
            "max_turns_exeeded",
            "got 'max_turns_exeeded'",
            "max_turns_exceeded",
        ),
        (
            'call_llm          = { decision = "call_llm" }',
            'call_llm          = { decision = "call_lm" }',
            "call_lm",
            "state 'call_llm': unknown decision 'call_lm'",
            "call_llm",
        ),
        (
            'on_enter = ["commit_pending"]',
            'on_entre = ["commit_pending"]',
            "on_entre",
            "state 'done': unknown key 'on_entre'",
            "on_enter",
        ),
        (
            'run_tools         = { decision = "run_tools" }',
            'run_tools         = { decision = "run_tools", timeout = 30 }',
            "timeout",
            "state 'run_tools': unknown key 'timeout'",
            None,
        ),
        (
            'actions = ["record_start"]',
            'action = ["record_start"]',
            "action =",
            "transition #1: unknown key 'action'",
            "actions",
        ),
        (
            'actions = ["record_start"]',
            'actions = ["record_reply"]',
            'record_reply"]\n\n#',
            "transition #1 (run_started): 'record_reply' only applies to model_replied",
            None,
        ),
        (
            'initial = "start"',
            'initial = "strat"',
            "strat",
            "unknown phase 'strat' named by initial/terminal",
            "start",
        ),
        (
            'terminal = ["done", "failed"]',
            'terminal = ["done",\n  "faild"]',
            "faild",
            "unknown phase 'faild' named by initial/terminal",
            "failed",
        ),
        (
            'initial = "start"\n',
            'initial = "start"\nsignal = ["approved"]\n',
            "signal =",
            "unknown key 'signal'",
            "signals",
        ),
        ('initial = "start"', 'inital = "start"', "inital =", "'inital'", "initial"),
        (
            'terminal = ["done", "failed"]',
            'terminals = ["done", "failed"]',
            "terminals =",
            "unknown key 'terminals'",
            "terminal",
        ),
        ("[states]", "[state]", "[state]", "unknown key 'state'", "states"),
        (
            'error = "cancelled"\n',
            'error = "cancelled"\n\nversion = 2\n',
            "version =",
            "unknown key 'version'",
            "reason",
        ),
    ],
    ids=[
        "guard",
        "unless-guard",
        "guard-in-a-multiline-array",
        "reducer",
        "on-enter-reducer",
        "dest",
        "source",
        "trigger",
        "reason",
        "error",
        "decision",
        "state-key",
        "state-key-far",
        "transition-key",
        "reducer-on-the-wrong-event",
        "initial",
        "terminal",
        "top-key",
        # A misspelt top-level key was not read as the key it is closest to:
        # `[state]` was also every phase named unknown, about 100 problems.
        "top-key-initial",
        "top-key-terminal",
        "top-key-states",
        # A key of its own at the end of the file is the last transition's:
        # it was read as that transition's reason too, and reported as one.
        "key-after-the-last-transition",
    ],
)
def test_a_typo_is_one_problem_on_its_line(
    old: str, new: str, marker: str, message: str, suggestion: str | None
) -> None:
    text = edit(STOCK, old, new)

    problems = problems_of(text)

    assert len(problems) == 1, [str(p) for p in problems]
    (problem,) = problems
    assert message in problem.message
    assert (problem.line, problem.suggestion) == (line_with(text, marker), suggestion)


def test_a_name_without_a_close_match_has_no_suggestion() -> None:
    text = edit(
        STOCK,
        'conditions = ["has_tool_calls"]',
        'conditions = ["zzz"]',
    )

    (problem,) = problems_of(text)

    assert (problem.line, problem.value, problem.suggestion) == (
        line_with(text, '"zzz"'),
        "zzz",
        None,
    )
    assert str(problem) == problem.message


def test_a_problem_names_its_field_and_value() -> None:
    data = tomllib.loads(STOCK)
    data["transitions"][3]["conditions"][0] = "is_over_emergncy_line"

    with pytest.raises(DefinitionError) as error:
        MachineSpec.from_dict(data)

    assert error.value.problems == (
        Problem(
            message="transition #4 (measured): unknown guard 'is_over_emergncy_line'",
            line=None,
            field="transitions[3].conditions[0]",
            value="is_over_emergncy_line",
            suggestion="is_over_emergency_line",
        ),
    )
    assert str(error.value) == (
        "<dict>: transition #4 (measured): unknown guard 'is_over_emergncy_line'"
        " (did you mean 'is_over_emergency_line'?)"
    )


def test_a_misspelt_dest_does_not_judge_the_reason_or_error_it_carries() -> None:
    text = edit(
        STOCK,
        'conditions = ["is_over_emergency_line"]\nreason = "emergency"',
        'conditions = ["is_over_emergency_line"]\nreason = "emergancy"',
    )
    text = edit(
        text,
        'dest = "compact"\nconditions = ["is_over_emergency_line"]',
        ('dest = "compat"\nconditions = ["is_over_emergency_line"]'),
    )

    messages = [p.message for p in problems_of(text)]

    assert messages == ["transition #4 (measured): unknown dest phase 'compat'"]


# -- graph problems name the phase's or the transition's line ------------------


def test_an_unreachable_phase_is_reported_with_a_misspelt_guard() -> None:
    """The report of issue 11: both problems in one pass, each on its line."""
    text = edit(
        STOCK, '"is_over_emergency_line"]\nreason', '"is_over_emergncy_line"]\nreason'
    )
    text = edit(text, "[states]\n", '[states]\nidle = { decision = "run_tools" }\n')
    text += '\n[[transitions]]\ntrigger = "tools_finished"\nsource = "idle"\n'
    text += 'dest = "start"\nactions = ["record_results"]\n'

    problems = problems_of(text, "t.toml")

    assert [str(p) for p in problems] == [
        "transition #4 (measured): unknown guard 'is_over_emergncy_line'"
        " (did you mean 'is_over_emergency_line'?)",
        "phase 'idle' is unreachable from 'start'",
    ]
    assert [p.line for p in problems] == [
        line_with(text, "is_over_emergncy_line"),
        line_with(text, "idle = "),
    ]
    assert [p.field for p in problems] == [
        "transitions[3].conditions[0]",
        "states.idle",
    ]


def test_a_phase_in_a_table_of_its_own_is_found_by_its_header() -> None:
    text = STOCK + '\n[states.review]\ndecision = "run_tols"\n'

    problems = problems_of(text)

    assert [(p.message, p.line, p.suggestion) for p in problems] == [
        (
            "state 'review': unknown decision 'run_tols' (known: call_llm, compact,"
            " fail, finish, measure, pause, run_tools; use effect = NAME for a"
            " custom one)",
            line_with(text, '"run_tols"'),
            "run_tools",
        ),
        (
            "phase 'review' is unreachable from 'start'",
            line_with(text, "[states.review]"),
            None,
        ),
        (
            "phase 'review' is a dead end: no transition leaves it",
            line_with(text, "[states.review]"),
            None,
        ),
    ]


def inline_transitions(data: dict[str, Any]) -> str:
    """A machine file with its transitions as one inline array, one per line."""
    rows = [
        "{ " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in t.items()) + " },"
        for t in data["transitions"]
    ]
    states = [
        f"{name} = {{ "
        + ", ".join(f"{k} = {json.dumps(v)}" for k, v in body.items())
        + " }"
        for name, body in data["states"].items()
    ]
    return "\n".join(
        [
            f"name = {json.dumps(data['name'])}",
            f"initial = {json.dumps(data['initial'])}",
            f"terminal = {json.dumps(data['terminal'])}",
            "transitions = [",
            *rows,
            "]",
            "[states]",
            *states,
        ]
    )


def test_a_transition_in_an_inline_array_is_found_on_its_line() -> None:
    data = tomllib.loads(STOCK)
    data["transitions"][20]["dest"] = "don"
    text = inline_transitions(data)

    problems = problems_of(text)

    assert [(p.line, p.field, p.suggestion) for p in problems] == [
        (line_with(text, '"don"'), "transitions[20].dest", "done")
    ]
    assert text.splitlines()[line_with(text, '"don"') - 1].startswith("{ trigger = ")


def test_a_missing_key_is_reported_on_its_table() -> None:
    text = edit(STOCK, 'reason = "emergency"\n', "")

    (problem,) = problems_of(text)

    assert problem.message.startswith("transition #4 (measured): into 'compact'")
    assert (problem.field, problem.value) == ("transitions[3].reason", None)
    assert problem.line is not None
    assert text.splitlines()[problem.line - 1] == "[[transitions]]"


@pytest.mark.parametrize(
    ("terminal", "missing"),
    [
        ("terminal = []\n", ["done", "failed"]),
        ("", ["done", "failed"]),
        ('terminal = ["done"]\n', ["failed"]),
    ],
)
def test_a_phase_left_out_of_terminal_is_one_problem(
    terminal: str, missing: list[str]
) -> None:
    # Leaving `failed` out of `terminal` was nineteen problems: each way into
    # it "without counting the pass", a cycle on its own run_cancelled, a
    # dead end. It is one, on its phase, with the line to write.
    text = STOCK.replace('terminal = ["done", "failed"]\n', terminal)

    problems = problems_of(text)

    assert [(p.field, p.value, p.message) for p in problems] == [
        (
            f"states.{phase}",
            phase,
            f"phase {phase!r} emits {'finish' if phase == 'done' else 'fail'} but"
            ' is not terminal: add it to terminal (terminal = ["done", "failed"])',
        )
        for phase in missing
    ]


@pytest.mark.parametrize(
    "written",
    ["1", '["has_tool_calls", 2]', '{ guard = "has_tool_calls" }', "true"],
)
def test_guards_that_are_not_names_are_one_problem(written: str) -> None:
    # `conditions = 1` was read as no conditions: three more problems
    # followed, the next transition "never fires" among them, each pointing
    # away from the line to fix.
    text = edit(
        STOCK,
        'conditions = ["has_tool_calls"]',
        f"conditions = {written}",
    )

    (problem,) = problems_of(text)

    assert problem.field == "transitions[7].conditions"
    assert problem.line == line_with(text, f"conditions = {written}")
    assert problem.message.startswith(
        "transition #8 (model_replied) conditions must be a string or a list of"
        " strings, got "
    )


def test_an_unknown_initial_phase_skips_the_reachability_check() -> None:
    problems = problems_of(edit(STOCK, 'initial = "start"', 'initial = "zzz"'))

    assert [(p.message, p.suggestion) for p in problems] == [
        ("unknown phase 'zzz' named by initial/terminal", None)
    ]


def test_a_state_that_is_not_a_table_is_still_a_known_phase() -> None:
    text = edit(STOCK, 'compact           = { decision = "compact" }', "compact = 7")

    problems = problems_of(text)

    assert problems[0].message == "state 'compact' must be a table"
    assert problems[0].line == line_with(text, "compact = 7")
    assert not [p for p in problems if "unknown" in p.message]


# -- the format ------------------------------------------------------------------


def test_the_error_lists_one_problem_per_line_with_file_and_line() -> None:
    error = DefinitionError(
        "m.toml",
        [
            Problem(message="unknown guard 'is_nope'", line=7, suggestion="is_no"),
            Problem(message="'name' must be a non-empty string, got None"),
            "a plain string",
        ],
    )

    assert str(error) == (
        "m.toml:7: unknown guard 'is_nope' (did you mean 'is_no'?)\n"
        "m.toml: 'name' must be a non-empty string, got None\n"
        "m.toml: a plain string"
    )
    assert error.problems[2] == Problem(message="a plain string")
    assert isinstance(error, ValueError)


def test_a_syntax_error_names_its_line() -> None:
    (problem,) = problems_of('name = "turn"\n[states\nstart = {}\n')

    assert problem.message.startswith("not valid TOML: ")
    assert problem.line == 2


# -- every machine shipped loads; any one-name mutation is caught on its line --


@pytest.mark.parametrize("path", MACHINES, ids=lambda p: p.name)
def test_the_shipped_machines_load(path: Any) -> None:
    spec = MachineSpec.from_toml(path.read_text(), source=str(path))

    assert spec.source == str(path)


NAMES = (
    GUARDS.keys()
    | REDUCERS.keys()
    | FAILURES.keys()
    | BUILTIN_TRIGGERS
    | DECISION_KINDS
    | {r.value for r in CompactReason}
)
"""Every name a machine file may use, but its phases."""


def name_sites(text: str) -> list[tuple[int, int, int]]:
    """Every quoted name a file uses (not declares): (start, end, line).

    Phases count where they are referred to (initial, terminal, source,
    dest), not where `[states]` declares them; comments are skipped.
    """
    phases = set(tomllib.loads(text)["states"])
    sites = []
    offset = 0
    for number, line in enumerate(text.splitlines(keepends=True), start=1):
        code = line.split("#", 1)[0]
        for found in re.finditer(r'"([A-Za-z_]+)"', code):
            if found.group(1) in NAMES | phases:
                sites.append((offset + found.start(1), offset + found.end(1), number))
        offset += len(line)
    return sites


@settings(max_examples=sized(200))
@given(
    path=st.sampled_from(MACHINES),
    data=st.data(),
    name=st.from_regex(r"[A-Za-z][A-Za-z0-9_-]{0,14}", fullmatch=True),
)
def test_replacing_any_name_is_a_problem_on_its_line(
    path: Any, data: st.DataObject, name: str
) -> None:
    text = path.read_text()
    start, end, line = data.draw(st.sampled_from(name_sites(text)))
    mutated = text[:start] + name + text[end:]
    if name in NAMES | set(tomllib.loads(text)["states"]):
        return  # the file may still be valid: nothing to find

    problems = problems_of(mutated)

    assert line in [p.line for p in problems], [str(p) for p in problems]


def test_an_error_that_is_not_a_string_is_a_problem_not_a_crash() -> None:
    data = tomllib.loads(STOCK)
    data["transitions"][1]["error"] = ["max_turns_exceeded"]

    outcome = load_or_problems(data)

    assert isinstance(outcome, tuple)
    assert [(p.field, p.value) for p in outcome] == [
        ("transitions[1].error", ["max_turns_exceeded"])
    ]


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)


def subtrees(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """The path of every value inside a parsed file, the file's own included."""
    items: list[tuple[Any, Any]] = []
    if isinstance(value, dict):
        items = list(value.items())
    elif isinstance(value, list):
        items = list(enumerate(value))
    out = [prefix]
    for step, inner in items:
        out += subtrees(inner, (*prefix, step))
    return out


@settings(max_examples=sized(200))
@given(data=st.data(), replacement=JSON)
def test_any_value_anywhere_is_a_problem_not_a_crash(
    data: st.DataObject, replacement: Any
) -> None:
    parsed = tomllib.loads(STOCK)
    path = data.draw(st.sampled_from(subtrees(parsed)[1:]))
    *parents, last = path
    holder = parsed
    for step in parents:
        holder = holder[step]
    holder[last] = replacement

    outcome = load_or_problems(parsed)

    assert isinstance(outcome, MachineSpec) or outcome


def load_or_problems(data: dict[str, Any]) -> MachineSpec | tuple[Problem, ...]:
    try:
        return MachineSpec.from_dict(data)
    except DefinitionError as error:
        return error.problems


def test_a_wildcard_among_phases_is_named_as_one() -> None:
    # It was reported as an unknown phase '*', which it is not.
    text = edit(
        STOCK,
        'source = "run_tools"\ndest = "start"',
        'source = ["*", "run_tools"]\ndest = "start"',
    )

    (problem,) = problems_of(text)

    assert problem.message == (
        "transition #14 (tools_finished): '*' (every phase) is a source on its"
        ' own: write source = "*", or list the phases'
    )
    assert (problem.field, problem.value) == ("transitions[13].source[0]", "*")
