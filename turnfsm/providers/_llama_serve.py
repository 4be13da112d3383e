"""``python -m turnfsm.providers._llama_serve``: llama.cpp's server, with tools.

Registers the ``turnfsm-tools`` chat format (see `_llama_chat`) in
llama-cpp-python, then runs its OpenAI-compatible server with the same
arguments as ``python -m llama_cpp.server``. `LlamaServer` starts it; this
module is imported only in that process (it loads llama.cpp).

With tools offered and ``tool_choice`` not ``"none"``, a reply is made in two
grammar-constrained steps (llama.cpp's GBNF grammars): the choice of a tool or
of a text answer (``"auto"``; a named tool is forced, ``"required"`` picks
among the tools, and takes the only one without asking the model), then the
call's arguments under the tool's JSON-schema grammar, or the text. Replies
are never longer than ``max_tokens``.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NotRequired

from turnfsm.providers._llama_chat import (
    CHAT_FORMAT,
    STOP,
    call_prefix,
    choice_grammar,
    chosen_tool,
    message_prefix,
    render_prompt,
    tool_names,
)

__all__ = ["PARENT_ENV", "serve", "tool_chat_handler", "watch_parent"]

PARENT_ENV = "TURNFSM_LLAMA_PARENT"
"""The environment variable `LlamaServer` sets to its own process id."""

_SAMPLING = (
    "top_p",
    "top_k",
    "min_p",
    "typical_p",
    "presence_penalty",
    "frequency_penalty",
    "repeat_penalty",
    "seed",
)


def _grammar(text: str) -> Any:
    from llama_cpp import llama_grammar

    return llama_grammar.LlamaGrammar.from_string(text, verbose=False)


def _schema_grammar(schema: object) -> Any:
    from llama_cpp import llama_grammar

    if not schema:
        return _grammar(llama_grammar.JSON_GBNF)
    try:
        return llama_grammar.LlamaGrammar.from_json_schema(
            json.dumps(schema), verbose=False
        )
    except Exception:  # a schema llama.cpp cannot compile: any JSON
        return _grammar(llama_grammar.JSON_GBNF)


def _response(
    text: str | None,
    calls: list[dict[str, Any]],
    usage: Mapping[str, int],
    model: str,
    finish: str,
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = calls
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {"index": 0, "message": message, "finish_reason": finish, "logprobs": None}
        ],
        "usage": dict(usage),
    }


def _stream(response: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """One reply as stream chunks: its content and calls, then its finish."""
    choice = response["choices"][0]
    message = choice["message"]
    delta: dict[str, Any] = {"role": "assistant", "content": message["content"]}
    if "tool_calls" in message:
        delta["tool_calls"] = [
            {"index": i, **call} for i, call in enumerate(message["tool_calls"])
        ]
    base = {k: response[k] for k in ("id", "created", "model")}
    base["object"] = "chat.completion.chunk"
    yield {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
    yield {
        **base,
        "choices": [
            {"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}
        ],
        "usage": response["usage"],
    }


def tool_chat_handler(
    llama: Any,
    messages: Sequence[Mapping[str, object]],
    tools: Sequence[Mapping[str, object]] | None = None,
    tool_choice: object = None,
    temperature: float = 0.2,
    max_tokens: int | None = None,
    stream: bool = False,
    stop: str | list[str] | None = None,
    response_format: Mapping[str, Any] | None = None,
    grammar: Any = None,
    **kwargs: Any,
) -> Any:
    """Answer a chat request in the ``turnfsm-tools`` format (see module doc)."""
    sampling = {k: kwargs[k] for k in _SAMPLING if kwargs.get(k) is not None}
    stops = [STOP, *([stop] if isinstance(stop, str) else (stop or []))]
    offered = list(tools or []) if tool_choice != "none" else []
    prompt = render_prompt(messages, offered)
    used = {"prompt_tokens": 0, "completion_tokens": 0}
    ended = ["stop"]  # the last completion's finish reason

    def complete(text: str, **options: Any) -> str:
        out: Any = llama.create_completion(prompt=text, stream=False, **options)
        used["prompt_tokens"] = max(
            used["prompt_tokens"], out["usage"]["prompt_tokens"]
        )
        # The reply's own tokens: the choice between a call and a message is
        # a step of this format's, not part of the reply (a reply reported
        # longer than it is would read as one its budget, not the window,
        # cut off).
        used["completion_tokens"] = out["usage"]["completion_tokens"]
        ended[0] = str(out["choices"][0].get("finish_reason") or "stop")
        return str(out["choices"][0]["text"])

    name: str | None = None
    if offered:
        names = tool_names(offered)
        forced = tool_choice if isinstance(tool_choice, Mapping) else None
        if forced is not None:
            name = str(forced.get("function", {}).get("name", ""))
        elif tool_choice == "required" and len(names) == 1:
            name = names[0]  # the only choice: no completion needed to make it
        else:
            choice = complete(
                prompt,
                temperature=0.0,
                max_tokens=16,
                grammar=_grammar(
                    choice_grammar(names, allow_message=tool_choice != "required")
                ),
            )
            name = chosen_tool(choice)
    if name is not None:
        tool = next((t for t in offered if tool_names([t]) == [name]), None)
        if tool is None:
            raise ValueError(f"tool_choice names {name!r}, which is not in tools")
        arguments = complete(
            prompt + call_prefix(name),
            temperature=temperature,
            max_tokens=max_tokens,
            stop=stops,
            grammar=_schema_grammar(tool.get("function", {}).get("parameters", {})),  # type: ignore[attr-defined]
            **sampling,
        )
        call = {
            "id": f"call_{uuid.uuid4().hex[:24]}",
            "type": "function",
            "function": {"name": name, "arguments": arguments},
        }
        # Arguments cut off (by the budget, or by the window) say so: the
        # driver then never runs a call that broke off.
        finish = "length" if ended[0] == "length" else "tool_calls"
        text, calls = None, [call]
    else:
        if response_format is not None and response_format.get("type") == "json_object":
            grammar = _schema_grammar(response_format.get("schema"))
        text = complete(
            prompt + (message_prefix() if offered else ""),
            temperature=temperature,
            max_tokens=max_tokens,
            stop=stops,
            grammar=grammar,
            **sampling,
        )
        calls, finish = [], ended[0]
    usage = {**used, "total_tokens": used["prompt_tokens"] + used["completion_tokens"]}
    response = _response(text, calls, usage, str(llama.model_path), finish)
    return _stream(response) if stream else response


def watch_parent(
    parent: int, gone: Callable[[], None], *, interval: float = 1.0
) -> threading.Thread:
    """Call `gone` once the process `parent` is no longer this one's parent.

    The server runs in a session of its own, so a signal that kills the
    process that started it (SIGKILL, SIGTERM on a script with no handler,
    a crash) does not reach it: without this it would run on, holding its
    port and memory, with no one left to stop it. Checked every `interval`
    seconds from a daemon thread, which is returned (started).
    """

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(interval)
        gone()

    thread = threading.Thread(target=watch, name="turnfsm-parent-watch", daemon=True)
    thread.start()
    return thread


def _stop_now() -> None:
    """End this server: SIGTERM to itself, and a hard exit 10 s later."""
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(10)
    os._exit(1)


def serve() -> None:
    """Register the ``turnfsm-tools`` format, then run llama.cpp's server.

    With ``TURNFSM_LLAMA_PARENT`` set to a process id (`LlamaServer` sets
    its own), the server stops when that process is gone.
    """
    parent = os.environ.get(PARENT_ENV, "")
    if parent.isdigit():
        watch_parent(int(parent), _stop_now)
    from llama_cpp import llama_chat_format, llama_types

    # OpenAI's API takes ``"content": null`` on an assistant message that only
    # calls tools (turnfsm sends it so); the server's request model wants a
    # string there. Loosened before the server's models are built (on import).
    llama_types.ChatCompletionRequestAssistantMessage.__annotations__["content"] = (
        NotRequired[str | None]
    )
    register: Any = llama_chat_format.register_chat_completion_handler
    register(CHAT_FORMAT)(tool_chat_handler)
    from llama_cpp.server import __main__ as server

    run: Any = server.main
    run()


if __name__ == "__main__":
    serve()
