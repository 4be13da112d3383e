"""MachineSpec -> Mermaid / DOT text (pure, deterministic).

A diagram has to read at the width of a page. It is drawn top to
bottom, the terminal phases on the bottom rank, and each pair of phases gets
one edge listing every transition between them. Transitions that fail the
run (those with an `error`) are drawn grey and dashed; two phases that fail
the same ways share one edge through a junction point; a wildcard
transition (``source = "*"``) is drawn once, from "any phase". Labels break
between a trigger, its guards and its outcome, at about 24 characters.

With `traffic` the diagram shows where some runs went: every
transition that fired is drawn on an edge of its own, coloured and thickened
by how often it fired (a heat map over many runs) and labelled with the count
and the most tokens estimated when it fired; the rest is greyed. A fired
transition is keyed by ``(index, source)``: its position among the machine
file's transitions (`Step.index`) and the phase it left, since a transition
with several sources is several edges.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from typing import Final, TypeAlias, final

import attrs

from turnfsm.core._spec import MachineSpec, TransitionSpec
from turnfsm.errors import ConfigError

__all__ = ["EdgeKey", "Traffic", "render_dot", "render_mermaid", "tally"]

EdgeKey: TypeAlias = tuple[int, str]
"""A transition as drawn: its index in the machine file and the phase it left."""

_WRAP: Final = 24
_ANY: Final = "any_"  # after the reserved prefix, + the destination: the
# "any phase" of wildcard edges
_GREY: Final = "#8c8c8c"  # failure edges
_FADED: Final = "#c4c4c4"  # everything a path did not take
_HEAT: Final = ("#fd8d3c", "#fc4e2a", "#e31a1c", "#b10026")  # ColorBrewer YlOrRd
_TIMES: Final = "\u00d7"  # the multiplication sign, as in "x3"


@final
@attrs.frozen(kw_only=True)
class Traffic:
    """How often one edge fired, and the most tokens estimated when it did.

    Attributes:
        count: How many times it fired.
        tokens: The largest token estimate right after it fired, if known.
    """

    count: int
    tokens: int | None = None

    def __add__(self, other: Traffic) -> Traffic:
        """Return both tallies as one: the counts add up, the larger estimate stays."""
        known = [t for t in (self.tokens, other.tokens) if t is not None]
        return Traffic(count=self.count + other.count, tokens=max(known, default=None))


def tally(fired: Iterable[tuple[int, str, int | None]]) -> dict[EdgeKey, Traffic]:
    """Count fired transitions, each given as ``(index, source, estimate)``.

    Args:
        fired: For each transition that fired, in any order: its index in
            the machine file (`Step.index`), the phase it left
            (`Step.source`) and the token estimate right after it, or None.

    Returns:
        ``{(index, source): Traffic}``, in the order the edges first fired.
    """
    out: dict[EdgeKey, Traffic] = {}
    for index, source, tokens in fired:
        one = Traffic(count=1, tokens=tokens)
        key = (index, source)
        out[key] = out[key] + one if key in out else one
    return out


@attrs.frozen
class _Edge:
    sources: tuple[str, ...]  # more than one: they meet at a junction point
    dest: str
    items: tuple[TransitionSpec, ...]
    first: int  # the file index of its first transition
    traffic: Traffic | None = None

    @property
    def is_failure(self) -> bool:
        return all(t.error is not None for t in self.items)


def _phrases(t: TransitionSpec) -> list[str]:
    """The transition's label, ``trigger [guards] / outcome``, in breakable pieces.

    A signal's transition that adds its data to the conversation ends with
    ``/ adds KEY``.
    """
    guards = [*t.conditions, *(f"not {g}" for g in t.unless)]
    phrases = [t.trigger, *(f"and {g}" for g in guards)]
    if guards:
        phrases[1] = f"[{guards[0]}"
        phrases[-1] += "]"
    outcome = t.reason.value if t.reason is not None else t.error
    if outcome is not None:
        phrases.append(f"/ {outcome}")
    if t.message is not None:
        phrases.append(f"/ adds {t.message}")
    return phrases


def _wrap(t: TransitionSpec) -> list[str]:
    """The transition's label in lines of about `_WRAP` characters."""
    lines: list[str] = []
    for phrase in _phrases(t):
        if lines and len(lines[-1]) + 1 + len(phrase) <= _WRAP:
            lines[-1] += f" {phrase}"
        else:
            lines.append(phrase)
    return lines


