"""`turnfsm.hooks.ConsoleHook`: a run printed as it happens, for your own agent."""

from __future__ import annotations

import http.server
import io
import json
import socket
import sys

import anyio
import pytest

from tests.helpers import http_server
from turnfsm import Agent, ContextManager, RetryPolicy
from turnfsm.hooks import ConsoleHook
from turnfsm.messages import Message
from turnfsm.providers import ModelRequest, ModelResponse, OpenAIModel
from turnfsm.testing import ScriptedModel, reply, tool_call
from turnfsm.tokens import HeuristicTokenCounter


def lookup(city: str, days: int = 1) -> str:
    """Look the weather up.

    Args:
        city: where.
        days: how many days.
    """
    return f"{city}: sunny for {days} day(s)"


def broken(city: str) -> str:
    """Fail.

    Args:
        city: where.
    """
    raise RuntimeError("down")


def _agent(
    out: io.StringIO, *, replies: bool, live: bool | None = None, strict: bool = False
) -> Agent:
    return Agent(
        model=ScriptedModel.of(
            reply("", tool_call("lookup", "c1", city="Oslo", days=2)),
            reply("", tool_call("broken", "c2", city="Rome")),
            "Sunny in Oslo.",
        ),
        tools=[lookup, broken],
        context=ContextManager(context_window=10_000, counter=HeuristicTokenCounter()),
        hooks=[ConsoleHook(out, replies=replies, live=live)],
        strict_hooks=strict,
    )


@pytest.mark.parametrize("replies", [True, False])
def test_piped_it_prints_tool_names_arguments_and_results(replies: bool) -> None:
    out = io.StringIO()
    result = _agent(out, replies=replies).run_sync("Weather?")
    assert result.ok
    lines = out.getvalue().splitlines()
    assert '[tool] lookup({"city": "Oslo", "days": 2})' in lines
    assert "[tool] lookup -> 24 characters" in lines
    assert '[tool] broken({"city": "Rome"})' in lines
    # It printed "[tool] broken -> 44 characters (an error result)": not why.
    assert "[tool] broken -> error: tool 'broken' failed: RuntimeError: down" in lines
    assert "  call_llm --model_replied--> done" in lines
    measures = [line for line in lines if line.startswith("[measure] request = ")]
    assert len(measures) == 3
    assert measures[0].endswith(
        "tokens (estimated), threshold line 8000, emergency line 9500, window 10000"
    )
    assert lines.count("Sunny in Oslo.") == (1 if replies else 0)
    assert "\x1b" not in out.getvalue()  # not a terminal: no status line


def test_live_on_a_stream_that_is_no_terminal_prints_the_same_lines() -> None:
    plain, live = io.StringIO(), io.StringIO()
    _agent(plain, replies=True).run_sync("Weather?")
    _agent(live, replies=True, live=True).run_sync("Weather?")
    assert live.getvalue().splitlines() == plain.getvalue().splitlines()


def test_it_is_exported_where_hooks_are() -> None:
    import turnfsm.hooks

    assert "ConsoleHook" in turnfsm.hooks.__all__


async def slow(city: str) -> str:
    """Take a long time.

    Args:
        city: where.
    """
    await anyio.sleep(30)
    return city


def test_a_tool_call_cut_short_is_said_to_be_interrupted() -> None:
    out = io.StringIO()
    agent = Agent(
        model=ScriptedModel.of(reply("", tool_call("slow", "c1", city="Oslo"))),
        tools=[slow],
        hooks=[ConsoleHook(out)],
    )

    async def cut_short() -> None:
        with anyio.move_on_after(0.5):  # as Ctrl-C cancels `turnfsm run`
            await agent.run("Weather?")

    anyio.run(cut_short)

    assert "[tool] slow interrupted" in out.getvalue().splitlines()
    assert "CancelledError" not in out.getvalue()


class _Flaky(http.server.BaseHTTPRequestHandler):
    """A model server whose first stream breaks off, whose second answer is 429."""

    protocol_version = "HTTP/1.1"
    posts = 0

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        type(self).posts += 1
        if self.posts == 2:
            body = b'{"error": {"message": "slow down"}}'
            self.send_response(429)
            self.send_header("Retry-After", "0")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        text = "hel" if self.posts == 1 else "hello"
        chunk = {"id": "x", "object": "chat.completion.chunk", "model": "m"}
        finish = None if self.posts == 1 else "stop"  # the whole reply ends so
        delta = {"content": text}
        chunk["choices"] = [{"index": 0, "delta": delta, "finish_reason": finish}]
        data = f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n".encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        # The first stream promises more than it sends, then breaks off.
        size = len(data) + (1000 if self.posts == 1 else 0)
        self.send_header("Content-Length", str(size))
        self.end_headers()
        if self.posts == 1:
            data = data[: data.index(b"\n\n") + 2]
        self.wfile.write(data)
        self.wfile.flush()
        if self.posts == 1:
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)

    def do_GET(self) -> None:  # no /props: not a llama.cpp server
        self.send_error(404)

    def log_message(self, *_args: object) -> None:
        pass


