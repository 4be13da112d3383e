"""`max_overflow_retries` counts the provider's overflows in a row.

A run whose counter reads the provider's size low (a local model fed digits)
meets an overflow now and then, each recovered by a compact-and-retry pass
and answered. A model reply starts the count again, so only overflows with
no reply between them end the run. A run logged before the count started
again replays and resumes as it ran: failed on its third overflow.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs
import pytest

from tests.helpers import REPO_ROOT
from turnfsm import replay
from turnfsm.context import (
    CompactionContext,
    CompactionProposal,
    ContextManager,
    PinRules,
)
from turnfsm.core import MachineSpec, TurnMachine
from turnfsm.driver import Driver, RetryPolicy, Session
from turnfsm.errors import CONTEXT_OVERFLOW, ContextExceeded, ProviderError
from turnfsm.messages import Message
from turnfsm.persistence import RunOpened, load_session
from turnfsm.providers import ModelRequest
from turnfsm.testing import FakeModelClient, reply, tool_call
from turnfsm.tokens import HeuristicTokenCounter

TOO_LONG = ProviderError("prompt is too long", kind=CONTEXT_OVERFLOW, status=400)
NO_WAIT = RetryPolicy(max_attempts=1)

pytestmark = pytest.mark.anyio


class DropOldest:
    """A compactor that always makes progress: it drops the first message."""

    async def compact(
        self, messages: Sequence[Message], target: int, ctx: CompactionContext
    ) -> CompactionProposal:
        return CompactionProposal.compacted(list(messages[1:]), ctx.tokens_before, 0)


def look(path: str) -> str:
    """Read a file.

    Args:
        path: the file.
    """
    return f"contents of {path}"


def scripted(*, overflows_after: int, in_a_row: int) -> FakeModelClient:
    """A model that asks for a tool `overflows_after` times, then answers.

    Each call after a tool result is refused `in_a_row` times first, as a
    provider whose window the counter reads low refuses it.
    """
    replies = [0]
    refused = [0]

    def handler(request: ModelRequest) -> Message:
        last = request.messages[-1]
        if last.tool_results and refused[0] < in_a_row:
            refused[0] += 1
            raise TOO_LONG
        refused[0] = 0
        replies[0] += 1
        if replies[0] <= overflows_after:
            return reply("", tool_call("look", f"c{replies[0]}", path="notes.txt"))
        return reply("all read")

    return FakeModelClient(handler)


def history() -> list[Message]:
    """A conversation the compactor can drop messages of, one a pass."""
    out: list[Message] = []
    for i in range(12):
        out += [Message.user(f"question {i}"), Message.assistant(f"answer {i}")]
    return out


def driver(model: FakeModelClient) -> Driver:
    context = ContextManager(
        DropOldest(),
        context_window=100_000,
        counter=HeuristicTokenCounter(),
        pins=PinRules(first_user=False),  # it drops the first message
    )
    return Driver(
        model=model,
        tools=[look],
        context=context,
        max_overflow_retries=2,
        retry=NO_WAIT,
    )


async def test_an_overflow_after_each_of_four_replies_is_recovered_each_time() -> None:
    """Four overflows in a run, none two in a row: the run is done."""
    model = scripted(overflows_after=4, in_a_row=1)
    session = Session()

    result = await driver(model).run(
        [*history(), Message.user("read")], session=session
    )

    assert (result.outcome, result.text) == ("done", "all read")
    events = [type(e).__name__ for e in session.runs[0].events]
    assert events.count("ContextOverflowed") == 4
    assert session.runs[0].opened.overflow_retries_in_a_row
    assert replay(None, session, session.runs[0].run_id).ok


async def test_three_overflows_in_a_row_still_end_the_run() -> None:
    """With no reply in between, the third overflow is one too many."""
    model = scripted(overflows_after=1, in_a_row=3)
    session = Session()

    result = await driver(model).run(
        [*history(), Message.user("read")], session=session
    )

    assert result.outcome == "failed"
    assert type(result.error) is ContextExceeded
    events = [type(e).__name__ for e in session.runs[0].events]
    assert events.count("ContextOverflowed") == 3
    assert events.count("CompactionResult") == 2
    assert replay(None, session, session.runs[0].run_id).ok


def counting_over_the_run(
    start: Callable[..., TurnMachine],
) -> Callable[..., TurnMachine]:
    """`TurnMachine.start` as turnfsm ran it before: overflows count per run."""

    def start_as_before(spec: MachineSpec, **kwargs: Any) -> TurnMachine:
        snapshot = start(spec, **kwargs).snapshot
        before = attrs.evolve(snapshot, overflow_retries_in_a_row=False)
        return TurnMachine.from_snapshot(spec, before)

    return start_as_before


async def test_a_run_logged_before_replays_as_it_ran(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The run failed on its third overflow, across replies; so does its replay."""
    with monkeypatch.context() as patch:
        patch.setattr(TurnMachine, "start", counting_over_the_run(TurnMachine.start))
        session = Session()
        model = scripted(overflows_after=4, in_a_row=1)
        result = await driver(model).run(
            [*history(), Message.user("read")], session=session
        )
    run = session.runs[0]
    assert type(result.error) is ContextExceeded
    assert [type(e).__name__ for e in run.events].count("ContextOverflowed") == 3
    # Its log is the one turnfsm wrote before: the run opened without the field.
    assert run.opened == RunOpened(
        run_id=run.run_id,
        machine=run.opened.machine,
        digest=run.opened.digest,
        budget=run.opened.budget,
        at=run.opened.at,
        context=run.opened.context,
        output_digest=run.opened.output_digest,
    )

    report = replay(None, session, run.run_id)

    assert report.ok, report.divergence


OLD_LOG = REPO_ROOT / "tests" / "driver" / "logs" / "overflows_counted_per_run.jsonl"
"""A run the turnfsm of before wrote: 4 tool turns, an overflow after each reply."""


async def test_a_log_written_before_replays_exactly() -> None:
    """Its run failed on its third overflow, though each had been recovered."""
    with OLD_LOG.open(encoding="utf-8") as lines:
        session = await load_session(lines)
    run = session.runs[0]
    events = [type(e).__name__ for e in run.events]
    assert not run.opened.overflow_retries_in_a_row
    assert (events.count("ModelReplied"), events.count("ContextOverflowed")) == (3, 3)
    assert (run.outcome, type(run.error)) == ("failed", ContextExceeded)

    report = replay(None, session, run.run_id)

    assert report.ok, report.divergence
    assert report.events == len(events)
