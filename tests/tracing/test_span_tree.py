"""The span tree of a run, exactly: names, kinds, parents, attributes, events.

One test per shape of run the issue names (#9): tools, a threshold and an
emergency compaction, a provider overflow and its retry, a transient error
and its retry, a cancelled run and a failed one. Every token count is the
heuristic counter's (floor((chars + 20) / 4) per message), so each tree is
deterministic; ids are masked, timings read ``<seconds>``.
"""

from __future__ import annotations

import anyio
import pytest

from tests.tracing._spans import (
    COMPACTED,
    STARTED,
    STATUS,
    Traced,
    agent,
    boom,
    chat,
    compaction,
    echo,
    history,
    manager,
    masks,
    said,
    tool,
    traced_driver,
    transitions,
    turn,
)
from turnfsm.driver import Driver, RetryPolicy, RunControl
from turnfsm.errors import CONTEXT_OVERFLOW, ProviderError
from turnfsm.providers import ModelRequest, ModelResponse
from turnfsm.testing import FakeModelClient, ScriptedModel, tool_call
from turnfsm.tracing import attributes as A
from turnfsm.values import Usage

pytestmark = pytest.mark.anyio


async def test_a_run_with_tools() -> None:
    traced = Traced.create()
    model = ScriptedModel.of(
        said(
            "",
            tool_call("echo", "c1", text="hi"),
            tool_call("boom", "c2"),
            usage=(50, 7),
        ),
        said("said hi", usage=(80, 3)),
    )
    driver = traced_driver(traced, model, tools=[echo, boom])
    result = await driver.run("say hi")
    assert traced.tree(masks(result)) == [
        ("invoke_agent assistant", "INTERNAL", agent(turns=2, usage=(130, 10)), [
            STARTED,
            ("turnfsm.turn 1", "INTERNAL", turn(1, "start", 202, usage=(50, 7)), [
                "measured: start -> call_llm #6 estimate=202",
                "model_replied: call_llm -> run_tools #7 [has_tool_calls] estimate=202",
                "tools_finished: run_tools -> start #13 estimate=202",
                ("chat gpt-test", "CLIENT", chat(usage=(50, 7)), []),
                ("execute_tool echo", "INTERNAL", tool("echo", "c1"), []),
                # The tool's exception: its type and traceback (its message
                # only with content captured).
                ("execute_tool boom", "INTERNAL", tool("boom", "c2") | {
                    A.ERROR_TYPE: "ValueError", STATUS: "ERROR: ValueError"
                }, ["exception ValueError: "]),
            ]),
            ("turnfsm.turn 2", "INTERNAL", turn(2, "done", 252, usage=(80, 3)), [
                "measured: start -> call_llm #6 estimate=252",
                "model_replied: call_llm -> done #9 estimate=252",
                ("chat gpt-test", "CLIENT", chat(usage=(80, 3)), []),
            ]),
        ]),
    ]  # fmt: skip


async def test_a_threshold_compaction() -> None:
    traced = Traced.create()
    model = ScriptedModel.of(said("ok", usage=(700, 2)))
    driver = traced_driver(traced, model, context=manager(4_000, threshold=60))
    result = await driver.run(history(10, 500))  # 2,650 tokens: over 2,400
    assert traced.tree(masks(result)) == [
        ("invoke_agent assistant", "INTERNAL", agent(
            usage=(700, 2), window=4_000, lines=(2_400, 3_800)
        ), [
            STARTED,
            ("turnfsm.turn 1", "INTERNAL", turn(1, "done", 662, usage=(700, 2)), [
                "measured: start -> compact #4 [is_over_threshold_line, "
                "not is_compaction_limit_reached, not is_threshold_line_spent] "
                "reason=threshold_exceeded "
                "estimate=2650",
                "compaction_result: compact -> start #18 estimate=662",
                "measured: start -> call_llm #6 estimate=662",
                "model_replied: call_llm -> done #9 estimate=662",
                ("turnfsm.compaction", "INTERNAL", compaction(
                    "threshold_exceeded", 2_650, 662, cache=(2_517, 530)
                ), []),
                ("chat gpt-test", "CLIENT", chat(usage=(700, 2)) | COMPACTED, []),
            ]),
        ]),
    ]  # fmt: skip


