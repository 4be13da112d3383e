"""The store a command works on: ``--store``, else ``TURNFSM_STORE``, else the file.

The command line keeps sessions on disk by default: in ``sessions.db`` in
the user's data directory (`default_store_path`), so that ``turnfsm
sessions`` finds what ``turnfsm demo`` ran.
"""

from __future__ import annotations

import json
import os
import re
import urllib.parse
from pathlib import Path
from typing import Final

import attrs

from turnfsm.errors import ConfigError, StoreDirectoryUnusable, StoreUnusable
from turnfsm.persistence import (
    STORE_ENV,
    MemoryStore,
    SessionStore,
    SQLiteStore,
    compressed,
    default_store_path,
    is_connection_string,
    meant_store,
    names_memory,
    open_store,
)

__all__ = [
    "IN_MEMORY",
    "close_store",
    "is_store_file",
    "not_a_log",
    "open_cli_store",
    "shown",
    "store_option",
    "where",
]

IN_MEMORY: Final = "memory: (lost when the command ends)"
"""Where a memory store keeps its sessions, as `where` says it."""


def open_cli_store(
    spec: str | None, *, existing: bool = False, read_only: bool = False
) -> SessionStore:
    """Return the store `spec` names, or ``TURNFSM_STORE``'s, or the default file.

    A command that works on stored sessions passes `existing`: a store file
    the user named that is not there is refused, not made (a mistyped path
    would leave an empty database behind). One that only reads them passes
    `read_only` too: an SQLite file is opened to read only, so that one in
    a directory or on a disk this user cannot write, or a run in progress
    writes, is read as well, and never changed (the default file, when it
    is not there yet, is made as before: it lists no session).

    Raises:
        ConfigError: the spec names no store (an empty one, an unknown
            scheme), or (with `existing`) a file that does not exist; names
            the setting (``--store`` or ``TURNFSM_STORE``) and the value.
        StoreDirectoryUnusable: the file's directory is missing, or cannot
            be created or written (the setting that chose it is named).
        StoreUnusable: the file cannot be used (it was not changed).
        ImportError: a PostgreSQL URL without the ``postgres`` extra.
    """
    setting = "--store"
    if spec is None:
        spec = os.environ.get(STORE_ENV, "").strip() or None
        setting = STORE_ENV
    if spec is None:
        default = _default_path()
        return SQLiteStore(default, read_only=read_only and default.exists())
    path = _file_of(spec)
    # A directory that cannot hold it is named by the store's own check.
    wanted = existing or read_only
    if wanted and path is not None and path.parent.is_dir() and not path.exists():
        meant = meant_store(spec)
        hint = f"; did you mean {meant}?" if meant is not None else ""
        raise ConfigError(
            setting, spec, f"a store file that exists (none is there{hint})"
        )
    try:
        return open_store(spec, read_only=read_only)
    except (StoreDirectoryUnusable, StoreUnusable) as exc:  # the setting chose it
        raise attrs.evolve(exc, setting=setting) from None
    except ConfigError as exc:  # named as the user gave it
        raise attrs.evolve(exc, field=setting) from None


def _file_of(spec: str) -> Path | None:
    """The file an SQLite `spec` names (a path or ``sqlite:///PATH``), else None.

    A blank `spec` names none, nor do ``KEY=VALUE`` settings (a PostgreSQL
    connection string) or SQLite's names of a database in memory
    (``file:x?mode=memory``): `open_store` refuses them.
    """
    if spec.startswith("sqlite:///"):
        path = spec.removeprefix("sqlite:///")
        return None if names_memory(path) else Path(path)
    if "://" in spec or spec.endswith(":") or not spec.strip():
        return None
    if is_connection_string(spec) or names_memory(spec):
        return None
    return Path(spec)


def _default_path() -> Path:
    """The default file; its directory (the user data directory) made if missing."""
    try:
        return default_store_path()
    except OSError as exc:
        import platformdirs

        directory = platformdirs.user_data_path("turnfsm", appauthor=False)
        raise StoreDirectoryUnusable(
            os.fspath(directory),
            f"it cannot be created ({exc.strerror or exc})",
            "XDG_DATA_HOME (the user data directory), or choose the store "
            f"with {STORE_ENV} or --store",
        ) from None


