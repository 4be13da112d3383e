"""Every public package has a sorted, complete `__all__` of documented names."""

from __future__ import annotations

import ast
import importlib
import inspect
import pathlib
import pkgutil
import typing

import pytest

import turnfsm

PACKAGES = [
    "turnfsm",
    "turnfsm.agent",
    "turnfsm.context",
    "turnfsm.core",
    "turnfsm.driver",
    "turnfsm.errors",
    "turnfsm.evals",
    "turnfsm.hooks",
    "turnfsm.messages",
    "turnfsm.persistence",
    "turnfsm.providers",
    "turnfsm.serde",
    "turnfsm.simulate",
    "turnfsm.temporal",
    "turnfsm.testing",
    "turnfsm.tokens",
    "turnfsm.tracing",
    "turnfsm.values",
    "turnfsm.view",
]
# Built for subclassing (or protocols / type aliases), so not @final.
OPEN = {"Hook", "TurnFSMError", "ContextExceeded"}


def _isort_key(name: str) -> tuple[int, str]:
    # ruff's RUF022 order: CONSTANTS, then CamelCase, then everything else.
    if name.isupper():
        return (0, name)
    if name[:1].isupper():
        return (1, name)
    return (2, name)


@pytest.mark.parametrize("name", PACKAGES)
def test_all_is_sorted_and_names_exist(name: str) -> None:
    module = importlib.import_module(name)
    exported = list(module.__all__)
    assert exported == sorted(exported, key=_isort_key)
    for attr in exported:
        assert hasattr(module, attr), f"{name}.{attr} is in __all__ but missing"


@pytest.mark.parametrize("name", PACKAGES)
def test_public_objects_have_docstrings(name: str) -> None:
    module = importlib.import_module(name)
    assert module.__doc__
    for attr in module.__all__:
        obj = getattr(module, attr)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            assert inspect.getdoc(obj), f"{name}.{attr} has no docstring"


@pytest.mark.parametrize("name", PACKAGES)
def test_public_concrete_classes_are_final(name: str) -> None:
    module = importlib.import_module(name)
    for attr in module.__all__:
        obj = getattr(module, attr)
        if not inspect.isclass(obj) or attr in OPEN:
            continue
        if issubclass(obj, typing.Protocol) or issubclass(obj, BaseException):  # type: ignore[arg-type]
            continue
        if (
            isinstance(obj, type)
            and issubclass(obj, str)
            and hasattr(obj, "__members__")
        ):
            continue  # enums cannot be subclassed anyway
        assert getattr(obj, "__final__", False), f"{name}.{attr} should be @final"


def test_private_modules_declare_all() -> None:
    for info in pkgutil.walk_packages(turnfsm.__path__, "turnfsm."):
        if info.name.rsplit(".", 1)[-1].startswith("_") and not info.name.endswith(
            "__main__"
        ):
            module = importlib.import_module(info.name)
            assert hasattr(module, "__all__"), f"{info.name} has no __all__"


def test_the_root_packages_type_imports_are_its_table() -> None:
    """`_LAZY` is the one list; the imports type checkers read must match it."""
    tree = ast.parse(inspect.getsource(turnfsm))
    (block,) = [
        node
        for node in tree.body
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
    ]
    imported = {
        alias.asname or alias.name: node.module
        for node in block.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert all(
        alias.asname == alias.name
        for node in block.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    ), "each name is re-exported explicitly (`X as X`)"
    assert imported == turnfsm._LAZY
    assert turnfsm.__all__ == sorted(turnfsm._LAZY)


PINNED = pathlib.Path(__file__).with_name("public_api.txt")


def _public_names() -> list[str]:
    return [
        f"{name}.{attr}"
        for name in PACKAGES
        for attr in importlib.import_module(name).__all__
    ]


def test_the_public_surface_is_pinned() -> None:
    """Adding or removing a public name is a decision: update public_api.txt."""
    assert _public_names() == PINNED.read_text().split(), (
        "the public surface changed; if on purpose, write the new list to "
        f"{PINNED.name} (one qualified name per line)"
    )
