"""The entries the store conformance suite writes, and how it compares what it reads."""

from __future__ import annotations

from collections.abc import Sequence

from turnfsm import serde
from turnfsm.core import (
    Budget,
    CompactionResult,
    CompactReason,
    Event,
    ModelReplied,
    Pause,
    RunStarted,
    ToolsFinished,
)
from turnfsm.errors import CompactionStalled
from turnfsm.messages import Message, ToolCallPart
from turnfsm.persistence import (
    Committed,
    CompactionRecord,
    Entry,
    EventRecorded,
    RunEnded,
    RunOpened,
    SummaryRecorded,
    ToolResultRecorded,
    TurnRecord,
)
from turnfsm.values import Usage

__all__ = ["ODD_TEXT", "_odd_entries", "_same", "sample_entries"]

ODD_TEXT = 'ls: \udcff\udc80.txt \ud800 nul \x00 😀 "q" \\u0000'
"""Text a database cannot hold as it is: lone surrogates (an `os.listdir` name
with undecodable bytes), a NUL, and what looks like their escapes."""


def sample_entries(run_id: str = "run_1") -> tuple[Entry, ...]:
    """Return one run's worth of log entries, one of every kind.

    The messages use tool calls, tool results with errors, metadata and
    non-ASCII text, so a store that loses any of it fails the suite.
    """
    call = ToolCallPart(id="tc_1", name="read", arguments={"path": "ü/ñ.md", "n": 2})
    user = Message.user("Zusammenfassung bitte 🙂", id="m_user", metadata={"k": "v"})
    asked = Message.assistant("", tool_calls=[call], id="m_call")
    result = Message.tool_result("tc_1", "no such file", is_error=True, id="m_res")
    summary = Message.system("summary: 日本語", id="m_sum")
    final = Message.assistant("done", id="m_final")
    usage = Usage(input_tokens=12, output_tokens=3)
    events: tuple[Event, ...] = (
        RunStarted(input=(user,)),
        ModelReplied(message=asked, usage=usage),
        ToolsFinished(results=(result,)),
        CompactionResult(messages=(summary, user), before=900, after=300),
        ModelReplied(message=final, usage=None),
    )
    entries: list[Entry] = [
        RunOpened(run_id=run_id, machine="turn", digest="abc", budget=Budget(), at=1.5),
    ]
    for index, event in enumerate(events):
        entries.append(
            EventRecorded(
                run_id=run_id,
                index=index,
                event=event,
                phase="start",
                decision="measure",
                at=2.0 + index,
            )
        )
    entries += [
        TurnRecord(
            run_id=run_id,
            turn=1,
            keep=0,
            added=("m_user",),
            output="m_call",
            usage=usage,
        ),
        CompactionRecord(
            run_id=run_id,
            turn=1,
            reason=CompactReason.THRESHOLD_EXCEEDED,
            strategy="TruncatingCompactor",
            verdict="compacted",
            covers=("m_user", "m_call", "m_res"),
            replacement=("m_sum", "m_user"),
            tokens_before=900,
            tokens_after=300,
            key=f"{run_id}:3",
        ),
        ToolResultRecorded(run_id=run_id, index=2, result=result),
        SummaryRecorded(
            run_id=run_id,
            message_id="m_sum",
            content="summary: 日本語",
            covers_up_to_message_id="m_res",
        ),
        Committed(run_id=run_id, keep=0, messages=("m_sum", "m_user")),
        RunEnded(
            run_id=run_id,
            outcome="paused",
            phase="await_approval",
            error=CompactionStalled(used=5, limit=9),
            usage=usage,
            turns=2,
            waiting=Pause(phase="await_approval", calls=(call,), accepts=("x",)),
            at=9.25,
        ),
    ]
    return tuple(entries)


def _odd_entries(run_id: str) -> tuple[Entry, ...]:
    """One run whose input, tool call, tool output and reply carry `ODD_TEXT`."""
    call = ToolCallPart(id="tc_odd", name="ls", arguments={"path": ODD_TEXT})
    user = Message.user(ODD_TEXT, id="m_odd_user", metadata={"dir": ODD_TEXT})
    asked = Message.assistant("", tool_calls=[call], id="m_odd_call")
    result = Message.tool_result("tc_odd", ODD_TEXT, id="m_odd_res")
    final = Message.assistant(ODD_TEXT, id="m_odd_final")
    events: tuple[Event, ...] = (
        RunStarted(input=(user,)),
        ModelReplied(message=asked, usage=None),
        ToolsFinished(results=(result,)),
        ModelReplied(message=final, usage=None),
    )
    opened = RunOpened(
        run_id=run_id, machine="turn", digest="abc", budget=Budget(), at=1.0
    )
    return (
        opened,
        *(
            EventRecorded(
                run_id=run_id,
                index=i,
                event=event,
                phase="start",
                decision="measure",
                at=2.0 + i,
            )
            for i, event in enumerate(events)
        ),
        ToolResultRecorded(run_id=run_id, index=2, result=result),
        Committed(run_id=run_id, keep=0, messages=(user.id, final.id)),
        RunEnded(
            run_id=run_id,
            outcome="done",
            phase="done",
            error=None,
            usage=Usage(),
            turns=2,
            waiting=None,
            at=9.0,
        ),
    )


def _same(got: Sequence[Entry], want: Sequence[Entry], check: str) -> None:
    if len(got) != len(want):
        raise AssertionError(f"{check}: loaded {len(got)} entries, wrote {len(want)}")
    for index, (a, b) in enumerate(zip(got, want, strict=True)):
        # The JSON form carries everything (metadata and errors too, which
        # equality ignores), so it is what must come back unchanged.
        if a != b or serde.envelope(a) != serde.envelope(b):
            raise AssertionError(
                f"{check}: entry {index} came back as {a!r}, was written as {b!r}"
            )
