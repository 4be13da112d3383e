"""Mermaid and DOT renderings of a machine: every transition on its edge, the
failures grouped and grey, and, with traffic, the path runs took as a heat map.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable

import attrs
import pytest

from tests.helpers import approval_toml, load_turn_spec
from turnfsm.core import (
    MachineSpec,
    Traffic,
    TransitionSpec,
    render_dot,
    render_mermaid,
    tally,
)
from turnfsm.errors import ConfigError

X = "\u00d7"  # the multiplication sign of "x6": how often an edge fired
Renderer = Callable[[MachineSpec], str]
RENDERERS = [render_mermaid, render_dot]
RENDERER_IDS = ["mermaid", "dot"]

SMALL = """
name = "small"
initial = "start"
terminal = ["done", "failed"]
signals = ["approved"]

[states]
start = { decision = "measure" }
wait = { effect = "ask_human" }
compact = { decision = "compact" }
done = { decision = "finish", on_enter = ["commit_pending"] }
failed = { decision = "fail" }

[[transitions]]
trigger = "run_started"
source = "start"
actions = ["record_start"]

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
trigger = "compaction_result"
source = "compact"
dest = "failed"
error = "compaction_stalled"

[[transitions]]
trigger = "compactor_failed"
source = "*"
dest = "failed"
error = "compaction_failed"

[[transitions]]
trigger = "compaction_overflowed"
source = "*"
dest = "failed"
error = "context_exceeded"

[[transitions]]
trigger = "compaction_circuit_opened"
source = "*"
dest = "failed"
error = "compaction_circuit_open"

