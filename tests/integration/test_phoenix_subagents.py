"""A sub-agent's spans in a real trace receiver (Arize Phoenix).

A lead agent delegates three file reads to a reader agent, both traced by
one `configure` exporting to Phoenix over OTLP/HTTP. Read back through
Phoenix's REST API, the lead's trace holds each reader run's spans under
the ``execute_tool reader`` span of the call that delegated it, in the
lead's project (each agent's runs are otherwise sent as a service, and so a
project, of the agent's name), even though the readers' spans reach Phoenix
in an export of their own, before the lead's.

Skipped when Phoenix is missing, unless TURNFSM_REQUIRE_PHOENIX=1 (CI).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.integration.phoenix import Phoenix, spans, unique_project
from turnfsm import Agent
from turnfsm.persistence import MemoryStore, child_sessions, parent_of
from turnfsm.providers import ModelRequest, ModelResponse
from turnfsm.testing import FakeModelClient, reply, tool_call
from turnfsm.tracing import Tracing, configure
from turnfsm.values import Usage

pytestmark = pytest.mark.timeout(300)  # the first test waits for Phoenix to start

TOTALS = {"north": 120, "south": 45, "east": 7}
USAGE = Usage(input_tokens=30, output_tokens=5)


def read_file(path: str) -> str:
    """Read a text file.

    Args:
        path: The file to read.
    """
    return Path(path).read_text()


def reader_answer(request: ModelRequest) -> ModelResponse:
    """Reads the file the task names, then says the total it found."""
    last = request.messages[-1]
    if last.tool_results:
        total = re.search(r"total: (\d+)", last.tool_results[0].content)
        assert total is not None
        message = reply(f"the total is {total[1]}")
    else:
        path = re.search(r"\S+\.txt", last.text)
        assert path is not None
        message = reply("", tool_call("read_file", path=path[0]))
    return ModelResponse(message=message, usage=USAGE)


def lead_answer(request: ModelRequest, tracing: Tracing) -> ModelResponse:
    """Delegates the three reads at once, then adds up the answers.

    Before adding up, it sends what has ended (the readers' spans) to the
    receiver, as a batch does when sub-agents take longer than its delay:
    the readers' spans arrive before their parents.
    """
    last = request.messages[-1]
    if last.tool_results:
        assert tracing.force_flush(timeout=10)
        said = [p.content for m in request.messages for p in m.tool_results]
        total = sum(int(n) for text in said for n in re.findall(r"\d+", text))
        message = reply(f"the grand total is {total}")
    else:
        message = reply(
            "",
            *[
                tool_call("reader", f"call_{name}", task=f"Read {name}.txt: total?")
                for name in TOTALS
            ],
        )
    return ModelResponse(message=message, usage=USAGE)


def test_the_leads_trace_holds_each_readers_spans_under_its_tool_span(
    phoenix: Phoenix, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    for name, total in TOTALS.items():
        Path(f"{name}.txt").write_text("filler\n" * 50 + f"total: {total}\n")
    lead_name = unique_project("lead")
    reader_name = unique_project("reader")
    store = MemoryStore()
    tracing = configure(endpoint=phoenix.url, set_global=False)
    try:
        reader = Agent(
            model=FakeModelClient(reader_answer),
            tools=[read_file],
            name=reader_name,
            hooks=[tracing.hook],
        )
        lead = Agent(
            model=FakeModelClient(lambda request: lead_answer(request, tracing)),
            tools=[reader.as_tool(name="reader", description="Read a file")],
            name=lead_name,
            hooks=[tracing.hook],
            store=store,
        )
        result = anyio.run(lead.run, "What is the grand total of the ledgers?")
        assert result.text == "the grand total is 172", result.error
        assert tracing.force_flush(timeout=10)
    finally:
        assert tracing.shutdown(timeout=10)

    # Lead: run, 2 turns, 2 chats, 3 tool spans; each reader: run, 2 turns,
    # 2 chats, 1 tool span (the phase spans come on top).
    found = spans(phoenix, lead_name, min_count=8 + 3 * 6, timeout=20)
    (root,) = [s for s in found if not s["parent_id"]]
    assert root["name"] == f"invoke_agent {lead_name}"
    assert root["attributes"]["turnfsm.run.id"] == result.run_id
    assert {s["trace_id"] for s in found} == {root["trace_id"]}
    by_id: dict[str, dict[str, Any]] = {s["span_id"]: s for s in found}
    for span in found:  # one tree: every parent is in the trace
        assert span["parent_id"] is None or span["parent_id"] in by_id, span["name"]

    children = anyio.run(child_sessions, store, result.session_id)
    calls = {parent_of(c).call_id: c for c in children}  # type: ignore[union-attr]
    assert sorted(calls) == sorted(f"call_{name}" for name in TOTALS)
    runs = [s for s in found if s["name"] == f"invoke_agent {reader_name}"]
    assert len(runs) == 3
    for run in runs:
        tool = by_id[run["parent_id"]]
        assert tool["name"] == "execute_tool reader"
        assert tool["kind"] == "TOOL"
        call_id = tool["attributes"]["gen_ai.tool.call.id"]
        child = calls[call_id]
        assert run["attributes"]["turnfsm.run.id"] == child.runs[0].run_id
        assert run["attributes"]["gen_ai.conversation.id"] == child.id
        # The reader's own turns, model calls and file read sit under its run.
        below = [s for s in found if _above(s, by_id, run["span_id"])]
        names = sorted(s["name"] for s in below)
        assert "execute_tool read_file" in names
        assert sum(n == "chat" or n.startswith("chat ") for n in names) == 2


def _above(span: dict[str, Any], by_id: dict[str, dict[str, Any]], top: str) -> bool:
    """Whether `top` is an ancestor of `span`."""
    parent = span["parent_id"]
    while parent is not None:
        if parent == top:
            return True
        parent = by_id[parent]["parent_id"]
    return False