def shown(spec: str) -> str:
    """`spec` as a command prints it: a PostgreSQL URL's password as ``PASSWORD``.

    The rest is kept as given (its options, such as the schema), so a
    printed command names the same store once the password is put back.
    """
    parts = urllib.parse.urlsplit(spec)
    if parts.scheme not in ("postgresql", "postgres"):
        return spec
    userinfo, at, host = parts.netloc.rpartition("@")
    if at and ":" in userinfo:
        user = userinfo.partition(":")[0]
        parts = parts._replace(netloc=f"{user}:PASSWORD@{host}")
    query = re.sub(r"(^|&)password=[^&]*", r"\1password=PASSWORD", parts.query)
    return urllib.parse.urlunsplit(parts._replace(query=query))


def store_option(store: SessionStore, given: str | None) -> list[str]:
    """The ``--store`` a later command needs to find the sessions of `store`.

    `given` is the command's ``--store`` (as `shown` prints it). Without it
    the store may be your agent's own (``--agent``), which a command given
    no ``--store`` does not open: its file (or its server) is named, unless
    it is the store such a command opens (``TURNFSM_STORE``, else the
    default file). A store in memory, or of your own kind, has no spec to
    give: none.
    """
    if given is not None:
        return ["--store", shown(given)]
    if isinstance(store, SQLiteStore):
        default = _default_file()
        if default is not None and store.path.absolute() == default.absolute():
            return []
        return ["--store", os.fspath(store.path)]
    server = getattr(store, "server", None)  # PostgresStore: no password
    if isinstance(server, str) and not isinstance(store, MemoryStore):
        return ["--store", server]
    return []


def _default_file() -> Path | None:
    """The file a command given no ``--store`` opens (None: not a file, or none)."""
    spec = os.environ.get(STORE_ENV, "").strip() or None
    if spec is not None:
        return _file_of(spec)
    try:
        return default_store_path()
    except OSError:
        return None


def where(store: SessionStore) -> str:
    """Return where `store` keeps its sessions, for a person to read."""
    if isinstance(store, SQLiteStore):
        return os.fspath(store.path)
    if isinstance(store, MemoryStore):
        return IN_MEMORY
    server = getattr(store, "server", None)  # PostgresStore: no password
    return str(server) if server is not None else type(store).__name__


async def close_store(store: SessionStore) -> None:
    """Close `store`: its ``aclose()``, else a store of one's own's ``close()``."""
    close = getattr(store, "aclose", None) or getattr(store, "close", None)
    if close is not None:
        await close()


_SQLITE_MAGIC: Final = b"SQLite format 3\x00"
"""How every SQLite database file begins (the file format's header string)."""


def is_store_file(data: bytes | str) -> bool:
    """Whether `data`, a file given as a session log, is an SQLite store's file."""
    return isinstance(data, bytes) and data.startswith(_SQLITE_MAGIC)


def not_a_log(data: bytes | str) -> str | None:
    """Why `data`, a file given as a session log, plainly is none (None: it may be).

    A session log is JSON (lines, or one document) that begins with ``{``;
    text that begins otherwise (a script, a CSV file) is no log, not a log
    changed since, and nor is a compressed file. Other bytes that are not
    UTF-8 are left to the log's reader, which names the byte.
    """
    if isinstance(data, bytes) and (said := compressed(data)) is not None:
        return f"it is {said}"
    try:
        text = data.decode() if isinstance(data, bytes) else data
    except UnicodeDecodeError:
        return None
    begins = text.removeprefix("\ufeff").lstrip()
    if not begins or begins.startswith("{"):
        return None
    line = begins.splitlines()[0]
    shown = line if len(line) <= 40 else f"{line[:40]}..."
    return f"its first line is not JSON: {shown!r}"


def unchecked_log_note(data: bytes | str, name: str) -> str | None:
    """What to say of a log, read already, whose lines could not be checked whole.

    A log written by an older turnfsm (no ``log_version`` in its header)
    carries no positions on its lines, and perhaps no digests: a line
    deleted, repeated or changed in it is found only where the session's
    own checks and the replay look. None for a log of this turnfsm.
    """
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    text = text.removeprefix("\ufeff").strip()
    try:
        header = json.loads(text.split("\n", 1)[0])
    except ValueError:
        header = None
    if not isinstance(header, dict):  # one JSON document on many lines
        try:
            header = json.loads(text)
        except ValueError:
            return None
    if not isinstance(header, dict) or header.get("log_version", 1) != 1:
        return None
    return (
        f"{name} was written by an older turnfsm: its lines carry no positions, "
        "so a line deleted, repeated or cut from its end cannot be told (an "
        "export by this turnfsm can be checked whole)"
    )
