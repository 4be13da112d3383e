"""Mermaid and DOT renderings of a machine: deterministic, guards on the edges."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest

from tests.helpers import load_turn_spec
from turnfsm.core import MachineSpec, render_dot, render_mermaid

Renderer = Callable[[MachineSpec], str]
RENDERERS = [render_mermaid, render_dot]
RENDERER_IDS = ["mermaid", "dot"]

MERMAID_EDGE = re.compile(r"^    (\w+) --> (\w+) : (.+)$")
DOT_EDGE = re.compile(r'^  "(\w+)" -> "(\w+)" \[label="(.+)"\];$')

SMALL = """
name = "small"
initial = "start"
terminal = ["done", "failed"]
signals = ["approved"]

[states]
start = { decision = "measure" }
wait = { effect = "ask_human" }
compact = { decision = "compact" }
done = { decision = "finish" }
failed = { decision = "fail" }

[[transitions]]
trigger = "measured"
source = "start"
dest = "failed"
conditions = ["is_compaction_limit_reached"]
error = "compaction_limit_exceeded"

[[transitions]]
trigger = "measured"
source = "start"
dest = "compact"
conditions = ["is_over_emergency_line", "is_over_threshold_line"]
unless = ["is_turn_limit_reached"]
reason = "emergency"

[[transitions]]
trigger = "measured"
source = "start"
dest = "wait"

[[transitions]]
trigger = "approved"
source = "wait"
dest = "done"

[[transitions]]
trigger = "compaction_noop"
source = "compact"
dest = "failed"
conditions = ["is_no_progress"]
error = "compaction_stalled"

[[transitions]]
trigger = "compaction_noop"
source = "compact"
dest = "start"
actions = ["count_compaction"]

