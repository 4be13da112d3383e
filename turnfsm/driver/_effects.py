"""The effects: one async function per decision, `async (ctx, decision) -> Event`.

Built-in phases and the phases users add share this one shape. An effect
reads what it needs from its frozen `EffectContext` (the run's resources:
model, tools, context manager, the one counter, retry policy, hooks, clock,
ids; the brain's snapshot) and returns the event the brain is fed next. It
records nothing: the loop appends every event to the log and builds the
audit trail from (decision, event). Tool results go to the step's
`ToolJournal` as they finish, and a pass's summary calls add to the step's
`UsageTally`: both are the loop's, handed in.

Every outside failure is translated into an event here, once (httpx's
translate-once rule); bugs and cancellation propagate unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final, TypeAlias

import anyio
import attrs

from turnfsm import _checks
from turnfsm.context import CompactionRequest
from turnfsm.core import (
    CallLLM,
    Compact,
    CompactionCircuitOpened,
    CompactionNoop,
    CompactorFailed,
    CompactReason,
    ContextOverflowed,
    Decision,
    Event,
    Measure,
    Measured,
    ModelFailed,
    ModelReplied,
    OutputRejected,
    PassEvent,
    Perform,
    RunTools,
    ToolsFinished,
)
from turnfsm.driver._arguments import InvalidArguments
from turnfsm.driver._cancels import cancel_errors, cancel_requested
from turnfsm.driver._context import (
    EffectContext,
    Reported,
    RunResources,
    report_limit,
)
from turnfsm.driver._model_calls import Tries, complete, describe_model
from turnfsm.driver._output import OutputType
from turnfsm.driver._recall import session_scope
from turnfsm.driver._refusal import refused_size
from turnfsm.driver._tools import run_tool_call, tool_call_outcome
from turnfsm.errors import (
    CONTENT_FILTER,
    CONTEXT_CHECK,
    CONTEXT_OVERFLOW,
    REPLY_OVER_WINDOW,
    InvalidMessage,
    InvalidReturn,
    ProviderError,
    SubagentWaiting,
)
from turnfsm.hooks import PreCompact, PreCompactInfo, ToolCallInfo
from turnfsm.messages import (
    Joined,
    Message,
    MessageLog,
    ToolCallPart,
    check_history,
    require_new_ids,
    unique_call_ids,
)
from turnfsm.providers import ModelClient, ModelRequest, ModelResponse
from turnfsm.values import ErrorInfo, Usage

__all__ = [
    "BUILTIN_EFFECTS",
    "Effect",
    "call_model",
    "checked_answer",
    "compact",
    "effect_key",
    "is_extension",
    "measure",
    "reply_taken",
    "run_one_tool",
    "run_tool_with_hooks",
    "run_tools",
]


Effect: TypeAlias = Callable[[EffectContext, Any], Awaitable[Event]]
"""An effect: ``async def effect(ctx: EffectContext, decision) -> Event``."""


async def measure(ctx: EffectContext, decision: Measure) -> Event:
    """Measure the whole next request: history + pending + extras + reply budget.

    With `ContextManager.use_reported_usage`, the provider's report for the
    last call stands in for the estimate of what that call carried, plus the
    estimate of what was added since. With `ContextManager.calibrate`, the
    estimates are scaled by the session's observed ratio.
    """
    reported = ctx.reported
    run = ctx.run
    manager = run.context
    if (
        reported is not None
        and manager is not None
        and manager.use_reported_usage
        and _extends(decision.history, decision.pending, reported)
    ):
        added = list(decision.pending.items_from(len(reported.pending)))
        reply = run.max_output_tokens or 0
        fresh = manager.calibrated(manager.count(added), ctx.ratio)
        return Measured(estimate=reported.tokens + fresh + reply, source="reported")
    calibrated = manager is not None and manager.calibration_factor(ctx.ratio) != 1.0
    return Measured(
        estimate=ctx.measure(decision.history, decision.pending),
        source="calibrated" if calibrated else "estimated",
    )


def _extends(history: MessageLog, pending: MessageLog, last: Reported) -> bool:
    """Whether this request is the reported one plus new pending messages."""
    return is_extension(history, last.history, same=True) and is_extension(
        pending, last.pending, same=False
    )


def is_extension(new: MessageLog, old: MessageLog, *, same: bool) -> bool:
    """Whether `new` is `old` (`same`) or `old` plus more (no copy compared)."""
    if new is old or (not same and not old):
        return True
    if new.store_key[0] is not old.store_key[0]:
        return False
    return len(new) == len(old) if same else len(new) >= len(old)


async def call_model(ctx: EffectContext, decision: CallLLM) -> Event:
    """Call the model with the whole request; classify what comes back.

    The request is measured again right before sending (cheap: the meter is
    incremental; calibrated like every measurement), whatever the machine
    believes, so that no machine file can make the driver send a request
    over the window; and the reply is measured
    before it is handed back, so a reply that would not fit is never committed.
    """
    window = ctx.window
    run = ctx.run
    if window:
        estimate = ctx.measure(decision.history, decision.pending)
        if estimate > window:
            # Never serve a request over the window: treat it like the
            # provider's own rejection, so the machine compacts and retries.
            return _overflowed(
                f"request of {estimate} tokens (reply budget included) "
                f"exceeds the {window} window"
            )
    output = run.output
    request = ModelRequest(
        messages=Joined(decision.history, decision.pending),
        system=run.system_prompt,
        tools=run.tool_schemas,
        max_tokens=run.max_output_tokens,
        output=None if output is None else output.spec,
    )
    tries = Tries()
    try:
        response = await complete(run, request, turn=ctx.turn + 1, tries=tries)
    except (ProviderError, TimeoutError, ConnectionError) as exc:
        if getattr(exc, "is_crash", False):
            raise  # a strict hook's error: the run crashes on it, not the model
        return _model_failed(exc, tries)
    _check_report(run, response.usage, window)
    cut = _cut_at_window(run, response, window)
    if cut is not None:
        return ContextOverflowed(
            error=ErrorInfo(type=CONTEXT_OVERFLOW, message=cut), usage=response.usage
        )
    taken = reply_taken(
        ctx, decision, ModelReplied(message=response.message, usage=response.usage)
    )
    if type(taken) is not ModelReplied:
        return taken
    if response.finish_reason in _UNFINISHED and (
        stopped := _stopped(run, response, output is not None)
    ):
        return ModelFailed(error=stopped, usage=response.usage)
    return checked_answer(output, taken)


def reply_taken(
    ctx: EffectContext, decision: CallLLM, replied: ModelReplied
) -> ModelReplied | ContextOverflowed:
    """The reply as the conversation takes it, or the window check's refusal.

    Each of its calls gets an id of its own (some servers repeat theirs),
    and so does the reply (a client that caches its replies gives one
    twice); a reply that would take the conversation over the window is
    not committed (`ContextOverflowed`). The built-in `call_llm` takes its
    replies so, and the loop those of an effect that replaces it.
    """
    run = ctx.run
    reply = unique_call_ids(replied.message, decision.history, decision.pending)
    try:
        require_new_ids((reply,), decision.history, decision.pending)
    except InvalidMessage:
        # Made of the request, not drawn: a durable workflow makes it again
        # the same when it replays.
        taken = {m.id for m in Joined(decision.history, decision.pending)}
        place = len(taken)
        fresh, more = f"{reply.id}_{place}", 1
        while fresh in taken:
            more += 1
            fresh = f"{reply.id}_{place}_{more}"
        reply = attrs.evolve(reply, id=fresh)
    if reply is not replied.message:
        replied = attrs.evolve(replied, message=reply)
    window = ctx.window
    if window:
        # Measured as the request was: calibrated too, or a reply the
        # request check let through would be refused for the same words.
        size = run.meter.measure(
            decision.history, decision.pending, (reply,), extras=run.extras
        )
        if run.context is not None:
            size = run.context.calibrated(size, ctx.ratio)
        if size > window:
            return _overflowed(
                f"{REPLY_OVER_WINDOW} {size} tokens, over the "
                f"{window} window; it is not committed",
                usage=replied.usage,
            )
    return replied


def checked_answer(
    output: OutputType | None, replied: ModelReplied
) -> ModelReplied | OutputRejected:
    """The reply as the run takes it: a final answer must read as `output`.

    A reply without tool calls that does not parse as the run's output type
    is `OutputRejected` (the machine asks again, or fails), so a run never
    ends done without its output: the built-in `call_llm` checks its
    replies so, and the loop checks those of an effect that replaces it.
    """
    message = replied.message
    if output is None or message.tool_calls:
        return replied
    try:
        output.parse(message.text)
    except InvalidArguments as exc:
        return OutputRejected(
            message=message, errors=output.errors(exc), usage=replied.usage
        )
    return replied


_UNFINISHED: Final = frozenset({"length", CONTENT_FILTER})
"""The finish reasons of a reply that may not be usable as it is."""
MAX_TOKENS: Final = "max_tokens"
"""The error kind of a reply cut off by its budget before it was usable."""


def _stopped(
    run: RunResources, response: ModelResponse, typed: bool
) -> ErrorInfo | None:
    """The failure of a reply the provider stopped short, when it is unusable.

    A reply cut off by its budget (finish reason ``length``) whose answer
    does not read as the output type (`typed`), or whose tool call's
    arguments broke off mid-JSON, would only be cut off again if asked
    again: the run fails naming the budget to raise; so does one cut off
    with nothing in it (a reasoning model's thinking took the budget). A
    reply the provider withheld (``content_filter``: a filter, a refusal)
    with nothing in it, or with text that is not the output type (the
    refusal's words), is no answer either: the run fails quoting it.
    Other such replies stand as they are (their `finish_reason` says so).
    """
    message = response.message
    if message.tool_calls and not any(
        set(c.arguments) == {"_raw"} for c in message.tool_calls
    ):
        return None  # whole calls: they run
    text = message.text.strip()
    if response.finish_reason == CONTENT_FILTER:
        if message.tool_calls or (text and (not typed or _parses(run, text))):
            return None  # a text that is the answer (a refusal, in words)
        said = f": {_short(text)}" if text else "; it had no text and no tool call"
        return ErrorInfo(
            type=CONTENT_FILTER,
            message="the provider withheld the answer (finish reason "
            f"{CONTENT_FILTER!r}){said}",
        )
    broken = [c.name for c in message.tool_calls if set(c.arguments) == {"_raw"}]
    if not broken and text and (not typed or _parses(run, text)):
        return None
    budget = run.max_output_tokens
    setting = (
        f"max_output_tokens={budget}"
        if budget is not None
        else "the model client's max_tokens, or the server's default"
    )
    if broken:
        what = f"before the arguments of its call to {broken[0]!r} were whole"
    elif text:
        what = "before its answer was whole"
    else:  # a reasoning model's thinking can take the whole budget
        what = "with no answer yet"
    return ErrorInfo(
        type=MAX_TOKENS,
        message=f"the reply was cut off at its budget ({setting}; finish reason "
        f"'length') {what}; raise max_output_tokens",
    )


def _parses(run: RunResources, text: str) -> bool:
    """Whether `text` reads as the run's output type."""
    assert run.output is not None
    try:
        run.output.parse(text)
    except InvalidArguments:
        return False
    return True


def _short(text: str) -> str:
    return repr(text if len(text) <= 200 else text[:197] + "...")


def _cut_at_window(
    run: RunResources, response: ModelResponse, window: int
) -> str | None:
    """Say why a reply cut off short of its budget was cut at the window, or None.

    A server that clips the reply budget to what its window leaves
    (llama.cpp's) instead of refusing the request cuts the reply off before
    its budget (finish reason ``length``); when its count of the input plus
    the budget is over the window, the counter read the request low, and
    the cut reply is no answer: the run treats it as the provider's
    refusal (a pass, and the model asked again), never commits it.
    """
    usage, budget = response.usage, run.max_output_tokens
    if not window or usage is None or not budget or response.finish_reason != "length":
        return None
    used, made = usage.input_tokens, usage.output_tokens
    if made >= budget or used + budget <= window:
        return None
    return (
        f"the provider cut the reply off at {made} of its {budget} tokens: by its "
        f"count the request is {used} input + {budget} reply = {used + budget} "
        f"tokens > the {window} window; the reply is not committed"
    )


def _check_report(run: RunResources, usage: Usage | None, window: int) -> None:
    """Raise `InvalidReturn` if `usage` reports what no request held to `window` has.

    Only where the report is read as the request's size
    (`ContextManager.use_reported_usage`) or calibrates the estimates
    (`ContextManager.calibrate`, which keeps the session's largest ratio):
    that one call's run fails, nothing of it logged as a turn, and the next
    run is measured as usual instead of from a count no pass can bring
    under the lines.
    """
    manager = run.context
    if usage is None or manager is None:
        return
    if not (manager.use_reported_usage or manager.calibrate):
        return
    limit = report_limit(window)
    if limit is not None and usage.input_tokens > limit:
        raise InvalidReturn(
            f"model {describe_model(run.model)[1]}",
            f"usage input_tokens={usage.input_tokens}",
            f"at most {limit:,} input tokens for a request held to the "
            f"{window:,} window",
        )


def _counted(info: ErrorInfo, tries: Tries) -> ErrorInfo:
    """`info` with the attempts the call made, when it was one worth retrying."""
    if not info.retryable or not tries.attempts:
        return info
    return attrs.evolve(info, attempts=tries.attempts, elapsed=round(tries.elapsed, 3))


_REQUEST: Final = _checks.instance(ModelRequest, "a ModelRequest")
_SUMMARY_MODEL: Final = _checks.instance(
    ModelClient,
    "a ModelClient (async complete()), or None: the agent's own",
    optional=True,
    awaited=("complete",),
)
"""What a compactor's `ctx.model_call(request, model)` takes."""


def _check_pairs(request: ModelRequest) -> None:
    """Refuse a summary `request` holding half a tool pair, as a provider would.

    Raises:
        InvalidMessage: a tool call without its result, or a result without
            its call, named; the request is not sent.
    """
    try:
        check_history(request.messages)
    except InvalidMessage as bad:
        raise InvalidMessage(
            bad.field, bad.value, f"{bad.reason}; the summary request was not sent"
        ) from None


def _over_window(
    ctx: EffectContext, request: ModelRequest, model: ModelClient | None
) -> ProviderError | None:
    """The refusal of a summary `request` to `model` over that model's window.

    The agent's own model (None, or the run's) has the run's window; another
    model the window its client states (an int ``context_window``), or none
    known (nothing is refused).
    """
    if model is None or model is ctx.run.model:
        window, whose = ctx.window, ""
    else:
        known: Any = getattr(model, "context_window", None)
        _checks.check(known, "model.context_window", _MODEL_WINDOW)
        name, provider = describe_model(model)
        window, whose = known or 0, f" of {name or provider}"
    if not window:
        return None
    size = ctx.measure_request(request)
    manager = ctx.run.context
    if not whose and manager is not None:
        # The agent's model, as its turns are held to it: calibrated, the
        # size the provider is expected to count.
        budget = request.max_tokens or 0
        size = manager.calibrated(size - budget, ctx.ratio) + budget
    if size <= window:
        return None
    return ProviderError(
        f"summary request of {size} tokens (reply budget included) exceeds the "
        f"{window} window{whose}; it was not sent",
        kind=CONTEXT_OVERFLOW,
    )


_MODEL_WINDOW: Final = _checks.integer(
    low=1, optional=True, expected="an int >= 1 (tokens), or None (not known)"
)
"""What a summary model's ``context_window`` may be."""


def _overflowed(message: str, *, usage: Usage | None = None) -> ContextOverflowed:
    """The window check's refusal; `usage`: what a reply it refused cost."""
    return ContextOverflowed(
        error=ErrorInfo(type=CONTEXT_CHECK, message=message), usage=usage
    )


async def run_tools(ctx: EffectContext, decision: RunTools) -> Event:
    """Run every call concurrently under the tool timeout; results in call order.

    In a batch of several calls each result goes to the step's journal as
    its call finishes, so a run whose process dies mid-batch resumes without
    running the finished calls again (`ToolJournal.recorded`). A lone call's
    result is logged by its `ToolsFinished`, written just as soon: a journal
    entry would close no window. A sub-agent that pauses for an answer
    (`SubagentWaiting`) stops the run once the batch's other calls finish.
    """
    calls = decision.calls
    if len(calls) == 1:  # the usual case: no task group needed
        return ToolsFinished(results=(await run_one_tool(ctx, calls[0]),))
    results: list[Message | None] = [None] * len(calls)
    waiting: list[SubagentWaiting] = []

    async def one(index: int) -> None:
        try:
            results[index] = await run_one_tool(ctx, calls[index], journal=True)
        except SubagentWaiting as paused:  # the others finish (and are journaled)
            waiting.append(paused)

    try:
        async with anyio.create_task_group() as group:
            for index in range(len(calls)):
                group.start_soon(one, index)
    except BaseExceptionGroup as raised:
        # The first failure (a result the store could not take, a strict
        # hook's error) stops the others: it surfaces as itself, as a lone
        # call's would, even when a call it stopped failed too on its way
        # out (its hook raised again).
        first = raised.exceptions[0]
        if len(raised.exceptions) == 1 or all(
            isinstance(e, Exception) for e in raised.exceptions
        ):
            raise first from None
        raise
    if waiting:
        raise waiting[0]
    return ToolsFinished(results=[r for r in results if r is not None])


async def run_one_tool(
    ctx: EffectContext, call: ToolCallPart, *, journal: bool = False
) -> Message:
    """Run one tool call between its hooks; return its result message.

    A call whose result the step's journal holds already (recorded before a
    crash) is not run again; one of them closed as interrupted here is heard
    by the hooks (`ToolCallInfo.interrupted`), its result the error result
    that closed it. With `journal`, the result goes to the
    journal as soon as the call finishes. A tool's exception, timeout or bad
    arguments are an error result, never an exception.
    """
    kept = ctx.journal
    if kept is not None:
        done = kept.recorded.get(call.id)
        if done is not None:
            if call.id in kept.interrupted:
                await _heard_interrupted(ctx.run, call, ctx.turn, done)
            return done
    result = await run_tool_with_hooks(ctx.run, call, turn=ctx.turn)
    if journal and kept is not None and kept.record is not None:
        await kept.record(result)
    return result


async def run_tool_with_hooks(
    run: RunResources, call: ToolCallPart, *, turn: int
) -> Message:
    """Run one tool call of `run` between its hooks; return its result message.

    What `run_one_tool` does outside a step (no journal): a durable run's
    tool activity, which knows the call and its turn, not the conversation.
    A tool's exception, timeout or bad arguments are an error result.
    """
    hooks = run.hooks
    with session_scope(run.session):  # a tool may read its conversation's log
        if hooks.wants("on_tool_start") or hooks.wants("on_tool_end"):
            return await _observed_tool(run, call, turn)
        return await run_tool_call(call, run.tools, limit=run.tool_timeout)


async def _heard_interrupted(
    run: RunResources, call: ToolCallPart, turn: int, closed: Message
) -> None:
    """Tell the hooks of a call closed as interrupted: it starts and ends at once.

    Its process died while it ran, so no hook heard it end; the result that
    closes it (an error result) is what `on_tool_end` hears.
    """
    hooks = run.hooks
    if not (hooks.wants("on_tool_start") or hooks.wants("on_tool_end")):
        return
    info = ToolCallInfo(
        session_id=run.session_id,
        run_id=run.run_id,
        turn=turn,
        call=call,
        interrupted=True,
    )

    async def closing() -> tuple[Message, Exception | None]:
        return closed, None

    await hooks.tool_call(info, closing, clock=anyio.current_time)


async def _observed_tool(run: RunResources, call: ToolCallPart, turn: int) -> Message:
    """Run one tool call between its `on_tool_start` and `on_tool_end` hooks."""
    info = ToolCallInfo(
        session_id=run.session_id, run_id=run.run_id, turn=turn, call=call
    )
    return await run.hooks.tool_call(
        info,
        lambda: tool_call_outcome(call, run.tools, limit=run.tool_timeout),
        clock=anyio.current_time,
    )


async def compact(ctx: EffectContext, decision: Compact) -> Event:
    """Run one compaction pass; its event is the context manager's own answer.

    The request's size before the pass is measured once, here; the manager
    reports in the same unit (reserved budget included), and that one count
    is what the event, the record and the hooks carry.
    """
    run = ctx.run
    manager = run.context
    before = run.measure(decision.history, decision.pending)
    if manager is None or run.ephemeral:  # ephemeral sessions never compact
        return CompactionNoop(before=before, after=before)
    messages = decision.messages
    guidance = PreCompact()
    if run.hooks.wants("pre_compact"):
        guidance = run.hooks.pre_compact(
            PreCompactInfo(
                run_id=run.run_id,
                reason=decision.reason,
                turn=ctx.turn,
                tokens_before=before,
                messages=messages,
            )
        )
    if guidance.veto:
        return CompactionNoop(before=before, after=before, vetoed=True)
    spent = ctx.spent

    async def model_call(
        request: ModelRequest, model: ModelClient | None
    ) -> ModelResponse:
        # A summary call is a model call: the run's retry policy, timeout
        # and usage accounting (labelled apart from the agent's own turns).
        # It is held to its model's window, as a turn is: the run's for
        # the agent's own model, a model's own known window (its
        # `context_window`) for another. One over it is refused unsent, as
        # the provider would refuse it.
        _checks.check(request, "request", _REQUEST)
        _checks.check(model, "model", _SUMMARY_MODEL)
        _check_pairs(request)
        refused = _over_window(ctx, request, model)
        if refused is not None:
            raise refused
        response = await complete(
            run,
            request,
            turn=ctx.turn + 1,
            model=model,
            stream=False,
            purpose="summary",
        )
        spent.add(response.usage)
        return response

    session = run.session
    target = None
    window = None
    factor = manager.calibration_factor(ctx.ratio)
    if factor > 1.0:
        # The provider counts more than the counter reads: the window, in
        # the counter's tokens, is smaller (a summary the compactor sizes
        # to it then fits as the provider counts it, `_over_window`).
        window = max(1, math.floor(manager.window / factor))
    reported = ctx.snapshot.estimate
    if manager.use_reported_usage and reported is not None and reported > before:
        # The pass was triggered by the provider's count, which reads this
        # conversation as bigger than the manager's counter does: aim lower
        # in the same proportion, so that the pass shrinks what the provider
        # will count.
        target = manager.target_tokens * before // reported
    elif factor != 1.0:
        # The lines read calibrated sizes, the pass works on estimates:
        # aim at the estimate whose calibrated size is the target, lower
        # when the estimate reads low (else a pass that the estimate finds
        # already under the target cuts nothing), and never past the window
        # (which the manager checks the estimate against) when it reads high.
        target = min(manager.window, math.floor(manager.target_tokens / factor))
    refused = refused_size(ctx.snapshot.overflow, ctx.window)
    if decision.reason is CompactReason.OVERFLOW and refused and refused > before:
        # The provider refused a request the estimate read as fitting: its
        # tokenizer reads this conversation bigger than the counter does
        # (digits, hex, another vocabulary). Aim lower in that proportion,
        # else a pass that finds the estimate under the target cuts nothing.
        aim = manager.target_tokens * before // refused
        target = aim if target is None else min(target, aim)
    request = CompactionRequest(
        messages=messages,
        reason=decision.reason,
        turn=ctx.turn,
        instructions=_opt(guidance.instructions),
        additional_context=_opt(guidance.additional_context),
        reserved=run.reserved,
        tokens_before=before,
        failures=session.compaction_failures if session is not None else 0,
        session_id=run.session_id,
        summaries=session.summary_texts if session is not None else {},
        model_call=model_call,
        target_tokens=target,
        pinned=guidance.pin,
        context_window=window,
    )
    try:
        event = await manager.compact(request)
    except cancel_errors() as exc:
        if cancel_requested():
            raise  # the run is cancelled (or its pass timed out)
        # A compactor that awaited something cancelled elsewhere (a future,
        # a task): its failure, not the run's cancellation.
        event = CompactorFailed(
            used=before,
            limit=manager.window,
            error=ErrorInfo(
                type="CompactorError",
                message=f"{manager.strategy} raised {type(exc).__name__} though "
                "nothing cancelled the pass (it awaited something cancelled "
                "elsewhere)",
            ),
        )
    return with_usage(event, spent.total)


_BARE_KINDS: Final = ((TimeoutError, "timeout"), (ConnectionError, "connection"))
"""The `ProviderError.kind` of a model call that failed on a bare exception.

A `TimeoutError` (the call ran past `model_timeout`, or a client of one's
own timed out) and a `ConnectionError` get the kinds the shipped clients
give the same failures (``timeout``, ``connection``), so a run's error says
one kind for one failure, whichever client met it.
"""


def _model_failed(
    exc: ProviderError | TimeoutError | ConnectionError, tries: Tries
) -> ContextOverflowed | ModelFailed:
    """The event of a model call that failed: an overflow, or a failure to retry."""
    if not isinstance(exc, ProviderError):
        kind = next(kind for bare, kind in _BARE_KINDS if isinstance(exc, bare))
        info = ErrorInfo(
            type=kind,
            # A bare TimeoutError() says nothing: its class says what failed.
            message=_checks.message_of(exc) or type(exc).__name__,
            retryable=True,
        )
        return ModelFailed(error=_counted(info, tries))
    info = ErrorInfo(
        type=exc.kind,
        message=exc.message,
        retryable=exc.retryable,
        status=exc.status,
        retry_after=exc.retry_after,
    )
    # A reply the client could not use (cut at the window, a refusal) was
    # billed all the same: its usage counts, as a reply the driver refuses.
    if exc.is_context_overflow:
        return ContextOverflowed(error=info, usage=exc.usage)
    return ModelFailed(error=_counted(info, tries), usage=exc.usage)


def with_usage(event: PassEvent, usage: Usage | None) -> PassEvent:
    """Return `event` carrying what the pass's model calls cost (if anything)."""
    if usage is None or isinstance(event, CompactionCircuitOpened):
        return event
    return attrs.evolve(event, usage=usage)


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
