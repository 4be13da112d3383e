"""The dev server runs a workflow and its activity end to end."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest

pytest.importorskip("temporalio")

from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.worker import Worker

pytestmark = pytest.mark.anyio


@activity.defn
async def shout(text: str) -> str:
    return text.upper() + "!"


@workflow.defn(sandboxed=False)
class Shouting:
    @workflow.run
    async def run(self, text: str) -> str:
        return await workflow.execute_activity(
            shout, text, start_to_close_timeout=timedelta(seconds=10)
        )


async def test_a_workflow_runs_its_activity(temporal_client: Client) -> None:
    queue = f"smoke-{uuid.uuid4().hex}"
    async with Worker(
        temporal_client, task_queue=queue, workflows=[Shouting], activities=[shout]
    ):
        result = await temporal_client.execute_workflow(
            Shouting.run, "hi", id=f"smoke-{uuid.uuid4().hex}", task_queue=queue
        )
    assert result == "HI!"
