"""Known context windows: from the bundled catalogue, from a llama.cpp server.

A run's window is the model's when none is given; a window larger than the
model's known one is refused when the agent is built, with the real figure;
an unknown model takes the window given (else 200,000). Looking a window up
never touches the network.
"""

from __future__ import annotations

import http.server
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import http_server
from turnfsm import Agent
from turnfsm.cli import main
from turnfsm.cli._run import open_model
from turnfsm.context import ContextManager
from turnfsm.driver import Driver
from turnfsm.errors import ConfigError, WindowTooLarge
from turnfsm.providers import (
    FALLBACK_WINDOW,
    AnthropicModel,
    LlamaServer,
    OpenAIModel,
    known_window,
    server_window,
    window_for,
)
from turnfsm.testing import ScriptedModel

pytest.importorskip("openai")
pytest.importorskip("anthropic")


def openai_model(name: str, **options: Any) -> OpenAIModel:
    return OpenAIModel(name, api_key="sk-test", **options)


def anthropic_model(name: str, **options: Any) -> AnthropicModel:
    return AnthropicModel(name, api_key="sk-test", **options)


# -- the catalogue -----------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "provider", "window"),
    [
        ("gpt-4o", "openai", 128_000),
        ("gpt-4o-mini", "openai", 128_000),
        ("gpt-4o-2024-08-06", "openai", 128_000),  # a dated name: its model
        ("gpt-4.1", "openai", 1_000_000),
        ("claude-sonnet-4-5", "anthropic", 200_000),
        ("claude-3-5-haiku-latest", "anthropic", 200_000),
        ("claude-opus-4-1-20250805", "anthropic", 200_000),
        ("gpt-4o", None, 128_000),  # the provider found from the name
    ],
)
def test_known_models_resolve(model: str, provider: str | None, window: int) -> None:
    assert known_window(model, provider=provider) == window


@pytest.mark.parametrize(
    ("make", "name", "window"),
    [
        (openai_model, "gpt-4o", 128_000),
        (openai_model, "gpt-4o-mini", 128_000),
        (anthropic_model, "claude-sonnet-4-5", 200_000),
        (anthropic_model, "claude-3-5-haiku-latest", 200_000),
    ],
)
def test_the_clients_know_their_models_windows(
    make: Any, name: str, window: int
) -> None:
    assert make(name).context_window == window


@pytest.mark.parametrize(
    ("model", "options"),
    [
        ("my-fine-tune", {"provider": "openai"}),
        ("ft:gpt-4o-mini:acme::abc123", {"provider": "openai"}),
        ("claude-of-the-future", {"provider": "anthropic"}),
        ("llama-3-8b-local", {}),
        # A local server or a proxy is not the provider, whatever the name.
        ("gpt-4o", {"api_url": "http://127.0.0.1:8080/v1"}),
    ],
)
def test_unknown_models_have_no_known_window(
    model: str, options: dict[str, Any]
) -> None:
    assert known_window(model, **options) is None


def test_a_blank_model_name_is_refused() -> None:
    with pytest.raises(ConfigError) as info:
        known_window("")  # a blank name names no model
    assert info.value.field == "model"


# -- the window a run works in -----------------------------------------------


@pytest.mark.parametrize(
    ("model", "window"),
    [
        (lambda: openai_model("gpt-4o"), 128_000),
        (lambda: anthropic_model("claude-sonnet-4-5"), 200_000),
        (lambda: openai_model("local", base_url="http://127.0.0.1:9/v1"), 200_000),
        (lambda: openai_model("my-fine-tune"), FALLBACK_WINDOW),
        (lambda: ScriptedModel.of("hi"), FALLBACK_WINDOW),  # says no window
        (
            lambda: openai_model(
                "local", base_url="http://127.0.0.1:9/v1", context_window=2048
            ),
            2048,  # a local server's n_ctx, given to its client
        ),
    ],
)
def test_no_window_given_uses_the_models(model: Any, window: int) -> None:
    client = model()
    assert window_for(client) == window
    for agent_options in ({}, {"context": ContextManager()}):
        agent = Agent(model=client, **agent_options)
        assert agent.driver.context is not None
        assert agent.driver.context.context_window == window
        assert agent.driver.budget.context_window == window


