"""A stored session under another context policy, through `simulate`.

The one seam between the benchmark and the replay: `replay_session`. The
k-th model call of each run gets that run's k-th recorded reply, each tool
call its recorded result (by call id); thresholds, passes and window checks
are the driver's own (see `turnfsm.simulate.simulate`). The stored session
is never written to.
"""

from __future__ import annotations

from decimal import Decimal
from typing import final

import attrs

from turnfsm.context import ContextManager
from turnfsm.core import CompactionResult, MachineSpec
from turnfsm.messages import Message
from turnfsm.persistence import CompactionRecord, Session, event_messages
from turnfsm.providers import ModelClient
from turnfsm.simulate import simulate

__all__ = ["ReplayedCall", "ReplayedSession", "replay_session"]


@final
@attrs.frozen
class ReplayedCall:
    """One model call of the replay.

    Attributes:
        run_id: The stored run it replays.
        messages: The context the model would see.
        tokens: The request's estimate, as the run measured it.
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
        cut_short: The runs that made fewer model calls than they recorded
            (they failed under this policy, e.g. over the window).
        history_tokens: The whole conversation's estimate, uncompacted: what
            every run brought in, committed or not (a paused run's too).
        caveats: What the replay cannot know, and where it differed.
        cost: The price of every call and summary at the chosen model's
            prices, in US dollars (None: no prices asked for).
        summary_cost: The part of `cost` the summaries' model calls make.
        differences: Where a replayed run ended otherwise than the stored
            one, in words, with its error (why a run was cut short).
    """

    session_id: str
    calls: tuple[ReplayedCall, ...]
    passes: tuple[CompactionRecord, ...]
    cut_short: tuple[str, ...]
    history_tokens: int
    caveats: tuple[str, ...] = ()
    cost: Decimal | None = None
    summary_cost: Decimal | None = None
    differences: tuple[str, ...] = ()


async def replay_session(
    session: Session,
    context: ContextManager,
    *,
    machine: MachineSpec | None = None,
    summary_model: ModelClient | None = None,
    prices: str | None = None,
) -> ReplayedSession:
    """Re-run every run of `session` under `context`, replies and results fixed.

    Args:
        session: A stored session.
        context: The context policy to replay under.
        machine: The machine to run on; None: each run's stored machine.
        summary_model: Answers the summaries the strategy asks for (None:
            only the recorded ones, reused when the request is the same).
        prices: A known model's name (``gpt-4o``) whose prices cost the
            calls and the summaries (None: no costs).

    Raises:
        ConfigError: the session cannot be replayed (see `simulate`).
    """
    simulation = await simulate(
        session,
        context=context,
        machine=machine,
        summary_model=summary_model,
        prices=prices,
    )
    order = {run.run_id: n for n, run in enumerate(session.runs)}
    # A pass in turn t of a run (t calls made) comes before its call t + 1.
    points = sorted((order[p.run_id], p.turn + 1) for p in simulation.passes)
    calls = []
    for call in simulation.calls:
        at = (order[call.run_id], call.turn)
        done = sum(1 for point in points if point <= at)
        calls.append(
            ReplayedCall(call.run_id, call.messages, call.tokens, call.reply, done)
        )
    made: dict[str, int] = {}
    for call in simulation.calls:
        made[call.run_id] = made.get(call.run_id, 0) + 1
    short = tuple(
        run.run_id for run in session.runs if made.get(run.run_id, 0) < len(run.turns)
    )
    return ReplayedSession(
        session.id,
        tuple(calls),
        simulation.passes,
        short,
        context.count(_said(session)),
        simulation.caveats,
        simulation.cost,
        simulation.summary_cost,
        simulation.differences,
    )


def _said(session: Session) -> list[Message]:
    """The whole conversation of `session`, as said: no pass applied.

    What every run brought in (its input, the replies, the tool results),
    without what its passes replaced them with: a run that did not end done
    (paused, interrupted, failed) counts too, as its last calls carried
    what it brought, committed or not.
    """
    out: list[Message] = []
    for run in session.runs:
        for event in run.events:
            if not isinstance(event, CompactionResult):
                out.extend(event_messages(event))
    return out
