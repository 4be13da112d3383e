"""A real local server's Retry-After against the retry policy's time budget."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator

import pytest

from turnfsm import Agent, RetryPolicy
from turnfsm.errors import ProviderError
from turnfsm.providers._openai import OpenAIModel

pytestmark = pytest.mark.anyio


class _RateLimited(http.server.BaseHTTPRequestHandler):
    """Answers every POST with a 429 asking to wait `wait` seconds."""

    wait = "600"
    posts = 0

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        type(self).posts += 1
        data = json.dumps(
            {"error": {"message": "Rate limit reached", "type": "rate_limit"}}
        ).encode()
        self.send_response(429)
        self.send_header("Retry-After", self.wait)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # no /props: not a llama.cpp server
        self.send_error(404)

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[tuple[str, type[_RateLimited]]]:
    handler = type("Handler", (_RateLimited,), {})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", handler
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


async def test_a_retry_after_past_the_budget_fails_the_run_without_calling_again(
    server: tuple[str, type[_RateLimited]],
) -> None:
    url, handler = server
    model = OpenAIModel("m", base_url=f"{url}/v1", api_key="k", timeout=10)
    agent = Agent(model=model, retry=RetryPolicy(max_attempts=4, max_total=30))
    result = await agent.run("hi")
    assert handler.posts == 1
    error = result.error
    assert isinstance(error, ProviderError)
    assert (error.kind, error.status, error.attempts) == ("rate_limit", 429, 1)
    assert "the provider asked to wait 600 s before trying again" in str(error)
    assert "RetryPolicy.max_total=30 s (raise it to wait)" in str(error)
