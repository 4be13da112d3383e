"""The docs' reference tables are generated from the code (tests/docs_tables.py).

The committed pages are fresh; a changed row fails the check, naming the page
and the table, and regenerating puts it back; every name the loader, the
errors package and the CLI accept is in its table. Edits happen in copies of
the pages, never in the repository.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests import docs_tables
from tests.helpers import REPO_ROOT
from turnfsm import core, errors
from turnfsm.core._spec import BUILTIN_TRIGGERS

MACHINE_PAGE = "docs/concepts/machine.md"


def _copy_pages(root: Path) -> None:
    for page in docs_tables.PAGES:
        (root / page).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO_ROOT / page, root / page)


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tests.docs_tables", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=False,
    )


def _region(page: str, name: str) -> str:
    text = (REPO_ROOT / page).read_text()
    found = [m for m in docs_tables.REGION.finditer(text) if m.group("name") == name]
    assert len(found) == 1, f"{page} has {len(found)} {name!r} regions"
    return found[0].group("body")


def _codes(text: str) -> set[str]:
    return set(re.findall(r"`([^`]+)`", text))


def test_the_committed_tables_are_fresh() -> None:
    assert docs_tables.problems(REPO_ROOT) == []


def test_a_changed_row_fails_the_check_and_regenerating_restores_it(
    tmp_path: Path,
) -> None:
    _copy_pages(tmp_path)
    page = tmp_path / MACHINE_PAGE
    fresh = page.read_text()
    rows = fresh.splitlines()
    row = next(line for line in rows if "`is_message_line_spent` |" in line)
    page.write_text(fresh.replace(row + "\n", ""))

    check = _run("--check", "--root", str(tmp_path))
    assert check.returncode == 1, check
    assert check.stderr.splitlines() == [
        f"{MACHINE_PAGE}: the generated table 'guards' is stale",
        "run `python -m tests.docs_tables` to regenerate",
    ]

    write = _run("--root", str(tmp_path))
    assert write.returncode == 0, write
    assert write.stdout == f"wrote {MACHINE_PAGE}\n"
    assert page.read_text() == fresh
    assert _run("--check", "--root", str(tmp_path)).returncode == 0


def test_a_missing_region_is_reported(tmp_path: Path) -> None:
    _copy_pages(tmp_path)
    page = tmp_path / "docs/reference/errors.md"
    text = page.read_text()
    page.write_text(text.replace("<!-- generated: errors -->", "<!-- errors -->"))
    assert docs_tables.problems(tmp_path) == [
        "the generated table 'errors' is on 0 pages' markers, expected once in "
        + ", ".join(docs_tables.PAGES)
    ]


def test_an_unknown_region_is_refused_by_name() -> None:
    text = "<!-- generated: gaurds -->\n<!-- end generated -->\n"
    with pytest.raises(ValueError, match=r"page\.md: unknown generated table 'gaurds'"):
        docs_tables.regenerate(text, "page.md")


@pytest.mark.parametrize(
    ("region", "names"),
    [
        ("guards", set(core.GUARDS)),
        ("reducers", set(core.REDUCERS)),
        ("failures", set(core.FAILURES)),
        ("triggers", set(BUILTIN_TRIGGERS)),
        ("decisions", set(docs_tables.decision_classes())),
    ],
)
def test_every_name_a_machine_file_may_use_is_in_its_table(
    region: str, names: set[str]
) -> None:
    assert names - _codes(_region(MACHINE_PAGE, region)) == set()


def test_every_guard_reducer_and_error_the_shipped_machines_use_is_listed() -> None:
    used: dict[str, set[str]] = {"guards": set(), "reducers": set(), "failures": set()}
    for path in sorted((REPO_ROOT / "machines").glob("*.toml")):
        spec = tomllib.loads(path.read_text())
        for t in spec["transitions"]:
            used["guards"] |= {*t.get("conditions", ()), *t.get("unless", ())}
            used["reducers"] |= set(t.get("actions", ()))
            used["failures"] |= {t["error"]} if "error" in t else set()
        for state in spec["states"].values():
            used["reducers"] |= set(state.get("on_enter", ()))
    assert {"is_message_line_spent", "is_message_count_pass"} <= used["guards"]
    for region, names in used.items():
        assert names - _codes(_region(MACHINE_PAGE, region)) == set(), region


def test_every_error_class_is_in_the_tree() -> None:
    classes = {
        name
        for name in errors.__all__
        if isinstance(obj := getattr(errors, name), type)
        and issubclass(obj, BaseException)
    }
    tree = _region("docs/reference/errors.md", "errors")
    assert classes - _codes(tree) == set()
    assert "    - [`WindowTooLarge`][turnfsm.errors.WindowTooLarge]" in tree


def test_every_subcommand_has_its_help_on_the_cli_page() -> None:
    text = (REPO_ROOT / "docs/reference/cli.md").read_text()
    usages = set(re.findall(r"^ *usage: turnfsm (\w+)", text, re.MULTILINE))
    commands = set(docs_tables.subcommands(docs_tables.cli_parser()))
    assert len(commands) == 15
    assert commands == usages


def _docstring_tree() -> list[tuple[int, str]]:
    """(depth, name) of each line of the tree in `turnfsm.errors`' docstring."""
    doc = errors.__doc__ or ""
    block = doc.split("```")[1]
    found = []
    for line in block.strip("\n").splitlines():
        match = re.match(r"^((?:│   |    )*)(?:[├└]── )?(\w+)", line)
        assert match, line
        depth = len(match.group(1)) // 4 + (1 if "── " in line else 0)
        found.append((depth, match.group(2)))
    return found


def test_the_tree_in_the_errors_docstring_is_the_class_tree() -> None:
    classes = {
        name: obj
        for name in errors.__all__
        if isinstance(obj := getattr(errors, name), type)
        and issubclass(obj, errors.TurnFSMError)
    }
    tree = _docstring_tree()
    assert sorted(name for _, name in tree) == sorted(classes)
    parents: list[str] = []
    for depth, name in tree:
        del parents[depth:]
        if parents:
            assert classes[name].__bases__[0] is classes[parents[-1]], name
        parents.append(name)