async def test_an_emergency_compaction() -> None:
    traced = Traced.create()
    model = ScriptedModel.of(said("ok", usage=(700, 2)))
    driver = traced_driver(traced, model, context=manager(4_000, threshold=60))
    result = await driver.run(history(20, 500))  # 5,305 tokens: over 3,800
    assert traced.tree(masks(result)) == [
        ("invoke_agent assistant", "INTERNAL", agent(
            usage=(700, 2), window=4_000, lines=(2_400, 3_800)
        ), [
            STARTED,
            ("turnfsm.turn 1", "INTERNAL", turn(1, "done", 663, usage=(700, 2)), [
                "measured: start -> compact #3 [is_over_emergency_line] "
                "reason=emergency estimate=5305",
                "compaction_result: compact -> start #18 estimate=663",
                "measured: start -> call_llm #6 estimate=663",
                "model_replied: call_llm -> done #9 estimate=663",
                ("turnfsm.compaction", "INTERNAL", compaction(
                    "emergency", 5_305, 663, cache=(5_172, 531)
                ), []),
                ("chat gpt-test", "CLIENT", chat(usage=(700, 2)) | COMPACTED, []),
            ]),
        ]),
    ]  # fmt: skip


OVERFLOW_ERROR = "model provider error [context_overflow]: prompt is too long"


async def test_a_provider_overflow_compacts_and_retries() -> None:
    traced = Traced.create()
    overflow = ProviderError("prompt is too long", kind=CONTEXT_OVERFLOW)
    model = ScriptedModel.of(overflow, said("ok", usage=(300, 2)))
    driver = traced_driver(traced, model, context=manager(100_000))
    result = await driver.run(history(6, 200))
    assert traced.tree(masks(result)) == [
        ("invoke_agent assistant", "INTERNAL", agent(
            usage=(300, 2), window=100_000, lines=(80_000, 95_000)
        ), [
            STARTED,
            ("turnfsm.turn 1", "INTERNAL", turn(1, "done", 287, usage=(300, 2)), [
                "measured: start -> call_llm #6 estimate=690",
                "context_overflowed: call_llm -> compact_and_retry #10 "
                "[has_overflow_retries_left] reason=overflow estimate=690",
                "compaction_result: compact_and_retry -> call_llm #19 estimate=287",
                "model_replied: call_llm -> done #9 estimate=287",
                ("chat gpt-test", "CLIENT", chat() | {
                    A.ERROR_TYPE: "context_overflow",
                    STATUS: "ERROR: prompt is too long",  # the provider's words
                }, [f"exception ProviderError: {OVERFLOW_ERROR}"]),
                ("turnfsm.compaction", "INTERNAL", compaction(
                    "overflow", 690, 287, cache=(632, 230)
                ), []),
                ("chat gpt-test", "CLIENT", chat(usage=(300, 2)) | COMPACTED, []),
            ]),
        ]),
    ]  # fmt: skip


RATE_ERROR = "model provider error [rate_limit]: slow down"


async def test_a_transient_error_is_retried_in_a_second_attempt() -> None:
    traced = Traced.create()
    rate = ProviderError("slow down", retryable=True, kind="rate_limit")
    model = ScriptedModel.of(rate, said("fine", usage=(6, 1)))
    policy = RetryPolicy(max_attempts=3, initial_wait=0.01, jitter=False)
    result = await traced_driver(traced, model, retry=policy).run("hello")
    assert traced.tree(masks(result)) == [
        ("invoke_agent assistant", "INTERNAL", agent(usage=(6, 1)), [
            STARTED,
            ("turnfsm.turn 1", "INTERNAL", turn(1, "done", 6, usage=(6, 1)), [
                "measured: start -> call_llm #6 estimate=6",
                "model_replied: call_llm -> done #9 estimate=6",
                ("chat gpt-test", "CLIENT", chat() | {
                    A.ERROR_TYPE: "rate_limit", STATUS: "ERROR: slow down"
                }, [f"exception ProviderError: {RATE_ERROR}"]),
                ("chat gpt-test", "CLIENT", chat(attempt=2, usage=(6, 1)) | {
                    A.RETRY_WAIT: "<seconds>"
                }, []),
            ]),
        ]),
    ]  # fmt: skip
    [retry] = [s for s in traced.spans if (s.attributes or {}).get(A.ATTEMPT) == 2]
    wait = (retry.attributes or {})[A.RETRY_WAIT]
    assert isinstance(wait, float)
    assert wait >= 0.01  # the policy's backoff


