"""`OpenAIModel`: a `ModelClient` on the OpenAI SDK's chat completions.

It speaks to OpenAI and to any OpenAI-compatible server (vLLM, llama.cpp,
Ollama) through ``base_url``. The SDK's own retries are off (``max_retries=0``):
the driver owns every retry, so a failure reaches it once, classified here in
`classify_openai_error` (the one place; rules in ``_errors.py``).
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping
from contextlib import aclosing
from typing import Any, ClassVar, Final, Literal, TypeAlias, final

import attrs

from turnfsm import _checks
from turnfsm.errors import CONTEXT_OVERFLOW, InvalidMessage, ProviderError
from turnfsm.messages import Message
from turnfsm.providers._config import (
    check_ascii_headers,
    client_check,
    http_url,
    model_name,
    positive_or_none,
    resolve_api_key,
)
from turnfsm.providers._convert_openai import (
    from_openai_messages,
    to_openai_messages,
    to_openai_tools,
)
from turnfsm.providers._errors import (
    BAD_REQUEST,
    BAD_RESPONSE,
    CONNECTION,
    CONTENT_FILTER,
    QUOTA,
    SERVER,
    connection_error,
    from_status,
    given_call_id,
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
    import openai
    from openai.types.chat import ChatCompletion, ChatCompletionChunk
except ImportError as exc:  # pragma: no cover - depends on what is installed
    raise ImportError(
        "OpenAIModel needs the OpenAI SDK: pip install 'turnfsm[openai]'"
    ) from exc

__all__ = ["OpenAIModel", "classify_openai_error"]

_ChunkStream: TypeAlias = openai.AsyncStream[ChatCompletionChunk]

_KEY_ENV: Final = "OPENAI_API_KEY"
_KEY_HINT: Final = f"check the API key: set {_KEY_ENV} or pass api_key="


@final
@_checks.keyword_checked
@attrs.define(eq=False)
class OpenAIModel(SDKModel):
    """A `ModelClient` for OpenAI chat completions and compatible servers.

    ``OpenAIModel("gpt-4o-mini")`` reads the key from ``OPENAI_API_KEY``;
    ``OpenAIModel("local", base_url="http://127.0.0.1:8080/v1")`` talks to a
    llama.cpp or vLLM server (a placeholder key is sent when none is set).
    Requests carry the tools as function tools; replies may call several
    tools at once. `stream` yields the text as it arrives.

    Use it as an async context manager, ``async with OpenAIModel("gpt-4o-mini") as
    model:``, to close its connections at the block's end, even when the
    block raises or is cancelled; or call `close()` when done with it.

    Attributes:
        model: the model name sent with every request.
        base_url: an OpenAI-compatible server; None for OpenAI itself.
        api_key: the key; None reads ``OPENAI_API_KEY``.
        timeout: seconds per HTTP request (None: no limit).
        max_tokens: the reply budget when the request sets none (None: the
            server's default). Sent as ``max_completion_tokens`` to
            api.openai.com and as ``max_tokens`` elsewhere.
        temperature: the sampling temperature when the request sets none.
        parallel_tool_calls: sent with tools when not None.
        tool_choice: sent with tools when not None: ``"auto"`` (the model
            may call a tool or answer), ``"required"`` (it must call one) or
            ``"none"``. OpenAI and the server `LlamaServer` starts assume
            ``"auto"``; llama-cpp-python's ``chatml-function-calling`` format
            offers the tools only when it is sent.
        structured_output: how a request's `ModelRequest.output` is asked
            for: ``"json_schema"`` (OpenAI's ``response_format`` with a JSON
            schema, strict when the schema qualifies) or ``"json_object"``
            (``{"type": "json_object", "schema": ...}``, the llama.cpp
            server's JSON-schema grammar).
        client: a ready `openai.AsyncOpenAI` to use instead of building one
            (`base_url`, `api_key` and `timeout` are then ignored); its
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

    provider_name: ClassVar[str] = "openai"
    """The provider's name in traces (``gen_ai.provider.name``)."""

    model: str = attrs.field(
        validator=model_name("openai", "OpenAIModel", "gpt-4o-mini")
    )
    base_url: str | None = attrs.field(
        default=None,
        kw_only=True,
        validator=http_url("http://127.0.0.1:8080/v1"),
    )
    api_key: str | None = attrs.field(
        default=None, kw_only=True, repr=False, validator=_checks.string(optional=True)
    )
    timeout: float | None = attrs.field(
        default=600.0, kw_only=True, validator=positive_or_none("timeout")
    )
    max_tokens: int | None = attrs.field(
        default=None, kw_only=True, validator=_checks.integer(low=1, optional=True)
    )
    temperature: float | None = attrs.field(
        default=None,
        kw_only=True,
        validator=_checks.number(low=0, high=2, optional=True),
    )
    parallel_tool_calls: bool | None = attrs.field(
        default=None, kw_only=True, validator=_checks.boolean(optional=True)
    )
    tool_choice: Literal["auto", "required", "none"] | None = attrs.field(
        default=None,
        kw_only=True,
        validator=_checks.one_of(("auto", "required", "none"), optional=True),
    )
    structured_output: Literal["json_schema", "json_object"] = attrs.field(
        default="json_schema",
        kw_only=True,
        validator=_checks.one_of(("json_schema", "json_object")),
    )
    client: openai.AsyncOpenAI | None = attrs.field(
        default=None,
        kw_only=True,
        repr=False,
        validator=client_check(openai.AsyncOpenAI, openai.OpenAI),
    )
    context_window: int | None = attrs.field(
        default=None,
        kw_only=True,
        validator=_checks.integer(low=1, high=_checks.MAX_TOKENS, optional=True),
    )
    _sdk: LoopClient[openai.AsyncOpenAI] = attrs.field(init=False, repr=False)
    _limit_field: str = attrs.field(init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        if self.client is not None:
            check_ascii_headers(self.client.api_key, self.client.default_headers)
        self._sdk = LoopClient(self._build, owned=self.client is None)
        if self.context_window is None:  # where the requests really go
            url = str(self._sdk.client.base_url)
            self.context_window = known_window(self.model, api_url=url)
        official = self._sdk.client.base_url.host == "api.openai.com"
        self._limit_field = "max_completion_tokens" if official else "max_tokens"

    def _client(self) -> openai.AsyncOpenAI:
        return self._sdk.get()

    def _build(self) -> openai.AsyncOpenAI:
        if self.client is not None:
            return self.client.with_options(max_retries=0)
        key = resolve_api_key(self.api_key, _KEY_ENV, base_url=self.base_url)
        return openai.AsyncOpenAI(
            api_key=key, base_url=self.base_url, timeout=self.timeout, max_retries=0
        )

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Send `request` as one chat completion and return the reply.

        Raises:
            ProviderError: the API failed; `kind` says how (see ``_errors``).
        """
        with _translated(self._timeout_setting()):
            # `**options` hides the overload; name the type it returns.
            completion: ChatCompletion = await sent(
                self._client().chat.completions.create, self._options(request)
            )
        return _whole_reply(completion)

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        """Send `request` streamed; yield text deltas, then the whole reply.

        Tool calls are assembled from their fragments; usage comes from the
        final chunk (``stream_options.include_usage``).

        A stream that ends without a reply (llama.cpp's server ends one so
        when the request is over its context size) is asked again without
        streaming, once: that answer says what went wrong, or is the reply.

        Raises:
            ProviderError: the API failed, before or during the stream.
        """
        reply = _Chunks(tool.name for tool in request.tools)
        with _translated(self._timeout_setting(), "a streamed event"):
            chunks: _ChunkStream = await sent(
                self._client().chat.completions.create,
                self._options(request),
                stream=True,
                stream_options={"include_usage": True},
            )
            without_bom(chunks.response)
            each_event(chunks, reply.see)
            where = _named(self._sdk.client.base_url)
            async with chunks:
                if not is_event_stream(chunks.response.headers):
                    # A server that ignores `stream` answered with the whole
                    # reply (or a proxy with its error) in one body: asked
                    # again unstreamed, it was asked, and billed, twice.
                    with _translated(self._timeout_setting()):
                        raw = await whole_body(chunks.response, *_DROPPED)
                        body = json.loads(raw)
                    response = _whole_reply(body)
                    if text := response.message.text:
                        yield TextDelta(text=text)
                    yield StreamDone(response=response)
                    return
                # After the finish_reason, only the usage (and [DONE]) may
                # follow: a server that holds the stream open after it is
                # left `AFTER_STOP_WAIT` later, the usage kept if it came.
                read = streamed_text(
                    chunks,
                    reply.add,
                    where,
                    _DROPPED,
                    whole=reply.stopped,
                    sent=openai.APIError,
                    classify=classify_openai_error,
                )
                async with aclosing(read) as deltas:
                    async for delta in deltas:
                        yield delta
        if reply.replied and not reply.finished:
            # The body ended mid-reply (a gateway lost its upstream): what
            # came is not the whole reply; the driver may ask again.
            raise connection_error(
                f"the stream from {where} broke off: it ended before a chunk "
                "with a finish_reason, the usage or [DONE] came"
            )
        if not reply.replied:
            response = await self._after_empty_stream(request)
            if text := response.message.text:
                yield TextDelta(text=text)
            yield StreamDone(response=response)
            return
        yield StreamDone(response=_said(reply.response()))

    async def _after_empty_stream(self, request: ModelRequest) -> ModelResponse:
        """`complete(request)`, on a new connection if the stream's was closed."""
        try:
            return await self.complete(request)
        except ProviderError as exc:
            if exc.kind != CONNECTION:
                raise
        # llama.cpp's server closes the connection after such a stream, and
        # the client learns it on its next request there: the next one goes
        # on a new connection.
        return await self.complete(request)

    def _timeout_setting(self) -> str:
        return timeout_setting("OpenAIModel", self.timeout, client=self.client)

    def _options(self, request: ModelRequest) -> dict[str, Any]:
        messages: list[dict[str, object]] = []
        if request.system:
            messages.append({"role": "system", "content": request.system})
        messages.extend(to_openai_messages(request.messages))
        options: dict[str, Any] = {"model": self.model, "messages": messages}
        if request.tools:
            options["tools"] = to_openai_tools(request.tools)
            if self.parallel_tool_calls is not None:
                options["parallel_tool_calls"] = self.parallel_tool_calls
            if self.tool_choice is not None:
                options["tool_choice"] = self.tool_choice
        limit = (
            request.max_tokens if request.max_tokens is not None else self.max_tokens
        )
        if limit is not None:
            options[self._limit_field] = limit
        temperature = (
            request.temperature if request.temperature is not None else self.temperature
        )
        if temperature is not None:
            options["temperature"] = temperature
        if request.output is not None:
            options["response_format"] = self._response_format(request.output)
        return options

    def _response_format(self, output: OutputSpec) -> dict[str, Any]:
        schema = dict(output.schema)
        if self.structured_output == "json_object":
            return {"type": "json_object", "schema": schema}
        return {
            "type": "json_schema",
            "json_schema": {
                "name": output.name,
                "schema": schema,
                "strict": output.strict,
            },
        }


class _Chunks:
    """A streamed reply, assembled chunk by chunk."""

    def __init__(self, tool_names: Iterable[str] = ()) -> None:
        self.tool_names = frozenset(tool_names)  # the tools the request offers
        self.text: list[str] = []
        self.refusal: list[str] = []
        self.parts: list[dict[str, Any]] = []  # content parts other than text
        self.calls: dict[int, dict[str, str]] = {}  # in order: id, name, arguments
        self._slots: dict[int | None, int] = {}  # a server's call index: its call
        self._again: dict[int | None, str] = {}  # a name repeated after the arguments
        self.usage: Usage | None = None
        self.model: str | None = None
        self.finish_reason: str | None = None
        self.replied = False  # a choice came
        # The server said the reply is over: its finish_reason, its usage
        # (sent after the finish_reason) or [DONE] came. Until then, a body
        # that ends is a stream cut short.
        self.finished = False

    def see(self, event: Any) -> Any:
        """Note the stream's end marker, ``data: [DONE]``, as it passes.

        The SDK stops at it without a word; it is the server's own end of a
        whole stream, where a body cut short just ends.
        """
        if event.data.startswith("[DONE]"):  # as the SDK reads it
            self.finished = True
        return event

    def stopped(self) -> bool:
        """Whether the reply said why it ended: only its usage may follow."""
        return self.finish_reason is not None

    def add(self, chunk: ChatCompletionChunk) -> str:
        """Take in one chunk; return the text it adds ("" if none).

        Raises:
            ProviderError: the chunk is not of a chunk's shape (a string, a
                delta that is not an object, ...), kind ``bad_response``.
        """
        data = reply_object(chunk, "a streamed chunk")
        self.model = self.model or reply_text(data.get("model"), "model") or None
        if data.get("usage") is not None:  # the last chunk, with include_usage
            self.usage = _usage(data["usage"])
            self.finished = True
        added = ""
        for i, raw in enumerate(reply_list(data.get("choices"), "choices")):
            choice = reply_object(raw, f"choices[{i}]")
            if choice.get("index") not in (0, None):
                continue
            self.replied = True
            if finish := reply_text(
                choice.get("finish_reason"), f"choices[{i}].finish_reason"
            ):
                self.finish_reason = finish
                self.finished = True
            where = f"choices[{i}].delta"
            delta = reply_object(choice.get("delta") or {}, where)
            self.refusal.append(reply_text(delta.get("refusal"), f"{where}.refusal"))
            pieces = reply_list(delta.get("tool_calls"), f"{where}.tool_calls")
            for j, raw_piece in enumerate(pieces):
                self._add_call(reply_object(raw_piece, f"{where}.tool_calls[{j}]"))
            text = self._add_content(delta.get("content"), f"{where}.content")
            if text:
                self.text.append(text)
                added += text
        return added

    def _add_content(self, content: object, where: str) -> str:
        """Take in a delta's content; return its text.

        Some servers (Mistral) send content as a list of typed parts,
        streamed or not: text parts are text; other parts are kept for the
        reply, which reads them as the same reply unstreamed would.
        """
        if not isinstance(content, list):
            return reply_text(content, where)
        text = ""
        for i, raw in enumerate(content):
            part = reply_object(raw, f"{where}[{i}]")
            if part.get("type") == "text" and isinstance(part.get("text"), str):
                text += part["text"]
            else:
                self.parts.append(part)
        return text

    def _add_call(self, piece: dict[str, Any]) -> None:
        """Take in one fragment of a tool call.

        OpenAI sends the id and name once, in a call's first fragment, and
        the arguments in pieces; fragments of one call share its ``index``.
        Compatible servers differ: some split the name into pieces, some
        repeat the id and the whole name in every fragment (`_name_with`),
        and some send every call at one index (or with none), where
        `_starts_another` tells where the next call begins.
        """
        raw_index = piece.get("index")
        index = raw_index if _checks.is_int(raw_index) else None
        call_id = reply_text(piece.get("id"), "tool_calls.id")
        function = reply_object(piece.get("function") or {}, "tool_calls.function")
        name = reply_text(function.get("name"), "tool_calls.function.name")
        arguments = function.get("arguments")
        if not isinstance(arguments, Mapping):
            arguments = reply_text(arguments, "tool_calls.function.arguments")
        slot = self._slots.get(index)
        call = self.calls.get(slot) if slot is not None else None
        fragment = {"id": call_id, "name": name, "arguments": arguments}
        if call is None or self._starts_another(call, index, fragment):
            if call is not None and not name:  # named by a repeat, if one came
                name = self._again.get(index, "")
            slot = self._slots[index] = len(self.calls)
            call = self.calls[slot] = {"id": "", "name": "", "arguments": ""}
            self._again.pop(index, None)
        elif (
            name == call["name"] != ""
            and not arguments
            and call_id in ("", call["id"])
            and _whole_object(call["arguments"])
        ):
            self._again[index] = name  # a repeat, or the next call's start
        call["id"] = call["id"] or call_id
        call["name"] = self._name_with(call["name"], name)
        if isinstance(arguments, Mapping):  # an object, as a whole reply's may be
            call["arguments"] = json.dumps(arguments, ensure_ascii=False)
            return
        call["arguments"] += arguments

    def _starts_another(
        self, call: dict[str, str], index: int | None, piece: dict[str, Any]
    ) -> bool:
        """Whether a fragment at `call`'s index begins another call.

        Its id other than the call's, with a name, begins one (servers that
        send each call whole at one index); the call's id repeated does not,
        nor another id without a name (the call keeps its first). Without
        ids, once the call's arguments are a whole JSON object (nothing can
        follow it in the same arguments), another name begins one, and so
        do more arguments that come with the call's name again, or after it.
        Any other fragment continues the call, as the same reply unstreamed
        would have it.
        """
        call_id, name, arguments = piece["id"], piece["name"], piece["arguments"]
        if call_id and call["id"]:
            return call_id != call["id"] and bool(name)
        more = isinstance(arguments, Mapping) or bool(arguments.strip())
        other = bool(name) and name != call["name"]
        again = (bool(name) and name == call["name"]) or index in self._again
        if not (other or (more and again)):
            return False
        return _whole_object(call["arguments"])

    def _name_with(self, name: str, piece: str) -> str:
        """A call's `name` so far with a fragment's `piece` of it taken in.

        A piece equal to the name so far repeats it (servers that send the
        whole name in every fragment), unless the two together name a tool
        the request offers and the name so far does not; any other piece
        continues it (servers that split the name).
        """
        if piece != name:
            return name + piece
        joined = name + piece
        if joined in self.tool_names and name not in self.tool_names:
            return joined
        return name

    def response(self) -> ModelResponse:
        """Return the whole reply, as `OpenAIModel.complete` would."""
        text = "".join(self.text)
        content: str | list[dict[str, Any]] = text
        if self.parts:  # as a whole reply's list of parts
            content = [{"type": "text", "text": text}] if text else []
            content += self.parts
        data = {
            "role": "assistant",
            "content": content,
            "refusal": "".join(self.refusal),
            "tool_calls": [
                {
                    "id": call["id"],
                    "type": "function",
                    "function": {"name": call["name"], "arguments": call["arguments"]},
                }
                for _, call in sorted(self.calls.items())
            ],
        }
        return ModelResponse(
            message=_reply(data, self.usage),
            usage=self.usage,
            model=self.model,
            finish_reason=self.finish_reason,
        )


def _whole_object(arguments: str) -> bool:
    """Whether a call's `arguments` so far are a whole JSON object."""
    text = arguments.strip()
    if not text.endswith("}"):  # most pieces: no need to parse
        return False
    try:
        return isinstance(json.loads(text), dict)
    except (ValueError, RecursionError):
        return False


def _reply(data: Mapping[str, Any], usage: Usage | None) -> Message:
    """Read a reply's assistant message, mending what some servers leave out.

    Raises:
        ProviderError: the message is a refusal (kind ``content_filter``,
            with the reply's `usage`: it was billed), or of the wrong shape
            (kind ``bad_response``).
    """
    _check_refusal(data, usage)
    message = dict(data, role="assistant")
    if message.get("content") == "":  # servers send "" beside tool calls
        message["content"] = None
    calls = reply_list(message.get("tool_calls"), "tool_calls")
    message["tool_calls"] = [
        _with_name(given_call_id(reply_object(c, f"tool_calls[{i}]"), "call_"))
        for i, c in enumerate(calls)
    ]
    try:
        return from_openai_messages([message])[0]
    except InvalidMessage as exc:
        raise ProviderError(f"unreadable reply: {exc}", kind=BAD_RESPONSE) from exc


def _check_refusal(message: Mapping[str, Any], usage: Usage | None) -> None:
    """Raise the error of a reply that is a refusal, if it is one.

    OpenAI says that the model refused (a structured answer, a call it
    will not give) in the message's ``refusal``, streamed or not, with the
    finish reason ``stop``: what it says is no answer. As Anthropic's
    ``refusal`` stop reason, it is kind ``content_filter``, not retried
    (asked again, the model refuses again), quoting the refusal.
    """
    refusal = reply_text(message.get("refusal"), "message.refusal")
    if not refusal.strip():
        return
    said = refusal if len(refusal) <= 200 else refusal[:197] + "..."
    raise ProviderError(
        f"the API refused to answer (the reply's refusal: {said!r}); the reply "
        "is not kept: rephrase the request, or use another model",
        kind=CONTENT_FILTER,
        usage=usage,
    )


def _with_name(call: dict[str, Any]) -> dict[str, Any]:
    """`call` with a name (`named_call`) if its function is an object."""
    function = call.get("function")
    if isinstance(function, Mapping):
        call["function"] = dict(function, name=named_call(function.get("name")))
    return call


def _whole_reply(reply: object) -> ModelResponse:
    """Read a whole chat completion (an SDK model or its JSON data)."""
    # The SDK builds its models unchecked, and servers send shapes they
    # do not expect (a list as content): read the reply as JSON data and
    # check it here; the converter checks the message.
    data = reply_object(reply, "the reply")
    choices = reply_list(data.get("choices"), "choices")
    if not choices:
        raise _no_choices(data.get("error"))
    choice = reply_object(choices[0], "choices[0]")
    message = reply_object(choice.get("message"), "choices[0].message")
    finish = reply_text(choice.get("finish_reason"), "choices[0].finish_reason")
    usage = _usage(data.get("usage"))
    return _said(
        ModelResponse(
            message=_reply(message, usage),
            usage=usage,
            model=reply_text(data.get("model"), "model") or None,
            finish_reason=finish or None,
        )
    )


def _said(response: ModelResponse) -> ModelResponse:
    """Return a whole reply (a body, or a stream that came to its end).

    Whole, a reply that does not say why it ended is still the reply (some
    compatible servers send no finish_reason); finish_reason None says so.

    Raises:
        ProviderError: the reply holds nothing and no finish_reason: no
            reply, not an empty one (an empty answer says ``stop``), kind
            ``bad_response``.
    """
    if response.finish_reason is None and not response.message.parts:
        raise ProviderError(
            "unreadable reply: the reply has no content, no tool call and "
            "no finish_reason",
            kind=BAD_RESPONSE,
        )
    return response


def _no_choices(error: object) -> ProviderError:
    """The error of a reply with no choices, quoting the error it has instead.

    Some servers answer a refused request with status 200 and an ``error``
    object: a context-length refusal among them is an overflow (the run
    compacts and retries), as it would be with its proper status. One whose
    ``code`` is an HTTP error status (a router's upstream failing after it
    answered 200) is classified by that status: a 429 or a 5xx is retried.
    """
    said = error.get("message") if isinstance(error, Mapping) else error
    if not isinstance(said, str) or not said.strip():
        return ProviderError("the reply has no choices", kind=BAD_RESPONSE)
    said = said if len(said) <= 500 else said[:497] + "..."
    if mentions_overflow(said):
        return ProviderError(said, kind=CONTEXT_OVERFLOW)
    code = error.get("code") if isinstance(error, Mapping) else None
    if (
        isinstance(code, int)
        and _checks.is_int(code)
        and (code in (408, 409, 429) or 500 <= code <= 599)
    ):
        return from_status(code, said, overflow=False, key_hint=_KEY_HINT)
    return ProviderError(
        f"the reply has no choices; the server said: {said}", kind=BAD_RESPONSE
    )


def _usage(value: object) -> Usage | None:
    """Return a reply's `Usage` (None if it has none).

    The prompt tokens the prompt cache served
    (``prompt_tokens_details.cached_tokens``) are a part of the prompt's:
    `Usage.cache_read_tokens`.
    """
    if value is None:
        return None
    usage = reply_object(value, "usage")
    prompt = reply_tokens(usage.get("prompt_tokens"), "usage.prompt_tokens")
    details = usage.get("prompt_tokens_details")
    cached = 0
    if details is not None:
        where = "usage.prompt_tokens_details"
        cached = reply_tokens(
            reply_object(details, where).get("cached_tokens"), f"{where}.cached_tokens"
        )
        if cached > prompt:
            raise unreadable_field(
                f"{where}.cached_tokens",
                cached,
                f"at most usage.prompt_tokens ({prompt}): the cached tokens "
                "are a part of the prompt's",
            )
    return Usage(
        input_tokens=prompt,
        output_tokens=reply_tokens(
            usage.get("completion_tokens"), "usage.completion_tokens"
        ),
        cache_read_tokens=cached,
    )


@contextlib.contextmanager
def _translated(setting: str, read: str = "the body") -> Iterator[None]:
    """Translate the SDK's API errors and unreadable bodies; bugs pass unchanged.

    A timeout names the `setting` that bounds the wait (`timeout_setting`);
    JSON that cannot be read is named as `read` (``"a streamed event"``).
    """
    try:
        yield
    except openai.APIError as exc:
        raise with_setting(classify_openai_error(exc), setting) from exc
    except (json.JSONDecodeError, RecursionError) as exc:  # the SDK's json.loads
        raise unreadable_body_error(exc, read) from exc


_DROPPED: Final = (openai.APITimeoutError, openai.APIConnectionError)
"""The SDK's timeout, then its connection error: what `broken_off` tells apart."""


def _where(exc: openai.APIError) -> str:
    """Name what was called: the OpenAI API, or the server at its URL."""
    return _named(request_url(exc))


def _named(url: Any) -> str:
    """Name the API at `url` (an httpx URL): the OpenAI API, or the server."""
    return named_server(url, "api.openai.com", "the OpenAI API")


_NO_JSON_SCHEMA: Final = re.compile(
    # llama-cpp-python (its validation error) | llama.cpp's own, in older builds
    r"'loc': \('body', 'response_format', 'type'\).*'input': 'json_schema'"
    r"|response_format type must be one of .* but got: json_schema",
    re.DOTALL,
)
"""A server's refusal of a ``json_schema`` response format, in its words."""

_UNREADABLE_BODY: Final = re.compile(r"\d+ validation errors?:\n.*'loc': \('body'")
"""llama-cpp-python's words for a request body it cannot read."""

_JSON_OBJECT_FIX: Final = (
    "the server takes no response_format of type json_schema; llama.cpp's "
    'servers read the JSON schema of a structured answer as {"type": '
    '"json_object", "schema": ...}, which OpenAIModel(..., '
    'structured_output="json_object") sends'
)


def _unreadable_request(status: int, message: str) -> ProviderError | None:
    """The error of a request the server refused as unreadable, sent as a 5xx.

    Such a 5xx repeats whatever the wait, so it is not retried. llama.cpp's
    servers answer a ``json_schema`` response format they do not take with
    HTTP 500 (a structured answer needs ``structured_output="json_object"``,
    which the error names), and llama-cpp-python's answers any request body
    it cannot read so (FastAPI's validation error, a 422 elsewhere). None:
    not such a refusal.
    """
    if status < 500:
        return None
    said = message.split("\n\n  File ")[0]  # the server's trace left out
    if _NO_JSON_SCHEMA.search(said):
        said = f"{said} - {_JSON_OBJECT_FIX}"
    elif not _UNREADABLE_BODY.match(said):
        return None
    return ProviderError(f"HTTP {status}: {said}", kind=BAD_REQUEST, status=status)


def classify_openai_error(exc: openai.APIError) -> ProviderError:
    """Return the `ProviderError` for an OpenAI SDK error (see ``_errors``).

    A context overflow is ``code == "context_length_exceeded"`` (OpenAI,
    llama-cpp-python) or an error text naming the maximum context length
    (vLLM, llama.cpp); an exhausted quota (a 429 with code
    ``insufficient_quota``) is not retried, nor is a 5xx that refuses the
    request as unreadable (it would repeat: see `_unreadable_request`).
    """
    where = _where(exc)
    if isinstance(exc, openai.APITimeoutError):
        return timeout_error(f"{where} timed out: {exc.message}")
    if isinstance(exc, openai.APIConnectionError):
        return lost_connection(exc, where)
    body: Mapping[str, object] = exc.body if isinstance(exc.body, Mapping) else {}
    raw_message = body.get("message")
    message = raw_message if isinstance(raw_message, str) else exc.message
    page = page_text(exc.body) if isinstance(exc.body, str) else ""
    if page:  # the body is no JSON: a proxy's page, a server's own text
        message = f"{message} - {page}"
    status = exc.status_code if isinstance(exc, openai.APIStatusError) else None
    if status == 404 and not isinstance(raw_message, str):
        usual = "an OpenAI-compatible server's usually ends in /v1, e.g. http://127.0.0.1:8080/v1"
        message = f"{message} - {not_served(request_url(exc), usual)}"
    kind = body.get("type")
    overflow = exc.code == "context_length_exceeded" or mentions_overflow(
        message, kind if isinstance(kind, str) else None
    )
    if isinstance(exc, openai.APIResponseValidationError):
        return ProviderError(
            f"unreadable reply: {message}", kind=BAD_RESPONSE, status=exc.status_code
        )
    if isinstance(exc, openai.APIStatusError):
        if exc.code == "insufficient_quota":
            return ProviderError(
                f"HTTP {exc.status_code}: {message}", kind=QUOTA, status=exc.status_code
            )
        if refused := _unreadable_request(exc.status_code, message):
            return refused
        return from_status(
            exc.status_code,
            message,
            overflow=overflow,
            key_hint=_KEY_HINT,
            headers=exc.response.headers,
        )
    # An error event inside a stream: the server failed mid-reply.
    if overflow:
        return ProviderError(message, kind=CONTEXT_OVERFLOW)
    return ProviderError(message, retryable=True, kind=SERVER)
