"""A pass's whole output, pinned: its messages, its sizes and its verdict.

Speed work on the pass (fewer scans, fewer counts) must not change what a
pass answers. Each case runs a `ContextManager` pass over one varied
conversation and compares a digest of everything the event carries with the
digest recorded before that work: a change shows up here, whatever it is.
"""

from __future__ import annotations

import hashlib
import json
import operator
from typing import Any

import anyio
import attrs
import pytest

from turnfsm.context import (
    CompactionRequest,
    ContextManager,
    MaskingCompactor,
    TruncatingCompactor,
)
from turnfsm.core import CompactionResult, CompactReason, PassEvent
from turnfsm.messages import Message, ToolCallPart


def conversation() -> tuple[Message, ...]:
    """A system prompt, three exchanges of tool work, every kind of part.

    Parallel calls, a reused call id, results short, long (over the
    digest's 200 characters) and huge (over the 4,000-character cap), an
    error result, a pinned message, and a lone call in flight at the end.
    """
    out = [Message.system("You are a careful coding agent.", id="sys")]
    for turn in range(3):
        out.append(Message.user(f"turn {turn}: fix the failing test", id=f"u{turn}"))
        for step in range(3):
            ids = [f"c{turn}{step}{k}" for k in range(2)]
            if turn == 1 and step == 2:
                ids = ["reused", "reused"]
            calls = [
                ToolCallPart(id=i, name="read_file", arguments={"path": f"src/{i}.py"})
                for i in ids
            ]
            out.append(Message.assistant("", tool_calls=calls, id=f"a{turn}{step}"))
            for k, i in enumerate(ids):
                size = (turn * 7 + step * 3 + k) % 4
                content = ["ok", "x = 1\n" * 50, "y" * 5_000, "def f(): ..."][size]
                out.append(
                    Message.tool_result(
                        i, content, is_error=size == 3, id=f"r{turn}{step}{k}"
                    )
                )
        reply = Message.assistant(f"fixed in turn {turn}. " * 20, id=f"f{turn}")
        out.append(reply.pin() if turn == 1 else reply)
    out.append(Message.user("and the docs too", id="u3"))
    late = ToolCallPart(id="late", name="read_file", arguments={"path": "README"})
    out.append(Message.assistant("", tool_calls=[late], id="a30"))
    return tuple(out)


def digest(event: PassEvent) -> str:
    """The sha256 of everything `event` carries, messages field by field."""

    def plain(value: Any) -> Any:
        if isinstance(value, Message):
            return value.to_dict()
        if attrs.has(type(value)):
            return {
                "type": type(value).__name__,
                **{
                    f.name: plain(getattr(value, f.name))
                    for f in attrs.fields(type(value))
                },
            }
        if isinstance(value, tuple | list):
            return [plain(v) for v in value]
        return value

    text = json.dumps(plain(event), sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def run(manager: ContextManager, **request: Any) -> PassEvent:
    async def go() -> PassEvent:
        return await manager.compact(CompactionRequest(turn=1, **request))

    return anyio.run(go)


CASES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "masking-emergency": ({}, {"reason": CompactReason.EMERGENCY}),
    "masking-threshold-tight": (
        {},
        {"reason": CompactReason.THRESHOLD_EXCEEDED, "target_tokens": 900},
    ),
    "masking-threshold-loose": (
        {},
        {"reason": CompactReason.THRESHOLD_EXCEEDED, "target_tokens": 4_000},
    ),
    "masking-threshold-cap-only": (
        {},
        {"reason": CompactReason.THRESHOLD_EXCEEDED, "target_tokens": 15_000},
    ),
    "masking-message-count": ({}, {"reason": CompactReason.MESSAGE_COUNT}),
    "masking-manual-given-size": (
        {},
        {"reason": CompactReason.MANUAL, "tokens_before": 9_000, "reserved": 300},
    ),
    "masking-pinned-by-request": (
        {},
        {"reason": CompactReason.EMERGENCY, "pinned": ("r100", "a21")},
    ),
    "truncating": (
        {"compactor": TruncatingCompactor()},
        {"reason": CompactReason.EMERGENCY, "reserved": 1_500},
    ),
    "priced-payback": (
        {"prices": "claude-sonnet-4-5", "cache_payback_calls": 3},
        {"reason": CompactReason.THRESHOLD_EXCEEDED, "target_tokens": 2_000},
    ),
    "masking-small-results": (
        {"compactor": MaskingCompactor(mask_min_chars=10, keep_recent_calls=1)},
        {"reason": CompactReason.THRESHOLD_EXCEEDED, "target_tokens": 3_000},
    ),
}

