"""`open_store`: a `SessionStore` from what a user writes (a path, a URL).

The forms, one per store: a store object (used as it is), ``memory:``, a
file path or ``sqlite:///path`` (`SQLiteStore`), and a ``postgresql://``
URL (`PostgresStore`, from the ``postgres`` extra). The ``TURNFSM_STORE``
environment variable holds one of them.
"""

from __future__ import annotations

import os
import re
import urllib.parse
from pathlib import Path
from typing import Final

import attrs

from turnfsm.errors import ConfigError, StoreDirectoryUnusable, StoreUnusable
from turnfsm.persistence._store import MemoryStore, SessionStore, check_store

__all__ = [
    "STORE_ENV",
    "default_store_path",
    "env_store",
    "names_memory",
    "open_store",
]

STORE_ENV: Final = "TURNFSM_STORE"
"""The environment variable naming the store to use when none is given."""

_TEXT: Final = "'memory:', a file path, 'sqlite:///PATH' or a postgresql:// URL"
"""The stores a text names (an environment variable, a command line option)."""

_EXPECTED: Final = f"a SessionStore, {_TEXT}"

_MEMORY: Final = "'memory:', a store in this process's memory"

# A libpq connection string ("host=... user=... password=..."): its first
# word is one of libpq's keywords and an equals sign.
_CONNINFO: Final = re.compile(
    r"\s*(host|hostaddr|port|dbname|user|password|passfile|service|sslmode"
    r"|options|connect_timeout|application_name)\s*=",
    re.IGNORECASE,
)


def is_connection_string(spec: str) -> bool:
    """Whether `spec` reads as a libpq connection string (``host=... dbname=...``).

    Such text names no file, and may hold a password: it is never shown.
    """
    return _CONNINFO.match(spec) is not None


def names_memory(name: str) -> bool:
    """Whether SQLite reads `name` as a database kept in memory, not a file.

    That is ``:memory:``, and a ``file:`` URI whose path is ``:memory:``
    (``file::memory:``) or that asks for ``mode=memory``
    (``file:x?mode=memory``). An `SQLiteStore` opens every other name, a
    ``file:`` one too, as the file it names.
    """
    if name == ":memory:":
        return True
    if not name.startswith("file:"):  # SQLite's test: "file:" in lower case
        return False
    path, _, query = name.removeprefix("file:").partition("#")[0].partition("?")
    if path.startswith("//"):  # an authority before the path: file://localhost/x
        path = "/" + path[2:].partition("/")[2]
    asked = urllib.parse.parse_qsl(query, keep_blank_values=True)
    return urllib.parse.unquote(path) == ":memory:" or ("mode", "memory") in asked


def open_store(
    spec: SessionStore | str | os.PathLike[str], *, read_only: bool = False
) -> SessionStore:
    """Return the store `spec` names.

    Args:
        spec: A `SessionStore` (returned as it is); ``"memory:"`` (a new
            `MemoryStore`); a file path or ``"sqlite:///PATH"`` (an
            `SQLiteStore` on that file, created if missing; four slashes
            for an absolute path, as in SQLAlchemy); or a ``postgresql://``
            or ``postgres://`` URL (a `PostgresStore`).
        read_only: An SQLite file is only read (``SQLiteStore(path,
            read_only=True)``): it must exist and is never changed, and a
            file or directory that cannot be written is read all the same.
            The other stores are opened as they are.

    Raises:
        ConfigError: `spec` is none of these; ``memory``, and the names
            SQLite reads as a database in memory (``:memory:``,
            ``file::memory:``, ``sqlite:///:memory:``), are refused saying
            ``memory:``,
            ``postgres:/db`` saying ``postgresql://db``, and a PostgreSQL
            connection string (``host=... dbname=...``) asking for the URL
            (its text, which may hold a password, is not shown).
        ImportError: a PostgreSQL URL without the ``turnfsm[postgres]`` extra.
        StoreUnusable: the file cannot be used as a store (not SQLite,
            another application's, a newer schema); it was not changed.
    """
    if isinstance(spec, SessionStore):
        return check_store(spec)
    if isinstance(spec, os.PathLike):
        return _sqlite(os.fspath(spec), read_only)
    if not isinstance(spec, str):
        raise ConfigError("store", spec, _EXPECTED)
    if not spec.strip():  # text, so one of the texts
        raise ConfigError("store", spec, _TEXT)
    if spec == "memory:":
        return MemoryStore()
    if spec.startswith(("postgresql://", "postgres://")):
        return _postgres(spec)
    if spec.startswith("sqlite:///"):
        path = spec.removeprefix("sqlite:///")
        if names_memory(path):
            raise ConfigError("store", spec, f"{_TEXT} (did you mean {_MEMORY}?)")
        meant = _absolute_meant(path)
        if meant is not None:
            raise ConfigError(
                "store",
                spec,
                f"{_TEXT} (did you mean {meant}? three slashes take a path from "
                "the working directory, four an absolute one)",
            )
        return _sqlite(path, read_only)
    if is_connection_string(spec):  # would name a file, password and all
        raise ConfigError(
            "store",
            "<a PostgreSQL connection string, not shown>",
            f"{_TEXT} (write it as postgresql://USER:PASSWORD@HOST:PORT/DATABASE)",
        )
    meant = meant_store(spec)
    if meant is not None:
        raise ConfigError("store", spec, f"{_TEXT} (did you mean {meant}?)")
    if "://" in spec or spec.endswith(":") or spec.startswith("sqlite:"):
        raise ConfigError("store", spec, _TEXT)
    return _sqlite(spec, read_only)


