from __future__ import annotations

import itertools
from typing import Final

import attrs
import pytest

from turnfsm.driver import RetryPolicy, RunResult, is_transient
from turnfsm.errors import CONTEXT_OVERFLOW, ConfigError, ProviderError
from turnfsm.providers import ModelRequest, ModelResponse
from turnfsm.testing import FakeModelClient


def test_transient_errors_are_retried_overflow_and_bugs_are_not() -> None:
    assert is_transient(ProviderError("slow", retryable=True, kind="rate_limit"))
    assert is_transient(TimeoutError())
    assert is_transient(ConnectionResetError())
    assert not is_transient(ProviderError("auth", kind="auth"))
    assert not is_transient(
        ProviderError("too long", retryable=True, kind=CONTEXT_OVERFLOW)
    )
    assert not is_transient(TypeError("bug"))


def test_backoff_is_exponential_capped_and_jittered() -> None:
    policy = RetryPolicy(initial_wait=1, max_wait=5, jitter=False)
    assert [policy.wait_seconds(n, None) for n in (1, 2, 3, 4, 5)] == [1, 2, 4, 5, 5]
    jittered = RetryPolicy(initial_wait=1, max_wait=5)
    for n in range(1, 6):
        wait = jittered.wait_seconds(n, None)
        full = min(5, 2 ** (n - 1))
        assert full / 2 <= wait <= full


def test_retry_after_is_honoured_but_bounded_by_the_total() -> None:
    policy = RetryPolicy(initial_wait=0.1, max_total=30, jitter=False)
    late = ProviderError("slow", retryable=True, kind="rate_limit", retry_after=7)
    assert policy.wait_seconds(1, late) == 7
    huge = ProviderError("slow", retryable=True, kind="rate_limit", retry_after=999)
    assert policy.wait_seconds(1, huge) == 30


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"max_attempts": 0}, "max_attempts"),
        ({"max_attempts": True}, "max_attempts"),
        ({"initial_wait": -1}, "initial_wait"),
        ({"max_wait": "5"}, "max_wait"),
        ({"max_total": -0.5}, "max_total"),
    ],
    ids=lambda v: str(v),
)
def test_bad_settings_name_their_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError) as caught:
        RetryPolicy(**kwargs)  # type: ignore[arg-type]
    assert caught.value.field == field


@pytest.mark.anyio
async def test_the_driver_backs_off_exponentially_across_attempts() -> None:
    import anyio

    from turnfsm.driver import Driver
    from turnfsm.testing import FakeModelClient

    stamps: list[float] = []
    rate = ProviderError("slow", retryable=True, kind="rate_limit")

    def handler(request: ModelRequest) -> ModelResponse | str:
        stamps.append(anyio.current_time())
        if len(stamps) < 4:
            raise rate
        return "ok"

    policy = RetryPolicy(max_attempts=4, initial_wait=0.02, jitter=False)
    result = await Driver(model=FakeModelClient(handler), retry=policy).run("x")
    assert result.text == "ok"
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    assert gaps[0] >= 0.02
    assert gaps[1] >= 0.04
    assert gaps[2] >= 0.08


def _failing(*errors: BaseException) -> tuple[list[int], FakeModelClient]:
    calls: list[int] = []

    def handler(request: ModelRequest) -> ModelResponse:
        calls.append(len(calls) + 1)
        raise errors[min(len(calls), len(errors)) - 1]

    return calls, FakeModelClient(handler)


_BUSY: Final = ProviderError(
    "HTTP 503: busy", retryable=True, kind="server", status=503
)


async def _run_failing(
    policy: RetryPolicy, *errors: BaseException
) -> tuple[list[int], RunResult]:
    """A run of a model that raises `errors` in turn: its calls and its result."""
    from turnfsm.driver import Driver

    calls, model = _failing(*errors)
    return calls, await Driver(model=model, retry=policy).run("x")


@pytest.mark.anyio
@pytest.mark.parametrize("later", [False, True], ids=["first", "later"])
async def test_a_retry_after_past_the_budget_ends_the_call_at_once(later: bool) -> None:
    slow = ProviderError(
        "HTTP 429: slow down", retryable=True, kind="rate_limit", retry_after=600
    )
    policy = RetryPolicy(max_attempts=5, initial_wait=0.01, max_total=60)
    calls, result = await _run_failing(policy, *((_BUSY, slow) if later else (slow,)))
    assert calls == ([1, 2] if later else [1])  # no call before the wait is up
    error = result.error
    assert isinstance(error, ProviderError)
    assert error.kind == "rate_limit"
    assert error.attempts == len(calls)
    assert "the provider asked to wait 600 s before trying again, more than the " in (
        str(error)
    )
    assert (
        "s left of the retry budget, RetryPolicy.max_total=60 s (raise it to wait)"
        in (str(error))
    )