def test_a_manager_without_a_window_is_left_as_it_was() -> None:
    manager = ContextManager(threshold=60)
    agent = Agent(model=openai_model("gpt-4o"), context=manager)
    assert manager.context_window is None  # the agent's is a copy
    assert agent.driver.context is not None
    assert agent.driver.context.threshold == 60
    assert agent.driver.context.threshold_line == 128_000 * 60 // 100


@pytest.mark.parametrize(
    ("model", "window"),
    [
        (lambda: openai_model("gpt-4o"), 100_000),  # under the model's
        (lambda: openai_model("gpt-4o"), 128_000),  # the model's own
        (lambda: openai_model("my-fine-tune"), 500_000),  # unknown: as given
        (lambda: ScriptedModel.of("hi"), 500_000),
        (lambda: anthropic_model("claude-of-the-future"), 1_000_000),
    ],
)
def test_a_window_that_fits_or_an_unknown_model_is_taken_as_given(
    model: Any, window: int
) -> None:
    manager = ContextManager(context_window=window)
    agent = Agent(model=model(), context=manager)
    assert agent.driver.context is manager
    assert agent.driver.budget.context_window == window


OVERSIZED = [
    pytest.param(lambda: openai_model("gpt-4o"), "gpt-4o", 128_000, id="openai"),
    pytest.param(
        lambda: openai_model("gpt-4o-2024-08-06"),
        "gpt-4o-2024-08-06",
        128_000,
        id="openai-dated",
    ),
    pytest.param(
        lambda: anthropic_model("claude-sonnet-4-5"),
        "claude-sonnet-4-5",
        200_000,
        id="anthropic",
    ),
]


@pytest.mark.parametrize(("model", "name", "real"), OVERSIZED)
@pytest.mark.parametrize(
    "build",
    [
        pytest.param(
            lambda m: Agent(model=m, context=ContextManager(context_window=500_000)),
            id="agent",
        ),
        pytest.param(
            lambda m: Driver(model=m, context=ContextManager(context_window=500_000)),
            id="driver",
        ),
        pytest.param(
            lambda m: Driver(model=m, context=None, context_window=500_000),
            id="driver-without-manager",
        ),
        pytest.param(lambda m: window_for(m, 500_000), id="window_for"),
    ],
)
def test_a_window_larger_than_the_models_is_refused(
    build: Any, model: Any, name: str, real: int
) -> None:
    with pytest.raises(WindowTooLarge) as info:
        build(model())
    error = info.value
    assert isinstance(error, ConfigError)
    assert (error.field, error.value, error.model, error.window) == (
        "context_window",
        500_000,
        name,
        real,
    )
    assert str(error).startswith(
        f"context_window=500000 is larger than {name}'s context window of "
        f"{real} tokens: give at most {real}"
    )


def test_a_threshold_over_the_models_window_is_refused() -> None:
    manager = ContextManager(threshold_tokens=150_000)  # fits 200,000 alone
    with pytest.raises(ConfigError) as info:
        Agent(model=openai_model("gpt-4o"), context=manager)
    assert (info.value.field, info.value.value) == ("threshold_tokens", 150_000)
    assert "128000" in str(info.value)


def test_a_client_can_be_told_its_window() -> None:
    assert openai_model("gpt-4o", context_window=64_000).context_window == 64_000
    with pytest.raises(ConfigError) as info:
        openai_model("gpt-4o", context_window=0)
    assert info.value.field == "context_window"


