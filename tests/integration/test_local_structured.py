"""A structured final answer from the real local model, through a JSON-schema grammar.

llama.cpp serves Gemma 3 270M on loopback; `OpenAIModel(structured_output=
"json_object")` sends the output type's schema as ``response_format``, which
the server compiles into a grammar, so even this tiny model can only write
JSON of the right shape. The driver validates it and reads it into the type.

Skipped when the ``local`` extra is missing, unless TURNFSM_REQUIRE_LOCAL_MODEL
is set (CI sets it, so a broken install fails instead of skipping).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator

import anyio
import httpx2
import openai
import pytest

from tests.integration._local import require_local_extra, threads
from turnfsm.driver import Driver, RunResult
from turnfsm.driver._output import OutputType
from turnfsm.errors import ProviderError
from turnfsm.messages import Message

require_local_extra()

from turnfsm.providers import LlamaServer, ModelRequest, OpenAIModel  # noqa: E402

pytestmark = [pytest.mark.local_model, pytest.mark.slow, pytest.mark.timeout(300)]


@dataclasses.dataclass
class City:
    """A city.

    Attributes:
        name: The city's name.
        population: How many people live there.
    """

    name: str
    population: int


@pytest.fixture(scope="module")
def server() -> Iterator[LlamaServer]:
    with LlamaServer(n_ctx=1024, n_threads=threads()) as running:
        yield running


def test_the_grammar_makes_the_tiny_model_answer_in_the_schema(
    server: LlamaServer,
) -> None:
    async def go() -> RunResult[City]:
        model = OpenAIModel(
            model="local",
            base_url=server.base_url,
            structured_output="json_object",
            temperature=0.0,
        )
        try:
            driver = Driver(
                model=model,
                context=None,
                context_window=1024,
                max_output_tokens=48,
                model_timeout=240,
                system_prompt="Answer in JSON.",
            )
            return await driver.run(
                "Name one big city and its population.", output_type=City
            )
        finally:
            await model.close()

    result = anyio.run(go)

    assert result.ok, result.error
    assert isinstance(result.output, City)
    assert isinstance(result.output.name, str)
    assert isinstance(result.output.population, int)
    assert json.loads(result.text) == dataclasses.asdict(result.output)


def test_the_raw_reply_fits_the_schema(server: LlamaServer) -> None:
    output = OutputType.of(City)

    async def go() -> str:
        model = OpenAIModel(
            model="local", base_url=server.base_url, structured_output="json_object"
        )
        try:
            request = ModelRequest(
                messages=[Message.user("A city, please.")],
                system="Reply with a city as JSON.",
                max_tokens=48,
                temperature=0.0,
                output=output.spec,
            )
            response = await model.complete(request)
            return response.message.text
        finally:
            await model.close()

    text = anyio.run(go)

    assert isinstance(output.parse(text), City)


def test_without_json_object_the_run_fails_at_once_naming_the_setting(
    server: LlamaServer,
) -> None:
    # The client's default, OpenAI's json_schema response format, is refused
    # by the server with HTTP 500; the run asked 4 times, with backoff, and
    # failed each time the same way.
    sent: list[httpx2.Request] = []

    async def count(request: httpx2.Request) -> None:
        sent.append(request)

    async def go() -> RunResult[City]:
        http = httpx2.AsyncClient(event_hooks={"request": [count]})
        client = openai.AsyncOpenAI(
            api_key="none", base_url=server.base_url, http_client=http
        )
        async with OpenAIModel(model="local", client=client) as model:
            driver = Driver(
                model=model,
                context=None,
                context_window=1024,
                max_output_tokens=48,
                model_timeout=240,
            )
            return await driver.run("Name one big city.", output_type=City)

    result = anyio.run(go)

    assert result.outcome == "failed"
    error = result.error
    assert isinstance(error, ProviderError)
    assert (error.kind, error.retryable, error.status) == ("bad_request", False, 500)
    assert len(sent) == 1
    assert 'structured_output="json_object"' in str(error)
