"""The `SessionStore` conformance suite: what every store must do, checked.

Run it against a fresh store of yours::

    await check_store(lambda: MyStore(...))

Each check gets a new store from the factory, so a store backed by a file
or a database can hand out a fresh file or schema each time. A failed check
raises `AssertionError` naming the check and what went wrong.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

import anyio

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
from turnfsm.errors import CompactionStalled, ConfigError, SessionConflict
from turnfsm.messages import Message, ToolCallPart
from turnfsm.persistence import (
    Committed,
    CompactionRecord,
    Entry,
    EventRecorded,
    RunEnded,
    RunOpened,
    SessionStore,
    SummaryRecorded,
    ToolResultRecorded,
    TurnRecord,
)
from turnfsm.values import Usage

__all__ = ["check_store", "sample_entries"]

StoreFactory = Callable[[], "SessionStore | Awaitable[SessionStore]"]


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


async def _make(factory: StoreFactory) -> SessionStore:
    store = factory()
    if isinstance(store, Awaitable):
        store = await store
    if not isinstance(store, SessionStore):
        raise AssertionError(f"the factory made {store!r}, not a SessionStore")
    return store


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


async def _round_trip(store: SessionStore) -> None:
    entries = sample_entries()
    version = await store.append("s_round", entries[:3], expected_version=0)
    if version != 3:
        raise AssertionError(f"round trip: append returned version {version}, not 3")
    version = await store.append("s_round", entries[3:], expected_version=3)
    if version != len(entries):
        raise AssertionError(f"round trip: version {version}, not {len(entries)}")
    _same(await store.load("s_round"), entries, "round trip")


async def _unknown_is_empty(store: SessionStore) -> None:
    if await store.load("s_nobody") != ():
        raise AssertionError("an unknown session must load as ()")
    if await store.list_sessions() != ():
        raise AssertionError("a new store must list no sessions")


async def _conflict(store: SessionStore) -> None:
    entries = sample_entries()
    await store.append("s_conflict", entries[:2], expected_version=0)
    for stale in (0, 1, 3):
        try:
            await store.append("s_conflict", entries[2:], expected_version=stale)
        except SessionConflict as exc:
            if (exc.expected, exc.actual) != (stale, 2):
                raise AssertionError(f"conflict: wrong versions in {exc!r}") from None
        else:
            raise AssertionError(
                f"conflict: an append expecting version {stale} of a log at 2 "
                "was accepted"
            )
    _same(await store.load("s_conflict"), entries[:2], "conflict (nothing written)")


async def _race(store: SessionStore) -> None:
    entries = sample_entries()
    wins: list[int] = []
    losses: list[SessionConflict] = []

    async def writer(n: int) -> None:
        try:
            await store.append("s_race", entries[n : n + 1], expected_version=0)
            wins.append(n)
        except SessionConflict as exc:
            losses.append(exc)

    async with anyio.create_task_group() as group:
        for n in range(4):
            group.start_soon(writer, n)
    if len(wins) != 1 or len(losses) != 3:
        raise AssertionError(
            f"race: {len(wins)} of 4 writers expecting version 0 succeeded"
        )
    _same(await store.load("s_race"), entries[wins[0] : wins[0] + 1], "race")


async def _isolation(store: SessionStore) -> None:
    a, b = sample_entries("run_a"), sample_entries("run_b")
    await store.append("s_b", b, expected_version=0)
    await store.append("s_a", a[:4], expected_version=0)
    _same(await store.load("s_a"), a[:4], "isolation")
    _same(await store.load("s_b"), b, "isolation")
    listed = [(s.id, s.version) for s in await store.list_sessions()]
    if listed != [("s_a", 4), ("s_b", len(b))]:
        raise AssertionError(f"list_sessions: got {listed}")


async def _bad_id(store: SessionStore) -> None:
    for bad in ("", 5, None):
        try:
            await store.append(bad, sample_entries()[:1], expected_version=0)  # type: ignore[arg-type]
        except ConfigError:
            continue
        raise AssertionError(f"a session id of {bad!r} was accepted")


_CHECKS = (_unknown_is_empty, _round_trip, _conflict, _race, _isolation, _bad_id)


async def check_store(factory: StoreFactory) -> None:
    """Check that the stores `factory` makes behave as a `SessionStore` must.

    Checked: an unknown session loads empty; every kind of entry reads back
    equal, in order, across appends; an append at a stale version raises
    `SessionConflict` and writes nothing; of several concurrent writers
    expecting one version exactly one wins; sessions do not see each other's
    entries and are listed with their versions; a bad session id is a
    `ConfigError`.

    Raises:
        AssertionError: naming the first check that failed.
    """
    for check in _CHECKS:
        await check(await _make(factory))
