"""The spans of a model-call attempt (``chat``) and a tool call (``execute_tool``)."""

from __future__ import annotations

from typing import Any, Final

from opentelemetry.metrics import Histogram
from opentelemetry.trace import Span

from turnfsm.errors import Cancelled, ProviderError, SubagentWaiting
from turnfsm.hooks import ModelCallEnd, ModelCallInfo, ToolCallEnd, ToolCallInfo
from turnfsm.tracing import attributes as A
from turnfsm.tracing._content import (
    error_status,
    messages_json,
    record_without_text,
    to_json,
    usage_attributes,
)
from turnfsm.values import Usage

__all__ = [
    "chat_attributes",
    "end_chat",
    "end_tool",
    "tool_attributes",
]


def chat_attributes(
    info: ModelCallInfo, *, compacted: bool, capture: bool
) -> dict[str, Any]:
    """A ``chat`` span's attributes as the attempt starts."""
    request = info.request
    attributes: dict[str, Any] = {
        A.OPERATION_NAME: A.OP_CHAT,
        A.CONVERSATION_ID: info.session_id,
        A.ATTEMPT: info.attempt,
        A.PURPOSE: info.purpose,
    }
    if info.provider:
        attributes[A.PROVIDER_NAME] = info.provider
    if info.model:
        attributes[A.REQUEST_MODEL] = info.model
    if request.max_tokens is not None:
        attributes[A.REQUEST_MAX_TOKENS] = request.max_tokens
    if request.temperature is not None:
        attributes[A.REQUEST_TEMPERATURE] = request.temperature
    if info.attempt > 1:
        attributes[A.RETRY_WAIT] = round(info.waited, 6)
    if compacted:
        attributes[A.CONVERSATION_COMPACTED] = True
    if capture:
        attributes[A.INPUT_MESSAGES] = messages_json(request.messages)
        if request.system:
            attributes[A.SYSTEM_INSTRUCTIONS] = request.system
    return attributes


def end_chat(
    span: Span, info: ModelCallEnd, *, tokens: Histogram, capture: bool
) -> dict[str, Any]:
    """Set the attempt's usage, or its error, on `span`; its metric labels."""
    call = info.call
    labels: dict[str, Any] = {A.OPERATION_NAME: A.OP_CHAT}
    if call.provider:
        labels[A.PROVIDER_NAME] = call.provider
    if call.model:
        labels[A.REQUEST_MODEL] = call.model
    response = info.response
    if response is not None:
        said: dict[str, Any] = {}  # set at once: one lock, one pass of checks
        if response.model:
            said[A.RESPONSE_MODEL] = labels[A.RESPONSE_MODEL] = response.model
        if response.finish_reason:
            said[A.RESPONSE_FINISH_REASONS] = (response.finish_reason,)
        usage = response.usage
        if usage is not None:
            said.update(usage_attributes(usage))
            _count_tokens(tokens, usage, labels)
        if capture:
            said[A.OUTPUT_MESSAGES] = messages_json((response.message,))
        if said:
            span.set_attributes(said)
    elif info.error is not None:
        error = info.error
        # A reply the client could not use (cut at the window, a refusal)
        # was billed: its usage, as for a reply.
        usage = error.usage if isinstance(error, ProviderError) else None
        if usage is not None:
            span.set_attributes(usage_attributes(usage))
            _count_tokens(tokens, usage, labels)
        kind = _fail(span, error)
        if kind is not None:
            labels[A.ERROR_TYPE] = kind
    return labels


def _count_tokens(tokens: Histogram, usage: Usage, labels: dict[str, Any]) -> None:
    """Record a call's input and output tokens in the token metric."""
    tokens.record(usage.input_tokens, {**labels, A.TOKEN_TYPE: "input"})
    tokens.record(usage.output_tokens, {**labels, A.TOKEN_TYPE: "output"})


