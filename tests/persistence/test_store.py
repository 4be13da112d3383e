"""The SessionStore protocol: MemoryStore passes the conformance suite; the suite
catches stores that break it; log entries round-trip through the one JSON form."""

from __future__ import annotations

import io
import json
from collections.abc import Sequence

import anyio
import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.generators import histories
from tests.profiles import sized
from turnfsm import Agent, serde
from turnfsm.core import (
    Budget,
    CompactReason,
    MessageInjected,
    ModelReplied,
    Pause,
    RunStarted,
)
from turnfsm.errors import (
    Cancelled,
    CompactionStalled,
    ConfigError,
    CorruptRecord,
    InvalidReturn,
    ProviderError,
    SessionConflict,
    SessionNotFound,
)
from turnfsm.messages import Message
from turnfsm.persistence import (
    ENTRY_TYPES,
    Committed,
    CompactionRecord,
    Entry,
    EventRecorded,
    MemoryStore,
    RunEnded,
    RunOpened,
    Session,
    SessionInfo,
    SQLiteStore,
    SummaryRecorded,
    ToolResultRecorded,
    TurnRecord,
    dump_session,
    load_session,
    session_lines,
)
from turnfsm.testing import ScriptedModel, check_store, reply, sample_entries, tool_call
from turnfsm.values import Usage

pytestmark = pytest.mark.anyio


async def test_memory_store_passes_the_conformance_suite() -> None:
    await check_store(MemoryStore)


@attrs.define
class _Lenient:
    """A broken store: it ignores the expected version."""

    inner: MemoryStore = attrs.field(factory=MemoryStore)

    async def append(
        self, session_id: str, entries: Sequence[Entry], *, expected_version: int
    ) -> int:
        log = await self.inner.load(session_id)
        return await self.inner.append(session_id, entries, expected_version=len(log))

    async def load(self, session_id: str) -> tuple[Entry, ...]:
        return await self.inner.load(session_id)

    async def list_sessions(self) -> tuple[object, ...]:
        return await self.inner.list_sessions()


@attrs.define
class _Forgetful(_Lenient):
    """A broken store: it loses message metadata."""

    async def load(self, session_id: str) -> tuple[Entry, ...]:
        out = []
        for entry in await self.inner.load(session_id):
            if isinstance(entry, EventRecorded) and isinstance(entry.event, RunStarted):
                msgs = [
                    Message(role=m.role, parts=m.parts, id=m.id)
                    for m in entry.event.input
                ]
                entry = attrs.evolve(entry, event=RunStarted(input=msgs))
            out.append(entry)
        return tuple(out)

    async def append(
        self, session_id: str, entries: Sequence[Entry], *, expected_version: int
    ) -> int:
        return await self.inner.append(
            session_id, entries, expected_version=expected_version
        )


async def test_the_suite_catches_a_store_without_version_checks() -> None:
    with pytest.raises(AssertionError, match="conflict"):
        await check_store(_Lenient)


async def test_the_suite_catches_a_store_that_loses_data() -> None:
    with pytest.raises(AssertionError, match="round trip: entry 1"):
        await check_store(_Forgetful)


async def test_the_suite_rejects_what_is_not_a_store() -> None:
    with pytest.raises(AssertionError, match="not a SessionStore"):
        await check_store(lambda: object())  # type: ignore[arg-type,return-value]


async def test_a_stale_session_view_gets_a_conflict_and_writes_nothing() -> None:
    store = MemoryStore()
    first = Session("s1", store=store)
    with pytest.raises(SessionNotFound):  # reading writes nothing, creates nothing
        await Session.load(store, "s1")
    assert await store.list_sessions() == ()
    driver_model = ScriptedModel.of("one", "two")
    from turnfsm.driver import Driver

    await Driver(model=driver_model).run("hi", session=first)
    stale = Session("s1", store=store)  # a view that never loaded the log
    with pytest.raises(SessionConflict) as caught:
        await Driver(model=driver_model).run("again", session=stale)
    assert caught.value.expected == 0
    assert caught.value.actual == first.version
    assert len(await store.load("s1")) == first.version


def test_a_session_needs_a_usable_id_and_a_store() -> None:
    with pytest.raises(ConfigError, match="session_id"):
        Session("")
    with pytest.raises(ConfigError, match="store"):
        Session(store=object())  # type: ignore[arg-type]


