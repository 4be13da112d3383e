"""`Session`: a conversation as a view over its log in a `SessionStore`.

The session keeps the projections of its log up to date as entries are
appended (no re-reading): the committed `history` (what the next request is
built from) and the audit trail of `runs`. Both can be rebuilt from the log
alone, which is what `Session.load` does.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Final, final

from turnfsm import _checks
from turnfsm._json import compact_encoder
from turnfsm.core import MachineSpec
from turnfsm.errors import (
    ConfigError,
    ContinuedAsNew,
    CorruptRecord,
    InvalidReturn,
    LeaseLost,
    SessionBusy,
    SessionNotFound,
)
from turnfsm.messages import Message, MessageLog
from turnfsm.persistence._commits import (
    SeenIndex,
    _check_commits,
    _committed,
    _history_at,
    unopened,
)
from turnfsm.persistence._context_settings import ContextSettings
from turnfsm.persistence._rebase import rebase_points
from turnfsm.persistence._records import (
    ENTRY_TYPES,
    BreakerChanged,
    Committed,
    CompactionRecord,
    Entry,
    EventRecorded,
    MachineStored,
    RunEnded,
    RunOpened,
    SummaryRecorded,
    ToolResultRecorded,
    TurnRecord,
    event_messages,
)
from turnfsm.persistence._run_record import GOES_ON, RunRecord, _Run
from turnfsm.persistence._store import (
    MemoryStore,
    SessionStore,
    check_session_id,
    check_store,
)

__all__ = ["Session", "new_id"]


_RESET_AT: Final = _checks.number(
    expected="wall-clock seconds: a finite int or float (not a bool)"
)


def new_id(prefix: str) -> str:
    """Return a fresh id such as ``run_3f2a...``: 20 random hex digits.

    Drawn from the system's randomness, as a random UUID's are (without
    the UUID: a run and its session each take one).
    """
    return f"{prefix}_{os.urandom(10).hex()}"


def _not_entries(store: SessionStore, value: str) -> InvalidReturn:
    return InvalidReturn(
        f"store {type(store).__name__}.load",
        value,
        "a sequence of log entries (turnfsm.persistence.ENTRY_TYPES)",
    )


@final
class Session:
    """A conversation across runs: a view over its log in a `SessionStore`.

    `Session()` starts a new conversation in a private `MemoryStore`;
    `Session(store=s)` a new one in `s`; `await Session.load(s, id)` reopens
    a stored one (`SessionNotFound` if `s` holds none); `await
    Session.open(s, id)` reopens it, or starts a new one under that id. The
    driver appends to the log; `history` and `runs` are its projections,
    kept up to date as it grows.
    """

    __slots__ = (
        "_breaker_open",
        "_entries",
        "_failures",
        "_history",
        "_latest",
        "_lost",
        "_machines",
        "_messages",
        "_open",
        "_ratio",
        "_ratios",
        "_running",
        "_runs",
        "_seen",
        "_summaries",
        "_summary_texts",
        "id",
        "is_ephemeral",
        "store",
    )

    def __init__(self, id: str | None = None, *, store: SessionStore | None = None):
        """Start a session view (no I/O: an existing log is read by `load`).

        Raises:
            ConfigError: `id` is not a usable session id, or `store` is not
                a `SessionStore`.
        """
        self.id = check_session_id(id) if id is not None else new_id("ses")
        self.store = check_store(store) if store is not None else MemoryStore()
        self.is_ephemeral = False
        self._entries: list[Entry] = []
        self._history = MessageLog()
        self._messages: dict[str, Message] = {}
        # A pass may change a message and keep its id (a digested tool
        # result names its call's original, which `message` returns): a
        # commit takes each message as the latest event brought it.
        self._latest: dict[str, Message] = {}
        self._runs: dict[str, _Run] = {}
        self._seen: SeenIndex | None = None  # built by the first `seen`
        # The runs that can go on, in order: a run start looks at them
        # without walking every run the session ever had.
        self._open: dict[str, _Run] = {}
        self._summaries: list[SummaryRecorded] = []
        self._summary_texts: dict[str, str] = {}
        self._failures = 0
        self._ratio: float | None = None
        # The largest ratio learned with each counter (`counter_key`).
        self._ratios: dict[tuple[str, str] | None, float] = {}
        self._breaker_open = False
        self._running = False
        self._lost: LeaseLost | None = None  # `hold_lost`
        self._machines: dict[str, MachineStored] = {}

    @classmethod
    def ephemeral(cls, id: str | None = None) -> Session:
        """Return a short-lived session (a cron job, a one-off tool run).

        An ephemeral session is never stored (its log lives in a private
        `MemoryStore`, whatever store the agent has) and never compacts: a
        run that crosses a line ends in `CompactionStalled` instead.
        """
        session = cls(id)
        session.is_ephemeral = True
        return session

    @classmethod
    async def load(cls, store: SessionStore, id: str) -> Session:
        """Reopen the stored session `id`: its history and runs, rebuilt from its log.

        Reading never creates a session: a misspelt id fails here instead
        of quietly starting an empty conversation. `Session.open` reopens a
        session or starts a new one under that id.

        Raises:
            SessionNotFound: `store` holds no session `id`.
            CorruptRecord: the stored log does not project (an entry of a run
                that never opened, a commit of messages no event brought).
            ConfigError: `id` is not a usable session id.
        """
        session = await cls.open(store, id)
        if not session.version:
            raise SessionNotFound(session.id)
        return session

    @classmethod
    async def open(cls, store: SessionStore, id: str) -> Session:
        """Reopen the session `id` from `store`, or start a new one under that id.

        Nothing is written: a new session is stored by its first run. Use
        `Session.load` to read a session that must exist.

        Raises:
            CorruptRecord: the stored log does not project.
            ConfigError: `id` is not a usable session id.
            InvalidReturn: the store's `load` returned something other than
                a sequence of log entries.
        """
        # None would start a session under a new id, and name that one.
        session = cls(check_session_id(id), store=check_store(store))
        entries = await store.load(session.id)
        if isinstance(entries, str | bytes | Mapping) or not _checks.is_iterable(
            entries
        ):
            raise _not_entries(store, repr(entries))
        for n, entry in enumerate(entries):
            if not isinstance(entry, ENTRY_TYPES):
                raise _not_entries(store, f"{entry!r} at [{n}]")
            session._apply(entry)
        return session

    # -- projections ---------------------------------------------------
    @property
    def version(self) -> int:
        """How many entries the log holds (what the next append expects)."""
        return len(self._entries)

    @property
    def entries(self) -> tuple[Entry, ...]:
        """The whole log, oldest first."""
        return tuple(self._entries)

    @property
    def history(self) -> MessageLog:
        """The committed conversation the next request is built from."""
        return self._history

    @property
    def runs(self) -> list[RunRecord]:
        """The audit trail: every run of this session, oldest first."""
        return [run.record() for run in self._runs.values()]

    def run(self, run_id: str) -> RunRecord:
        """Return the audit trail of `run_id`.

        Raises:
            KeyError: the session has no such run.
        """
        return self._runs[run_id].record()

    def has_run(self, run_id: str) -> bool:
        """Whether the log holds a run `run_id`."""
        return run_id in self._runs

    def open_runs(self) -> list[RunRecord]:
        """Runs that can still go on: paused, interrupted, or not ended in the log."""
        return [run.record() for run in self._open.values()]

    @property
    def compaction_failures(self) -> int:
        """Consecutive failed compaction passes (the circuit breaker's count).

        A compacted pass sets it back to 0 while the breaker is closed; once
        it opened (`BreakerChanged`), only an operator's reset
        (`reset_breaker`) does. No-ops, vetoes, stalls and refused passes
        leave it as it is.
        """
        return self._failures

    @property
    def reported_ratio(self) -> float | None:
        """The largest ratio of reported to estimated input tokens so far.

        Over the session's model calls whose record carries both the
        provider's reported input tokens and turnfsm's estimate of the same
        request (`TurnRecord.reported_ratio`); None before the first. A
        projection of the log, so it survives restarts and replays; a
        calibrating `ContextManager` scales its estimates by it.
        """
        return self._ratio

    def reported_ratio_for(self, context: ContextSettings | None) -> float | None:
        """The largest ratio of reported to estimated input tokens of one counter.

        `reported_ratio` over the model calls of the runs whose context
        settings name the same counter, with the same settings, as
        `context`: an estimate is its counter's, so a ratio learned with one
        counter says nothing of another's estimates. None before the first
        such call. A calibrating `ContextManager` scales a run's estimates
        by the ratio of its own counter.
        """
        return self._ratios.get(counter_key(context))

    @property
    def breaker_open(self) -> bool:
        """Whether the session's compaction circuit breaker is open.

        It opens when `compaction_failures` reaches the context manager's
        `max_failures`; then passes make no model call until an operator
        resets it (`reset_breaker`, ``turnfsm sessions reset-breaker``).
        """
        return self._breaker_open

    def machine(self, digest: str) -> MachineSpec | None:
        """The machine of `digest` a run of this session began on, or None.

        Raises:
            DefinitionError: the stored definition no longer loads.
        """
        stored = self._machines.get(digest)
        return None if stored is None else stored.spec()

    def has_machine(self, digest: str) -> bool:
        """Whether the log holds the machine of `digest`."""
        return digest in self._machines

    @property
    def summary_texts(self) -> Mapping[str, str]:
        """Each recorded summary's text, by summary message id (read only)."""
        return MappingProxyType(self._summary_texts)

    async def reset_breaker(self, *, at: float = 0.0) -> None:
        """Reset the compaction circuit breaker (the operator's call).

        Appends `BreakerChanged(open=False)`; the next pass may call the
        summary model again.

        Args:
            at: When, in wall-clock seconds (``time.time()``); 0.0: unknown.

        Raises:
            ConfigError: `at` is not a finite int or float (None, a string,
                a bool, NaN, an infinity); nothing is written.
            SessionConflict: another writer appended to this session first.
        """
        _checks.check(at, "at", _RESET_AT)
        await self.append(
            BreakerChanged(run_id="", open=False, failures=self._failures, at=at)
        )

    @property
    def summaries(self) -> tuple[SummaryRecorded, ...]:
        """Every summary a committed compaction brought in, oldest first."""
        return tuple(self._summaries)

    @property
    def latest_summary(self) -> SummaryRecorded | None:
        """The latest summary still in the working history, if any.

        The working history is that summary plus the messages after it; a
        later compaction that dropped the summary message leaves none.
        """
        if not self._summaries:
            return None
        ids = {m.id for m in self._history}
        return next((s for s in reversed(self._summaries) if s.message_id in ids), None)

    def message(self, message_id: str) -> Message:
        """Return the message with `message_id`, as it was first said.

        Raises:
            KeyError: no event of this session brought such a message.
        """
        return self._messages[message_id]

    def seen(self, run_id: str, index: int) -> tuple[Message, ...]:
        """Return the messages the model saw on `run_id`'s turn `index`, as it saw them.

        `message` answers with a message as it was first said; a pass may
        have changed it since (a digested or capped tool result keeps its
        id), and a turn after that pass saw the change.

        Raises:
            KeyError: the session has no such run.
            IndexError: the run has no such turn.
        """
        record = self.run(run_id)
        ids = record.context(index)
        reply = record.turns[index].output
        return self._seen_index().seen(run_id, reply, ids)

    def passed(
        self, record: CompactionRecord
    ) -> tuple[tuple[Message, ...], tuple[Message, ...]]:
        """Return what a pass was given, and what it put in their place, as they were.

        `record` is one of the session's passes (`RunRecord.compactions`).
        The first tuple holds the messages of `record.covers` as the pass
        was handed them; the second those of `record.replacement` as the
        pass made them. A message the pass changed under its own id (the
        default strategy's digested or capped tool results) reads as it was
        on the first side and as it became on the second, where `message`
        answers with it as first said.

        Raises:
            KeyError: `record` is not a pass of this session.
        """
        return self._seen_index().passed(record)

    def _seen_index(self) -> SeenIndex:
        found = self._seen
        if found is None or found.size != len(self._entries):
            found = self._seen = SeenIndex(self._entries)  # once per log length
        return found

    def run_entries(self, run_id: str) -> tuple[EventRecorded, ...]:
        """Return the events logged for `run_id`, in the order they were fed.

        Raises:
            KeyError: the session has no such run.
        """
        return tuple(self._runs[run_id].events)

    def recorded_results(self, run_id: str) -> dict[str, Message]:
        """Return the tool results of `run_id`'s batch in flight, by call id.

        These are the calls that finished after the run's latest event, in a
        process that died before the batch did: a resumed run does not run
        them again.

        Raises:
            KeyError: the session has no such run.
        """
        run = self._runs[run_id]
        return {
            part.call_id: r.result
            for r in run.results
            if r.index == len(run.events)
            for part in r.result.tool_results
        }

    def history_before(self, run_id: str) -> MessageLog:
        """Return the committed history as it was when `run_id` began."""
        return self._runs[run_id].history

    def rebases(self, run_id: str) -> dict[int, MessageLog]:
        """Return where other runs' commits land under `run_id`, by event index.

        A session compacted while `run_id` was paused: its brain takes the
        committed history that pass left before the next event it is fed
        (named by its index; after the run's latest event, the index of the
        event it is fed next). Empty when no other run committed meanwhile.

        Raises:
            KeyError: the session has no such run.
        """
        run = self._runs[run_id]
        end = run.ended
        ended = end is not None and end.outcome not in GOES_ON
        stop = run.last if ended else len(self._entries)
        return rebase_points(self._entries, run_id, run.version, stop)

    def history_after(self, run_id: str) -> MessageLog:
        """Return the committed history as `run_id`'s latest entry left it."""
        return _history_at(self._entries[: self._runs[run_id].last])

    @property
    def is_running(self) -> bool:
        """Whether a run holds this session now (in this process)."""
        return self._running

    # -- writing -------------------------------------------------------
    def claim(self) -> contextlib.AbstractContextManager[Session]:
        """Hold the session for one run (the driver does this).

        Raises:
            SessionBusy: another run holds it: two runs on one history would
                each commit over the other.
        """
        return _Claim(self)

    def hold_lost(self, lost: LeaseLost | None) -> None:
        """Refuse every append with `lost` from now on (None: accept them again).

        The driver calls it when its run's lease on the session was taken
        over: another process carries the session on, so this view writes
        nothing more.
        """
        self._lost = lost

    async def append(self, *entries: Entry, history: MessageLog | None = None) -> None:
        """Append `entries` to the log and apply them to the projections.

        Args:
            *entries: The entries, in order.
            history: The committed history the entries lead to, when the
                caller already holds it (the driver does): adopted instead of
                rebuilt, so a commit costs O(new messages).

        Raises:
            SessionConflict: another writer appended to this session first.
            LeaseLost: this process's run lost the session's lease to another
                process (`hold_lost`); nothing is written.
            ConfigError: a `Committed` entry names a message that no event
                of the session brought, or an entry belongs to a run that
                never opened (nothing is written).
        """
        if self._lost is not None:
            raise self._lost.with_traceback(None)
        self._check_runs(entries)
        _check_commits(entries, self._messages)
        await self.store.append(self.id, entries, expected_version=len(self._entries))
        apply = self._apply
        for entry in entries:
            apply(entry, history)

    def _check_runs(self, entries: Sequence[Entry]) -> None:
        """Refuse an entry of a run that never opened, before it is written.

        Written, it would leave a log that no longer loads (`_apply`'s rule).
        """
        opened: set[str] = set()
        for n, entry in enumerate(entries):
            run_id = entry.run_id
            if isinstance(entry, RunOpened):
                opened.add(run_id)
            elif run_id not in self._runs and run_id not in opened and _of_a_run(entry):
                raise ConfigError(
                    f"entries[{n}].run_id",
                    run_id,
                    "a run of the session (its RunOpened first)",
                )

    def _apply(self, entry: Entry, hint: MessageLog | None = None) -> None:
        version = len(self._entries)
        run = self._runs.get(entry.run_id)
        if run is None and _of_a_run(entry) and not isinstance(entry, RunOpened):
            raise CorruptRecord(
                type(entry).__name__,
                f"entries[{version}]",
                unopened(entry.run_id),
            )
        if isinstance(entry, Committed):
            committed = _committed(entry, version, self._history, self._latest, hint)
        self._entries.append(entry)
        if run is not None:
            run.last = version + 1
        match entry:
            case EventRecorded():
                for message in event_messages(entry.event):
                    self._messages.setdefault(message.id, message)
                    self._latest[message.id] = message
                run = self._runs[entry.run_id]
                run.events.append(entry)
                # A paused or interrupted run fed an event goes on: it is
                # running until it ends again (a process cut off after
                # logging the answer leaves it so).
                run.ended = None
            case Committed():
                self._history = committed
            case TurnRecord():
                turned = self._runs[entry.run_id]
                turned.turns.append(entry)
                ratio = entry.reported_ratio
                if ratio is not None:
                    if self._ratio is None or ratio > self._ratio:
                        self._ratio = ratio
                    key = counter_key(turned.opened.context)
                    known = self._ratios.get(key)
                    if known is None or ratio > known:
                        self._ratios[key] = ratio
            case CompactionRecord(verdict=outcome):
                self._runs[entry.run_id].compactions.append(entry)
                if outcome == "failed":
                    self._failures += 1
                elif outcome == "compacted" and not self._breaker_open:
                    self._failures = 0  # an open breaker waits for the operator
            case SummaryRecorded():
                self._summaries.append(entry)
                self._summary_texts[entry.message_id] = entry.content
            case BreakerChanged(open=is_open):
                self._breaker_open = is_open
                if not is_open:
                    self._failures = 0
            case ToolResultRecorded(result=result):
                self._messages.setdefault(result.id, result)
                self._latest[result.id] = result
                self._runs[entry.run_id].results.append(entry)
            case MachineStored(digest=digest):
                self._machines.setdefault(digest, entry)
            case RunOpened():
                self._runs[entry.run_id] = self._open[entry.run_id] = _Run(
                    opened=entry,
                    version=version,
                    history=self._history,
                    last=version + 1,
                )
            case RunEnded():
                run = self._runs[entry.run_id]
                run.ended = entry
                if isinstance(entry.error, ContinuedAsNew):
                    run.continued += 1
                if entry.outcome not in GOES_ON:
                    self._open.pop(entry.run_id, None)


@final
class _Claim:
    """`Session.claim`'s context (a class, not a generator: every run enters one)."""

    __slots__ = ("_session",)

    def __init__(self, session: Session) -> None:
        self._session = session

    def __enter__(self) -> Session:
        session = self._session
        if session._running:
            raise SessionBusy(session.id)
        session._running = True
        return session

    def __exit__(self, *_exc: object) -> None:
        self._session._running = False


_SETTINGS_JSON: Final = compact_encoder(sort_keys=True)


_KEYS: Final[dict[int, tuple[ContextSettings, tuple[str, str]]]] = {}
"""A context's id -> the context and its counter's key: a run asks at every step."""


def counter_key(context: ContextSettings | None) -> tuple[str, str] | None:
    """The counter `context` names, with its settings: whose estimates a ratio is."""
    if context is None:
        return None
    known = _KEYS.get(id(context))
    if known is not None and known[0] is context:
        return known[1]
    key = context.counter, _SETTINGS_JSON(dict(context.counter_settings))
    if len(_KEYS) >= 64:
        _KEYS.clear()
    _KEYS[id(context)] = (context, key)
    return key


def _of_a_run(entry: Entry) -> bool:
    """Whether `entry` belongs to a run, which must have opened before it.

    A machine's definition and an operator's breaker reset (no run id) stand
    on their own.
    """
    return not (
        isinstance(entry, MachineStored)
        or (isinstance(entry, BreakerChanged) and not entry.run_id)
    )
