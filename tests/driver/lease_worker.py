"""A process whose run holds its session, then hangs in a tool.

    python -m tests.driver.lease_worker DB SESSION_ID

It prints ``holding`` once its tool has started (the run holds the session's
lease and renews it), then waits until it is killed.
"""

from __future__ import annotations

import sys

import anyio

from turnfsm import Driver
from turnfsm.persistence import Session, SQLiteStore
from turnfsm.testing import ScriptedModel, reply, tool_call

TTL = 1.0
"""The lease's time to live, in seconds (short, for the test)."""


def build(hang: bool) -> Driver:
    async def work(step: str) -> str:
        """Do one step of the work.

        Args:
            step: the step.
        """
        if hang:
            print("holding", flush=True)
            await anyio.sleep_forever()
        return f"did {step}"

    model = ScriptedModel.of(reply("", tool_call("work", "c1", step="one")), "all done")
    return Driver(model=model, tools=[work], lease_ttl=TTL)


async def main(path: str, session_id: str) -> None:
    session = await Session.open(SQLiteStore(path), session_id)
    await build(hang=True).run("do the work", session=session)


if __name__ == "__main__":
    anyio.run(main, *sys.argv[1:])