[[transitions]]
trigger = "run_cancelled"
source = "*"
dest = "failed"
error = "cancelled"
"""

# -- reading the renderings back ------------------------------------------


@attrs.frozen
class Drawn:
    """One drawn edge: the phases it leaves, where it goes, its label, its looks."""

    sources: tuple[str, ...]
    dest: str
    label: str  # the label's lines joined by spaces, indentation dropped
    style: str


def one_line(t: TransitionSpec) -> str:
    """The label a transition should carry: ``trigger [guards] / outcome``."""
    parts = [t.trigger]
    guards = [*t.conditions, *(f"not {g}" for g in t.unless)]
    if guards:
        parts.append(f"[{' and '.join(guards)}]")
    outcome = t.reason.value if t.reason is not None else t.error
    if outcome is not None:
        parts.append(f"/ {outcome}")
    return " ".join(parts)


def expected_edges(spec: MachineSpec) -> dict[tuple[str, str], str]:
    """``{(source, dest): label}`` the plain rendering of `spec` must draw."""
    out: dict[tuple[str, str], list[str]] = defaultdict(list)
    for t in spec.transitions:
        if t.dest is None:
            continue
        sources = [f"__any_{t.dest}"] if t.is_wildcard else t.sources
        for source in sources:
            out[(source, t.dest)].append(one_line(t))
    return {key: " ".join(labels) for key, labels in out.items()}


def _joined(lines: list[str]) -> str:
    return " ".join(line.strip() for line in lines if line.strip())


DOT_EDGE = re.compile(r'^  "([^"]+)" -> "([^"]+)" \[(.*)\];$')
DOT_LABEL = re.compile(r'label="((?:[^"\\]|\\.)*)"')


def dot_edges(text: str) -> list[Drawn]:
    raw = [m.groups() for line in text.splitlines() if (m := DOT_EDGE.match(line))]
    legs = defaultdict(list)
    for source, dest, _ in raw:
        if dest.startswith("__junction_"):
            legs[dest].append(source)
    drawn = []
    for source, dest, style in raw:
        if dest.startswith("__junction_") or source == "__start":
            continue
        label = DOT_LABEL.search(style)
        assert label is not None, style
        lines = re.split(r"\\[nl]", label[1])
        sources = tuple(legs[source]) if source in legs else (source,)
        drawn.append(Drawn(sources, dest, _joined(lines), style))
    return drawn


MERMAID_LINK = re.compile(
    r'^    (\w+)(?:\(\( \)\))? (-->|-\.->|---|-\.-)(?:\|"(.*)"\|)? (\w+)$'
)
MERMAID_STYLE = re.compile(r"^    linkStyle ([\d,]+) (.*)$")


def mermaid_edges(text: str) -> list[Drawn]:
    links = [
        m.groups() for line in text.splitlines() if (m := MERMAID_LINK.match(line))
    ]
    styles = {}
    for line in text.splitlines():
        if (m := MERMAID_STYLE.match(line)) is not None:
            for number in m[1].split(","):
                styles[int(number)] = m[2]
    legs = defaultdict(list)
    for source, arrow, _, dest in links:
        if arrow in ("---", "-.-"):
            legs[dest].append(source)
    drawn = []
    for number, (source, arrow, label, dest) in enumerate(links):
        if label is None:
            continue
        lines = label.replace("#160;", " ").split("<br/>")
        sources = tuple(legs[source]) if source in legs else (source,)
        style = f"{arrow} {styles.get(number, '')}"
        drawn.append(Drawn(sources, dest, _joined(lines), style))
    return drawn


def drawn_pairs(drawn: list[Drawn]) -> dict[tuple[str, str], str]:
    out = {}
    for edge in drawn:
        for source in edge.sources:
            assert (source, edge.dest) not in out, f"{source} -> {edge.dest} twice"
            out[(source, edge.dest)] = edge.label
    return out


def approval_spec() -> MachineSpec:
    return MachineSpec.from_toml(approval_toml())


SPECS = [load_turn_spec, approval_spec, lambda: MachineSpec.from_toml(SMALL)]
SPEC_IDS = ["turn", "approval", "small"]
READERS = [(render_dot, dot_edges), (render_mermaid, mermaid_edges)]
READER_IDS = ["dot", "mermaid"]

# -- the plain diagram ------------------------------------------------------


@pytest.mark.parametrize("render", RENDERERS, ids=RENDERER_IDS)
def test_rendering_is_deterministic(render: Renderer) -> None:
    spec = load_turn_spec()

    first, again = render(spec), render(spec)
    other = render(load_turn_spec())

    assert first == again == other


@pytest.mark.parametrize("make", SPECS, ids=SPEC_IDS)
@pytest.mark.parametrize(("render", "read"), READERS, ids=READER_IDS)
def test_every_transition_is_drawn_once_with_its_guards_and_outcome(
    make: Callable[[], MachineSpec],
    render: Renderer,
    read: Callable[[str], list[Drawn]],
) -> None:
    spec = make()

    assert drawn_pairs(read(render(spec))) == expected_edges(spec)


@pytest.mark.parametrize(("render", "read"), READERS, ids=READER_IDS)
def test_failures_are_dashed_and_grey_the_rest_plain(
    render: Renderer, read: Callable[[str], list[Drawn]]
) -> None:
    for edge in read(render(load_turn_spec())):
        is_failure = edge.dest == "failed"
        assert ("#8c8c8c" in edge.style) is is_failure, edge
        assert ("dashed" in edge.style or "-.->" in edge.style) is is_failure, edge


def test_phases_that_fail_alike_share_one_edge_and_a_wildcard_is_drawn_once() -> None:
    edges = dot_edges(render_dot(load_turn_spec()))

    shared = [e.sources for e in edges if len(e.sources) > 1]
    cancelled = [e.sources for e in edges if "run_cancelled" in e.label]

    assert shared == [("compact", "compact_and_retry")]
    assert cancelled == [("__any_failed",)]


def test_internal_transitions_are_not_drawn() -> None:
    text = render_mermaid(load_turn_spec()) + render_dot(load_turn_spec())

    assert ("run_started" in text, "message_injected" in text) == (False, False)


def test_dot_draws_top_to_bottom_with_the_terminal_phases_at_the_bottom() -> None:
    lines = render_dot(load_turn_spec()).splitlines()

    assert lines[0] == 'digraph "turn" {'
    assert lines[-1] == "}"
    for line in [
        "  rankdir=TB;",
        '  "__start" -> "start";',
        '  "start" [label="start\\n/measure"];',
        '  "done" [label="done\\n/finish", peripheries=2];',
        '  "failed" [label="failed\\n/fail", peripheries=2];',
        '  "__any_failed" [shape=plaintext, label="any phase", fontcolor="#8c8c8c"];',
        '  { rank=sink; "done"; "failed"; "__any_failed"; }',
    ]:
        assert line in lines


def test_labels_break_between_trigger_guards_and_outcome() -> None:
    lines = render_dot(load_turn_spec()).splitlines()

    assert (
        '  "call_llm" -> "compact_and_retry" [label="context_overflowed\\n'
        '[has_overflow_retries_left]\\n/ overflow"];'
    ) in lines


def test_mermaid_of_the_stock_machine() -> None:
    lines = render_mermaid(load_turn_spec()).splitlines()

    assert lines[:6] == [
        "---",
        'title: "turn (generated from turn.toml; do not edit)"',
        "---",
        "flowchart TB",
        "    __start(( )) --> start",
        '    start("start<br/>/measure")',
    ]
    for line in [
        '    compact_and_retry("compact_and_retry<br/>/compact")',
        '    failed(["failed<br/>/fail"])',
        '    __any_failed["any phase"]:::any',
        '    call_llm -->|"model_replied<br/>[has_tool_calls]"| run_tools',
        "    compact -.- __junction_12",
        "    compact_and_retry -.- __junction_12",
        '    __any_failed -.->|"run_cancelled<br/>/ cancelled"| failed',
    ]:
        assert line in lines


def test_dot_of_a_custom_machine() -> None:
    spec = MachineSpec.from_toml(SMALL)

    assert render_dot(spec) == (
        'digraph "small" {\n'
        "  rankdir=TB;\n"
        "  ordering=in;\n"
        "  nodesep=0.25;\n"
        "  ranksep=0.5;\n"
        '  node [shape=box, style="rounded", fontname="Helvetica", fontsize=11];\n'
        '  edge [fontname="Helvetica", fontsize=10];\n'
        '  "__start" [shape=point, label=""];\n'
        '  "__start" -> "start";\n'
        '  "start" [label="start\\n/measure"];\n'
        '  "wait" [label="wait\\n/effect ask_human"];\n'
        '  "compact" [label="compact\\n/compact"];\n'
        '  "done" [label="done\\n/finish", peripheries=2];\n'
        '  "failed" [label="failed\\n/fail", peripheries=2];\n'
        '  "__any_failed" [shape=plaintext, label="any phase", fontcolor="#8c8c8c"];\n'
        '  { rank=sink; "done"; "failed"; "__any_failed"; }\n'
        '  "compact" -> "start" [label="compaction_noop"];\n'
        '  "wait" -> "done" [label="approved"];\n'
        '  "start" -> "wait" [label="measured"];\n'
        '  "start" -> "compact" [label="measured\\n[is_over_emergency_line\\n'
        'and is_over_threshold_line\\nand not is_turn_limit_reached]\\n/ emergency"];\n'
        '  "start" -> "failed" [label="measured\\n[is_compaction_limit_reached]\\n'
        '/ compaction_limit_exceeded", color="#8c8c8c", fontcolor="#8c8c8c", '
        "style=dashed];\n"
        '  "compact" -> "failed" [label="compaction_noop\\l  [is_no_progress]\\l'
        '  / compaction_stalled\\lcompaction_result\\l  / compaction_stalled\\l", '
        'color="#8c8c8c", fontcolor="#8c8c8c", style=dashed];\n'
        '  "__any_failed" -> "failed" [label="compactor_failed\\l'
        "  / compaction_failed\\lcompaction_overflowed\\l  / context_exceeded\\l"
        "compaction_circuit_opened\\l  / compaction_circuit_open\\lrun_cancelled\\l"
        '  / cancelled\\l", color="#8c8c8c", fontcolor="#8c8c8c", style=dashed];\n'
        "}\n"
    )


def test_mermaid_of_a_custom_machine() -> None:
    spec = MachineSpec.from_toml(SMALL)

    assert render_mermaid(spec) == (
        "---\n"
        'title: "small (generated from small.toml; do not edit)"\n'
        "---\n"
        "flowchart TB\n"
        "    __start(( )) --> start\n"
        '    start("start<br/>/measure")\n'
        '    wait("wait<br/>/effect ask_human")\n'
        '    compact("compact<br/>/compact")\n'
        '    done(["done<br/>/finish"])\n'
        '    failed(["failed<br/>/fail"])\n'
        '    __any_failed["any phase"]:::any\n'
        '    compact -->|"compaction_noop"| start\n'
        '    wait -->|"approved"| done\n'
        '    start -->|"measured"| wait\n'
        '    start -->|"measured<br/>[is_over_emergency_line<br/>and'
        " is_over_threshold_line<br/>and not is_turn_limit_reached]<br/>"
        '/ emergency"| compact\n'
        '    start -.->|"measured<br/>[is_compaction_limit_reached]<br/>'
        '/ compaction_limit_exceeded"| failed\n'
        '    compact -.->|"compaction_noop<br/>#160;#160;[is_no_progress]<br/>'
        "#160;#160;/ compaction_stalled<br/>compaction_result<br/>"
        '#160;#160;/ compaction_stalled"| failed\n'
        '    __any_failed -.->|"compactor_failed<br/>#160;#160;/ compaction_failed'
        "<br/>compaction_overflowed<br/>#160;#160;/ context_exceeded<br/>"
        "compaction_circuit_opened<br/>#160;#160;/ compaction_circuit_open<br/>"
        'run_cancelled<br/>#160;#160;/ cancelled"| failed\n'
        "    linkStyle 5 stroke:#8c8c8c,color:#8c8c8c\n"
        "    linkStyle 6 stroke:#8c8c8c,color:#8c8c8c\n"
        "    linkStyle 7 stroke:#8c8c8c,color:#8c8c8c\n"
        "    classDef any fill:none,stroke:none,color:#8c8c8c\n"
    )


ODD = """
name = "odd"
initial = "start"
terminal = ["end", "failed"]
signals = ["greeted"]