[[transitions]]
trigger = "run_cancelled"
source = "*"
dest = "failed"
error = "cancelled"
"""


def edges(text: str, pattern: re.Pattern[str]) -> list[tuple[str, str, str]]:
    found = []
    for line in text.splitlines():
        match = pattern.match(line)
        if match is not None:
            found.append((match[1], match[2], match[3]))
    return found


@pytest.mark.parametrize("render", RENDERERS, ids=RENDERER_IDS)
def test_rendering_is_deterministic(render: Renderer) -> None:
    spec = load_turn_spec()

    first, again = render(spec), render(spec)
    other = render(load_turn_spec())

    assert first == again == other


@pytest.mark.parametrize(
    ("render", "pattern"),
    [(render_mermaid, MERMAID_EDGE), (render_dot, DOT_EDGE)],
    ids=RENDERER_IDS,
)
def test_every_transition_is_drawn_with_its_guards_and_outcome(
    render: Renderer, pattern: re.Pattern[str]
) -> None:
    spec = load_turn_spec()
    expected = [
        (source, t.dest, t)
        for t in spec.transitions
        if t.dest is not None
        for source in t.sources
    ]

    drawn = edges(render(spec), pattern)

    assert [(s, d) for s, d, _ in drawn] == [(s, d) for s, d, _ in expected]
    for (_, _, label), (_, _, t) in zip(drawn, expected, strict=True):
        words = label.replace("[", " ").replace("]", " ").split()
        assert words[0] == t.trigger
        assert set(t.conditions) <= set(words)
        if t.reason is not None:
            assert label.endswith(f"/ {t.reason.value}")
        if t.error is not None:
            assert label.endswith(f"/ {t.error}")


def test_internal_transitions_are_not_drawn() -> None:
    text = render_mermaid(load_turn_spec()) + render_dot(load_turn_spec())

    assert ("run_started" in text, "message_injected" in text) == (False, False)


def test_mermaid_of_the_stock_machine() -> None:
    lines = render_mermaid(load_turn_spec()).splitlines()

    assert lines[:6] == [
        "---",
        "title: turn (generated from turn.toml; do not edit)",
        "---",
        "stateDiagram-v2",
        "    [*] --> start",
        "    start : start / measure",
    ]
    for line in [
        "    compact_and_retry : compact_and_retry / compact",
        "    start --> failed : measured [is_turn_limit_reached] / max_turns_exceeded",
        "    start --> failed : measured [is_over_emergency_line and"
        " is_compaction_limit_reached] / compaction_limit_exceeded",
        "    start --> compact : measured [is_over_emergency_line] / emergency",
        "    start --> compact : measured [is_over_threshold_line and not"
        " is_compaction_limit_reached] / threshold_exceeded",
        "    start --> call_llm : measured",
        "    call_llm --> compact_and_retry : context_overflowed"
        " [has_overflow_retries_left] / overflow",
        "    compact --> failed : compaction_result [is_no_progress]"
        " / compaction_stalled",
        "    compact_and_retry --> failed : compaction_noop [is_no_progress]"
        " / compaction_stalled",
        "    run_tools --> failed : run_cancelled / cancelled",
    ]:
        assert line in lines
    assert lines[-2:] == ["    done --> [*]", "    failed --> [*]"]


def test_dot_of_the_stock_machine() -> None:
    lines = render_dot(load_turn_spec()).splitlines()

    assert lines[0] == 'digraph "turn" {'
    assert lines[-1] == "}"
    for line in [
        '  "__start" -> "start";',
        '  "start" [label="start\\n/measure"];',
        '  "done" [label="done\\n/finish", peripheries=2];',
        '  "failed" [label="failed\\n/fail", peripheries=2];',
        '  "start" -> "compact" [label="measured [is_over_emergency_line]'
        ' / emergency"];',
        '  "compact" -> "start" [label="compaction_result"];',
    ]:
        assert line in lines


def test_mermaid_of_a_custom_machine() -> None:
    spec = MachineSpec.from_toml(SMALL)

    assert render_mermaid(spec) == (
        "---\n"
        "title: small (generated from small.toml; do not edit)\n"
        "---\n"
        "stateDiagram-v2\n"
        "    [*] --> start\n"
        "    start : start / measure\n"
        "    wait : wait / effect ask_human\n"
        "    compact : compact / compact\n"
        "    done : done / finish\n"
        "    failed : failed / fail\n"
        "    start --> failed : measured [is_compaction_limit_reached]"
        " / compaction_limit_exceeded\n"
        "    start --> compact : measured [is_over_emergency_line and"
        " is_over_threshold_line and not is_turn_limit_reached] / emergency\n"
        "    start --> wait : measured\n"
        "    wait --> done : approved\n"
        "    compact --> failed : compaction_noop [is_no_progress]"
        " / compaction_stalled\n"
        "    compact --> start : compaction_noop\n"
        "    compact --> failed : run_cancelled / cancelled\n"
        "    start --> failed : run_cancelled / cancelled\n"
        "    wait --> failed : run_cancelled / cancelled\n"
        "    done --> [*]\n"
        "    failed --> [*]\n"
    )


def test_dot_of_a_custom_machine() -> None:
    spec = MachineSpec.from_toml(SMALL)

    assert render_dot(spec) == (
        'digraph "small" {\n'
        "  rankdir=TB;\n"
        '  node [shape=box, style="rounded", fontname="Helvetica"];\n'
        '  edge [fontname="Helvetica", fontsize=9];\n'
        '  "__start" [shape=point, label=""];\n'
        '  "__start" -> "start";\n'
        '  "start" [label="start\\n/measure"];\n'
        '  "wait" [label="wait\\n/effect ask_human"];\n'
        '  "compact" [label="compact\\n/compact"];\n'
        '  "done" [label="done\\n/finish", peripheries=2];\n'
        '  "failed" [label="failed\\n/fail", peripheries=2];\n'
        '  "start" -> "failed" [label="measured [is_compaction_limit_reached]'
        ' / compaction_limit_exceeded"];\n'
        '  "start" -> "compact" [label="measured [is_over_emergency_line and'
        ' is_over_threshold_line and not is_turn_limit_reached] / emergency"];\n'
        '  "start" -> "wait" [label="measured"];\n'
        '  "wait" -> "done" [label="approved"];\n'
        '  "compact" -> "failed" [label="compaction_noop [is_no_progress]'
        ' / compaction_stalled"];\n'
        '  "compact" -> "start" [label="compaction_noop"];\n'
        '  "compact" -> "failed" [label="run_cancelled / cancelled"];\n'
        '  "start" -> "failed" [label="run_cancelled / cancelled"];\n'
        '  "wait" -> "failed" [label="run_cancelled / cancelled"];\n'
        "}\n"
    )
