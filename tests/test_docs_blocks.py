"""The docs runner fails a page whose shown output is not what its code prints."""

from __future__ import annotations

import ast
import re
import textwrap
from collections import Counter
from pathlib import Path
from unittest import SkipTest

import pytest

from tests import docs_blocks

FENCE = "```"


def _page(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "page.md"
    path.write_text(textwrap.dedent(text).replace("~~~", FENCE))
    return path


@pytest.fixture(autouse=True)
def _uncounted(monkeypatch: pytest.MonkeyPatch) -> None:
    """These pages are not the project's: keep them out of the docs count."""
    monkeypatch.setattr(docs_blocks, "RUN", Counter())


def _run(path: Path) -> list[str]:
    """Evaluate every block of the page in order; what each did."""
    document = docs_blocks.docs_sybil().parse(path)
    outcomes: list[str] = []
    docs_blocks._setup(document.namespace)
    try:
        for example in document.examples():
            try:
                example.evaluate()
            except SkipTest as skip:
                outcomes.append(f"skipped: {skip}")
            except AssertionError as failure:
                outcomes.append(f"failed: {type(failure).__name__}")
            else:
                outcomes.append("ok")
    finally:
        docs_blocks._teardown(document.namespace)
    return outcomes


def test_a_page_that_shows_what_it_prints_passes(tmp_path: Path) -> None:
    page = _page(
        tmp_path,
        """
        ~~~python
        tokens = 1543
        print(f"{tokens} tokens")
        ~~~

        ~~~text
        1543 tokens
        ~~~

        ~~~python
        print(tokens + 1)
        ~~~

        ~~~text
        1544
        ~~~
        """,
    )
    assert _run(page) == ["ok", "ok"]


def test_changing_one_printed_number_fails_the_page(tmp_path: Path) -> None:
    page = _page(
        tmp_path,
        """
        ~~~python
        print(f"{1543} tokens")
        ~~~

        ~~~text
        1571 tokens
        ~~~
        """,
    )
    assert _run(page) == ["failed: ShownOutputDiffers"]


def test_a_block_that_prints_with_no_output_shown_fails(tmp_path: Path) -> None:
    page = _page(
        tmp_path,
        """
        ~~~python
        print("hidden")
        ~~~
        """,
    )
    assert _run(page) == ["failed: ShownOutputDiffers"]


def test_only_an_ellipsis_matches_what_varies(tmp_path: Path) -> None:
    page = _page(
        tmp_path,
        """
        ~~~python
        import uuid
        print("run", uuid.uuid4().hex, "done")
        ~~~

        ~~~text
        run ... done
        ~~~
        """,
    )
    assert _run(page) == ["ok"]


@pytest.mark.parametrize(
    "line",
    [
        "await anyio.sleep(0)",
        "async with anyio.create_task_group():\n    pass",
        "async for _ in anyio.wrap_file(io.StringIO()):\n    pass",
    ],
)
def test_a_block_that_awaits_outside_a_function_fails(
    tmp_path: Path, line: str
) -> None:
    # Copied into a file, such a block raises SyntaxError.
    page = _page(tmp_path, f"~~~python\nimport io\nimport anyio\n{line}\n~~~\n")
    assert _run(page) == ["failed: TopLevelAwait"]


def test_an_async_example_run_by_anyio_passes(tmp_path: Path) -> None:
    page = _page(
        tmp_path,
        """
        ~~~python
        import anyio


        async def main() -> None:
            await anyio.sleep(0)
            print("done")


        anyio.run(main)
        ~~~

        ~~~text
        done
        ~~~
        """,
    )
    assert _run(page) == ["ok"]


def test_a_console_command_is_run_and_its_output_compared(tmp_path: Path) -> None:
    good = _page(tmp_path, "~~~console\n$ echo 1543\n1543\n~~~\n")
    assert _run(good) == ["ok"]
    bad = _page(tmp_path, "~~~console\n$ echo 1543\n1571\n~~~\n")
    assert _run(bad) == ["failed: ShownOutputDiffers"]


def test_a_failing_shell_block_fails(tmp_path: Path) -> None:
    page = _page(tmp_path, "~~~sh\ntrue\nfalse\n~~~\n")
    assert _run(page) == ["failed: AssertionError"]


def test_a_labelled_block_is_skipped_with_its_reason(tmp_path: Path) -> None:
    page = _page(
        tmp_path,
        """
        <!-- skip: next "needs an OpenAI API key" -->

        ~~~python
        raise RuntimeError("never run")
        ~~~
        """,
    )
    # The directive is an example of its own, then the block it skips.
    assert _run(page) == ["ok", "skipped: needs an OpenAI API key"]


def test_a_machine_in_a_toml_block_must_load(tmp_path: Path) -> None:
    page = _page(
        tmp_path,
        """
        ~~~toml
        name = "broken"
        initial = "start"
        terminal = ["done"]
        states = {}
        transitions = []
        ~~~
        """,
    )
    with pytest.raises(Exception, match="start"):
        _run(page)


def test_a_page_runs_in_its_own_directory(tmp_path: Path) -> None:
    page = _page(
        tmp_path,
        """
        ~~~python
        import os
        open("left.txt", "w").close()
        here = os.getcwd()
        ~~~
        """,
    )
    before = Path.cwd()
    document = docs_blocks.docs_sybil().parse(page)
    docs_blocks._setup(document.namespace)
    try:
        for example in document.examples():
            example.evaluate()
    finally:
        docs_blocks._teardown(document.namespace)
    here = Path(document.namespace["here"])
    assert here != before
    assert Path.cwd() == before
    assert not here.exists()
    assert not (before / "left.txt").exists()


def _docstring_blocks() -> list[tuple[str, str]]:
    """Every ``python`` block in a docstring of the package: (where, source)."""
    root = docs_blocks.REPO_ROOT
    blocks: list[tuple[str, str]] = []
    for path in sorted((root / "turnfsm").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not isinstance(
                node,
                ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef,
            ):
                continue
            doc = ast.get_docstring(node)
            if doc is None:
                continue
            name = getattr(node, "name", "module")
            for n, found in enumerate(_PYTHON_FENCE.finditer(doc)):
                where = f"{path.relative_to(root)}:{name} block {n + 1}"
                blocks.append((where, textwrap.dedent(found.group(1))))
    return blocks


_PYTHON_FENCE = re.compile(r"```python\n(.*?)\n\s*```", re.DOTALL)


def test_the_docstrings_have_python_examples_to_check() -> None:
    # The pattern finds them: a check over no blocks would pass on anything.
    assert len(_docstring_blocks()) >= 10


@pytest.mark.parametrize(
    ("where", "source"), _docstring_blocks(), ids=lambda value: str(value)[:60]
)
def test_a_docstring_example_compiles_as_a_file(where: str, source: str) -> None:
    # Copied into a file, a docstring's example must at least compile: no
    # await outside a function, as the pages are held to.
    docs_blocks._compile(source, where, where)


INSTALL_BY_NAME = re.compile(r"pip install [^\n]*['\"]?\bturnfsm\[")
"""An extra installed by the package's name: from an index, not the checkout."""


def test_the_pages_install_extras_from_the_checkout() -> None:
    # The docs install turnfsm from a source checkout (`pip install .`); a
    # command `pip install 'turnfsm[local]'` asked the package index for it.
    root = docs_blocks.REPO_ROOT
    pages = [root / "README.md", *sorted((root / "docs").rglob("*.md"))]
    fence = re.compile(r"^```(?:sh|bash|console)\n(.*?)^```", re.M | re.S)
    found = [
        f"{page.relative_to(root)}: {line.strip()}"
        for page in pages
        for block in fence.findall(page.read_text(encoding="utf-8"))
        for line in block.splitlines()
        if INSTALL_BY_NAME.search(line)
    ]
    assert found == []
