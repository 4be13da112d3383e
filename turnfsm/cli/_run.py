"""``turnfsm run "task" --model ...``: one task on a real model, streamed."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import TextIO

import anyio

from turnfsm.agent import Agent
from turnfsm.cli._demo import ConsoleHook, run_and_close_store
from turnfsm.cli._stores import open_cli_store, where
from turnfsm.context import ContextManager
from turnfsm.driver import RunResult
from turnfsm.errors import ConfigError, StoreError
from turnfsm.hooks import Hook, OutcomeInfo, TextDeltaInfo
from turnfsm.providers import ModelClient

__all__ = ["StreamPrinter", "open_model", "run_and_close", "run_task"]

_KEYS = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY"}


class StreamPrinter(Hook):
    """Prints the model's text as it streams in."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.pending_newline = False

    def on_text_delta(self, info: TextDeltaInfo) -> None:
        """Print one piece of text, unbuffered."""
        self.out.write(info.text)
        self.out.flush()
        self.pending_newline = True

    def on_outcome(self, info: OutcomeInfo) -> None:
        """End a streamed reply's line before the next phase is printed."""
        if self.pending_newline:
            self.out.write("\n")
            self.pending_newline = False


@contextlib.contextmanager
def open_model(spec: str, *, n_ctx: int = 4096) -> Iterator[tuple[ModelClient, int]]:
    """Yield the model named by `spec` and its context window.

    `spec` is ``openai:MODEL``, ``anthropic:MODEL``, ``local`` (starts the
    bundled llama.cpp model, stopped on exit) or an OpenAI-compatible base
    URL (``http://host:port/v1``; ``URL#MODEL`` names the model).

    Only the provider `spec` needs is imported: a missing SDK is named with
    the extra that brings it.

    Raises:
        ConfigError: an unknown spec, or a missing API key (named).
        ImportError: the SDK `spec` needs is not installed (names the extra).
    """
    kind, _, name = spec.partition(":")
    if kind in _KEYS and name:
        if not os.environ.get(_KEYS[kind]):
            raise ConfigError("api_key", None, f"set {_KEYS[kind]} to use {spec}")
        if kind == "openai":
            from turnfsm.providers import OpenAIModel

            yield OpenAIModel(model=name), 128_000
        else:
            from turnfsm.providers import AnthropicModel

            yield AnthropicModel(model=name), 200_000
        return
    if spec == "local":
        from turnfsm.providers import LlamaServer

        local_client()  # the SDK first: no server is started for nothing
        with LlamaServer(n_ctx=n_ctx) as server:
            client = local_client(server.base_url)
            assert client is not None
            yield client, n_ctx
        return
    if spec.startswith(("http://", "https://")):
        from turnfsm.providers import OpenAIModel

        url, _, model = spec.partition("#")
        yield OpenAIModel(model=model or "default", base_url=url), n_ctx
        return
    raise ConfigError(
        "model", spec, "openai:MODEL, anthropic:MODEL, local, or an http(s) base URL"
    )


def local_client(base_url: str | None = None) -> ModelClient | None:
    """The OpenAI-compatible client of the bundled local model's server.

    With no `base_url`, only check that it can be made (before a server is
    started for it) and return None.

    Raises:
        ImportError: the ``local`` extra (which brings the OpenAI SDK) is
            not installed.
    """
    try:
        from turnfsm.providers import OpenAIModel
    except ImportError:
        raise ImportError(
            "the local model needs the local extra: pip install 'turnfsm[local]'"
        ) from None
    if base_url is None:
        return None
    # llama-cpp-python's server takes a JSON schema as a grammar through
    # `json_object` (its `json_schema` mode is not the OpenAI one), and offers
    # the tools only when a tool_choice is sent.
    return OpenAIModel(
        model="local",
        base_url=base_url,
        structured_output="json_object",
        tool_choice="auto",
    )


async def run_and_close(agent: Agent, task: str) -> RunResult:
    """Run `task`, then close the model's connections (if it has `close()`)."""
    try:
        return await agent.run(task)
    finally:
        close = getattr(agent.driver.model, "close", None)
        if close is not None:
            await close()


def run_task(
    task: str,
    model_spec: str,
    *,
    n_ctx: int = 4096,
    max_tokens: int = 256,
    out: TextIO | None = None,
    store: str | None = None,
) -> int:
    """Run `task` on the named model, printing phases and streamed text.

    The session is kept in `store` (a store spec; by default
    ``TURNFSM_STORE``, else the SQLite file in the user data directory).
    """
    stream = out or sys.stdout
    try:
        sessions = open_cli_store(store)
        with open_model(model_spec, n_ctx=n_ctx) as (model, window):
            agent = Agent(
                model=model,
                store=sessions,
                context=ContextManager(context_window=window),
                hooks=[ConsoleHook(stream, window=window), StreamPrinter(stream)],
                max_output_tokens=max_tokens,
            )
            result = anyio.run(run_and_close_store, agent, task)
    except (ConfigError, StoreError, ImportError, RuntimeError) as exc:
        # A missing key or extra, a local server that would not start, or a
        # store that cannot be opened.
        print(f"turnfsm run: {exc}", file=sys.stderr)
        return 2
    print(f"\nsession {result.session_id} stored in {where(sessions)}", file=stream)
    if not result.ok:
        print(f"\nrun failed: {result.error}", file=stream)
        return 1
    print(f"\n\nfinal answer ({result.turns} model calls): {result.text}", file=stream)
    return 0
