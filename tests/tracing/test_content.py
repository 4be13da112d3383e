"""Message content reaches the trace only when the user opts in.

Off by default: no attribute, event or status of any span carries what was
said — the input, the system prompt, tool arguments and results (an error
result too), the reply, nor a summary call's prompt or summary. On with
``capture_content=True`` or ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan

from tests.tracing._spans import Named, Traced, history, said
from turnfsm.context import ContextManager, PinRules, SummarizingCompactor
from turnfsm.driver import Driver, Session
from turnfsm.errors import ConfigError
from turnfsm.messages import Message
from turnfsm.testing import ExtractiveSummaryModel, ScriptedModel, tool_call
from turnfsm.tokens import HeuristicTokenCounter
from turnfsm.tracing import CAPTURE_CONTENT_ENV, TracingHook
from turnfsm.tracing import attributes as A

pytestmark = pytest.mark.anyio

SECRET = "the vault code is 7431 ALPHA"


def remember(text: str) -> str:
    """Remember a note.

    Args:
        text: the note.
    """
    return f"noted: {text}"


def refuse(text: str) -> str:
    """Refuse a note.

    Args:
        text: the note.
    """
    raise ValueError(f"will not store {text!r}")


def _driver(traced: Traced, model: ScriptedModel, **options: Any) -> Driver:
    return Driver(
        model=Named(model),
        tools=[remember, refuse],
        system_prompt=f"Guard this: {SECRET}",
        hooks=[traced.hook],
        strict_hooks=True,
        **options,
    )


def _script() -> ScriptedModel:
    return ScriptedModel.of(
        said(
            "",
            tool_call("remember", "c1", text=SECRET),
            tool_call("refuse", "c2", text=SECRET),
        ),
        said(f"I noted {SECRET}"),
    )


def _texts(span: ReadableSpan) -> Iterator[str]:
    """Everything a span says as text: attributes, events, status."""
    for value in (span.attributes or {}).values():
        yield str(value)
    for event in span.events:
        yield event.name
        for value in (event.attributes or {}).values():
            yield str(value)
    yield span.status.description or ""


def _leaks(traced: Traced) -> list[tuple[str, str]]:
    # Words of the secret, not its digits: a session or run id (hex) may hold
    # "7431" by chance (about one run in a hundred), and one in CI did.
    return [
        (span.name, text)
        for span in traced.spans
        for text in _texts(span)
        if "vault" in text or "ALPHA" in text
    ]


async def test_without_opting_in_no_span_carries_what_was_said() -> None:
    traced = Traced.create()
    summaries = ExtractiveSummaryModel()
    context = ContextManager(
        SummarizingCompactor(
            model=Named(summaries, model="summarizer"), keep_recent_turns=2
        ),
        context_window=4_000,
        threshold=60,
        counter=HeuristicTokenCounter(),
        # The summary call is what is checked: the first user message goes
        # into it, so the rule that pins that message is off.
        pins=PinRules(first_user=False),
    )
    # The secret is in the history the summary call is sent, and (a fact:
    # digits, capitals) in the summary it writes.
    said_before = [Message.user(f"note: {SECRET}"), Message.assistant("ok")]
    result = await _driver(traced, _script(), context=context).run(
        [*said_before, *history(10, 500), Message.user(f"keep {SECRET}")]
    )
    assert result.ok, result.error
    assert SECRET in summaries.requests[0].messages[0].text
    assert {s.name for s in traced.spans} >= {"turnfsm.compaction", "chat summarizer"}
    assert _leaks(traced) == []


@pytest.mark.parametrize("how", ["output-type", "content-filter"])
async def test_a_failure_that_quotes_the_answer_leaves_its_words_out(how: str) -> None:
    # The run's span quoted the answer in its status and exception: an
    # answer that never fit the output type, a reply a filter withheld.
    from turnfsm.providers import ModelResponse
    from turnfsm.testing import reply

    traced = Traced.create()
    if how == "output-type":
        answer = f'{{"result": "{SECRET}"}}'
        model = ScriptedModel.of(said(answer), said(answer))
        options: dict[str, Any] = {"output_type": int, "max_output_retries": 1}
    else:
        withheld = ModelResponse(message=reply(SECRET), finish_reason="content_filter")
        model = ScriptedModel.of(withheld)
        options = {"output_type": int}
    result = await _driver(traced, model, **options).run("go")
    assert result.outcome == "failed"
    assert SECRET in str(result.error)  # the caller is told, the trace is not
    assert _leaks(traced) == []
    [root] = [s for s in traced.spans if s.name == "invoke_agent turnfsm"]
    assert root.status.description
    assert (root.attributes or {})[A.ERROR_TYPE] == type(result.error).__name__


async def test_a_sub_agent_s_failure_passed_up_leaves_the_answer_s_words_out() -> None:
    # A phase's child whose answer never fit failed the effect, then the run:
    # both spans quoted the child's answer through the errors that carry it.
    from turnfsm import Agent, review_machine
    from turnfsm.driver import subagent_effect
    from turnfsm.testing import FakeModelClient, reply

    traced = Traced.create()
    child = Agent(
        model=FakeModelClient(lambda r: f'{{"result": "{SECRET}"}}'),
        output_type=int,
        max_output_retries=0,
    )
    agent = Agent(
        model=FakeModelClient(lambda r: reply("draft")),
        machine=review_machine(),
        effects={"review": subagent_effect(child.driver, signal="approved")},
        hooks=[traced.hook],
    )
    result = await agent.run("go")
    assert result.outcome == "failed"
    assert SECRET in str(result.error)
    assert {s.name for s in traced.spans} >= {"turnfsm.effect", "invoke_agent turnfsm"}
    assert _leaks(traced) == []


def _by_name(traced: Traced) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for span in traced.spans:
        out.setdefault(span.name, []).append(dict(span.attributes or {}))
    return out


def _without_ids(value: str) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = json.loads(value)
    return [{k: v for k, v in m.items() if k != "id"} for m in messages]


async def _captured(traced: Traced) -> None:
    """Run the script and check every place content is captured, exactly."""
    session = Session()
    model = _script()
    result = await _driver(traced, model).run(f"remember {SECRET}", session=session)
    assert result.ok, result.error
    spans = _by_name(traced)
    [root] = spans["invoke_agent turnfsm"]
    asked, answered = model.requests
    assert root[A.INPUT_MESSAGES] == json.dumps([session.history[0].to_dict()])
    assert _without_ids(root[A.OUTPUT_MESSAGES]) == [
        {
            "role": "assistant",
            "parts": [{"type": "text", "text": f"I noted {SECRET}"}],
            "metadata": {},
        }
    ]
    first, second = spans["chat gpt-test"]
    assert first[A.SYSTEM_INSTRUCTIONS] == f"Guard this: {SECRET}"
    assert first[A.INPUT_MESSAGES] == json.dumps([m.to_dict() for m in asked.messages])
    assert first[A.OUTPUT_MESSAGES] == json.dumps([session.history[1].to_dict()])
    assert second[A.INPUT_MESSAGES] == json.dumps(
        [m.to_dict() for m in answered.messages]
    )
    [kept] = spans["execute_tool remember"]
    assert kept[A.TOOL_CALL_ARGUMENTS] == json.dumps({"text": SECRET})
    assert kept[A.TOOL_CALL_RESULT] == f"noted: {SECRET}"
    [refused] = spans["execute_tool refuse"]
    failure = f"tool 'refuse' failed: ValueError: will not store {SECRET!r}"
    assert refused[A.TOOL_CALL_RESULT] == failure
    [span] = [s for s in traced.spans if s.name == "execute_tool refuse"]
    assert span.status.description == failure


async def test_capture_content_records_messages_tools_and_the_reply() -> None:
    await _captured(Traced.create(capture_content=True))


async def test_the_standard_environment_variable_opts_in(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(CAPTURE_CONTENT_ENV, "true")
    await _captured(Traced.create())


async def test_an_explicit_no_wins_over_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(CAPTURE_CONTENT_ENV, "true")
    traced = Traced.create(capture_content=False)
    result = await _driver(traced, _script()).run(f"remember {SECRET}")
    assert result.ok, result.error
    assert _leaks(traced) == []


@pytest.mark.parametrize(("value", "on"), [("yes", True), ("0", False), (" ", False)])
def test_a_hook_reads_the_environment_s_switch_as_configure_does(
    monkeypatch: pytest.MonkeyPatch, value: str, on: bool
) -> None:
    monkeypatch.setenv(CAPTURE_CONTENT_ENV, value)
    assert TracingHook().capture_content is on


def test_a_switch_that_is_neither_on_nor_off_is_refused_by_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Read as off: a hook built with `on` recorded no content, without a word
    # (configure() refused it already).
    monkeypatch.setenv(CAPTURE_CONTENT_ENV, "on")
    with pytest.raises(ConfigError) as raised:
        TracingHook()
    assert str(raised.value) == (
        "invalid OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT='on': "
        "expected true or false"
    )
    assert TracingHook(capture_content=True).capture_content  # asked: not read


@pytest.mark.parametrize(
    ("settings", "field"),
    [
        ({"tracer_provider": 5}, "tracer_provider"),
        ({"meter_provider": 5}, "meter_provider"),
        ({"tracer_provider": "global"}, "tracer_provider"),
        ({"capture_content": "yes"}, "capture_content"),
        ({"capture_content": 1}, "capture_content"),
    ],
    ids=repr,
)
def test_bad_hook_settings_are_refused_naming_the_field(
    settings: dict[str, Any], field: str
) -> None:
    # The providers failed inside OpenTelemetry with an AttributeError;
    # "yes" was taken as content capture switched on.
    with pytest.raises(ConfigError) as caught:
        TracingHook(**settings)
    assert caught.value.field == field
