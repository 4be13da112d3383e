"""The worker that serves durable runs: `create_worker`, `run_worker`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from temporalio.client import Client
from temporalio.worker import UnsandboxedWorkflowRunner, Worker, WorkflowRunner

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

For a worker you run in Temporal's sandbox (see `workflow_runner`):
``SandboxRestrictions.default.with_passthrough_modules(*PASSTHROUGH)``.
turnfsm's brain is pure (its determinism is tested apart); importing it
once keeps each workflow run cheap. The agent's own modules (its tools,
model, hooks) live in the process that registered it: workflows find the
agent by name (`register`), they never import it.
"""


def workflow_runner() -> WorkflowRunner:
    """The runner `create_worker` runs workflows on: Temporal's unsandboxed one.

    A durable run's workflow runs turnfsm's own code and the agent's hooks,
    which the worker's process built before any workflow ran: Temporal's
    sandbox would re-import none of it (it passes `PASSTHROUGH` through),
    so it would guard nothing, yet it forbids ``open`` and ``input`` to
    every observing hook (a hook appending to a file crashed the run) and
    makes the workflow's side of a run cost about 1.7 times the CPU time.
    Replay a run's history (`temporalio.worker.Replayer`) on this runner, as
    its workers ran it.

    To run in the sandbox all the same, pass ``workflow_runner=``
    ``SandboxedWorkflowRunner(restrictions=SandboxRestrictions.default``
    ``.with_passthrough_modules(*PASSTHROUGH))`` to `create_worker`; hooks
    called in the workflow may then open no files.
    """
    return UnsandboxedWorkflowRunner()


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
    `DurableOptions.retry_max`). `options` go to `temporalio.worker.Worker`;
    its workflows run on `workflow_runner()` unless `options` name another.

    Raises:
        ConfigError: `agents` is empty or two of them share a name, or
            `task_queue` is empty.
    """
    if isinstance(agents, str | bytes | Mapping):
        raise ConfigError("agents", agents, "an Agent or a sequence of Agents")
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
