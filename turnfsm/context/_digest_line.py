"""`digest_line`: one line saying what a tool call did, read from its result.

The digests, by tool name (matched in any case), with the arguments that
name what the call worked on (the first one present is used):

- `read_file` (`path`, `file`, `filename`, `file_path`):
  `[read_file] read notes.md (10 chars)`
- `write_file`, `create_file` (as `read_file`):
  `[write_file] wrote notes.md (120 chars)`
- `edit_file` (as `read_file`): `[edit_file] edited notes.md`
- `execute_cmd`, `run_command`, `shell`, `bash` (`cmd`, `command`):
  ``[execute_cmd] ran `cargo build` → exit 0, 47 lines output``
- `list_dir`, `list_files`, `ls` (`path`, `dir`, `directory`):
  `[list_dir] listed src/ (12 entries)`
- `search`, `grep`, `find` (`pattern`, `query`, `regex`):
  `[search] searched 'TODO' (5 matches)`
- `web_fetch`, `fetch_url`, `http_get` (`url`):
  `[web_fetch] fetched https://example.com (5120 chars)`
- any other tool (its first argument, when short):
  `[lookup] (id=42) returned 800 chars, 12 lines`
- a result whose call is not in view: `[tool tc_7] returned 800 chars, 12 lines`

The rules behind the numbers:

- Sizes are in characters (`len`), not bytes. `wrote` counts the call's
  `content` (or `text`) argument when it is a string, else the result.
- Lines are newline-separated, a last line without a newline included (0 for
  an empty result); entries and matches are the lines that are not blank.
  A count of one is singular (`1 char`, `1 line`, `1 entry`, `1 match`).
- The exit code is the last ``exit 2``, ``exit code: 2``, ``exit status 2``,
  ``exited with code 2``, ``returncode=2`` or ``return code 2`` in the result
  (any case). With none, a successful result reads ``exit 0`` and an error
  result ``exit ?``.
- Every other error result ends in ``, error`` (a command's exit code already
  says it).
- A known tool whose key argument is missing or blank gets the generic line,
  whose first argument shows as ``(key=value)`` when that is at most 40
  characters.
- Values are flattened to one line (runs of whitespace and control characters
  become one space) and clipped with ``…``: names and ids to 40 characters;
  paths, commands, patterns and URLs to 80. A digest is therefore one line of
  at most 200 characters.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Final, NamedTuple, TypeAlias, final

from turnfsm.messages import JSONValue, ToolCallPart, ToolResultPart

__all__ = ["_is_digest", "digest_line"]


_MAX_LINE: Final = 200
"""The longest digest, in characters (the bound the clips below guarantee)."""

# Clips, chosen so that the longest head and tail add up to fewer than
# _MAX_LINE characters: a command line is at most 1 + 40 + 7 + 80 + 1 = 129
# characters of head and 8 + 11 + 2 + 20 + 13 = 54 of tail.
_MAX_NAME: Final = 40
_MAX_VALUE: Final = 80
_MAX_ARG: Final = 40

_FLATTEN: Final = re.compile(r"[\s\x00-\x1f\x7f-\x9f]+")
"""Runs of characters that could break or garble a line."""
_NOT_ONE_LINE: Final = re.compile(r"[^\S ]|[\x00-\x1f\x7f-\x9f]")
"""Any such character other than a plain space."""
_EXIT: Final = re.compile(
    r"\b(?:exit(?:ed)?(?:[ _](?:with[ _])?(?:code|status))?|return[ _]?code)"
    r"\s*[:=]?\s*(-?\d{1,10})\b",
    re.IGNORECASE,
)
"""``exit 2``, ``exit code: 2``, ``exit status 2``, ``returncode=2`` …"""

_Digest: TypeAlias = tuple[str, str]
"""A digest as (head, tail): the head depends on the call alone."""


def digest_line(call: ToolCallPart | None, result: ToolResultPart) -> str:
    """Return a one-line digest of `result`, by the tool that produced it.

    Pure string parsing, no model: the module docstring lists the formats.

    Args:
        call: The call `result` answers, or None when it is not in view.
        result: The tool result to digest.

    Returns:
        One line (no line breaks) of at most 200 characters, e.g.
        ``[read_file] read notes.md (10 chars)``.
    """
    head, tail = _digest(call, result)
    return head + tail


def _is_digest(call: ToolCallPart | None, result: ToolResultPart) -> bool:
    """Return whether `result` already reads like its own digest."""
    content = result.content
    return (
        len(content) <= _MAX_LINE
        and _NOT_ONE_LINE.search(content) is None
        and content.startswith(_digest(call, result)[0])
    )


def _digest(call: ToolCallPart | None, result: ToolResultPart) -> _Digest:
    if call is None:
        return f"[tool {_flat(result.call_id, _MAX_NAME)}]", _returned(call, result)
    label = f"[{_flat(call.name, _MAX_NAME)}]"
    family = _FAMILIES.get(call.name.lower())
    target = _key_arg(call.arguments, family.keys) if family else None
    if family is None or target is None:
        return _generic_head(label, call.arguments), _returned(call, result)
    return family.head.format(label=label, target=target), family.tail(call, result)


# -- the families ----------------------------------------------------------

_Tail: TypeAlias = Callable[[ToolCallPart | None, ToolResultPart], str]
"""The part of a digest that depends on the result."""


@final
class _Family(NamedTuple):
    """How the results of a group of tools read."""

    keys: tuple[str, ...]
    """The arguments naming what the call worked on, in order of preference."""
    head: str
    """The head, formatted with `label` and `target` (the key argument)."""
    tail: _Tail


def _sized(_call: ToolCallPart | None, r: ToolResultPart) -> str:
    return f" ({_chars(len(r.content))}){_error(r)}"


def _written(call: ToolCallPart | None, r: ToolResultPart) -> str:
    args = call.arguments if call else {}
    bodies = [v for v in map(args.get, _BODY_KEYS) if isinstance(v, str)]
    size = len(bodies[0]) if bodies else len(r.content)
    return f" ({_chars(size)}){_error(r)}"


def _edited(_call: ToolCallPart | None, r: ToolResultPart) -> str:
    return _error(r)


def _exited(_call: ToolCallPart | None, r: ToolResultPart) -> str:
    codes = _EXIT.findall(r.content)
    code = codes[-1] if codes else ("?" if r.is_error else "0")
    lines = _count(_line_count(r.content), "line", "lines")
    return f" → exit {code}, {lines} output"  # the exit code tells an error


def _entries(_call: ToolCallPart | None, r: ToolResultPart) -> str:
    return f" ({_count(_filled_lines(r.content), 'entry', 'entries')}){_error(r)}"


def _matches(_call: ToolCallPart | None, r: ToolResultPart) -> str:
    return f" ({_count(_filled_lines(r.content), 'match', 'matches')}){_error(r)}"


def _returned(_call: ToolCallPart | None, r: ToolResultPart) -> str:
    size, lines = len(r.content), _line_count(r.content)
    return f" returned {_chars(size)}, {_count(lines, 'line', 'lines')}{_error(r)}"


def _generic_head(label: str, args: Mapping[str, JSONValue]) -> str:
    """Return `label`, with the first argument when it is short."""
    for key, value in args.items():  # the first argument only
        shown = f"{_flat(key, _MAX_ARG)}={_flat(_arg_text(value), _MAX_ARG)}"
        return f"{label} ({shown})" if len(shown) <= _MAX_ARG else label
    return label


_PATH_KEYS: Final = ("path", "file", "filename", "file_path")
_BODY_KEYS: Final = ("content", "text")  # what `wrote` counts, when a string
_FAMILY_TABLE: Final = (
    (("read_file",), _Family(_PATH_KEYS, "{label} read {target}", _sized)),
    (
        ("write_file", "create_file"),
        _Family(_PATH_KEYS, "{label} wrote {target}", _written),
    ),
    (("edit_file",), _Family(_PATH_KEYS, "{label} edited {target}", _edited)),
    (
        ("execute_cmd", "run_command", "shell", "bash"),
        _Family(("cmd", "command"), "{label} ran `{target}`", _exited),
    ),
    (
        ("list_dir", "list_files", "ls"),
        _Family(("path", "dir", "directory"), "{label} listed {target}", _entries),
    ),
    (
        ("search", "grep", "find"),
        _Family(("pattern", "query", "regex"), "{label} searched '{target}'", _matches),
    ),
    (
        ("web_fetch", "fetch_url", "http_get"),
        _Family(("url",), "{label} fetched {target}", _sized),
    ),
)
_FAMILIES: Final[Mapping[str, _Family]] = {
    name: family for names, family in _FAMILY_TABLE for name in names
}
"""Lower-case tool name -> how its results read."""


# -- text helpers ----------------------------------------------------------


def _error(r: ToolResultPart) -> str:
    return ", error" if r.is_error else ""


def _chars(n: int) -> str:
    return _count(n, "char", "chars")


def _count(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def _line_count(text: str) -> int:
    """Return the newline-separated lines of `text`, an unterminated last one too."""
    return text.count("\n") + (not text.endswith("\n")) if text else 0


def _filled_lines(text: str) -> int:
    """Return how many lines of `text` are not blank."""
    return sum(1 for line in text.split("\n") if line.strip())


def _key_arg(args: Mapping[str, JSONValue], keys: Sequence[str]) -> str | None:
    """Return the first non-blank of `keys` in `args`, flattened and clipped."""
    for key in keys:
        value = args.get(key)
        if value is not None:
            text = _flat(_arg_text(value), _MAX_VALUE)
            if text:
                return text
    return None


def _arg_text(value: JSONValue) -> str:
    """Return an argument as text: strings as is, argv lists joined, else JSON."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return " ".join(str(v) for v in value)
    return json.dumps(
        value, ensure_ascii=False, separators=(",", ":"), sort_keys=True, default=str
    )


def _flat(text: str, limit: int) -> str:
    """Return `text` on one line, clipped to `limit` characters with ``…``."""
    flat = _FLATTEN.sub(" ", text).strip()
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"