def test_a_retried_stream_starts_on_a_line_of_its_own_after_the_failure() -> None:
    with http_server(_Flaky) as (server, _):
        out = io.StringIO()
        agent = Agent(
            model=OpenAIModel("m", base_url=f"{server}/v1", api_key="k", timeout=10),
            context=ContextManager(context_window=8_000),
            retry=RetryPolicy(initial_wait=0.01, jitter=False),
            hooks=[ConsoleHook(out, replies=True)],
        )
        result = agent.run_sync("hi")
    assert result.ok, result.error
    lines = out.getvalue().splitlines()
    start = lines.index("[call_llm] CallLLM")
    assert lines[start + 1] == "hel"  # what the broken stream had sent
    assert lines[start + 2].startswith("[model] attempt 1 failed: [connection] ")
    assert lines[start + 3].startswith("[model] attempt 2, ")
    assert lines[start + 4] == (
        "[model] attempt 2 failed: [rate_limit] HTTP 429: slow down"
    )
    assert lines[start + 5].startswith("[model] attempt 3, ")
    assert lines[start + 6] == "hello"


class _HeadOne(io.StringIO):
    """A pipe whose reader took one line and went away (``| head -1``)."""

    def write(self, text: str) -> int:
        if "\n" in self.getvalue():
            raise BrokenPipeError(32, "Broken pipe")
        return super().write(text)


@pytest.mark.parametrize("replies", [True, False])
def test_a_reader_gone_stops_the_printing_not_the_run(replies: bool) -> None:
    # `turnfsm run ... | head -1`: the hook raised BrokenPipeError, was
    # detached with a traceback on stderr, and a strict one failed the run.
    out = _HeadOne()
    agent = _agent(out, replies=replies, strict=True)

    result = agent.run_sync("Weather?")

    assert result.ok, result.error
    assert result.text == "Sunny in Oslo."
    assert out.getvalue().count("\n") == 1


class _FullDisk(io.StringIO):
    """A file on a full disk (``> /dev/full``)."""

    def write(self, text: str) -> int:
        raise OSError(28, "No space left on device")


def test_a_stream_that_fails_or_is_closed_stops_the_printing_not_the_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # ENOSPC raised out of the hook; with stdout closed (`>&-`, sys.stdout
    # is None) a streamed reply raised AttributeError. Each was logged with
    # its traceback as the hook was detached.
    result = _agent(_FullDisk(), replies=True, strict=True).run_sync("Weather?")
    assert result.ok, result.error

    monkeypatch.setattr(sys, "stdout", None)
    hook = ConsoleHook(replies=True)
    agent = Agent(
        model=ScriptedModel.of("Sunny in Oslo."), hooks=[hook], strict_hooks=True
    )
    assert agent.run_sync("Weather?").ok


def test_an_error_result_is_printed_on_one_line_shortened() -> None:
    out = io.StringIO()
    agent = Agent(
        model=ScriptedModel.of(
            reply("", tool_call("lookup", "c1", town="Oslo", weeks="many" * 40)),
            "done",
        ),
        tools=[lookup],
        hooks=[ConsoleHook(out)],
    )
    assert agent.run_sync("Weather?").ok
    (line,) = [
        x for x in out.getvalue().splitlines() if x.startswith("[tool] lookup ->")
    ]
    assert line.startswith(
        "[tool] lookup -> error: invalid arguments for tool 'lookup'; it did not "
        "run: - city: missing (required) - town: unexpected"
    )
    assert line.endswith("...")
    assert len(line) == len("[tool] lookup -> error: ") + 120


class _Terminal(io.StringIO):
    """A stream that says it is a terminal, so the live status line draws."""

    def isatty(self) -> bool:
        return True


def test_the_status_line_clock_runs_while_the_model_is_waited_on() -> None:
    # The seconds were computed only when a step happened: a model that
    # took minutes to answer showed "0 s" all along, as if nothing ran.
    class Slow:
        async def complete(self, request: ModelRequest) -> ModelResponse:
            await anyio.sleep(1.6)
            return ModelResponse(message=Message.assistant("Done."))

    out = _Terminal()
    agent = Agent(model=Slow(), hooks=[ConsoleHook(out, live=True)])
    assert agent.run_sync("Wait.").ok
    assert "call_llm | " in out.getvalue()
    assert "tool call(s) | 1 s" in out.getvalue()
