"""MachineSpec -> Mermaid / DOT text (pure, deterministic)."""

from __future__ import annotations

from turnfsm.core._spec import MachineSpec, TransitionSpec

__all__ = ["render_dot", "render_mermaid"]


def _label(t: TransitionSpec) -> str:
    parts = [t.trigger]
    guards = [*t.conditions, *(f"not {g}" for g in t.unless)]
    if guards:
        parts.append(f"[{' and '.join(guards)}]")
    if t.reason is not None:
        parts.append(f"/ {t.reason.value}")
    if t.error is not None:
        parts.append(f"/ {t.error}")
    return " ".join(parts)


def _edges(spec: MachineSpec) -> list[tuple[str, str, str]]:
    """Every phase-changing edge in file order, wildcards expanded."""
    edges = []
    for t in spec.transitions:
        if t.dest is None:
            continue
        label = _label(t)
        for source in t.sources:
            edges.append((source, t.dest, label))
    return edges


def render_mermaid(spec: MachineSpec) -> str:
    """Return a Mermaid ``stateDiagram-v2`` of `spec`, guards on the edges."""
    lines = [
        "---",
        f"title: {spec.name} (generated from {spec.name}.toml; do not edit)",
        "---",
        "stateDiagram-v2",
        f"    [*] --> {spec.initial}",
    ]
    for state in spec.states:
        what = (
            state.decision if state.decision is not None else f"effect {state.effect}"
        )
        lines.append(f"    {state.name} : {state.name} / {what}")
    for source, dest, label in _edges(spec):
        lines.append(f"    {source} --> {dest} : {label}")
    for phase in spec.terminal:
        lines.append(f"    {phase} --> [*]")
    return "\n".join(lines) + "\n"


def render_dot(spec: MachineSpec) -> str:
    """Return a Graphviz DOT digraph of `spec`, guards on the edges."""
    lines = [
        f'digraph "{spec.name}" {{',
        "  rankdir=TB;",
        '  node [shape=box, style="rounded", fontname="Helvetica"];',
        '  edge [fontname="Helvetica", fontsize=9];',
        '  "__start" [shape=point, label=""];',
        f'  "__start" -> "{spec.initial}";',
    ]
    for state in spec.states:
        what = (
            state.decision if state.decision is not None else f"effect {state.effect}"
        )
        shape = ", peripheries=2" if state.name in spec.terminal else ""
        lines.append(f'  "{state.name}" [label="{state.name}\\n/{what}"{shape}];')
    for source, dest, label in _edges(spec):
        lines.append(f'  "{source}" -> "{dest}" [label="{label}"];')
    lines.append("}")
    return "\n".join(lines) + "\n"