class SyncStore:
    """A store of your own with a plain `def append`: turnfsm awaits it."""

    def __init__(self) -> None:
        self.inner = MemoryStore()

    def append(
        self, session_id: str, entries: Sequence[Entry], *, expected_version: int
    ) -> int:
        return 0

    async def load(self, session_id: str) -> tuple[Entry, ...]:
        return await self.inner.load(session_id)

    async def list_sessions(self) -> tuple[SessionInfo, ...]:
        return await self.inner.list_sessions()


def test_a_store_whose_append_is_a_plain_def_is_refused_where_given() -> None:
    # It failed the first run with TypeError: "object int can't be used in
    # 'await' expression".
    model = ScriptedModel.of("hi")
    for make in (
        lambda: Session(store=SyncStore()),  # type: ignore[arg-type]
        lambda: Agent(model=model, store=SyncStore()),  # type: ignore[arg-type]
    ):
        with pytest.raises(ConfigError, match="write it as `async def append`") as got:
            make()
        assert got.value.field == "store"


async def test_session_load_from_no_store_names_the_store() -> None:
    # It raised AttributeError: 'NoneType' object has no attribute 'load'.
    with pytest.raises(ConfigError, match="invalid store=None"):
        await Session.load(None, "ses_1")  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
@pytest.mark.parametrize(
    ("entries", "version", "field"),
    [
        ([1], 0, "entries[0]"),
        ("entries", 0, "entries"),
        (None, 0, "entries"),
        ((), "0", "expected_version"),
        ((), -1, "expected_version"),
    ],
    ids=["an-int", "a-str", "none", "a-str-version", "a-negative-version"],
)
async def test_an_append_of_what_is_no_log_is_refused_and_writes_nothing(
    kind: str, entries: object, version: object, field: str, tmp_path: object
) -> None:
    # The memory store kept an int as an entry (the session then did not
    # load); the SQLite store raised AttributeError; "0" was a conflict.
    store = MemoryStore() if kind == "memory" else SQLiteStore(f"{tmp_path}/s.db")
    async with store:
        with pytest.raises(ConfigError) as raised:
            await store.append("ses_1", entries, expected_version=version)  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="session_id"):
            await store.load(None)  # type: ignore[arg-type]
        assert await store.load("ses_1") == ()
    assert raised.value.field == field


# -- the JSON form ------------------------------------------------------------

texts = st.text(max_size=12)
usages = st.builds(
    Usage, input_tokens=st.integers(0, 9), output_tokens=st.integers(0, 9)
)
errors = st.one_of(
    st.none(),
    st.builds(CompactionStalled, used=st.integers(0, 99), limit=st.integers(0, 99)),
    st.builds(Cancelled, reason=texts),
    st.builds(ProviderError, message=texts, retryable=st.booleans(), status=st.none()),
)


@st.composite
def entries(draw: st.DrawFn) -> Entry:
    run = draw(st.sampled_from(["run_a", "run_b"]))
    msgs = draw(histories(max_messages=6))
    ids = tuple(m.id for m in msgs)
    kind = draw(st.sampled_from(ENTRY_TYPES))
    if kind is RunOpened:
        return RunOpened(
            run_id=run, machine="turn", digest="d", budget=Budget(), at=1.0
        )
    if kind is EventRecorded:
        event = draw(
            st.sampled_from(
                [
                    RunStarted(input=[m for m in msgs if m.role.value == "user"]),
                    ModelReplied(message=Message.assistant("x"), usage=draw(usages)),
                    MessageInjected(message=Message.user("note")),
                ]
            )
        )
        return EventRecorded(
            run_id=run,
            index=draw(st.integers(0, 9)),
            event=event,
            phase="start",
            decision="measure",
            at=draw(st.floats(0, 1e9, allow_nan=False)),
        )
    if kind is TurnRecord:
        return TurnRecord(
            run_id=run,
            turn=1,
            keep=draw(st.integers(0, 5)),
            added=ids,
            output="m",
            usage=draw(st.none() | usages),
        )
    if kind is CompactionRecord:
        return CompactionRecord(
            run_id=run,
            turn=2,
            reason=draw(st.sampled_from(list(CompactReason))),
            strategy="S",
            verdict=draw(st.sampled_from(["compacted", "noop", "failed"])),
            covers=ids,
            replacement=ids[:1],
            tokens_before=9,
            tokens_after=3,
            key=f"{run}:1",
        )
    if kind is ToolResultRecorded:
        call_id = draw(texts)
        result = Message.tool_result(
            call_id if call_id.strip() else "c", draw(texts), is_error=True
        )
        return ToolResultRecorded(
            run_id=run, index=draw(st.integers(0, 9)), result=result
        )
    if kind is SummaryRecorded:
        return SummaryRecorded(
            run_id=run,
            message_id=draw(texts),
            content=draw(texts),
            covers_up_to_message_id=draw(texts),
        )
    if kind is Committed:
        return Committed(run_id=run, keep=draw(st.integers(0, 9)), messages=ids)
    calls = tuple(c for m in msgs for c in m.tool_calls)
    return RunEnded(
        run_id=run,
        outcome=draw(st.sampled_from(["done", "failed", "cancelled", "paused"])),
        phase="p",
        text=draw(texts),
        error=draw(errors),
        usage=draw(usages),
        turns=3,
        waiting=draw(
            st.none() | st.just(Pause(phase="w", calls=calls, accepts=("a",)))
        ),
        at=2.0,
    )


