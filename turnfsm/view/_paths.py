"""The path a run took on its machine, and its diagram with that path drawn.

The path is replayed from the run's log (`turnfsm.driver.rebuild`), and
the log checked, as ``turnfsm diagram --run`` does; the diagram is the machine's overlay
(`turnfsm.core.render_dot` drawn by Graphviz into SVG when ``dot`` is on
the PATH, else its Mermaid text).
"""

from __future__ import annotations

import shutil
import subprocess
from typing import final

import attrs

from turnfsm._resources import load_machine, machines_dir
from turnfsm.core import (
    CompactionCircuitOpened,
    CompactionNoop,
    CompactionOverflowed,
    CompactionResult,
    CompactorFailed,
    MachineSpec,
    ModelReplied,
    TurnMachine,
    render_dot,
    render_mermaid,
    tally,
)
from turnfsm.driver import rebuild
from turnfsm.errors import TurnFSMError
from turnfsm.persistence import RunRecord, Session

__all__ = ["Diagram", "PathStep", "edge_anchor", "run_path"]


@final
@attrs.frozen(kw_only=True)
class PathStep:
    """One transition a run fired: on which event, from where to where.

    `turn` and `compaction` are the model call (its index in the run's
    turns) or the pass (in its compactions) whose end the event was, if any.
    `edge` numbers the drawn edge it went along (the run's edges in the
    order they first fired).
    """

    event: int
    index: int
    source: str
    dest: str
    trigger: str
    estimate: int | None
    turn: int | None = None
    compaction: int | None = None
    edge: int = 0


_PASS_ENDS = (
    CompactionResult,
    CompactionNoop,
    CompactionOverflowed,
    CompactorFailed,
    CompactionCircuitOpened,
)
"""The events that end a compaction pass (each pass has its record)."""


@final
@attrs.frozen(kw_only=True)
class Diagram:
    """A run's path and its machine drawn with it.

    `svg` is Graphviz's drawing (None without ``dot``); `mermaid` the same
    diagram as Mermaid text; `problem` why neither could be drawn.
    """

    steps: tuple[PathStep, ...] = ()
    svg: str | None = None
    mermaid: str = ""
    problem: str | None = None


def _machine(session: Session, run: RunRecord) -> MachineSpec | None:
    """The machine the run began on: from its log, else the shipped one of its name."""
    spec = session.machine(run.opened.digest)
    if spec is not None:
        return spec
    shipped = machines_dir() / f"{run.opened.machine}.toml"
    return load_machine(shipped) if shipped.is_file() else None


def run_path(session: Session, run: RunRecord, *, draw: bool = True) -> Diagram:
    """Replay `run`'s path and draw its machine with it (never raises on a bad log)."""
    try:
        spec = _machine(session, run)
    except TurnFSMError as exc:
        return Diagram(problem=f"its machine does not load: {exc}")
    if spec is None:
        return Diagram(problem=f"the machine {run.opened.machine!r} is not known")
    steps: list[PathStep] = []

    def took(brain: TurnMachine) -> None:
        step = brain.last_step
        if step is not None:
            steps.append(
                PathStep(
                    event=len(steps_seen),
                    index=step.index,
                    source=step.source,
                    dest=step.dest,
                    trigger=step.trigger,
                    estimate=brain.snapshot.estimate,
                )
            )
        steps_seen.append(None)

    steps_seen: list[None] = []
    problem = None
    try:
        # Checked, as `turnfsm replay` and `turnfsm diagram --run` check it: a
        # log changed after it was written is drawn as far as it replays.
        rebuild(spec, session, run.run_id, on_step=took)
    except TurnFSMError as exc:  # draw what was replayed, and say why it stopped
        problem = f"the replay stopped: {exc}"
    edges: dict[tuple[int, str], int] = {}
    for step in steps:
        edges.setdefault((step.index, step.source), len(edges))
    steps = [
        attrs.evolve(s, edge=edges[s.index, s.source]) for s in _linked(steps, run)
    ]
    if not draw:
        return Diagram(steps=tuple(steps), problem=problem)
    traffic = tally((s.index, s.source, s.estimate) for s in steps)
    title = f"{spec.name}: run {run.run_id}"
    mermaid = render_mermaid(spec, traffic, title=title)

    def href(index: int, source: str) -> str:
        return f"#{edge_anchor(run.run_id, edges[index, source])}"

    svg = _svg(render_dot(spec, traffic, title=title, href=href))
    return Diagram(steps=tuple(steps), svg=svg, mermaid=mermaid, problem=problem)


def edge_anchor(run_id: str, edge: int) -> str:
    """The id of the listed step that first went along `edge` of the run."""
    return f"edge-{run_id}-{edge}"


def _linked(steps: list[PathStep], run: RunRecord) -> list[PathStep]:
    """`steps`, each naming the turn or the pass its event ended.

    The n-th reply is the n-th turn, the n-th pass's end its n-th record;
    when the counts do not agree (a log cut short), nothing is named.
    """
    replies = [i for i, e in enumerate(run.events) if isinstance(e, ModelReplied)]
    ends = [i for i, e in enumerate(run.events) if isinstance(e, _PASS_ENDS)]
    turns = dict(zip(replies, range(len(replies)), strict=True))
    passes = dict(zip(ends, range(len(ends)), strict=True))
    if len(replies) != len(run.turns):
        turns = {}
    if len(ends) != len(run.compactions):
        passes = {}
    return [
        attrs.evolve(s, turn=turns.get(s.event), compaction=passes.get(s.event))
        for s in steps
    ]


def _svg(dot_text: str) -> str | None:
    """Graphviz's SVG of `dot_text` (its ``<svg>`` element), or None without dot."""
    dot = shutil.which("dot")
    if dot is None:
        return None
    try:
        done = subprocess.run(
            [dot, "-Tsvg"],
            input=dot_text,
            text=True,
            capture_output=True,
            check=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    text = done.stdout
    start = text.find("<svg")
    return text[start:] if start >= 0 else None
