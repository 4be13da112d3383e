"""A parent delegates three large-file reads to a sub-agent on the real local model.

The child answers on the real llama.cpp server (Gemma 3 270M, a window of
``N_CTX`` tokens): each of its runs reads one file of about 300 tokens into
that window and the server writes the answer. The three files together do not
fit in the window. The parent is scripted: it calls the sub-agent three times
in one batch, then repeats the answers. Its first tool call per child is
scripted too (the tiny base model cannot be trusted to name the right file),
so what the test checks is the mechanics over real HTTP: three child sessions
linked to the parent's calls, each tool result is that child's final answer,
no request of the parent holds a line of any file, the parent never needs a
compaction pass, and the parent's ``children_usage`` is the usage the server
reported for the children. The figures printed are the real tokenizer's
counts of the files and of the parent's largest request.
"""

from __future__ import annotations

import json
import re
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from tests.integration._local import require_local_extra, threads
from turnfsm import Agent
from turnfsm.context import ContextManager
from turnfsm.driver import RetryPolicy, RunResult
from turnfsm.persistence import MemoryStore, Session, child_sessions, parent_of
from turnfsm.providers import ModelRequest, ModelResponse
from turnfsm.testing import FakeModelClient, reply, tool_call
from turnfsm.values import Usage

require_local_extra()

from turnfsm.providers import LlamaServer, OpenAIModel  # noqa: E402

pytestmark = [pytest.mark.local_model, pytest.mark.slow, pytest.mark.timeout(900)]

N_CTX = 768  # the child's window: one file fits, the three do not
ROWS = 15  # some 300 tokens a file
NAMES = ("north", "south", "east")
TOTALS = {"north": 120, "south": 45, "east": 7}


