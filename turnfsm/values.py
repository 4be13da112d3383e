"""Values shared by the brain and the ports: token usage and error descriptions.

`Usage` is what a provider reports for one model call; `ErrorInfo` is an
outside failure translated once, at the effect that met it, into a value the
brain, the log and the trace carry unchanged. Both are plain frozen values, so
a provider can build them without importing the brain (`turnfsm.core`).

This module imports only the standard library, `attrs` and turnfsm's shared
validators, so every module, the brain included, may import it.
"""

from __future__ import annotations

from typing import final

import attrs

from turnfsm import _checks

__all__ = ["ErrorInfo", "Usage"]


def _retry_after_of(exc: BaseException) -> float | None:
    value = getattr(exc, "retry_after", None)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


@final
@attrs.frozen(kw_only=True)
class ErrorInfo:
    """An outside failure, translated once at the effect that met it.

    Attributes:
        type: what failed (an exception class name or a provider's error kind).
        message: the failure's own message.
        retryable: whether trying again could succeed.
        status: the HTTP status, when the failure came with one.
        retry_after: the seconds the provider asked to wait, when it said.
    """

    type: str = attrs.field(validator=_checks.string())
    message: str = attrs.field(validator=_checks.string())
    retryable: bool = attrs.field(default=False, validator=_checks.boolean())
    status: int | None = attrs.field(
        default=None, validator=_checks.integer(low=0, optional=True)
    )
    retry_after: float | None = attrs.field(
        default=None, validator=_checks.number(low=0, optional=True)
    )

    @classmethod
    def from_exception(
        cls, exc: BaseException, *, retryable: bool = False
    ) -> ErrorInfo:
        """Describe `exc` by its class name and message.

        A `retry_after` the exception carries (as `ProviderError` does) is kept.
        """
        return cls(
            type=type(exc).__name__,
            message=str(exc),
            retryable=retryable,
            retry_after=_retry_after_of(exc),
        )


@final
@attrs.frozen(kw_only=True)
class Usage:
    """Provider-reported token usage of one model call."""

    input_tokens: int = attrs.field(default=0, validator=_checks.integer(low=0))
    output_tokens: int = attrs.field(default=0, validator=_checks.integer(low=0))

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
        )
