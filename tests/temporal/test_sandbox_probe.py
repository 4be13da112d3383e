"""What turnfsm and anyio may do inside Temporal's default sandboxed runner.

A regression probe for `turnfsm.temporal`. With `turnfsm` and `anyio` passed
through, the pure core runs in a workflow, `anyio.lowlevel.checkpoint()` works,
an `anyio.CancelScope` cancelled from a signal cancels a timer or a condition
wait, a shielded scope runs a clean-up activity after the workflow was
cancelled, and the history replays (`is_replaying()` False on the first run,
True on replay). What the sandbox needs:

- The lazy names (PEP 562, `importlib.import_module`) bypass the sandbox's
  pass-through: `turnfsm.default_machine` imports `turnfsm._resources` in the
  sandbox (its `Path.resolve` is then restricted) and anyio imports its
  asyncio backend (a `threading.Thread` subclass) the same way, unless those
  modules are imported at the workflow module's top, as here.
- Imports inside `run()` warn ("imported after initial workflow load"), which
  `filterwarnings = error` turns into a failed workflow task.

Not tested because it hangs: an `anyio.CancelScope` around an activity (or
anything whose cancellation the server must confirm). The SDK swallows the
`CancelledError`, requests the cancel and waits for the next activation; anyio
re-delivers the cancel with `call_soon` on every loop pass, so the activation
never ends: TMPRL1101 "Potential deadlock detected", sandboxed or not. Cancel
an activity by cancelling its task (`asyncio.Task.cancel`): the await then
raises `ActivityError` caused by `CancelledError`, as tested here.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import anyio
import anyio._backends._asyncio
import anyio.lowlevel
import pytest

import turnfsm
import turnfsm._resources
import turnfsm.core

pytest.importorskip("temporalio")

from temporalio import activity, workflow
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.exceptions import ActivityError, CancelledError
from temporalio.worker import (
    ExecuteWorkflowInput,
    Interceptor,
    Replayer,
    Worker,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
)
from temporalio.worker.workflow_sandbox import (
    SandboxedWorkflowRunner,
    SandboxRestrictions,
)
from temporalio.workflow import ActivityCancellationType

pytestmark = pytest.mark.anyio

PASSTHROUGH = ("turnfsm", "anyio")


def sandboxed() -> SandboxedWorkflowRunner:
    return SandboxedWorkflowRunner(
        restrictions=SandboxRestrictions.default.with_passthrough_modules(*PASSTHROUGH)
    )


# -- activities (outside the sandbox) -------------------------------------------
STARTED: dict[str, asyncio.Event] = {}
CALLS: list[str] = []


@activity.defn
async def wait_until_cancelled(key: str) -> str:
    STARTED.setdefault(key, asyncio.Event()).set()
    try:
        while True:
            activity.heartbeat()
            await asyncio.sleep(0.1)
    except asyncio.CancelledError:
        CALLS.append(f"{key}: activity cancelled")
        raise


@activity.defn
async def record(text: str) -> str:
    CALLS.append(text)
    return text


# -- workflows (inside the sandbox) ---------------------------------------------
@workflow.defn
class CoreAndScopes:
    def __init__(self) -> None:
        self.scope: anyio.CancelScope | None = None
        self.task: asyncio.Task[str] | None = None

    @workflow.run
    async def run(self, key: str) -> dict[str, Any]:
        out: dict[str, Any] = {"first_replaying": workflow.unsafe.is_replaying()}
        machine = turnfsm.TurnMachine.start(turnfsm.default_machine())
        decision = machine.handle(
            turnfsm.core.RunStarted(input=(turnfsm.Message.user("hi"),))
        )
        out["decision"] = type(decision).__name__
        out["phase"] = str(machine.phase)
        await anyio.lowlevel.checkpoint()
        with anyio.CancelScope() as scope:
            self.scope = scope
            await workflow.wait_condition(lambda: False)
        self.scope = None
        out["scope_cancelled"] = scope.cancelled_caught
        self.task = asyncio.create_task(
            workflow.execute_activity(
                wait_until_cancelled,
                key,
                start_to_close_timeout=timedelta(seconds=30),
                heartbeat_timeout=timedelta(seconds=2),
                cancellation_type=ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
            )
        )
        try:
            await self.task
        except ActivityError as error:
            out["activity_cancelled"] = isinstance(error.cause, CancelledError)
        out["after"] = await workflow.execute_activity(
            record, f"{key}: after", start_to_close_timeout=timedelta(seconds=10)
        )
        out["last_replaying"] = workflow.unsafe.is_replaying()
        return out

    @workflow.query
    def waiting(self) -> bool:
        return self.scope is not None

    @workflow.signal
    def cancel(self) -> None:
        if self.scope is not None:
            self.scope.cancel()
        elif self.task is not None:
            self.task.cancel()


@workflow.defn
class ShieldedCleanUp:
    def __init__(self) -> None:
        self.is_waiting = False

    @workflow.run
    async def run(self, key: str) -> None:
        try:
            self.is_waiting = True
            await workflow.wait_condition(lambda: False)
        except asyncio.CancelledError:
            with anyio.CancelScope(shield=True):
                await workflow.execute_activity(
                    record,
                    f"{key}: clean-up",
                    start_to_close_timeout=timedelta(seconds=10),
                )
            raise

    @workflow.query
    def waiting(self) -> bool:
        return self.is_waiting


# -- replay: the interceptor (outside the sandbox) keeps what run() returned -----
RESULTS: list[Any] = []


class _Inbound(WorkflowInboundInterceptor):
    async def execute_workflow(self, input: ExecuteWorkflowInput) -> Any:
        result = await super().execute_workflow(input)
        RESULTS.append(result)
        return result


class KeepResults(Interceptor):
    def workflow_interceptor_class(
        self, input: WorkflowInterceptorClassInput
    ) -> type[WorkflowInboundInterceptor]:
        return _Inbound


async def wait_until_waiting(handle: WorkflowHandle[Any, Any]) -> None:
    """Poll the workflow's `waiting` query until it is True."""
    for _ in range(500):
        if await handle.query("waiting"):
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the workflow never waited")