def _same(a: Entry, b: Entry) -> bool:
    if isinstance(a, RunEnded) and isinstance(b, RunEnded):
        key = (type(a.error), a.error.args) if a.error else None
        other = (type(b.error), b.error.args) if b.error else None
        return a == b and key == other
    return a == b


@settings(max_examples=sized(500), deadline=None)
@given(entry=entries())
def test_every_entry_round_trips_through_json(entry: Entry) -> None:
    line = serde.dumps(serde.envelope(entry))
    assert _same(serde.open_envelope(json.loads(line), Entry), entry)


async def test_a_session_log_round_trips_through_json_lines(tmp_path: object) -> None:
    session = Session()
    model = ScriptedModel.of(reply("", tool_call("t", "c1")), "done")

    def t() -> str:
        """A tool."""
        return "ok"

    from turnfsm.driver import Driver

    await Driver(model=model, tools=[t]).run("go", session=session)
    path = f"{tmp_path}/log.jsonl"
    assert dump_session(session, path) == session.version
    loaded = await load_session((await anyio.Path(path).read_text()).splitlines())
    assert loaded.id == session.id
    assert [m.id for m in loaded.history] == [m.id for m in session.history]
    assert [_same(a, b) for a, b in zip(loaded.entries, session.entries, strict=True)]
    assert all(
        _same(a, b) for a, b in zip(loaded.entries, session.entries, strict=True)
    )


async def test_a_field_edited_in_an_exported_log_is_refused_by_name() -> None:
    agent = Agent(model=ScriptedModel.of("hello there"))
    await agent.run("hi")
    lines = list(session_lines(agent.session))
    number = next(
        n for n, line in enumerate(lines, 1) if '"type":"ModelReplied"' in line
    )
    edited = [*lines]
    edited[number - 1] = lines[number - 1].replace("hello there", "forged")
    with pytest.raises(CorruptRecord) as caught:
        await load_session("\n".join(edited))
    assert caught.value.path == f"line {number}: data.event"
    assert "changed since the log was written" in str(caught.value)
    # A field removed, or one added, is named too.
    for change, said in [
        (lambda d: d["data"].pop("phase"), "data.phase: missing"),
        (lambda d: d["data"].update(extra=1), "data.extra: a field added"),
    ]:
        data = json.loads(lines[number - 1])
        change(data)
        changed = [*lines]
        changed[number - 1] = json.dumps(data)
        with pytest.raises(CorruptRecord, match=said):
            await load_session("\n".join(changed))
    # A log written before lines carried digests loads as it did.
    newer = ("digests", "seq", "log_version", "entry_count")
    older = [
        json.dumps({k: v for k, v in json.loads(line).items() if k not in newer})
        for line in lines
    ]
    loaded = await load_session("\n".join(older))
    assert loaded.version == agent.session.version


async def test_loading_a_log_into_a_store_that_holds_its_session_says_so() -> None:
    store = MemoryStore()
    agent = Agent(model=ScriptedModel.of("hello"), store=store)
    await agent.run("hi")
    text = "\n".join(session_lines(agent.session))
    with pytest.raises(SessionConflict) as caught:
        await load_session(text, store)
    message = str(caught.value)
    assert message.startswith(
        f"session {agent.session.id!r} is already in this store "
        f"({agent.session.version} entries): nothing of the log was loaded"
    )
    assert "this writer took it for a new one" not in message
    assert "delete_session" in message
    assert "turnfsm sessions rm" in message
    assert len(await store.load(agent.session.id)) == agent.session.version


