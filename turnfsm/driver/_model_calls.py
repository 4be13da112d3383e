"""Model calls: the hooks around each attempt, the timeout, and the retries.

Every model call of a run goes through `complete`: the agent's own turns
(the `call_llm` effect) and a compaction pass's summary calls alike, so
both get the run's retry policy, timeout and hooks.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Awaitable, Callable
from typing import Final, Literal

import anyio
import attrs

from turnfsm import _checks
from turnfsm.driver._context import RunResources
from turnfsm.driver._retry import is_transient
from turnfsm.driver._tools import deadline
from turnfsm.errors import ConfigError, InvalidReturn, ProviderError
from turnfsm.hooks import (
    ModelCallEnd,
    ModelCallInfo,
    TextDeltaInfo,
    TextDiscardedInfo,
)
from turnfsm.providers import (
    ModelClient,
    ModelRequest,
    ModelResponse,
    StreamDone,
    TextDelta,
)

__all__ = ["Tries", "complete", "describe_model"]


@attrs.define
class Tries:
    """How a model call went: its attempts, and the seconds they took in all.

    `elapsed` is filled in when the call fails (what its failure reports):
    a call that answers reads the clock no more.
    """

    attempts: int = 0
    elapsed: float = 0.0


async def complete(
    run: RunResources,
    request: ModelRequest,
    *,
    turn: int,
    model: ModelClient | None = None,
    stream: bool | None = None,
    purpose: Literal["turn", "summary"] = "turn",
    tries: Tries | None = None,
) -> ModelResponse:
    """Call the model; on a transient error, hand over to the retry policy.

    Args:
        run: The run's resources (retry policy, timeout, hooks).
        request: The request.
        turn: The turn the call belongs to (the run's model calls so far + 1).
        model: The client to call (default: the run's model).
        stream: Whether to stream to the hooks (default: the run's setting).
        purpose: What the call is for, as the model-call hooks see it.
        tries: Filled in with the attempts made, however the call ends, and
            the time they took when it fails.
    """
    client = run.model if model is None else model
    streamed = run.stream if stream is None else stream
    hooks = run.hooks
    observed = hooks.wants("on_model_call_start") or hooks.wants("on_model_call_end")
    attempts = run.first_attempt - 1  # a durable run's retry: Temporal's count
    ended: float | None = None  # when this process's last attempt ended
    limit = run.model_timeout
    sent: list[str] = []  # the text the attempt streamed to the hooks

    def what() -> str:  # asked only when an attempt timed out
        return _model_label(client)

    async def call() -> ModelResponse:
        nonlocal attempts
        attempts += 1
        sent.clear()
        try:
            return await observed_call()
        except Exception as exc:
            if sent:
                info = TextDiscardedInfo(
                    run_id=run.run_id,
                    turn=turn,
                    attempt=attempts,
                    text="".join(sent),
                    error=exc,
                )
                hooks.call("on_text_discarded", info)
            if isinstance(exc, ProviderError):
                _check_provider_error(client, exc)
            raise

    async def observed_call() -> ModelResponse:
        nonlocal ended
        if not observed:
            with deadline(limit, what):
                if streamed:
                    return await _streamed(run, client, request, turn, sent)
                return _response_of(client, await client.complete(request))
        name, provider = describe_model(client)
        started = anyio.current_time()
        info = ModelCallInfo(
            session_id=run.session_id,
            run_id=run.run_id,
            key=run.new_id("call"),
            turn=turn,
            attempt=attempts,
            purpose=purpose,
            model=name,
            provider=provider,
            request=request,
            waited=(
                0.0
                if attempts < 2
                else run.first_wait  # waited in another attempt's activity
                if ended is None
                else started - ended
            ),
        )
        response: ModelResponse | None = None
        error: BaseException | None = None
        try:
            # A strict hook that raises here still has the end hooks called:
            # one that began something (a span made current) ends it.
            hooks.call("on_model_call_start", info)
            # The deadline inside, so the end hook sees its TimeoutError,
            # not the cancellation it is made of.
            with deadline(limit, what):
                if streamed:
                    response = await _streamed(run, client, request, turn, sent)
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
        return await _retried(run, call, started)
    except BaseException:
        if tries is not None:
            tries.elapsed = anyio.current_time() - started
        raise
    finally:
        if tries is not None:
            tries.attempts = attempts


async def _retried(
    run: RunResources, call: Callable[[], Awaitable[ModelResponse]], started: float
) -> ModelResponse:
    """Make `call`, and again while the run's retry policy says so."""
    try:
        # The first attempt runs outside tenacity: the happy path pays nothing.
        return await call()
    except Exception as exc:
        if not is_transient(exc) or run.retry.max_attempts < 2:
            raise
        first = exc
    # Attempt 1 failed: wait its backoff, then let tenacity continue the count.
    policy = run.retry
    policy.check_budget(first, elapsed=anyio.current_time() - started)
    wait = policy.wait_seconds(1, first)
    if not policy.allows_wait(wait, elapsed=anyio.current_time() - started):
        raise first  # no wait ends past the budget (nor does tenacity's)
    await anyio.sleep(wait)
    elapsed = anyio.current_time() - started
    async for attempt in policy.retrying(done=1, elapsed=elapsed):
        with attempt:
            return await call()
    raise AssertionError("unreachable: tenacity re-raises the last error")


def _response_of(client: object, response: object) -> ModelResponse:
    """Return `response` if it is a usable `ModelResponse`; else raise `InvalidReturn`.

    Its usage, when reported, is one call's: neither count can be over
    `turnfsm._checks.MAX_TOKENS`, more than any window holds. A count past
    it is a client's bug (an overflowed or uninitialised number), and would
    read as a conversation no pass can shrink, in this run and the next.
    """
    if not isinstance(response, ModelResponse):
        raise InvalidReturn(
            f"model {describe_model(client)[1]}",
            _short_repr(response),
            "a ModelResponse",
        )
    usage = response.usage
    if usage is not None:
        for name in ("input_tokens", "output_tokens"):
            tokens = getattr(usage, name)
            if tokens > _checks.MAX_TOKENS:
                raise InvalidReturn(
                    f"model {describe_model(client)[1]}",
                    f"usage {name}={tokens}",
                    f"at most {_checks.MAX_TOKENS:,} tokens for one call",
                )
    return response


_PROVIDER_ERROR_FIELDS: Final = (
    ("message", _checks.string()),
    ("kind", _checks.string()),
    ("retryable", _checks.boolean()),
    ("status", _checks.integer(low=0, optional=True)),
    ("retry_after", _checks.number(low=0, optional=True)),
    ("attempts", _checks.integer(low=0, optional=True)),
    ("elapsed", _checks.number(low=0, optional=True)),
)
"""What each field of a model's `ProviderError` must be for the run to read it."""


def _check_provider_error(client: object, exc: ProviderError) -> None:
    """Raise `InvalidReturn` if `exc` has a field the run cannot read.

    A client's `ProviderError` is read by the retry policy (its
    `retry_after`), the run's failure and the log: a `retry_after` of -5 or
    ``"10"``, a `kind` of None, would break there, far from the client. It
    is refused where the client raised it, naming the field and the value.
    """
    for name, check in _PROVIDER_ERROR_FIELDS:
        value = getattr(exc, name)
        try:
            _checks.check(value, name, check)
        except ConfigError as bad:
            raise InvalidReturn(
                f"model {describe_model(client)[1]}",
                f"ProviderError with {name}={_short_repr(value)}",
                f"its {name} to be {bad.expected}",
            ) from exc


def _model_label(client: object) -> str:
    """Name the model a timeout's error names: ``model 'gpt-4o'``."""
    name, provider = describe_model(client)
    return f"model {name!r}" if name else f"model {provider}"


def _stray(item: object, done: bool) -> str:
    """Name what a stream should not have yielded, and when."""
    if not done:
        return _short_repr(item)
    if type(item) is StreamDone:
        return "a second StreamDone"
    return f"{_short_repr(item)} after its StreamDone"


def _close(value: object) -> None:
    """Close a coroutine that will not be awaited (no "never awaited" warning)."""
    close = getattr(value, "close", None)
    if inspect.iscoroutine(value) and callable(close):
        close()


async def _closed(stream: object) -> None:
    """Close a stream (an async generator) the run stopped reading.

    The error that stopped the run is the one reported: an error the
    generator raises while it closes is not raised over it.
    """
    aclose = getattr(stream, "aclose", None)
    if callable(aclose):
        with contextlib.suppress(Exception):
            await aclose()


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
    run: RunResources,
    model: ModelClient,
    request: ModelRequest,
    turn: int,
    sent: list[str],
) -> ModelResponse:
    """Consume the model's stream, forwarding text deltas to the hooks.

    Each piece forwarded is kept in `sent`: a retried stream starts over,
    and the hooks hear of an attempt that failed after sending text
    (`on_text_discarded`); the brain only ever sees the one assembled reply.

    Raises:
        InvalidReturn: the stream yielded something other than `TextDelta`s
            and then one `StreamDone` (a client's bug, named).
    """
    stream = model.stream(request)  # type: ignore[attr-defined]
    if not hasattr(stream, "__aiter__"):
        _close(stream)
        raise InvalidReturn(
            f"model {describe_model(model)[1]}.stream()",
            _short_repr(stream),
            "an async iterator (write stream() as an async generator: "
            "async def with yield)",
        )
    response: ModelResponse | None = None
    try:
        async for item in stream:
            if type(item) is TextDelta and response is None:
                if not isinstance(item.text, str):  # the hooks would get it as text
                    raise InvalidReturn(
                        f"model {describe_model(model)[1]}.stream()",
                        _short_repr(item),
                        "TextDelta items whose text is a string",
                    )
                if item.text:
                    sent.append(item.text)
                    run.hooks.call(
                        "on_text_delta",
                        TextDeltaInfo(run_id=run.run_id, turn=turn, text=item.text),
                    )
            elif type(item) is StreamDone and response is None:
                response = _response_of(model, item.response)
            else:
                raise InvalidReturn(
                    f"model {describe_model(model)[1]}.stream()",
                    _stray(item, response is not None),
                    "TextDelta items, then one StreamDone, and nothing after it",
                )
    except Exception:
        # Left mid-way by the run (not by the stream's own error, which ended
        # it): close it now, so a client's HTTP response goes back now, not
        # when the generator is garbage-collected.
        await _closed(stream)
        raise
    if response is None:
        raise ProviderError(
            "the model's stream ended without a reply", kind="bad_stream"
        )
    return response