def _lines(edge: _Edge, indent: str) -> list[str]:
    """The edge's label, one string per line; a list's items are indented."""
    if len(edge.items) == 1:
        lines = _wrap(edge.items[0])
    else:
        lines = []
        for t in edge.items:
            first, *rest = _wrap(t)
            lines += [first, *(indent + line for line in rest)]
    if edge.traffic is not None:
        tokens = edge.traffic.tokens
        spent = "" if tokens is None else f", max {tokens:,} tokens"
        lines.append(f"{_TIMES}{edge.traffic.count}{spent}")
    return lines


def _edges(spec: MachineSpec, traffic: Mapping[EdgeKey, Traffic]) -> list[_Edge]:
    """Every edge to draw, in the order Graphviz lays out narrowest."""
    known = {(i, s) for i, t in enumerate(spec.transitions) for s in t.sources}
    for key in traffic:
        if key not in known:
            expected = f"(index, source) of a transition of {spec.name!r}"
            raise ConfigError("traffic", key, expected)
    edges: list[_Edge] = []
    pairs: dict[tuple[str, str], list[tuple[int, TransitionSpec]]] = {}
    for index, t in enumerate(spec.transitions):
        rest = []
        for source in t.sources:
            fired = traffic.get((index, source))
            if fired is not None:  # an internal transition loops on its phase
                edges.append(_Edge((source,), t.dest or source, (t,), index, fired))
            else:
                rest.append(source)
        if t.dest is not None and rest:
            for source in [_any(spec, t.dest)] if t.is_wildcard else rest:
                pairs.setdefault((source, t.dest), []).append((index, t))
    # Pairs that list the same transitions into the same phase share an edge.
    shared: dict[tuple[str, tuple[tuple[int, TransitionSpec], ...]], list[str]] = {}
    for (source, dest), listed in pairs.items():
        shared.setdefault((dest, tuple(listed)), []).append(source)
    for (dest, items), sources in shared.items():
        ts = tuple(t for _, t in items)
        edges.append(_Edge(tuple(sources), dest, ts, items[0][0]))
    # Each phase's fallback (its last, unguarded, transition) first and the
    # failures last: Graphviz then keeps the stock machines narrow.
    return sorted(edges, key=_layout_order)


def _layout_order(edge: _Edge) -> tuple[bool, int]:
    return edge.is_failure, edge.first if edge.is_failure else -edge.first


def _visited(spec: MachineSpec, edges: list[_Edge]) -> set[str]:
    """The phases some fired edge touches (none without traffic)."""
    fired = [e for e in edges if e.traffic is not None]
    if not fired:
        return set()
    sources = {s for e in fired for s in e.sources}
    return {spec.initial, *sources, *(e.dest for e in fired)}


@attrs.frozen
class _Pen:
    colour: str | None = None
    width: float | None = None
    is_dashed: bool = False


def _pen(edge: _Edge, top: int, is_overlay: bool) -> _Pen:
    """Draw an edge by its heat if it fired, faded beside a path, grey if failing."""
    if edge.traffic is not None:
        share = edge.traffic.count / top
        colour = _HEAT[min(len(_HEAT) - 1, int(share * len(_HEAT)))]
        return _Pen(colour, round(1.5 + 3.5 * share, 2))
    if is_overlay:
        return _Pen(_FADED, None, edge.is_failure)
    return _Pen(_GREY, None, True) if edge.is_failure else _Pen()


def _what(spec: MachineSpec, phase: str) -> str:
    state = spec.state(phase)
    if state.subagent is not None:
        return f"sub-agent {state.subagent} ({spec.subagent(state.subagent).machine})"
    return state.decision if state.decision is not None else f"effect {state.effect}"


def _reserved(spec: MachineSpec) -> str:
    """The prefix of the drawing's own nodes: one no phase of `spec` starts with.

    The start marker, the junction points and the "any phase" nodes are
    named after it, so no phase name (``__start`` is one) can merge with them.
    """
    prefix = "__"
    while any(phase.startswith(prefix) for phase in spec.phases):
        prefix += "_"
    return prefix


def _any(spec: MachineSpec, dest: str) -> str:
    """The node of the "any phase" whose wildcard edges go into `dest`."""
    return f"{_reserved(spec)}{_ANY}{dest}"


def _anys(spec: MachineSpec, edges: list[_Edge]) -> list[str]:
    """The "any phase" nodes of `edges` (the wildcard transitions' sources)."""
    phases = set(spec.phases)
    return sorted({s for e in edges for s in e.sources if s not in phases})


def _top(traffic: Mapping[EdgeKey, Traffic]) -> int:
    return max((t.count for t in traffic.values()), default=1)


# -- DOT -------------------------------------------------------------------


def _q(text: str) -> str:
    """`text` as the inside of a DOT string."""
    return text.replace("\\", "\\\\").replace('"', '\\"')


