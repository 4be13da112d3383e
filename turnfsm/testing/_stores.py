"""The `SessionStore` conformance suite: what every store must do, checked.

Run it against a fresh store of yours::

    await check_store(lambda: MyStore(...))

Each check gets a new store from the factory, so a store backed by a file
or a database can hand out a fresh file or schema each time. A failed check
raises `AssertionError` naming the check and what went wrong. The owner
lease checks (`turnfsm.testing._store_leases`) run when the store is a
`LeasingStore`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

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
from turnfsm.errors import (
    CompactionStalled,
    ConfigError,
    CorruptRecord,
    DuplicateRecord,
    SessionConflict,
)
from turnfsm.messages import Message, ToolCallPart
from turnfsm.persistence import (
    Committed,
    CompactionRecord,
    Entry,
    EventRecorded,
    LeasingStore,
    RunEnded,
    RunOpened,
    SessionStore,
    SummaryRecorded,
    ToolResultRecorded,
    TurnRecord,
)
from turnfsm.testing._store_leases import LEASE_CHECKS
from turnfsm.values import Usage

__all__ = ["check_store", "sample_entries"]

StoreFactory = Callable[[], "SessionStore | Awaitable[SessionStore]"]
Damage = Callable[[Any, str], Awaitable[None]]
"""``damage(store, session_id)``: break a stored session (a test's own hook)."""

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


async def _duplicate_key(store: SessionStore) -> None:
    entries = sample_entries()
    await store.append("s_keys", entries, expected_version=0)
    again = sample_entries("run_2")
    for batch, version in (((*again, *entries), len(entries)), ((*again, *again), 0)):
        session = "s_keys" if version else "s_keys_new"
        try:
            await store.append(session, batch, expected_version=version)
        except DuplicateRecord as exc:
            if exc.key not in ("run_1:3", "run_2:3"):
                raise AssertionError(f"duplicate key: wrong key in {exc!r}") from None
        else:
            raise AssertionError(
                "duplicate key: an append repeating a compaction key was accepted"
            )
    _same(await store.load("s_keys"), entries, "duplicate key (nothing written)")
    await _no_trace(store, "s_keys_new", "duplicate key")


async def _no_trace(store: SessionStore, session_id: str, check: str) -> None:
    """A session a refused append would have created must not exist."""
    if await store.load(session_id) != ():
        raise AssertionError(f"{check}: a refused append left entries behind")
    listed = [info.id for info in await store.list_sessions()]
    if session_id in listed:
        raise AssertionError(
            f"{check}: a refused append left a ghost session {session_id!r} "
            f"(listed: {listed})"
        )
    entries = sample_entries("run_after")
    if await store.append(session_id, entries[:1], expected_version=0) != 1:
        raise AssertionError(f"{check}: a first append after a refused one failed")


async def _no_ghosts(store: SessionStore) -> None:
    entries = sample_entries()
    for stale in (1, 5):
        try:
            await store.append("s_ghost", entries[:2], expected_version=stale)
        except SessionConflict as exc:
            if (exc.expected, exc.actual) != (stale, 0):
                raise AssertionError(f"ghost: wrong versions in {exc!r}") from None
        else:
            raise AssertionError(
                f"ghost: an append expecting version {stale} of a new session "
                "was accepted"
            )
    if await store.append("s_empty", (), expected_version=0) != 0:
        raise AssertionError("ghost: an empty first append must return version 0")
    if "s_empty" in [info.id for info in await store.list_sessions()]:
        raise AssertionError("ghost: an empty append created a listed session")
    await _no_trace(store, "s_ghost", "ghost")


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


async def _odd_text(store: SessionStore) -> None:
    sessions = ("s_\udcff", "\udcff\udc80", '"s_\\udcff"', "s_nul\x00", "s_plain")
    for n, session in enumerate(sessions):
        entries = _odd_entries(f"run_{n}_\udcff")
        await store.append(session, entries[:3], expected_version=0)
        await store.append(session, entries[3:], expected_version=3)
    for n, session in enumerate(sessions):
        _same(await store.load(session), _odd_entries(f"run_{n}_\udcff"), "odd text")
    listed = sorted(info.id for info in await store.list_sessions())
    if listed != sorted(sessions):
        raise AssertionError(f"odd text: listed {listed!r}, wrote {sorted(sessions)!r}")


async def _lifecycle(store: SessionStore) -> None:
    # Optional: a store that holds resources is an async context manager
    # whose exit lets go of them (`aclose`).
    enter = getattr(store, "__aenter__", None)
    leave = getattr(store, "__aexit__", None)
    if enter is None or leave is None:
        return
    if await enter() is not store:
        raise AssertionError("lifecycle: `async with store as s` must bind the store")
    await leave(None, None, None)


_CHECKS = (
    _unknown_is_empty,
    _round_trip,
    _conflict,
    _race,
    _isolation,
    _bad_id,
    _duplicate_key,
    _no_ghosts,
    _odd_text,
)


async def _damaged(store: SessionStore, damage: Damage) -> None:
    entries = sample_entries()
    await store.append("s_sound", entries, expected_version=0)
    await store.append("s_damaged", entries, expected_version=0)
    await damage(store, "s_damaged")
    try:
        await store.load("s_damaged")
    except CorruptRecord as exc:
        if "s_damaged" not in exc.path:
            raise AssertionError(
                f"damaged: the error does not name the session: {exc!r}"
            ) from None
    else:
        raise AssertionError("damaged: a damaged session loaded without an error")
    listed = {info.id: info for info in await store.list_sessions()}
    if set(listed) != {"s_sound", "s_damaged"}:
        raise AssertionError(f"damaged: list_sessions gave {sorted(listed)}")
    _same(await store.load("s_sound"), entries, "damaged (the other session)")


async def check_store(factory: StoreFactory, *, damage: Damage | None = None) -> None:
    """Check that the stores `factory` makes behave as a `SessionStore` must.

    Checked: an unknown session loads empty; every kind of entry reads back
    equal, in order, across appends; an append at a stale version raises
    `SessionConflict` and writes nothing; of several concurrent writers
    expecting one version exactly one wins; sessions do not see each other's
    entries and are listed with their versions; a bad session id is a
    `ConfigError`; a repeated compaction key is a `DuplicateRecord` that
    writes nothing; a refused or empty append leaves no session behind; text
    and ids with lone surrogates, NULs and escapes read back exactly. A store
    that is an async context manager binds itself and closes on exit. A
    `LeasingStore` must also keep owner leases: one winner among concurrent
    acquirers, expired leases taken over, `force`, `SessionBusy` naming the
    live owner, `LeaseLost` on renewing a lost lease, release and lookup.

    Args:
        factory: Makes a fresh, empty store (sync or async).
        damage: Optional ``async damage(store, session_id)`` that breaks a
            stored session the way a bad disk or a hand edit would (a row
            that is not JSON, a wrong counter); then loading it must raise
            `CorruptRecord` naming the session, while listing and the other
            sessions keep working.

    Raises:
        AssertionError: naming the first check that failed.
    """
    for check in _CHECKS:
        await check(await _make(factory))
    store = await _make(factory)
    await _lifecycle(store)
    if damage is not None:
        await _damaged(await _make(factory), damage)
    if isinstance(store, LeasingStore):
        for lease_check in LEASE_CHECKS:
            await lease_check(await _make(factory))
