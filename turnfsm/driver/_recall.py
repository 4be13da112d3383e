"""The built-in `recall` tool: the model fetches what a compaction replaced.

Nothing a pass replaces is lost: the session's log keeps every message as
it was first said, under its id, and each replacement names what it covers
(a ``[recall ...]`` note, see `turnfsm.context.mark_replacements`). The
tool, added to an agent's tools with `recall_tool()`, lets the model read
those originals again:

- by what a note names, or by id: ``{"ids": ["h1a2b3c4d5e", "h0f..h9e"]}``
  (a summary's note brings back what that summary stands for; another
  range is every message of the session said from the first to the last,
  in order);
- by text: ``{"query": "invoice total"}``, over the messages that passes
  replaced (dropped, summarised, digested, cut), best matches first.

It answers with plain text, pair-safe (a tool call comes with its result,
a result with its call), within a size limit (what is cut is said), and
only from the session it runs in. It is a tool like any other: its calls
and results are in the log, traced, and a replay re-uses the recorded
results.
"""

from __future__ import annotations

import contextvars
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, Final, final

from turnfsm import _checks
from turnfsm.context import call_handle, handle, replaced_ids
from turnfsm.driver._tools import Tool
from turnfsm.messages import ImagePart, Message, ToolCallPart
from turnfsm.persistence import (
    CompactionRecord,
    EventRecorded,
    Session,
    ToolResultRecorded,
    event_messages,
)

__all__ = [
    "RECALL_MAX_CHARS",
    "Archive",
    "current_session",
    "recall_tool",
    "session_scope",
]

RECALL_MAX_CHARS: Final = 8_000
"""The longest answer the recall tool gives by default, in characters."""

_MAX_LIMIT: Final = 50
_RANGE: Final = re.compile(r"^\s*(\S+?)\s*\.\.\s*(\S+)\s*$")
_WORD: Final = re.compile(r"\w+")
_DATA_HEAD: Final = 64  # an inline (data:) image is named by this much

_SESSION: Final[contextvars.ContextVar[Session | None]] = contextvars.ContextVar(
    "turnfsm_run_session", default=None
)


def current_session() -> Session | None:
    """Return the session of the run whose tool is running (else None).

    Set around every tool call the driver runs, like `current_tool_call`:
    a tool reads the log of the conversation it serves (read only; only
    the driver appends).
    """
    return _SESSION.get()


@contextmanager
def session_scope(session: Session | None) -> Iterator[None]:
    """Make `session` the `current_session()` for the calls run inside."""
    token = _SESSION.set(session)
    try:
        yield
    finally:
        _SESSION.reset(token)


def _render(message: Message, calls: Mapping[str, ToolCallPart]) -> str:
    """One message as the model reads it back: ``[id] role: what it said``."""
    pieces: list[str] = []
    if message.text:
        pieces.append(message.text)
    for part in message.parts:
        if isinstance(part, ImagePart):
            pieces.append(_image(part.url))
    for call in message.tool_calls:
        arguments = json.dumps(call.arguments, sort_keys=True, ensure_ascii=False)
        pieces.append(f"called {call.name}({arguments}) as {call.id}")
    for part in message.tool_results:
        caller = calls.get(part.call_id)
        name = f" of {caller.name}" if caller is not None else ""
        error = " (error)" if part.is_error else ""
        pieces.append(f"result{name} for {part.call_id}{error}: {part.content}")
    return f"[{message.id}] {message.role.value}: " + "\n".join(pieces)


def _image(url: str) -> str:
    """An image as the tool names it: its URL (an inline one by its head)."""
    if url.startswith("data:") and len(url) > _DATA_HEAD:
        head = url.partition(",")[0][:_DATA_HEAD]
        return f"[image {head},... ({len(url)} characters)]"
    return f"[image {url}]"