[states]
start = { decision = "measure" }
"say \\"hi\\"" = { effect = "greet" }
end = { decision = "finish", on_enter = ["commit_pending"] }
failed = { decision = "fail" }

[[transitions]]
trigger = "run_started"
source = "start"
actions = ["record_start"]

[[transitions]]
trigger = "measured"
source = "start"
dest = "failed"
conditions = ["is_turn_limit_reached"]
error = "max_turns_exceeded"

[[transitions]]
trigger = "measured"
source = "start"
dest = "say \\"hi\\""

[[transitions]]
trigger = "greeted"
source = "say \\"hi\\""
dest = "end"

[[transitions]]
trigger = "run_cancelled"
source = "*"
dest = "failed"
error = "cancelled"
"""


def test_odd_phase_names_are_escaped() -> None:
    spec = MachineSpec.from_toml(ODD)

    mermaid, dot = render_mermaid(spec), render_dot(spec)

    # `end` is a keyword of a Mermaid flowchart; a quote ends a DOT string.
    assert "    end_([" not in mermaid
    assert '    phase_656e64(["end<br/>/finish"])' in mermaid
    hexed = "phase_" + b'say "hi"'.hex()
    assert f'    start -->|"measured"| {hexed}' in mermaid
    assert f'    {hexed}("say #quot;hi#quot;<br/>/effect greet")' in mermaid
    assert '  "start" -> "say \\"hi\\"" [label="measured"];' in dot.splitlines()


def test_no_phase_name_merges_with_another_node() -> None:
    # A phase named `__start` was drawn as the start marker (a loop onto
    # itself, one node fewer), and one named as an escaped name is escaped
    # too, so it is not drawn as the phase `end`.
    toml = re.sub(r"\bstart\b", "__start", ODD).replace('say \\"hi\\"', "phase_656e64")
    spec = MachineSpec.from_toml(toml)

    mermaid, dot = render_mermaid(spec), render_dot(spec)

    assert "    ___start(( )) --> __start" in mermaid
    assert '    __start("__start<br/>/measure")' in mermaid
    assert '    phase_656e64(["end<br/>/finish"])' in mermaid
    hexed = "phase_" + b"phase_656e64".hex()
    assert f'    {hexed}("phase_656e64<br/>/effect greet")' in mermaid
    assert '    ___any_failed["any phase"]:::any' in mermaid
    assert '  "___start" -> "__start";' in dot.splitlines()
    assert '  "___any_failed" [shape=plaintext' in dot
    declared = re.findall(r"^    (\w+)[(\[]", mermaid, re.MULTILINE)
    assert len(declared) == len(set(declared)) == len(spec.phases) + 2


def test_markup_in_a_name_is_drawn_as_text_not_read_as_html() -> None:
    # Mermaid reads its labels as HTML: a phase named `<b>x</b>` was drawn
    # bold, and an `<img ...>` in a name was markup in the page.
    name = "<img src=x> & <b>hi</b>"
    spec = MachineSpec.from_toml(ODD.replace('say \\"hi\\"', name))

    mermaid = render_mermaid(spec)

    assert "<img" not in mermaid
    assert "<b>" not in mermaid
    hexed = "phase_" + name.encode().hex()
    escaped = "#lt;img src=x#gt; #amp; #lt;b#gt;hi#lt;/b#gt;"
    assert f'    {hexed}("{escaped}<br/>/effect greet")' in mermaid


# -- traffic: the path runs took --------------------------------------------

# One run of the demo: six model calls, five tool rounds, a threshold pass
# and an emergency pass (indexes are turn.toml's transitions).
DEMO = tally(
    [(0, "start", None)]
    + [(6, "start", 1000 + n) for n in range(6)]
    + [(7, "call_llm", 1000)] * 5
    + [(13, "run_tools", 1000)] * 5
    + [(4, "start", 6818), (18, "compact", 1853)]
    + [(3, "start", 7860), (18, "compact", 6204)]
    + [(9, "call_llm", 6204)]
)


def test_tally_counts_each_edge_and_keeps_the_most_tokens() -> None:
    assert DEMO[(6, "start")] == Traffic(count=6, tokens=1005)
    assert DEMO[(18, "compact")] == Traffic(count=2, tokens=6204)
    assert DEMO[(0, "start")] == Traffic(count=1, tokens=None)
    assert list(DEMO)[:3] == [(0, "start"), (6, "start"), (7, "call_llm")]


def test_traffic_adds_up() -> None:
    one = Traffic(count=2, tokens=10)

    assert one + Traffic(count=3, tokens=None) == Traffic(count=5, tokens=10)
    assert Traffic(count=1) + Traffic(count=1) == Traffic(count=2, tokens=None)
    assert one + Traffic(count=1, tokens=40) == Traffic(count=3, tokens=40)


@pytest.mark.parametrize(("render", "read"), READERS, ids=READER_IDS)
def test_the_fired_edges_are_drawn_alone_with_their_counts(
    render: Callable[..., str], read: Callable[[str], list[Drawn]]
) -> None:
    spec = load_turn_spec()

    drawn = read(render(spec, DEMO))

    fired = {(e.sources, e.dest, e.label) for e in drawn if f"{X}" in e.label}
    assert fired == {
        (("start",), "start", f"run_started {X}1"),
        (("start",), "call_llm", f"measured {X}6, max 1,005 tokens"),
        (
            ("call_llm",),
            "run_tools",
            f"model_replied [has_tool_calls] {X}5, max 1,000 tokens",
        ),
        (("run_tools",), "start", f"tools_finished {X}5, max 1,000 tokens"),
        (
            ("start",),
            "compact",
            "measured [is_over_threshold_line and not is_compaction_limit_reached"
            " and not is_threshold_line_spent]"
            f" / threshold_exceeded {X}1, max 6,818 tokens",
        ),
        (
            ("start",),
            "compact",
            f"measured [is_over_emergency_line] / emergency {X}1, max 7,860 tokens",
        ),
        (("compact",), "start", f"compaction_result {X}2, max 6,204 tokens"),
        (("call_llm",), "done", f"model_replied {X}1, max 6,204 tokens"),
    }
    # What did not fire stays on the diagram, greyed.
    rest = [e for e in drawn if f"{X}" not in e.label]
    assert all("#c4c4c4" in e.style for e in rest)
    still = {(e.sources, e.dest): e.label for e in rest}
    assert still[(("start",), "compact")] == (
        "measured [is_over_message_line and not is_compaction_limit_reached"
        " and not is_message_line_spent] / message_count"
    )


@pytest.mark.parametrize(("render", "read"), READERS, ids=READER_IDS)
def test_the_heat_follows_the_count(
    render: Callable[..., str], read: Callable[[str], list[Drawn]]
) -> None:
    drawn = {e.label: e.style for e in read(render(load_turn_spec(), DEMO))}

    hottest = drawn[f"measured {X}6, max 1,005 tokens"]
    once = drawn[
        f"measured [is_over_emergency_line] / emergency {X}1, max 7,860 tokens"
    ]

    assert "#b10026" in hottest
    assert "5.0" in hottest
    assert "#fd8d3c" in once
    assert "2.08" in once


def test_the_phases_on_the_path_are_marked_the_rest_greyed() -> None:
    lines = render_dot(load_turn_spec(), DEMO).splitlines()

    assert (
        '  "compact" [label="compact\\n/compact", color="#b10026", penwidth=2];'
        in lines
    )
    assert (
        '  "compact_and_retry" [label="compact_and_retry\\n/compact",'
        ' color="#c4c4c4", fontcolor="#c4c4c4"];'
    ) in lines
    mermaid = render_mermaid(load_turn_spec(), DEMO).splitlines()
    assert "    style done stroke:#b10026,stroke-width:2px" in mermaid
    assert "    style failed color:#c4c4c4,stroke:#c4c4c4" in mermaid


def test_a_wildcard_that_fired_leaves_from_its_phase() -> None:
    spec = load_turn_spec()
    cancel = next(i for i, t in enumerate(spec.transitions) if t.is_wildcard and t.dest)

    drawn = dot_edges(render_dot(spec, {(cancel, "run_tools"): Traffic(count=1)}))

    labels = {(e.sources, e.label) for e in drawn if "run_cancelled" in e.label}
    assert labels == {
        (("run_tools",), f"run_cancelled / cancelled {X}1"),
        (("__any_failed",), "run_cancelled / cancelled"),
    }


def test_a_wildcard_that_fired_everywhere_has_no_any_phase_left() -> None:
    spec = load_turn_spec()
    cancel = next(i for i, t in enumerate(spec.transitions) if t.is_wildcard and t.dest)
    everywhere = {
        (cancel, s): Traffic(count=1) for s in spec.transitions[cancel].sources
    }

    assert "__any_failed" not in render_dot(spec, everywhere)


@pytest.mark.parametrize("render", RENDERERS, ids=RENDERER_IDS)
def test_traffic_on_no_edge_of_the_machine_is_refused(
    render: Callable[..., str],
) -> None:
    spec = load_turn_spec()

    with pytest.raises(ConfigError, match=r"traffic=\(7, 'start'\)"):
        render(spec, {(7, "start"): Traffic(count=1)})
    with pytest.raises(ConfigError, match="a transition of 'turn'"):
        render(spec, {(99, "start"): Traffic(count=1)})


def test_a_title_goes_on_top() -> None:
    spec = load_turn_spec()

    dot = render_dot(spec, DEMO, title='turn: 1 run "x"').splitlines()
    mermaid = render_mermaid(spec, DEMO, title='turn: 1 run "x"').splitlines()

    assert '  labelloc=t; fontname="Helvetica"; label="turn: 1 run \\"x\\"";' in dot
    assert mermaid[1] == 'title: "turn: 1 run \\"x\\""'


def test_each_fired_edge_links_where_href_says_and_no_other_does() -> None:
    spec = load_turn_spec()
    asked: list[tuple[int, str]] = []

    def href(index: int, source: str) -> str:
        asked.append((index, source))
        return f'#step "{index}" from {source}'

    dot = render_dot(spec, DEMO, href=href)

    assert sorted(asked) == sorted(DEMO)  # every fired edge, once
    linked = [line for line in dot.splitlines() if "href=" in line]
    assert len(linked) == len(DEMO)
    for index, source in DEMO:
        wanted = f'href="#step \\"{index}\\" from {source}", target="_self"'
        assert sum(wanted in line for line in linked) == 1
    assert "href=" not in render_dot(spec, DEMO)
    assert "href=" not in render_dot(spec, href=href)  # nothing fired


def test_mermaid_names_the_file_it_was_generated_from() -> None:
    # A copy of turn.toml saved as mine.toml said "generated from turn.toml".
    spec = MachineSpec.from_toml(SMALL, source="machines/mine.toml")

    assert render_mermaid(spec).splitlines()[1] == (
        'title: "small (generated from mine.toml; do not edit)"'
    )
