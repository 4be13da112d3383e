"""Commits: the check that a commit names only brought messages, and its projection."""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from typing import final

from turnfsm.core import PASS_EVENT_TYPES, CompactionResult, PassEvent
from turnfsm.errors import ConfigError, CorruptRecord
from turnfsm.messages import Message, MessageLog
from turnfsm.persistence._records import (
    Committed,
    CompactionRecord,
    Entry,
    EventRecorded,
    ToolResultRecorded,
    event_messages,
)

__all__ = [
    "SeenIndex",
    "_check_commits",
    "_commit",
    "_committed",
    "_history_at",
    "unbrought",
    "unopened",
]


def _check_commits(entries: Sequence[Entry], known: Mapping[str, Message]) -> None:
    """Refuse a commit of a message no event brought, before it is written."""
    brought: set[str] = set()
    for n, entry in enumerate(entries):
        if isinstance(entry, EventRecorded):
            brought.update(m.id for m in event_messages(entry.event))
        elif isinstance(entry, ToolResultRecorded):
            brought.add(entry.result.id)
        elif isinstance(entry, Committed):
            missing = [i for i in entry.messages if i not in known and i not in brought]
            if missing:
                raise ConfigError(
                    f"entries[{n}].messages",
                    missing,
                    "ids of messages an event of the session brought",
                )


def _committed(
    entry: Committed,
    version: int,
    history: MessageLog,
    messages: dict[str, Message],
    hint: MessageLog | None,
) -> MessageLog:
    missing = [i for i in entry.messages if i not in messages]
    if missing:
        raise CorruptRecord(
            "Committed", f"entries[{version}].messages", unbrought(missing)
        )
    return _commit(history, entry.keep, entry.messages, messages, hint)


def unopened(run_id: str) -> str:
    """Why an entry of a run that never opened is refused (what a log reads)."""
    return f"run {run_id!r} has no RunOpened before it"


def unbrought(missing: Sequence[str]) -> str:
    """Why a commit of messages no event brought cannot be read."""
    return f"message {missing[0]!r} was brought in by no event before it"


def _commit(
    history: MessageLog,
    keep: int,
    ids: Sequence[str],
    messages: dict[str, Message],
    hint: MessageLog | None,
) -> MessageLog:
    # The ids are known: `_committed` checked them (a projection of
    # a log already read, `_history_at`, needs no check).
    size = keep + len(ids)
    if (
        hint is not None
        and len(hint) == size
        and (not ids or hint[size - 1].id == ids[-1])
    ):
        return hint
    if keep == len(history):
        return history.extend(messages[i] for i in ids)
    return MessageLog([*history[:keep], *(messages[i] for i in ids)])


def _history_at(entries: Sequence[Entry]) -> MessageLog:
    messages: dict[str, Message] = {}
    history = MessageLog()
    for entry in entries:
        if isinstance(entry, EventRecorded):
            for message in event_messages(entry.event):
                messages[message.id] = message  # as the latest event brought it
        elif isinstance(entry, Committed):
            history = _commit(history, entry.keep, entry.messages, messages, None)
    return history


@final
class SeenIndex:
    """Where each message id was brought and committed, by log position.

    Built in one walk over a session's entries, so `Session.seen` answers a
    turn in O(its messages), not O(the log): a view that shows every turn
    would otherwise walk the log once per turn.
    """

    __slots__ = ("_brought", "_committed", "_passes", "_replies", "size")

    def __init__(self, entries: Sequence[Entry]) -> None:
        self.size = len(entries)
        """How many entries the index covers."""
        brought: dict[str, tuple[list[int], list[Message]]] = {}
        committed: dict[str, tuple[list[int], list[Message]]] = {}
        replies: dict[tuple[str, str], int] = {}
        passes: dict[str, tuple[int, PassEvent | None]] = {}
        waiting: dict[str, str] = {}  # a run -> its last pass, until its event
        latest: dict[str, Message] = {}
        for at, entry in enumerate(entries):
            if isinstance(entry, EventRecorded):
                event = entry.event
                if isinstance(event, PASS_EVENT_TYPES):
                    key = waiting.pop(entry.run_id, None)
                    if key is not None:
                        passes[key] = (passes[key][0], event)
                for message in event_messages(event):
                    replies.setdefault((entry.run_id, message.id), at)
                    if latest.get(message.id) is not message:
                        latest[message.id] = message
                        _version(brought, message.id, at, message)
            elif isinstance(entry, Committed):
                for message_id in entry.messages:
                    _version(committed, message_id, at, latest[message_id])
            elif isinstance(entry, CompactionRecord):
                # The pass's event follows its record (`taken`, or the run's end).
                passes[entry.key] = (at, None)
                waiting[entry.run_id] = entry.key
        self._brought, self._committed, self._replies = brought, committed, replies
        self._passes = passes

    def seen(
        self, run_id: str, reply_id: str, ids: Sequence[str]
    ) -> tuple[Message, ...]:
        """The messages `ids` as the model saw them, right before it said `reply_id`.

        A pass may change a message and keep its id: each id reads as it was
        last committed before that reply, or (not committed yet: the run's
        own pending messages) as the latest event before it brought it.
        """
        before = self._replies.get((run_id, reply_id), self.size)
        return tuple(self._as_of(message_id, before) for message_id in ids)

    def passed(
        self, record: CompactionRecord
    ) -> tuple[tuple[Message, ...], tuple[Message, ...]]:
        """What `record`'s pass was given, and what it put in their place, as they were.

        The messages of `record.covers` as the pass was handed them (each as
        last committed before it, or brought), and those of
        `record.replacement` as the pass made them: a message it changed
        under its id (a digested tool result) reads differently on each side.
        """
        at, event = self._passes[record.key]
        before = tuple(self._as_of(i, at) for i in record.covers)
        if not isinstance(event, CompactionResult):
            return before, before  # nothing replaced
        made = {m.id: m for m in event.messages}
        after = tuple(
            made[i] if i in made else self._as_of(i, at) for i in record.replacement
        )
        return before, after

    def _as_of(self, message_id: str, before: int) -> Message:
        for versions in (self._committed, self._brought):
            found = versions.get(message_id)
            if found is not None:
                at = bisect.bisect_left(found[0], before)
                if at:
                    return found[1][at - 1]
        raise KeyError(message_id)


def _version(
    versions: dict[str, tuple[list[int], list[Message]]],
    message_id: str,
    at: int,
    message: Message,
) -> None:
    found = versions.get(message_id)
    if found is None:
        versions[message_id] = ([at], [message])
    else:
        found[0].append(at)
        found[1].append(message)
