"""`AnthropicModel`: a `ModelClient` on the Anthropic SDK's Messages API.

The system prompt goes in ``system=``; tool calls are ``tool_use`` blocks and
results ``tool_result`` blocks (``is_error`` kept). The SDK's own retries are
off (``max_retries=0``): the driver owns every retry, so a failure reaches it
once, classified here in `classify_anthropic_error` (rules in ``_errors.py``).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import aclosing
from typing import Any, ClassVar, Final, TypeAlias, final

import attrs

from turnfsm import _checks
from turnfsm.errors import CONTEXT_OVERFLOW, ConfigError, InvalidMessage, ProviderError
from turnfsm.messages import Message
from turnfsm.providers._config import (
    client_check,
    http_url,
    model_name,
    positive_or_none,
    resolve_api_key,
)
from turnfsm.providers._convert_anthropic import (
    from_anthropic_messages,
    to_anthropic_messages,
    to_anthropic_tools,
)
from turnfsm.providers._convert_openai import arguments_from_json
from turnfsm.providers._errors import (
    BAD_RESPONSE,
    CONTENT_FILTER,
    QUOTA,
    SERVER,
    connection_error,
    from_status,
    given_call_id,
    json_data,
    lost_connection,
    mentions_overflow,
    named_call,
    named_server,
    not_served,
    page_text,
    reply_list,
    reply_object,
    reply_text,
    reply_tokens,
    request_url,
    streamed_text,
    timeout_error,
    timeout_setting,
    unreadable_body_error,
    unreadable_field,
    with_setting,
)
from turnfsm.providers._protocol import ModelRequest, ModelResponse, OutputSpec
from turnfsm.providers._sdk import (
    LoopClient,
    SDKModel,
    each_event,
    is_event_stream,
    sent,
    whole_body,
    without_bom,
)
from turnfsm.providers._stream import StreamDone, StreamEvent, TextDelta
from turnfsm.providers._windows import known_window
from turnfsm.values import Usage

try:
    import anthropic
    from anthropic import types as wire
except ImportError as exc:  # pragma: no cover - depends on what is installed
    raise ImportError(
        "AnthropicModel needs the Anthropic SDK: pip install 'turnfsm[anthropic]'"
    ) from exc

__all__ = ["AnthropicModel", "classify_anthropic_error"]

_EventStream: TypeAlias = anthropic.AsyncStream[wire.RawMessageStreamEvent]

_KEY_ENV: Final = "ANTHROPIC_API_KEY"
_TOKEN_ENV: Final = "ANTHROPIC_AUTH_TOKEN"
_KEY_HINT: Final = f"check the API key: set {_KEY_ENV} or pass api_key="
# A compatible server without authentication still needs some key.
# The status each error type stands for, for errors sent inside a stream
# (the SDK reports those with the stream's own status, 200).
_TYPE_STATUS: Final = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "permission_error": 403,
    "billing_error": 402,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "timeout_error": 504,
    "overloaded_error": 529,
}


@final
@_checks.keyword_checked
@attrs.define(eq=False)
class AnthropicModel(SDKModel):
    """A `ModelClient` for Anthropic's Messages API.

    ``AnthropicModel("claude-sonnet-4-5")`` reads the key from
    ``ANTHROPIC_API_KEY`` (or ``ANTHROPIC_AUTH_TOKEN``). Replies may call
    several tools at once; consecutive tool results travel together in one
    user message. `stream` yields the text as it arrives. Sampling settings
    (`ModelRequest.temperature`) are not sent: the current Messages API
    rejects them.

    Use it as an async context manager, ``async with
    AnthropicModel("claude-sonnet-4-5") as model:``, to close its
    connections at the block's end, even when the block raises or is
    cancelled; or call `close()` when done with it.

    Attributes:
        model: the model name sent with every request.
        base_url: another Messages-API endpoint; None for Anthropic itself.
        api_key: the key; None reads ``ANTHROPIC_API_KEY``.
        timeout: seconds per HTTP request (None: no limit).
        max_tokens: the reply budget when the request sets none (the API
            requires one).
        client: a ready `anthropic.AsyncAnthropic` to use instead of building
            one (`base_url`, `api_key` and `timeout` are then ignored); its
            retries are switched off too.
        context_window: the model's window in tokens; None: the window
            `known_window` gives for `model` (from the catalogue bundled
            with ``genai-prices``) for the URL the requests go to, else
            not known (a local server, a proxy). A run's window is
            chosen from it (see `window_for`).

    Raises:
        ConfigError: no key is found and no `base_url` is given, or a
            setting is out of range.
    """

    provider_name: ClassVar[str] = "anthropic"
    """The provider's name in traces (``gen_ai.provider.name``)."""

    model: str = attrs.field(
        validator=model_name("anthropic", "AnthropicModel", "claude-sonnet-4-5")
    )
    base_url: str | None = attrs.field(
        default=None,
        kw_only=True,
        validator=http_url("https://api.anthropic.com"),
    )
    api_key: str | None = attrs.field(
        default=None, kw_only=True, repr=False, validator=_checks.string(optional=True)
    )
    timeout: float | None = attrs.field(
        default=600.0, kw_only=True, validator=positive_or_none("timeout")
    )
    max_tokens: int = attrs.field(
        default=1024,
        kw_only=True,
        validator=_checks.integer(low=1),
    )
    client: anthropic.AsyncAnthropic | None = attrs.field(
        default=None,
        kw_only=True,
        repr=False,
        validator=client_check(anthropic.AsyncAnthropic, anthropic.Anthropic),
    )
    context_window: int | None = attrs.field(
        default=None,
        kw_only=True,
        validator=_checks.integer(low=1, high=_checks.MAX_TOKENS, optional=True),
    )
    _sdk: LoopClient[anthropic.AsyncAnthropic] = attrs.field(init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        if self.client is not None:
            _check_credential(self.client)
        self._sdk = LoopClient(self._build, owned=self.client is None)
        if self.context_window is None:  # where the requests really go
            url = str(self._sdk.client.base_url)
            self.context_window = known_window(self.model, api_url=url)

    def _client(self) -> anthropic.AsyncAnthropic:
        return self._sdk.get()

    def _build(self) -> anthropic.AsyncAnthropic:
        if self.client is not None:
            return self.client.with_options(max_retries=0)
        key = resolve_api_key(
            self.api_key, _KEY_ENV, base_url=self.base_url, also_accepted=[_TOKEN_ENV]
        )
        return anthropic.AsyncAnthropic(
            api_key=key, base_url=self.base_url, timeout=self.timeout, max_retries=0
        )

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Send `request` as one Messages API call and return the reply.

        Raises:
            ProviderError: the API failed; `kind` says how (see ``_errors``).
        """
        client = self._client()
        with _translated(self._timeout_setting()):
            # `**options` hides the overload; name the type it returns. The
            # client's timeout, given: left to the SDK, a client built with
            # its default refuses a budget that might take over 10 minutes
            # unstreamed (a ValueError), where the run's model_timeout
            # bounds the call anyway.
            reply: wire.Message = await sent(
                client.messages.create, self._options(request), timeout=client.timeout
            )
        # A gateway whose upstream failed after it answered sends its error
        # with status 200: read as a reply, it would be an empty one.
        return _whole_reply(_error_body(json_data(reply)), request.output)

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        """Send `request` streamed; yield text deltas, then the whole reply.

        Tool calls are assembled from their ``input_json_delta`` fragments;
        those of the call that carries a structured answer stream as its
        text. Usage comes from the ``message_start`` and ``message_delta``
        events.

        Raises:
            ProviderError: the API failed, before or during the stream.
        """
        reply = _Events(request.output)
        setting = self._timeout_setting()
        with _translated(setting, "a streamed event"):
            events: _EventStream = await sent(
                self._client().messages.create, self._options(request), stream=True
            )
            without_bom(events.response)
            each_event(events, _named_by_type)
            async with events:
                if not is_event_stream(events.response.headers):
                    # A proxy or a compatible server answered with one JSON
                    # body: an error, or the whole reply unstreamed.
                    with _translated(setting):
                        raw = await whole_body(events.response, *_DROPPED)
                        body = json.loads(raw)
                    response = _whole_reply(_error_body(body), request.output)
                    if text := response.message.text:
                        yield TextDelta(text=text)
                    yield StreamDone(response=response)
                    return
                where = _named(self._sdk.client.base_url)
                # The reply is whole at its stop reason: the message_stop
                # event after it adds nothing (the SDK's own accumulation
                # reads the stop reason and the last usage from the
                # message_delta), so a server that holds the stream open
                # after it is left, `AFTER_STOP_WAIT` later.
                read = streamed_text(
                    events,
                    reply.add,
                    where,
                    _DROPPED,
                    whole=reply.whole,
                    sent=anthropic.APIError,
                    classify=classify_anthropic_error,
                )
                async with aclosing(read) as deltas:
                    async for delta in deltas:
                        yield delta
        if not reply.whole():
            # The body ended mid-reply, or before it began (a proxy lost its
            # upstream): what came is not the whole reply; the driver may
            # ask again.
            missing = (
                "stop reason (a message_delta event)"
                if reply.started
                else "message_start event"
            )
            raise connection_error(
                f"the stream from {where} broke off: it ended before its {missing}"
            )
        yield StreamDone(response=reply.response())

    def _timeout_setting(self) -> str:
        return timeout_setting("AnthropicModel", self.timeout, client=self.client)

    def _options(self, request: ModelRequest) -> dict[str, Any]:
        # A request that defines no tools may hold no tool blocks.
        blocks = bool(request.tools) or request.output is not None
        system, messages = to_anthropic_messages(request.messages, tool_blocks=blocks)
        if request.system and request.system.strip():  # blank text is refused
            system.insert(0, {"type": "text", "text": request.system})
        limit = (
            request.max_tokens if request.max_tokens is not None else self.max_tokens
        )
        options: dict[str, Any] = {
            "model": self.model,
            "max_tokens": limit,
            "messages": messages,
        }
        if len(system) == 1:
            options["system"] = system[0]["text"]
        elif system:
            options["system"] = system
        if request.tools:
            options["tools"] = to_anthropic_tools(request.tools)
        if request.output is not None:
            _force_output(options, request.output)
        # No temperature: SDK 2.x has no sampling parameters, and the API
        # version it sends (2026-10-21) rejects them; `request.temperature`
        # is not sent.
        return options


def _check_credential(client: anthropic.AsyncAnthropic) -> None:
    """Refuse a `client` with no credential, as the SDK would at each call.

    Raises:
        ConfigError: no key, no token, no credentials provider and no
            ``X-Api-Key`` or ``Authorization`` header: the SDK refused
            every call with a bare TypeError.
    """
    given = {name.lower() for name in client.default_headers}
    if given & {"x-api-key", "authorization"}:
        return
    if getattr(client, "_token_cache", None) is not None:  # credentials=
        return  # a provider that fills Authorization in at each call
    raise ConfigError(
        "client",
        client,
        f"a client with a key: it was built without one (set {_KEY_ENV} "
        "before building it, or pass api_key= to it)",
    )


class _Events:
    """A streamed reply, assembled event by event."""

    def __init__(self, output: OutputSpec | None = None) -> None:
        self.output = output
        self.blocks: dict[int, dict[str, Any]] = {}  # by index, as the API sends
        self.inputs: dict[int, list[str]] = {}  # tool_use input JSON pieces
        self.answer: int | None = None  # the index of the output tool's call
        self.counts: dict[str, int] = {}  # the usage's counts so far
        self.model: str | None = None
        self.stop_reason = ""  # the API's own word
        self.stop_details: object = None  # what it says of a refusal
        self.started = False  # a message_start came: the stream is a reply
        self.stopped = False  # its message_stop came

    def whole(self) -> bool:
        """Whether the whole reply came: its stop reason, or its message_stop."""
        return self.stopped or (self.started and bool(self.stop_reason))

    def add(self, event: wire.RawMessageStreamEvent) -> str:
        """Take in one event; return the text it adds ("" if none).

        Raises:
            ProviderError: the event is not of its type's shape (a delta of a
                block that never started, a message that is not an object,
                ...), kind ``bad_response``.
        """
        data = reply_object(event, "a streamed event")
        kind = data.get("type")
        if kind == "message_start":
            message = reply_object(data.get("message"), "message_start.message")
            self.started = True
            self.counts = _counts(message.get("usage"))
            self.model = reply_text(message.get("model"), "model") or None
        elif kind == "message_stop":
            self.stopped = True
        elif kind == "message_delta":
            self.counts = _counts(data.get("usage"), self.counts)
            delta = reply_object(data.get("delta") or {}, "message_delta.delta")
            where = "message_delta.delta.stop_reason"
            self.stop_reason = reply_text(delta.get("stop_reason"), where) or (
                self.stop_reason
            )
            self.stop_details = delta.get("stop_details") or self.stop_details
        elif kind == "content_block_start":
            where = "content_block_start.content_block"
            block = reply_object(data.get("content_block"), where)
            index = data.get("index")
            if not isinstance(index, int) or isinstance(index, bool):
                raise unreadable_field("content_block_start.index", index, "an int")
            self.blocks[index] = block
            if block.get("type") == "tool_use":
                self.inputs[index] = []
                if self.output is not None and block.get("name") == self.output.name:
                    self.answer = index  # its JSON is the answer's text
            elif block.get("type") == "text":
                text = reply_text(block.get("text"), f"{where}.text")
                block["text"] = text
                return text
        elif kind == "content_block_delta":
            return self._add_delta(data)
        return ""

    def _add_delta(self, data: dict[str, Any]) -> str:
        """Take in a block's delta: a piece of its text or of its input."""
        index = data.get("index")
        delta = reply_object(data.get("delta"), "content_block_delta.delta")
        if delta.get("type") == "text_delta":
            block = self.blocks.get(index) if isinstance(index, int) else None
            if block is None or block.get("type") != "text":
                raise unreadable_field(
                    "text_delta's index", index, "the index of a text block it started"
                )
            text = reply_text(delta.get("text"), "text_delta.text")
            block["text"] += text
            return text
        if delta.get("type") == "input_json_delta":
            pieces = self.inputs.get(index) if isinstance(index, int) else None
            if pieces is None:
                raise unreadable_field(
                    "input_json_delta's index",
                    index,
                    "the index of a tool_use block it started",
                )
            where = "input_json_delta.partial_json"
            piece = reply_text(delta.get("partial_json"), where)
            pieces.append(piece)
            return piece if index == self.answer else ""
        if delta.get("type") in _THOUGHT_DELTAS:
            # A thinking block's text and signature, which the next call
            # sends back unchanged.
            field = _THOUGHT_DELTAS[delta["type"]]
            block = self.blocks.get(index) if isinstance(index, int) else None
            if block is None or block.get("type") != "thinking":
                raise unreadable_field(
                    f"{delta['type']}'s index",
                    index,
                    "the index of a thinking block it started",
                )
            piece = reply_text(delta.get(field), f"{delta['type']}.{field}")
            block[field] = reply_text(block.get(field), field) + piece
        return ""

    def response(self) -> ModelResponse:
        """Return the whole reply, as `AnthropicModel.complete` would.

        Raises:
            ProviderError: the stream sent no message (a body that is not
                server-sent events, such as an HTML page), kind
                ``bad_response``.
        """
        if not self.started:
            raise ProviderError(
                "unreadable reply: the stream sent no message", kind=BAD_RESPONSE
            )
        for index, pieces in self.inputs.items():
            if pieces:
                self.blocks[index]["input"] = arguments_from_json("".join(pieces))
        order = sorted(self.blocks)
        blocks = [self.blocks[i] for i in order]
        _check_stop(self.stop_reason, self.stop_details, blocks, self.counts)
        if order and _cut_off(self.stop_reason, blocks):  # the text as it came
            blocks[-1]["input"] = {"_raw": "".join(self.inputs.get(order[-1], []))}
        message = _reply(blocks, self.output)
        return ModelResponse(
            message=message,
            usage=_usage(self.counts),
            model=self.model,
            finish_reason=_finish_reason(self.stop_reason, message),
        )


