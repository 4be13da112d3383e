"""The peer: the concurrency bench's sessions on the Agents SDK's Temporal integration.

`bench.temporal_peers` runs this beside turnfsm's durable runs, on the same
Temporal server, the same fake model server (`bench.fake_openai`) and the
same workload: N sessions at once, each one workflow whose agent makes T
model calls, calling the ``work`` tool (a Temporal activity,
`activity_as_tool`) after each but the last. Model calls run as the
integration's model activities (Chat Completions, to the fake server);
tracing is off on both sides.

It needs ``openai-agents`` and ``temporalio-openai-agents`` (not turnfsm's
dependencies: install them in a separate environment and pass its Python
to `bench.temporal_peers` with ``--agents-python``). It imports nothing of
turnfsm, so that environment needs no turnfsm either.

    python -m bench.agents_sdk_temporal --address HOST:PORT --model-url URL \
        --sessions 100 --turns 20 [--workers 2]

Prints one JSON line: throughput (model calls per second, first start to
last result), turn latency p50 / p99 (from each workflow's history: one
model activity scheduled to the next, the last to the workflow's end), the
workers' CPU seconds and peak RSS.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import itertools
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import IO, Any

from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.worker import Worker

with workflow.unsafe.imports_passed_through():
    from agents import Agent, Runner, set_tracing_disabled
    from agents.models.openai_provider import OpenAIProvider
    from openai import AsyncOpenAI
    from temporalio.openai_agents import ModelActivityParameters, OpenAIAgentsPlugin
    from temporalio.openai_agents.workflow import activity_as_tool

TIMEOUT = timedelta(seconds=60)


@activity.defn
async def work(tag: str, step: int) -> str:
    """Hash a step of a session (the tool's tiny amount of real work).

    Args:
        tag: The session's tag.
        step: The step.
    """
    digest = hashlib.sha256(f"{tag}:{step}".encode()).hexdigest()[:16]
    return f"[{tag}] {step} {digest}"


@workflow.defn
class PeerSession:
    """One session: the agent runs its task to its final answer."""

    @workflow.run
    async def run(self, task: str, turns: int) -> str:
        agent: Agent[None] = Agent(
            name="bench",
            instructions="Take the steps, then answer.",
            model="fake",
            tools=[activity_as_tool(work, start_to_close_timeout=TIMEOUT)],
        )
        result = await Runner.run(agent, task, max_turns=turns + 1)
        return str(result.final_output)


def plugin(model_url: str) -> OpenAIAgentsPlugin:
    """The integration, its model calls sent to `model_url` (Chat Completions)."""
    provider = OpenAIProvider(
        openai_client=AsyncOpenAI(base_url=model_url, api_key="none", max_retries=0),
        use_responses=False,
    )
    return OpenAIAgentsPlugin(
        model_params=ModelActivityParameters(start_to_close_timeout=TIMEOUT),
        model_provider=provider,
        add_temporal_spans=False,
    )


async def serve_worker(args: argparse.Namespace) -> None:
    """Serve the workflow and the tool until stdin closes; report CPU and RSS."""
    set_tracing_disabled(True)
    client = await Client.connect(args.address, plugins=[plugin(args.model_url)])
    worker = Worker(
        client, task_queue=args.task_queue, workflows=[PeerSession], activities=[work]
    )
    async with worker:
        await asyncio.to_thread(_report, args.report, "ready")
        await asyncio.to_thread(sys.stdin.read)
    usage = os.times()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    figures = {"cpu": usage.user + usage.system, "rss": peak}
    await asyncio.to_thread(_report, args.report, json.dumps(figures))


def _report(path: str, line: str) -> None:
    with Path(path).open("a") as out:
        out.write(line + "\n")


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank `q` quantile (0 < q <= 1)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


async def turn_latencies(client: Client, workflow_id: str) -> list[float]:
    """A workflow's turns by its history: model activity scheduled to the next."""
    stamps: list[float] = []
    end = None
    async for event in client.get_workflow_handle(workflow_id).fetch_history_events():
        attrs = event.activity_task_scheduled_event_attributes
        if event.HasField("activity_task_scheduled_event_attributes") and (
            attrs.activity_type.name != "work"
        ):
            stamps.append(event.event_time.ToDatetime().timestamp())
        if event.HasField("workflow_execution_completed_event_attributes"):
            end = event.event_time.ToDatetime().timestamp()
    if end is not None:
        stamps.append(end)
    return [b - a for a, b in itertools.pairwise(stamps)]


Workers = list[tuple[subprocess.Popen[str], IO[str], Path]]


def start_workers(args: argparse.Namespace, queue: str, logs: Path) -> Workers:
    """Start the worker processes and wait until each serves."""
    procs: Workers = []
    for n in range(args.workers):
        report = logs / f"worker{n}.report"
        command = [sys.executable, "-m", "bench.agents_sdk_temporal", "--worker"]
        command += ["--address", args.address, "--model-url", args.model_url]
        command += ["--task-queue", queue, "--report", str(report)]
        log = (logs / f"worker{n}.log").open("w")
        proc = subprocess.Popen(
            command,
            cwd=Path(__file__).resolve().parent.parent,
            stdin=subprocess.PIPE,
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "OPENAI_AGENTS_DISABLE_TRACING": "1"},
        )
        procs.append((proc, log, report))
    for proc, _, report in procs:
        while not report.exists():
            if proc.poll() is not None:
                raise SystemExit(f"a worker did not start: see {logs}")
            time.sleep(0.1)
    return procs


