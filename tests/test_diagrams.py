"""The committed diagrams are generated from machines/, must not drift, and read.

The Mermaid files are compared byte for byte. The SVG files (drawn by
whichever Graphviz ran `turnfsm diagram`) are checked without a screenshot:
they are at most twice as wide as tall and narrow enough for a README (their
labels stay legible at about 800 px), and every phase and every transition's
``trigger [guards] / outcome`` is in their text, on the edge it belongs to.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
from collections import defaultdict

import pytest

from tests.core.test_render import expected_edges
from tests.helpers import REPO_ROOT
from turnfsm._resources import load_machine
from turnfsm.cli._diagram import render_all
from turnfsm.core import MachineSpec, render_dot

SVG = "{http://www.w3.org/2000/svg}"
MACHINES = ["turn", "approval"]
MAX_WIDTH_PT = 1_000  # 10 pt labels at 800 px: 8 px and up
ARROW = re.compile(r"^(.+)->(.+)$")


def test_committed_diagrams_are_fresh() -> None:
    rendered = render_all(REPO_ROOT / "machines")
    assert {"turn.mmd", "approval.mmd"} <= set(rendered), "shipped machines missing"
    for name, text in rendered.items():
        committed = REPO_ROOT / "diagrams" / name
        assert committed.is_file(), f"{committed} missing: run `turnfsm diagram`"
        assert committed.read_text() == text, (
            f"{committed} is stale: run `turnfsm diagram`"
        )


def svg_size(root: ET.Element) -> tuple[float, float]:
    _, _, width, height = (float(v) for v in root.attrib["viewBox"].split())
    return width, height


def svg_texts(root: ET.Element) -> tuple[set[str], list[tuple[str, str, str]]]:
    """The nodes' texts, and ``(source, dest, label)`` of each edge drawn."""
    nodes: set[str] = set()
    edges: list[tuple[str, str, str]] = []
    legs: dict[str, list[str]] = defaultdict(list)
    for group in root.iter(f"{SVG}g"):
        title = group.findtext(f"{SVG}title", "")
        texts = [t.text or "" for t in group.iter(f"{SVG}text")]
        if group.get("class") == "node":
            nodes.update(texts)
            continue
        match = ARROW.match(title)
        if group.get("class") != "edge" or match is None:
            continue
        source, dest = match.groups()
        if dest.startswith("__junction_"):
            legs[dest].append(source)
        elif source != "__start":
            label = " ".join(t.strip() for t in texts if t.strip())
            edges.append((source, dest, label))
    # An edge out of a junction point leaves every phase that meets there.
    return nodes, [
        (leg, dest, label)
        for source, dest, label in edges
        for leg in legs.get(source, [source])
    ]


def check_svg(spec: MachineSpec, text: str) -> None:
    root = ET.fromstring(text)
    width, height = svg_size(root)
    assert width / height <= 2, f"{spec.name}: {width:.0f} x {height:.0f} pt"
    assert width <= MAX_WIDTH_PT, f"{spec.name}: {width:.0f} pt wide"
    nodes, edges = svg_texts(root)
    for state in spec.states:
        assert state.name in nodes
    pairs = {(source, dest): label for source, dest, label in edges}
    assert len(pairs) == len(edges), "two edges between the same phases"
    assert pairs == expected_edges(spec)


@pytest.mark.parametrize("name", MACHINES)
def test_committed_svgs_are_narrow_and_carry_every_label(name: str) -> None:
    spec = load_machine(REPO_ROOT / "machines" / f"{name}.toml")

    check_svg(spec, (REPO_ROOT / "diagrams" / f"{name}.svg").read_text())


@pytest.mark.skipif(shutil.which("dot") is None, reason="needs Graphviz's dot")
@pytest.mark.parametrize("name", MACHINES)
def test_this_graphviz_draws_them_narrow_with_every_label(name: str) -> None:
    spec = load_machine(REPO_ROOT / "machines" / f"{name}.toml")

    drawn = subprocess.run(
        ["dot", "-Tsvg"], input=render_dot(spec), text=True, capture_output=True
    )

    check_svg(spec, drawn.stdout)
