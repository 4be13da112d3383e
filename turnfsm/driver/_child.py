"""The process a ``Tool(in_subprocess=True)`` call runs in (run as a script).

The parent (`turnfsm.driver._subprocess`) starts ``python -u _child.py`` in a
session of its own, writes one pickled request to its stdin and reads one
pickled answer from its stdout. This file imports only the standard library:
it runs as a script, so starting it costs no turnfsm import, and the tool's
module is imported by name, as the parent has it.

The request is a dict: ``path`` (the parent's `sys.path`), ``main`` (how to
load the parent's ``__main__`` when the tool or its arguments live there:
``["module", name]``, ``["path", file]`` or None), ``module`` and
``qualname`` (where the tool's function is) and ``kwargs`` (the keyword
arguments, pickled apart, so their classes unpickle once the path is set).
The answer is ``("ok", text)`` or ``("raised", type name, message)``.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import json
import os
import pickle
import reprlib
import runpy
import sys
import types
from collections.abc import Callable
from typing import IO, Any

__all__ = ["answer", "as_json", "as_text", "main"]


LOADING_MAIN: str | None = None
"""While the parent's ``__main__`` is loaded, the script (or ``-m`` module) it is.

Read by `turnfsm.driver._subprocess.loading_main` (this file is the
child's ``__main__``): a run started then is refused, since a script that
starts its agent at its top level, not under ``if __name__ ==
"__main__":``, would run it again in here.
"""


def _load_main(how: list[str] | None) -> None:
    """Load the parent's ``__main__`` as ``__mp_main__``, as multiprocessing does."""
    global LOADING_MAIN
    if how is None:
        return
    kind, where = how
    LOADING_MAIN = where
    try:
        if kind == "module":
            found = runpy.run_module(where, run_name="__mp_main__", alter_sys=False)
        else:
            found = runpy.run_path(where, run_name="__mp_main__")
    finally:
        LOADING_MAIN = None
    module = types.ModuleType("__mp_main__")
    module.__dict__.update(found)
    sys.modules["__main__"] = sys.modules["__mp_main__"] = module


def _resolve(module_name: str, qualname: str) -> Callable[..., Any]:
    target: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        target = getattr(target, part)
    # `@function_tool` rebinds the function's name to the Tool it made.
    if type(target).__name__ == "Tool" and callable(getattr(target, "fn", None)):
        target = target.fn
    fn: Callable[..., Any] = target
    return fn


def as_text(result: object) -> str:
    """Return what a tool returned as the text the model gets.

    A string as it is, bytes as the UTF-8 text they hold; anything else as
    JSON, where an attrs class, a dataclass or a pydantic model is an object
    of its fields, a set a list, an enum its value, bytes their text, and
    whatever else JSON has no type for its `str()`.
    A value JSON cannot hold at all (a mapping with keys that are no
    strings, one that holds itself) is its `str()`: the tool ran, and
    its result is not a failure.
    """
    if isinstance(result, str):
        return result
    if isinstance(result, bytes | bytearray):
        return _decoded(result)
    try:
        return as_json(result)
    except (TypeError, ValueError, RecursionError):
        try:
            return str(result)
        except RecursionError:
            return reprlib.repr(result)


def as_json(value: object) -> str:
    """Return `value` as JSON, as `as_text` writes what is not text.

    Raises:
        TypeError, ValueError, RecursionError: JSON cannot hold it.
    """
    return json.dumps(value, default=_jsonable, ensure_ascii=False)


def _jsonable(value: Any) -> Any:
    """`json.dumps`'s ``default``: a value JSON has no type for, as one it has."""
    if callable(getattr(value, "model_dump", None)) and not isinstance(value, type):
        return value.model_dump(mode="json")  # pydantic
    fields = getattr(type(value), "__attrs_attrs__", None)
    if fields is not None:
        return {f.name: getattr(value, f.name) for f in fields}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if isinstance(value, set | frozenset):
        try:
            return sorted(value)  # the same text every time
        except TypeError:
            return list(value)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, bytes | bytearray):
        return _decoded(value)
    return str(value)


def _decoded(data: bytes | bytearray) -> str:
    """Bytes as the text they hold (a command's output), U+FFFD for a non-UTF-8 byte."""
    return bytes(data).decode("utf-8", errors="replace")


def _message_of(exc: BaseException) -> str:
    """``str(exc)``, or a note saying it could not be read (as the parent words it)."""
    try:
        return str(exc)
    except Exception as failed:
        return f"(its message could not be read: str() raised {type(failed).__name__})"


def answer(request: bytes) -> tuple[str, ...]:
    """Run the request's tool and return the answer to send back."""
    try:
        data = pickle.loads(request)
        sys.path[:] = data["path"]
        _load_main(data["main"])
        fn = _resolve(data["module"], data["qualname"])
        kwargs = pickle.loads(data["kwargs"])
        return ("ok", as_text(fn(**kwargs)))
    except BaseException as exc:  # the tool's failure, reported, not raised
        return ("raised", type(exc).__name__, _message_of(exc))


def main(stdin: IO[bytes], out: IO[bytes]) -> None:
    """Read one request from `stdin`, write its answer to `out`."""
    request = stdin.read()
    reply = answer(request)
    try:
        data = pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:  # a message that does not pickle (it always should)
        data = pickle.dumps(("raised", type(exc).__name__, _message_of(exc)))
    out.write(data)
    out.flush()


if __name__ == "__main__":  # pragma: no cover - runs in the child process
    # The answer goes to the original stdout; fd 1 becomes stderr, so what the
    # tool (or a program it starts) prints cannot corrupt it; stdin is empty.
    _out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    _in = os.fdopen(os.dup(0), "rb")
    _null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(_null, 0)
    main(_in, _out)
