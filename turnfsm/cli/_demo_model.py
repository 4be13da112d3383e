"""The demo's simulated world: the logs its plan reads, the tool, the stand-in model."""

from __future__ import annotations

import json
import random
import re
from typing import Literal

from turnfsm.driver import Tool
from turnfsm.messages import SUMMARY_COVERS, Message, ToolCallPart
from turnfsm.providers import ModelRequest, ModelResponse
from turnfsm.tokens import HeuristicTokenCounter
from turnfsm.values import Usage

__all__ = [
    "LOCAL_LINES",
    "PLAN",
    "LogName",
    "SimulatedModel",
    "log_text",
    "read_log",
    "read_log_head",
]

PLAN = (
    ("app.log", 40),
    ("db.log", 40),
    ("auth.log", 40),
    ("metrics.log", 40),
    ("kernel.log", 140),
)


LogName = Literal["app.log", "db.log", "auth.log", "metrics.log", "kernel.log"]
"""The logs the simulated server keeps (the tool's schema lists them)."""

LOCAL_LINES = 6
"""How many lines of each log the local model's tool returns (it is slow)."""


def read_log(name: LogName) -> str:
    """Read a log file from the (simulated) server.

    Args:
        name: the log file's name, e.g. app.log.
    """
    return log_text(name)


def _read_log_head(name: LogName) -> str:
    """Read a log file from the (simulated) server.

    Args:
        name: the log file's name, e.g. app.log.
    """
    return log_text(name, limit=LOCAL_LINES)


read_log_head = Tool.from_function(_read_log_head, name="read_log")
"""`read_log` for the local model: the first `LOCAL_LINES` lines of a log."""


def log_text(name: str, *, limit: int | None = None) -> str:
    """The log `name` (its first `limit` lines if given), or why there is none.

    A whole log ends with an end line (``-- end of app.log: 40 lines --``),
    so a reader can tell it from one cut short (a digest, a capped result).
    """
    total = dict(PLAN).get(name)
    if total is None:
        return f"no such log: {name}"
    lines = total if limit is None else min(total, limit)
    rng = random.Random(name)
    levels = ("INFO", "INFO", "INFO", "WARN", "ERROR")
    out = []
    for i in range(lines):
        level = rng.choice(levels)
        out.append(
            f"2026-11-30T02:{i // 60:02d}:{i % 60:02d}Z {level} {name} "
            f"worker={rng.randint(1, 8)} req={rng.randint(10_000, 99_999)} "
            f"latency_ms={rng.randint(3, 900)}"
        )
    if lines == total:
        out.append(f"-- end of {name}: {total} lines --")
    return "\n".join(out)


_END = re.compile(r"^-- end of (\S+\.log): (\d+) lines --$", re.MULTILINE)
_LINE = re.compile(r"\dZ (?:INFO|WARN|ERROR) (\S+\.log) worker=")


def _whole_logs(text: str) -> dict[str, tuple[int, int]]:
    """Log name -> (lines, ERROR lines) for each whole log in `text`.

    A log counts only with its end line and as many lines before it as the
    end line says: a cut one (digested, capped) is not counted.
    """
    out: dict[str, tuple[int, int]] = {}
    start = 0
    for end in _END.finditer(text):
        name, total = end[1], int(end[2])
        body = [
            line
            for line in text[start : end.start()].splitlines()
            if (found := _LINE.search(line)) and found[1] == name
        ]
        start = end.end()
        if len(body) == total:
            out[name] = (total, sum(" ERROR " in line for line in body))
    return out


