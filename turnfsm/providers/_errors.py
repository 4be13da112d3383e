"""Shared rules for turning a model API's failure into a `ProviderError`.

Each provider module classifies its SDK's exceptions in one function and
leans on these helpers, so both providers agree on what is transient:

| failure                          | `kind`             | retryable |
|----------------------------------|--------------------|-----------|
| request longer than the context  | `CONTEXT_OVERFLOW` | no        |
| HTTP 429                         | ``rate_limit``     | yes       |
| HTTP 408, SDK timeout            | ``timeout``        | yes       |
| HTTP 409                         | ``conflict``       | yes       |
| HTTP 5xx (529 overloaded too)    | ``server``         | yes       |
| connection failure               | ``connection``     | yes       |
| HTTP 401, 403                    | ``auth``           | no        |
| any other 4xx                    | ``bad_request``    | no        |
| a reply body (or a streamed      | ``bad_response``   | no        |
| event) that is not JSON          |                    |           |
| a reply of the wrong shape       | ``bad_response``   | no        |
| a reply with nothing in it and   | ``bad_response``   | no        |
| no finish reason; a stream that  |                    |           |
| ended without one                |                    |           |
| a reply cut at the model's window| `CONTEXT_OVERFLOW` | no        |
| a refusal (Anthropic's stop      | `CONTENT_FILTER`   | no        |
| reason, OpenAI's ``refusal``)    |                    |           |

408 and 409 are retried because the SDKs' own retry policies retry them, and
turnfsm switches those off (`max_retries=0`) so its driver owns every retry;
as the SDKs do, it retries no response that says ``x-should-retry: false``.
"""

from __future__ import annotations

import email.utils
import html
import json
import logging
import math
import re
import uuid
from collections.abc import AsyncGenerator, AsyncIterable, Callable, Iterator, Mapping
from contextlib import aclosing, contextmanager
from datetime import UTC, datetime
from typing import Any, Final, TypeVar

import attrs
import pydantic

from turnfsm import _checks
from turnfsm.errors import CONTENT_FILTER, CONTEXT_OVERFLOW, ProviderError
from turnfsm.providers._sdk import until_done
from turnfsm.providers._stream import TextDelta

logger = logging.getLogger("turnfsm.providers")

__all__ = [
    "AUTH",
    "BAD_REQUEST",
    "BAD_RESPONSE",
    "CONFLICT",
    "CONNECTION",
    "CONTENT_FILTER",
    "NAMELESS_TOOL",
    "OVERFLOW_MARKERS",
    "QUOTA",
    "RATE_LIMIT",
    "SERVER",
    "TIMEOUT",
    "connection_error",
    "dropped",
    "from_status",
    "given_call_id",
    "json_data",
    "lost_connection",
    "mentions_overflow",
    "named_call",
    "named_server",
    "not_served",
    "page_text",
    "parse_retry_after",
    "reply_list",
    "reply_object",
    "reply_text",
    "reply_tokens",
    "request_url",
    "streamed_text",
    "timeout_error",
    "timeout_setting",
    "unreadable_body_error",
    "unreadable_field",
    "with_setting",
]

RATE_LIMIT: Final = "rate_limit"
"""`ProviderError.kind` of an HTTP 429: retryable, honours Retry-After."""
QUOTA: Final = "quota"
"""`ProviderError.kind` of an exhausted quota or balance: not retryable."""
TIMEOUT: Final = "timeout"
"""`ProviderError.kind` of a request that timed out: retryable."""
CONFLICT: Final = "conflict"
"""`ProviderError.kind` of an HTTP 409 (a lock timeout upstream): retryable."""
SERVER: Final = "server"
"""`ProviderError.kind` of an HTTP 5xx or an overloaded API: retryable."""
CONNECTION: Final = "connection"
"""`ProviderError.kind` of a failed connection: retryable."""
AUTH: Final = "auth"
"""`ProviderError.kind` of a rejected key (HTTP 401 or 403): not retryable."""
BAD_REQUEST: Final = "bad_request"
"""`ProviderError.kind` of any other HTTP 4xx: not retryable."""
BAD_RESPONSE: Final = "bad_response"
"""`ProviderError.kind` of a reply the SDK could not read: not retryable."""

OVERFLOW_MARKERS: Final = (
    "maximum context length",  # OpenAI, vLLM, llama-cpp-python
    "context_length_exceeded",
    "exceed_context_size",  # llama.cpp's own server (error type)
    "exceeds the available context size",  # llama.cpp's own server
    "prompt is too long",  # Anthropic
    "exceed context limit",  # Anthropic: input + max_tokens over the window
    "longer than the maximum model length",  # vLLM: "The decoder prompt ..."
    "exceeds the maximum number of tokens allowed",  # Gemini
    "exceeds the context window",  # OpenAI's Responses wording
    "maximum prompt length",  # xAI
)
"""Lower-case phrases that mark a context-length rejection in an error text."""


