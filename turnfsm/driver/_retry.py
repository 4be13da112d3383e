"""The retry policy for transient model errors (tenacity, on anyio's clock)."""

from __future__ import annotations

import random
from typing import Any, final

import anyio
import attrs
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
    stop_before_delay,
)

from turnfsm import _checks
from turnfsm._waits import waited_for
from turnfsm.errors import ProviderError

__all__ = ["RetryPolicy", "is_transient"]


def is_transient(exc: BaseException) -> bool:
    """Whether `exc` is worth retrying: a retryable ProviderError, a timeout, a reset.

    A context overflow is never transient: retrying the same request cannot help.
    Nor is an error that crashes the run (``is_crash``: a strict hook's).
    """
    if getattr(exc, "is_crash", False):
        return False
    if isinstance(exc, ProviderError):
        return exc.retryable and not exc.is_context_overflow
    return isinstance(exc, TimeoutError | ConnectionError)


def _positive(name: str) -> Any:
    return _checks.seconds(name, optional=False, low=0)


@final
@_checks.keyword_checked
@attrs.frozen(kw_only=True)
class RetryPolicy:
    """Jittered exponential backoff, bounded in attempts and total time.

    A provider's Retry-After (`ProviderError.retry_after`) is honoured: the
    wait is at least that long. When it is longer than what is left of
    `max_total`, the call is not retried: the provider's error ends it at
    once, saying how long the provider asked to wait. Context overflow is
    never retried.

    Attributes:
        max_attempts: calls in all, the first included (1 disables retries;
            at most 1,000,000).
        initial_wait: the first backoff, in seconds.
        max_wait: the longest single wait, in seconds.
        max_total: the seconds retrying may take, from the first attempt:
            a wait that would end past it is not begun, and the call gives
            up with its last error instead.
        jitter: randomise each wait in [wait/2, wait].
    """

    max_attempts: int = attrs.field(
        default=4,
        validator=_checks.integer("max_attempts", low=1, high=_checks.MAX_COUNT),
    )
    initial_wait: float = attrs.field(default=0.5, validator=_positive("initial_wait"))
    max_wait: float = attrs.field(default=30.0, validator=_positive("max_wait"))
    max_total: float = attrs.field(default=120.0, validator=_positive("max_total"))
    jitter: bool = attrs.field(default=True, validator=_checks.boolean("jitter"))

    def backoff(self, attempt: int) -> float:
        """Return the longest own wait after attempt number `attempt` (1-based).

        `initial_wait` doubled after each attempt, at most `max_wait`: also
        the wait of a durable run's retries (Temporal's, which do not jitter).
        """
        return min(self.max_wait, self.initial_wait * 2.0 ** (attempt - 1))

    def wait_seconds(self, attempt: int, exc: BaseException | None) -> float:
        """Return the wait before retry number `attempt` (1-based) after `exc`."""
        wait = self.backoff(attempt)
        if self.jitter:
            wait = random.uniform(wait / 2, wait)
        retry_after: float | None = (
            exc.retry_after if isinstance(exc, ProviderError) else None
        )
        if retry_after is not None:
            wait = max(wait, min(retry_after, self.max_total))
        return wait

    def allows_wait(self, wait: float, *, elapsed: float) -> bool:
        """Whether a wait of `wait` s, `elapsed` s in, ends within `max_total`.

        The rule every retry keeps, in-process and durable: no wait that
        ends past the budget is begun (tenacity's ``stop_before_delay``).
        """
        return elapsed + wait < self.max_total

    def check_budget(self, exc: BaseException, *, elapsed: float) -> None:
        """Refuse to wait past `max_total` for a provider's Retry-After.

        Args:
            exc: The error the retry would answer.
            elapsed: Seconds already spent, counted against `max_total`.

        Raises:
            ProviderError: `exc`'s `retry_after` is longer than what is left
                of `max_total`; the message says both (`exc` is its cause).
        """
        if not isinstance(exc, ProviderError) or exc.retry_after is None:
            return
        said = self.past_budget(exc.message, exc.retry_after, elapsed=elapsed)
        if said is not None:
            raise attrs.evolve(exc, message=said) from exc

    def past_budget(
        self, message: str, retry_after: float, *, elapsed: float
    ) -> str | None:
        """`message` saying the wait asked for is past the budget; None if not.

        Args:
            message: The provider's error.
            retry_after: The seconds it asked to wait.
            elapsed: Seconds already spent, counted against `max_total`.
        """
        left = max(0.0, self.max_total - elapsed)
        if retry_after <= left:
            return None
        return (
            f"{message}; {waited_for(retry_after)}, more than the {left:.1f} s "
            "left of the retry budget, "
            f"RetryPolicy.max_total={self.max_total:g} s (raise it to wait)"
        )

    def retrying(self, *, done: int = 0, elapsed: float = 0.0) -> AsyncRetrying:
        """Return a tenacity controller that sleeps on anyio (asyncio or trio).

        Args:
            done: attempts already made (and failed) before this controller;
                the backoff continues from there instead of starting over.
            elapsed: seconds already spent, counted against `max_total`.
        """

        def wait(state: RetryCallState) -> float:
            exc = state.outcome.exception() if state.outcome is not None else None
            if exc is not None and state.attempt_number + done < self.max_attempts:
                spent = state.seconds_since_start or 0.0
                self.check_budget(exc, elapsed=elapsed + spent)
            return self.wait_seconds(state.attempt_number + done, exc)

        return AsyncRetrying(
            stop=stop_after_attempt(max(1, self.max_attempts - done))
            | stop_before_delay(max(0.0, self.max_total - elapsed)),
            wait=wait,
            retry=retry_if_exception(is_transient),
            sleep=anyio.sleep,
            reraise=True,
        )