class SimulatedModel:
    """A deterministic stand-in for an LLM (clearly not one): plan, then answer."""

    label = "SIMULATED model (deterministic script, no network)"
    model = "simulated"  # as traces name it: `chat simulated`
    provider_name = "turnfsm.demo"

    def __init__(self) -> None:
        self.calls = 0  # plan steps answered (observability only)

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Ask for the next log in the plan, then answer (see `_answer`).

        The answer counts each log's ERROR lines from its whole text in
        context or from the conversation summary's count, never from a copy
        cut short (a log left only so is read again, once), and names the
        logs it cannot count.

        The step is read from the request (the latest ``call_N`` it shows),
        not kept in the model: a request asked again (a retry, a durable run
        going on in another worker) gets the same answer.

        A summary request (a compactor's: temperature set, no tools) gets a
        short summary that counts each log's lines and ERROR lines.
        """
        if request.temperature is not None and not request.tools:
            return _reply(request, Message.assistant(_summary(request)))
        self.calls += 1
        step = _last_step(request) + 1
        if step <= len(PLAN):
            name = PLAN[step - 1][0]
            call = ToolCallPart(
                id=f"call_{step}", name="read_log", arguments={"name": name}
            )
            message = Message.assistant(f"Reading {name}.", tool_calls=[call])
            return _reply(request, message)
        return _reply(request, _answer(request, step))


_COUNTER = HeuristicTokenCounter()


def _reply(request: ModelRequest, message: Message) -> ModelResponse:
    """`message`, with the usage a provider would report: tokens in and out.

    The simulated model counts with the characters-over-four rule: the
    request's messages, system prompt and tool schemas in, the reply out.
    """
    sent = _COUNTER.count(request.messages)
    if request.system:
        sent += _COUNTER.count_text(request.system)
    for tool in request.tools:
        schema = {"name": tool.name, "description": tool.description}
        sent += _COUNTER.count_text(json.dumps({**schema, **tool.parameters}))
    usage = Usage(input_tokens=sent, output_tokens=_COUNTER.count([message]))
    return ModelResponse(message=message, usage=usage)


def _answer(request: ModelRequest, step: int) -> Message:
    """The audit's answer, from what the request still shows - or a re-read.

    A log counts when its whole text is in view, or when the latest
    conversation summary counts it. A log whose result is in view only cut
    short (a one-line digest, a capped result) is read again, once; a log
    still cut short after that is named so, and a log gone from view with no
    summary is named as compacted away.
    """
    names = {
        c.id: c.arguments.get("name") for m in request.messages for c in m.tool_calls
    }
    whole: dict[str, int] = {}
    cut: list[str] = []
    for message in request.messages:
        for result in message.tool_results:
            counted = _whole_logs(result.content)
            whole.update({name: errors for name, (_, errors) in counted.items()})
            name = names.get(result.call_id)
            if not counted and isinstance(name, str) and name in dict(PLAN):
                cut.append(name)
    summaries = [m for m in request.messages if SUMMARY_COVERS in m.metadata]
    summarised = _counted(summaries[-1].text) if summaries else {}
    known = {**summarised, **whole}
    again = [name for name in cut if name not in known and name not in _reread(request)]
    if again:
        call = ToolCallPart(
            id=f"call_{step}", name="read_log", arguments={"name": again[0]}
        )
        return Message.assistant(
            f"Reading {again[0]} again: only a cut-short copy is left.",
            tool_calls=[call],
        )
    counts = [(name, known[name]) for name, _ in PLAN if name in known]
    listed = ", ".join(f"{name} {errors}" for name, errors in counts)
    text = (
        f"Audit done: {sum(e for _, e in counts)} ERROR lines in {len(counts)} "
        f"log(s) ({listed})."
    )
    in_summary = [name for name in summarised if name not in whole]
    if in_summary:
        text += (
            f" The conversation summary covers {len(in_summary)} earlier log(s); "
            f"{len(counts) - len(in_summary)} log(s) are still in context in full."
        )
    short = [name for name, _ in PLAN if name in cut and name not in known]
    if short:
        text += (
            f" Only cut-short copies of {', '.join(short)} are left (read again "
            "already): their ERROR lines are not counted."
        )
    missing = [name for name, _ in PLAN if name not in known and name not in cut]
    if missing:
        text += (
            f" Older logs were compacted away ({', '.join(missing)}); "
            "re-read them if their details matter."
        )
    return Message.assistant(text)


_STEP = re.compile(r"\bcall_(\d+)\b")


def _reread(request: ModelRequest) -> set[str]:
    """The logs the request shows a second read of (a step past the plan)."""
    return {
        str(call.arguments.get("name"))
        for message in request.messages
        for call in message.tool_calls
        if (m := _STEP.match(call.id)) and int(m[1]) > len(PLAN)
    }


def _last_step(request: ModelRequest) -> int:
    """The latest plan step the conversation shows (0: none yet)."""
    steps = [0]
    for message in request.messages:
        steps += [int(m[1]) for c in message.tool_calls if (m := _STEP.match(c.id))]
        steps += [
            int(m[1]) for r in message.tool_results if (m := _STEP.match(r.call_id))
        ]
        if SUMMARY_COVERS in message.metadata:
            steps += [int(n) for n in _STEP.findall(message.text)]
    return max(steps)


_COUNT = re.compile(r"^- (\S+\.log): (\d+) lines, (\d+) ERROR", re.MULTILINE)


def _counted(text: str) -> dict[str, int]:
    """Log name -> ERROR lines, from a summary's Critical Context lines."""
    return {name: int(errors) for name, _lines, errors in _COUNT.findall(text)}


def _summary(request: ModelRequest) -> str:
    """The simulated model's summary: per whole log, its lines and ERROR lines.

    The counts of an earlier summary in the prompt are kept; a log cut short
    (no end line, or fewer lines than it says) is not counted.
    """
    prompt = request.messages[-1].text
    seen = {
        name: f"- {name}: {lines} lines, {errors} ERROR"
        for name, lines, errors in _COUNT.findall(prompt)
    }
    for name, (lines, errors) in _whole_logs(prompt).items():
        seen[name] = f"- {name}: {lines} lines, {errors} ERROR"
    facts = "\n".join(seen.values()) or "None"
    return (
        "## Active Task\nAudit the five logs and report errors.\n"
        f"## Completed Actions\nRead {', '.join(seen) or 'no logs'}.\n"
        f"## Critical Context\n{facts}"
    )
