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


@pytest.fixture(scope="module")
def mypy_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache for the module's runs: the package is read once."""
    return tmp_path_factory.mktemp("mypy-cache")


def strict_mypy(code: str, tmp_path: Path, cache: Path) -> tuple[str, str, int]:
    """Run ``mypy --strict`` on `code` as a user's module; its out, err, status."""
    mypy_api = pytest.importorskip("mypy.api")
    mine = tmp_path / "mine.py"
    mine.write_text(textwrap.dedent(code))
    out, err, status = mypy_api.run(["--strict", "--cache-dir", str(cache), str(mine)])
    return out, err, status


def test_a_tool_made_by_the_decorator_with_options_is_typed(
    tmp_path: Path, mypy_cache: Path
) -> None:
    # `@function_tool(idempotent=True)` was "Untyped decorator makes function
    # 'fetch' untyped": function_tool returned Any.
    out, err, status = strict_mypy(USER_CODE, tmp_path, mypy_cache)
    assert (status, err) == (0, ""), out


CLIENTS_CODE = """
from typing import assert_type

from turnfsm.providers import AnthropicModel, OpenAIModel


async def main() -> None:
    async with OpenAIModel("gpt-4o-mini", api_key="k") as openai_model:
        assert_type(openai_model, OpenAIModel)
    async with AnthropicModel("claude-sonnet-4-5", api_key="k") as anthropic_model:
        assert_type(anthropic_model, AnthropicModel)
"""


def test_a_model_client_entered_with_async_with_keeps_its_type(
    tmp_path: Path, mypy_cache: Path
) -> None:
    out, err, status = strict_mypy(CLIENTS_CODE, tmp_path, mypy_cache)
    assert (status, err) == (0, ""), out
