"""Each model client with a ``close()`` is an async context manager that closes it."""

from __future__ import annotations

from collections.abc import Callable

import anthropic
import anyio
import anyio.lowlevel
import httpx2
import openai
import pytest

from tests.providers._mock import Server, anthropic_reply, openai_reply, text_block
from turnfsm.messages import Message
from turnfsm.providers import AnthropicModel, ModelRequest, OpenAIModel

pytestmark = pytest.mark.anyio

Client = OpenAIModel | AnthropicModel


class Connections(httpx2.MockTransport):
    """A scripted server whose close, like a connection pool's, awaits."""

    closed = False

    async def aclose(self) -> None:
        await anyio.lowlevel.checkpoint()  # a cancelled, unshielded close stops here
        self.closed = True


def openai_model(http: httpx2.AsyncClient) -> OpenAIModel:
    sdk = openai.AsyncOpenAI(api_key="k", base_url="http://x.test/v1", http_client=http)
    return OpenAIModel("m", client=sdk)


def anthropic_model(http: httpx2.AsyncClient) -> AnthropicModel:
    return AnthropicModel(
        "m", client=anthropic.AsyncAnthropic(api_key="k", http_client=http)
    )


CLIENTS: dict[str, tuple[Callable[[httpx2.AsyncClient], Client], httpx2.Response]] = {
    "openai": (openai_model, openai_reply("ok")),
    "anthropic": (anthropic_model, anthropic_reply(text_block("ok"))),
}


@pytest.fixture(params=CLIENTS.values(), ids=CLIENTS.keys())
def client(request: pytest.FixtureRequest) -> tuple[Client, Connections]:
    make, reply = request.param
    connections = Connections(Server(reply))
    return make(httpx2.AsyncClient(transport=connections)), connections


async def test_async_with_yields_the_model_and_closes_it_on_exit(
    client: tuple[Client, Connections],
) -> None:
    model, connections = client
    async with model as entered:
        assert entered is model
        reply = await entered.complete(ModelRequest(messages=[Message.user("hi")]))
        assert not connections.closed
    assert reply.message.text == "ok"
    assert connections.closed


async def test_async_with_closes_the_model_when_the_block_raises(
    client: tuple[Client, Connections],
) -> None:
    model, connections = client
    with pytest.raises(RuntimeError, match="the block's own"):
        async with model:
            raise RuntimeError("the block's own")
    assert connections.closed


async def test_async_with_closes_the_model_when_the_block_is_cancelled(
    client: tuple[Client, Connections],
) -> None:
    model, connections = client
    with anyio.fail_after(5), anyio.CancelScope() as scope:
        async with model:
            scope.cancel()
            await anyio.sleep(10)
    assert scope.cancelled_caught
    assert connections.closed
