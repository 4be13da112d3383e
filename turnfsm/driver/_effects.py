"""The effects: one async function per decision, `async (ctx, decision) -> Event`.

Built-in phases and the phases users add share this one shape. An effect
reads what it needs from its `EffectContext` (model, tools, context manager,
the one counter, retry policy, hooks, clock, ids) and returns the event the
brain is fed next. It records nothing: the loop appends every event to the
log and derives the audit trail from (decision, event).

Every outside failure is translated into an event here, once (httpx's
translate-once rule); bugs and cancellation propagate unchanged.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final, Literal, TypeAlias, final

import anyio
import attrs

from turnfsm.context import (
    CircuitOpen,
    Compacted,
    CompactorError,
    ContextManager,
    ContextOverflow,
    NoAction,
)
from turnfsm.core import (
    CallLLM,
    Compact,
    CompactionCircuitOpened,
    CompactionNoop,
    CompactionOverflowed,
    CompactionResult,
    CompactorFailed,
    ContextOverflowed,
    Decision,
    Event,
    Measure,
    Measured,
    ModelFailed,
    ModelReplied,
    OutputRejected,
    Perform,
    RunTools,
    Snapshot,
    ToolsFinished,
)
from turnfsm.driver._arguments import InvalidArguments
from turnfsm.driver._output import OutputType
from turnfsm.driver._retry import RetryPolicy, is_transient
from turnfsm.driver._tools import Tool, deadline, run_tool_call
from turnfsm.errors import InvalidReturn, ProviderError
from turnfsm.hooks import (
    ModelCallEnd,
    ModelCallInfo,
    PreCompact,
    PreCompactInfo,
    TextDeltaInfo,
    ToolCallEnd,
    ToolCallInfo,
)
from turnfsm.hooks._dispatch import HookDispatcher
from turnfsm.messages import Joined, Message, MessageLog, ToolCallPart
from turnfsm.persistence import Session
from turnfsm.providers import ModelClient, ModelRequest, ModelResponse, ToolSchema
from turnfsm.providers._stream import StreamDone, TextDelta
from turnfsm.tokens import Meter
from turnfsm.values import ErrorInfo, Usage

__all__ = [
    "BUILTIN_EFFECTS",
    "Effect",
    "EffectContext",
    "call_model",
    "compact",
    "describe_model",
    "measure",
    "run_tools",
]


@final
@attrs.define(eq=False, kw_only=True)
class EffectContext:
    """What an effect may use while it carries out one decision of a run.

    The loop owns it and keeps `snapshot` current; effects only read it.

    Attributes:
        run_id: The run.
        session_id: Its session.
        snapshot: The brain's state as of the decision being carried out.
        model: The `ModelClient`.
        tools: The registered tools, by name.
        tool_schemas: Their schemas, as sent with every request.
        system_prompt: Sent with every request.
        context: The context manager, or None (no compaction).
        meter: Measures requests with the one counter (the manager's).
        extras: Texts that ride every request (system prompt, tool schemas).
        reserved: Tokens the request needs besides its messages: the extras
            plus the reply budget (`max_output_tokens`).
        max_output_tokens: The reply budget asked of the model.
        retry: The policy for transient model errors.
        model_timeout: Seconds each model attempt may take (None: no limit).
        tool_timeout: Seconds each tool call may take (None: no limit).
        hooks: The run's hooks (for the effects that steer or stream).
        stream: Whether replies are streamed to the hooks.
        clock: Wall-clock seconds (``time.time`` unless replaced).
        new_id: Makes a fresh id from a prefix.
        recorded: Tool results of the batch in flight that a previous process
            recorded before it died, by call id: not run again.
        record: Hands each tool result to the loop as the call finishes (the
            loop writes it to the log), or None.
        ephemeral: The session is ephemeral: compaction passes change nothing.
        session: The session's log view (read only), or None: compaction
            passes read its circuit breaker and recorded summaries.
        reported: The input tokens the provider reported for the run's last
            call, with that call's history and pending (seed 004's trigger,
            `ContextManager.use_reported_usage`), or None.
        spent: The usage of the compaction pass in flight's model calls, as
            they return (the loop keeps it when the pass times out or is
            cancelled).
        output: The run's output type, or None (the answer is plain text):
            a final reply that does not fit it is `OutputRejected`.
    """

    run_id: str
    session_id: str
    snapshot: Snapshot
    model: ModelClient
    tools: Mapping[str, Tool]
    tool_schemas: tuple[ToolSchema, ...]
    system_prompt: str | None
    context: ContextManager | None
    meter: Meter
    extras: tuple[str, ...]
    reserved: int
    max_output_tokens: int | None
    retry: RetryPolicy
    model_timeout: float | None
    tool_timeout: float | None
    hooks: HookDispatcher
    stream: bool
    clock: Callable[[], float]
    new_id: Callable[[str], str]
    recorded: Mapping[str, Message] = attrs.field(factory=dict)
    record: Callable[[Message], Awaitable[None]] | None = None
    ephemeral: bool = False
    session: Session | None = None
    reported: tuple[int, MessageLog, MessageLog] | None = None
    spent: list[Usage] = attrs.field(factory=list)
    output: OutputType | None = None

    @property
    def turn(self) -> int:
        """Model calls the run has made so far."""
        return self.snapshot.turns

    @property
    def window(self) -> int:
        """The context window the run works within (0: unlimited)."""
        return self.snapshot.budget.context_window

    def measure(self, *parts: Sequence[Message]) -> int:
        """Return the size of a request carrying `parts`: messages + reserved."""
        return self.meter.measure(*parts, extras=self.extras) + self._reply_budget

    @property
    def _reply_budget(self) -> int:
        return self.max_output_tokens or 0


Effect: TypeAlias = Callable[[EffectContext, Any], Awaitable[Event]]
"""An effect: ``async def effect(ctx: EffectContext, decision) -> Event``."""


async def measure(ctx: EffectContext, decision: Measure) -> Event:
    """Measure the whole next request: history + pending + extras + reply budget.

    With `ContextManager.use_reported_usage`, the provider's report for the
    last call stands in for the estimate of what that call carried (seed
    004), plus the estimate of what was added since.
    """
    reported = ctx.reported
    manager = ctx.context
    if reported is not None and manager is not None and manager.use_reported_usage:
        tokens, history, pending = reported
        if is_extension(decision.history, history, same=True) and is_extension(
            decision.pending, pending, same=False
        ):
            added = list(decision.pending.items_from(len(pending)))
            return Measured(estimate=tokens + manager.count(added) + ctx._reply_budget)
    return Measured(estimate=ctx.measure(decision.history, decision.pending))


def is_extension(new: MessageLog, old: MessageLog, *, same: bool) -> bool:
    """Whether `new` is `old` (`same`) or `old` plus more (no copy compared)."""
    if new is old:
        return True
    if new.store_key[0] is not old.store_key[0]:
        return False
    return len(new) == len(old) if same else len(new) >= len(old)


async def call_model(ctx: EffectContext, decision: CallLLM) -> Event:
    """Call the model with the whole request; classify what comes back.

    The request is measured again right before sending (cheap: the meter is
    incremental), whatever the machine believes, so that no machine file can
    make the driver send a request over the window; and the reply is measured
    before it is handed back, so a reply that would not fit is never committed.
    """
    window = ctx.window
    if window:
        estimate = ctx.measure(decision.history, decision.pending)
        if estimate > window:
            # Never serve a request over the window: treat it like the
            # provider's own rejection, so the machine compacts and retries.
            return _overflowed(
                f"request of {estimate} tokens (reply budget included) "
                f"exceeds the {window} window"
            )
    request = ModelRequest(
        messages=Joined(decision.history, decision.pending),
        system=ctx.system_prompt,
        tools=ctx.tool_schemas,
        max_tokens=ctx.max_output_tokens,
        output=None if ctx.output is None else ctx.output.spec,
    )
    try:
        response = await _complete(ctx, request)
    except ProviderError as exc:
        info = ErrorInfo(
            type=exc.kind,
            message=exc.message,
            retryable=exc.retriable,
            status=exc.status,
            retry_after=exc.retry_after,
        )
        if exc.is_context_overflow:
            return ContextOverflowed(error=info)
        return ModelFailed(error=info)
    except (TimeoutError, ConnectionError) as exc:
        return ModelFailed(error=ErrorInfo.from_exception(exc, retryable=True))
    if window:
        size = ctx.meter.measure(
            decision.history, decision.pending, (response.message,), extras=ctx.extras
        )
        if size > window:
            return _overflowed(
                f"the reply makes the conversation {size} tokens, over the "
                f"{window} window; it is not committed"
            )
    if ctx.output is not None and not response.message.tool_calls:
        try:
            ctx.output.parse(response.message.text)
        except InvalidArguments as exc:
            return OutputRejected(
                message=response.message,
                errors=ctx.output.errors(exc),
                usage=response.usage,
            )
    return ModelReplied(message=response.message, usage=response.usage)


def _overflowed(message: str) -> ContextOverflowed:
    return ContextOverflowed(error=ErrorInfo(type="ContextCheck", message=message))


async def _complete(
    ctx: EffectContext,
    request: ModelRequest,
    *,
    model: ModelClient | None = None,
    stream: bool | None = None,
    purpose: Literal["turn", "summary"] = "turn",
) -> ModelResponse:
    """Call the model; on a transient error, hand over to the retry policy.

    Args:
        ctx: The effect's context (retry policy, timeout, hooks).
        request: The request.
        model: The client to call (default: the run's model).
        stream: Whether to stream to the hooks (default: the run's setting).
        purpose: What the call is for, as the model-call hooks see it.
    """
    client = ctx.model if model is None else model
    streamed = ctx.stream if stream is None else stream
    hooks = ctx.hooks
    observed = hooks.wants("on_model_call_start") or hooks.wants("on_model_call_end")
    attempts = 0
    ended = 0.0

    async def call() -> ModelResponse:
        nonlocal attempts, ended
        attempts += 1
        if not observed:
            with deadline(ctx.model_timeout):
                if streamed:
                    return await _streamed(ctx, client, request)
                return _response_of(client, await client.complete(request))
        name, provider = describe_model(client)
        started = anyio.current_time()
        info = ModelCallInfo(
            session_id=ctx.session_id,
            run_id=ctx.run_id,
            key=ctx.new_id("call"),
            turn=ctx.turn + 1,
            attempt=attempts,
            purpose=purpose,
            model=name,
            provider=provider,
            request=request,
            waited=started - ended if attempts > 1 else 0.0,
        )
        hooks.call("on_model_call_start", info)
        response: ModelResponse | None = None
        error: BaseException | None = None
        try:
            # The deadline inside, so the end hook sees its TimeoutError,
            # not the cancellation it is made of.
            with deadline(ctx.model_timeout):
                if streamed:
                    response = await _streamed(ctx, client, request)
                else:
                    response = _response_of(client, await client.complete(request))
            return response
        except BaseException as exc:
            error = exc
            raise
        finally:
            ended = anyio.current_time()
            end = ModelCallEnd(
                call=info, response=response, error=error, duration=ended - started
            )
            hooks.call("on_model_call_end", end)

    started = anyio.current_time()
    try:
        # The first attempt runs outside tenacity: the happy path pays nothing.
        return await call()
    except Exception as exc:
        if not is_transient(exc) or ctx.retry.max_attempts < 2:
            raise
        first = exc
    # Attempt 1 failed: wait its backoff, then let tenacity continue the count.
    policy = ctx.retry
    await anyio.sleep(policy.wait_seconds(1, first))
    elapsed = anyio.current_time() - started
    async for attempt in policy.retrying(done=1, elapsed=elapsed):
        with attempt:
            return await call()
    raise AssertionError("unreachable: tenacity re-raises the last error")


def _response_of(client: object, response: object) -> ModelResponse:
    """Return `response` if it is a `ModelResponse`; else raise `InvalidReturn`."""
    if not isinstance(response, ModelResponse):
        raise InvalidReturn(
            f"model {describe_model(client)[1]}",
            _short_repr(response),
            "a ModelResponse",
        )
    return response


def _short_repr(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 200 else text[:197] + "..."


def describe_model(client: object) -> tuple[str | None, str | None]:
    """Return a client's (model name, provider name) as traces show them.

    The name is ``client.model`` when it is a string; the provider is
    ``client.provider_name``, else the client's class name.
    """
    name = getattr(client, "model", None)
    provider = getattr(client, "provider_name", None)
    return (
        name if isinstance(name, str) else None,
        provider if isinstance(provider, str) else type(client).__name__,
    )


async def _streamed(
    ctx: EffectContext, model: ModelClient, request: ModelRequest
) -> ModelResponse:
    """Consume the model's stream, forwarding text deltas to the hooks.

    A retried stream starts over, so observers may see a reply's first
    deltas twice; the brain only ever sees the one assembled reply.
    """
    stream = model.stream(request)  # type: ignore[attr-defined]
    response: ModelResponse | None = None
    turn = ctx.turn + 1
    async for item in stream:
        if isinstance(item, TextDelta):
            if item.text:
                ctx.hooks.call(
                    "on_text_delta",
                    TextDeltaInfo(run_id=ctx.run_id, turn=turn, text=item.text),
                )
        elif isinstance(item, StreamDone):
            response = item.response
    if response is None:
        raise ProviderError(
            "the model's stream ended without a reply", kind="bad_stream"
        )
    return response


async def run_tools(ctx: EffectContext, decision: RunTools) -> Event:
    """Run every call concurrently under the tool timeout; results in call order.

    In a batch of several calls each result is handed to `ctx.record` as its
    call finishes, so a run whose process dies mid-batch resumes without
    running the finished calls again (`ctx.recorded`). A lone call's result
    is logged by its `ToolsFinished`, written just as soon: a journal entry
    would close no window.
    """
    calls = decision.calls
    if len(calls) == 1:  # the usual case: no task group needed
        return ToolsFinished(results=(await _one_tool(ctx, calls[0], journal=False),))
    results: list[Message | None] = [None] * len(calls)

    async def one(index: int) -> None:
        results[index] = await _one_tool(ctx, calls[index], journal=True)

    if calls:
        async with anyio.create_task_group() as group:
            for index in range(len(calls)):
                group.start_soon(one, index)
    return ToolsFinished(results=[r for r in results if r is not None])


async def _one_tool(
    ctx: EffectContext, call: ToolCallPart, *, journal: bool
) -> Message:
    done = ctx.recorded.get(call.id)
    if done is not None:
        return done
    hooks = ctx.hooks
    if hooks.wants("on_tool_start") or hooks.wants("on_tool_end"):
        result = await _observed_tool(ctx, call)
    else:
        result = await run_tool_call(call, ctx.tools, limit=ctx.tool_timeout)
    if journal and ctx.record is not None:
        await ctx.record(result)
    return result


async def _observed_tool(ctx: EffectContext, call: ToolCallPart) -> Message:
    """Run one tool call between its `on_tool_start` and `on_tool_end` hooks."""
    hooks = ctx.hooks
    info = ToolCallInfo(
        session_id=ctx.session_id, run_id=ctx.run_id, turn=ctx.turn, call=call
    )
    hooks.call("on_tool_start", info)
    started = anyio.current_time()
    result: Message | None = None
    error: BaseException | None = None
    try:
        result = await run_tool_call(call, ctx.tools, limit=ctx.tool_timeout)
        return result
    except BaseException as exc:
        error = exc
        raise
    finally:
        duration = anyio.current_time() - started
        end = ToolCallEnd(call=info, result=result, error=error, duration=duration)
        hooks.call("on_tool_end", end)


async def compact(ctx: EffectContext, decision: Compact) -> Event:
    """Run one compaction pass and feed back what the manager made of it.

    The request's size before the pass is measured once, here; the manager
    reports its verdict in the same unit (reserved budget included), and
    that one count is what the event, the record and the hooks carry.
    """
    manager = ctx.context
    before = ctx.measure(decision.history, decision.pending)
    if manager is None or ctx.ephemeral:  # seed 004: ephemeral sessions never compact
        return CompactionNoop(before=before, after=before)
    messages = decision.messages
    guidance = PreCompact()
    if ctx.hooks.wants("pre_compact"):
        guidance = ctx.hooks.pre_compact(
            PreCompactInfo(
                run_id=ctx.run_id,
                reason=decision.reason,
                turn=ctx.turn,
                tokens_before=before,
                messages=messages,
            )
        )
    if guidance.veto:
        return CompactionNoop(before=before, after=before, vetoed=True)
    spent = ctx.spent
    spent.clear()

    async def model_call(
        request: ModelRequest, model: ModelClient | None
    ) -> ModelResponse:
        # A summary call is a model call: the run's retry policy, timeout
        # and usage accounting (labelled apart from the agent's own turns).
        response = await _complete(
            ctx, request, model=model, stream=False, purpose="summary"
        )
        if response.usage is not None:
            spent.append(response.usage)
        return response

    session = ctx.session
    target = None
    reported = ctx.snapshot.estimate
    if manager.use_reported_usage and reported is not None and reported > before:
        # The pass was triggered by the provider's count, which reads this
        # conversation as bigger than the manager's counter does: aim lower
        # in the same proportion, so that the pass shrinks what the provider
        # will count.
        target = manager.target_tokens * before // reported
    verdict = await manager.compact_with_reason(
        messages,
        turn=ctx.turn,
        reason=decision.reason,
        instructions=_opt(guidance.instructions),
        additional_context=_opt(guidance.additional_context),
        reserved=ctx.reserved,
        tokens_before=before,
        failures=session.compaction_failures if session is not None else 0,
        session_id=ctx.session_id,
        summaries=session.summary_texts if session is not None else None,
        model_call=model_call,
        target_tokens=target,
    )
    usage = sum(spent, Usage()) if spent else None
    match verdict:
        case Compacted(messages=new, tokens_after=after):
            return CompactionResult(
                messages=new, before=before, after=after, usage=usage
            )
        case NoAction(tokens_after=after):
            return CompactionNoop(before=before, after=max(after, before), usage=usage)
        case CompactorError(error=error):
            return CompactorFailed(
                used=before,
                limit=ctx.window,
                error=ErrorInfo(type="CompactorError", message=error),
                usage=usage,
            )
        case ContextOverflow(used=used):
            return CompactionOverflowed(used=used, limit=ctx.window, usage=usage)
        case CircuitOpen(failures=failures):
            return CompactionCircuitOpened(failures=failures)


def _opt(text: str | None) -> Sequence[str]:
    return (text,) if text else ()


BUILTIN_EFFECTS: Final[Mapping[str, Effect]] = {
    "measure": measure,
    "call_llm": call_model,
    "run_tools": run_tools,
    "compact": compact,
}
"""The built-in effects, by the decision kind they carry out."""


def effect_key(decision: Decision) -> str:
    """Return the name of the effect that carries `decision` out."""
    key = _KEYS.get(type(decision))
    if key is not None:
        return key
    return decision.effect if isinstance(decision, Perform) else ""


_KEYS: Final[dict[type, str]] = {
    Measure: "measure",
    CallLLM: "call_llm",
    RunTools: "run_tools",
    Compact: "compact",
}
