"""A stored session that delegated: a lead, its two sub-agents and a grandchild.

``ses_lead``'s one run calls ``mid`` (call ``call_mid``) and ``leaf`` (call
``call_solo``) in one batch; ``mid`` calls ``leaf`` in turn (call
``call_leaf``). Each leaf answers at once. A second session, ``ses_alone``,
delegated nothing.
"""

from __future__ import annotations

from pathlib import Path

import anyio

from turnfsm import Agent
from turnfsm.persistence import Session, SQLiteStore, descendants
from turnfsm.providers import ModelRequest, ModelResponse
from turnfsm.testing import FakeModelClient, reply, tool_call
from turnfsm.values import Usage

LEAF_USAGE = Usage(input_tokens=40, output_tokens=3)
LEAD = "ses_lead"
ALONE = "ses_alone"


def _delegating(*calls: tuple[str, str]) -> FakeModelClient:
    """Calls the given tools (name, call id) at once, then says it is done."""

    def answer(request: ModelRequest) -> ModelResponse:
        if request.messages[-1].tool_results:
            message = reply("all done")
        else:
            message = reply("", *[tool_call(n, i, task=f"do {n}") for n, i in calls])
        return ModelResponse(message=message, usage=Usage(input_tokens=100))

    return FakeModelClient(answer)


def _leaf() -> Agent:
    answer = ModelResponse(message=reply("leaf done"), usage=LEAF_USAGE)
    return Agent(model=FakeModelClient(lambda _request: answer))


async def _store(path: Path) -> None:
    store = SQLiteStore(path)
    try:
        leaf = _leaf().as_tool(name="leaf", description="Answer at once")
        mid = Agent(model=_delegating(("leaf", "call_leaf")), tools=[leaf])
        lead = Agent(
            model=_delegating(("mid", "call_mid"), ("leaf", "call_solo")),
            tools=[mid.as_tool(name="mid", description="Delegate again"), leaf],
            session=Session(LEAD, store=store),
        )
        result = await lead.run("delegate it")
        assert result.outcome == "done", result
        alone = Agent(model=_delegating(), session=Session(ALONE, store=store))
        assert (await alone.run("answer")).outcome == "done"
    finally:
        await store.aclose()


def delegating_store(path: Path) -> Path:
    """Write the sessions into a new SQLite file at `path`; return `path`."""
    anyio.run(_store, path)
    return path


def family(path: Path) -> list[Session]:
    """The sessions below ``ses_lead`` in `path`, each before its children."""

    async def read() -> list[Session]:
        store = SQLiteStore(path)
        try:
            return await descendants(store, LEAD)
        finally:
            await store.aclose()

    return anyio.run(read)