@pytest.mark.parametrize(
    ("wait", "said"),
    [(600, "600 s"), (86.44659, "86.4 s"), (86_400, "86400 s"), (0.05, "0.05 s")],
)
def test_a_wait_past_the_budget_is_said_to_a_tenth_of_a_second(
    wait: float, said: str
) -> None:
    # A wait read from an HTTP date is no round number.
    text = RetryPolicy(max_total=60).past_budget("HTTP 429", wait, elapsed=60)
    assert text is not None
    assert f"the provider asked to wait {said} before trying again" in text


@pytest.mark.anyio
async def test_a_retry_after_within_the_budget_is_waited_for() -> None:
    slow = ProviderError("slow", retryable=True, kind="rate_limit", retry_after=0.01)
    policy = RetryPolicy(max_attempts=3, initial_wait=0.01, max_total=60)
    calls, result = await _run_failing(policy, slow)
    assert calls == [1, 2, 3]
    # Not past the budget; the error says the wait, for a caller to heed.
    assert "left of the retry budget" not in str(result.error)
    assert str(result.error).endswith(
        "; the provider asked to wait 0.01 s before trying again"
    )


@pytest.mark.anyio
async def test_a_run_that_gave_up_retrying_says_how_often_it_tried() -> None:
    policy = RetryPolicy(max_attempts=3, initial_wait=0.01, jitter=False)
    _, result = await _run_failing(policy, _BUSY)
    error = result.error
    assert isinstance(error, ProviderError)
    assert (error.attempts, error.message) == (3, "HTTP 503: busy")
    assert error.elapsed is not None
    assert error.elapsed >= 0.02  # the two waits between the three tries
    assert str(error) == (
        f"model provider error [server]: HTTP 503: busy; tried 3 times over "
        f"{error.elapsed:.1f} s, failing each time (errors of this kind are "
        "retried, as far as the RetryPolicy allows)"
    )


@pytest.mark.anyio
async def test_a_timeout_with_retries_off_says_it_was_tried_once() -> None:
    policy = RetryPolicy(max_attempts=1)
    timed_out = TimeoutError("model 'm' timed out after 5s")
    _, result = await _run_failing(policy, timed_out)
    assert str(result.error) == (
        "model provider error [timeout]: model 'm' timed out after 5s; tried "
        "once (errors of this kind are retried, as far as the RetryPolicy allows)"
    )


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("raised", "kind"),
    [
        (TimeoutError("read timed out"), "timeout"),
        (TimeoutError(), "timeout"),
        (ConnectionResetError("reset by peer"), "connection"),
        (ConnectionError("refused"), "connection"),
    ],
    ids=["timeout", "bare timeout", "reset", "connection"],
)
async def test_a_client_s_timeout_or_lost_connection_has_the_shipped_clients_kind(
    raised: BaseException, kind: str
) -> None:
    # The kind was the exception's class name (TimeoutError,
    # ConnectionResetError) where the shipped clients say timeout and
    # connection: one failure, two kinds to test for.
    _, result = await _run_failing(RetryPolicy(max_attempts=1), raised)
    error = result.error
    assert isinstance(error, ProviderError)
    assert (error.kind, error.retryable, error.status) == (kind, True, None)
    assert error.message == (str(raised) or type(raised).__name__)


@pytest.mark.anyio
@pytest.mark.parametrize(
    "policy",
    [
        RetryPolicy(max_attempts=1),
        RetryPolicy(max_attempts=2, initial_wait=0.01, max_total=60),
        RetryPolicy(max_attempts=3, initial_wait=0.01, max_total=1),
    ],
    ids=["retries off", "retries spent", "past the budget"],
)
async def test_a_run_that_gave_up_keeps_the_wait_the_provider_asked_for(
    policy: RetryPolicy,
) -> None:
    # The log's model failure kept it, but the run's error said None.
    slow = ProviderError(
        "HTTP 429: slow down",
        retryable=True,
        kind="rate_limit",
        retry_after=0.05 if policy.max_total > 1 else 7,
        status=429,
    )
    from turnfsm.driver import Driver
    from turnfsm.persistence import Session

    _, model = _failing(slow)
    session = Session()
    result = await Driver(model=model, retry=policy).run("x", session=session)
    error = result.error
    assert isinstance(error, ProviderError)
    assert error.retry_after == slow.retry_after
    stored = session.runs[0].error
    assert isinstance(stored, ProviderError)
    assert attrs.asdict(stored) == attrs.asdict(error)