def meant_store(spec: str) -> str | None:
    """The store form `spec` looks like a slip of, if any (said as a hint).

    ``memory`` would be a file named so (a file path is a store's name),
    SQLite's names of a database in memory (``:memory:``) are refused by
    `SQLiteStore`, and ``postgres:/db`` would be a directory ``postgres:``.
    """
    if spec.strip().strip(":").lower() == "memory" or names_memory(spec):
        return _MEMORY
    scheme, colon, rest = spec.partition(":")
    if colon and scheme.lower() in ("postgres", "postgresql"):
        url = rest.lstrip("/")
        return f"postgresql://{url}" if url else "a postgresql://HOST/DATABASE URL"
    if colon and scheme.lower() == "sqlite" and rest.strip("/"):
        # sqlite://s.db (two slashes, as in a web URL) and sqlite:s.db name a
        # file from the working directory; sqlite:/var/s.db an absolute one.
        path = rest[2:] if rest.startswith("//") else rest
        return f"sqlite:///{path}"
    return None


def _absolute_meant(path: str) -> str | None:
    """The four-slash URL of `path` (from ``sqlite:///PATH``), if that was meant.

    Three slashes take a path from the working directory; one whose
    directory is missing there but exists from the root (``sqlite:///tmp/s.db``)
    meant the absolute path.
    """
    directory = os.path.dirname(path)
    if not directory or os.path.isabs(path) or os.path.isdir(directory):
        return None
    if not os.path.isdir(os.sep + directory):
        return None
    return f"sqlite:////{path}"


def env_store() -> SessionStore | None:
    """Return the store ``TURNFSM_STORE`` names, or None when it is unset or empty.

    Raises:
        ConfigError: as `open_store` (the variable is named).
        StoreDirectoryUnusable: as `open_store` (the variable is named).
        StoreUnusable: as `open_store` (the variable is named).
    """
    value = os.environ.get(STORE_ENV, "").strip()
    if not value:
        return None
    try:
        return open_store(value)
    except ConfigError as exc:
        # The value as the refusal shows it (a connection string: not at all).
        raise ConfigError(STORE_ENV, exc.value, exc.expected) from None
    except (StoreDirectoryUnusable, StoreUnusable) as exc:  # what chose it
        raise attrs.evolve(exc, setting=STORE_ENV) from None


def default_store_path() -> Path:
    """Return the CLI's default store file, creating its directory.

    It is ``sessions.db`` in turnfsm's user data directory (platformdirs:
    ``$XDG_DATA_HOME/turnfsm``, by default ``~/.local/share/turnfsm``, on
    Linux).
    """
    import platformdirs

    directory = platformdirs.user_data_path("turnfsm", appauthor=False)
    directory.mkdir(parents=True, exist_ok=True)
    return directory / "sessions.db"


def _sqlite(path: str, read_only: bool = False) -> SessionStore:
    if not path:
        raise ConfigError("store", "sqlite:///", "sqlite:///PATH (a file path)")
    from turnfsm.persistence.sqlite import SQLiteStore

    return SQLiteStore(path, read_only=read_only)


def _postgres(url: str) -> SessionStore:
    try:
        from turnfsm.persistence.postgres import PostgresStore
    except ImportError as exc:
        said = str(exc)  # the module's own words name the extra, when they came
        if "turnfsm[postgres]" not in said:
            said = (
                f"a PostgreSQL store needs psycopg: install turnfsm[postgres] ({said})"
            )
        raise ImportError(said) from exc
    store: SessionStore = PostgresStore(url)
    return store
