"""Values shared by the brain and the ports: token usage, error descriptions, payback.

`Usage` is what a provider reports for one model call; `ErrorInfo` is an
outside failure translated once, at the effect that met it, into a value the
brain, the log and the trace carry unchanged. Both are plain frozen values, so
a provider can build them without importing the brain (`turnfsm.core`).
`PassPayback` is what a compaction pass costs against what it saves, by the
prompt cache: the context manager works it out, the pass's event carries it,
and the log, the trace and `turnfsm simulate` report it.

This module imports only the standard library, `attrs`, turnfsm's shared
validators and its errors, so every module, the brain included, may import it.
"""

from __future__ import annotations

from typing import Final, final

import attrs

from turnfsm import _checks
from turnfsm.errors import ConfigError

__all__ = ["ErrorInfo", "PassPayback", "Usage"]


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
        attempts: how many times the call was made before the run gave up
            (None: not counted).
        elapsed: seconds from the first attempt to the last one's failure
            (None: not counted).
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
    attempts: int | None = attrs.field(
        default=None, validator=_checks.integer(low=0, optional=True)
    )
    elapsed: float | None = attrs.field(
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
            message=_checks.message_of(exc),
            retryable=retryable,
            retry_after=_retry_after_of(exc),
        )


OMITTED_IF_DEFAULT: Final = "turnfsm.omitted_if_default"
"""A field's metadata: its stored form leaves the field out while it has its default.

So a field added to an event keeps the stored form of the events that do
not use it (`Signal.message`).
"""
_TOKENS = _checks.integer(low=0)


@final
@attrs.frozen(kw_only=True)
class Usage:
    """Provider-reported token usage of one model call.

    Attributes:
        input_tokens: Every input token of the request, those a prompt
            cache served or stored included: what the request weighed
            against the context window.
        output_tokens: The tokens of the reply.
        cache_read_tokens: Of `input_tokens`, those read from the
            provider's prompt cache (Anthropic's
            ``cache_read_input_tokens``, OpenAI's ``cached_tokens``),
            billed at the cached price.
        cache_write_tokens: Of `input_tokens`, those written to the
            prompt cache (Anthropic's ``cache_creation_input_tokens``),
            billed at the cache-write price.
    """

    input_tokens: int = attrs.field(default=0, validator=_checks.integer(low=0))
    output_tokens: int = attrs.field(default=0, validator=_checks.integer(low=0))
    # Left out of the log while 0: a usage with nothing cached keeps
    # the form logs written before these counts have.
    cache_read_tokens: int = attrs.field(
        default=0, validator=_TOKENS, metadata={OMITTED_IF_DEFAULT: True}
    )
    cache_write_tokens: int = attrs.field(
        default=0, validator=_TOKENS, metadata={OMITTED_IF_DEFAULT: True}
    )

    def __attrs_post_init__(self) -> None:
        cached = self.cache_read_tokens + self.cache_write_tokens
        if cached > self.input_tokens:
            raise ConfigError(
                "cache_read_tokens + cache_write_tokens",
                cached,
                f"at most input_tokens ({self.input_tokens}): the cached "
                "tokens are a part of the input",
            )

    def __repr__(self) -> str:
        """The counts, the cached ones only when there are any (as the log)."""
        cached = "".join(
            f", {name}={count}"
            for name, count in (
                ("cache_read_tokens", self.cache_read_tokens),
                ("cache_write_tokens", self.cache_write_tokens),
            )
            if count
        )
        return (
            f"Usage(input_tokens={self.input_tokens}, "
            f"output_tokens={self.output_tokens}{cached})"
        )

    def __add__(self, other: object) -> Usage:
        if not isinstance(other, Usage):
            return NotImplemented
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cache_read_tokens=self.cache_read_tokens + other.cache_read_tokens,
            cache_write_tokens=self.cache_write_tokens + other.cache_write_tokens,
        )

    def describe(self) -> str:
        """The counts in words, as the CLI and the view print them.

        Example:
            ```python
            usage = Usage(input_tokens=1200, output_tokens=40, cache_read_tokens=1000)
            usage.describe()
            # '1200 in (1000 read from cache) / 40 out'
            ```
        """
        cached = [
            f"{count} {what}"
            for count, what in (
                (self.cache_read_tokens, "read from cache"),
                (self.cache_write_tokens, "written to cache"),
            )
            if count
        ]
        said = f" ({', '.join(cached)})" if cached else ""
        return f"{self.input_tokens} in{said} / {self.output_tokens} out"


_DOLLARS = _checks.number(optional=True)


@final
@attrs.frozen(kw_only=True)
class PassPayback:
    """What a compaction pass costs against what it saves, by the prompt cache.

    A pass that changes the conversation from one message on invalidates the
    provider's cache of everything from that message to the end (the system
    prompt and the tool schemas before it stay cached). The next call writes
    that part again at the cache-write price instead of reading it at the
    cached price: the pass's `cost`, with its summary calls. Every later call
    sends fewer tokens: the `saving` per call.

    Attributes:
        invalidated_tokens: The tokens whose cache the pass invalidates:
            from the first message it changed to the end of the request.
        rewritten_tokens: The tokens the next call writes to the cache
            again: from that message to the end, after the pass.
        removed_tokens: The tokens the pass removed from the request.
        cost: The pass's one-time cost in US dollars: the rewritten tokens
            at the write price rather than the cached price, plus its
            summary calls (None: no prices known).
        saving: What every later call saves in US dollars: the removed
            tokens at the price they were paid (None: no prices known).
        payback_calls: The calls after which the saving has covered the
            cost (0: at once); None: never (nothing saved), or no prices.
        declined: Whether the context manager declined the pass because it
            would not pay back soon enough (nothing was changed).
        note: The decline's reason in words ("" when not declined).
    """

    invalidated_tokens: int = attrs.field(validator=_TOKENS)
    rewritten_tokens: int = attrs.field(validator=_TOKENS)
    removed_tokens: int = attrs.field(validator=_TOKENS)
    cost: float | None = attrs.field(default=None, validator=_DOLLARS)
    saving: float | None = attrs.field(default=None, validator=_DOLLARS)
    payback_calls: int | None = attrs.field(
        default=None, validator=_checks.integer(low=0, optional=True)
    )
    declined: bool = attrs.field(default=False, validator=_checks.boolean())
    note: str = attrs.field(default="", validator=_checks.string())

    @property
    def priced(self) -> bool:
        """Whether the figures include costs (prices were known)."""
        return self.cost is not None and self.saving is not None

    def describe(self) -> str:
        """The figures in words, as reports print them.

        Example:
            ```python
            PassPayback(
                invalidated_tokens=900, rewritten_tokens=300, removed_tokens=600,
                cost=0.001035, saving=0.00018, payback_calls=6,
            ).describe()
            # 'invalidates 900 cached tokens, costs $0.001035,
            #  saves $0.000180 a call, pays back after 6 calls'
            ```
        """
        text = f"invalidates {self.invalidated_tokens} cached tokens"
        if self.cost is not None and self.saving is not None:
            text += f", costs ${self.cost:.6f}, saves ${self.saving:.6f} a call"
            if self.payback_calls is None:
                text += ", never pays back"
            else:
                calls = self.payback_calls
                text += f", pays back after {calls} call{'' if calls == 1 else 's'}"
        if self.note:
            text += f"; {self.note}"
        return text
