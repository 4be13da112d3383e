"""A 512-token local window, and a tool result the default counter reads low.

The bundled model's tokenizer reads every digit as a token; the default
counter, built for cl100k, reads three digits as one. A page of digits that
the counter finds well under the window is over it to the server, which
refuses the request (its prompt is over the window) or cuts the reply off
at the window (its prompt fits, the reply budget does not). Either way the
run compacts in the proportion the server counted and asks again: it ends
done, and no reply cut at the window is its answer.
"""

from __future__ import annotations

from collections.abc import Iterator

import anyio
import pytest

from tests.integration._local import require_local_extra, threads
from turnfsm.agent import Agent
from turnfsm.driver import RetryPolicy, Session
from turnfsm.messages import Message, ToolCallPart

require_local_extra()

from turnfsm.providers import LlamaServer, OpenAIModel  # noqa: E402

pytestmark = [pytest.mark.local_model, pytest.mark.slow, pytest.mark.timeout(300)]

N_CTX = 512
REPLY = 16


@pytest.fixture(scope="module")
def server() -> Iterator[LlamaServer]:
    with LlamaServer(n_ctx=N_CTX, n_threads=threads()) as running:
        yield running


def _read(digits: int) -> list[Message]:
    page = "".join(str(i * 7 % 10) for i in range(digits))
    call = ToolCallPart(id="call_1", name="read_page", arguments={"name": "today"})
    return [
        Message.user("Which reading is the last?"),
        Message.assistant(tool_calls=[call]),
        Message.tool_result("call_1", page),
        Message.user("Say it."),
    ]


@pytest.mark.parametrize(
    "digits",
    [
        pytest.param(560, id="refused: the prompt is over the window"),
        pytest.param(452, id="cut: the prompt fits, the reply budget does not"),
    ],
)
def test_a_request_the_counter_reads_low_is_compacted_and_sent_again(
    server: LlamaServer, digits: int
) -> None:
    session = Session()

    async def run() -> None:
        model = OpenAIModel(
            model="local",
            base_url=server.base_url,
            context_window=server.context_window,
        )
        agent = Agent(
            model=model,
            max_output_tokens=REPLY,
            max_turns=2,
            retry=RetryPolicy(max_attempts=1),
            model_timeout=120,
        )
        try:
            result = await agent.run(_read(digits), session=session)
            assert result.ok, result.error
        finally:
            await model.close()

    anyio.run(run)
    (record,) = session.runs
    passes = [
        (c.verdict.value, c.tokens_before, c.tokens_after) for c in record.compactions
    ]
    print(
        f"{digits} digits: estimates {[t.estimate for t in record.turns]}, "
        f"server {[t.usage and t.usage.input_tokens for t in record.turns]}, "
        f"passes {passes}"
    )
    assert [c.verdict.value for c in record.compactions] == ["compacted"]
    for turn in record.turns:  # the reply committed was not cut at the window
        assert turn.usage is not None
        assert turn.usage.input_tokens + turn.usage.output_tokens < N_CTX
