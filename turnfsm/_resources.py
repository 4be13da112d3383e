"""Finding and loading machine files (the file I/O the pure core leaves out)."""

from __future__ import annotations

import difflib
import errno
import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Final, NoReturn

from turnfsm.core import MachineSpec
from turnfsm.errors import ConfigError, DefinitionError, Problem

__all__ = [
    "approval_machine",
    "compaction_machine",
    "default_machine",
    "load_machine",
    "machines_dir",
    "review_machine",
]


def machines_dir() -> Path:
    """Return the directory holding the shipped machine files.

    ``turn.toml`` (the stock machine), ``approval.toml``, ``review.toml`` and
    ``compaction.toml``: copy one to start a machine of your own.

    In an installed wheel they sit in ``turnfsm/_machines``; in a source
    checkout, in ``machines/`` at the repository root (one copy, no duplicate).
    """
    here = Path(__file__).resolve().parent
    packaged = here / "_machines"
    if packaged.is_dir():
        return packaged
    return here.parent / "machines"


def load_machine(path: str | Path) -> MachineSpec:
    """Load and validate the machine file at `path`, and its sub-agents' files.

    `path` may also be a shipped machine's name (``approval``, or
    ``approval.toml``) when no file of that name is here: the shipped file
    (see `machines_dir`) is loaded. A sub-agent's ``machine`` is a path
    relative to the file that declares it, or the name of a shipped machine
    file (``turn.toml``); each is loaded and checked in turn
    (`MachineSpec.children`), and a file that runs its own caller is
    refused.

    Raises:
        DefinitionError: the file is invalid (every problem listed, each
            with its line), also when it is not UTF-8 text, or when one of
            its sub-agents' files is.
        OSError: the file cannot be read.
        ConfigError: `path` is not a str or an `os.PathLike` of one.
    """
    text = os.fspath(path) if isinstance(path, str | os.PathLike) else None
    if not isinstance(text, str):
        raise ConfigError("path", path, "a machine file's path (a str or a Path)")
    return _Loading().load(_here_or_shipped(Path(text)), ())


