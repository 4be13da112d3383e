"""Recall marks: every replacement a pass makes names what it replaces.

A pass keeps nothing it drops, but the session's log does: each original
stays addressable by its message id. So that the model (and a reader) can
get back to it, a replacement names the range it covers, twice:

- in its metadata, under `REPLACES`: the covered message ids, separated by
  spaces (`replaced_ids` reads them back);
- in its text, as a short note the model can act on:
  ``[recall h1a2b3c4d5e]`` for one message, ``[recall h1a..h9f]`` for a
  range (the first and last, in the order they were said). A note names
  a message by a short digest of what it says (`handle`), a tool result by
  its call's (`call_handle`): message ids are fresh in every run, and a
  note must read the same, and cost the same, each time the same
  conversation is compacted. The recall tool resolves them.

A summary names the messages it stands for; a tool result whose content a
pass changed (digested, capped, cut, emptied) names its own call, whose
original result the log holds under the message's id. Truncation drops messages
without a replacement: nothing names them, but they stay in the log (and
the recall tool's search finds them).

The marks are applied around a strategy (`with_recall_marks`): the strategy
sees its input with the marks taken off, so its own rules (what is already a
digest, what was cut already) read the content they always read, and a pass
on its own output changes nothing more. The notes are deterministic: the
same pass over the same messages writes the same text.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Final, final

import attrs

from turnfsm.context._pass_count import count_of, same_messages
from turnfsm.context._transcript import result_texts
from turnfsm.context._values import CompactionContext, CompactionProposal
from turnfsm.messages import (
    Message,
    Part,
    Role,
    TextPart,
    ToolCallPart,
    ToolResultPart,
)
from turnfsm.tokens import TokenCounter

__all__ = [
    "REPLACES",
    "call_handle",
    "handle",
    "mark_replacements",
    "recall_note",
    "replaced_ids",
    "same_messages",
    "unmark",
    "with_recall_marks",
]

REPLACES: Final = "turnfsm.replaces"
"""Metadata key of a replacement: the ids of the messages it covers (spaces apart)."""

Compact = Callable[
    [Sequence[Message], int, CompactionContext], Awaitable[CompactionProposal]
]
"""A strategy's compact method."""


def recall_note(ids: Sequence[str]) -> str:
    """Return the note naming `ids`: ``[recall a]`` or ``[recall first..last]``.

    Args:
        ids: The covered message ids, in the order they were said (≥ 1).
    """
    if not ids:
        raise ValueError("a recall note names at least one message id")
    span = ids[0] if len(ids) == 1 else f"{ids[0]}..{ids[-1]}"
    return f"[recall {span}]"


def replaced_ids(message: Message) -> tuple[str, ...]:
    """Return the ids of the messages `message` replaces (empty: it replaces none)."""
    value = message.metadata.get(REPLACES)
    return tuple(value.split()) if isinstance(value, str) else ()


def _digest(*pieces: str) -> str:
    # Any text: a lone surrogate (a tool's output decoded from bytes that are
    # not UTF-8) hashes by its code point, as a store keeps it.
    text = "\x1f".join(pieces)
    return "h" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:10]


def call_handle(call: ToolCallPart) -> str:
    """Return what a note calls tool call `call`: a digest of its name and arguments."""
    arguments = json.dumps(call.arguments, sort_keys=True, default=str)
    return _digest("call", call.name, arguments)


def handle(message: Message, calls: Mapping[str, ToolCallPart] | None = None) -> str:
    """Return what a note calls `message`: a short digest of what it says.

    Message ids are fresh in every run; a note names what a message says
    instead, so the same conversation compacts to the same text (and the
    same size) every time. A tool result is named by its call (found in
    `calls`, by call id; a result whose call is not there, by its call id).

    Args:
        message: The message.
        calls: The conversation's tool calls, by id.
    """
    results = message.tool_results
    if results:
        call = (calls or {}).get(results[0].call_id)
        return call_handle(call) if call is not None else results[0].call_id
    return _digest(
        message.role.value, message.text, *(call_handle(c) for c in message.tool_calls)
    )


def _calls(messages: Sequence[Message]) -> dict[str, ToolCallPart]:
    return {c.id: c for m in messages for c in m.tool_calls}