_THOUGHT_DELTAS: Final = {"thinking_delta": "thinking", "signature_delta": "signature"}
"""The deltas of a thinking block, and the field each adds to."""


def _whole_reply(reply: object, output: OutputSpec | None) -> ModelResponse:
    """Read a whole Messages API reply (an SDK model or its JSON data)."""
    # The SDK builds its models unchecked: read the reply as JSON data and
    # check its shape here; the converter checks the blocks.
    data = reply_object(reply, "the reply")
    if data.get("content") is None:  # even an empty reply has its list
        raise unreadable_field("content", None, "a list of content blocks")
    content = reply_list(data["content"], "content")
    blocks = [reply_object(block, f"content[{i}]") for i, block in enumerate(content)]
    counts = _counts(data.get("usage"))
    _check_stop(data.get("stop_reason"), data.get("stop_details"), blocks, counts)
    if _cut_off(data.get("stop_reason"), blocks):
        said = json.dumps(blocks[-1].get("input"), ensure_ascii=False)
        blocks[-1] = dict(blocks[-1], input={"_raw": said})
    message = _reply(blocks, output)
    return ModelResponse(
        message=message,
        usage=_usage(counts),
        model=reply_text(data.get("model"), "model") or None,
        finish_reason=_finish_reason(data.get("stop_reason"), message),
    )


