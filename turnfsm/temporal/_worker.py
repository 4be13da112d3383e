"""The worker that serves durable runs: `create_worker`, `run_worker`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from temporalio.client import Client
from temporalio.worker import Worker
from temporalio.worker.workflow_sandbox import (
    SandboxedWorkflowRunner,
    SandboxRestrictions,
)

from turnfsm.agent import Agent
from turnfsm.errors import ConfigError
from turnfsm.temporal._activities import ACTIVITIES, register
from turnfsm.temporal._workflow import TurnWorkflow

__all__ = ["PASSTHROUGH", "create_worker", "run_worker", "workflow_runner"]

PASSTHROUGH = (
    "turnfsm",
    "anyio",
    "sniffio",
    "attrs",
    "cattrs",
    "transitions",
    "jsonschema",
    "referencing",
    "rpds",
    "tenacity",
    "platformdirs",
    "typing_extensions",
)
"""Modules a workflow imports from the worker's process, not anew per run.

turnfsm's brain is pure (its determinism is tested apart); importing it
once keeps each workflow run cheap. The agent's own modules (its tools,
model, hooks) live in the process that registered it: workflows find the
agent by name (`register`), they never import it.
"""


def workflow_runner() -> SandboxedWorkflowRunner:
    """Temporal's sandbox, with turnfsm and its dependencies passed through."""
    return SandboxedWorkflowRunner(
        restrictions=SandboxRestrictions.default.with_passthrough_modules(*PASSTHROUGH)
    )


def create_worker(
    client: Client,
    task_queue: str,
    agents: Agent | Sequence[Agent],
    **options: Any,
) -> Worker:
    """Return a worker serving durable runs of `agents` on `task_queue`.

    Every worker of the queue must serve the same agents (by `Driver.name`),
    built the same way: a workflow started on one worker may go on in
    another. While a deploy adds a tool, a worker without it leaves the
    tool's calls to the workers that have it (for 20 times
    `DurableOptions.retry_max`). `options` go to `temporalio.worker.Worker`.

    Raises:
        ConfigError: `agents` is empty or two of them share a name, or
            `task_queue` is empty.
    """
    listed = (agents,) if isinstance(agents, Agent) else tuple(agents)
    if not listed:
        raise ConfigError("agents", agents, "at least one Agent")
    if not isinstance(task_queue, str) or not task_queue:
        raise ConfigError("task_queue", task_queue, "a non-empty string")
    register(listed, task_queue=task_queue)
    options.setdefault("workflow_runner", workflow_runner())
    return Worker(
        client,
        task_queue=task_queue,
        workflows=[TurnWorkflow],
        activities=list(ACTIVITIES),
        **options,
    )


async def run_worker(
    task_queue: str,
    agents: Agent | Sequence[Agent],
    *,
    address: str = "127.0.0.1:7233",
    namespace: str = "default",
    **options: Any,
) -> None:
    """Connect to Temporal at `address` and serve `task_queue` until cancelled."""
    client = await Client.connect(address, namespace=namespace)
    worker = create_worker(client, task_queue, agents, **options)
    await worker.run()
