"""How the command line words an error: one line, in plain words.

Every command prints its errors as ``turnfsm COMMAND: MESSAGE`` on stderr.
`explain` makes the MESSAGE: a file system error names the path and what
is wrong with it (not ``[Errno 2] ...``); any other error is its own
message. `check_writable` refuses an output file that cannot be written
before a command does its work.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import signal
import sys
import unicodedata
from typing import TYPE_CHECKING, Final, TextIO

if TYPE_CHECKING:
    from turnfsm.errors import ConfigError

# No turnfsm import at the top: the program imports this module before its
# Ctrl-C handling starts (see `turnfsm.cli.script`).

__all__ = [
    "INTERRUPTED_STATUS",
    "as_option",
    "check_writable",
    "count_option",
    "explain",
    "fail",
    "stdout_to_devnull",
    "stdout_unless_closed",
    "stop_signals",
    "terminal_text",
    "write_utf8",
]

INTERRUPTED_STATUS = 130
"""The exit status of a command Ctrl-C stopped (128 + SIGINT, as shells use)."""


_STOPPING: Final = tuple(
    getattr(signal, name)
    for name in ("SIGINT", "SIGTERM", "SIGHUP")
    if hasattr(signal, name)
)
"""The signals that interrupt a run (Windows has no SIGHUP)."""


def stop_signals() -> list[signal.Signals]:
    """Ctrl-C, SIGTERM and SIGHUP; SIGHUP not when the program was told to ignore it.

    ``nohup turnfsm run ...`` outlives its terminal. Ctrl-C and SIGTERM are
    taken even when ignored: a shell starts a script's background job with
    Ctrl-C ignored, and a ``kill -INT`` sent to it on purpose would do
    nothing.
    """
    return [
        s
        for s in _STOPPING
        if s.name != "SIGHUP" or signal.getsignal(s) is not signal.SIG_IGN
    ]


_PLAIN = {
    errno.EISDIR: "is a directory, not a file",
    errno.ENOTDIR: "is not a directory (or a part of its path is a file)",
    errno.EEXIST: "already exists",
    errno.EACCES: "cannot be opened: permission denied",
    errno.EPERM: "cannot be opened: operation not permitted",
    errno.EROFS: "cannot be written: the file system is read-only",
    errno.ENOSPC: "cannot be written: no space left on the device",
    errno.ENAMETOOLONG: "is too long a file name",
}


def explain(exc: BaseException) -> str:
    """`exc`'s message on one line; a file system error in plain words."""
    if isinstance(exc, OSError) and exc.filename is not None:
        return _os_error(exc)
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror[0].lower() + exc.strerror[1:]
    return str(exc) or type(exc).__name__


def _os_error(exc: OSError) -> str:
    path = os.fsdecode(exc.filename)
    if exc.errno == errno.ENOENT:
        parent = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(parent):
            return f"{path}: the directory {parent} does not exist"
        # Words added to the system's own ("..., nor a shipped machine of
        # that name (...; did you mean 'turn'?)") are kept.
        said = exc.strerror or ""
        standard = os.strerror(errno.ENOENT)
        more = said.removeprefix(standard) if said.startswith(standard) else ""
        return f"{path} does not exist{more}"
    plain = _PLAIN.get(exc.errno or 0)
    if plain is not None:
        return f"{path} {plain}"
    reason = (exc.strerror or type(exc).__name__).lower()
    return f"{path}: {reason}"


def fail(command: str, exc: BaseException, status: int = 2) -> int:
    """Print ``turnfsm COMMAND: MESSAGE`` for `exc` on stderr; return `status`."""
    print(f"turnfsm {command}: {explain(exc)}", file=sys.stderr)
    return status


def _holds_a_database(path: str) -> bool:
    from turnfsm.cli._stores import is_store_file

    try:
        with open(path, "rb") as file:
            return is_store_file(file.read(16))
    except OSError:  # not readable: nothing known of it
        return False