@pytest.fixture
def key() -> Iterator[str]:
    name = uuid.uuid4().hex
    yield name
    STARTED.pop(name, None)


async def test_core_and_cancel_scopes_in_the_sandbox(
    temporal_client: Client, key: str
) -> None:
    queue = f"probe-{key}"
    STARTED[key] = asyncio.Event()
    async with Worker(
        temporal_client,
        task_queue=queue,
        workflows=[CoreAndScopes],
        activities=[wait_until_cancelled, record],
        workflow_runner=sandboxed(),
    ):
        handle = await temporal_client.start_workflow(
            CoreAndScopes.run, key, id=f"probe-{key}", task_queue=queue
        )
        await wait_until_waiting(handle)
        await handle.signal(CoreAndScopes.cancel)
        await asyncio.wait_for(STARTED[key].wait(), 10)
        await handle.signal(CoreAndScopes.cancel)
        out = await handle.result()
    assert out == {
        "first_replaying": False,
        "decision": "Measure",
        "phase": "start",
        "scope_cancelled": True,
        "activity_cancelled": True,
        "after": f"{key}: after",
        "last_replaying": False,
    }
    assert f"{key}: activity cancelled" in CALLS

    RESULTS.clear()
    history = await handle.fetch_history()
    replayer = Replayer(
        workflows=[CoreAndScopes],
        workflow_runner=sandboxed(),
        interceptors=[KeepResults()],
    )
    await replayer.replay_workflow(history)
    assert len(RESULTS) == 1
    assert RESULTS[0] == {**out, "first_replaying": True, "last_replaying": True}


async def test_a_shielded_scope_runs_an_activity_after_cancellation(
    temporal_client: Client, key: str
) -> None:
    queue = f"probe-{key}"
    async with Worker(
        temporal_client,
        task_queue=queue,
        workflows=[ShieldedCleanUp],
        activities=[record],
        workflow_runner=sandboxed(),
    ):
        handle = await temporal_client.start_workflow(
            ShieldedCleanUp.run, key, id=f"probe-{key}", task_queue=queue
        )
        await wait_until_waiting(handle)
        await handle.cancel()
        with pytest.raises(WorkflowFailureError) as failure:
            await handle.result()
    assert isinstance(failure.value.cause, CancelledError)
    assert f"{key}: clean-up" in CALLS
    history = await handle.fetch_history()
    await Replayer(
        workflows=[ShieldedCleanUp], workflow_runner=sandboxed()
    ).replay_workflow(history)
