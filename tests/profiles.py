"""The hypothesis profiles, and how they size the long tests.

Two profiles, picked with ``HYPOTHESIS_PROFILE``:

- ``ci`` (the default, what ``.ci/run`` uses): thorough. Every property
  runs the examples its test asks for (10,000 for the heavy ones, 100
  when it asks for none), and the crash tests spend their full kill budgets.
- ``dev`` (local iteration): quick. A property runs at most `DEV_EXAMPLES`
  examples, and the crash tests kill a few workers, not a hundred.

A count written in a test is its CI count and goes through `sized`: a test's
own ``@settings(max_examples=...)`` overrides the profile, so a bare number
would run in full under ``dev`` too.

`heavy` marks a property that runs long under ``ci``: ``slow`` (deselect it
with ``-m "not slow"``), no whole-test clock (pytest-timeout fired in the
middle of a 10,000-example run on a busy machine, and hypothesis reported the
interrupted example as flaky), and a watchdog on each example instead.
"""

from __future__ import annotations

import functools
import inspect
import os
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, settings

PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")
"""The profile `tests/conftest.py` loads."""

DEV_EXAMPLES = 20
"""The examples a property runs at most under the ``dev`` profile."""

EXAMPLE_SECONDS = 30.0
"""How long one example of a heavy property may run before it fails as hung.

Their examples take milliseconds; the margin is for a machine busy with
other work. A hang fails the test in minutes, not never: hypothesis then
shrinks, and each attempt that hangs again costs this long (it stops
shrinking after about five minutes).
"""

settings.register_profile(
    "ci", deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "dev",
    max_examples=DEV_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

T = TypeVar("T")


def load() -> None:
    """Load the profile ``HYPOTHESIS_PROFILE`` names (``ci`` by default)."""
    settings.load_profile(PROFILE)


def sized(ci: int, *, dev: int | None = None) -> int:
    """Return `ci` under the ``ci`` profile, else `dev` (at most `ci`).

    `dev` defaults to the loaded profile's ``max_examples``.
    """
    if PROFILE == "ci":
        return ci
    return min(ci, settings().max_examples if dev is None else dev)


class ExampleHung(Exception):
    """An example of a heavy property ran longer than `EXAMPLE_SECONDS`."""


@contextmanager
def watchdog(seconds: float) -> Iterator[None]:
    """Raise `ExampleHung` in the block if it runs longer than `seconds`.

    A real-time alarm (SIGALRM), so it interrupts a blocked or looping test
    in the main thread, the one pytest runs tests in; hypothesis' ``deadline``
    only judges an example once it has returned.
    """

    def expire(_signum: int, _frame: FrameType | None) -> None:
        raise ExampleHung(f"the example ran longer than {seconds} s: a hang?")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def heavy(ci_examples: int, **options: Any) -> Callable[[T], T]:
    """Mark a long property: sized, ``slow``, no whole-test clock, each example guarded.

    Goes above ``@given`` and takes the place of the test's ``@settings``:
    `options` are further settings. The test runs ``sized(ci_examples)``
    examples, pytest-timeout does not apply to it (``timeout(0)``), and each
    example fails with `ExampleHung` after `EXAMPLE_SECONDS`.
    """
    suppress = [HealthCheck.too_slow, *options.pop("suppress_health_check", ())]

    def decorate(test: T) -> T:
        handle = getattr(test, "hypothesis", None)
        if handle is None:
            raise TypeError(f"@heavy goes above @given ({test!r})")
        inner = handle.inner_test
        if inspect.iscoroutinefunction(inner):
            raise TypeError(f"@heavy guards sync examples only ({test!r})")

        @functools.wraps(inner)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            with watchdog(EXAMPLE_SECONDS):
                return inner(*args, **kwargs)

        handle.inner_test = guarded
        sized_test = settings(
            max_examples=sized(ci_examples),
            deadline=None,
            suppress_health_check=suppress,
            **options,
        )(test)
        return pytest.mark.slow(pytest.mark.timeout(0)(sized_test))

    return decorate