def mentions_overflow(*texts: str | None) -> bool:
    """Return whether any of `texts` reads like a context-length rejection."""
    return any(
        marker in text.lower() for text in texts if text for marker in OVERFLOW_MARKERS
    )


def parse_retry_after(
    headers: Mapping[str, str] | None, *, now: datetime | None = None
) -> float | None:
    """Return the wait a response asks for, in seconds, or None.

    Reads ``retry-after-ms`` (OpenAI) first, then ``retry-after`` as seconds
    or as an HTTP date. A date in the past gives 0; garbage gives None.

    Args:
        headers: the response headers (case-insensitive, as httpx gives them).
        now: the current time for an HTTP date (defaults to the clock).
    """
    if headers is None:
        return None
    millis = _number(headers.get("retry-after-ms"))
    if millis is not None:
        return millis / 1000
    value = headers.get("retry-after")
    if value is None:
        return None
    seconds = _number(value)
    if seconds is not None:
        return seconds
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    now = now if now is not None else datetime.now(UTC)
    return max(0.0, (when - now).total_seconds())


def _number(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        number = float(value.strip())
    except ValueError:
        return None
    if not math.isfinite(number) or number < 0:
        return None
    return number


def from_status(
    status: int,
    message: str,
    *,
    overflow: bool,
    key_hint: str,
    headers: Mapping[str, str] | None = None,
) -> ProviderError:
    """Classify an HTTP error status from a model API.

    Args:
        status: the HTTP status code.
        message: the provider's own error message.
        overflow: whether the provider said the request is too long (the
            caller's provider-specific rule decides).
        key_hint: how to fix a rejected key, e.g. ``"set OPENAI_API_KEY"``.
        headers: the response headers, for Retry-After.

    Returns:
        The `ProviderError` the driver acts on. A response that says
        ``x-should-retry: false`` (as the SDKs read it: a proxy that has
        retried already, a server that knows another try fails too) is
        not retried, whatever its status.
    """
    error = _by_status(status, message, overflow, key_hint, headers)
    said = headers.get("x-should-retry") if headers is not None else None
    if error.retryable and said == "false":
        return attrs.evolve(
            error,
            retryable=False,
            message=f"{error.message} (the server said not to retry: "
            "x-should-retry: false)",
        )
    return error


def _by_status(
    status: int,
    message: str,
    overflow: bool,
    key_hint: str,
    headers: Mapping[str, str] | None,
) -> ProviderError:
    text = f"HTTP {status}: {message}"
    if overflow:
        return ProviderError(text, kind=CONTEXT_OVERFLOW, status=status)
    if status == 429:
        wait = parse_retry_after(headers)
        return ProviderError(
            text, retryable=True, kind=RATE_LIMIT, retry_after=wait, status=status
        )
    if status == 408:
        return ProviderError(text, retryable=True, kind=TIMEOUT, status=status)
    if status == 409:
        return ProviderError(text, retryable=True, kind=CONFLICT, status=status)
    if status >= 500:
        wait = parse_retry_after(headers)
        return ProviderError(
            text, retryable=True, kind=SERVER, retry_after=wait, status=status
        )
    if status in (401, 403):
        return ProviderError(f"{text} - {key_hint}", kind=AUTH, status=status)
    return ProviderError(text, kind=BAD_REQUEST, status=status)


def timeout_error(message: str) -> ProviderError:
    """Return the retryable `ProviderError` for a request that timed out."""
    return ProviderError(message, retryable=True, kind=TIMEOUT)


def timeout_setting(model: str, timeout: float | None, *, client: object) -> str:
    """Name what bounds a model's requests: its ``timeout`` or a passed-in client's.

    Args:
        model: the model class's name, e.g. ``"OpenAIModel"``.
        timeout: its ``timeout`` setting.
        client: its ``client`` setting (None: the model builds its own).
    """
    if client is not None:
        return "the timeout of the client passed in (client=) bounds each request"
    if timeout is None:
        return f"{model}.timeout=None sets no limit of its own"
    return f"{model}.timeout={timeout:g} s per request; raise it to wait longer"


def with_setting(error: ProviderError, setting: str) -> ProviderError:
    """Return a client-side timeout `error` naming the `setting` that bounds it.

    Other errors (an HTTP 408 included: the server's own timeout) are
    returned as they are.
    """
    if error.kind != TIMEOUT or error.status is not None:
        return error
    return attrs.evolve(error, message=f"{error.message} - {setting}")


def named_server(url: Any, host: str, api: str) -> str:
    """Name what a request went to: `api` at its own `host`, else the server.

    A proxy or a compatible server is named by its URL, so that an error
    sends the user to it, not to the provider's status page.

    Args:
        url: the request's URL (an httpx URL), or None if not known.
        host: the provider's own host, e.g. ``"api.openai.com"``.
        api: its name there, e.g. ``"the OpenAI API"``.
    """
    if url is None or url.host == host:
        return api
    return f"the server at {url.scheme}://{url.netloc.decode()}"


def not_served(url: Any, usual: str) -> str:
    """Say that a 404 with no API error in it is a path the server lacks.

    A model the server does not have is a 404 too, but says so in an API
    error; a bare 404 (a web page, FastAPI's ``{"detail": "Not Found"}``)
    is a base URL with a path too few or too many.

    Args:
        url: the request's URL (an httpx URL), or None if not known.
        usual: what such a server's base URL usually is, with an example.
    """
    at = f" at {url.copy_with(query=None)}" if url is not None else ""
    return f"nothing is served{at}: check the base URL ({usual})"


def request_url(exc: BaseException) -> Any:
    """The URL an SDK error's request went to; None for an error without one."""
    try:
        return exc.request.url  # type: ignore[attr-defined]
    except (AttributeError, RuntimeError):  # an error built without a request
        return None


def connection_error(message: str) -> ProviderError:
    """Return the retryable `ProviderError` for a connection that failed."""
    return ProviderError(message, retryable=True, kind=CONNECTION)


def lost_connection(exc: BaseException, where: str) -> ProviderError:
    """Return the retryable `ProviderError` for an SDK's connection error.

    Only a connection that could not be opened (the HTTP library's
    ``ConnectError``) "could not reach" `where`; one lost after it was open
    (a reset, a body cut short) broke off: the server was reached, and
    "could not reach" would send the user looking at the URL. Either way
    the message says how, in the HTTP library's words (`dropped`).
    """
    cause = exc.__cause__
    opening = cause is None or any(
        kind.__name__ == "ConnectError" for kind in type(cause).__mro__
    )
    if opening:
        return connection_error(f"could not reach {where}: {dropped(exc)}")
    return connection_error(f"the connection to {where} broke off: {dropped(exc)}")


def dropped(exc: BaseException) -> str:
    """What an SDK's connection error says went wrong: its cause's words.

    The SDKs say only "Connection error."; the HTTP library under them says
    how the connection ended ("peer closed connection without sending
    complete message body").
    """
    cause = str(exc.__cause__ or "").strip()
    return cause or str(exc)


@contextmanager
def broken_off(
    where: str,
    timeout: type[BaseException],
    connection: type[BaseException],
    *,
    whole: Callable[[], bool] = lambda: False,
    sent: type[BaseException] | tuple[()] = (),
    classify: Callable[[Any], ProviderError] | None = None,
) -> Iterator[None]:
    """Say that a connection lost mid-stream broke the stream from `where` off.

    The server was reached and had begun to answer: "could not reach" would
    send the user looking at the URL. Still a retryable connection error.
    `timeout` and `connection` are the SDK's error classes (its timeout is
    a kind of its connection error, and stays what it is). Once the reply
    is `whole` (it said why it stopped), a connection lost or a read timed
    out only ends the stream: the reply stands.

    So does an error event that comes after the stop (`sent`, the SDK's
    error class, raised for one; `classify` reads it): what follows a stop
    is delivery's bookkeeping (the usage, the end), and no error a server
    sends then (overloaded, an upstream's failure, a timeout) withdraws a
    reply it has finished. Asked for again, the reply would be billed
    twice. The error is logged as a warning on ``turnfsm.providers``.
    """
    try:
        yield
    except timeout:
        if not whole():
            raise
    except connection as exc:
        if not whole():
            raise connection_error(
                f"the stream from {where} broke off: {dropped(exc)}"
            ) from exc
    except sent as exc:
        if not whole() or classify is None:
            raise
        logger.warning(
            "the stream from %s sent an error after its reply was whole "
            "(its stop reason had come); the reply is kept: %s",
            where,
            classify(exc),
        )


def unreadable_body_error(
    exc: json.JSONDecodeError | RecursionError, what: str = "the body"
) -> ProviderError:
    """Return the `ProviderError` for a reply body the SDK could not parse.

    A server (often a proxy's HTML error page sent with status 200) can
    answer with text that is not JSON, or JSON nested too deep to read; the
    run fails on it as on any other unreadable reply, without a retry. A
    streamed event's data that is not JSON is read the same way (`what`
    names it: ``"a streamed event"``): a stream cut short ends before its
    last event, so such an event is the server's own.
    """
    if isinstance(exc, RecursionError):
        return ProviderError(
            f"unreadable reply: {what} is JSON nested too deep to read",
            kind=BAD_RESPONSE,
        )
    return ProviderError(
        f"unreadable reply: {what} is not JSON ({exc.msg}): {exc.doc[:80]!r}",
        kind=BAD_RESPONSE,
    )


def page_text(body: str) -> str:
    """The start of an error body that is not JSON, as text: a page's words.

    A proxy's or a gateway's error page is read as a browser shows it: its
    styles, scripts and comments left out, its tags as spaces, its
    entities (``&nbsp;``) as the characters they stand for; at most 200
    characters of it.
    """
    words = " ".join(html.unescape(_TAG.sub(" ", _UNSHOWN.sub(" ", body))).split())
    return words if len(words) <= 200 else words[:197] + "..."


_UNSHOWN: Final = re.compile(
    r"<!--.*?(?:-->|$)|<(script|style)\b[^>]*>.*?(?:</\1\s*>|$)",
    re.DOTALL | re.IGNORECASE,
)
"""What a page does not show: its comments, scripts and styles."""
_TAG: Final = re.compile(r"<[^>]*>")


def unreadable_field(where: str, value: object, expected: str) -> ProviderError:
    """Return the `ProviderError` for a reply whose `where` is not `expected`.

    The SDKs build their reply objects without checking them, so a server
    can send anything where a list, an object or a count belongs; the run
    fails on it, naming the field and the value, without a retry.
    """
    shown = repr(value)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    return ProviderError(
        f"unreadable reply: {where}={shown}: expected {expected}", kind=BAD_RESPONSE
    )


def json_data(value: object) -> object:
    """Return the JSON an SDK read into `value`: its models as plain dicts."""
    if isinstance(value, pydantic.BaseModel):
        return value.model_dump(mode="json", warnings=False)
    return value


def reply_object(value: object, where: str) -> dict[str, Any]:
    """Return `value` (an SDK model or a dict) as a dict, else refuse `where`."""
    data = json_data(value)
    if not isinstance(data, dict):
        raise unreadable_field(where, data, "a JSON object")
    return data


def reply_list(value: object, where: str) -> list[Any]:
    """Return `value` as a list (None: empty), else refuse `where`."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise unreadable_field(where, value, "a list")
    return value


def reply_text(value: object, where: str) -> str:
    """Return `value` as a string (None: empty), else refuse `where`."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise unreadable_field(where, value, "a string")
    return value


def given_call_id(call: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    """Return a reply's tool `call` (a dict) with an id: a fresh one if it has none.

    llama.cpp and other compatible servers may leave a call's ``id`` empty
    or out; a call without one cannot be answered, so it gets a fresh one,
    `prefix` and 24 hex digits (``call_...``, ``toolu_...``). An id of
    another type is kept, for the converter to refuse.
    """
    if call.get("id") not in (None, ""):
        return dict(call)
    return dict(call, id=f"{prefix}{uuid.uuid4().hex[:24]}")


NAMELESS_TOOL: Final = "missing_tool_name"
"""The name a reply's tool call with an empty name is given (no tool has it)."""


def named_call(name: object) -> object:
    """Return a tool call's `name`, or `NAMELESS_TOOL` for an empty one.

    A small model (or a server's grammar) can call a tool with an empty
    name: the call gets a name no tool has, so it is answered with an error
    result the model reads (as a call of an unknown tool is), and the run
    goes on instead of failing on an unreadable reply. The name is one every
    provider accepts back in the history. A name of another type is kept,
    for the converter to refuse.
    """
    return NAMELESS_TOOL if name in (None, "") else name


def reply_tokens(value: object, where: str) -> int:
    """Return a reported token count (None: 0), else refuse `where`."""
    if value is None:
        return 0
    if (
        not isinstance(value, int)
        or isinstance(value, bool)
        or not 0 <= value <= _checks.MAX_TOKENS
    ):
        raise unreadable_field(
            where, value, f"a token count: an int from 0 to {_checks.MAX_TOKENS:,}"
        )
    return value


_E = TypeVar("_E")


async def streamed_text(
    events: AsyncIterable[_E],
    add: Callable[[_E], str],
    where: str,
    dropped: tuple[type[BaseException], type[BaseException]],
    *,
    whole: Callable[[], bool],
    sent: type[BaseException],
    classify: Callable[[Any], ProviderError],
) -> AsyncGenerator[TextDelta]:
    """Read a reply's stream: each event to `add`, each text it gives as a delta.

    The stream ends when its events do, or `AFTER_STOP_WAIT` after the reply
    is `whole` (`until_done`); a connection lost or an error sent after
    that leaves the reply standing, and before it is said as a stream that
    broke off from `where` (`broken_off`, with the SDK's `dropped` timeout
    and connection error, its error class `sent` and `classify`).
    """
    with broken_off(where, *dropped, whole=whole, sent=sent, classify=classify):
        async with aclosing(until_done(events, whole)) as read:
            async for event in read:
                if text := add(event):
                    yield TextDelta(text=text)
