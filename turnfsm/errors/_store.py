"""Errors of loading and saving records: `StoreError` and its kinds."""

from __future__ import annotations

from collections.abc import Iterable
from typing import final

import attrs

from turnfsm.errors._base import TurnFSMError

__all__ = [
    "CorruptRecord",
    "DuplicateRecord",
    "LeaseLost",
    "SessionConflict",
    "SessionNotFound",
    "StoreDirectoryUnusable",
    "StoreError",
    "StoreUnusable",
]


class StoreError(TurnFSMError):
    """Base class of the errors of loading and saving records; never raised directly.

    A load or save that failed, an unknown schema version and a write
    conflict are store errors.
    """


@final
@attrs.frozen(auto_exc=True)
class CorruptRecord(StoreError, ValueError):
    """Raised when stored data does not read back as the record it should be.

    `type` names what was being read (``"Snapshot"``, ``"Event"``), `path`
    where in the data the problem is (``"events[3].message.parts"``; empty
    for the whole value) and `reason` what is wrong there. An unknown schema
    version is a corrupt record too (its `path` is ``"v"``).
    """

    type: str
    path: str
    reason: str

    def __str__(self) -> str:
        where = f" at {self.path}" if self.path else ""
        return (
            f"corrupt {self.type} record{where}: {self.reason}; it was written "
            "by another turnfsm version or changed since"
        )


@final
@attrs.frozen(auto_exc=True)
class SessionConflict(StoreError):
    """Raised when an append finds the session's log at another version.

    Another writer (a second process, host or `Session` view) appended first;
    nothing of this append was written. Expecting version 0 of a stored
    session means the writer took it for a new one: a `Session(id,
    store=...)` made anew reads nothing, `Session.open` reads the log.
    Found at version 0 when it expected more, the session was removed while
    the writer worked on it. `loading` is True when the append was a session
    log read into a store that already holds that session (`load_session`,
    ``turnfsm sessions import``).
    """

    session_id: str
    expected: int
    actual: int
    loading: bool = attrs.field(default=False, kw_only=True)

    def __str__(self) -> str:
        if self.loading:
            return (
                f"session {self.session_id!r} is already in this store "
                f"({self.actual} entries): nothing of the log was loaded. Read "
                f"the stored one (Session.open(store, {self.session_id!r})), load "
                "the log into another store, or delete the stored one first "
                f"(store.delete_session({self.session_id!r}), turnfsm sessions rm "
                f"{self.session_id}) to replace it with the log"
            )
        if self.expected == 0 and self.actual > 0:
            # The writer took a stored session for a new one: most often a
            # `Session(id, store=...)` made anew, which reads nothing.
            return (
                f"session {self.session_id!r} is already stored ({self.actual} "
                "entries), but this writer took it for a new one: another "
                "writer started it first, or this view was made with "
                f"Session({self.session_id!r}, store=...), which reads nothing "
                "- reload the session and retry (await Session.open(store, "
                f"{self.session_id!r}) reads it)"
            )
        if self.actual == 0:
            # Nobody appended: the session was deleted under the writer.
            return (
                f"session {self.session_id!r} is no longer in the store: it was "
                f"removed (expected version {self.expected}, found none) while "
                "this writer worked on it, by turnfsm sessions rm or "
                "delete_session; nothing of this append was written"
            )
        return (
            f"session {self.session_id!r} changed under this writer: expected "
            f"version {self.expected}, found {self.actual}; another writer "
            "appended first - reload the session and retry (await "
            f"Session.open(store, {self.session_id!r}) reads it)"
        )