_CUT: Final = frozenset({"max_tokens"})
"""The stop reasons of a reply cut off where it stood that is still a reply
(one cut at the window, or by a refusal, is an error: `_check_stop`)."""


def _check_stop(
    stop_reason: object,
    details: object,
    blocks: list[dict[str, Any]],
    counts: dict[str, int],
) -> None:
    """Raise the error a reply's stop reason says it is, if it says so.

    - ``model_context_window_exceeded``: the reply filled the model's
      window before it was done (the request's budget did not fit beside
      its input; Anthropic cuts the reply there instead of refusing the
      request). As a reply cut at the window by any server, it is a
      context overflow: the run compacts and asks again; the cut reply is
      not committed.
    - ``refusal``: Anthropic's classifier stopped the reply mid-way; what
      came is no answer, and a conversation that keeps it is refused again
      (Anthropic: reset the conversation): kind ``content_filter``, not
      retried, quoting the reply so far.
    - ``pause_turn``: Anthropic paused a long turn of its own server tools,
      to be continued by sending the paused content back; turnfsm sends
      no server tools and cannot continue one: kind ``bad_response``.

    Raises:
        ProviderError: the stop reason is one of those, with the reply's
            usage (`counts`): it was billed.
    """
    if stop_reason == "model_context_window_exceeded":
        used = sum(counts.get(name, 0) for name in _INPUTS)
        made = counts.get("output_tokens", 0)
        raise ProviderError(
            "the reply filled the model's context window before it was done "
            f"(stop reason 'model_context_window_exceeded', after {made} output "
            f"tokens on {used} input tokens): the conversation leaves too little "
            "room for the reply budget",
            kind=CONTEXT_OVERFLOW,
            usage=_usage(counts),
        )
    if stop_reason == "refusal":
        said = "".join(
            b["text"]
            for b in blocks
            if b.get("type") == "text" and isinstance(b.get("text"), str)
        )
        explained = details.get("explanation") if isinstance(details, Mapping) else None
        why = f": {explained}" if isinstance(explained, str) and explained else ""
        so_far = f"; the reply so far: {said[:200]!r}" if said else ""
        raise ProviderError(
            f"the API refused to go on (stop reason 'refusal'){why}{so_far}; "
            "the reply is not kept: rephrase the request, or use another model",
            kind=CONTENT_FILTER,
            usage=_usage(counts),
        )
    if stop_reason == "pause_turn":
        raise ProviderError(
            "the API paused the turn (stop reason 'pause_turn'), as it does for "
            "a long loop of its own server tools; turnfsm sends none and cannot "
            "continue one: check what adds server tools to the request (a proxy)",
            kind=BAD_RESPONSE,
            usage=_usage(counts),
        )