def ledger(name: str) -> str:
    """A ledger of some 300 tokens; every line names its file."""
    rows = [
        f"{name} ledger row {i}: {3 + i % 5} crates of pumps shipped, paid in full."
        for i in range(ROWS)
    ]
    rows.insert(ROWS // 2, f"total: {TOTALS[name]}")
    return "\n".join(rows) + "\n"


def read_file(path: str) -> str:
    """Read a text file.

    Args:
        path: The file to read.
    """
    return Path(path).read_text()


def token_count(server: LlamaServer, text: str) -> int:
    """How many tokens the served model's own tokenizer makes of `text`."""
    root = server.base_url.removesuffix("/v1")
    request = urllib.request.Request(
        f"{root}/extras/tokenize/count",
        data=json.dumps({"input": text}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return int(json.load(response)["count"])


def request_text(request: ModelRequest) -> str:
    """Everything a request holds, as text: system, messages, calls, results."""
    out = [request.system or ""]
    for m in request.messages:
        out.append(m.text)
        out.extend(p.content for p in m.tool_results)
        out.extend(json.dumps(c.arguments) for c in m.tool_calls)
    out.extend(json.dumps(t.parameters) + t.description for t in request.tools)
    return "\n".join(out)


@pytest.fixture(scope="module")
def server() -> Iterator[LlamaServer]:
    with LlamaServer(n_ctx=N_CTX, n_threads=threads()) as running:
        yield running


def lead_model() -> FakeModelClient:
    """Delegates the three reads at once, then repeats what each child said."""

    def answer(request: ModelRequest) -> ModelResponse:
        last = request.messages[-1]
        if last.tool_results:
            said = {
                p.call_id: p.content for m in request.messages for p in m.tool_results
            }
            message = reply("; ".join(f"{k}: {v}" for k, v in sorted(said.items())))
        else:
            calls = [
                tool_call(
                    "reader",
                    f"call_{name}",
                    task=f"Read {name}.txt and say the total it records.",
                )
                for name in NAMES
            ]
            message = reply("", *calls)
        return ModelResponse(message=message, usage=Usage(input_tokens=1))

    return FakeModelClient(answer)


def reader_model(local: OpenAIModel) -> FakeModelClient:
    """Reads the file the task names (scripted), then the real model answers."""

    async def answer(request: ModelRequest) -> ModelResponse:
        last = request.messages[-1]
        if last.tool_results:
            return await local.complete(request)  # real HTTP, real tokens
        path = re.search(r"\S+\.txt", last.text)
        assert path is not None, last.text
        return ModelResponse(message=reply("", tool_call("read_file", path=path[0])))

    return FakeModelClient(answer)


def test_the_parent_delegates_three_reads_and_its_window_never_holds_the_files(
    server: LlamaServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    for name in NAMES:
        Path(f"{name}.txt").write_text(ledger(name))
    store = MemoryStore()
    lead = lead_model()

    async def go() -> RunResult:
        local = OpenAIModel(
            model="local",
            base_url=server.base_url,
            context_window=server.context_window,
            temperature=0.0,
            tool_choice="none",  # its call is scripted: the model writes the answer
        )
        reader = Agent(
            model=reader_model(local),
            tools=[read_file],
            system_prompt="Answer in a few words.",
            context=ContextManager(context_window=server.context_window),
            max_output_tokens=16,
            max_turns=2,
            retry=RetryPolicy(max_attempts=1),
            model_timeout=300,
        )
        agent = Agent(
            model=lead,
            tools=[reader.as_tool(name="reader", description="Read a file, answer")],
            context=ContextManager(context_window=N_CTX),
            tool_timeout=600,  # three children, one after another on 2 CPUs
            store=store,
        )
        try:
            return await agent.run("What are the totals of the three ledgers?")
        finally:
            await local.close()

    started = time.perf_counter()
    result = anyio.run(go)
    elapsed = time.perf_counter() - started
    assert result.outcome == "done", result.error

    async def load() -> tuple[Session, list[Session]]:
        parent = await Session.load(store, result.session_id)
        return parent, await child_sessions(store, result.session_id)

    parent, children = anyio.run(load)

    # Three child sessions, each linked to the parent's run and one of its calls.
    links = [parent_of(child) for child in children]
    assert sorted(link.call_id for link in links if link is not None) == sorted(
        f"call_{name}" for name in NAMES
    )
    for link in links:
        assert link is not None
        assert (link.session_id, link.run_id, link.depth) == (
            parent.id,
            result.run_id,
            1,
        )
    # Each child read its file into its window on the real server, and the
    # tool result the parent got is that child's final answer.
    answers = {}
    for child, link in zip(children, links, strict=True):
        assert link is not None
        (run,) = child.runs
        assert run.outcome == "done", run.error
        name = link.call_id.removeprefix("call_")
        real = run.turns[-1].usage
        assert real is not None
        assert real.input_tokens >= token_count(server, ledger(name))
        answers[link.call_id] = run.text
    results = {p.call_id: p.content for m in parent.history for p in m.tool_results}
    assert results == answers

    # No request of the parent holds a line of any file; it never compacted.
    assert len(lead.requests) == 2
    texts = [request_text(r) for r in lead.requests]
    for name in NAMES:
        for line in ledger(name).splitlines():
            if "ledger row" in line:
                assert all(line not in text for text in texts), line
    (run,) = parent.runs
    assert run.compactions == ()

    # What the children used rolls up into the parent's result, apart.
    children_usage = Usage()
    for child in children:
        for child_run in child.runs:
            children_usage = children_usage + child_run.usage
    assert result.children_usage == children_usage
    assert result.children_usage.input_tokens > 0
    assert result.usage_with_children == result.usage + children_usage

    files = [token_count(server, ledger(name)) for name in NAMES]
    held = max(token_count(server, text) for text in texts)
    print(
        f"files {files} tokens ({sum(files)} together, window {N_CTX}); "
        f"the parent's largest request {held} tokens; children used "
        f"{result.children_usage.input_tokens} in / "
        f"{result.children_usage.output_tokens} out; "
        f"answers {sorted(answers.values())}; {elapsed:.1f} s"
    )
    assert sum(files) > N_CTX  # the three files would not fit in the window
    assert held < min(files)
