"""The brain stays sans-IO: no I/O, clock, randomness, async or outer layers.

Two checks: the AST of every module in `turnfsm/core` (what the code says it
imports), and a clean interpreter importing each module (what actually loads).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT

CORE = REPO_ROOT / "turnfsm" / "core"
CORE_FILES = sorted(CORE.glob("*.py"))

FORBIDDEN_IMPORTS = (
    "anyio",
    "asyncio",
    "trio",
    "os",
    "sys",
    "time",
    "random",
    "logging",
    "socket",
    "threading",
    "subprocess",
    "opentelemetry",
    "openai",
    "anthropic",
    "httpx",
    "sqlite3",
    "psycopg",
    "pathlib",
    "io",
    "importlib",
    "turnfsm.driver",
    "turnfsm.context",
    "turnfsm.providers",
    "turnfsm.persistence",
    "turnfsm.tracing",
)
"""Modules the core must not import (`importlib` would hide any of them)."""

FORBIDDEN_AT_RUNTIME = (
    "anyio",
    "asyncio",
    "trio",
    "opentelemetry",
    "openai",
    "anthropic",
    "httpx",
    "sqlite3",
    "psycopg",
    "tenacity",
)
"""Modules importing the core must not load, even through a dependency."""

ALLOWED_TURNFSM = (
    "turnfsm._checks",
    "turnfsm._identity",
    "turnfsm._json",
    "turnfsm._lines",
    "turnfsm._waits",
    "turnfsm.core",
    "turnfsm.messages",
    "turnfsm.errors",
    "turnfsm.tokens",
    "turnfsm.values",
)
"""The only turnfsm modules the core may load: itself, the pure value modules,
the shared validators, the shared JSON encoders (`json` and `re` alone), the
emergency line's arithmetic (nothing) and the identity map (`weakref` alone)."""


def is_within(module: str, roots: tuple[str, ...]) -> bool:
    return any(module == root or module.startswith(f"{root}.") for root in roots)


def imported_names(node: ast.Import | ast.ImportFrom, package: str) -> list[str]:
    """Return the absolute module names an import statement can bind."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        parts = package.split(".")
        anchor = ".".join(parts[: len(parts) - node.level + 1])
        base = f"{anchor}.{base}" if base else anchor
    # `from turnfsm import driver` imports the submodule turnfsm.driver
    return [base, *(f"{base}.{alias.name}" for alias in node.names)]


def impurities(source: str, package: str = "turnfsm.core") -> list[str]:
    """Return what makes `source` impure, one line per finding."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import | ast.ImportFrom):
            for name in imported_names(node, package):
                if is_within(name, FORBIDDEN_IMPORTS):
                    found.append(f"line {node.lineno}: imports {name}")
        elif isinstance(node, ast.AsyncFunctionDef | ast.AsyncFor | ast.AsyncWith):
            found.append(f"line {node.lineno}: async {type(node).__name__}")
        elif isinstance(node, ast.Await):
            found.append(f"line {node.lineno}: await")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "__import__"
        ):
            found.append(f"line {node.lineno}: __import__()")
    return found


def test_the_core_modules_are_all_checked() -> None:
    names = {path.stem for path in CORE_FILES}

    assert names >= {
        "__init__",
        "_decisions",
        "_events",
        "_guards",
        "_lines",
        "_machine",
        "_phases",
        "_reducers",
        "_render",
        "_snapshot",
        "_spec",
    }


@pytest.mark.parametrize("path", CORE_FILES, ids=lambda p: p.name)
def test_core_module_is_pure(path: Path) -> None:
    assert impurities(path.read_text(encoding="utf-8")) == []


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import os", ["line 1: imports os"]),
        ("import os.path", ["line 1: imports os.path"]),
        ("from os import path", ["line 1: imports os", "line 1: imports os.path"]),
        ("import asyncio as aio", ["line 1: imports asyncio"]),
        (
            "from turnfsm import driver",
            ["line 1: imports turnfsm.driver"],
        ),
        (
            "from turnfsm.tracing import Hook",
            ["line 1: imports turnfsm.tracing", "line 1: imports turnfsm.tracing.Hook"],
        ),
        (
            "from ..context import ContextManager",
            [
                "line 1: imports turnfsm.context",
                "line 1: imports turnfsm.context.ContextManager",
            ],
        ),
        ("from .. import providers", ["line 1: imports turnfsm.providers"]),
        (
            "async def f():\n    await g()",
            ["line 1: async AsyncFunctionDef", "line 2: await"],
        ),
        (
            "def f():\n    return __import__('time')",
            ["line 2: __import__()"],
        ),
        ("import osmosis, iolite, timeit_free", []),
        ("from . import _lines\nfrom .. import errors, messages", []),
        ("from turnfsm.tokens import HeuristicTokenCounter", []),
    ],
    ids=[
        "os",
        "os.path",
        "from-os",
        "alias",
        "from-turnfsm-import-driver",
        "from-turnfsm.tracing",
        "relative-context",
        "relative-providers",
        "async-await",
        "dunder-import",
        "lookalike-names",
        "relative-pure",
        "tokens-allowed",
    ],
)
def test_purity_check_finds_what_it_should(source: str, expected: list[str]) -> None:
    assert impurities(source) == expected


def test_purity_check_finds_async_loops_and_context_managers() -> None:
    source = (
        "async def f(xs, cm):\n"
        "    async for x in xs:\n"
        "        async with cm:\n"
        "            pass"
    )

    assert impurities(source) == [
        "line 1: async AsyncFunctionDef",
        "line 2: async AsyncFor",
        "line 3: async AsyncWith",
    ]


LOADER = """
import importlib, json, sys, types
root, name = sys.argv[1], sys.argv[2]
package = types.ModuleType("turnfsm")  # skip turnfsm/__init__: test the core alone
package.__path__ = [root + "/turnfsm"]
sys.modules["turnfsm"] = package
before = set(sys.modules)
importlib.import_module(name)
print(json.dumps(sorted(set(sys.modules) - before)))
"""


def module_name(path: Path) -> str:
    return "turnfsm.core" if path.stem == "__init__" else f"turnfsm.core.{path.stem}"


@pytest.mark.parametrize("path", CORE_FILES, ids=lambda p: p.name)
def test_importing_the_core_loads_nothing_async_or_outer(path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-I", "-c", LOADER, str(REPO_ROOT), module_name(path)],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    loaded = json.loads(done.stdout)

    assert module_name(path) in loaded
    assert [m for m in loaded if is_within(m, FORBIDDEN_AT_RUNTIME)] == []
    assert [
        m
        for m in loaded
        if is_within(m, ("turnfsm",))
        and m != "turnfsm"
        and not is_within(m, ALLOWED_TURNFSM)
    ] == []