async def test_a_cancelled_run_ends_every_span() -> None:
    traced = Traced.create()
    control = RunControl()
    running = anyio.Event()

    async def hang() -> str:
        """Hang until cancelled."""
        running.set()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    model = ScriptedModel.of(said("", tool_call("hang", "c1"), usage=(9, 4)))
    driver = traced_driver(traced, model, tools=[hang])
    with anyio.fail_after(5):
        async with anyio.create_task_group() as group:

            async def stop() -> None:
                await running.wait()
                control.cancel("user pressed stop")

            group.start_soon(stop)
            result = await driver.run("go", control=control)
    assert result.outcome == "cancelled"
    cut = {A.CANCELLED: True}
    assert traced.tree(masks(result)) == [
        ("invoke_agent assistant", "INTERNAL", agent(
            outcome="cancelled", phase="failed", usage=(9, 4)
        ) | cut, [
            STARTED,
            ("turnfsm.turn 1", "INTERNAL", turn(1, "failed", 91, usage=(9, 4)) | cut, [
                "measured: start -> call_llm #6 estimate=91",
                "model_replied: call_llm -> run_tools #7 [has_tool_calls] estimate=91",
                "run_cancelled: run_tools -> failed #32 error=cancelled estimate=91",
                ("chat gpt-test", "CLIENT", chat(usage=(9, 4)), []),
                ("execute_tool hang", "INTERNAL", tool("hang", "c1") | cut, []),
            ]),
        ]),
    ]  # fmt: skip


class Looping:
    """Asks for the `echo` tool on every call, with call ids c1, c2, ..."""

    def __init__(self) -> None:
        self.calls = 0

    async def complete(self, request: ModelRequest) -> ModelResponse:
        self.calls += 1
        call = tool_call("echo", f"c{self.calls}", text="again")
        return said("", call, usage=(10, 5))


MAX_TURNS = (
    "the run reached max_turns=2 without a final answer; raise max_turns or "
    "check the tools for a loop"
)


async def test_a_failed_run_marks_its_root_span() -> None:
    traced = Traced.create()
    driver = traced_driver(traced, Looping(), tools=[echo], max_turns=2)
    result = await driver.run("loop")
    assert result.outcome == "failed"
    assert traced.tree(masks(result)) == [
        ("invoke_agent assistant", "INTERNAL", agent(
            outcome="failed", turns=2, phase="failed", usage=(20, 10)
        ) | {A.ERROR_TYPE: "MaxTurnsExceeded", STATUS: f"ERROR: {MAX_TURNS}"}, [
            STARTED,
            f"exception MaxTurnsExceeded: {MAX_TURNS}",
            ("turnfsm.turn 1", "INTERNAL", turn(1, "start", 124, usage=(10, 5)), [
                "measured: start -> call_llm #6 estimate=124",
                "model_replied: call_llm -> run_tools #7 [has_tool_calls] estimate=124",
                "tools_finished: run_tools -> start #13 estimate=124",
                ("chat gpt-test", "CLIENT", chat(usage=(10, 5)), []),
                ("execute_tool echo", "INTERNAL", tool("echo", "c1"), []),
            ]),
            ("turnfsm.turn 2", "INTERNAL", turn(2, "start", 147, usage=(10, 5)), [
                "measured: start -> call_llm #6 estimate=147",
                "model_replied: call_llm -> run_tools #7 [has_tool_calls] estimate=147",
                "tools_finished: run_tools -> start #13 estimate=147",
                ("chat gpt-test", "CLIENT", chat(usage=(10, 5)), []),
                ("execute_tool echo", "INTERNAL", tool("echo", "c2"), []),
            ]),
            ("turnfsm.turn 3", "INTERNAL", turn(3, "failed", 147), [
                "measured: start -> failed #1 [is_turn_limit_reached] "
                "error=max_turns_exceeded estimate=147",
            ]),
        ]),
    ]  # fmt: skip


