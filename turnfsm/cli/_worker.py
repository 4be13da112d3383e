"""``turnfsm worker`` and ``turnfsm demo --durable``: durable runs from the shell."""

from __future__ import annotations

import sys
from typing import Any, Final, TextIO

import anyio

from turnfsm.agent import Agent
from turnfsm.cli._agents import load_agents
from turnfsm.cli._errors import INTERRUPTED_STATUS, explain, stop_signals
from turnfsm.cli._run import run_async
from turnfsm.errors import (
    ConfigError,
    StoreError,
    TemporalUnreachable,
    TurnFSMError,
)

__all__ = ["run_durable_demo", "run_worker_command"]

_EXTRA = "the temporal extra is not installed: pip install 'turnfsm[temporal]'"

WATCH: Final = 15.0
"""Seconds between looks at the task queue while `turnfsm demo --durable` waits."""


def _demo_agents(store: str | None, out: TextIO) -> list[Agent]:
    from turnfsm.cli._demo import build_demo_agent
    from turnfsm.cli._stores import open_cli_store

    return [build_demo_agent(out, store=open_cli_store(store))]


async def _connect(address: str, namespace: str) -> Any:
    """A client of the Temporal server at `address`, whose `namespace` exists.

    Raises:
        ConfigError: naming ``--address`` (no Temporal server answers there)
            or ``--namespace`` (the server has no such namespace).
    """
    from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest
    from temporalio.client import Client
    from temporalio.service import RPCError, RPCStatusCode

    try:
        client = await Client.connect(address, namespace=namespace)
    except Exception as exc:  # the SDK raises RuntimeError for a refused connection
        raise ConfigError(
            "--address",
            address,
            f"the host:port of a running Temporal server (none answered there: "
            f"{_why(exc)}); start one (temporal server start-dev) or give its "
            "address",
        ) from None
    try:
        await client.workflow_service.describe_namespace(
            DescribeNamespaceRequest(namespace=namespace)
        )
    except RPCError as exc:
        if exc.status != RPCStatusCode.NOT_FOUND:
            raise
        raise ConfigError(
            "--namespace",
            namespace,
            f"a namespace of the Temporal server at {address} (it has none of "
            "that name); create it (temporal operator namespace create "
            f"--namespace {namespace}) or give another",
        ) from None
    return client


def _why(exc: BaseException) -> str:
    """The innermost reason in the SDK's connection error (``Connection refused``)."""
    from turnfsm.temporal import sdk_reason

    return sdk_reason(str(exc)) or explain(exc)