def test_a_permanent_error_says_nothing_of_retries() -> None:
    error = ProviderError("HTTP 401: bad key", kind="auth", attempts=1, elapsed=0.2)
    assert str(error) == "model provider error [auth]: HTTP 401: bad key"


@pytest.mark.anyio
async def test_the_backoff_never_sleeps_past_the_budget() -> None:
    # A wait that would end past max_total is not begun: the call gives up
    # then, instead of sleeping over the budget and calling once more.
    policy = RetryPolicy(
        max_attempts=10, initial_wait=1.0, max_wait=1.0, max_total=1.5, jitter=False
    )

    calls, result = await _run_failing(policy, _BUSY)

    assert calls == [1, 2]  # at 0 s and 1 s; a third would start at 2 s
    error = result.error
    assert isinstance(error, ProviderError)
    assert error.attempts == 2


@pytest.mark.anyio
async def test_a_first_backoff_past_the_budget_is_not_begun() -> None:
    policy = RetryPolicy(initial_wait=0.6, max_total=0.5, jitter=False)

    calls, result = await _run_failing(policy, _BUSY)

    assert calls == [1]
    assert isinstance(result.error, ProviderError)


@pytest.mark.parametrize(
    ("elapsed", "wait", "allowed"),
    [(0.0, 9.9, True), (5.0, 4.9, True), (5.0, 5.0, False), (11.0, 0.0, False)],
)
def test_a_wait_is_allowed_only_if_it_ends_within_the_budget(
    elapsed: float, wait: float, allowed: bool
) -> None:
    policy = RetryPolicy(max_total=10)
    assert policy.allows_wait(wait, elapsed=elapsed) is allowed


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("fields", "named", "expected"),
    [
        ({"retry_after": -5}, "retry_after=-5", "a finite number >= 0, or None"),
        (
            {"retry_after": float("nan")},
            "retry_after=nan",
            "a finite number >= 0, or None",
        ),
        ({"retry_after": "10"}, "retry_after='10'", "a finite number >= 0, or None"),
        ({"status": "503"}, "status='503'", "an int >= 0, or None"),
        ({"kind": None}, "kind=None", "a string"),
        ({"message": None}, "message=None", "a string"),
        ({"retryable": "yes"}, "retryable='yes'", "True or False"),
    ],
    ids=[
        "negative-wait",
        "nan-wait",
        "text-wait",
        "text-status",
        "no-kind",
        "no-message",
        "text-flag",
    ],
)
async def test_a_provider_error_the_run_cannot_read_fails_it_naming_the_field(
    fields: dict[str, object], named: str, expected: str
) -> None:
    from turnfsm.driver import Driver
    from turnfsm.errors import InvalidReturn

    calls = 0
    error_fields = {"message": "slow down", "retryable": True, **fields}

    def handler(request: ModelRequest) -> ModelResponse:
        nonlocal calls
        calls += 1
        raise ProviderError(**error_fields)  # type: ignore[arg-type]

    policy = RetryPolicy(max_attempts=3, initial_wait=0.01, jitter=False)
    result = await Driver(model=FakeModelClient(handler), retry=policy).run("x")

    assert isinstance(result.error, InvalidReturn)
    assert result.error.source == "model FakeModelClient"
    assert result.error.value == f"ProviderError with {named}"
    field = named.split("=")[0]
    assert result.error.expected == f"its {field} to be {expected}"
    assert calls == 1  # a client's bug is not retried


def test_a_message_ending_in_a_full_stop_is_not_followed_by_a_semicolon() -> None:
    # "Connection error." is how the OpenAI SDK words an unreachable server.
    error = ProviderError(
        "could not reach the server: Connection error.",
        retryable=True,
        kind="connection",
        attempts=2,
    )
    assert str(error).startswith(
        "model provider error [connection]: could not reach the server: "
        "Connection error; tried 2 times, failing each time"
    )
    # An ellipsis stays as it is.
    clipped = attrs.evolve(error, message="the reply was cut...")
    assert "cut...; tried 2 times" in str(clipped)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("tool_timeout", 1e14),
        ("model_timeout", 1e10),
        ("lease_ttl", 1e12),
        ("initial_wait", 1e14),
        ("max_total", 1e10),
    ],
)
def test_a_time_past_any_duration_is_refused_naming_it(name: str, value: float) -> None:
    # In-process they ran; a durable run overflowed Temporal's durations.
    from turnfsm.driver import Driver

    def build() -> object:
        if name in ("initial_wait", "max_total"):
            return RetryPolicy(**{name: value})
        return Driver(model=FakeModelClient(lambda r: "ok"), **{name: value})

    with pytest.raises(ConfigError, match="about 31 years") as refused:
        build()
    assert refused.value.field == name
