"""``turnfsm diagram`` and ``turnfsm check``."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from turnfsm._resources import load_machine, machines_dir
from turnfsm.core import MachineSpec, render_dot, render_mermaid
from turnfsm.errors import DefinitionError

__all__ = ["render_all", "run_check", "run_diagram"]


def render_all(machines: Path) -> dict[str, str]:
    """Return ``{file name: Mermaid text}`` for every machine file in `machines`."""
    out = {}
    for path in sorted(machines.glob("*.toml")):
        spec = load_machine(path)
        out[f"{path.stem}.mmd"] = render_mermaid(spec)
    return out


def run_diagram(machines: str | None, out: str, *, check: bool) -> int:
    """Write (or, with `check`, compare) ``<name>.mmd`` and, with Graphviz, ``.svg``.

    Every machine file is loaded; the problems of those that do not load are
    printed, the others rendered, and the status is then 1.
    """
    source = Path(machines) if machines else machines_dir()
    target = Path(out)
    rendered = {}
    failed = 0
    for path in sorted(source.glob("*.toml")):  # every file, the bad ones reported
        spec = _load(path)
        if spec is None:
            failed += 1
        else:
            rendered[f"{path.stem}.mmd"] = render_mermaid(spec)
    if check:
        stale = [
            n
            for n, text in rendered.items()
            if not (target / n).is_file() or (target / n).read_text() != text
        ]
        for name in stale:
            print(f"stale: {target / name} (run `turnfsm diagram`)", file=sys.stderr)
        return 1 if stale or failed else 0
    target.mkdir(parents=True, exist_ok=True)
    dot = shutil.which("dot")
    for name, text in rendered.items():
        (target / name).write_text(text)
        print(f"wrote {target / name}")
        if dot is not None:
            spec = load_machine(source / f"{Path(name).stem}.toml")
            svg = target / f"{Path(name).stem}.svg"
            subprocess.run(
                [dot, "-Tsvg", "-o", str(svg)],
                input=render_dot(spec),
                text=True,
                check=True,
            )
            print(f"wrote {svg}")
    return 1 if failed else 0


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
        print(f"{path}: {exc.strerror}", file=sys.stderr)
    return None