def tool_attributes(info: ToolCallInfo, *, capture: bool) -> dict[str, Any]:
    """An ``execute_tool`` span's attributes as the tool starts."""
    call = info.call
    attributes: dict[str, Any] = {
        A.OPERATION_NAME: A.OP_EXECUTE_TOOL,
        A.TOOL_NAME: call.name,
        A.TOOL_CALL_ID: call.id,
        A.TOOL_TYPE: "function",
        A.CONVERSATION_ID: info.session_id,
    }
    if capture:
        attributes[A.TOOL_CALL_ARGUMENTS] = to_json(call.arguments)
    return attributes


def end_tool(span: Span, info: ToolCallEnd, *, capture: bool) -> dict[str, Any]:
    """Set the tool's result, or its error, on `span`; its metric labels."""
    labels: dict[str, Any] = {
        A.OPERATION_NAME: A.OP_EXECUTE_TOOL,
        A.TOOL_NAME: info.call.call.name,
    }
    if info.result is not None:
        # A tool message has no text parts: its content is its results'
        # (said only when content is captured).
        text = ""
        if capture:
            text = "".join(p.content for p in info.result.tool_results)
            span.set_attribute(A.TOOL_CALL_RESULT, text)
        raised = info.raised
        if info.interrupted:
            # Closed on resume: its process stopped while it ran. No content:
            # the words are turnfsm's, the same for every such call.
            span.set_attribute(A.ERROR_TYPE, A.TOOL_INTERRUPTED)
            span.set_status(error_status(_INTERRUPTED))
            labels[A.ERROR_TYPE] = A.TOOL_INTERRUPTED
        elif raised is not None:
            named = _raised(span, raised, capture=capture)
            # Its error result with content captured, else its type alone.
            span.set_status(error_status(text if capture else named))
            labels[A.ERROR_TYPE] = named
        elif info.is_error:
            span.set_attribute(A.ERROR_TYPE, "tool_error")
            # An error result is content too (it may quote the arguments).
            span.set_status(error_status(text if capture else None))
            labels[A.ERROR_TYPE] = "tool_error"
    elif info.error is not None:
        kind = _fail(span, info.error)
        if kind is not None:
            labels[A.ERROR_TYPE] = kind
    return labels


_INTERRUPTED: Final = (
    "closed as interrupted: the run stopped before this call finished, so its "
    "effects are unknown"
)


def _raised(span: Span, raised: Exception, *, capture: bool) -> str:
    """Record the tool's own exception on `span`: its type and traceback.

    Its message may quote what was said (the tool's arguments): it is kept
    only when content is captured, as the error result is.
    """
    kind = getattr(raised, "type_name", type(raised).__name__)  # a child's: by name
    span.set_attribute(A.ERROR_TYPE, kind)
    if capture:
        span.record_exception(raised)
    else:
        record_without_text(span, raised)
    return kind


def _fail(span: Span, error: BaseException) -> str | None:
    """Mark `span` with how its operation ended; the error type, or None (cut short)."""
    if _is_cancellation(error) or isinstance(error, SubagentWaiting):
        # A sub-agent that waits for an answer stops its caller's run, which
        # goes on once answered: the call is cut short, as the run is.
        span.set_attribute(A.CANCELLED, True)
        return None
    if isinstance(error, ProviderError):
        # Its own words, not its text as a run's failure ("tried 4 times ...").
        kind, described = error.kind, error.message
    else:
        kind, described = type(error).__name__, str(error)
    span.set_attribute(A.ERROR_TYPE, kind)
    span.record_exception(error)
    span.set_status(error_status(described))
    return kind


def _is_cancellation(error: BaseException) -> bool:
    if isinstance(error, Cancelled):
        return True
    kind = type(error)
    return kind.__name__ in ("CancelledError", "Cancelled") and kind.__module__ in (
        "asyncio.exceptions",
        "trio",
        "trio._core._exceptions",
    )
