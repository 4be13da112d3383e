"""Compact JSON text at C speed: `json.dumps` without its per-call set-up.

`json.dumps` with options builds a new encoder, and CPython's C encoder
under it, on every call: for the small values turnfsm writes most (a
record's row, a tool call's arguments) that set-up costs more than the
encoding. `compact_encoder` builds the C encoder once per set of options.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Final

__all__ = [
    "compact_encoder",
    "escape_surrogates",
    "plain",
    "strict_loads",
    "well_formed",
]

_SAMPLE = {"b": [1, 2.5, None, True, -0.0], "a": {"é": "\u0000\n"}, "c": float("nan")}


def compact_encoder(*, sort_keys: bool) -> Callable[[object], str]:
    """Return `json.dumps(value, separators=(",", ":"), ensure_ascii=False, ...)`.

    Keys sorted or not as `sort_keys` says; NaN written as JSON's `NaN`.
    The values it is given hold no cycle (they are checked JSON values or
    records), so the cycle check is left out. Elsewhere than CPython, or
    where the C encoder takes other arguments or writes another text, it
    is `JSONEncoder.encode` itself.
    """
    rule = json.JSONEncoder(
        separators=(",", ":"), sort_keys=sort_keys, ensure_ascii=False
    )
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # pragma: no cover - CPython always has it
        return rule.encode
    try:  # the call `JSONEncoder.iterencode` makes, less the cycle check
        iterencode = make(
            None,
            rule.default,
            json.encoder.encode_basestring,
            rule.indent,
            rule.key_separator,
            rule.item_separator,
            rule.sort_keys,
            rule.skipkeys,
            rule.allow_nan,
        )
    except TypeError:  # pragma: no cover - another signature: the slow path
        return rule.encode

    def dumps(value: object) -> str:
        if isinstance(value, dict) and len(value) == 1:
            # One string for one key, the commonest tool call (a path, a
            # query): written here when neither needs escaping, which is
            # what the encoder would write, at half its cost.
            ((key, item),) = value.items()
            if type(key) is str and type(item) is str:
                both = key + item
                if both.isprintable() and '"' not in both and "\\" not in both:
                    return '{"' + key + '":"' + item + '"}'
        elif isinstance(value, str):
            return rule.encode(value)
        return "".join(iterencode(value, 0))

    same = dumps(_SAMPLE) == rule.encode(_SAMPLE)
    return dumps if same else rule.encode


def plain(value: object) -> object:
    """Return a copy of the JSON `value` that its receiver may change.

    Every mapping inside is a new `dict` and every list a new `list`
    (tuples stay tuples, of copies); strings, numbers, booleans and None
    are shared. A message's metadata and a call's arguments do not change
    in place: what a plug-in is handed to work on is this copy.
    """
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(plain(v) for v in value)
    return value


_LONE_SURROGATE: Final = re.compile("[\ud800-\udfff]")


def _escape(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def escape_surrogates(text: str) -> str:
    r"""Return JSON `text` with each lone surrogate written as its backslash-u escape.

    A lone surrogate can only stand inside a JSON string, where its escape
    reads back as the same character: what ``ensure_ascii=True`` writes for
    it, leaving all other text as it is. The text then encodes to UTF-8 (a
    file, a database's text column, a network message).
    """
    if text.isascii() or _LONE_SURROGATE.search(text) is None:
        return text
    return _LONE_SURROGATE.sub(_escape, text)


def well_formed(value: object) -> object:
    """Return the JSON `value` with each lone surrogate in its strings as U+FFFD.

    Text decoded from bytes that were not UTF-8 (a file name `os.listdir`
    read, a tool's output) can hold lone surrogates, which UTF-8 cannot
    encode; a model API is sent U+FFFD in their place, the character a
    UTF-8 decoder puts for a byte it cannot read (three bytes, as the
    surrogate's own). Strings without one are returned as they are;
    mappings and lists are copied (a tuple as a list, as JSON has it).
    """
    if isinstance(value, str):
        if value.isascii() or _LONE_SURROGATE.search(value) is None:
            return value
        return _LONE_SURROGATE.sub("\ufffd", value)
    if isinstance(value, Mapping):
        return {well_formed(k): well_formed(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [well_formed(v) for v in value]
    return value


def strict_loads(text: str) -> object:
    """Read `text` as JSON, which has no ``NaN`` nor ``Infinity``.

    `json.loads` reads them (as Python's floats); no JSON parser of another
    language does, and a model that writes them wrote no JSON.

    Raises:
        ValueError: `text` is not JSON (``NaN`` and ``Infinity`` included).
        RecursionError: it is nested too deep to read.
    """
    return json.loads(text, parse_constant=_no_constant)


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")
