"""The re-read rate: repeated tool calls within 24 calls after a pass."""

from __future__ import annotations

import pytest

from turnfsm.evals import REREAD_SPAN, ReplayedCall, reread_rate
from turnfsm.messages import Message, ToolCallPart


def _call(n: int, passes: int, *paths: str) -> ReplayedCall:
    calls = [
        ToolCallPart(id=f"c{n}-{k}", name="read_file", arguments={"path": p})
        for k, p in enumerate(paths)
    ]
    reply = Message.assistant("" if calls else "done", tool_calls=calls)
    return ReplayedCall("run", (), 0, reply, passes)


@pytest.mark.parametrize(
    ("plan", "rate"),
    [
        # (passes before the call, the files its reply reads: one a letter)
        ([(0, "a"), (0, "a")], (0, 0)),  # no pass: nothing counts
        ([(0, "a"), (1, "a")], (1, 1)),  # read again right after a pass
        ([(0, "a"), (1, "b")], (0, 1)),  # a new read after a pass
        ([(1, "a"), (1, "a")], (1, 2)),  # the pass came first
        ([(0, "a"), (1, ""), (1, "ab")], (1, 2)),  # a reply without calls
        ([(0, "a"), (1, "bcd"), (2, "a")], (1, 4)),  # a second pass
    ],
)
def test_the_reread_rate(plan: list[tuple[int, str]], rate: tuple[int, int]) -> None:
    calls = [_call(n, passes, *files) for n, (passes, files) in enumerate(plan)]
    assert reread_rate(calls) == rate


def test_a_call_past_the_span_after_a_pass_does_not_count() -> None:
    first = [_call(0, 0, "a"), _call(1, 1, *(f"f{k}" for k in range(REREAD_SPAN)))]
    assert reread_rate([*first, _call(2, 1, "a")]) == (0, REREAD_SPAN)
    assert reread_rate([*first, _call(2, 2, "a")]) == (1, REREAD_SPAN + 1)
