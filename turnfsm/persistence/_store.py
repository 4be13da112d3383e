"""The `SessionStore` protocol and `MemoryStore`, its in-memory implementation.

A store keeps one append-only log per session. An append names the version
(the number of entries) it expects the log to be at, so two writers on one
session cannot interleave: the second gets `SessionConflict` and writes
nothing. Stores never rewrite or delete entries.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, final, runtime_checkable

import attrs

from turnfsm import _checks
from turnfsm.errors import ConfigError, SessionConflict
from turnfsm.persistence._records import Entry

__all__ = ["MemoryStore", "SessionInfo", "SessionStore"]


@final
@attrs.frozen(kw_only=True)
class SessionInfo:
    """One session as a store lists it: its id and how many entries it has."""

    id: str
    version: int


@runtime_checkable
class SessionStore(Protocol):
    """Where session logs live: append-only, versioned, one log per session id."""

    async def append(
        self, session_id: str, entries: Sequence[Entry], *, expected_version: int
    ) -> int:
        """Append `entries` to the log of `session_id` if it is at `expected_version`.

        A session that does not exist yet is at version 0.

        Returns:
            The new version (the number of entries in the log).

        Raises:
            SessionConflict: the log is not at `expected_version` (another
                writer appended first); nothing was written.
        """
        ...

    async def load(self, session_id: str) -> tuple[Entry, ...]:
        """Return every entry of `session_id`, oldest first (empty if unknown)."""
        ...

    async def list_sessions(self) -> tuple[SessionInfo, ...]:
        """Return every session the store holds, by id."""
        ...


# A store whose resources are bound to an event loop (a connection pool) may
# also define `async def release()`: `Agent.run_sync` calls it before the loop
# it made ends. It is not part of the protocol: most stores need none.


def check_session_id(session_id: object) -> str:
    """Return `session_id` if it is a usable id; raise `ConfigError` if not."""
    return _checks.check_id("session_id", session_id)


def check_store(store: object) -> SessionStore:
    """Return `store` if it is a `SessionStore`; raise `ConfigError` if not."""
    if not isinstance(store, SessionStore):
        raise ConfigError("store", store, "a SessionStore (append/load/list_sessions)")
    return store


@final
@attrs.define(eq=False)
class MemoryStore:
    """Session logs in this process's memory (a library `Agent`'s default).

    Entries are frozen values, kept as they are (no serialisation): a
    `MemoryStore` is as fast as a list, and is lost with the process.
    """

    _logs: dict[str, list[Entry]] = attrs.field(factory=dict, init=False)

    async def append(
        self, session_id: str, entries: Sequence[Entry], *, expected_version: int
    ) -> int:
        """Append `entries` if the log is at `expected_version` (see `SessionStore`)."""
        log = self._logs.get(session_id)
        if log is None:
            check_session_id(session_id)
            log = self._logs[session_id] = []
        if len(log) != expected_version:
            raise SessionConflict(
                session_id=session_id, expected=expected_version, actual=len(log)
            )
        log.extend(entries)
        return len(log)

    async def load(self, session_id: str) -> tuple[Entry, ...]:
        """Return every entry of `session_id`, oldest first."""
        return tuple(self._logs.get(session_id, ()))

    async def list_sessions(self) -> tuple[SessionInfo, ...]:
        """Return every session, sorted by id."""
        return tuple(
            SessionInfo(id=sid, version=len(log))
            for sid, log in sorted(self._logs.items())
        )
