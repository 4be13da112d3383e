"""Durable runs: the Turn FSM as a Temporal workflow (extra ``turnfsm[temporal]``).

The workflow runs the brain and the driver's own loop; every effect that
meets the outside world (a model call, a tool call, a compaction pass, a
custom effect, the session log's I/O) is an activity, so a worker killed
mid-run is replaced by another that goes on at the same phase, and no
finished tool call runs again.

Example:
    ```python
    from temporalio.client import Client
    from turnfsm.temporal import create_worker, start_durable

    async def main() -> None:
        client = await Client.connect("127.0.0.1:7233")
        async with create_worker(client, "agents", agent):
            run = await start_durable(
                agent, "Audit the logs", client=client, task_queue="agents"
            )
            result = await run.result()
    ```

Or run ``turnfsm worker --task-queue agents --agent myapp:agent``.
"""

from turnfsm.temporal._activities import ACTIVITIES, append_once, register
from turnfsm.temporal._client import DurableRun, start_durable

# For the command line (not in `__all__`): the reason in the SDK's words,
# and whether a worker serves a task queue.
from turnfsm.temporal._client import queue_polled as queue_polled
from turnfsm.temporal._client import sdk_reason as sdk_reason
from turnfsm.temporal._payloads import DurableOptions, RunSpec, RunStatus
from turnfsm.temporal._remote import EffectCrashed
from turnfsm.temporal._worker import (
    PASSTHROUGH,
    create_worker,
    run_worker,
    workflow_runner,
)
from turnfsm.temporal._workflow import TurnWorkflow

__all__ = [
    "ACTIVITIES",
    "PASSTHROUGH",
    "DurableOptions",
    "DurableRun",
    "EffectCrashed",
    "RunSpec",
    "RunStatus",
    "TurnWorkflow",
    "append_once",
    "create_worker",
    "register",
    "run_worker",
    "start_durable",
    "workflow_runner",
]
