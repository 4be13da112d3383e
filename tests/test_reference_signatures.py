"""The API reference shows attrs defaults, never private validator names.

mkdocstrings renders an attribute's value as written; the Griffe extension
`scripts/griffe_attrs.py` (configured in mkdocs.yml) replaces each
``attrs.field(...)`` call by the field's default.
"""

from __future__ import annotations

import re

import pytest

from tests.helpers import REPO_ROOT

griffe = pytest.importorskip("griffe")

PRIVATE_CALL = re.compile(r"attrs\.field|attr\.ib|validator=|converter=|_checks\.")
"""What an attrs field's call would show (the validators are private)."""


def _load() -> object:
    extensions = griffe.load_extensions(
        f"{REPO_ROOT / 'scripts' / 'griffe_attrs.py'}:AttrsDefaults"
    )
    loader = griffe.GriffeLoader(extensions=extensions, search_paths=[str(REPO_ROOT)])
    return loader.load("turnfsm")


def _attribute_values(obj: object) -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    """The values of public attributes of public classes (what the reference shows)."""
    for member in getattr(obj, "members", {}).values():
        if getattr(member, "is_alias", False):
            continue
        public = not member.name.startswith("_")
        if member.is_attribute and public and member.value is not None:
            found.append((member.path, str(member.value)))
        if member.is_module or (member.is_class and public):
            found.extend(_attribute_values(member))
    return found


def test_no_rendered_attribute_value_names_a_validator() -> None:
    values = _attribute_values(_load())
    bad = [(path, value) for path, value in values if PRIVATE_CALL.search(value)]
    assert bad == []


def test_an_attrs_default_is_shown_as_the_value() -> None:
    package: object = _load()
    driver = package["driver._driver.Driver"]  # type: ignore[index]
    assert str(driver["max_turns"].value) == "50"
    assert str(driver["retry"].value) == "RetryPolicy()"
    measured = package["core._events.Measured"]  # type: ignore[index]
    assert measured["estimate"].value is None
