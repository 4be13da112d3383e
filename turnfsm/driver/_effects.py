"""The driver's effects: one async function per decision, each returning an event.

Every outside failure is translated into an event here, once (httpx's
translate-once rule); bugs and cancellation propagate unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import anyio
import attrs

from turnfsm.context import Compacted, ContextOverflow, NoAction
from turnfsm.core import (
    CallLLM,
    Compact,
    CompactionNoop,
    CompactionOverflowed,
    CompactionResult,
    CompactorFailed,
    ContextOverflowed,
    ErrorInfo,
    Event,
    ModelFailed,
    ModelReplied,
    RunTools,
    ToolsFinished,
)
from turnfsm.driver._retry import is_transient
from turnfsm.driver._session import CompactionRecord
from turnfsm.driver._tools import Tool, deadline, run_tool_call
from turnfsm.errors import ProviderError
from turnfsm.hooks import CompactionInfo, PreCompact, PreCompactInfo, TextDeltaInfo
from turnfsm.messages import Joined, Message, MessageLog
from turnfsm.providers import ModelRequest, ModelResponse
from turnfsm.providers._stream import StreamDone, TextDelta

if TYPE_CHECKING:
    from turnfsm.driver._driver import _Run

__all__ = ["call_model", "compact", "run_tools"]


async def call_model(run: _Run, decision: CallLLM) -> Event:
    """Call the model with the whole request; classify what comes back.

    The request is measured again right before sending (cheap: the meter is
    incremental), whatever the machine believes, so that no machine file can
    make the driver send a request over the window.
    """
    driver = run.driver
    estimate = run.measure(decision.history, decision.pending)
    window = run.budget.context_window
    if window and estimate > window:
        # Never serve a request over the window: treat it like the provider's
        # own rejection, so the machine compacts and retries or fails.
        return ContextOverflowed(
            error=ErrorInfo(
                type="ContextCheck",
                message=f"request of {estimate} tokens exceeds the {window} window",
            )
        )
    request = ModelRequest(
        messages=Joined(decision.history, decision.pending),
        system=driver.system_prompt,
        tools=run.tool_schemas,
        max_tokens=driver.max_output_tokens,
    )
    try:
        response = await _complete(run, request)
    except ProviderError as exc:
        info = ErrorInfo(
            type=exc.kind,
            message=exc.message,
            retryable=exc.retriable,
            status=exc.status,
        )
        if exc.is_context_overflow:
            return ContextOverflowed(error=info)
        return ModelFailed(error=info)
    except (TimeoutError, ConnectionError) as exc:
        return ModelFailed(error=ErrorInfo.from_exception(exc, retryable=True))
    run.record_turn(decision, response.message, response.usage)
    return ModelReplied(message=response.message, usage=response.usage)


async def _complete(run: _Run, request: ModelRequest) -> ModelResponse:
    """Call the model; on a transient error, hand over to the retry policy."""
    driver = run.driver
    call = _streamed if run.wants_stream else _plain
    started = anyio.current_time()
    try:
        # The first attempt runs outside tenacity: the happy path pays nothing.
        with deadline(driver.model_timeout):
            return await call(run, request)
    except Exception as exc:
        if not is_transient(exc) or driver.retry.max_attempts < 2:
            raise
        first = exc
    # Attempt 1 failed: wait its backoff, then let tenacity continue the count.
    policy = driver.retry
    await anyio.sleep(policy.wait_seconds(1, first))
    elapsed = anyio.current_time() - started
    async for attempt in policy.retrying(done=1, elapsed=elapsed):
        with attempt, deadline(driver.model_timeout):
            return await call(run, request)
    raise AssertionError("unreachable: tenacity re-raises the last error")


async def _plain(run: _Run, request: ModelRequest) -> ModelResponse:
    return await run.driver.model.complete(request)


async def _streamed(run: _Run, request: ModelRequest) -> ModelResponse:
    """Consume the model's stream, forwarding text deltas to the hooks.

    A retried stream starts over, so observers may see a reply's first
    deltas twice; the brain only ever sees the one assembled reply.
    """
    stream = run.driver.model.stream(request)  # type: ignore[attr-defined]
    response: ModelResponse | None = None
    async for item in stream:
        if isinstance(item, TextDelta):
            if item.text:
                run.hooks.call(
                    "on_text_delta",
                    TextDeltaInfo(run_id=run.run_id, turn=run.turn, text=item.text),
                )
        elif isinstance(item, StreamDone):
            response = item.response
    if response is None:
        raise ProviderError(
            "the model's stream ended without a reply", kind="bad_stream"
        )
    return response


async def run_tools(run: _Run, decision: RunTools) -> Event:
    """Run every call concurrently under the tool timeout; results in call order."""
    tools: Mapping[str, Tool] = run.tools
    results: list[Message | None] = [None] * len(decision.calls)
    timeout = run.driver.tool_timeout

    async def one(index: int) -> None:
        results[index] = await run_tool_call(
            decision.calls[index], tools, limit=timeout
        )

    if len(decision.calls) == 1:
        await one(0)
    else:
        async with anyio.create_task_group() as group:
            for index in range(len(decision.calls)):
                group.start_soon(one, index)
    return ToolsFinished(results=[r for r in results if r is not None])


async def compact(run: _Run, decision: Compact) -> Event:
    """Run one compaction pass and feed back what the manager made of it."""
    driver = run.driver
    before = run.measure(decision.history, decision.pending)
    messages = decision.messages
    if driver.context is None:
        return _noop(run, decision, before, len(messages), vetoed=False)
    guidance = PreCompact()
    if run.hooks.wants("pre_compact"):
        guidance = run.hooks.pre_compact(
            PreCompactInfo(
                run_id=run.run_id,
                reason=decision.reason,
                turn=run.turn,
                tokens_before=before,
                messages=messages,
            )
        )
    if guidance.veto:
        return _noop(run, decision, before, len(messages), vetoed=True)
    result = await driver.context.compact_with_reason(
        messages,
        turn=run.turn,
        reason=decision.reason,
        instructions=_opt(guidance.instructions),
        additional_context=_opt(guidance.additional_context),
        reserved=run.reserved,
    )
    match result:
        case Compacted(messages=new):
            after = run.measure(MessageLog(new), MessageLog())
            _report(run, decision, before, after, len(messages), len(new), True, False)
            return CompactionResult(messages=new, before=before, after=after)
        case NoAction():
            return _noop(run, decision, before, len(messages), vetoed=False)
        case ContextOverflow(used=used, compactor_error=error) if error is not None:
            _report(
                run,
                decision,
                before,
                before,
                len(messages),
                len(messages),
                False,
                False,
            )
            limit = run.budget.context_window
            return CompactorFailed(
                used=used,
                limit=limit,
                error=ErrorInfo(type="CompactorError", message=error),
            )
        case ContextOverflow(used=used):
            _report(
                run, decision, before, used, len(messages), len(messages), False, False
            )
            return CompactionOverflowed(used=used, limit=run.budget.context_window)


def _opt(text: str | None) -> Sequence[str]:
    return (text,) if text else ()


def _noop(
    run: _Run, decision: Compact, before: int, count: int, *, vetoed: bool
) -> Event:
    _report(run, decision, before, before, count, count, False, vetoed)
    return CompactionNoop(before=before, after=before)


def _report(
    run: _Run,
    decision: Compact,
    before: int,
    after: int,
    count_before: int,
    count_after: int,
    compacted: bool,
    vetoed: bool,
) -> None:
    record = CompactionRecord(
        reason=decision.reason,
        tokens_before=before,
        tokens_after=after,
        messages_before=count_before,
        messages_after=count_after,
        compacted=compacted,
        vetoed=vetoed,
    )
    run.compactions.append(record)
    if not (run.hooks.wants("post_compact") or run.hooks.wants("on_compaction")):
        return
    # The hook sees the audit record plus where it happened.
    info = CompactionInfo(
        run_id=run.run_id, turn=run.turn, **attrs.asdict(record, recurse=False)
    )
    if compacted:
        run.hooks.call("on_compaction", info)
    run.hooks.call("post_compact", info)
