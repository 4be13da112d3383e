"""Probes: what a compacted context should still know, and how it is checked."""

from __future__ import annotations

import difflib
import json
import os
import re
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final, final

import attrs

from turnfsm import _checks
from turnfsm.errors import ConfigError
from turnfsm.messages import Message

__all__ = ["PROBE_KINDS", "Probe", "context_text", "load_probes", "present"]

PROBE_KINDS: Final = ("fact", "artifact", "next_step", "decision")
"""The kinds of probe: a fact to recall, an artifact and its state, the next
step, a decision and its reason."""


def _expect(value: object) -> tuple[str, ...]:
    """A string alone, or any sequence of them, as a tuple."""
    if isinstance(value, str):
        return (value,)
    return _checks.as_tuple(value, "expect", "non-empty strings")


def _filled(value: tuple[object, ...]) -> bool:
    return bool(value) and all(isinstance(v, str) and v.strip() for v in value)


@final
@_checks.keyword_checked
@attrs.frozen(kw_only=True)
class Probe:
    """One thing a context should still hold after compaction.

    Attributes:
        kind: One of `PROBE_KINDS`: ``fact``, ``artifact``, ``next_step``,
            ``decision``.
        question: The question a judge model is asked over the context.
        expect: The strings a context (and a judge's answer) must hold,
            each as a whole word, any case: all of them (``["vendor",
            "Python 3.8"]`` for a decision and its reason).
        session: The session the probe belongs to; "" for every session
            evaluated.
    """

    kind: str = attrs.field(validator=_checks.one_of(PROBE_KINDS))
    question: str = attrs.field(validator=_checks.string(non_empty=True))
    expect: tuple[str, ...] = attrs.field(
        converter=_expect,
        validator=_checks.satisfies(_filled, "one or more non-empty strings"),
    )
    session: str = attrs.field(default="", validator=_checks.string())


_WORD_EDGE: Final = r"[\w-]"


def occurs(key: str, text: str) -> bool:
    """Whether `key` occurs in `text` as a whole word, in any case.

    Whole words: a ticket 7431 is not found in a log's batch 174312.
    """
    pattern = rf"(?<!{_WORD_EDGE}){re.escape(key)}(?!{_WORD_EDGE})"
    return re.search(pattern, text, re.IGNORECASE) is not None


def context_text(messages: Sequence[Message]) -> str:
    """Every string a model reads in `messages`: texts, tool calls, results."""
    out: list[str] = []
    for m in messages:
        out.append(m.text)
        out.extend(f"{c.name} {c.arguments_json()}" for c in m.tool_calls)
        out.extend(r.content for r in m.tool_results)
    return "\n".join(out)


def present(probe: Probe, text: str) -> bool:
    """Whether every string `probe` expects occurs in `text` (see `occurs`)."""
    return all(occurs(key, text) for key in probe.expect)


def load_probes(path: str | Path) -> tuple[Probe, ...]:
    """Read a probe file: TOML (``[[probe]]`` tables) or JSON (``{"probe": [...]}``).

    Each probe has ``kind``, ``question``, ``expect`` (a string or a list of
    them) and, optionally, ``session`` (the session id it belongs to).

    Example:
        ```toml
        [[probe]]
        session = "support-42"
        kind = "decision"
        question = "Which database did we choose, and why?"
        expect = ["PostgreSQL", "logical replication"]
        ```

    Raises:
        ConfigError: the file cannot be read or parsed, or a probe is not
            valid (the field is named: ``probe[2].kind``).
    """
    if not isinstance(path, str | os.PathLike) or not os.fspath(path):
        raise ConfigError("path", path, "the path of a probe file (TOML or JSON)")
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(
            "path", str(path), f"a readable probe file ({_unreadable(exc)})"
        ) from None
    try:
        data: Any = json.loads(text) if file.suffix == ".json" else tomllib.loads(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
        kind = "JSON" if file.suffix == ".json" else "TOML"
        raise ConfigError("path", str(path), f"a {kind} probe file ({exc})") from None
    rows = data.get("probe") if isinstance(data, Mapping) else None
    if not isinstance(rows, list) or not rows:
        raise ConfigError(
            f"{path}: probe",
            rows,
            f"a list of probes ([[probe]] tables in TOML{_misspelt(data)})",
        )
    return tuple(_probe(row, f"{path}: probe[{n}]") for n, row in enumerate(rows))


def _misspelt(data: object) -> str:
    """What a file without ``probe`` has in its place that reads like it, if any."""
    if not isinstance(data, Mapping) or "probe" in data:
        return ""
    keys = [key for key in data if isinstance(key, str)]
    close = difflib.get_close_matches("probe", [k.lower() for k in keys], n=1)
    if not close:
        return ""
    key = next(k for k in keys if k.lower() == close[0])
    return f"; the file has [[{key}]]: did you mean [[probe]]?"


def _probe(row: object, where: str) -> Probe:
    if not isinstance(row, Mapping):
        raise ConfigError(where, row, "a table of kind, question, expect")
    known = {f.name for f in attrs.fields(Probe)}
    for name in row:
        if name not in known:
            raise ConfigError(f"{where}.{name}", row[name], f"one of {sorted(known)}")
    try:
        return Probe(**row)
    except ConfigError as exc:
        raise ConfigError(f"{where}.{exc.field}", exc.value, exc.expected) from None
    except TypeError:
        missing = sorted(known - {"session"} - set(row))
        raise ConfigError(
            f"{where}.{missing[0]}", None, "a value (it is required)", missing=True
        ) from None


def _unreadable(exc: OSError | UnicodeDecodeError) -> str:
    """Why a probe file could not be read, in plain words (no ``[Errno 2]``)."""
    if isinstance(exc, UnicodeDecodeError):
        return "it is not UTF-8 text"
    if isinstance(exc, FileNotFoundError):
        return "it does not exist"
    if isinstance(exc, IsADirectoryError):
        return "it is a directory"
    return (exc.strerror or type(exc).__name__).lower()
