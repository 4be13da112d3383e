"""`require_new_ids`: the one check that a message joins a conversation once.

A message is known by its id: a commit names the messages it keeps by id,
a compaction pass the ones it replaces, a recall the one it fetches, the
token cache the count it keeps. A conversation that holds one id twice
cannot be told apart, and no pass can shrink it. So a message whose id the
conversation already holds is refused where it would join: a run's input,
an injected message, an effect's or a reviewer's results.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

from turnfsm.errors import InvalidMessage
from turnfsm.messages._log import MessageLog
from turnfsm.messages._values import Message

__all__ = ["require_new_ids"]

_MEMO: Final = "message_ids"


def require_new_ids(
    messages: Iterable[Message], *before: Sequence[Message], field: str = "id"
) -> None:
    """Check that each of `messages` has an id no message before it has.

    "Before" is every message of `before` (the history, then the run's
    messages so far) and the items of `messages` ahead of it. A
    `MessageLog`'s ids are kept on it, so asking again after k messages
    were appended costs O(k), not O(its length).

    Args:
        messages: The messages about to join the conversation.
        before: The conversation they join, in parts.
        field: What `messages` are, for the error (``input``: a run's).

    Raises:
        InvalidMessage: an id is used twice (`value` is the id).
    """
    # Per part: each id's first index, and how many items the part has
    # (an id is in the part when its first index is below that). None: not
    # looked up yet (a commit adds no message, and looks up nothing).
    known: list[tuple[dict[str, int], int]] | None = None
    seen: set[str] = set()
    for message in messages:
        if known is None:
            known = [_first_indexes(part) for part in before if part]
        message_id = message.id
        if message_id in seen:
            raise InvalidMessage(
                f"{field}.id", message_id, _said("given twice in one go")
            )
        for first, length in known:
            if first.get(message_id, length) < length:
                raise InvalidMessage(
                    f"{field}.id", message_id, _said("the conversation already has")
                )
        seen.add(message_id)


def _said(what: str) -> str:
    return (
        f"a message (by its id) {what}: give each message once, and build a "
        "new Message (Message.user(text)) to say the same again"
    )


def _first_indexes(messages: Sequence[Message]) -> tuple[dict[str, int], int]:
    """Each id's first index in `messages`, and their number.

    A `MessageLog`'s views share one append-only list, so one index of each
    id's first position, kept on that list, answers for every view: an id is
    in a view when it first appears below the view's length.
    """
    if type(messages) is not MessageLog:
        return {m.id: 0 for m in messages}, len(messages)
    length = messages._len
    memo = messages._store.memo
    known: tuple[int, dict[str, int]] | None = memo.get(_MEMO)
    count, first = known if known is not None else (0, {})
    if count < length:
        for i, message in enumerate(messages.items_from(count), count):
            first.setdefault(message.id, i)
        memo[_MEMO] = (length, first)
    return first, length