AUTH_ERROR = "model provider error [auth]: bad key"


async def test_a_permanent_provider_error_fails_the_call_and_the_run() -> None:
    traced = Traced.create()
    model = ScriptedModel.of(ProviderError("bad key", kind="auth", status=401))
    result = await traced_driver(traced, model).run("hello")
    assert traced.tree(masks(result)) == [
        ("invoke_agent assistant", "INTERNAL", agent(
            outcome="failed", turns=0, phase="failed"
        ) | {A.ERROR_TYPE: "ProviderError", STATUS: f"ERROR: {AUTH_ERROR}"}, [
            STARTED,
            f"exception ProviderError: {AUTH_ERROR}",
            ("turnfsm.turn 1", "INTERNAL", turn(1, "failed", 6), [
                "measured: start -> call_llm #6 estimate=6",
                "model_failed: call_llm -> failed #12 error=provider_error estimate=6",
                ("chat gpt-test", "CLIENT", chat() | {
                    A.ERROR_TYPE: "auth", STATUS: "ERROR: bad key"
                }, [f"exception ProviderError: {AUTH_ERROR}"]),
            ]),
        ]),
    ]  # fmt: skip


async def test_a_refused_reply_s_chat_span_carries_its_usage() -> None:
    # The client refused the reply (a refusal), which the provider billed:
    # its usage is the call's, on its span and in the token metric.
    traced = Traced.create()
    refused = ProviderError(
        "the API refused to answer",
        kind="content_filter",
        usage=Usage(input_tokens=40, output_tokens=7),
    )
    result = await traced_driver(traced, ScriptedModel.of(refused)).run("hello")
    assert result.usage == Usage(input_tokens=40, output_tokens=7)
    [(_, _, _, [_, _, (_, _, _, [_, _, chat_span])])] = traced.tree(masks(result))
    name, _, attributes, _ = chat_span
    assert name == "chat gpt-test"
    assert attributes[A.ERROR_TYPE] == "content_filter"
    assert (attributes[A.USAGE_INPUT_TOKENS], attributes[A.USAGE_OUTPUT_TOKENS]) == (
        40,
        7,
    )
    totals = traced.metric(A.METRIC_TOKEN_USAGE)
    assert sorted(totals.values()) == [7, 40]


async def test_a_model_without_a_name_makes_a_plain_chat_span() -> None:
    traced = Traced.create()
    driver = Driver(
        model=FakeModelClient(lambda _r: "hi"), hooks=[traced.hook], strict_hooks=True
    )
    result = await driver.run("hello")
    [(root, _, attributes, [_, (_, _, _, [_, _, chat_span])])] = traced.tree(
        masks(result)
    )
    assert (root, attributes[A.PROVIDER_NAME]) == (
        "invoke_agent turnfsm",
        "FakeModelClient",
    )
    assert A.REQUEST_MODEL not in attributes
    assert chat_span == (
        "chat",
        "CLIENT",
        {
            A.OPERATION_NAME: "chat",
            A.CONVERSATION_ID: "<session>",
            A.ATTEMPT: 1,
            A.PURPOSE: "turn",
            A.PROVIDER_NAME: "FakeModelClient",
        },
        [],
    )


async def test_a_re_ask_for_a_structured_answer_is_a_turn_of_its_own() -> None:
    traced = Traced.create()
    model = ScriptedModel.of('{"result": "many"}', '{"result": 3}')
    driver = traced_driver(traced, model, output_type=int)

    result = await driver.run("how many?")

    assert result.output == 3
    assert traced.unended() == []
    turns = [s for s in traced.spans if s.name.startswith("turnfsm.turn ")]
    assert len(turns) == 2
    fired = [
        (t[A.TRANSITION_TRIGGER], t[A.TRANSITION_TO]) for t in transitions(turns[0])
    ]
    assert ("output_rejected", "start") in fired
