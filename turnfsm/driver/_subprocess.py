"""Run a plain function tool in a child process that is killed on a timeout.

A thread cannot be stopped: a timed-out function tool that runs in a worker
thread finishes in the background, side effects and all. A tool built with
``in_subprocess=True`` runs in a fresh Python process instead (the runner is
`turnfsm.driver._child`), in a session of its own; when the call is
cancelled (its timeout, `RunControl.cancel()`, a cancelled task group) the
whole process group gets SIGKILL and the child is reaped before the
cancellation goes on. Programs the tool started are in that group and die
with it; only a program that made itself a session of its own escapes.

The function is found in the child by its module and qualified name, so it
must be defined at the top level of a module (a ``__main__`` script is
loaded as ``__mp_main__``, as by multiprocessing). Its keyword arguments go
to the child by pickle; the result comes back as text (a string as it is,
anything else as JSON).

Why not `anyio.to_process.run_sync(..., cancellable=True)`: it does SIGKILL
and reap its worker on a cancel, but its workers are pooled and reused (one
call's state leaks into the next), share the parent's process group (a
program the tool started outlives the kill) and send the tool's output and
tracebacks to /dev/null.
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

import anyio
import anyio.abc

__all__ = ["ToolRaised", "call_in_subprocess", "check_isolatable", "loading_main"]

CHILD: Final = str(Path(__file__).with_name("_child.py"))
"""The runner script the child process executes."""


class ToolRaised(Exception):
    """Raised when the tool raised in its child process (re-raised here by name)."""

    def __init__(self, type_name: str, message: str) -> None:
        super().__init__(type_name, message)
        self.type_name = type_name
        self.message = message

    def __str__(self) -> str:
        return f"{self.type_name}: {self.message}" if self.message else self.type_name


def loading_main() -> str | None:
    """The script an ``in_subprocess`` tool's process is loading, else None.

    The child loads the parent's ``__main__`` to find a tool defined there;
    a run started meanwhile is the script's own, started at its top level
    instead of under ``if __name__ == "__main__":``, and would call the
    model and write the store again, once per tool call.
    """
    main = sys.modules.get("__main__")
    # Read from the namespace: a missed getattr on a module costs microseconds
    # (an AttributeError made and dropped), on every run's start.
    loading = getattr(main, "__dict__", {}).get("LOADING_MAIN")
    if not isinstance(loading, str):
        return None
    ran = getattr(main, "__file__", None)
    return loading if ran and os.path.realpath(ran) == os.path.realpath(CHILD) else None


def check_isolatable(fn: Callable[..., Any]) -> str | None:
    """Return why `fn` cannot run in a child process, or None if it can."""
    qualname = getattr(fn, "__qualname__", "")
    if not callable(fn) or not hasattr(fn, "__module__") or not qualname:
        return "in_subprocess needs a plain function"
    if "<" in qualname:  # <lambda>, <locals>
        return (
            f"in_subprocess needs a function defined at the top level of a module, "
            f"not {qualname}"
        )
    return None


def _main_source() -> list[str] | None:
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name:
        return ["module", spec.name.removesuffix(".__main__")]
    path = getattr(main, "__file__", None)
    return ["path", str(path)] if path else None


def _request(fn: Callable[..., Any], kwargs: Mapping[str, Any]) -> bytes:
    args = pickle.dumps(dict(kwargs), protocol=pickle.HIGHEST_PROTOCOL)
    needs_main = fn.__module__ == "__main__" or b"__main__" in args
    return pickle.dumps(
        {
            "path": list(sys.path),
            "main": _main_source() if needs_main else None,
            "module": fn.__module__,
            "qualname": fn.__qualname__,
            "kwargs": args,
        },
        protocol=pickle.HIGHEST_PROTOCOL,
    )


def _kill(process: anyio.abc.Process) -> None:
    """SIGKILL the child's process group (the child leads it: own session)."""
    if process.returncode is not None:
        return  # reaped already: its group id may belong to someone else now
    try:
        if hasattr(os, "killpg"):
            os.killpg(process.pid, signal.SIGKILL)
        else:  # pragma: no cover - no process groups (Windows)
            process.kill()
    except ProcessLookupError:  # pragma: no cover - it died just now
        pass


async def call_in_subprocess(fn: Callable[..., Any], kwargs: Mapping[str, Any]) -> str:
    """Call ``fn(**kwargs)`` in a fresh child process and return its text result.

    Raises:
        ToolRaised: the function raised (the child reports its type and message).
        RuntimeError: the child ended without an answer (killed, crashed).
        pickle.PicklingError: an argument cannot be pickled.
    """
    request = _request(fn, kwargs)
    process = await anyio.open_process(
        [sys.executable, "-u", "-P", CHILD],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=None,  # the tool's prints and tracebacks show as the parent's
        start_new_session=True,
    )
    chunks: list[bytes] = []
    try:
        assert process.stdin is not None
        assert process.stdout is not None
        await process.stdin.send(request)
        await process.stdin.aclose()
        async for chunk in process.stdout:
            chunks.append(chunk)
        code = await process.wait()
    except BaseException:
        # A timeout or a cancel (or a broken pipe): the call is over, so is
        # the child. Reaping is shielded so the cancellation cannot skip it.
        _kill(process)
        with anyio.CancelScope(shield=True):
            await process.aclose()
        raise
    await process.aclose()
    return _read_answer(b"".join(chunks), code)


def _read_answer(data: bytes, code: int) -> str:
    try:
        answer = pickle.loads(data)
    except Exception:
        answer = None
    if not isinstance(answer, tuple) or not answer:
        raise RuntimeError(f"the tool's process ended with code {code} and no result")
    if answer[0] == "ok":
        text: str = answer[1]
        return text
    raise ToolRaised(answer[1], answer[2])
