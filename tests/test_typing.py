"""A user's own code that uses turnfsm type-checks under ``mypy --strict``."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # mypy reads the whole package: half a minute

USER_CODE = '''
from turnfsm import Tool, function_tool


@function_tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


@function_tool(idempotent=True)
async def fetch(url: str) -> str:
    """Fetch a page."""
    return url


tools: list[Tool] = [add, fetch]
'''


def test_a_tool_made_by_the_decorator_with_options_is_typed(tmp_path: Path) -> None:
    # `@function_tool(idempotent=True)` was "Untyped decorator makes function
    # 'fetch' untyped": function_tool returned Any.
    mypy_api = pytest.importorskip("mypy.api")
    mine = tmp_path / "mine.py"
    mine.write_text(textwrap.dedent(USER_CODE))
    out, err, status = mypy_api.run(
        ["--strict", "--cache-dir", str(tmp_path / "cache"), str(mine)]
    )
    assert (status, err) == (0, ""), out