def check_writable(option: str, path: str) -> None:
    """Refuse `path` for `option` unless a file can be written there.

    Nothing is created: the path must not be a directory, its directory must
    exist and be writable, and an existing file must be writable and no
    SQLite database (a session store written over loses its sessions).

    Raises:
        ConfigError: naming `option`, `path` and what is wrong.
    """
    from turnfsm.errors import ConfigError

    if path == "-":
        return
    if os.path.isdir(path):
        raise ConfigError(option, path, "a file to write (it is a directory)")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        why = "is not a directory" if os.path.exists(parent) else "does not exist"
        raise ConfigError(
            option, path, f"a file in an existing directory ({parent} {why})"
        )
    if os.path.exists(path):
        if not os.access(path, os.W_OK):
            raise ConfigError(option, path, "a file you may write (permission denied)")
        if _holds_a_database(path):
            raise ConfigError(
                option,
                path,
                "a file that is no SQLite database (it holds one, a session "
                "store's, say: writing over it would lose what it holds)",
            )
    elif not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(
            option, path, f"a file in a directory you may write ({parent} is not)"
        )


def as_option(exc: ConfigError, option: str) -> ConfigError:
    """`exc`, a library setting's refusal, as the command line option that gave it.

    The option is named in the setting's place, and a None the setting
    takes (``an int ..., or None (the model's)``) is not offered: an
    option left out is that None, and there is none to type.
    """
    import re

    import attrs

    expected = re.sub(r",? or None(?: \([^)]*\))?$", "", exc.expected)
    return attrs.evolve(exc, field=option, expected=expected)


def count_option(
    option: str, given: str | None, default: int, *, low: int, what: str
) -> int | None:
    """The number `option` gives (None: ``all``; not given: `default`).

    Raises:
        ConfigError: it is neither ``all`` nor a whole number from `low` up.
    """
    from turnfsm.errors import ConfigError

    if given is None:
        return default
    if given == "all":
        return None
    expected = f"a whole number of {what} from {low} up, or all"
    try:
        value = int(given)
    except ValueError:
        raise ConfigError(option, given, expected) from None
    if value < low:
        raise ConfigError(option, given, expected)
    return value


_BIDI: Final = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e") | {
    chr(c) for c in range(0x2066, 0x206A)
}
"""The characters that reorder the text around them (right-to-left and the like)."""


def terminal_text(text: str) -> str:
    r"""`text` with its control characters written as escapes (``\x1b``).

    A log holds what a model, a tool or a user wrote: a terminal escape in
    it would clear the screen, set the title or hide what follows, and a
    right-to-left override would show the text in another order.
    """
    if text.isprintable():
        return text
    return "".join(
        c.encode("unicode_escape").decode("ascii")
        if unicodedata.category(c) == "Cc" or c in _BIDI
        else c
        for c in text
    )


def stdout_to_devnull() -> None:
    """Point stdout at /dev/null, so the final flush at exit fails no more.

    For a standard output that failed (``| head`` gone, a full disk): the
    text still in its buffer would fail again at exit, with a traceback.
    """
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


def write_utf8(out: TextIO, text: str, *, errors: str = "strict") -> None:
    """Write `text` (a log, a report) to `out` as UTF-8, whatever its encoding.

    A session log is UTF-8: on a standard output that encodes otherwise (a
    Windows console's code page, ``PYTHONIOENCODING=ascii``) it would fail
    on the first character that encoding lacks, or write a file that is
    not a log. Its bytes go under the text layer, when it has one, until
    the last: an unbuffered one (``PYTHONUNBUFFERED``) takes what a pipe
    holds and says how much, and a reader gone (``| head``) then raises
    `BrokenPipeError` on the next write instead of the rest being dropped.
    `errors` is how a lone surrogate is encoded (``backslashreplace``: as
    its escape).
    """
    buffer = getattr(out, "buffer", None)
    if buffer is None:  # a stream of text only (a StringIO): it holds any text
        out.write(text)
        return
    out.flush()
    data = memoryview(text.encode("utf-8", errors))
    while data:
        data = data[buffer.write(data) :]
    buffer.flush()


class _ClosedOutput(io.TextIOBase):
    """Standard output when the program started with it closed (``>&-``).

    Python leaves `sys.stdout` None then, and `print` writes nothing: a
    command would end well with its output lost. Each write fails instead,
    as it does on a full disk (``> /dev/full``), and is reported so.
    """

    def write(self, text: str) -> int:
        """Fail: there is nowhere to write `text`."""
        raise OSError(errno.EBADF, "standard output is closed")


def stdout_unless_closed() -> None:
    """Give a closed standard output (`sys.stdout` None) a `_ClosedOutput`."""
    if sys.stdout is None:
        sys.stdout = _ClosedOutput()