_NOTE_AT_END: Final = re.compile(r"(?:\A| )\[recall [^\s\]]+\]\Z")


def _unmarked_content(content: str, note: str) -> str | None:
    """`content` without its trailing `note` (None: it carries none)."""
    if content == note:
        return ""
    if content.endswith(" " + note):
        return content[: -len(note) - 1]
    return None


def _may_end_in_note(content: str) -> bool:
    """Could `content` end with a recall note (a test cheaper than the note)?"""
    return content.endswith("]")


def _plain(message: Message) -> bool:
    """Does marking leave `message` as it is, when the pass left it so?"""
    return message.role is not Role.TOOL or not any(
        isinstance(p, ToolResultPart) and _may_end_in_note(p.content)
        for p in message.parts
    )


def _marked_content(content: str, note: str) -> str:
    return f"{content} {note}" if content else note


def _unmark_one(message: Message) -> Message:
    if message.role is not Role.TOOL or REPLACES not in message.metadata:
        return message
    parts: list[Part] = []
    for part in message.parts:
        if isinstance(part, ToolResultPart):
            found = _NOTE_AT_END.search(part.content)
            if found is not None:
                part = attrs.evolve(part, content=part.content[: found.start()])
        parts.append(part)
    metadata = {k: v for k, v in message.metadata.items() if k != REPLACES}
    return attrs.evolve(message, parts=tuple(parts), metadata=metadata)


def unmark(messages: Sequence[Message]) -> tuple[Message, ...]:
    """Return `messages` with the recall notes of changed tool results taken off.

    Summaries keep theirs (their text is reused as it was recorded).
    Messages without a note are the same objects.
    """
    # Most messages carry no metadata at all: test that before reading it.
    marked = [
        i for i, m in enumerate(messages) if m.metadata and REPLACES in m.metadata
    ]
    if not marked:
        return tuple(messages)
    out = list(messages)
    for i in marked:
        out[i] = _unmark_one(out[i])
    return tuple(out)


def _same(a: Message, b: Message) -> bool:
    return a == b and dict(a.metadata) == dict(b.metadata)


def _gaps(plain: Sequence[Message], kept: set[str]) -> dict[int, list[Message]]:
    """The dropped messages, by the index of the last kept one before them (-1)."""
    gaps: dict[int, list[Message]] = {}
    last = -1
    for i, m in enumerate(plain):
        if m.id in kept:
            last = i
        else:
            gaps.setdefault(last, []).append(m)
    return gaps


def _covers(
    result: Sequence[Message],
    index: Mapping[str, int],
    gaps: Mapping[int, list[Message]],
) -> dict[int, list[Message]]:
    """What each new message of `result` covers, by its index in `result`.

    A run of dropped messages goes to the first new message after the kept
    message it followed; when none stands there (a summary put before the
    pinned messages it replaced the messages around), to the nearest new
    message before it.
    """
    new = [at for at, m in enumerate(result) if m.id not in index]
    if not new:
        return {}
    place = {index[m.id]: at for at, m in enumerate(result) if m.id in index}
    covers: dict[int, list[Message]] = {}
    for last, dropped in sorted(gaps.items()):
        after = place.get(last, -1)
        following = [at for at in new if at > after]
        nearest = following[0] if following else new[-1]
        if following and any(p < nearest for p in place.values() if p > after):
            preceding = [at for at in new if at < after]
            nearest = preceding[-1] if preceding else nearest
        covers.setdefault(nearest, []).extend(dropped)
    return covers


def _with_note(
    message: Message, covered: Sequence[Message], calls: Mapping[str, ToolCallPart]
) -> Message:
    """A new message (a summary) naming `covered` in its metadata and its text."""
    ids = [m.id for m in covered]
    ends = [handle(covered[0], calls), handle(covered[-1], calls)]
    note = recall_note(ends[: len(covered)])
    metadata = {**message.metadata, REPLACES: " ".join(ids)}
    parts = list(message.parts)
    last_text = max(
        (j for j, p in enumerate(parts) if isinstance(p, TextPart)), default=None
    )
    if last_text is not None:
        text = parts[last_text]
        assert isinstance(text, TextPart)
        if not text.text.endswith(note):
            parts[last_text] = TextPart(text=f"{text.text}\n\n{note}")
    return attrs.evolve(message, parts=tuple(parts), metadata=metadata)


