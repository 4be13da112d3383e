from __future__ import annotations

from datetime import UTC, datetime

import pytest

from turnfsm.errors import CONTEXT_OVERFLOW
from turnfsm.providers._errors import from_status, mentions_overflow, parse_retry_after

NOW = datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC)

RETRY_AFTER = {
    "seconds": ({"retry-after": "3"}, 3.0),
    "fraction": ({"retry-after": " 1.5 "}, 1.5),
    "milliseconds win": ({"retry-after-ms": "250", "retry-after": "9"}, 0.25),
    "http date": ({"retry-after": "Wed, 01 Jan 2025 12:00:30 GMT"}, 30.0),
    "date in the past": ({"retry-after": "Wed, 01 Jan 2025 11:00:00 GMT"}, 0.0),
    "garbage": ({"retry-after": "soon"}, None),
    "negative": ({"retry-after": "-1"}, None),
    "infinite": ({"retry-after": "inf"}, None),
    "absent": ({}, None),
}


@pytest.mark.parametrize(
    ("headers", "expected"), RETRY_AFTER.values(), ids=RETRY_AFTER.keys()
)
def test_parse_retry_after(headers: dict[str, str], expected: float | None) -> None:
    assert parse_retry_after(headers, now=NOW) == expected


def test_no_headers_no_wait() -> None:
    assert parse_retry_after(None) is None


@pytest.mark.parametrize(
    "text",
    [
        "This model's maximum context length is 1024 tokens.",
        "prompt is too long: 208310 tokens > 200000 maximum",
        "the request exceeds the available context size, try increasing it",
        "input length and `max_tokens` exceed context limit: 1 + 2 > 3",
        "Error code: context_length_exceeded",
        "The decoder prompt (length 12324) is longer than the maximum model "
        "length of 8192. Make sure that `max_model_len` is no smaller than the "
        "number of text tokens.",  # vLLM
        "The input token count (1300000) exceeds the maximum number of tokens "
        "allowed (1048575).",  # Gemini
        "Your input exceeds the context window of this model. Please adjust "
        "your input and try again.",  # OpenAI's Responses wording
        "This model's maximum prompt length is 131072 but the request contains "
        "537812 tokens.",  # xAI
    ],
)
def test_overflow_texts_are_recognised(text: str) -> None:
    assert mentions_overflow(None, text)


def test_other_texts_are_not_overflow() -> None:
    assert not mentions_overflow("Invalid value for 'temperature'", None, "")


def test_overflow_wins_over_the_status() -> None:
    error = from_status(500, "maximum context length", overflow=True, key_hint="k")
    assert (error.kind, error.retryable, error.status) == (CONTEXT_OVERFLOW, False, 500)


@pytest.mark.parametrize("status", [429, 500, 529, 408, 409])
def test_a_server_that_says_not_to_retry_is_not_retried(status: int) -> None:
    error = from_status(
        status, "busy", overflow=False, key_hint="", headers={"x-should-retry": "false"}
    )
    assert not error.retryable
    assert "x-should-retry: false" in error.message


def test_other_should_retry_values_leave_the_rule_as_it_is() -> None:
    for said in ("true", "no", ""):
        headers = {"x-should-retry": said}
        error = from_status(529, "busy", overflow=False, key_hint="", headers=headers)
        assert error.retryable