def _cut_off(stop_reason: object, blocks: list[dict[str, Any]]) -> bool:
    """Whether the reply's last block is a tool call cut off mid-way.

    The API reads the input of a call it cut off as far as it came, so
    it can look whole with its last arguments missing: such a call gets
    ``{"_raw": ...}`` arguments, which never run (cut off by its budget,
    the run fails naming it). A call with a later block after it is whole.
    """
    return stop_reason in _CUT and bool(blocks) and blocks[-1].get("type") == "tool_use"


def _named_by_type(event: Any) -> Any:
    """Name a server-sent event that has no ``event:`` line by its data's type.

    Anthropic names each event (``event: message_start``) and repeats the
    name as its data's ``"type"``; the SDK reads the event by that type,
    but skips an event with no name, so a proxy or a compatible server that
    sends ``data:`` lines alone (as OpenAI-style servers do) had its whole
    reply skipped, read as a stream that broke off, and asked again. Such
    an event is read by its data's type, as a named one is.

    Raises:
        ProviderError: the unnamed event's data is not a JSON object with a
            ``"type"`` (not an Anthropic event: an OpenAI server's chunk,
            say), kind ``bad_response``; data that is not JSON at all is
            the SDK's JSON error, translated the same way.
    """
    if event.event is not None or not event.data.strip():
        return event  # named, or no data: the SDK reads it as it is
    data = json.loads(event.data)
    kind = data.get("type") if isinstance(data, dict) else None
    if not isinstance(kind, str) or not kind:
        raise unreadable_field(
            "a streamed event with no event name: its data",
            data,
            'an Anthropic event, a JSON object with a "type" '
            '(e.g. "message_start"); is this an Anthropic-compatible server?',
        )
    return type(event)(event=kind, data=event.data, id=event.id, retry=event.retry)