def _dot_pen(pen: _Pen) -> list[str]:
    out = []
    if pen.colour is not None:
        out += [f'color="{pen.colour}"', f'fontcolor="{pen.colour}"']
    if pen.width is not None:
        out.append(f"penwidth={pen.width}")
    if pen.is_dashed:
        out.append("style=dashed")
    return out


def _dot_edge(
    edge: _Edge, pen: _Pen, junction: str, link: str | None = None
) -> list[str]:
    lines = [_q(line) for line in _lines(edge, "  ")]
    # A list of transitions is left-justified (\l); a single label centred.
    end = "\\l" if len(edge.items) > 1 else "\\n"
    label = end.join(lines) + (end if len(edge.items) > 1 else "")
    linked = [] if link is None else [f'href="{_q(link)}"', 'target="_self"']
    drawn = ", ".join([f'label="{label}"', *_dot_pen(pen), *linked])
    dest = _q(edge.dest)
    if len(edge.sources) == 1:
        return [f'  "{_q(edge.sources[0])}" -> "{dest}" [{drawn}];']
    leg = ", ".join(["arrowhead=none", *_dot_pen(pen)])
    return [
        f'  "{junction}" [shape=point, width=0.06, color="{pen.colour}"];',
        *(f'  "{_q(s)}" -> "{junction}" [{leg}];' for s in edge.sources),
        f'  "{junction}" -> "{dest}" [{drawn}];',
    ]


def _dest_of(spec: MachineSpec, node: str) -> str:
    """The phase an "any phase" `node` leads into."""
    return node[len(_reserved(spec)) + len(_ANY) :]


def _dot_nodes(spec: MachineSpec, visited: set[str], anys: list[str]) -> list[str]:
    lines = []
    for phase in spec.phases:
        extra = ", peripheries=2" if phase in spec.terminal else ""
        if phase in visited:
            extra += f', color="{_HEAT[-1]}", penwidth=2'
        elif visited:
            extra += f', color="{_FADED}", fontcolor="{_FADED}"'
        label = f"{_q(phase)}\\n/{_q(_what(spec, phase))}"
        lines.append(f'  "{_q(phase)}" [label="{label}"{extra}];')
    lines += [
        f'  "{node}" [shape=plaintext, label="any phase", fontcolor="{_GREY}"];'
        for node in anys
    ]
    # The terminal phases, and "any phase" beside them, sit on the bottom rank.
    sink = [*spec.terminal, *(n for n in anys if _dest_of(spec, n) in spec.terminal)]
    lines.append("  { rank=sink; " + " ".join(f'"{_q(p)}";' for p in sink) + " }")
    return lines


def render_dot(
    spec: MachineSpec,
    traffic: Mapping[EdgeKey, Traffic] | None = None,
    *,
    title: str | None = None,
    href: Callable[[int, str], str] | None = None,
) -> str:
    """Return a Graphviz DOT digraph of `spec`, top to bottom, guards on the edges.

    Args:
        spec: The machine.
        traffic: Where some runs went, ``{(index, source): Traffic}`` (build
            it with `tally`): each edge that fired is drawn on its own, by
            how often it fired; the rest is greyed.
        title: A caption above the drawing.
        href: The address each fired edge links to, from its transition's
            index and its source phase (Graphviz's SVG makes the edge and
            its label a link); None: no links.

    Raises:
        ConfigError: a key of `traffic` names no transition of `spec`.
    """
    traffic = traffic or {}
    edges = _edges(spec, traffic)
    visited = _visited(spec, edges)
    lines = [
        f'digraph "{_q(spec.name)}" {{',
        "  rankdir=TB;",
        "  ordering=in;",
        "  nodesep=0.25;",
        "  ranksep=0.5;",
        '  node [shape=box, style="rounded", fontname="Helvetica", fontsize=11];',
        '  edge [fontname="Helvetica", fontsize=10];',
    ]
    if title is not None:
        lines.append(f'  labelloc=t; fontname="Helvetica"; label="{_q(title)}";')
    start = _q(_reserved(spec) + "start")
    lines.append(f'  "{start}" [shape=point, label=""];')
    lines.append(f'  "{start}" -> "{_q(spec.initial)}";')
    lines += _dot_nodes(spec, visited, _anys(spec, edges))
    for number, edge in enumerate(edges):
        pen = _pen(edge, _top(traffic), bool(visited))
        link = None
        if href is not None and edge.traffic is not None:
            link = href(edge.first, edge.sources[0])
        junction = f"{_reserved(spec)}junction_{number}"
        lines += _dot_edge(edge, pen, junction, link)
    lines.append("}")
    return "\n".join(lines) + "\n"


# -- Mermaid ---------------------------------------------------------------