def _here_or_shipped(p: Path) -> Path:
    """`p`, or the shipped machine file a bare name names when no file here does."""
    if p.name != str(p) or os.path.lexists(p):
        return p  # a path with a directory, or a file (or anything) here
    for name in (p.name, f"{p.name}.toml"):
        shipped = _shipped(name)
        if shipped is not None:
            return shipped
    names = shipped_names()
    close = difflib.get_close_matches(p.name.removesuffix(".toml"), names, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise FileNotFoundError(
        errno.ENOENT,
        "No such file or directory, nor a shipped machine of that name "
        f"({', '.join(names)}{hint})",
        str(p),
    )


def shipped_names() -> list[str]:
    """The names of the shipped machines (``approval``, ..., ``turn``), sorted."""
    return sorted(path.stem for path in machines_dir().glob("*.toml"))


def _shipped(name: str) -> Path | None:
    """The shipped machine file `name` (``turn.toml``), if there is one."""
    shipped = machines_dir() / name
    return shipped if shipped.is_file() else None


_MAX_NESTING: Final = 32
"""How many machine files deep sub-agents may be declared (each within its own
`max_depth` too): past it, a chain of files is refused before it is read."""


class _Loading:
    """One `load_machine`: each file read once, however many files name it."""

    def __init__(self) -> None:
        self.done: dict[Path, tuple[MachineSpec, frozenset[Path]]] = {}
        """A file loaded -> its spec and every file below it."""

    def load(self, p: Path, callers: tuple[Path, ...]) -> MachineSpec:
        """Load `p`, run as a sub-agent by the files `callers` (outermost first)."""
        here = _resolved(p)
        return self._read(p, here, callers)

    def _child(self, parent: Path, name: str, chain: tuple[Path, ...]) -> MachineSpec:
        """The machine file `name` a file in `parent` declares a sub-agent on."""
        if "\x00" in name:
            raise OSError(errno.EINVAL, "a file name cannot hold a NUL character")
        target = parent / name
        if not target.exists() and (shipped := _shipped(name)) is not None:
            target = shipped
        here = _resolved(target)
        if here in chain:
            names = [c.name for c in chain[chain.index(here) :]]
            _refuse(
                target,
                "a machine cannot run its own caller as a sub-agent"
                f" ({' > '.join([*names, target.name])}): nothing would bound"
                " the recursion",
            )
        if len(chain) >= _MAX_NESTING:
            _refuse(
                target,
                f"sub-agents are declared more than {_MAX_NESTING} machine files deep",
            )
        known = self.done.get(here)
        if known is not None:
            spec, below = known
            looped = below & set(chain)
            if looped:  # it runs a file above it, which runs it
                _refuse(
                    target,
                    "a machine cannot run its own caller as a sub-agent"
                    f" ({target.name} > ... > {min(looped).name}): nothing would"
                    " bound the recursion",
                )
            return spec
        if target.exists() and not target.is_file():  # a directory, a pipe
            raise OSError(errno.EINVAL, "not a regular file", str(target))
        return self._read(target, here, chain)

    def _read(self, p: Path, here: Path, callers: tuple[Path, ...]) -> MachineSpec:
        chain = (*callers, here)
        spec = _parse(p, lambda name: self._child(p.parent, name, chain))
        below = frozenset(
            f for child in spec.children.values() for f in self._files(child)
        )
        self.done[here] = (spec, below)
        return spec

    def _files(self, spec: MachineSpec) -> frozenset[Path]:
        """The files `spec` and those below it came from (as loaded here)."""
        for path, (known, below) in self.done.items():
            if known is spec:
                return below | {path}
        return frozenset()


def _resolved(p: Path) -> Path:
    """`p`'s real path; a loop of links is the OSError reading it would give."""
    try:
        return p.resolve()
    except RuntimeError:  # Python < 3.13 raises it for a loop of links
        raise OSError(errno.ELOOP, f"too many levels of symbolic links: {p}") from None


def _refuse(target: Path, message: str) -> NoReturn:
    raise DefinitionError(str(target), (Problem(message=message),))


def _parse(p: Path, resolve: Callable[[str], MachineSpec]) -> MachineSpec:
    """Read and check the machine file `p`; `resolve` loads its sub-agents'."""
    data = p.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        problem = Problem(
            message=f"not UTF-8 text: byte {data[exc.start]:#04x} cannot be read"
            " (a machine file is TOML, which is UTF-8)",
            line=data.count(b"\n", 0, exc.start) + 1,
        )
        raise DefinitionError(str(p), (problem,)) from None
    # Line ends as `Path.read_text` reads them (universal newlines), and
    # without the byte-order mark some editors begin a UTF-8 file with.
    text = text.removeprefix("\ufeff").replace("\r\n", "\n").replace("\r", "\n")
    return MachineSpec.from_toml(text, source=str(p), resolve=resolve)


@functools.cache
def default_machine() -> MachineSpec:
    """Return the stock Turn FSM, ``turn.toml`` (loaded once)."""
    return load_machine(machines_dir() / "turn.toml")


@functools.cache
def approval_machine() -> MachineSpec:
    """Return the Turn FSM with a review before tools, ``approval.toml`` (loaded once).

    A reply with tool calls emits `Pause` in ``await_approval``; feed
    `ToolCallsReviewed` (or `run_cancelled`) to go on.
    """
    return load_machine(machines_dir() / "approval.toml")


@functools.cache
def review_machine() -> MachineSpec:
    """Return the Turn FSM with a review of the final answer, ``review.toml``.

    A reply without tool calls enters ``await_review``, a phase whose effect
    is named ``review`` (give it in `effects=`). It answers with a `Signal`:
    ``approved`` ends the run; ``revise`` with ``data={"feedback": TEXT}``
    adds TEXT to the conversation as a user message and calls the model
    again. Loaded once.
    """
    return load_machine(machines_dir() / "review.toml")


@functools.cache
def compaction_machine() -> MachineSpec:
    """Return the machine of a manual compaction, ``compaction.toml`` (loaded once).

    One pass over a stored session's history, outside any run of the agent
    (`Agent.compact`, ``turnfsm sessions compact``).
    """
    return load_machine(machines_dir() / "compaction.toml")