def _error_body(data: object) -> object:
    """Return `data` (a whole body); raise the error it holds, if it is one.

    Raises:
        ProviderError: the body is an error (``{"type": "error", "error":
            {...}}``), classified by its error type as an error event is.
    """
    if not isinstance(data, Mapping) or (
        data.get("type") != "error" and data.get("error") is None
    ):
        return data
    error = data.get("error")
    error = error if isinstance(error, Mapping) else data
    message, kind = error.get("message"), error.get("type")
    said = message if isinstance(message, str) else json.dumps(data)[:500]
    status = _TYPE_STATUS.get(kind if isinstance(kind, str) else "", 500)
    raise _classified(status, kind, said)


def _classified(
    status: int, kind: object, message: str, headers: Mapping[str, str] | None = None
) -> ProviderError:
    """Classify an error the API sent, by its status and its error type.

    A ``billing_error`` (no credit left) is kind ``quota``: asked again, it
    fails again.
    """
    if kind == "billing_error":
        return ProviderError(f"HTTP {status}: {message}", kind=QUOTA, status=status)
    overflow = status == 413 or mentions_overflow(message)
    return from_status(
        status, message, overflow=overflow, key_hint=_KEY_HINT, headers=headers
    )


def _force_output(options: dict[str, Any], output: OutputSpec) -> None:
    """Ask for the structured answer as a call of a tool named after the output.

    Alone, the tool is forced; beside the run's own tools, the model must
    call one of them or the output tool (``any``), so it can still use them.
    """
    tools = options.setdefault("tools", [])
    tools.append(
        {
            "name": output.name,
            "description": "Give your final answer in this format.",
            "input_schema": dict(output.schema),
        }
    )
    alone = len(tools) == 1
    options["tool_choice"] = (
        {"type": "tool", "name": output.name} if alone else {"type": "any"}
    )