_MERMAID_WORDS: Final = frozenset(
    {"end", "graph", "flowchart", "subgraph", "style", "class", "classdef"}
    | {"click", "linkstyle", "direction", "default", "call", "href"}
)
_MERMAID_ID: Final = re.compile(r"[A-Za-z0-9_]+")
_ESCAPED: Final = "phase_"  # + the name's UTF-8 in hex: an id of an odd name


def _mid(name: str) -> str:
    """A Mermaid node id for the phase `name` (keywords and odd names escaped).

    A name that starts as an escaped one does (``phase_``) is escaped too,
    so that two phases never share an id.
    """
    if (
        _MERMAID_ID.fullmatch(name)
        and name.lower() not in _MERMAID_WORDS
        and not name.startswith(_ESCAPED)
    ):
        return name
    return _ESCAPED + name.encode().hex()


_MERMAID_ENTITIES: Final = str.maketrans(
    {'"': "#quot;", "<": "#lt;", ">": "#gt;", "&": "#amp;"}
)


def _mtext(text: str) -> str:
    """`text` in a Mermaid label: a quote, or markup (``<b>``), as itself."""
    return text.translate(_MERMAID_ENTITIES)


def _mermaid_style(pen: _Pen) -> str | None:
    parts = []
    if pen.colour is not None:
        parts += [f"stroke:{pen.colour}", f"color:{pen.colour}"]
    if pen.width is not None:
        parts.append(f"stroke-width:{pen.width}px")
    return ",".join(parts) or None


def _mermaid_edges(
    edges: list[_Edge], top: int, is_overlay: bool, reserved: str
) -> list[str]:
    """The edges, then a ``linkStyle`` for each one drawn other than plain."""
    lines, styles, link = [], [], 1  # link 0 is the arrow into the initial phase
    for number, edge in enumerate(edges):
        pen = _pen(edge, top, is_overlay)
        arrow, leg = ("-.->", "-.-") if pen.is_dashed else ("-->", "---")
        label = "<br/>".join(_mtext(line) for line in _lines(edge, "#160;#160;"))
        links = []
        source = _mid(edge.sources[0])
        if len(edge.sources) > 1:
            source = f"{reserved}junction_{number}"
            lines.append(f"    {source}(( ))")
            for s in edge.sources:
                lines.append(f"    {_mid(s)} {leg} {source}")
                links.append(link)
                link += 1
        lines.append(f'    {source} {arrow}|"{label}"| {_mid(edge.dest)}')
        links.append(link)
        link += 1
        style = _mermaid_style(pen)
        if style is not None:
            styles.append(f"    linkStyle {','.join(map(str, links))} {style}")
    return lines + styles


def _file_of(spec: MachineSpec) -> str:
    """The name of the file `spec` was read from (NAME.toml when not from one)."""
    name = re.split(r"[\\/]", spec.source)[-1]  # no file system: a pure module
    return name if name.endswith(".toml") else f"{spec.name}.toml"


def render_mermaid(
    spec: MachineSpec,
    traffic: Mapping[EdgeKey, Traffic] | None = None,
    *,
    title: str | None = None,
) -> str:
    """Return a Mermaid ``flowchart TB`` of `spec`, guards on the edges.

    Args:
        spec: The machine.
        traffic: Where some runs went, as for `render_dot`.
        title: The diagram's title (default: the file it was generated from).

    Raises:
        ConfigError: a key of `traffic` names no transition of `spec`.
    """
    traffic = traffic or {}
    edges = _edges(spec, traffic)
    visited = _visited(spec, edges)
    heading = title or f"{spec.name} (generated from {_file_of(spec)}; do not edit)"
    quoted = heading.replace("\\", "\\\\").replace('"', '\\"')  # a YAML string
    lines = ["---", f'title: "{quoted}"', "---", "flowchart TB"]
    lines.append(f"    {_reserved(spec)}start(( )) --> {_mid(spec.initial)}")
    for phase in spec.phases:
        text = f"{_mtext(phase)}<br/>/{_mtext(_what(spec, phase))}"
        shape = f'(["{text}"])' if phase in spec.terminal else f'("{text}")'
        lines.append(f"    {_mid(phase)}{shape}")
    lines += [f'    {_mid(node)}["any phase"]:::any' for node in _anys(spec, edges)]
    lines += _mermaid_edges(edges, _top(traffic), bool(visited), _reserved(spec))
    lines.append(f"    classDef any fill:none,stroke:none,color:{_GREY}")
    for phase in spec.phases:
        if phase in visited:
            lines.append(f"    style {_mid(phase)} stroke:{_HEAT[-1]},stroke-width:2px")
        elif visited:
            lines.append(f"    style {_mid(phase)} color:{_FADED},stroke:{_FADED}")
    return "\n".join(lines) + "\n"
