"""Helpers shared by turnfsm's tests: the stock machine, scripts, message builders.

Messages built here get readable, deterministic ids when the caller names one,
so expected buffers can be written out in a test and compared with `==`.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import attrs

from turnfsm.context import CompactionContext
from turnfsm.core import (
    Budget,
    CompactReason,
    Decision,
    Event,
    MachineSpec,
    Snapshot,
    TurnMachine,
)
from turnfsm.errors import StoreUnusable
from turnfsm.messages import JSONValue, Message, ToolCallPart
from turnfsm.persistence import Entry, MemoryStore, SessionInfo, SessionStore
from turnfsm.providers import ModelRequest
from turnfsm.tokens import HeuristicTokenCounter

__all__ = [
    "REPO_ROOT",
    "TURN_TOML",
    "approval_toml",
    "calling",
    "http_server",
    "load_turn_spec",
    "machine_at",
    "reply",
    "request_text",
    "restamp",
    "result",
    "results_for",
    "run_killed",
    "run_script",
    "start_machine",
    "tool_call",
    "turn_toml_text",
    "user",
]

REPO_ROOT = Path(__file__).resolve().parent.parent
"""The repository root (the directory holding ``machines/``)."""

TURN_TOML = REPO_ROOT / "machines" / "turn.toml"
"""The stock Turn FSM definition."""


def turn_toml_text() -> str:
    """Return the text of ``machines/turn.toml``."""
    return TURN_TOML.read_text(encoding="utf-8")


def restamp(lines: Sequence[str]) -> list[str]:
    """A session log's lines as one who knows the format leaves them after an edit.

    Each entry line is numbered again in order (``seq``) with its fields'
    digests made again, and the header counts the entry lines: what is left
    to check is what the edit did to the session, not to the file. A line
    no edit touched is returned as it was.
    """
    from turnfsm.persistence._rows import field_digests

    out, header, seq = list(lines), None, 0
    for i, line in enumerate(out):
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if not isinstance(data, dict):
            continue
        if data.get("format") == "turnfsm-session-log":
            header = i if header is None else header
            continue
        seq += 1
        stamped = {**data, "seq": seq}
        if isinstance(data.get("data"), dict):
            stamped["digests"] = field_digests(data["data"])
        if stamped != data:
            out[i] = json.dumps(stamped)
    if header is not None:
        data = json.loads(out[header])
        if "log_version" in data and data.get("entry_count") != seq:
            out[header] = json.dumps({**data, "entry_count": seq})
    return out


def load_turn_spec() -> MachineSpec:
    """Parse and validate ``machines/turn.toml`` with `MachineSpec.from_toml`."""
    return MachineSpec.from_toml(turn_toml_text(), source=str(TURN_TOML))


def _edit(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, f"expected one {old!r} in turn.toml"
    return text.replace(old, new)


def approval_toml() -> str:
    """Return the stock machine with an `await_approval` phase before the tools.

    The phase emits ``Perform(effect="await_approval")``; the signals
    ``approved`` (run the tools) and ``rejected`` (fail, cancelled) leave it.
    """
    text = _edit(
        turn_toml_text(),
        'terminal = ["done", "failed"]\n',
        'terminal = ["done", "failed"]\nsignals = ["approved", "rejected"]\n',
    )
    text = _edit(
        text,
        'failed            = { decision = "fail", on_enter = ["discard_pending"] }\n',
        'failed            = { decision = "fail", on_enter = ["discard_pending"] }\n'
        'await_approval    = { effect = "await_approval" }\n',
    )
    text = _edit(
        text,
        'dest = "run_tools"\nconditions = ["has_tool_calls"]',
        'dest = "await_approval"\nconditions = ["has_tool_calls"]',
    )
    return text + (
        '\n[[transitions]]\ntrigger = "approved"\nsource = "await_approval"\n'
        'dest = "run_tools"\n'
        '\n[[transitions]]\ntrigger = "rejected"\nsource = "await_approval"\n'
        'dest = "failed"\nerror = "cancelled"\n'
    )


def start_machine(
    *, budget: Budget | None = None, history: Iterable[Message] = ()
) -> TurnMachine:
    """Return a stock Turn FSM in `start` over the committed `history`."""
    return TurnMachine.start(load_turn_spec(), budget=budget, history=tuple(history))


def machine_at(phase: str, **fields: Any) -> TurnMachine:
    """Return a stock Turn FSM restored in `phase` with the given snapshot fields."""
    return TurnMachine.from_snapshot(
        load_turn_spec(), Snapshot(phase=phase, is_started=True, **fields)
    )


def run_script(machine: TurnMachine, events: Iterable[Event]) -> list[Decision]:
    """Feed `events` in order and return the decision answered to each."""
    return [machine.handle(event) for event in events]


def run_killed(module: str, *args: str) -> subprocess.CompletedProcess[bytes]:
    """Run the worker `module` with `args` and check that SIGKILL ended it.

    The worker runs as ``python -m module`` from the repository root, which
    is on its ``PYTHONPATH``; it is given two minutes to kill itself.
    """
    killed = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()
    return killed


def _ids(id: str | None) -> dict[str, Any]:
    return {} if id is None else {"id": id}


def user(text: str = "hello", *, id: str | None = None) -> Message:
    """Return a user message."""
    return Message.user(text, **_ids(id))


def reply(text: str = "done", *, id: str | None = None) -> Message:
    """Return an assistant reply without tool calls (a final answer)."""
    return Message.assistant(text, **_ids(id))


def tool_call(
    call_id: str, name: str = "lookup", **arguments: JSONValue
) -> ToolCallPart:
    """Return a tool call part."""
    return ToolCallPart(id=call_id, name=name, arguments=arguments)


def calling(
    *calls: ToolCallPart | str, text: str = "", id: str | None = None
) -> Message:
    """Return an assistant reply asking for `calls` (a bare string is a call id)."""
    parts = [tool_call(c) if isinstance(c, str) else c for c in calls]
    return Message.assistant(text, tool_calls=parts, **_ids(id))


def result(
    call_id: str,
    content: str = "ok",
    *,
    is_error: bool = False,
    id: str | None = None,
) -> Message:
    """Return a tool message answering the call `call_id`."""
    return Message.tool_result(call_id, content, is_error=is_error, **_ids(id))


def results_for(message: Message) -> tuple[Message, ...]:
    """Return one ``ok`` result for every tool call of `message`."""
    return tuple(result(c.id, id=f"{message.id}-{c.id}") for c in message.tool_calls)


def request_text(request: ModelRequest) -> str:
    """Return everything `request` shows the model, one piece a line.

    Its system prompt, then each message's text, tool results and tool call
    arguments: what a test checks a model was (or was not) shown.
    """
    out = [request.system or ""]
    for m in request.messages:
        out.append(m.text)
        out.extend(p.content for p in m.tool_results)
        out.extend(str(c.arguments) for c in m.tool_calls)
    return "\n".join(out)


def compaction_context(
    messages: Sequence[Message],
    *,
    window: int = 100_000,
    summaries: dict[str, str] | None = None,
    allow_model: bool = True,
    session_id: str = "ses_1",
) -> CompactionContext:
    """A threshold pass's context over `messages`, counted by the heuristic."""
    counter = HeuristicTokenCounter()
    return CompactionContext(
        tokens_before=counter.count(messages),
        reason=CompactReason.THRESHOLD_EXCEEDED,
        context_window=window,
        turn=1,
        counter=counter,
        session_id=session_id,
        summaries=summaries or {},
        allow_model=allow_model,
    )