def _answer_as_text(
    blocks: list[dict[str, Any]], output: OutputSpec | None
) -> list[dict[str, Any]]:
    """Turn the forced output tool's call back into the reply's JSON text.

    The history never holds a call without a result: the answer is text.
    A call whose arguments broke off stays a call, for the run to fail on.
    """
    if output is None:
        return blocks
    return [
        {"type": "text", "text": json.dumps(b.get("input", {}), ensure_ascii=False)}
        if b.get("type") == "tool_use"
        and b.get("name") == output.name
        and not _broken(b.get("input"))
        else b
        for b in blocks
    ]


def _broken(arguments: object) -> bool:
    """Whether a call's `arguments` are text that was no whole JSON object."""
    return isinstance(arguments, dict) and set(arguments) == {"_raw"}


def _reply(blocks: list[dict[str, Any]], output: OutputSpec | None = None) -> Message:
    blocks = [
        dict(given_call_id(b, "toolu_"), name=named_call(b.get("name")))
        if b.get("type") == "tool_use"
        else b
        for b in _answer_as_text(blocks, output)
    ]
    try:
        return from_anthropic_messages([{"role": "assistant", "content": blocks}])[0]
    except InvalidMessage as exc:
        raise ProviderError(f"unreadable reply: {exc}", kind=BAD_RESPONSE) from exc


_FINISH_REASONS: Final = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "tool_use": "tool_calls",
}
"""Anthropic's stop reasons in OpenAI's words (`ModelResponse.finish_reason`)."""


def _finish_reason(value: object, message: Message) -> str | None:
    """Return a reply's ``stop_reason`` as a `ModelResponse.finish_reason`.

    A ``tool_use`` stop of a reply with no tool call left (the forced output
    tool's call, read back as the answer's text) is a whole answer, ``stop``.
    """
    said = reply_text(value, "stop_reason")
    reason = _FINISH_REASONS.get(said, said)
    if reason == "tool_calls" and not message.tool_calls:
        return "stop"
    return reason or None


