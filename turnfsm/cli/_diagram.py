"""``turnfsm diagram`` and ``turnfsm check``."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from turnfsm._resources import load_machine, machines_dir
from turnfsm.core import render_dot, render_mermaid
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
    """Write (or, with `check`, compare) ``<name>.mmd`` and, with Graphviz, ``.svg``."""
    source = Path(machines) if machines else machines_dir()
    target = Path(out)
    try:
        rendered = render_all(source)
    except DefinitionError as exc:
        print(exc, file=sys.stderr)
        return 1
    if check:
        stale = [
            n
            for n, text in rendered.items()
            if not (target / n).is_file() or (target / n).read_text() != text
        ]
        for name in stale:
            print(f"stale: {target / name} (run `turnfsm diagram`)", file=sys.stderr)
        return 1 if stale else 0
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
    return 0


def run_check(file: str) -> int:
    """Validate one machine file; print its problems; 0 when it loads."""
    try:
        spec = load_machine(file)
    except DefinitionError as exc:
        print(exc, file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"{file}: {exc.strerror}", file=sys.stderr)
        return 1
    print(
        f"{file}: ok ({len(spec.states)} phases, {len(spec.transitions)} transitions)"
    )
    return 0
