"""The demo's simulated world: the logs its plan reads, the tool, the stand-in model."""

from __future__ import annotations

import random
import re

from turnfsm.messages import SUMMARY_COVERS, Message, Role, ToolCallPart
from turnfsm.providers import ModelRequest, ModelResponse

__all__ = ["PLAN", "SimulatedModel", "read_log"]

PLAN = (
    ("app.log", 40),
    ("db.log", 40),
    ("auth.log", 40),
    ("metrics.log", 40),
    ("kernel.log", 145),
)


def read_log(name: str) -> str:
    """Read a log file from the (simulated) server.

    Args:
        name: the log file's name, e.g. app.log.
    """
    lines = dict(PLAN).get(name)
    if lines is None:
        return f"no such log: {name}"
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
    return "\n".join(out)


class SimulatedModel:
    """A deterministic stand-in for an LLM (clearly not one): plan, then answer."""

    label = "SIMULATED model (deterministic script, no network)"
    model = "simulated"  # as traces name it: `chat simulated`
    provider_name = "turnfsm.demo"

    def __init__(self) -> None:
        self.calls = 0  # plan steps answered (observability only)

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Ask for the next log in the plan, then summarise the visible logs.

        The step is read from the request (the latest ``call_N`` it shows),
        not kept in the model: a request asked again (a retry, a durable run
        going on in another worker) gets the same answer.

        A summary request (a compactor's: temperature set, no tools) gets a
        short summary that counts each log's lines and ERROR lines.
        """
        if request.temperature is not None and not request.tools:
            return ModelResponse(message=Message.assistant(_summary(request)))
        self.calls += 1
        step = _last_step(request) + 1
        if step <= len(PLAN):
            name = PLAN[step - 1][0]
            call = ToolCallPart(
                id=f"call_{step}", name="read_log", arguments={"name": name}
            )
            message = Message.assistant(f"Reading {name}.", tool_calls=[call])
            return ModelResponse(message=message)
        visible = [
            (r.call_id, r.content)
            for m in request.messages
            if m.role is Role.TOOL
            for r in m.tool_results
        ]
        errors = sum(content.count(" ERROR ") for _, content in visible)
        summaries = [m for m in request.messages if SUMMARY_COVERS in m.metadata]
        if summaries:
            counted = _counted(summaries[-1].text)
            tail = (
                f"The conversation summary covers {len(counted)} earlier log(s) "
                f"with {sum(counted.values())} ERROR lines."
            )
        else:
            tail = (
                "Older logs were compacted away; re-read them if their details matter."
            )
        text = (
            f"Audit done. {len(visible)} log(s) still in context after compaction, "
            f"{errors} ERROR lines among them. {tail}"
        )
        return ModelResponse(message=Message.assistant(text))


_STEP = re.compile(r"\bcall_(\d+)\b")


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
    """The simulated model's summary: per log, its lines and ERROR lines."""
    prompt = request.messages[-1].text
    seen = {
        name: f"- {name}: {lines} lines, {errors} ERROR"
        for name, lines, errors in _COUNT.findall(prompt)
    }
    for block in prompt.split("[TOOL RESULT ")[1:]:
        body = block.partition("]: ")[2]
        lines = [line for line in body.splitlines() if ".log " in line]
        if lines:
            name = lines[0].split()[2]
            errors = sum(" ERROR " in line for line in lines)
            seen[name] = f"- {name}: {len(lines)} lines, {errors} ERROR"
    facts = "\n".join(seen.values()) or "None"
    return (
        "## Active Task\nAudit the five logs and report errors.\n"
        f"## Completed Actions\nRead {', '.join(seen) or 'no logs'}.\n"
        f"## Critical Context\n{facts}"
    )