_Handler = TypeVar("_Handler", bound=http.server.BaseHTTPRequestHandler)


@contextlib.contextmanager
def http_server(handler: type[_Handler]) -> Iterator[tuple[str, type[_Handler]]]:
    """Serve `handler` on a free local port, in a thread, for the block.

    Yields the server's URL (``http://127.0.0.1:PORT``) and the class that
    serves: a fresh subclass of `handler`, so what a test sets or counts on
    its class stays that test's.
    """
    served = type("Handler", (handler,), {})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), served)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", served
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


class ProtocolStore:
    """`inner` seen through the `SessionStore` protocol alone, counting its loads.

    No `list_delegated`, no leases; with `times` False, no session's
    `updated_at` either: a store of one's own that says only what the
    protocol asks.
    """

    def __init__(self, inner: SessionStore, *, times: bool = True) -> None:
        self.inner = inner
        self.times = times
        self.loaded: list[str] = []

    async def append(
        self, session_id: str, entries: Sequence[Entry], *, expected_version: int
    ) -> int:
        return await self.inner.append(
            session_id, entries, expected_version=expected_version
        )

    async def load(self, session_id: str) -> tuple[Entry, ...]:
        self.loaded.append(session_id)
        return await self.inner.load(session_id)

    async def list_sessions(self) -> tuple[SessionInfo, ...]:
        listed = await self.inner.list_sessions()
        if self.times:
            return listed
        return tuple(attrs.evolve(info, updated_at=None) for info in listed)


class RefusingStore(MemoryStore):
    """A `MemoryStore` down for the first `times` appends holding a `kind` entry.

    Each refused append raises `StoreUnusable` and writes nothing: a store
    that fails at one point of a run, then works again (for its resume).
    """

    def __init__(self, kind: type, *, times: int = 1) -> None:
        super().__init__()
        self.kind = kind
        self.refusals = times

    async def append(
        self, session_id: str, entries: Sequence[Entry], *, expected_version: int
    ) -> int:
        if self.refusals and any(isinstance(e, self.kind) for e in entries):
            self.refusals -= 1
            raise StoreUnusable(path="memory", reason="down for this append")
        return await super().append(
            session_id, entries, expected_version=expected_version
        )
