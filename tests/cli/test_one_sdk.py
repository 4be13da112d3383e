"""The CLI with one SDK, or none: each `--model` imports only the provider it
needs, and a missing one is named with the extra that brings it.

Each case runs `turnfsm` in a fresh interpreter where the SDKs that are "not
installed" cannot be imported (their module entries are None).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

_RUN = """
import sys
for name in {blocked!r}:
    sys.modules[name] = None  # import fails, as if not installed
from turnfsm.cli import main
sys.exit(main({argv!r}))
"""


def cli(
    argv: list[str], *, blocked: tuple[str, ...]
) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "OPENAI_API_KEY": "sk-test",
        "ANTHROPIC_API_KEY": "sk-test",
        "TURNFSM_STORE": "memory:",
    }
    return subprocess.run(
        [sys.executable, "-c", _RUN.format(blocked=blocked, argv=argv)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )


ONLY_OPENAI = ("anthropic",)
ONLY_ANTHROPIC = ("openai",)
NEITHER = ("openai", "anthropic")


@pytest.mark.parametrize(
    ("blocked", "model", "extra"),
    [
        (ONLY_ANTHROPIC, "openai:gpt-4o-mini", "turnfsm[openai]"),
        (ONLY_OPENAI, "anthropic:claude-3-5-haiku-latest", "turnfsm[anthropic]"),
        (ONLY_ANTHROPIC, "http://127.0.0.1:9/v1", "turnfsm[openai]"),
        (NEITHER, "openai:gpt-4o-mini", "turnfsm[openai]"),
        (NEITHER, "anthropic:claude-3-5-haiku-latest", "turnfsm[anthropic]"),
    ],
)
def test_a_missing_sdk_is_named_with_its_extra(
    blocked: tuple[str, ...], model: str, extra: str
) -> None:
    done = cli(["run", "hi", "--model", model], blocked=blocked)
    assert done.returncode == 2, done.stderr
    assert extra in done.stderr
    other = "anthropic" if "openai" in extra else "openai"
    assert f"turnfsm[{other}]" not in done.stderr


@pytest.mark.parametrize("blocked", [ONLY_OPENAI, ONLY_ANTHROPIC, NEITHER])
def test_the_other_errors_need_no_sdk(blocked: tuple[str, ...]) -> None:
    unknown = cli(["run", "hi", "--model", "nonsense"], blocked=blocked)
    assert unknown.returncode == 2
    assert "openai:MODEL, anthropic:MODEL, local" in unknown.stderr
    assert "SDK" not in unknown.stderr


def test_with_only_the_openai_sdk_a_missing_key_is_named() -> None:
    env_run = subprocess.run(
        [
            sys.executable,
            "-c",
            _RUN.format(blocked=ONLY_OPENAI, argv=["run", "hi", "--model", "openai:m"]),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
        | {"TURNFSM_STORE": "memory:"},
        check=False,
    )
    assert env_run.returncode == 2
    assert "OPENAI_API_KEY" in env_run.stderr
    assert "Anthropic" not in env_run.stderr


def test_the_local_model_without_its_extra_names_the_local_extra() -> None:
    done = cli(["demo", "--model", "local", "--store", "memory:"], blocked=NEITHER)
    assert done.returncode == 2, done.stderr
    assert "turnfsm[local]" in done.stderr
    assert "turnfsm[openai]" not in done.stderr


def test_the_simulated_demo_needs_no_sdk() -> None:
    done = cli(["demo", "--quiet", "--store", "memory:"], blocked=NEITHER)
    assert done.returncode == 0, done.stderr
    assert "final answer" in done.stdout


def test_with_only_the_openai_sdk_an_openai_compatible_model_runs() -> None:
    """The report: with only [openai], every --model failed naming Anthropic."""
    done = cli(["run", "hi", "--model", "http://127.0.0.1:9/v1"], blocked=ONLY_OPENAI)
    said = done.stdout + done.stderr
    assert "Anthropic" not in said
    assert "SDK" not in said
    assert "could not reach" in said  # it got as far as calling the server


@pytest.mark.parametrize(
    ("model", "extra"),
    [
        ("openai:gpt-4o-mini", "turnfsm[openai]"),
        ("anthropic:claude-3-5-haiku-latest", "turnfsm[anthropic]"),
    ],
)
def test_a_missing_sdk_is_named_before_a_missing_key(model: str, extra: str) -> None:
    keyless = {
        k: v
        for k, v in os.environ.items()
        if k not in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY")
    }
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            _RUN.format(blocked=NEITHER, argv=["run", "hi", "--model", model]),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=keyless | {"TURNFSM_STORE": "memory:"},
        check=False,
    )
    assert done.returncode == 2
    assert extra in done.stderr
    assert "API_KEY" not in done.stderr.split(extra)[0]