def run_worker_command(
    task_queue: str,
    *,
    address: str,
    namespace: str,
    agent: str | None,
    store: str | None,
    out: TextIO | None = None,
) -> int:
    """Serve durable runs on `task_queue` until interrupted; return the exit status.

    Without `agent`, the worker serves the demo agent (on `store`, the CLI's
    default SQLite file if None), so ``turnfsm demo --durable`` has one.
    """
    stream = out or sys.stdout
    try:
        from turnfsm.temporal import create_worker
    except ImportError:
        print(f"turnfsm worker: {_EXTRA}", file=sys.stderr)
        return 2
    try:
        agents = load_agents(agent) if agent else _demo_agents(store, stream)
    except (ConfigError, StoreError) as exc:
        print(f"turnfsm worker: {explain(exc)}", file=sys.stderr)
        return 2
    names = ", ".join(a.driver.name for a in agents)
    lost: list[str] = []  # why the worker lost the server, if it did

    async def serve() -> None:
        # A store that cannot be used is said now, not at each run's first
        # activity (which Temporal would retry without end).
        for store in {id(a.store): a.store for a in agents}.values():
            opened = getattr(store, "open", None)  # PostgresStore connects
            if opened is not None:
                await opened()
        client = await _connect(address, namespace)
        worker = create_worker(client, task_queue, agents)
        print(
            f"turnfsm worker: serving {names} on task queue {task_queue!r} "
            f"at {address} (namespace {namespace}); Ctrl-C stops",
            file=stream,
            flush=True,
        )
        async with anyio.create_task_group() as group:
            group.start_soon(_shut_down_on_signal, worker)
            # Returns once the worker has shut down: the SDK's threads are
            # stopped before the interpreter exits.
            try:
                await worker.run()
            except RuntimeError as exc:
                # The SDK's word for a server it lost (gone between the
                # address check and the worker's own, or a poll it gave
                # up on): one line, not a traceback.
                lost.append(_why(exc))
            group.cancel_scope.cancel()

    try:
        run_async(serve)
    except (ConfigError, StoreError) as exc:
        print(f"turnfsm worker: {explain(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        pass  # a Ctrl-C before the worker was serving
    if lost:
        print(
            f"turnfsm worker: lost the Temporal server at {address} ({lost[0]}); "
            "start it again, then the worker (its runs are kept by the server "
            "and go on then)",
            file=sys.stderr,
        )
        return 1
    print("turnfsm worker: stopped", file=stream)
    return 0


async def _shut_down_on_signal(worker: Any) -> None:
    """Shut `worker` down gracefully on Ctrl-C, SIGTERM or SIGHUP (`stop_signals`)."""
    with anyio.open_signal_receiver(*stop_signals()) as signals:
        async for _ in signals:
            break
    await worker.shutdown()


async def _polled(client: Any, namespace: str, task_queue: str) -> bool:
    """Whether a worker polled `task_queue` (of `client`'s namespace) lately."""
    from turnfsm.temporal import queue_polled

    return await queue_polled(client, task_queue)


def run_durable_demo(
    task_queue: str,
    *,
    address: str,
    namespace: str,
    quiet: bool = False,
    out: TextIO | None = None,
) -> int:
    """Run the demo's task as a durable run on a worker serving the demo agent."""
    stream = out or sys.stdout
    try:
        from turnfsm.temporal import start_durable
    except ImportError:
        print(f"turnfsm demo: {_EXTRA}", file=sys.stderr)
        return 2
    import io

    from temporalio.service import RPCError

    from turnfsm.cli._demo import TASK, build_demo_agent
    from turnfsm.persistence import MemoryStore

    # The client's agent only names the run's agent and reads its answer:
    # the worker's agent runs it, in the worker's store.
    agent = build_demo_agent(io.StringIO(), store=MemoryStore())
    started: list[Any] = []  # the DurableRun, once started

    async def go() -> Any:
        client = await _connect(address, namespace)
        run = await start_durable(agent, TASK, client=client, task_queue=task_queue)
        started.append(run)
        if not quiet:
            print(
                f"durable run {run.handle.result_run_id} of session "
                f"{run.session_id} started on {task_queue!r} (workflow "
                f"{run.workflow_id}); waiting for a worker...",
                file=stream,
                flush=True,
            )
        where = f" --address {address}"
        if namespace != "default":
            where += f" --namespace {namespace}"

        def unserved() -> None:
            # Said with --quiet too (on stderr): else it waits without a word.
            print(
                f"no worker has asked {task_queue!r} for work lately: start "
                f"one (turnfsm worker --task-queue {task_queue}{where}, in "
                "another terminal) and the run goes on there",
                file=sys.stderr if quiet else stream,
                flush=True,
            )

        polled = await _polled(client, namespace, task_queue)
        if not polled:
            unserved()
        # A worker that stops mid-run (killed, its host gone) is said too,
        # once its queue has gone unpolled: the run waits for another.
        while True:
            with anyio.move_on_after(WATCH):
                return await run.result()
            now = await _polled(client, namespace, task_queue)
            if polled and not now:
                unserved()
            polled = now

    try:
        result = run_async(go)
    except TemporalUnreachable as exc:  # the server went away mid-way
        if exc.starting:  # its own words: the start may have reached it
            print(f"turnfsm demo: {exc}", file=sys.stderr)
            return 1
        return _lost_server(address, exc.reason, started)
    except TurnFSMError as exc:
        print(f"turnfsm demo: {explain(exc)}", file=sys.stderr)
        return 2 if isinstance(exc, ConfigError) else 1
    except KeyboardInterrupt:
        if not started:
            raise
        print(
            f"\nturnfsm demo: interrupted; the durable run of session "
            f"{started[0].session_id} goes on when a worker serves {task_queue!r} "
            f"(cancel it with: temporal workflow cancel -w {started[0].workflow_id})",
            file=sys.stderr,
        )
        return INTERRUPTED_STATUS
    except RPCError as exc:  # the server refused mid-way
        return _lost_server(address, str(exc), started)
    if not result.ok:
        print(f"run failed: {result.error}", file=stream)
        return 1
    print(f"\nfinal answer ({result.turns} model calls): {result.text}", file=stream)
    return 0


def _lost_server(address: str, why: str, started: list[Any]) -> int:
    """Say that `turnfsm demo --durable` lost its server; return the exit status."""
    kept = (
        f"; the run of session {started[0].session_id} is kept by the server "
        "and goes on when it is back (turnfsm sessions show it in the worker's "
        "store)"
        if started
        else "; no run was started"
    )
    print(
        f"turnfsm demo: lost the Temporal server at {address} ({why}){kept}",
        file=sys.stderr,
    )
    return 1
