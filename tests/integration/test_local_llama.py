"""A real model behind a real server: llama.cpp serving Gemma 3 270M on loopback.

The server, not the brain, detects the overflow here: the agent is told the
window is larger than the server's n_ctx, so every estimate "fits" while the
server answers HTTP 400 context_length_exceeded. The Turn FSM must go through
compact_and_retry and complete - or, when compaction cannot help, end with a
typed error after its bounded retries, never loop.

Skipped when the ``local`` extra is missing, unless TURNFSM_REQUIRE_LOCAL_MODEL
is set (CI sets it, so a broken install fails instead of skipping).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import anyio
import pytest

from tests.integration._local import require_local_extra, threads
from turnfsm.context import (
    CompactionContext,
    CompactionProposal,
    ContextManager,
    TruncatingCompactor,
)
from turnfsm.core import CompactReason, ContextOverflowed
from turnfsm.driver import Driver, RetryPolicy, RunResult, Session
from turnfsm.errors import CompactionStalled, ContextExceeded
from turnfsm.messages import Message

require_local_extra()

from turnfsm.providers import LlamaServer, ModelRequest, OpenAIModel  # noqa: E402

pytestmark = [pytest.mark.local_model, pytest.mark.slow, pytest.mark.timeout(300)]

N_CTX = 1024


@pytest.fixture(scope="module")
def server() -> Iterator[LlamaServer]:
    with LlamaServer(n_ctx=N_CTX, n_threads=threads()) as running:
        yield running


def chatter(pairs: int, words: int) -> list[Message]:
    """A long, honest conversation: numbered facts, ~`words` words each."""
    out: list[Message] = []
    for i in range(pairs):
        out.append(Message.user(f"Fact {i}: " + " ".join(["apple"] * words)))
        out.append(Message.assistant(f"Noted fact {i}."))
    return out


def run_on(
    server: LlamaServer,
    compactor: object,
    messages: list[Message],
    session: Session,
    retries: int = 2,
) -> RunResult:
    """Run `messages` on the real server; the client is closed afterwards."""

    async def go() -> RunResult:
        model = OpenAIModel(model="local", base_url=server.base_url)
        try:
            return await driver_for(model, compactor, retries).run(
                messages, session=session
            )
        finally:
            await model.close()

    return anyio.run(go)


def driver_for(model: OpenAIModel, compactor: object, retries: int) -> Driver:
    return Driver(
        model=model,
        # The agent believes in an 8k window: the estimate always "fits", so
        # only the real server can notice that 1,024 tokens are too few.
        context=ContextManager(compactor, context_window=8_192),  # type: ignore[arg-type]
        max_output_tokens=8,
        max_overflow_retries=retries,
        retry=RetryPolicy(max_attempts=1),
        model_timeout=120,
    )


def test_server_overflow_goes_through_compact_and_retry_and_completes(
    server: LlamaServer,
) -> None:
    session = Session()
    messages = [
        *chatter(12, 100),
        Message.user("Which fact came last? Answer briefly."),
    ]
    result = run_on(server, TruncatingCompactor(preserve_recent=2), messages, session)
    assert result.ok, result.error
    run = session.runs[0]
    names = [type(e).__name__ for e in run.events]
    # The audit trail shows the overflow, the compaction and the retried call.
    first_overflow = names.index("ContextOverflowed")
    assert names[first_overflow + 1] == "CompactionResult"
    assert names[-1] == "ModelReplied"
    overflow = run.events[first_overflow]
    assert isinstance(overflow, ContextOverflowed)
    assert "maximum context length is 1024 tokens" in overflow.error.message
    assert run.compactions[0].reason is CompactReason.OVERFLOW
    assert run.compactions[0].compacted
    assert len(run.turns) == 1  # the rejected call is not a turn; the retry is
    assert len(run.context(0)) < len(messages)
    assert result.usage.input_tokens > 0  # the server's own usage report


def test_compaction_that_cannot_shrink_enough_stalls_without_looping(
    server: LlamaServer,
) -> None:
    # Two huge messages: nothing for the truncator to cut.
    messages = [
        Message.user(" ".join(["pear"] * 900)),
        Message.assistant("ok"),
        Message.user(" ".join(["plum"] * 900)),
    ]
    session = Session()
    result = run_on(server, TruncatingCompactor(preserve_recent=2), messages, session)
    assert isinstance(result.error, CompactionStalled)
    assert list(session.history) == []  # a failed run leaves no trace


class ShaveOne:
    """Always makes a little progress: drops the oldest unpinned message, never enough.

    The pinned messages (here the first and the latest user message) are kept,
    as every strategy must keep them.
    """

    async def compact(
        self, messages: Sequence[Message], target: int, ctx: CompactionContext
    ) -> CompactionProposal:
        drop = next(i for i, m in enumerate(messages) if m.id not in ctx.pinned)
        kept = [*messages[:drop], *messages[drop + 1 :]]
        return CompactionProposal.compacted(kept, ctx.tokens_before, 0)


def test_a_streamed_request_over_the_servers_context_is_an_overflow(
    server: LlamaServer,
) -> None:
    """The server ends such a stream with no reply: the model says why."""
    from turnfsm.errors import ProviderError
    from turnfsm.providers import ModelRequest
    from turnfsm.providers._stream import StreamDone

    request = ModelRequest(
        messages=(Message.user(" ".join(["apple"] * 1_500)),), max_tokens=8
    )

    async def stream() -> list[object]:
        model = OpenAIModel(model="local", base_url=server.base_url)
        try:
            return [event async for event in model.stream(request)]
        finally:
            await model.close()

    with pytest.raises(ProviderError) as info:
        anyio.run(stream)
    assert info.value.is_context_overflow
    # A request that fits streams as usual.
    request = ModelRequest(messages=(Message.user("Say hello."),), max_tokens=4)
    events = anyio.run(stream)
    assert isinstance(events[-1], StreamDone)


def test_bounded_overflow_retries_end_with_a_typed_error(server: LlamaServer) -> None:
    messages = [Message.user("tiny"), Message.assistant("ok"), *chatter(1, 1_400)]
    session = Session()
    result = run_on(server, ShaveOne(), messages, session, retries=2)
    assert type(result.error) is ContextExceeded
    events = [type(e).__name__ for e in session.runs[0].events]
    assert events.count("ContextOverflowed") == 3  # the call + 2 bounded retries
    assert events.count("CompactionResult") == 2


def test_cli_run_streams_a_real_reply(
    server: LlamaServer, capsys: pytest.CaptureFixture[str]
) -> None:
    from turnfsm.cli import main

    code = main(
        [
            "run",
            "Say hello.",
            "--model",
            f"{server.base_url}#local",
            "--n-ctx",
            str(N_CTX),
            "--max-tokens",
            "8",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert "start --measured--> call_llm" in out
    assert "call_llm --model_replied--> done" in out
    assert "run done: 1 model call(s)" in out


def test_one_model_serves_consecutive_event_loops(server: LlamaServer) -> None:
    from turnfsm import Agent

    agent = Agent(
        model=OpenAIModel(model="local", base_url=server.base_url),
        max_output_tokens=4,
    )
    first = agent.run_sync("Say one word.")
    second = agent.run_sync("Say another word.", backend="trio")
    assert first.ok, first.error
    assert second.ok, second.error
    assert len(agent.session.runs) == 2
    assert all(t.usage is not None for r in agent.session.runs for t in r.turns)


def test_the_server_window_reaches_the_agent(server: LlamaServer) -> None:
    """llama-cpp-python's server reports no n_ctx: the one it was started with."""
    from turnfsm import Agent
    from turnfsm.errors import WindowTooLarge
    from turnfsm.providers import server_window

    assert server_window(server.base_url) is None  # no /props on this server
    assert server.context_window == N_CTX
    model = OpenAIModel(
        model="local", base_url=server.base_url, context_window=server.context_window
    )
    assert Agent(model=model).driver.budget.context_window == N_CTX
    with pytest.raises(WindowTooLarge) as info:
        Agent(model=model, context=ContextManager(context_window=N_CTX * 2))
    assert (info.value.value, info.value.window) == (N_CTX * 2, N_CTX)


def test_the_bundled_models_whole_context_starts_and_answers() -> None:
    # The server kept every token's logits, n_ctx x 262,144 floats: at the
    # model's trained 32,768 it died reserving 32 GiB, its log printed.
    with LlamaServer(n_ctx=32_768, n_threads=threads()) as big:
        assert big.context_window == 32_768
        model = OpenAIModel("local", base_url=big.base_url, max_tokens=4)

        async def ask() -> str:
            try:
                reply = await model.complete(
                    ModelRequest(messages=[Message.user("Hi")])
                )
            finally:
                await model.close()
            return reply.message.text

        assert isinstance(anyio.run(ask), str)
