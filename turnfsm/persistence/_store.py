"""The `SessionStore` protocol and `MemoryStore`, its in-memory implementation.

A store keeps one append-only log per session. An append names the version
(the number of entries) it expects the log to be at, so two writers on one
session cannot interleave: the second gets `SessionConflict` and writes
nothing. Stores never rewrite or delete entries.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from types import TracebackType
from typing import Final, Protocol, final, runtime_checkable

import attrs

from turnfsm import _checks
from turnfsm.errors import ConfigError, DuplicateRecord, SessionConflict
from turnfsm.persistence._lease import Lease, check_lease, renewed, taken
from turnfsm.persistence._records import ENTRY_TYPES, Entry, RunOpened

__all__ = [
    "MemoryStore",
    "SessionInfo",
    "SessionStore",
    "check_session_id",
    "check_store",
    "store_label",
]


@final
@attrs.frozen(kw_only=True)
class SessionInfo:
    """One session as a store lists it: its id and how many entries it has.

    Attributes:
        id: The session's id.
        version: Its version counter: the number of entries in its log.
        problem: What is wrong with the session, when the store sees at a
            glance that it is damaged (its counter disagrees with its rows);
            None for a sound one. A damaged session is listed all the same,
            so that one bad session never hides the others; loading it
            raises `CorruptRecord`.
        updated_at: When its log last grew (seconds since the epoch, on the
            store's clock), or None when the store does not say. Every
            shipped store says: ``turnfsm sessions list --limit N`` then
            reads only the newest sessions.
    """

    id: str
    version: int
    problem: str | None = None
    updated_at: float | None = None


@runtime_checkable
class SessionStore(Protocol):
    """Where session logs live: append-only, versioned, one log per session id.

    A store that holds resources (a file, a connection pool) lets go of
    them in ``await store.aclose()``, and is an async context manager that
    calls it (``async with SQLiteStore(path) as store:``); every shipped
    store is. Neither is part of the protocol: a store without them works.
    """

    async def append(
        self, session_id: str, entries: Sequence[Entry], *, expected_version: int
    ) -> int:
        """Append `entries` to the log of `session_id` if it is at `expected_version`.

        A session that does not exist yet is at version 0, and its first
        append creates it. An append that is refused, for any reason, leaves
        no trace: a session it would have created does not exist after it.

        Returns:
            The new version (the number of entries in the log).

        Raises:
            SessionConflict: the log is not at `expected_version` (another
                writer appended first); nothing was written.
            DuplicateRecord: a compaction record's idempotency key is already
                in the session (or twice in `entries`); nothing was written.
            ConfigError: `session_id` is not a usable id, `entries` holds
                something that is no log entry, or `expected_version` is no
                integer >= 0; nothing was written (`check_append`).
        """
        ...

    async def load(self, session_id: str) -> tuple[Entry, ...]:
        """Return every entry of `session_id`, oldest first (empty if unknown).

        Raises:
            CorruptRecord: a stored row does not read back, or the session's
                rows disagree with its version counter; the error's path
                names the session and the row.
        """
        ...

    async def list_sessions(self) -> tuple[SessionInfo, ...]:
        """Return every session the store holds, by id (damaged ones too)."""
        ...


_ID = _checks.identifier()
_PAIR = re.compile("[\ud800-\udbff][\udc00-\udfff]")
_WHOLE = _checks.satisfies(
    lambda value: _PAIR.search(value) is None,
    "a non-empty string (<= 200) without a surrogate pair split into two "
    "characters (text no encoding can hold)",
)


def check_session_id(session_id: object) -> str:
    r"""Return `session_id` if it is a usable id; raise `ConfigError` if not.

    Any string of 1 to 200 characters is usable, NUL and lone surrogates
    (the ``"\udcff"`` of an undecodable file name) included: every store
    holds it as it is. Refused: a high surrogate right before a low one,
    which reads back from any JSON text as the one character the pair
    encodes.
    """
    _checks.check(session_id, "session_id", _ID, _WHOLE)
    return session_id  # type: ignore[return-value]


def check_append(session_id: object, entries: object, expected_version: object) -> None:
    """Refuse an append's arguments with a `ConfigError` naming the one at fault.

    `session_id` a usable id (`check_session_id`), `entries` a sequence of
    log entries (`ENTRY_TYPES`), `expected_version` an integer >= 0: every
    shipped store checks them before it writes anything.
    """
    check_session_id(session_id)
    check_entries(entries, expected_version)


def check_entries(entries: object, expected_version: object) -> None:
    """`check_append` without the session id (a store that knows the id already)."""
    if not isinstance(entries, Sequence) or isinstance(entries, str | bytes):
        raise ConfigError("entries", entries, "a sequence of log entries")
    for i, entry in enumerate(entries):
        # One set lookup for the shipped classes, isinstance for a subclass.
        if type(entry) not in _ENTRY_CLASSES and not isinstance(entry, ENTRY_TYPES):
            raise ConfigError(
                f"entries[{i}]",
                entry,
                "a log entry (one of turnfsm.persistence.ENTRY_TYPES)",
            )
    if type(expected_version) is not int or expected_version < 0:
        _checks.check(expected_version, "expected_version", _VERSION)


_ENTRY_CLASSES: Final = frozenset(ENTRY_TYPES)
_VERSION: Final = _checks.integer(low=0)


def check_store(store: object) -> SessionStore:
    """Return `store` if it is a `SessionStore`; raise `ConfigError` if not.

    Its methods are awaited: one written as a plain ``def`` is refused too.
    """
    _checks.check(store, "store", _STORE)
    return store  # type: ignore[return-value]


def store_label(store: object) -> str:
    """Name `store` for a person: its file or database, else its class."""
    path = getattr(store, "path", None)
    return str(path) if path is not None else type(store).__name__


_STORE: Final = _checks.instance(
    SessionStore,
    "a SessionStore (async append/load/list_sessions)",
    awaited=("append", "load", "list_sessions"),
)


@final
@_checks.keyword_checked
@attrs.define(eq=False)
class MemoryStore:
    """Session logs in this process's memory (a library `Agent`'s default).

    Entries are frozen values, kept as they are (no serialisation): a
    `MemoryStore` is as fast as a list, and is lost with the process. It
    keeps owner leases too (a `LeasingStore`), on this process's clock.
    `aclose` has nothing to let go of: the sessions stay.
    """

    # Not in the repr: an error naming the store would print every log.
    _logs: dict[str, list[Entry]] = attrs.field(factory=dict, init=False, repr=False)
    _keys: dict[str, set[str]] = attrs.field(factory=dict, init=False, repr=False)
    _leases: dict[str, Lease] = attrs.field(factory=dict, init=False, repr=False)
    _updated: dict[str, float] = attrs.field(factory=dict, init=False, repr=False)

    async def append(
        self, session_id: str, entries: Sequence[Entry], *, expected_version: int
    ) -> int:
        """Append `entries` if the log is at `expected_version` (see `SessionStore`)."""
        log = self._logs.get(session_id)
        if log is None:
            check_append(session_id, entries, expected_version)
        else:  # the id was checked when the log began
            check_entries(entries, expected_version)
        actual = 0 if log is None else len(log)
        if actual != expected_version:
            raise SessionConflict(
                session_id=session_id, expected=expected_version, actual=actual
            )
        keys = self._keys.get(session_id, set())
        new = [key for e in entries if (key := getattr(e, "key", None)) is not None]
        for index, key in enumerate(new):
            if key in keys or key in new[:index]:
                raise DuplicateRecord(session_id=session_id, key=key)
        # Checked: nothing below can fail, so a refused append leaves no trace.
        if not entries:
            return actual
        if log is None:
            log = self._logs[session_id] = []
        log.extend(entries)
        self._updated[session_id] = time.time()
        if new:
            self._keys[session_id] = keys | set(new)
        return len(log)

    async def load(self, session_id: str) -> tuple[Entry, ...]:
        """Return every entry of `session_id`, oldest first."""
        check_session_id(session_id)
        return tuple(self._logs.get(session_id, ()))

    async def list_sessions(self) -> tuple[SessionInfo, ...]:
        """Return every session, sorted by id."""
        return tuple(
            SessionInfo(id=sid, version=len(log), updated_at=self._updated.get(sid))
            for sid, log in sorted(self._logs.items())
        )

    async def list_delegated(self) -> dict[str, RunOpened]:
        """Return the sessions sub-agents ran in, with their first runs' openings."""
        found: dict[str, RunOpened] = {}
        for session_id, log in self._logs.items():
            opened = next((e for e in log if isinstance(e, RunOpened)), None)
            if opened is not None and opened.parent is not None:
                found[session_id] = opened
        return found

    async def delete_session(self, session_id: str) -> bool:
        """Delete `session_id`, its entries and its lease; return whether it existed."""
        self._keys.pop(session_id, None)
        self._leases.pop(session_id, None)
        self._updated.pop(session_id, None)
        return self._logs.pop(session_id, None) is not None

    # -- LeasingStore ----------------------------------------------------
    async def acquire_lease(
        self, session_id: str, owner: str, *, ttl: float, force: bool = False
    ) -> Lease:
        """Take the lease on `session_id` for `owner` (see `LeasingStore`)."""
        check_session_id(session_id)
        check_lease(owner, ttl, force)
        lease = taken(
            self._leases.get(session_id),
            session_id,
            owner,
            now=time.time(),
            ttl=ttl,
            force=force,
        )
        self._leases[session_id] = lease
        return lease

    async def renew_lease(self, session_id: str, owner: str, *, ttl: float) -> Lease:
        """Extend `owner`'s lease on `session_id` (see `LeasingStore`)."""
        check_session_id(session_id)
        check_lease(owner, ttl)
        lease = renewed(
            self._leases.get(session_id), session_id, owner, now=time.time(), ttl=ttl
        )
        self._leases[session_id] = lease
        return lease

    async def release_lease(self, session_id: str, owner: str) -> None:
        """Let go of `owner`'s lease on `session_id` (see `LeasingStore`)."""
        lease = self._leases.get(session_id)
        if lease is not None and lease.owner == owner:
            del self._leases[session_id]

    async def lease_of(self, session_id: str) -> Lease | None:
        """Return the lease on `session_id`, or None (see `LeasingStore`)."""
        return self._leases.get(session_id)

    # -- lifecycle -------------------------------------------------------
    async def aclose(self) -> None:
        """Do nothing: a memory store holds no resources (its sessions stay)."""

    async def __aenter__(self) -> MemoryStore:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