_INPUTS: Final = (
    "input_tokens",
    "cache_creation_input_tokens",
    "cache_read_input_tokens",
)
"""The usage's counts of input: cache writes and reads are input too
(`Usage.input_tokens` sums them; the cache's are kept apart as well)."""


def _counts(value: object, before: dict[str, int] | None = None) -> dict[str, int]:
    """Return the token counts so far, by the API's names.

    A streamed ``message_delta`` gives each count so far; one it leaves
    out (or sends as null) stands as ``message_start`` gave it, as the
    SDK reads it.
    """
    counts = dict(before or {})
    if value is None:
        return counts
    usage = reply_object(value, "usage")
    for name in (*_INPUTS, "output_tokens"):
        if usage.get(name) is not None or name not in counts:
            counts[name] = reply_tokens(usage.get(name), f"usage.{name}")
    return counts


def _usage(counts: dict[str, int]) -> Usage | None:
    """Return the `Usage` of `counts` (None if none came)."""
    if not counts:
        return None
    return Usage(
        input_tokens=sum(counts[name] for name in _INPUTS),
        output_tokens=counts["output_tokens"],
        cache_read_tokens=counts["cache_read_input_tokens"],
        cache_write_tokens=counts["cache_creation_input_tokens"],
    )


@contextlib.contextmanager
def _translated(setting: str, read: str = "the body") -> Iterator[None]:
    """Translate the SDK's API errors and unreadable bodies; bugs pass unchanged.

    A timeout names the `setting` that bounds the wait (`timeout_setting`);
    JSON that cannot be read is named as `read` (``"a streamed event"``).
    """
    try:
        yield
    except anthropic.APIError as exc:
        raise with_setting(classify_anthropic_error(exc), setting) from exc
    except (json.JSONDecodeError, RecursionError) as exc:  # the SDK's json.loads
        raise unreadable_body_error(exc, read) from exc


_DROPPED: Final = (anthropic.APITimeoutError, anthropic.APIConnectionError)
"""The SDK's timeout, then its connection error: what `broken_off` tells apart."""


def _named(url: Any) -> str:
    """Name the API at `url` (an httpx URL): the Anthropic API, or the server."""
    return named_server(url, "api.anthropic.com", "the Anthropic API")


_USUAL_URL: Final = (
    "an Anthropic-compatible server's is given without /v1, which the client "
    "adds, e.g. http://127.0.0.1:4000"
)


def classify_anthropic_error(exc: anthropic.APIError) -> ProviderError:
    """Return the `ProviderError` for an Anthropic SDK error (see ``_errors``).

    A context overflow is a 400 whose message says "prompt is too long" (or
    that input and max_tokens "exceed context limit"), or a 413
    ``request_too_large``: a smaller conversation fixes all three. 529
    (overloaded) is a retryable server error; a ``billing_error`` is kind
    ``quota``, not retried. An error sent inside a stream is classified by
    its error type.
    """
    if isinstance(exc, anthropic.APITimeoutError):
        return timeout_error(f"{_named(request_url(exc))} timed out: {exc.message}")
    if isinstance(exc, anthropic.APIConnectionError):
        where = _named(request_url(exc))
        return lost_connection(exc, where)
    body = exc.body if isinstance(exc.body, Mapping) else {}
    error = body.get("error")
    error = error if isinstance(error, Mapping) else body
    raw_message, kind = error.get("message"), error.get("type")
    message = raw_message if isinstance(raw_message, str) else exc.message
    if isinstance(exc.body, str) and (page := page_text(exc.body)):
        message = page  # no JSON: a proxy's page, a server's own text
    if isinstance(exc, anthropic.APIResponseValidationError):
        return ProviderError(
            f"unreadable reply: {message}", kind=BAD_RESPONSE, status=exc.status_code
        )
    if not isinstance(exc, anthropic.APIStatusError):
        return ProviderError(message, retryable=True, kind=SERVER)
    status = exc.status_code
    if status == 404 and not isinstance(raw_message, str):
        message = f"{message} - {not_served(request_url(exc), _USUAL_URL)}"
    if status < 400:  # an error event inside a stream
        status = _TYPE_STATUS.get(kind if isinstance(kind, str) else "", 500)
    return _classified(status, kind, message, exc.response.headers)