@final
class Archive:
    """A session's messages as first said, in order, and what passes replaced.

    Read from the log each time the tool runs, so it sees every message
    brought in up to the call (the run's own included).
    """

    __slots__ = ("_calls", "_handles", "_order", "_replaced", "_results", "messages")

    def __init__(self, session: Session) -> None:
        """Read `session`'s log."""
        self.messages: dict[str, Message] = {}
        replaced: dict[str, None] = {}
        for entry in session.entries:
            if isinstance(entry, EventRecorded):
                for message in event_messages(entry.event):
                    self.messages.setdefault(message.id, message)
            elif isinstance(entry, ToolResultRecorded):
                self.messages.setdefault(entry.result.id, entry.result)
            elif isinstance(entry, CompactionRecord) and entry.compacted:
                replaced.update(dict.fromkeys(entry.covers))
        self._order = {mid: i for i, mid in enumerate(self.messages)}
        # What the working history still holds as it was said is not archived.
        current = {m.id: m for m in session.history}
        self._replaced = [
            mid
            for mid in replaced
            if mid in self.messages and current.get(mid) != self.messages[mid]
        ]
        self._calls: dict[str, tuple[str, ToolCallPart]] = {}
        self._results: dict[str, list[str]] = {}
        for mid, message in self.messages.items():
            for call in message.tool_calls:
                self._calls.setdefault(call.id, (mid, call))
            for part in message.tool_results:
                self._results.setdefault(part.call_id, []).append(mid)
        # What the notes call the messages: digests of what they say.
        calls = {cid: call for cid, (_m, call) in self._calls.items()}
        self._handles: dict[str, list[str]] = {}
        for mid, message in self.messages.items():
            named = [handle(message, calls)]
            named += [call_handle(call) for call in message.tool_calls]
            for name in dict.fromkeys(named):
                self._handles.setdefault(name, []).append(mid)

    def resolve(self, ids: Sequence[str]) -> tuple[list[str], list[str]]:
        """Return the message ids `ids` name (ranges spelled out), and the unknown.

        An id may be a message id, a tool call id (its call's message), what
        a ``[recall ...]`` note calls a message (every message it may mean),
        or a range ``first..last`` of those: what the summary whose note
        reads so stands for, or else (in either order) from the earliest
        message the ends may mean to the latest.
        """
        found: list[str] = []
        unknown: list[str] = []
        order = list(self.messages)
        for raw in ids:
            wanted = raw.strip()
            span = _RANGE.match(wanted)
            if span is not None:
                noted = self._noted(*span.groups())
                if noted:
                    found.extend(noted)
                    continue
                ends = [self._known(end) for end in span.groups()]
                missing = [e for e, k in zip(span.groups(), ends, strict=True) if not k]
                if missing:
                    unknown.extend(missing)
                    continue
                places = [self._order[m] for end in ends for m in end]
                found.extend(order[min(places) : max(places) + 1])
                continue
            known = self._known(wanted)
            if known:
                found.extend(known)
            else:
                unknown.append(wanted)
        return list(dict.fromkeys(found)), list(dict.fromkeys(unknown))

    def _noted(self, first: str, last: str) -> list[str]:
        """The messages a summary whose note reads ``first..last`` stands for.

        A note's ends name messages by what they say, and a short reply
        ("Noted.") is said many times: the summary's own list of what it
        covers says which ones it meant, and nothing else comes back.
        Empty when no summary's note reads so (a range written by hand).
        """
        calls = {cid: call for cid, (_m, call) in self._calls.items()}
        found: list[str] = []
        for message in self.messages.values():
            covered = [m for m in replaced_ids(message) if m in self.messages]
            if len(covered) < 2:
                continue
            ends = {
                handle(self.messages[covered[0]], calls),
                handle(self.messages[covered[-1]], calls),
            }
            if ends == {first, last} or (first == last and ends == {first}):
                found.extend(covered)
        return found

    def _known(self, wanted: str) -> list[str]:
        if wanted in self.messages:
            return [wanted]
        call = self._calls.get(wanted)
        if call is not None:
            return [call[0]]
        return self._handles.get(wanted, [])

    def search(self, query: str, limit: int) -> list[str]:
        """Return the archived message ids that best match `query` (≤ `limit`).

        Every word of the query (letters and digits, any case) must occur in
        the message's text, its calls or its results; the most occurrences
        first, then the order they were said.
        """
        words = [w.casefold() for w in _WORD.findall(query)]
        if not words:
            return []
        scored: list[tuple[int, int, str]] = []
        calls = {cid: call for cid, (_m, call) in self._calls.items()}
        for mid in self._replaced:
            text = _render(self.messages[mid], calls).casefold()
            counts = [text.count(w) for w in words]
            if all(counts):
                scored.append((-sum(counts), self._order[mid], mid))
        return [mid for _s, _o, mid in sorted(scored)[:limit]]

    def groups(self, ids: Sequence[str]) -> list[list[str]]:
        """Group `ids` pair-safe: each call with its results, each result with its call.

        Groups are in the order they were said, each in that order too;
        groups that share a message are merged.
        """
        groups: list[set[str]] = []
        for mid in ids:
            group = {mid}
            message = self.messages[mid]
            for call in message.tool_calls:
                group.update(self._results.get(call.id, ()))
            for part in message.tool_results:
                owner = self._calls.get(part.call_id)
                if owner is not None:
                    group.add(owner[0])
                    caller = self.messages[owner[0]]
                    for call in caller.tool_calls:
                        group.update(self._results.get(call.id, ()))
            for other in [g for g in groups if g & group]:
                group |= other
                groups.remove(other)
            groups.append(group)
        ordered = [sorted(g, key=self._order.__getitem__) for g in groups]
        return sorted(ordered, key=lambda g: self._order[g[0]])

    def render(self, mid: str) -> str:
        """Return message `mid` as the tool shows it."""
        calls = {cid: call for cid, (_m, call) in self._calls.items()}
        return _render(self.messages[mid], calls)


def _cut(text: str, keep: int) -> str:
    if len(text) <= keep:
        return text
    return f"{text[: max(keep, 0)]}[... {len(text) - max(keep, 0)} characters cut]"