def _ids(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(value)


@final
@attrs.frozen(auto_exc=True)
class SessionNotFound(StoreError, LookupError):
    """Raised when a session is read by an id that the store does not hold.

    Reading is never how a session starts (a run on a new id is): a
    misspelt id fails here instead of opening an empty conversation.
    `store` says where it was looked for ("" when the reader did not say),
    `suggestions` the stored ids closest to `session_id`, if the reader
    looked for any. With none, an id made for a run (``run_...``) is said
    to be a run's, not a session's.
    """

    session_id: str
    store: str = ""
    suggestions: tuple[str, ...] = attrs.field(default=(), converter=_ids)

    def __str__(self) -> str:
        where = f" in {self.store}" if self.store else " in the store"
        hint = ""
        if self.suggestions:
            hint = f" (did you mean {' or '.join(map(repr, self.suggestions))}?)"
        elif self.session_id.startswith("run_"):  # as a new run's id is made
            hint = (
                f" ({self.session_id!r} is a run's id: give its session's id, ses_...)"
            )
        return (
            f"no session {self.session_id!r}{where}{hint}; check the id against "
            "the stored sessions (a session is created by its first run, "
            "never by reading it)"
        )


@final
@attrs.frozen(auto_exc=True)
class DuplicateRecord(StoreError):
    """Raised when an append carries a compaction key the session already holds.

    A compaction record's idempotency `key` is unique in its session, so a
    pass that was already logged (a retried or redone append) is not logged
    twice; nothing of this append was written.
    """

    session_id: str
    key: str

    def __str__(self) -> str:
        return (
            f"session {self.session_id!r} already holds the compaction record "
            f"with key {self.key!r}; nothing was appended - reload the session, "
            "the pass is logged already"
        )


@final
@attrs.frozen(auto_exc=True)
class StoreUnusable(StoreError):
    """Raised when a store's file or database cannot be used; it was left unchanged.

    `path` names the file (or database) and `reason` what is wrong with it:
    not an SQLite file, another application's database, or a schema newer
    than this turnfsm knows. `in_doubt` is True when the write was sent and
    the connection was lost before its answer, on every connection tried:
    it may have been written, and reloading the session tells. `setting`
    names what chose the store when it was opened (``--store``,
    ``TURNFSM_STORE``; "" when the caller gave it). `names_no_store` is
    True when the path names something that is no store of turnfsm's (a
    directory, a file of another kind, another application's database):
    with a `setting`, the message says to change it.
    """

    path: str
    reason: str
    in_doubt: bool = False
    setting: str = attrs.field(default="", kw_only=True)
    names_no_store: bool = attrs.field(default=False, kw_only=True)

    def __str__(self) -> str:
        outcome = (
            "it may have been written: reload the session to see"
            if self.in_doubt
            else "nothing was changed"
        )
        wrong = self.names_no_store and not self.in_doubt
        change = f"; change {self.setting}" if self.setting and wrong else ""
        return (
            f"cannot use {self.path} as a turnfsm session store: {self.reason}"
            f"{change} ({outcome})"
        )


@final
@attrs.frozen(auto_exc=True)
class StoreDirectoryUnusable(StoreError):
    """Raised when the directory a store's file would live in cannot be used.

    It is missing, not a directory, or cannot be created or written.
    `directory` names it, `reason` says what is wrong, and `setting` names
    what chose it (``--store``, ``TURNFSM_STORE``, ``XDG_DATA_HOME``), the
    thing to change. Nothing was written.
    """

    directory: str
    reason: str
    setting: str

    def __str__(self) -> str:
        mend = next(
            (m for why, m in _MENDS if self.reason.startswith(why)), "create it"
        )
        return (
            f"cannot keep sessions in the directory {self.directory}: "
            f"{self.reason}; {mend}, or change {self.setting} "
            "(nothing was written)"
        )


_MENDS = (
    ("it is not a directory", "move that file away"),
    (
        "it cannot be written (a read-only file system)",
        "copy the store to a writable disk",
    ),
    ("it cannot be written", "let this user write it"),
)
"""What mends a directory refused for each reason; any other: create it."""


@final
@attrs.frozen(auto_exc=True)
class LeaseLost(StoreError):
    """Raised when an owner renews a session's lease that is no longer its own.

    `holder` took the session over, its lease expired or forced (None: nobody
    holds it now). The owner must stop working on the session: another
    process may be resuming or abandoning its run.
    """

    session_id: str
    owner: str
    holder: str | None = None

    def __str__(self) -> str:
        if self.holder is not None:
            why = (
                f"{self.holder!r} took the session over: the lease had expired, "
                "or was taken with force"
            )
        else:
            why = "nobody holds it now: the lease was released, or the session removed"
        return (
            f"{self.owner!r} no longer holds the lease on session "
            f"{self.session_id!r} ({why}); stop working on the session and "
            "reload it to see what the other process did"
        )
