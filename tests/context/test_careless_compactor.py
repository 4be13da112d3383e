"""The manager accepts only valid conversations, whoever wrote the compactor.

A careless compactor drops, moves, duplicates and inserts messages (tool
calls and results among them) in a generated valid history. Whatever it does,
a result the manager accepts passes `check_history`, repeats no message id and
keeps the messages it keeps in their order, and a result it rejects is
reported as `CompactorFailed`.
"""

from __future__ import annotations

from collections.abc import Coroutine, Sequence
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.generators import CALL_IDS, histories, valid
from tests.profiles import heavy, sized
from turnfsm.context import (
    CompactionContext,
    CompactionProposal,
    CompactionRequest,
    ContextManager,
    PinRules,
)
from turnfsm.core import (
    CompactionNoop,
    CompactionResult,
    CompactorFailed,
    CompactReason,
    PassEvent,
)
from turnfsm.errors import InvalidMessage
from turnfsm.messages import (
    Message,
    ToolCallPart,
    check_history,
)
from turnfsm.tokens import HeuristicTokenCounter

COUNTER = HeuristicTokenCounter()


Edit = tuple[int, int, int]
edits = st.lists(
    st.tuples(st.integers(0, 5), st.integers(0, 63), st.integers(0, 63)),
    max_size=4,
)


def apply(messages: Sequence[Message], plan: Sequence[Edit]) -> list[Message]:
    """Apply a careless compactor's edits (indices wrap around)."""
    out = list(messages)
    for n, (kind, a, b) in enumerate(plan):
        if not out:
            break
        i, j = a % len(out), b % (len(out) + 1)
        match kind:
            case 0:  # DROP
                del out[i]
            case 1:  # MOVE
                out.insert(j % len(out), out.pop(i))
            case 2:  # DUPLICATE
                out.insert(j, out[i])
            case 3:  # INSERT_RESULT: often an id that is called somewhere
                call_id = CALL_IDS[a % len(CALL_IDS)]
                out.insert(j, Message.tool_result(call_id, "x", id=f"new{n}"))
            case 4:  # INSERT_CALL
                call = ToolCallPart(id=CALL_IDS[a % len(CALL_IDS)], name="tool")
                out.insert(j, Message.assistant("", tool_calls=[call], id=f"new{n}"))
            case _:  # INSERT_TEXT: harmless where no pair straddles it
                out.insert(j, Message.user("x", id=f"new{n}"))
    return out


class Careless:
    """A compactor that answers with the edited input, without awaiting."""

    def __init__(self, plan: Sequence[Edit]) -> None:
        self.plan = plan
        self.returned: list[Message] = []

    async def compact(
        self, messages: Sequence[Message], target: int, ctx: CompactionContext
    ) -> CompactionProposal:
        self.returned = apply(messages, self.plan)
        return CompactionProposal.compacted(self.returned, ctx.tokens_before, 0)


def run_sync(coro: Coroutine[Any, Any, PassEvent]) -> PassEvent:
    """Drive a pass that never suspends (the compactor does not await)."""
    try:
        coro.send(None)
    except StopIteration as stop:
        result: PassEvent = stop.value
        return result
    coro.close()
    raise AssertionError("the pass suspended")


def is_valid(messages: Sequence[Message], source: Sequence[Message] = ()) -> bool:
    """A whole conversation, no id twice, and what it keeps of `source` in order."""
    if not messages or len({m.id for m in messages}) != len(messages):
        return False
    try:
        check_history(messages)
    except InvalidMessage:
        return False
    place = {m.id: i for i, m in enumerate(source)}
    kept = [place[m.id] for m in messages if m.id in place]
    return kept == sorted(kept)


def test_the_repaired_generator_gives_valid_histories() -> None:
    @given(histories(max_messages=12))
    @settings(max_examples=sized(200), deadline=None)
    def check(messages: list[Message]) -> None:
        assert is_valid(valid(messages)) or not valid(messages)

    check()


@heavy(10_000, suppress_health_check=[HealthCheck.filter_too_much])
@given(histories(max_messages=12), edits)
def test_accepted_results_are_valid_and_rejections_are_compactor_errors(
    generated: list[Message], plan: list[Edit]
) -> None:
    messages = valid(generated)
    compactor = Careless(plan)
    # Structure only: the careless edits drop and rewrite pinned messages too,
    # which the pins' own property test covers (test_pins.py); its rules are off.
    mgr = ContextManager(
        compactor,
        context_window=0,
        counter=COUNTER,
        pins=PinRules(system_prompt=False, first_user=False, latest_user=False),
    )

    decision = run_sync(
        mgr.compact(
            CompactionRequest(
                messages=messages, turn=1, reason=CompactReason.MANUAL, reserved=2
            )
        )
    )

    if not messages:
        assert isinstance(decision, CompactionNoop)
        return
    returned = compactor.returned
    event(type(decision).__name__)
    if is_valid(returned, messages):
        assert isinstance(decision, CompactionResult | CompactionNoop)
        if isinstance(decision, CompactionResult):
            assert decision.messages == tuple(returned)
            check_history(decision.messages)
    else:
        assert isinstance(decision, CompactorFailed)
        assert decision.used == COUNTER.count(messages) + 2
        assert decision.error.type == "CompactorError"
