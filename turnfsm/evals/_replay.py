"""Replay a stored session under another context policy (replies held fixed).

The one seam between the benchmark and the replay: `replay_session`. The
k-th model call of each run gets that run's k-th recorded reply, each tool
call its recorded result (by call id); the run goes through a real `Agent`
in a `MemoryStore`, so thresholds, passes and the window checks are the
driver's own. The stored session is never written to.
"""

from __future__ import annotations

import functools
from typing import Any, final

import attrs

from turnfsm.agent import Agent
from turnfsm.context import ContextManager
from turnfsm.core import MachineSpec, ModelReplied
from turnfsm.evals._corpus import recorded_tools
from turnfsm.messages import Message
from turnfsm.persistence import (
    CompactionRecord,
    MemoryStore,
    RunRecord,
    Session,
    event_messages,
)
from turnfsm.providers import ModelRequest
from turnfsm.testing import FakeModelClient

__all__ = ["ReplayedCall", "ReplayedSession", "replay_session"]


@final
@attrs.frozen
class ReplayedCall:
    """One model call of the replay.

    Attributes:
        run_id: The stored run it replays.
        messages: The context the model would see.
        tokens: Its estimate, by the context manager's counter.
        reply: The recorded reply it gets.
        passes: The compaction passes done before it (over the whole session).
    """

    run_id: str
    messages: tuple[Message, ...] = attrs.field(repr=False)
    tokens: int
    reply: Message = attrs.field(repr=False)
    passes: int


@final
@attrs.frozen
class ReplayedSession:
    """A stored session replayed under one context policy.

    Attributes:
        session_id: The stored session.
        calls: Every model call, in order.
        passes: Every compaction pass, in order.
        failed: The runs that failed under this policy, with why.
        history_tokens: The whole stored history's estimate (uncompacted).
    """

    session_id: str
    calls: tuple[ReplayedCall, ...]
    passes: tuple[CompactionRecord, ...]
    failed: tuple[tuple[str, str], ...]
    history_tokens: int


def _replies(run: RunRecord) -> list[Message]:
    return [e.message for e in run.events if isinstance(e, ModelReplied)]


async def replay_session(
    session: Session,
    context: ContextManager,
    *,
    machine: MachineSpec | None = None,
) -> ReplayedSession:
    """Re-run every run of `session` under `context`, replies and results fixed.

    Args:
        session: A stored session.
        context: The context policy to replay under.
        machine: The machine to run on; None: each run's stored machine.
    """
    calls: list[ReplayedCall] = []
    failed: list[tuple[str, str]] = []
    copy = Session(session.id, store=MemoryStore())
    for run in session.runs:
        replies = _replies(run)
        results = {
            part.call_id: part.content
            for event in run.events
            for message in event_messages(event)
            for part in message.tool_results
        }
        names = sorted({c.name for r in replies for c in r.tool_calls})

        def answer(
            request: ModelRequest,
            run_id: str = run.run_id,
            replies: list[Message] = replies,
        ) -> Message:
            k = sum(1 for c in calls if c.run_id == run_id)
            reply = replies[k] if k < len(replies) else Message.assistant("")
            messages = tuple(request.messages)
            done = sum(len(r.compactions) for r in copy.runs)
            calls.append(
                ReplayedCall(run_id, messages, context.count(messages), reply, done)
            )
            return reply

        stored = machine or session.machine(run.opened.digest)
        options: dict[str, Any] = {} if stored is None else {"machine": stored}
        agent = Agent(
            model=FakeModelClient(answer),
            tools=recorded_tools(functools.partial(dict, results), names),
            context=context,
            session=copy,
            max_turns=1000,
            **options,
        )
        result = await agent.run(list(run.input))
        if result.outcome != "done":
            failed.append((run.run_id, str(result.error or result.outcome)))
    passes = tuple(c for r in copy.runs for c in r.compactions)
    return ReplayedSession(
        session.id,
        tuple(calls),
        passes,
        tuple(failed),
        context.count(list(session.history)),
    )