def stop_workers(procs: Workers) -> list[dict[str, Any]]:
    """Close the workers' stdin, wait for them; return their figures."""
    for proc, _, _ in procs:
        assert proc.stdin is not None
        proc.stdin.close()
    figures = []
    for proc, log, report in procs:
        proc.wait(timeout=120)
        log.close()
        lines = report.read_text().splitlines()
        if len(lines) > 1:
            figures.append(json.loads(lines[-1]))
    return figures


async def client_run(args: argparse.Namespace, queue: str) -> dict[str, Any]:
    """Run every session at once on the workers serving `queue`; measure."""
    client = await Client.connect(args.address, plugins=[plugin(args.model_url)])
    width = max(5, len(str(args.sessions - 1)))
    tags = [f"s{i:0{width}d}" for i in range(args.sessions)]
    ids = [f"{queue}-{tag}" for tag in tags]
    t0 = time.perf_counter()
    handles = await asyncio.gather(
        *(
            client.start_workflow(
                PeerSession.run,
                args=[f"[{tag}] take {args.turns - 1} steps, then answer", args.turns],
                id=wid,
                task_queue=queue,
            )
            for tag, wid in zip(tags, ids, strict=True)
        )
    )
    answers = await asyncio.gather(*(h.result() for h in handles))
    wall = time.perf_counter() - t0
    wrong = [
        (tag, a)
        for tag, a in zip(tags, answers, strict=True)
        if a != f"[{tag}] done after {args.turns - 1} steps"
    ]
    latencies: list[float] = []
    for chunk in range(0, len(ids), 50):
        found = await asyncio.gather(
            *(turn_latencies(client, wid) for wid in ids[chunk : chunk + 50])
        )
        for one in found:
            latencies.extend(one)
    turns = args.sessions * args.turns
    return {
        "backend": "agents-sdk-temporal",
        "sessions": args.sessions,
        "turns": args.turns,
        "wall": wall,
        "throughput": turns / wall,
        "p50": percentile(latencies, 0.5) if latencies else float("nan"),
        "p99": percentile(latencies, 0.99) if latencies else float("nan"),
        "turn_count": len(latencies),
        "wrong": len(wrong),
    }


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Start the workers, run the sessions, stop the workers: the figures."""
    queue = f"peer-{uuid.uuid4().hex[:8]}"
    logs = Path(tempfile.mkdtemp(prefix="turnfsm-bench-peer-"))
    procs = start_workers(args, queue, logs)
    try:
        result = asyncio.run(client_run(args, queue))
    finally:
        figures = stop_workers(procs)
    result["workers_cpu"] = [round(f["cpu"], 1) for f in figures]
    result["workers_rss"] = [round(f["rss"]) for f in figures]
    result["logs"] = str(logs)
    return result


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", required=True)
    parser.add_argument("--model-url", required=True)
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--task-queue", help=argparse.SUPPRESS)
    parser.add_argument("--report", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        asyncio.run(serve_worker(args))
        return
    print(json.dumps(measure(args)))


if __name__ == "__main__":
    main(sys.argv[1:])
