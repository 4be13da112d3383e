"""`OpenCalls`: the one checker that every tool call is answered, in O(new messages)."""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from typing import Final, final

import attrs

from turnfsm.errors import InvalidMessage
from turnfsm.messages._log import MessageLog
from turnfsm.messages._values import Message, Role, ToolCallPart, ToolResultPart

__all__ = ["OpenCalls", "check_history"]


def check_history(messages: Iterable[Message]) -> tuple[Message, ...]:
    """Validate a conversation given from outside and return it as a tuple.

    Every tool call must be answered by tool results before the next
    non-tool message (and before the end): a provider rejects a conversation
    with an orphaned half. The rules are `OpenCalls`'s.

    Raises:
        InvalidMessage: an item is not a `Message`; a tool result answers no
            earlier tool call (`field` is ``tool_result.call_id``); or a tool
            call has no result (`field` is ``tool_call.id``).
    """
    out = tuple(messages)
    OpenCalls().then(out).require_closed()
    return out


_OPEN_CALLS_MEMO: Final = "open_calls"


def _as_ids(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(value)


@final
@attrs.frozen(kw_only=True)
class OpenCalls:
    """The tool calls a valid conversation prefix leaves unanswered.

    The one checker of tool pairing: every tool result answers an open call
    of the same id, and every call is answered before the next non-tool
    message. Open calls can therefore only belong to the last assistant
    message. `OpenCalls()` is the state of an empty conversation;
    `state.then(messages)` checks the messages that follow it and returns the
    state after them, so a growing conversation is checked in O(new
    messages). `OpenCalls.of(log)` memoises the state of every checked
    `MessageLog` prefix on the log's backing list.

    Attributes:
        ids: the ids of the calls awaiting a result, in call order (an id
            called twice and answered once appears once).
    """

    ids: tuple[str, ...] = attrs.field(default=(), converter=_as_ids)

    @property
    def is_closed(self) -> bool:
        """Whether every call is answered (the prefix is a whole conversation)."""
        return not self.ids

    def then(self, messages: Iterable[Message]) -> OpenCalls:
        """Check `messages` as the continuation of this prefix; return the new state.

        Raises:
            InvalidMessage: an item is not a `Message` (`field` is
                ``messages``); a tool result answers no open call (`field` is
                ``tool_result.call_id``); or a non-tool message follows an
                unanswered call (`field` is ``tool_call.id``).
        """
        ids = self.ids
        for message in messages:
            ids = _step(ids, message)
        if ids is self.ids:
            return self
        if not ids:
            return _CLOSED
        # `OpenCalls(ids=...)` without the converter: `ids` is a tuple already.
        state = object.__new__(OpenCalls)
        object.__setattr__(state, "ids", ids)
        return state

    def require_closed(self) -> None:
        """Check that no call is left open (the conversation may end here).

        Raises:
            InvalidMessage: a call has no result (`field` is ``tool_call.id``,
                `value` its id).
        """
        if self.ids:
            raise InvalidMessage(
                "tool_call.id",
                self.ids[0],
                "a tool call with no result before the next message",
            )

    @classmethod
    def of(cls, messages: Iterable[Message]) -> OpenCalls:
        """Check `messages` as a conversation prefix; return the calls left open.

        For a `MessageLog` the state of each checked length is kept in its
        `memo`, so checking a log again after appending k messages costs O(k).

        Raises:
            InvalidMessage: as `then`.
        """
        if type(messages) is not MessageLog:
            return _CLOSED.then(messages)
        memo = messages._store.memo
        known: _Known | None = memo.get(_OPEN_CALLS_MEMO)
        if known is None:
            known = memo[_OPEN_CALLS_MEMO] = _Known()
        n = messages._len
        lengths = known.lengths
        if lengths[-1] <= n:  # the usual case: the log only grew
            at = len(lengths) - 1
        else:
            at = bisect.bisect_right(lengths, n) - 1
        length = lengths[at]
        state = known.states[at]
        if length == n:
            return state
        state = state.then(messages.items_from(length))
        lengths.insert(at + 1, n)
        known.states.insert(at + 1, state)
        return state


@final
class _Known:
    """The checked prefixes of one backing list: lengths (sorted), their states."""

    __slots__ = ("lengths", "states")

    def __init__(self) -> None:
        self.lengths: list[int] = [0]
        self.states: list[OpenCalls] = [_CLOSED]


_CLOSED: Final = OpenCalls()


def _step(open_ids: tuple[str, ...], message: object) -> tuple[str, ...]:
    """Return the open call ids after `message` (the checker's one rule)."""
    if type(message) is not Message:  # Message is final
        raise InvalidMessage("messages", message, "expected a Message")
    role = message.role
    if role is Role.TOOL:
        ids = list(open_ids)
        # A tool message holds only tool results (Message checks it).
        for part in message.parts:
            assert isinstance(part, ToolResultPart)
            if part.call_id not in ids:
                raise InvalidMessage(
                    "tool_result.call_id",
                    part.call_id,
                    "a tool result for no open tool call (no earlier call of "
                    "that id, already answered, or a message came between)",
                )
            ids.remove(part.call_id)
        return tuple(ids)
    if open_ids:
        raise InvalidMessage(
            "tool_call.id",
            open_ids[0],
            "a tool call with no result before the next message",
        )
    if role is not Role.ASSISTANT:  # only an assistant may call tools
        return open_ids
    calls = []  # a loop, not a generator: once per reply, on every tool turn
    for part in message.parts:
        if type(part) is ToolCallPart:
            calls.append(part.id)
    return tuple(calls) if calls else open_ids
