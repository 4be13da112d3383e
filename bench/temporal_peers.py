"""Durable runs side by side: turnfsm on Temporal, and the Agents SDK's integration.

One Temporal dev server, one fake model server (`bench.fake_openai`, the
concurrency bench's script over Chat Completions), one workload: N sessions
at once, T model calls each, a ``work`` tool activity between them, two
worker processes per side. turnfsm runs `bench.concurrency`'s Temporal
backend (its store: one SQLite file) with its agent's model pointed at the
fake server; the peer runs `bench.agents_sdk_temporal` in the Python given
by ``--agents-python`` (an environment with ``openai-agents`` and
``temporalio-openai-agents``). The sides alternate, so drift hits both.

    python -m bench.temporal_peers --agents-python /path/to/venv/bin/python \
        --sessions 100 --sessions 1000 --turns 20 [--rounds 2] \
        [--turnfsm-option local_activities=true]

``--turnfsm-option`` is a `DurableOptions` field for turnfsm's runs.
Prints, per side and size, the best round's throughput (model calls per
second, first start to last result), its turn latency p50 / p99 (turnfsm's
by its workers' clock, the peer's from its workflow history), the CPU
seconds the workers and the server spent per model call, and turnfsm's
throughput as a ratio to the peer's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

if __name__ == "__main__" and not __package__:
    sys.path.insert(1, str(ROOT))

from bench.concurrency import parse, run_child  # noqa: E402
from bench.concurrency_temporal import server_cpu, temporal_server  # noqa: E402


@contextlib.contextmanager
def fake_model(python: str, turns: int) -> Any:
    """Start `bench.fake_openai`; yield its base URL."""
    proc = subprocess.Popen(
        [python, "-m", "bench.fake_openai", "--turns", str(turns)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        port = proc.stdout.readline().split()[1]
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.kill()
        proc.wait()


def run_turnfsm(args: argparse.Namespace, sessions: int, url: str) -> dict[str, Any]:
    options = parse(
        [
            "--store",
            "temporal",
            "--sessions",
            str(sessions),
            "--turns",
            str(args.turns),
            "--model-url",
            url,
            "--temporal-address",
            args.temporal_address,
            "--workers",
            str(args.workers),
            *(f"--durable-option={pair}" for pair in args.turnfsm_option),
        ]
    )
    cpu0 = server_cpu(args.temporal_dir)
    run = run_child(options, "temporal", None)["run"]
    cpu1 = server_cpu(args.temporal_dir)
    return {
        "side": "turnfsm",
        "throughput": run["throughput"],
        "p50": run["p50"],
        "p99": run["p99"],
        "workers_cpu": sum(run["worker_cpu"] or []),
        "server_cpu": None if cpu0 is None or cpu1 is None else cpu1 - cpu0,
        "checked": run["verified"],
    }


def run_peer(args: argparse.Namespace, sessions: int, url: str) -> dict[str, Any]:
    command = [args.agents_python, "-m", "bench.agents_sdk_temporal"]
    command += ["--address", args.temporal_address, "--model-url", url]
    command += ["--sessions", str(sessions), "--turns", str(args.turns)]
    command += ["--workers", str(args.workers)]
    cpu0 = server_cpu(args.temporal_dir)
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    cpu1 = server_cpu(args.temporal_dir)
    if done.returncode != 0:
        raise SystemExit(f"the peer failed:\n{done.stderr[-3000:]}")
    run = json.loads(done.stdout.strip().splitlines()[-1])
    return {
        "side": "agents-sdk",
        "throughput": run["throughput"],
        "p50": run["p50"],
        "p99": run["p99"],
        "workers_cpu": sum(run["workers_cpu"]),
        "server_cpu": None if cpu0 is None or cpu1 is None else cpu1 - cpu0,
        "checked": sessions - run["wrong"],
    }


def row(result: dict[str, Any], sessions: int, turns: int) -> str:
    calls = sessions * turns
    server = result["server_cpu"]
    per_call = (result["workers_cpu"] + (server or 0)) / calls * 1e3
    return (
        f"| {result['side']} | {sessions:,} x {turns} | {result['throughput']:.0f}"
        f" | {result['p50'] * 1e3:.0f} | {result['p99'] * 1e3:.0f}"
        f" | {result['p99'] / result['p50']:.2f} | {result['workers_cpu']:.0f}"
        f" | {'-' if server is None else f'{server:.0f}'} | {per_call:.1f}"
        f" | {result['checked']:,} |"
    )


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents-python", required=True)
    parser.add_argument("--sessions", type=int, action="append")
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--temporal-address", default=None)
    parser.add_argument("--temporal-dir", default=None)
    parser.add_argument("--turnfsm-option", action="append", default=[])
    args = parser.parse_args(argv)
    sizes = args.sessions or [100]
    print(
        f"durable runs side by side: {args.workers} workers a side,"
        f" {args.turns} model calls a session, instant fake model over HTTP"
        + "".join(f"; turnfsm {pair}" for pair in args.turnfsm_option)
    )
    lines = [
        "| side | sessions x calls | calls/s | p50 turn (ms) | p99 turn (ms)"
        " | p99 / p50 | workers' CPU (s) | server CPU (s) | CPU ms per call"
        " | sessions checked |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    ratios = []
    with temporal_server(args), fake_model(sys.executable, args.turns) as url:
        for sessions in sizes:
            best: dict[str, dict[str, Any]] = {}
            for n in range(args.rounds):
                sides = [run_turnfsm, run_peer]
                for side in sides if n % 2 == 0 else reversed(sides):
                    result = side(args, sessions, url)
                    name = result["side"]
                    print(
                        f"  {name} {sessions:,} x {args.turns}, round {n + 1}:"
                        f" {result['throughput']:.0f} calls/s",
                        flush=True,
                    )
                    if (
                        name not in best
                        or result["throughput"] > best[name]["throughput"]
                    ):
                        best[name] = result
            lines += [
                row(best[k], sessions, args.turns) for k in ("turnfsm", "agents-sdk")
            ]
            ratio = best["turnfsm"]["throughput"] / best["agents-sdk"]["throughput"]
            ratios.append(
                f"{sessions:,} sessions: turnfsm / agents-sdk throughput x{ratio:.2f}"
            )
    print()
    print("\n".join(lines))
    print("\n".join(ratios))


if __name__ == "__main__":
    main(sys.argv[1:])
