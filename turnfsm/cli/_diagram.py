"""``turnfsm diagram`` and ``turnfsm check``.

``turnfsm diagram`` renders every machine file of a directory; with
``--run`` or ``--trace`` it draws one machine with the path some runs took
on it (`run_overlay`): the runs' transitions are replayed from the session
store or read from an OTLP/JSON trace, counted (`turnfsm.core.tally`) and
drawn by the pure renderers of `turnfsm.core`. A stored run that handed
work to sub-agents has their runs drawn too, each child session into a file
of its own beside the run's (`child_file`).
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Final, TypeAlias

import attrs

from turnfsm import _checks
from turnfsm._files import write_text
from turnfsm._resources import load_machine, machines_dir
from turnfsm.cli._errors import check_writable, explain
from turnfsm.cli._run import machine_option, run_async
from turnfsm.core import (
    EdgeKey,
    MachineSpec,
    Traffic,
    TurnMachine,
    render_dot,
    render_mermaid,
    tally,
)
from turnfsm.driver import rebuild
from turnfsm.errors import (
    ConfigError,
    DefinitionError,
    TurnFSMError,
)
from turnfsm.persistence import (
    ParentLink,
    Session,
    descendants,
    machine_digest,
    parent_of,
)
from turnfsm.tracing import (
    TRANSITION_EVENT,
    TracedTransition,
    load_otlp_json,
    traced_runs,
)

__all__ = [
    "SUB_AGENT_DEPTH",
    "Fired",
    "child_file",
    "default_out",
    "render_all",
    "run_check",
    "run_diagram",
    "run_overlay",
    "shown",
]


def render_all(machines: Path) -> dict[str, str]:
    """Return ``{file name: Mermaid text}`` for every machine file in `machines`."""
    out = {}
    for path in sorted(machines.glob("*.toml")):
        spec = load_machine(path)
        out[f"{path.stem}.mmd"] = render_mermaid(spec)
    return out


def default_out(machines: Path) -> Path:
    """Where diagrams of the machine files in `machines` go without ``--out``.

    Beside the machines: ``diagrams/`` in the directory that holds
    `machines` (``machines/`` and ``diagrams/`` at a repository's root), or
    ``./diagrams`` for the machines inside an installed turnfsm.
    """
    package = Path(__file__).resolve().parents[1]
    if package in machines.resolve().parents:
        return Path("diagrams")
    return machines.parent / "diagrams"


def shown(path: Path) -> str:
    """`path` for a person to read: relative below the working directory."""
    full = path.resolve()
    cwd = Path.cwd()
    return str(full.relative_to(cwd)) if full.is_relative_to(cwd) else str(full)


def run_diagram(machines: str | None, out: str | None, *, check: bool) -> int:
    """Write (or, with `check`, compare) ``<name>.mmd`` and, with Graphviz, ``.svg``.

    Without `out`, the diagrams go beside the machines (`default_out`); each
    file written is printed. Every machine file is loaded; the problems of
    those that do not load are printed, the others rendered, and the status
    is then 1. A directory that is missing or holds no machine file is
    named on standard error, nothing is written, and the status is 1.
    """
    source = Path(machines) if machines else machines_dir()
    files = sorted(source.glob("*.toml")) if source.is_dir() else []
    if not files:
        if source.is_dir():
            problem = "no machine files (*.toml)"
        elif source.exists():
            problem = (
                "not a directory (give the directory of the machine files, or"
                " draw one file with --machine FILE -o NAME.svg)"
            )
        else:
            problem = "no such directory"
        print(f"{source}: {problem}", file=sys.stderr)
        return 1
    target = Path(out) if out is not None else Path(shown(default_out(source)))
    rendered: dict[str, str] = {}
    failed = 0
    for path in files:  # every file, the bad ones reported
        spec = _load(path)
        if spec is None:
            failed += 1
        else:
            rendered[f"{path.stem}.mmd"] = render_mermaid(spec)
    if check:
        # The command that redraws these machines there: as they were named.
        redraw = shlex.join(
            ["turnfsm", "diagram"]
            + ([machines] if machines else [])
            + (["--out", out] if out is not None else [])
        )
        stale = 0
        for name, text in rendered.items():
            drawn = target / name
            if not drawn.is_file():
                said = "missing"
            elif _drawn_text(drawn) != text:
                said = "stale"
            else:
                continue
            stale += 1
            print(f"{said}: {drawn} (run `{redraw}`)", file=sys.stderr)
        return 1 if stale or failed else 0
    try:
        _out_directory(target)
        dot = shutil.which("dot")
        for name, text in rendered.items():
            write_text(target / name, text)
            print(f"wrote {target / name}")
            if dot is not None:
                spec = load_machine(source / f"{Path(name).stem}.toml")
                svg = target / f"{Path(name).stem}.svg"
                try:
                    _run_dot(dot, "--out", svg, render_dot(spec))
                except _DotTimedOut as exc:  # the others are still drawn
                    print(f"turnfsm diagram: {explain(exc)}", file=sys.stderr)
                    failed += 1
                    continue
                print(f"wrote {svg}")
    except BrokenPipeError:  # the reader went (`| head`): `main` ends quietly
        raise
    except (OSError, TurnFSMError) as exc:
        print(f"turnfsm diagram: {explain(exc)}", file=sys.stderr)
        return 2
    return 1 if failed else 0


def _drawn_text(drawn: Path) -> str:
    """The diagram at `drawn`; bytes that are not UTF-8 kept as no drawing's text.

    A drawing is UTF-8: a file that is not (a hand's edit, another tool's)
    is stale, not a traceback.
    """
    return drawn.read_text(encoding="utf-8", errors="surrogateescape")


def _out_directory(target: Path) -> None:
    """Make the directory `target` (and its parents), or say why it cannot be."""
    if target.exists() and not target.is_dir():
        raise ConfigError(
            "--out", str(target), "a directory for the diagrams (it is a file)"
        )
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(
            "--out", str(target), f"a directory that can be made ({explain(exc)})"
        ) from None


DOT_TIMEOUT: Final = 60.0
"""How long Graphviz's dot may take to draw one diagram, in seconds.

A machine of a few hundred phases takes it a few seconds; one of thousands
takes it many minutes, so the command would seem to hang.
"""


class _DotTimedOut(ConfigError):
    """Graphviz's dot did not finish drawing a diagram within `DOT_TIMEOUT`."""


def _run_dot(dot: str, option: str, path: Path, text: str) -> None:
    """Have Graphviz's dot draw `text` into `path`; its complaint if it cannot.

    Raises:
        _DotTimedOut: dot did not finish within `DOT_TIMEOUT` (it is stopped,
            and nothing is written to `path`).
        ConfigError: dot failed.
    """
    try:
        done = subprocess.run(
            [dot, f"-T{path.suffix[1:].lower()}", "-o", str(path)],
            input=text,
            text=True,
            stderr=subprocess.PIPE,
            check=False,
            timeout=DOT_TIMEOUT,
        )
    except subprocess.TimeoutExpired:
        path.unlink(missing_ok=True)  # what dot began to write is no drawing
        raise _DotTimedOut(
            option,
            str(path),
            f"a drawing Graphviz's dot makes within {DOT_TIMEOUT:g} s: it was "
            "stopped, the machine being too large for it; use the .mmd, or "
            "write the .dot (--machine FILE -o NAME.dot) and run dot on it "
            "yourself",
        ) from None
    if done.returncode != 0:
        said = " ".join(done.stderr.split()) or f"exit status {done.returncode}"
        raise ConfigError(option, str(path), f"a file dot can write (dot: {said})")


def run_check(paths: Sequence[str]) -> int:
    """Validate machine files, and the ``*.toml`` files of directories.

    Every file is loaded and every problem of each printed; returns 0 when
    all of them load, else 1 (also for a directory without machine files).
    """
    files: list[Path] = []
    is_empty = False
    for name in paths:
        path = Path(name)
        found = sorted(path.glob("*.toml")) if path.is_dir() else [path]
        if not found:
            print(f"{path}: no machine files (*.toml)", file=sys.stderr)
            is_empty = True
        files += found
    failed = 0
    for path in files:
        spec = _load(path)
        if spec is None:
            failed += 1
        else:
            print(
                f"{path}: ok ({len(spec.states)} phases, "
                f"{len(spec.transitions)} transitions)"
            )
    if failed and len(files) > 1:
        print(f"{failed} of {len(files)} machine files have problems", file=sys.stderr)
    return 1 if failed or is_empty else 0


def _load(path: Path) -> MachineSpec | None:
    """Load one machine file, or print why it does not load."""
    try:
        return load_machine(path)
    except DefinitionError as exc:
        print(exc, file=sys.stderr)
    except OSError as exc:
        said = explain(exc)  # names the file when the error does
        print(said if exc.filename is not None else f"{path}: {said}", file=sys.stderr)
    return None


# -- turnfsm diagram --run / --trace: the path runs took, on their machine --

Fired: TypeAlias = tuple[int, str, int | None]
"""One fired transition: its index, the phase it left, the estimate after it."""

_FORMATS = (".svg", ".png", ".dot", ".mmd")

SUB_AGENT_DEPTH = 3
"""How many levels of sub-agents `run_overlay` draws beside a run by default."""


@attrs.frozen
class _Run:
    """A run to draw: where it came from, its machine, and how to get its path."""

    label: str
    machine: str | None
    digest: str | None
    session: Session | None = None  # a stored run: replayed from its log
    run_id: str = ""
    transitions: tuple[TracedTransition, ...] = ()  # a traced run


@attrs.frozen
class _Child:
    """A sub-agent's session to draw beside its parent's run, and its runs."""

    session: Session
    link: ParentLink
    runs: tuple[_Run, ...]


def child_file(output: Path, session_id: str) -> Path:
    """Where the diagram of the sub-agent session `session_id` goes, beside `output`.

    ``run.svg`` and ``ses_abc`` make ``run.ses_abc.svg``.
    """
    return output.with_name(f"{output.stem}.{session_id}{output.suffix}")


def run_overlay(
    output: str | None,
    *,
    runs: Sequence[str] = (),
    traces: Sequence[str] = (),
    machine: str | None = None,
    store: str | None = None,
    depth: int = SUB_AGENT_DEPTH,
) -> int:
    """Draw a machine into `output` with the path its runs took highlighted.

    Args:
        output: The file to write; its suffix picks the format: ``.svg`` or
            ``.png`` (with Graphviz), ``.dot`` or ``.mmd``.
        runs: ``SESSION`` (every run of it) or ``SESSION:RUN``, read from
            `store` (a store spec; by default ``TURNFSM_STORE``, else the
            CLI's SQLite file) and replayed on the machine they ran on.
        traces: OTLP/JSON trace files; each run in them counts.
        machine: The machine file the runs ran on (default: the shipped
            machine they name). Runs on a machine of another name are left
            out; a run whose machine digest differs is refused.
        store: Where `runs` are kept.
        depth: How many levels of sub-agents to draw: each session a stored
            run delegated to (its runs, summed) goes into a file of its own
            (`child_file`), named with the call that made it; 0: none. A
            sub-agent that cannot be drawn is named on standard error.

    Returns 0 when the file was written, 2 when an input cannot be used
    (the error is printed). With neither `runs` nor `traces`, `machine` is
    drawn plain.
    """
    children: list[_Child] = []
    try:
        if output is None:
            raise ConfigError(
                "-o", None, f"the file to draw into ({_formats()})", missing=True
            )
        check_writable("-o", output)
        _check_format(Path(output))
        _checks.check(depth, "--depth", _checks.integer(low=0))
        found = run_async(_stored_runs, store, runs, depth, children) if runs else []
        found += _traced_runs(traces)
        if traces and not found:
            expected = f"a trace with {TRANSITION_EVENT} span events"
            raise ConfigError("--trace", ", ".join(traces), expected)
        spec, found = _machine_for(found, machine)
        fired = [f for run in found for f in _path(spec, run)]
        title = _title(spec, found) if found else None
        _draw(Path(output), spec, tally(fired), title)
    except (OSError, ImportError, TurnFSMError) as exc:
        print(f"turnfsm diagram: {explain(exc)}", file=sys.stderr)
        return 2
    ran = f" ({_runs(found)}, {len(fired)} transitions)" if found else ""
    print(f"wrote {shown(Path(output))}{ran}")
    for child in children:
        _draw_child(Path(output), child, spec)
    return 0


def _draw_child(output: Path, child: _Child, parent: MachineSpec) -> None:
    """Draw a sub-agent's runs beside `output`, or say why not (standard error)."""
    link = child.link
    made = f"call {link.call_id} of {link.session_id}:{link.run_id}"
    try:
        path = child_file(output, child.session.id)
        digest = machine_digest(parent)
        if all(r.digest == digest for r in child.runs):  # the parent's machine
            spec, runs = parent, list(child.runs)
        else:
            spec, runs = _machine_for(list(child.runs), None)
        fired = [f for run in runs for f in _path(spec, run)]
        title = (
            f"{spec.name}: sub-agent {child.session.id} for {made} "
            f"({_runs(runs)}); edge width and colour: times fired"
        )
        _draw(path, spec, tally(fired), title)
    except (OSError, TurnFSMError) as exc:
        print(
            f"turnfsm diagram: left out sub-agent {child.session.id} "
            f"(for {made}): {explain(exc)}",
            file=sys.stderr,
        )
        return
    print(
        f"wrote {shown(path)} (sub-agent for {made}: {_runs(runs)}, "
        f"{len(fired)} transitions)"
    )


def _runs(runs: list[_Run]) -> str:
    return f"{len(runs)} run" + ("s" if len(runs) > 1 else "")


def _formats() -> str:
    return ", ".join(_FORMATS[:-1]) + " or " + _FORMATS[-1]


async def _stored_runs(
    store: str | None, given: Sequence[str], depth: int, children: list[_Child]
) -> list[_Run]:
    """The runs `given` names; their sub-agents `depth` levels down into `children`."""
    from turnfsm.cli._stores import close_store, open_cli_store, where

    for text in given:  # named as the option the user gave, before any reading
        if not text.partition(":")[0]:
            raise ConfigError("--run", text, "SESSION or SESSION:RUN")
    sessions = open_cli_store(store, read_only=True)
    loaded: dict[str, Session] = {}
    runs: dict[str, _Run] = {}  # a run named twice counts once
    try:
        for text in given:
            session_id, _, run_id = text.partition(":")
            if session_id not in loaded:
                loaded[session_id] = await Session.open(sessions, session_id)
            session = loaded[session_id]
            records = [r for r in session.runs if run_id in ("", r.run_id)]
            if not records:
                what = "a run of the session" if session.version else "a session"
                raise ConfigError("--run", text, f"{what} in {where(sessions)}")
            for r in records:
                label = f"{session_id}:{r.run_id}"
                opened = r.opened
                runs[label] = _Run(
                    label, opened.machine, opened.digest, session, r.run_id
                )
        if depth:
            drawn = {(r.session.id, r.run_id) for r in runs.values() if r.session}
            for session_id in loaded:
                found = await descendants(sessions, session_id, depth=depth)
                children += _delegated(found, drawn, {c.session.id for c in children})
    finally:
        await close_store(sessions)
    return list(runs.values())


def _delegated(
    found: list[Session], drawn: set[tuple[str, str]], known: set[str]
) -> list[_Child]:
    """The sessions of `found` that a run of `drawn` (or one of them) started."""
    out = []
    for session in found:  # each after its parent
        link = parent_of(session)
        if link is None or session.id in known:
            continue
        if (link.session_id, link.run_id) not in drawn:
            continue
        runs = tuple(
            _Run(
                f"{session.id}:{r.run_id}",
                r.opened.machine,
                r.opened.digest,
                session,
                r.run_id,
            )
            for r in session.runs
        )
        drawn |= {(session.id, r.run_id) for r in session.runs}
        known.add(session.id)
        out.append(_Child(session, link, runs))
    return out


def _traced_runs(paths: Sequence[str]) -> list[_Run]:
    runs = []
    for path in paths:
        try:
            spans = load_otlp_json(path)
        except ConfigError as exc:  # named as the option, with its file
            raise ConfigError(
                "--trace", path, f"an OTLP/JSON trace file ({exc})"
            ) from None
        for run in traced_runs(spans):
            label = f"{Path(path).name}:{run.run_id or run.trace_id}"
            runs.append(
                _Run(label, run.machine, run.digest, transitions=run.transitions)
            )
    return runs


def _logged_machine(runs: list[_Run]) -> MachineSpec | None:
    """The machine stored runs all ran on, as their log keeps it (None: not kept)."""
    digests = {r.digest for r in runs}
    first = runs[0] if runs else None
    if first is None or first.session is None or len(digests) != 1:
        return None
    digest = first.digest
    return first.session.machine(digest) if digest is not None else None


def _machine_for(runs: list[_Run], path: str | None) -> tuple[MachineSpec, list[_Run]]:
    """The machine to draw `runs` on (and those of them that ran on it)."""
    if path is not None:
        spec = machine_option(path)
        kept = [r for r in runs if r.machine in (None, spec.name)]
        for run in runs:
            if run not in kept:
                print(
                    f"left out {run.label}: it ran on {run.machine!r}", file=sys.stderr
                )
    else:
        names = sorted({str(r.machine) for r in runs})
        if len(names) != 1 or runs[0].machine is None:
            ran = f"the runs ran on {', '.join(names)}" if runs else "no run given"
            if len(names) > 1 and all(r.machine is not None for r in runs):
                picks = " or ".join(f"--machine {name}" for name in names)
                ran += (
                    f": {picks} draws the runs on that one and leaves the others "
                    "out, or name one run as SESSION:RUN"
                )
            raise ConfigError(
                "--machine", None, f"the machine file to draw ({ran})", missing=True
            )
        shipped = machines_dir() / f"{names[0]}.toml"
        stock = load_machine(shipped) if shipped.is_file() else None
        same = stock is not None and {r.digest for r in runs} <= {
            None,
            machine_digest(stock),
        }
        logged = None if same else _logged_machine(runs)
        if logged is not None:  # the machine they ran on, as their log keeps it
            return logged, runs
        if stock is None:
            expected = f"the machine file of {names[0]!r} (not a shipped one)"
            raise ConfigError("--machine", None, expected, missing=True)
        spec, kept = stock, runs
    if runs and not kept:
        raise ConfigError("--machine", path, "the machine the runs ran on")
    digest = machine_digest(spec)
    for run in kept:
        if run.digest not in (None, digest):
            why = f"{run.label} ran on {spec.name!r} {run.digest}, not on {digest}"
            raise ConfigError(
                "--machine", spec.source, f"the machine it ran on ({why})"
            )
    return spec, kept


def _path(spec: MachineSpec, run: _Run) -> list[Fired]:
    """The transitions `run` fired: replayed from its log, or read from its trace."""
    if run.session is not None:
        return _replayed(spec, run.session, run.run_id)
    fired = []
    for t in run.transitions:
        n = t.index
        file = spec.transitions[n] if 0 <= n < len(spec.transitions) else None
        if (
            file is None
            or t.source not in file.sources
            or (file.trigger, file.dest or t.source) != (t.trigger, t.dest)
        ):
            step = f"#{n} {t.source} --{t.trigger}--> {t.dest}"
            expected = f"a transition of {spec.source} (it ran on another machine)"
            raise ConfigError(run.label, step, expected)
        fired.append((n, t.source, t.estimate))
    return fired


def _replayed(spec: MachineSpec, session: Session, run_id: str) -> list[Fired]:
    """The transitions the run fired, replayed from its log (checked)."""
    fired: list[Fired] = []

    def took(brain: TurnMachine) -> None:
        step = brain.last_step
        if step is not None:
            fired.append((step.index, step.source, brain.snapshot.estimate))

    rebuild(spec, session, run_id, on_step=took)
    return fired


def _title(spec: MachineSpec, runs: list[_Run]) -> str:
    sources = sorted({r.label.partition(":")[0] for r in runs})
    where = sources[0] if len(sources) == 1 else f"{len(sources)} sources"
    return f"{spec.name}: {_runs(runs)} ({where}); edge width and colour: times fired"


def _check_format(path: Path) -> tuple[str, str | None]:
    """The format `path`'s suffix names (lower case), and Graphviz's dot for it.

    Refused when the suffix names no format, or an image's when dot is not
    on the PATH: before the runs are read.
    """
    suffix = path.suffix.lower()
    if suffix not in _FORMATS:
        raise ConfigError("-o", str(path), f"a file ending {_formats()}")
    if suffix in (".dot", ".mmd"):
        return suffix, None
    dot = shutil.which("dot")
    if dot is None:
        expected = "a .dot or .mmd file: Graphviz's dot is not on the PATH"
        raise ConfigError("-o", str(path), expected)
    return suffix, dot


def _draw(
    path: Path, spec: MachineSpec, traffic: dict[EdgeKey, Traffic], title: str | None
) -> None:
    suffix, dot = _check_format(path)
    if suffix == ".mmd":
        write_text(path, render_mermaid(spec, traffic, title=title))
        return
    text = render_dot(spec, traffic, title=title)
    if dot is None:
        write_text(path, text)
        return
    _run_dot(dot, "-o", path, text)
