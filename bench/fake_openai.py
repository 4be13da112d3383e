"""An instant OpenAI-compatible Chat Completions server playing the concurrency script.

The peers' bench (`bench.temporal_peers`) points turnfsm and the OpenAI
Agents SDK at the same model server: this one. It answers
``POST /v1/chat/completions`` at once with the reply `bench.concurrency`'s
script gives (a ``work`` tool call per step, then the final answer), read
from the request's JSON alone: the session's tag from the first user
message, the step from the last tool result's call id. It keeps no state,
so any number of sessions and clients share it. Standard library only:
either side's Python runs it.

    python -m bench.fake_openai --turns 20      # prints "port N", serves until killed
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import re
import sys
from typing import Any

_STEP = re.compile(r"-c(\d+)$")
_TAG = re.compile(r"^\[([^\]]+)\]")
_ids = itertools.count()


def _text(content: Any) -> str:
    """A message's text: a string, or the text parts of a list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def script(body: dict[str, Any], turns: int) -> dict[str, Any]:
    """The chat completion answering `body` (the concurrency bench's script)."""
    messages = body["messages"]
    user = next(m for m in messages if m["role"] == "user")
    found = _TAG.match(_text(user["content"]))
    tag = found.group(1) if found else "?"
    results = [m for m in messages if m["role"] == "tool"]
    step = 0
    if results:
        last = _STEP.search(results[-1].get("tool_call_id", ""))
        step = int(last.group(1)) + 1 if last else len(results)
    message: dict[str, Any]
    if step >= turns - 1:
        message = {"role": "assistant", "content": f"[{tag}] done after {step} steps"}
    else:
        arguments = json.dumps({"step": step, "tag": tag}, separators=(",", ":"))
        message = {
            "role": "assistant",
            "content": f"[{tag}] step {step}",
            "tool_calls": [
                {
                    "id": f"{tag}-c{step}",
                    "type": "function",
                    "function": {"name": "work", "arguments": arguments},
                }
            ],
        }
    prompt = sum(len(_text(m.get("content"))) for m in messages) // 4 + 1
    return {
        "id": f"chatcmpl-{next(_ids)}",
        "object": "chat.completion",
        "created": 0,
        "model": body.get("model", "fake"),
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if "tool_calls" in message else "stop",
            }
        ],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": 12,
            "total_tokens": prompt + 12,
        },
    }


async def _serve_one(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, turns: int
) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            length = 0
            for line in lines[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value.strip())
            raw = await reader.readexactly(length) if length else b""
            path = lines[0].split(" ")[1] if " " in lines[0] else ""
            if path.endswith("/chat/completions"):
                status, payload = "200 OK", script(json.loads(raw), turns)
            else:
                status, payload = "404 Not Found", {"error": {"message": path}}
            data = json.dumps(payload).encode()
            writer.write(
                f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\n"
                f"content-length: {len(data)}\r\n\r\n".encode()
                + data
            )
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def serve(turns: int, port: int) -> None:
    """Serve on 127.0.0.1:`port` (0: a free one, printed) until killed."""
    server = await asyncio.start_server(
        lambda r, w: _serve_one(r, w, turns), "127.0.0.1", port, backlog=4096
    )
    print(f"port {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    asyncio.run(serve(args.turns, args.port))


if __name__ == "__main__":
    main(sys.argv[1:])
