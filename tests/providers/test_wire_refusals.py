"""What a failed run's error says when a model server refused it, on the wire.

A real local HTTP server answers 429 or 503 with a Retry-After (in seconds,
or as an HTTP date), or stalls past the run's `model_timeout` or the
client's own `timeout`. Both shipped clients are run against it, and the
run's error is read as the run returns it and as the store keeps it.
"""

from __future__ import annotations

import email.utils
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import attrs
import pytest

from tests.providers.test_wire import _Wire, asyncio_only, wire
from turnfsm import Agent, RetryPolicy
from turnfsm.errors import ProviderError
from turnfsm.persistence import Session
from turnfsm.persistence.sqlite import SQLiteStore
from turnfsm.providers._anthropic import AnthropicModel
from turnfsm.providers._openai import OpenAIModel

__all__ = ["wire"]  # the fixture, served here too

pytestmark = [pytest.mark.anyio, asyncio_only]

Client = Callable[..., AnthropicModel | OpenAIModel]


def _openai(url: str, timeout: float = 30) -> OpenAIModel:
    return OpenAIModel("m", base_url=f"{url}/v1", api_key="k", timeout=timeout)


def _anthropic(url: str, timeout: float = 30) -> AnthropicModel:
    return AnthropicModel("claude-x", base_url=url, api_key="k", timeout=timeout)


CLIENTS = [
    pytest.param(_openai, id="openai"),
    pytest.param(_anthropic, id="anthropic"),
]


def _refusal(status: int) -> list[bytes | float]:
    """An error body both APIs' shapes read: OpenAI's ``error``, Anthropic's type."""
    kind = "rate_limit_error" if status == 429 else "api_error"
    body = {"type": "error", "error": {"type": kind, "message": "slow down"}}
    return [json.dumps(body).encode()]


def _in_seven_seconds() -> str:
    return email.utils.formatdate(time.time() + 7, usegmt=True)


async def _stored(db: Path, session_id: str, run_id: str) -> ProviderError:
    """The run's error as a fresh store on the same file reads it back."""
    session = await Session.load(SQLiteStore(db), session_id)
    (run,) = [run for run in session.runs if run.run_id == run_id]
    assert isinstance(run.error, ProviderError)
    return run.error


async def _failed(agent: Agent, db: Path) -> ProviderError:
    """The error of `agent`'s run, which fails: as returned, and as stored."""
    with anyio.fail_after(20):
        result = await agent.run("hi")
    assert result.outcome == "failed"
    error = result.error
    assert isinstance(error, ProviderError)
    stored = await _stored(db, agent.session.id, result.run_id)
    assert attrs.asdict(stored) == attrs.asdict(error)
    return error


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize(
    ("status", "kind", "retry_after"),
    [
        pytest.param(429, "rate_limit", lambda: "7", id="429-seconds"),
        pytest.param(429, "rate_limit", _in_seven_seconds, id="429-date"),
        pytest.param(503, "server", lambda: "7", id="503-seconds"),
    ],
)
@pytest.mark.parametrize(
    "policy",
    [
        pytest.param(RetryPolicy(max_attempts=1), id="retries-off"),
        pytest.param(
            RetryPolicy(max_attempts=3, initial_wait=0.01, max_total=3),
            id="past-the-budget",
        ),
    ],
)
async def test_a_run_refused_with_a_retry_after_keeps_the_wait_in_its_error(
    wire: tuple[str, type[_Wire]],
    tmp_path: Path,
    client: Client,
    status: int,
    kind: str,
    retry_after: Callable[[], str],
    policy: RetryPolicy,
) -> None:
    # The client read the wait and the log's model failure kept it, but the
    # run's error (and the stored run's) said retry_after=None.
    url, handler = wire
    handler.status = status
    handler.kind = "application/json"
    handler.sent = {"Retry-After": retry_after()}
    handler.pieces = _refusal(status)
    agent = Agent(model=client(url), retry=policy, store=SQLiteStore(tmp_path / "s.db"))
    error = await _failed(agent, tmp_path / "s.db")
    assert (error.kind, error.status, error.retryable) == (kind, status, True)
    assert error.retry_after is not None
    assert 5 < error.retry_after <= 7
    assert (error.attempts, handler.posts) == (1, 1)


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("bound", ["model_timeout", "client timeout"])
async def test_a_call_that_timed_out_fails_with_kind_timeout_whatever_bounded_it(
    wire: tuple[str, type[_Wire]], tmp_path: Path, client: Client, bound: str
) -> None:
    # Past model_timeout the run's error had the kind "TimeoutError"; past
    # the client's own timeout, "timeout": one failure, two kinds.
    url, handler = wire
    handler.kind = "application/json"
    handler.pieces = [2.0, b"{}"]  # the headers, then nothing for 2 s
    timeouts: dict[str, Any] = (
        {"model_timeout": 0.3} if bound == "model_timeout" else {}
    )
    model = client(url, timeout=0.3 if bound == "client timeout" else 30)
    agent = Agent(
        model=model,
        retry=RetryPolicy(max_attempts=1),
        store=SQLiteStore(tmp_path / "s.db"),
        **timeouts,
    )
    error = await _failed(agent, tmp_path / "s.db")
    assert (error.kind, error.status, error.retryable) == ("timeout", None, True)
    assert error.retry_after is None
    setting = "model_timeout=0.3" if bound == "model_timeout" else ".timeout=0.3"
    assert setting in error.message
    assert str(error).startswith("model provider error [timeout]: ")