def _results_by_call(message: Message) -> dict[tuple[str, int], ToolResultPart]:
    """The tool results of `message` by (call id, occurrence of that call id)."""
    out: dict[tuple[str, int], ToolResultPart] = {}
    seen: dict[str, int] = {}
    for part in message.parts:
        if isinstance(part, ToolResultPart):
            k = seen.get(part.call_id, 0)
            seen[part.call_id] = k + 1
            out[part.call_id, k] = part
    return out


def _changed_results(
    message: Message,
    plain: Message,
    original: Message,
    note_of: Callable[[str], str],
) -> Message:
    """`message`, with a note on each tool result whose content the pass changed."""
    if message.role is not Role.TOOL:
        return message
    before = _results_by_call(plain)
    was = _results_by_call(original)
    parts: list[Part] = []
    marked = False
    seen: dict[str, int] = {}
    for part in message.parts:
        if isinstance(part, ToolResultPart):
            # A message may hold several results for one call: the k-th
            # result of a call is compared with the k-th it had.
            key = (part.call_id, seen.get(part.call_id, 0))
            seen[part.call_id] = key[1] + 1
            base = before.get(key)
            if base is not None and part.content == base.content:
                # Unchanged by this pass: as it came (with an earlier note).
                part = was.get(key, part)
                if not marked and _may_end_in_note(part.content):
                    note = note_of(part.call_id)
                    marked = _unmarked_content(part.content, note) is not None
            else:
                note = note_of(part.call_id)
                part = attrs.evolve(part, content=_marked_content(part.content, note))
                marked = True
        parts.append(part)
    metadata = {k: v for k, v in message.metadata.items() if k != REPLACES}
    if marked:
        metadata[REPLACES] = message.id
    return attrs.evolve(message, parts=tuple(parts), metadata=metadata)


def mark_replacements(
    plain: Sequence[Message],
    result: Sequence[Message],
    original: Sequence[Message] | None = None,
) -> tuple[Message, ...]:
    """Return `result` with every replacement naming what it covers.

    Args:
        plain: The pass's input, as the strategy saw it (`unmark`).
        result: What the strategy made of it.
        original: The input as it came (with earlier notes; default
            `plain`): a result message equal to its original is that object.

    Returns:
        `result`, where a new message (a summary) names the messages
        dropped where it stands, and a tool result whose content changed
        names its own message (in its metadata) and call (in its text).
    """
    return _Marker(plain, plain if original is None else original).mark(result)