EXPECTED: dict[str, tuple[str, int, int, str, str]] = {
    "masking-emergency": (
        "CompactionResult",
        24937,
        1633,
        "9bae8b754d16a438",
        "cf8913f4821679cb",
    ),
    "masking-manual-given-size": (
        "CompactionResult",
        9000,
        1017,
        "9262f82ce48a27b7",
        "f81445a3f3f18e8d",
    ),
    "masking-message-count": (
        "CompactionResult",
        24937,
        717,
        "c8969a50dd864cbd",
        "f81445a3f3f18e8d",
    ),
    "masking-pinned-by-request": (
        "CompactionResult",
        24937,
        6398,
        "22f4b87ff5b0623e",
        "5c3f5366a208774b",
    ),
    "masking-small-results": (
        "CompactionResult",
        24937,
        1487,
        "37c583ddc538453e",
        "a1fb76b4996cd908",
    ),
    "masking-threshold-cap-only": (
        "CompactionResult",
        24937,
        1633,
        "9bae8b754d16a438",
        "cf8913f4821679cb",
    ),
    "masking-threshold-loose": (
        "CompactionResult",
        24937,
        1633,
        "9bae8b754d16a438",
        "cf8913f4821679cb",
    ),
    "masking-threshold-tight": (
        "CompactionResult",
        24937,
        717,
        "c8969a50dd864cbd",
        "f81445a3f3f18e8d",
    ),
    "priced-payback": (
        "CompactionResult",
        24937,
        1633,
        "25affdd2702756be",
        "9b95d364aa6953a0",
    ),
    "truncating": (
        "CompactionResult",
        26437,
        2217,
        "fe41c93bfadf36c6",
        "f81445a3f3f18e8d",
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_pass_answers_as_recorded(name: str) -> None:
    settings, request = CASES[name]
    manager = ContextManager(context_window=20_000, **settings)
    event = run(manager, messages=conversation(), **request)
    first = (
        type(event).__name__,
        getattr(event, "before", -1),
        getattr(event, "after", -1),
        digest(event),
    )
    # A second pass over the first's result: its recall notes come back in.
    again = event.messages if isinstance(event, CompactionResult) else conversation()
    second = run(manager, messages=again, reason=CompactReason.MESSAGE_COUNT)
    assert (*first, digest(second)) == EXPECTED[name]


@attrs.define
class Recording:
    """A counter that records each list it counts."""

    inner: Any = attrs.field(factory=lambda: ContextManager().counter)
    counted: list[tuple[Message, ...]] = attrs.field(factory=list)

    def count(self, messages: Any) -> int:
        self.counted.append(tuple(messages))
        return int(self.inner.count(messages))

    def count_text(self, text: str) -> int:
        return int(self.inner.count_text(text))

    def times(self, messages: tuple[Message, ...]) -> int:
        """How often these very message objects were counted."""
        return sum(
            len(seen) == len(messages) and all(map(operator.is_, seen, messages))
            for seen in self.counted
        )


@pytest.mark.parametrize("given", [None, 30_000])
def test_a_pass_counts_the_messages_it_was_handed_once(given: int | None) -> None:
    """The strategy's check of the input reuses the manager's count of it.

    Only when the manager measured them: a size the caller gave is the
    caller's, and the strategy counts for itself.
    """
    counter = Recording()
    # Layers 1 and 2 change nothing here: the strategy checks the input.
    strategy = MaskingCompactor(max_tool_result_chars=10_000, mask_min_chars=10_000)
    manager = ContextManager(context_window=20_000, counter=counter, compactor=strategy)
    messages = conversation()
    event = run(
        manager,
        messages=messages,
        reason=CompactReason.THRESHOLD_EXCEEDED,
        target_tokens=900,
        tokens_before=given,
    )
    assert isinstance(event, CompactionResult)
    assert counter.times(messages) == 1  # the manager's, or else the strategy's
    # Outside a pass, nothing is remembered.
    manager.count(messages)
    assert counter.times(messages) == 2
