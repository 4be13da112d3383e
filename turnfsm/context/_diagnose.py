"""Name what fills a context: its largest items, for a `ContextExceeded`.

A run that cannot fit its window ends with `ContextExceeded` (or one of its
subclasses, `CompactionStalled` and `CompactionFailed`). `explain` fills the
error's `largest` with the biggest pieces of the context, so its message says
which tool result of which turn is big, and which shipped strategy shrinks it.

Each piece is measured on its own with the run's counter (`count_text`): a
tool result's content, a tool call's name and JSON arguments, and the text
parts of a message together. Images are not measured (they have no text).
Pure: no I/O.
"""

from __future__ import annotations

import heapq
from collections.abc import Collection, Iterator, Sequence
from typing import TypeVar

import attrs

from turnfsm import _checks
from turnfsm.errors import ConfigError, ContextExceeded, LargeItem, TurnFSMError
from turnfsm.messages import (
    ImagePart,
    Message,
    Role,
    TextPart,
    ToolCallPart,
    ToolResultPart,
)
from turnfsm.tokens import TokenCounter, arguments_json

__all__ = ["counter_at_fault", "explain", "largest_items"]

_E = TypeVar("_E", bound=TurnFSMError)


def largest_items(
    messages: Sequence[Message],
    counter: TokenCounter,
    *,
    n: int = 3,
    pinned: Collection[str] = (),
) -> tuple[LargeItem, ...]:
    """Return the `n` largest items of `messages`, biggest first.

    An item is a tool result, a tool call, or the text parts of one message
    with what its model client sends of its metadata (a reply's thinking);
    each is measured with `counter.count_text` on its rendered text. Ties go
    to the earlier item.

    Args:
        messages: The context, in order.
        counter: The run's token counter.
        n: How many items to return at most.
        pinned: The ids of the pinned messages (`ContextManager.pinned`):
            their items say so (`LargeItem.pinned`).

    Returns:
        Up to `n` items; a tool result names the tool of the call it answers
        (``""`` when no earlier call has its id).

    Raises:
        ConfigError: `n` is negative, or `counter` returned something other
            than an int >= 0.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ConfigError("n", n, "an int >= 0")
    ranked = heapq.nsmallest(
        n,
        enumerate(_items(messages, counter, frozenset(pinned))),
        key=lambda entry: (-entry[1].tokens, entry[0]),
    )
    return tuple(item for _, item in ranked)


def explain(
    error: _E,
    messages: Sequence[Message],
    counter: TokenCounter,
    *,
    strategy: str = "",
    pinned: Collection[str] = (),
) -> _E:
    """Return `error` naming the largest items of `messages`, if it can.

    A `ContextExceeded` (or subclass) whose `largest` is empty comes back as a
    copy with `largest` filled by `largest_items` and `strategy` set (its
    message then advises what would help, never that strategy), and with
    `counter` set when the counter's count of `messages` is more than any
    tokenizer makes of them (`counter_at_fault`); any other error, or one
    with nothing to add, comes back unchanged (the same object).

    Args:
        error: The error a run ended with.
        messages: The context the run could not fit.
        counter: The run's token counter.
        strategy: The class name of the compactor in use (``""``: unknown).
        pinned: The ids of the pinned messages: no pass shrinks them, and
            the message says so when they fill the context.
    """
    if not isinstance(error, ContextExceeded):
        return error
    explained = error
    if not error.counter:
        blame = counter_at_fault(messages, counter)
        if blame:
            explained = attrs.evolve(explained, counter=blame)
    if not error.largest:
        largest = largest_items(messages, counter, pinned=pinned)
        if largest:
            explained = attrs.evolve(explained, largest=largest, strategy=strategy)
    return explained


def counter_at_fault(
    messages: Sequence[Message],
    counter: TokenCounter,
    *,
    extras: Sequence[str] = (),
    tokens: int | None = None,
) -> str:
    """Say what `counter` counted, when no tokenizer makes that much of the text.

    A `ContextExceeded` blames the conversation (its pins, its largest
    items); when the counter's count is past what any tokenizer makes of
    the text (more than `turnfsm._checks.TOKENS_PER_CHAR` tokens a
    character, plus some framing per message), the counter is at fault,
    and the error names it (its `counter`).

    Args:
        messages: The messages counted.
        counter: The token counter that counted them.
        extras: Texts counted with them (system prompt, tool schemas).
        tokens: What the counter made of them (None: ``counter.count``).

    Returns:
        ``"NAME counted N tokens for M characters"``, or ``""`` when the
        count is one a tokenizer could make.
    """
    if tokens is None:
        tokens = _checks.token_count(counter.count(list(messages)), counter, "count")
    chars = sum(map(_chars, messages)) + sum(map(len, extras))
    if not _checks.tokens_beyond_text(tokens, chars, len(messages) + len(extras)):
        return ""
    return f"{type(counter).__name__} counted {tokens} tokens for {chars} characters"


def _chars(message: Message) -> int:
    """The characters of `message` a counter reads (an image as `_IMAGE_CHARS`)."""
    total = 0
    for part in message.parts:
        if isinstance(part, TextPart):
            total += len(part.text)
        elif isinstance(part, ToolCallPart):
            total += len(part.name) + len(arguments_json(part))
        elif isinstance(part, ToolResultPart):
            total += len(part.content)
        elif isinstance(part, ImagePart):
            total += _IMAGE_CHARS
    if message.metadata:  # what a model client sends of it, priced too
        total += sum(map(len, message.sent_texts))
    return total


_IMAGE_CHARS = 1_024
"""What an image counts as, in characters, when judging a count.

At `turnfsm._checks.TOKENS_PER_CHAR` tokens each, 8,192 tokens: more than
any provider charges for one image (about 3,800 at most), so a counter
pricing images high (`image_tokens`) is not blamed for them.
"""


def _items(
    messages: Sequence[Message], counter: TokenCounter, pinned: frozenset[str]
) -> Iterator[LargeItem]:
    """Yield every measured piece of `messages`, in order."""
    turn = 0
    tools: dict[str, str] = {}  # call id -> tool name, of the calls so far
    for index, message in enumerate(messages):
        role = message.role
        held = message.id in pinned
        if role is Role.USER:
            turn += 1
        text = "".join(p.text for p in message.parts if isinstance(p, TextPart))
        if message.metadata:  # what a model client sends of it (its thinking)
            text = "".join((text, *message.sent_texts))
        if text:
            yield LargeItem(
                kind="message",
                role=role.value,
                turn=turn,
                index=index,
                tokens=_count_text(counter, text),
                pinned=held,
            )
        for part in message.parts:
            if isinstance(part, ToolCallPart):
                tools[part.id] = part.name
                yield LargeItem(
                    kind="tool_call",
                    role=role.value,
                    turn=turn,
                    index=index,
                    tokens=_count_text(counter, part.name + arguments_json(part)),
                    tool=part.name,
                    call_id=part.id,
                    pinned=held,
                )
            elif isinstance(part, ToolResultPart):
                yield LargeItem(
                    kind="tool_result",
                    role=role.value,
                    turn=turn,
                    index=index,
                    tokens=_count_text(counter, part.content),
                    tool=tools.get(part.call_id, ""),
                    call_id=part.call_id,
                    pinned=held,
                )


def _count_text(counter: TokenCounter, text: str) -> int:
    return _checks.token_count(counter.count_text(text), counter, "count_text")
