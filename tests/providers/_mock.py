"""A scripted HTTP server for the provider tests: real SDKs, no network.

`Server` is an `httpx2.MockTransport` handler: it answers each request with
the next scripted reply (the last one repeats) and keeps every request body,
so a test can check what the SDK sent.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import httpx2

Reply = httpx2.Response | Callable[[httpx2.Request], httpx2.Response] | BaseException


class Server:
    """Answers requests from a script and records their JSON bodies."""

    def __init__(self, *replies: Reply) -> None:
        self.replies = list(replies)
        self.requests: list[httpx2.Request] = []

    @property
    def bodies(self) -> list[dict[str, Any]]:
        return [json.loads(r.content) for r in self.requests]

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        self.requests.append(request)
        reply = self.replies.pop(0) if len(self.replies) > 1 else self.replies[0]
        if isinstance(reply, BaseException):
            raise reply
        if callable(reply):
            return reply(request)
        return reply

    def http_client(self) -> httpx2.AsyncClient:
        return httpx2.AsyncClient(transport=httpx2.MockTransport(self))


def json_reply(
    body: Mapping[str, Any], status: int = 200, headers: Mapping[str, str] = {}
) -> httpx2.Response:
    return httpx2.Response(status, json=body, headers=dict(headers))


# Bodies sent as JSON that the SDKs cannot parse, and what the error says.
UNPARSABLE_BODIES = {
    "html page": (b"<html>oops</html>", "is not JSON"),
    "too deep": (b"[" * 100_000 + b"]" * 100_000, "nested too deep"),
}


def raw_json_reply(body: bytes) -> httpx2.Response:
    return httpx2.Response(
        200, content=body, headers={"content-type": "application/json"}
    )


def json_cut_short(error: Exception) -> httpx2.Response:
    """A JSON body (not an event stream) whose reading fails with `error`."""

    async def body() -> Any:
        yield b'{"id": "r", "choices": ['
        raise error

    return httpx2.Response(
        200, content=body(), headers={"content-type": "application/json"}
    )


def timeout(request: httpx2.Request) -> httpx2.Response:
    raise httpx2.ReadTimeout("the read timed out", request=request)


def refused(request: httpx2.Request) -> httpx2.Response:
    raise httpx2.ConnectError("connection refused", request=request)


# -- OpenAI ---------------------------------------------------------------


def openai_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


def openai_reply(
    content: str | None = None,
    *calls: dict[str, Any],
    usage: tuple[int, int] | None = (12, 3),
) -> httpx2.Response:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = list(calls)
    body: dict[str, Any] = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "gpt-test",
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if calls else "stop",
            }
        ],
    }
    if usage is not None:
        body["usage"] = {
            "prompt_tokens": usage[0],
            "completion_tokens": usage[1],
            "total_tokens": sum(usage),
        }
    return json_reply(body)


def openai_chunk(
    delta: dict[str, Any] | None = None, usage: tuple[int, int] | None = None
) -> dict[str, Any]:
    chunk: dict[str, Any] = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "gpt-test",
        "choices": []
        if delta is None
        else [{"index": 0, "delta": delta, "finish_reason": None}],
    }
    if usage is not None:
        chunk["usage"] = {
            "prompt_tokens": usage[0],
            "completion_tokens": usage[1],
            "total_tokens": sum(usage),
        }
    return chunk


def openai_sse(
    chunks: Iterable[dict[str, Any]], finish: str | None = "as OpenAI"
) -> httpx2.Response:
    """`chunks` as an event stream, ending in ``[DONE]``.

    A stream none of whose chunks says why the reply ended gets the chunk
    OpenAI sends for it, before the trailing chunks without choices (the
    usage): `finish`, by default ``tool_calls`` after a call, else
    ``stop``; None sends none.
    """
    chunks = list(chunks)
    chosen = any(c.get("choices") for c in chunks)
    if finish is not None and chosen and not any(_finish_of(c) for c in chunks):
        if finish == "as OpenAI":
            called = any(
                c.get("delta", {}).get("tool_calls")
                for chunk in chunks
                for c in chunk.get("choices") or []
            )
            finish = "tool_calls" if called else "stop"
        at = len(chunks)
        while at and not chunks[at - 1].get("choices") and chunks[at - 1].get("usage"):
            at -= 1
        last = openai_chunk({})
        last["choices"][0]["finish_reason"] = finish
        chunks.insert(at, last)
    text = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
    return httpx2.Response(
        200, content=text.encode(), headers={"content-type": "text/event-stream"}
    )


def _finish_of(chunk: dict[str, Any]) -> object:
    return any(c.get("finish_reason") for c in chunk.get("choices") or [])


# -- Anthropic --------------------------------------------------------------


def anthropic_reply(
    *blocks: dict[str, Any], usage: tuple[int, int] = (12, 3)
) -> httpx2.Response:
    has_calls = any(b["type"] == "tool_use" for b in blocks)
    return json_reply(
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "claude-test",
            "content": list(blocks),
            "stop_reason": "tool_use" if has_calls else "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": usage[0], "output_tokens": usage[1]},
        }
    )


def text_block(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def tool_use(call_id: str, name: str, **arguments: Any) -> dict[str, Any]:
    return {"type": "tool_use", "id": call_id, "name": name, "input": arguments}


def anthropic_error(status: int, kind: str, message: str, **headers: str) -> Reply:
    body = {"type": "error", "error": {"type": kind, "message": message}}
    return json_reply(
        body, status, {k.replace("_", "-"): v for k, v in headers.items()}
    )


def anthropic_sse(events: Iterable[tuple[str, dict[str, Any]]]) -> httpx2.Response:
    text = "".join(f"event: {e}\ndata: {json.dumps(d)}\n\n" for e, d in events)
    return httpx2.Response(
        200, content=text.encode(), headers={"content-type": "text/event-stream"}
    )