@final
class _Marker:
    """Marks the results of one pass's input: `mark_replacements`, reusable.

    A strategy counts many candidate results of one input (a search for the
    most that fits); the input's tables are built once, and each kept
    message's marking is remembered by the message object it was made from.
    """

    __slots__ = ("_as_is", "_calls", "by_id", "kept_as", "notes", "plain", "was")

    def __init__(self, plain: Sequence[Message], original: Sequence[Message]) -> None:
        self.plain = plain
        self.by_id = {m.id: m for m in plain}
        self.was = (
            self.by_id
            if same_messages(original, plain)
            else {m.id: m for m in original}
        )
        """The input as it came, by id (`by_id` itself when it had no notes)."""
        self._calls: dict[str, ToolCallPart] | None = None
        self._as_is: bool | None = None
        self.kept_as: dict[str, tuple[Message, Message]] = {}
        """A kept message's id -> (the message the strategy gave, as marked)."""
        self.notes: dict[str, str] = {}
        """A call id -> the note a changed result of it carries."""

    @property
    def calls(self) -> dict[str, ToolCallPart]:
        """The input's tool calls by id (a note names a call by them)."""
        calls = self._calls
        if calls is None:
            calls = self._calls = _calls(self.plain)
        return calls

    def note_of(self, call_id: str) -> str:
        """The note on a result of call `call_id` that a pass changed."""
        note = self.notes.get(call_id)
        if note is None:
            call = self.calls.get(call_id)
            handle = call_handle(call) if call is not None else call_id
            note = self.notes[call_id] = recall_note((handle,))
        return note

    @property
    def as_is(self) -> bool:
        """Does marking leave the input itself as it is (no notes on or in it)?"""
        as_is = self._as_is
        if as_is is None:
            as_is = self._as_is = (
                self.was is self.by_id
                and len(self.by_id) == len(self.plain)
                and not any(map(_may_end_in_note, result_texts(self.plain)))
            )
        return as_is

    def mark(self, result: Sequence[Message]) -> tuple[Message, ...]:
        if same_messages(result, self.plain) and self.as_is:
            return tuple(result)  # the input, untouched: nothing to name
        by_id, was, kept_as = self.by_id, self.was, self.kept_as
        out: list[Message] = []
        new: list[int] = []  # where the new messages stand
        for message in result:
            base = by_id.get(message.id)
            if base is None:
                new.append(len(out))
                out.append(message)
                continue
            known = kept_as.get(message.id)
            if known is not None and known[0] is message:
                out.append(known[1])
                continue
            if message is base and was.get(message.id) is base and _plain(base):
                # Untouched, and carrying no note: as it came.
                kept_as[message.id] = (base, base)
                out.append(base)
                continue
            changed = _changed_results(
                message, base, was.get(message.id, base), self.note_of
            )
            old = was.get(message.id)
            marked = old if old is not None and _same(changed, old) else changed
            kept_as[message.id] = (message, marked)
            out.append(marked)
        if new:  # a new message (a summary) names what it stands for
            kept = {m.id for m in result if m.id in by_id}
            index = {m.id: i for i, m in enumerate(self.plain)}
            covers = _covers(result, index, _gaps(self.plain, kept))
            for at in new:
                covered = covers.get(at)
                if covered:
                    out[at] = _with_note(out[at], covered, self.calls)
        return tuple(out)


@final
@attrs.define(eq=False)
class _MarkedCounter:
    """Counts a candidate result as it will be: with its recall notes.

    A strategy that measures its work against the target (stop when it
    fits, cut to the size that fits) then leaves room for the notes. It
    remembers the last result it counted, marked and measured: the pass
    marks and measures its proposal once, when that was the last counted.
    """

    counter: TokenCounter
    marker: _Marker
    _last: tuple[Sequence[Message], tuple[Message, ...], int] | None = None

    def count(self, messages: Sequence[Message]) -> int:
        marked, size = self.marked(messages)
        if size is None:
            size = count_of(self.counter, marked)
            # A snapshot: a list the strategy changes in place is not the same.
            self._last = (tuple(messages), marked, size)
        return size

    def count_text(self, text: str) -> int:
        return self.counter.count_text(text)

    def marked(
        self, messages: Sequence[Message]
    ) -> tuple[tuple[Message, ...], int | None]:
        """`messages` marked, and their size if this counter measured them last."""
        last = self._last
        if last is not None and same_messages(last[0], messages):
            return last[1], last[2]
        return self.marker.mark(messages), None


async def with_recall_marks(
    compact: Compact,
    messages: Sequence[Message],
    target: int,
    ctx: CompactionContext,
) -> CompactionProposal:
    """Run `compact` on `messages` without their notes; mark what it replaced.

    The result is re-counted with the marks (they count against the window
    like any text); a result that is the input again is reported unchanged.
    """
    plain = unmark(messages)
    counter = _MarkedCounter(ctx.counter, _Marker(plain, plain))
    proposal = await compact(plain, target, attrs.evolve(ctx, counter=counter))
    if proposal.is_failed:
        return proposal
    size: int | None = None
    if same_messages(messages, plain):
        marked, size = counter.marked(proposal.messages)
    else:  # the input had notes: mark against it
        marked = _Marker(plain, messages).mark(proposal.messages)
    if same_messages(marked, messages):
        return CompactionProposal.unchanged(messages, ctx.tokens_before)
    if proposal.tokens_after == proposal.tokens_before and same_messages(
        marked, proposal.messages
    ):
        return attrs.evolve(proposal, messages=marked)
    if size is None:
        size = ctx.counter.count(marked)
    return CompactionProposal.compacted(marked, ctx.tokens_before, size)