# -- the CLI -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "window"),
    [
        ("openai:gpt-4o", 128_000),
        ("openai:gpt-4.1", 1_000_000),
        ("anthropic:claude-sonnet-4-5", 200_000),
        ("openai:my-fine-tune", FALLBACK_WINDOW),
    ],
)
def test_the_cli_uses_the_models_window(
    spec: str, window: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test")
    with open_model(spec) as (_model, chosen):
        assert chosen == window


@pytest.mark.parametrize(
    ("spec", "name", "real"),
    [
        ("openai:gpt-4o", "gpt-4o", 128_000),
        ("anthropic:claude-sonnet-4-5", "claude-sonnet-4-5", 200_000),
    ],
)
def test_the_cli_refuses_a_window_larger_than_the_models(
    spec: str,
    name: str,
    real: int,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test")
    store = tmp_path / "sessions.db"
    code = main(
        ["run", "hi", "--model", spec, "--window", "500000", "--store", str(store)]
    )
    assert code == 2
    assert not store.exists()  # refused before anything is written
    err = capsys.readouterr().err
    assert err.startswith(
        f"turnfsm run: --window=500000 is larger than {name}'s context window "
        f"of {real} tokens"
    )


# -- a llama.cpp server's own window -------------------------------------------


class _Props(http.server.BaseHTTPRequestHandler):
    body: bytes = b""

    def do_GET(self) -> None:
        if self.path != "/props" or not self.body:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture
def props_server() -> Iterator[tuple[str, type[_Props]]]:
    with http_server(_Props) as (url, served):
        yield f"{url}/v1", served


@pytest.mark.parametrize(
    ("props", "window"),
    [
        ({"default_generation_settings": {"n_ctx": 4096}}, 4096),  # llama-server
        ({"n_ctx": 8192}, 8192),
        ({"default_generation_settings": {"n_ctx": 0}}, None),
        ({"default_generation_settings": {"n_ctx": True}}, None),
        ({"model_alias": "x"}, None),
        (["not", "an", "object"], None),
        (None, None),  # no /props: llama-cpp-python's server, others
    ],
)
def test_a_llama_cpp_servers_window_is_read_from_it(
    props: Any, window: int | None, props_server: tuple[str, type[_Props]]
) -> None:
    url, handler = props_server
    handler.body = b"" if props is None else json.dumps(props).encode()
    assert server_window(url) == window


@pytest.mark.parametrize(
    "body", [b"<html>oops</html>", b"[" * 100_000 + b"]" * 100_000]
)
def test_a_props_body_that_is_not_json_gives_no_window(
    body: bytes, props_server: tuple[str, type[_Props]]
) -> None:
    url, handler = props_server
    handler.body = body
    assert server_window(url) is None


def test_a_server_that_does_not_answer_has_no_window() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nobody listens
    assert server_window(f"http://127.0.0.1:{port}/v1", timeout=1) is None


def test_the_cli_takes_a_url_servers_window_from_it(
    props_server: tuple[str, type[_Props]],
) -> None:
    url, handler = props_server
    handler.body = json.dumps({"default_generation_settings": {"n_ctx": 3072}}).encode()
    with open_model(url) as (model, window):
        assert (window, getattr(model, "context_window", None)) == (3072, 3072)
    with pytest.raises(WindowTooLarge) as info, open_model(url, window=4096):
        pass
    assert (info.value.field, info.value.window) == ("--window", 3072)
    handler.body = b""  # a server that does not say: --n-ctx, as before
    with open_model(url, n_ctx=2048) as (_model, window):
        assert window == 2048


def test_a_local_server_that_has_not_started_knows_its_n_ctx() -> None:
    assert LlamaServer(n_ctx=1024).context_window == 1024


# -- no network ------------------------------------------------------------------

_OFFLINE = """
import json, socket
def refuse(*args, **kwargs):
    raise AssertionError(f"network access: {args!r}")
socket.socket.connect = refuse
socket.socket.connect_ex = refuse
socket.create_connection = refuse
socket.getaddrinfo = refuse

from genai_prices.data_snapshot import DataSnapshot, set_custom_snapshot
# What a run-time price update would install: never read.
set_custom_snapshot(DataSnapshot(providers=[], from_auto_update=True))

from turnfsm import Agent
from turnfsm.context import ContextManager
from turnfsm.errors import WindowTooLarge
from turnfsm.providers import AnthropicModel, OpenAIModel, known_window

found = [
    known_window("gpt-4o", provider="openai"),
    known_window("claude-sonnet-4-5", provider="anthropic"),
    known_window("my-fine-tune", provider="openai"),
    OpenAIModel("gpt-4o", api_key="k").context_window,
    AnthropicModel("claude-sonnet-4-5", api_key="k").context_window,
]
try:
    Agent(model=OpenAIModel("gpt-4o", api_key="k"),
          context=ContextManager(context_window=500_000))
except WindowTooLarge as exc:
    found.append(exc.window)
print(json.dumps(found))
"""


def test_no_lookup_touches_the_network(tmp_path: Path) -> None:
    """In a fresh process with every connection refused, and an updated
    snapshot installed the way genai-prices' updater would: the bundled
    figures, and no connection attempted."""
    done = subprocess.run(
        [sys.executable, "-c", _OFFLINE],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={**os.environ, "OPENAI_API_KEY": "", "ANTHROPIC_API_KEY": ""},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [
        128_000,
        200_000,
        None,
        128_000,
        200_000,
        128_000,
    ]


def test_no_lookup_touches_the_network_in_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refuse(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("network access")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    assert known_window("gpt-4o-mini", provider="openai") == 128_000
    with pytest.raises(WindowTooLarge):
        Agent(
            model=anthropic_model("claude-3-5-haiku-latest"),
            context=ContextManager(context_window=300_000),
        )


@pytest.mark.parametrize("stated", [0, -5, 1.5, "128000", True])
def test_a_client_stating_a_window_that_is_not_one_is_refused(stated: Any) -> None:
    class Stating:
        context_window = stated

        async def complete(self, request: Any) -> Any:
            raise AssertionError("not called")

    with pytest.raises(ConfigError) as info:
        Agent(model=Stating())
    assert (info.value.field, info.value.value) == ("model.context_window", stated)


@pytest.mark.parametrize(
    "choose",
    [
        pytest.param(lambda m: ContextManager().for_model(m), id="for_model"),
        pytest.param(window_for, id="window_for"),
        pytest.param(lambda m: window_for(m, 100_000), id="window_for-given"),
    ],
)
def test_a_models_name_is_refused_showing_where_a_name_is_looked_up(
    choose: Any,
) -> None:
    # for_model("gpt-4o") read the name as a client stating no window: 200,000,
    # though gpt-4o's is 128,000.
    with pytest.raises(ConfigError) as info:
        choose("gpt-4o")
    assert (info.value.field, info.value.value) == ("model", "gpt-4o")
    assert "known_window('gpt-4o') looks up a name's (128000)" in str(info.value)


@pytest.mark.parametrize(
    "model",
    [5, None, True, OpenAIModel, ScriptedModel],
    ids=["int", "none", "bool", "client-class", "scripted-class"],
)
def test_what_is_no_model_client_is_refused_naming_the_model(model: Any) -> None:
    for choose in (ContextManager().for_model, window_for):
        with pytest.raises(ConfigError) as info:
            choose(model)
        assert (info.value.field, info.value.value) == ("model", model)
    if isinstance(model, type):
        assert f"an instance, {model.__name__}(), not the class" in str(info.value)


def test_any_client_or_object_stating_a_window_is_a_model() -> None:
    class Stating:
        context_window = 4096

    assert window_for(Stating()) == 4096
    assert window_for(ScriptedModel.of("hi")) == FALLBACK_WINDOW
    assert ContextManager().for_model(openai_model("gpt-4o")).window == 128_000