def _answer(
    archive: Archive,
    groups: list[list[str]],
    unknown: list[str],
    max_chars: int,
    *,
    skipped: Sequence[str] = (),
    limit: int = 0,
) -> str:
    """The tool's text: the groups that fit in `max_chars`, and what was cut.

    `skipped` are the ids asked for past `limit`: named, not looked up.
    """
    notes: list[str] = []
    if unknown:
        notes.append(
            "no message of this conversation has the id "
            + ", ".join(unknown)
            + " (use the ids a [recall ...] note names)"
        )
    if skipped:
        more = f"{len(skipped)} more id{'s' if len(skipped) != 1 else ''}"
        notes.append(
            f"[{more} past the limit of {limit}, not looked up: "
            + ", ".join(skipped)
            + "; ask for them again, or give a higher limit]"
        )
    shown: list[str] = []
    left: list[str] = []
    budget = max_chars - sum(len(n) + 1 for n in notes) - 200
    for group in groups:
        text = "\n".join(archive.render(mid) for mid in group)
        if left or len(text) > budget:
            if not shown and not left:
                # Not even the first group fits: show each message's head.
                share = budget // len(group) - 1
                text = "\n".join(_cut(archive.render(mid), share) for mid in group)
                shown.append(text)
                budget -= len(text) + 1
                continue
            left.extend(group)
            continue
        shown.append(text)
        budget -= len(text) + 1
    count = sum(len(g) for g in groups) - len(left)
    head = f"recalled {count} message{'s' if count != 1 else ''}"
    if not groups:
        head = "recalled nothing"
    lines = [head, *notes, *shown]
    if left:
        lines.append(
            f"[{len(left)} more message{'s' if len(left) != 1 else ''} not shown "
            f"({left[0]}..{left[-1]}): over the {max_chars} character limit; "
            "ask for fewer ids]"
        )
    text = "\n".join(lines)
    if len(text) > max_chars:  # many tiny heads: the limit holds all the same
        keep = max_chars - 80
        text = (
            f"{text[:keep]}\n[... {len(text) - keep} characters cut: over the "
            f"{max_chars} character limit]"
        )
    return text


_check_max_chars = _checks.integer("max_chars", low=500)
_check_name = _checks.string("name", non_empty=True)


def recall_tool(*, max_chars: int = RECALL_MAX_CHARS, name: str = "recall") -> Tool:
    """Return the tool that fetches what compaction replaced; add it to `tools`.

    The model calls it with ``ids`` (what the ``[recall ...]`` notes name, a
    range ``first..last`` as written, message ids or tool call ids) or a ``query``
    (words searched in what passes replaced), and ``limit`` (how many ids,
    each perhaps a range, or matches, 5 by default, at most 50; ids past it
    are named in the answer, not looked up). The answer lists each
    message as ``[id] role: text`` (an image by its URL), a tool call
    always with its result and a result with its call, within `max_chars`
    characters: what does not fit is named, not sent. An unknown id is
    said, not an error. In a durable run's tool activities, which run
    apart from the session, it answers that it has no conversation to read.

    Args:
        max_chars: The longest answer, in characters (≥ 500).
        name: The tool's name, as the model calls it.

    Raises:
        ConfigError: `max_chars` is not an int ≥ 500, or `name` is empty.

    Example:
        ```python
        agent = Agent(model=model, tools=[read_file, recall_tool()])
        ```
    """
    _checks.check(max_chars, "max_chars", _check_max_chars)
    _checks.check(name, "name", _check_name)

    async def recall(
        ids: Sequence[str] | None = None, query: str | None = None, limit: int = 5
    ) -> str:
        session = current_session()
        if session is None:
            raise RuntimeError(
                "recall has no conversation to read: it works inside an agent's "
                "run on its session (not in a durable run's tool activities)"
            )
        if not ids and not query:
            raise ValueError("give ids (or ranges first..last) or a query")
        archive = Archive(session)
        unknown: list[str] = []
        skipped: list[str] = []
        if ids:
            asked = list(ids)
            skipped = asked[limit:]
            found, unknown = archive.resolve(asked[:limit])
        else:
            assert query is not None
            found = archive.search(query, limit)
        groups = archive.groups(found)
        return _answer(
            archive, groups, unknown, max_chars, skipped=skipped, limit=limit
        )

    return Tool(
        name=name,
        description=(
            "Fetch earlier messages of this conversation that were summarised, "
            "shortened or dropped to save room. Pass what a [recall ...] note "
            "names (a range first..last as written), or a query of words to "
            "search them."
        ),
        parameters=_PARAMETERS,
        fn=recall,
    )


_PARAMETERS: Final[Mapping[str, Any]] = {
    "type": "object",
    "properties": {
        "ids": {
            "type": "array",
            "items": {"type": "string", "minLength": 1},
            "minItems": 1,
            "description": "What a [recall ...] note names (or a range "
            "first..last), message ids, or tool call ids.",
        },
        "query": {
            "type": "string",
            "minLength": 1,
            "description": "Words to search the replaced messages for.",
        },
        "limit": {
            "type": "integer",
            "minimum": 1,
            "maximum": _MAX_LIMIT,
            "default": 5,
            "description": "How many ids or matches to return.",
        },
    },
    "additionalProperties": False,
}
