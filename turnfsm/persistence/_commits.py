"""Commits: the check that a commit names only brought messages, and its projection."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from turnfsm.errors import ConfigError, CorruptRecord
from turnfsm.messages import Message, MessageLog
from turnfsm.persistence._records import (
    Committed,
    Entry,
    EventRecorded,
    ToolResultRecorded,
    event_messages,
)

__all__ = [
    "_check_commits",
    "_commit",
    "_committed",
    "_history_at",
    "_seen_at",
    "unbrought",
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


def _seen_at(
    entries: Sequence[Entry], run_id: str, reply_id: str, ids: Sequence[str]
) -> tuple[Message, ...]:
    """The messages `ids` as the model saw them, right before it said `reply_id`.

    A pass may change a message and keep its id: each id reads as it was
    last committed before that reply, or (not committed yet: the run's own
    pending messages) as the latest event brought it.
    """
    brought: dict[str, Message] = {}
    committed: dict[str, Message] = {}
    for entry in entries:
        if isinstance(entry, EventRecorded):
            said = event_messages(entry.event)
            if entry.run_id == run_id and any(m.id == reply_id for m in said):
                break
            for message in said:
                brought[message.id] = message
        elif isinstance(entry, Committed):
            committed.update((i, brought[i]) for i in entry.messages)
    return tuple(committed[i] if i in committed else brought[i] for i in ids)
