"""What spans record: messages and tool arguments as JSON, usage, error statuses."""

from __future__ import annotations

import json
import traceback
from collections.abc import Mapping
from typing import Any, Final

from opentelemetry.trace import Span, Status, StatusCode

from turnfsm.errors import CONTENT_FILTER, OutputInvalid, ProviderError
from turnfsm.tracing import attributes as A
from turnfsm.values import Usage

__all__ = [
    "NAME_CHARS",
    "STATUS_CHARS",
    "cut",
    "error_status",
    "messages_json",
    "record_without_text",
    "to_json",
    "total_attributes",
    "usage_attributes",
    "without_content",
]

NAME_CHARS: Final = 128
"""The most characters of a name a span's name holds (a tool's, as called).

A span's name has no length limit of its own, and a model may call a tool
of any name.
"""

STATUS_CHARS: Final = 1_000
"""The most characters a span's status description keeps.

A status has no length limit of its own (the attribute limits do not reach
it): an error that quotes a whole page would make its span megabytes.
"""


def messages_json(messages: Any) -> str:
    return to_json([m.to_dict() for m in messages])


def to_json(value: object) -> str:
    if isinstance(value, Mapping):
        value = dict(value)
    return json.dumps(value, default=str, ensure_ascii=False)


def usage_attributes(usage: Usage) -> dict[str, int]:
    """A usage's span attributes: the cache's counts only when it has some."""
    said = {
        A.USAGE_INPUT_TOKENS: usage.input_tokens,
        A.USAGE_OUTPUT_TOKENS: usage.output_tokens,
    }
    if usage.cache_read_tokens:
        said[A.USAGE_CACHE_READ_TOKENS] = usage.cache_read_tokens
    if usage.cache_write_tokens:
        said[A.USAGE_CACHE_WRITE_TOKENS] = usage.cache_write_tokens
    return said


def total_attributes(usage: Usage) -> dict[str, int]:
    """What the model calls under a span reported, summed: its ``turnfsm.usage.*``.

    A run's, a turn's or a compaction pass's span says it under these keys,
    not ``gen_ai.usage.*`` (which only each call's ``chat`` span carries), so
    that summing ``gen_ai.usage.*`` over a trace counts every call once.
    """
    said = usage_attributes(usage)
    return {_TOTALS[key]: value for key, value in said.items()}


_TOTALS: Final = {
    A.USAGE_INPUT_TOKENS: A.TOTAL_INPUT_TOKENS,
    A.USAGE_OUTPUT_TOKENS: A.TOTAL_OUTPUT_TOKENS,
    A.USAGE_CACHE_READ_TOKENS: A.TOTAL_CACHE_READ_TOKENS,
    A.USAGE_CACHE_WRITE_TOKENS: A.TOTAL_CACHE_WRITE_TOKENS,
}


def error_status(text: str | None) -> Status:
    """An ERROR status described by `text`, cut to `STATUS_CHARS` characters."""
    return Status(StatusCode.ERROR, None if text is None else cut(text, STATUS_CHARS))


def cut(text: str, limit: int) -> str:
    """`text`, or its first characters and ``...`` when longer than `limit`."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def record_without_text(span: Span, raised: BaseException, message: str = "") -> None:
    """Record `raised` on `span` as an ``exception`` event, its text left out.

    Its type and traceback, with `message` for its message: the exception's
    own text may quote what was said (a tool's arguments, a model's answer).
    """
    trace = "".join(traceback.format_tb(raised.__traceback__))
    module, name = type(raised).__module__, type(raised).__qualname__
    qualified = name if module == "builtins" else f"{module}.{name}"  # as Python
    span.record_exception(
        raised,
        attributes={
            A.EXCEPTION_MESSAGE: message,
            "exception.stacktrace": (
                f"Traceback (most recent call last):\n{trace}{qualified}\n"
            ),
        },
    )


_QUOTING: Final = ("OutputInvalid: ", f"[{CONTENT_FILTER}]: ")
"""Where a failure passed up (a sub-agent's, an effect's) starts quoting words."""


def without_content(error: BaseException) -> str | None:
    """What a failure says without the conversation's words, or None.

    Most errors name settings, limits and types. Two quote what the model
    said: an answer that did not fit the output type (its values), and a
    reply a filter withheld (its text); so does a failure that passes one
    of theirs up (a sub-agent's, an effect's). Without content capture,
    spans say what happened and leave the words out.
    """
    if isinstance(error, OutputInvalid):
        return (
            f"the final answer did not fit the output type after {error.retries} "
            f"re-ask(s): {len(error.errors)} problem(s), which quote the answer"
            " (recorded with message content captured)"
        )
    if isinstance(error, ProviderError) and error.kind == CONTENT_FILTER:
        return (
            f"model provider error [{CONTENT_FILTER}]: the provider withheld the"
            " answer (its words are recorded with message content captured)"
        )
    text = str(error)
    for marker in _QUOTING:
        at = text.find(marker)
        if at >= 0:
            return (
                text[: at + len(marker)]
                + "(words of the answer, recorded with message content captured)"
            )
    return None
