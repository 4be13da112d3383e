"""A text file written whole, or not left behind."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable

__all__ = ["write_text"]


def write_text(
    path: str | os.PathLike[str], text: str | Iterable[str], *, errors: str = "strict"
) -> None:
    """Write `text` (a string, or its pieces in order) to `path` as UTF-8.

    A write that fails part-way (a full disk) removes the file it began: a
    file cut short would read as a whole one with its end missing. A device
    or a pipe (``/dev/stdout``) is written as it is, and not removed.

    Raises:
        OSError: `path` could not be written; its `filename` is `path`.
    """
    try:
        with open(path, "w", encoding="utf-8", errors=errors) as out:
            if isinstance(text, str):
                out.write(text)
            else:
                for piece in text:
                    out.write(piece)
    except OSError as exc:
        if os.path.isfile(path):
            with contextlib.suppress(OSError):
                os.remove(path)
        if exc.filename is None:
            raise OSError(exc.errno, exc.strerror, os.fspath(path)) from exc
        raise