async def test_a_corrupt_log_line_is_named() -> None:
    session = Session()
    await session.append(*sample_entries()[:3])
    lines = list(session_lines(session))
    broken = [*lines[:2], '{"v": 1, "type": "EventRecorded", "data": {"run_id": 5}}']
    with pytest.raises(CorruptRecord, match="line 3"):
        await load_session(io.StringIO("\n".join(broken)))
    with pytest.raises(CorruptRecord, match="line 2"):
        await load_session(io.StringIO("\n".join([lines[0], "{not json"])))
    with pytest.raises(CorruptRecord, match="header"):
        await load_session(io.StringIO("\n".join(lines[1:])))
    future = lines[0].replace('"v": 1', '"v": 99')
    with pytest.raises(CorruptRecord, match="unknown version 99"):
        await load_session(io.StringIO("\n".join([future, *lines[1:]])))


class _OnMemory:
    """The rest of a test store: what its `inner` memory store does."""

    inner: MemoryStore

    async def list_sessions(self) -> object:
        return await self.inner.list_sessions()

    async def delete_session(self, session_id: str) -> bool:
        return await self.inner.delete_session(session_id)

    async def aclose(self) -> None:
        await self.inner.aclose()


@attrs.define
class Answers(_OnMemory):
    """A store of yours whose `load` answers with `loaded` instead."""

    loaded: object
    inner: MemoryStore = attrs.field(factory=MemoryStore)

    async def append(
        self, session_id: str, entries: Sequence[Entry], *, expected_version: int
    ) -> None:
        await self.inner.append(session_id, entries, expected_version=expected_version)

    async def load(self, session_id: str) -> object:
        return self.loaded


@pytest.mark.parametrize(
    ("loaded", "named"),
    [
        (None, "returned None"),
        ({"entries": []}, "returned {'entries': []}"),
        (("a",), "returned 'a' at [0]"),
        ([*sample_entries()[:1], 5], "returned 5 at [1]"),
    ],
    ids=["none", "mapping", "text", "not-an-entry"],
)
async def test_a_store_whose_load_answers_no_entries_is_named(
    loaded: object, named: str
) -> None:
    store = Answers(loaded)
    with pytest.raises(InvalidReturn) as caught:
        await Session.load(store, "s")  # type: ignore[arg-type]  # bad on purpose
    assert str(caught.value).startswith(f"store Answers.load {named}: expected")


async def test_an_entry_of_a_run_that_never_opened_is_refused_unwritten() -> None:
    store = MemoryStore()
    session = Session("s", store=store)
    await session.append(*sample_entries())
    stray = RunEnded(run_id="run_never", outcome="failed", phase="failed")
    with pytest.raises(ConfigError) as caught:
        await session.append(stray)
    assert (caught.value.field, caught.value.value) == (
        "entries[0].run_id",
        "run_never",
    )
    assert (await Session.load(store, "s")).entries == session.entries


@attrs.define
class FailsOnce(_OnMemory):
    """A store whose append number `failing` raises, as a full disk would."""

    failing: int
    inner: MemoryStore = attrs.field(factory=MemoryStore)
    appends: int = 0

    async def append(
        self, session_id: str, entries: Sequence[Entry], *, expected_version: int
    ) -> None:
        self.appends += 1
        if self.appends == self.failing:
            raise OSError("disk full")
        await self.inner.append(session_id, entries, expected_version=expected_version)

    async def load(self, session_id: str) -> tuple[Entry, ...]:
        return await self.inner.load(session_id)


@pytest.mark.parametrize("failing", [1, 2])
async def test_a_run_whose_append_fails_leaves_a_session_that_loads(
    failing: int,
) -> None:
    store = FailsOnce(failing)
    agent = Agent(model=ScriptedModel.of("hi"), store=store)  # type: ignore[arg-type]  # a store of yours
    with pytest.raises(OSError, match="disk full"):
        await agent.run("hello")
    session = await Session.load(store, agent.session.id)  # type: ignore[arg-type]
    (run,) = session.runs
    assert run.outcome == "failed"
    assert str(run.error) == "run crashed on OSError: disk full"
