"""Finding a user's code for the command line: ``--agent`` and ``--tools``.

Each names objects as ``MODULE:ATTR`` (``myapp.agents:support``); the module
is imported as Python would import it (the current directory is on the path,
as with ``python -m``). A spec that names nothing usable is refused with a
`ConfigError` naming the option, the value and what is wrong: the module
cannot be found, it has no such attribute, or the attribute is not what the
option takes.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import sys
from collections.abc import Callable
from typing import Any

from turnfsm.agent import Agent
from turnfsm.driver import Tool
from turnfsm.errors import ConfigError

__all__ = [
    "load_agent",
    "load_agents",
    "load_object",
    "load_tools",
    "made_by",
]


_SPELLINGS = {
    "--tools": "MODULE:FUNC (e.g. myapp.tools:search)",
    "--compactor": "MODULE:ATTR (e.g. myapp.context:compactor)",
}
"""How an option that names no agent (as ``--agent`` does) spells its object."""


def load_object(option: str, spec: str) -> Any:
    """Import ``MODULE:ATTR`` (ATTR may be dotted) and return the object.

    Raises:
        ConfigError: `spec` is not ``MODULE:ATTR``, the module is not found
            (or raised on import: the error is named), or it has no ATTR.
    """
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        spelling = _SPELLINGS.get(option, "MODULE:ATTR (e.g. myapp.agents:support)")
        raise ConfigError(option, spec, spelling)
    if not _dotted_names(module_name):
        # Not a module name Python could import (``./app.py``, ``src/app``).
        raise ConfigError(
            option, spec, f"an importable module ({_how_to_name(module_name, attr)})"
        )
    if "" not in sys.path:  # as `python -m` does: the current directory first
        sys.path.insert(0, "")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing and (module_name + ".").startswith(missing + "."):
            raise ConfigError(
                option,
                spec,
                f"an importable module: no module named {missing!r} "
                f"({_how_to_name(module_name, attr)})",
            ) from None
        raise _import_failed(option, spec, exc) from None
    except Exception as exc:  # the module's own code failed
        raise _import_failed(option, spec, exc) from None
    value: Any = module
    for part in attr.split("."):
        if not hasattr(value, part):
            close = difflib.get_close_matches(part, _public_names(value), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(
                option,
                spec,
                f"a name module {module_name} defines (no {attr!r}{hint})",
            )
        value = getattr(value, part)
    return value


def _public_names(value: object) -> list[str]:
    """The names `value` has that do not start with an underscore."""
    try:
        return [name for name in dir(value) if not name.startswith("_")]
    except Exception:  # a user's object whose __dir__ fails: no suggestion
        return []


def _how_to_name(module_name: str, attr: str) -> str:
    """What to do about a module that is not found: a file's name given, or not."""
    if not _is_file_name(module_name):
        return "run from the directory that holds it, or set PYTHONPATH"
    parts = module_name.removesuffix(".py").replace("\\", "/").split("/")
    dotted = ".".join(part for part in parts if part not in ("", ".", ".."))
    if not _dotted_names(dotted):
        return (
            "a module's name is Python names joined by dots, as in "
            "myapp.agents: rename the file so that Python can import it"
        )
    return (
        "a module is named as Python imports it, not by its file: "
        f"{dotted}:{attr}, run from the directory that holds it"
    )


def _is_file_name(module_name: str) -> bool:
    """Whether `module_name` reads as a file's name (``app.py``, ``./src/app``)."""
    return module_name.endswith(".py") or not _dotted_names(module_name)


def _dotted_names(name: str) -> bool:
    """Whether `name` is Python names joined by dots, as a module's name is."""
    return all(part.isidentifier() for part in name.split("."))


def _import_failed(option: str, spec: str, exc: BaseException) -> ConfigError:
    return ConfigError(
        option,
        spec,
        f"a module that imports (it raised {type(exc).__name__}: {exc})",
    )


def load_agent(spec: str, *, option: str = "--agent") -> Agent:
    """Import ``MODULE:ATTR``: an `Agent`, or a function of no arguments making one.

    Raises:
        ConfigError: the spec names no agent (see `load_object`; or the
            object is not an `Agent`, or the function returned none).
    """
    value = load_object(option, spec)
    made = callable(value) and not isinstance(value, Agent) and _no_arguments(value)
    if made:
        value = made_by(option, spec, value)
    if not isinstance(value, Agent):
        raise ConfigError(
            option,
            spec,
            f"an Agent, or a function making one ({_what_it_is(value, made)})",
        )
    return value


def _what_it_is(value: object, made: bool) -> str:
    """What a value named where an agent (or a factory) belongs is, in words.

    `made`: `value` is what the named function returned. A function that
    needs arguments is not a factory (one is called with none): it names
    them, so that ``(it is a function)`` does not read as what was asked for.
    """
    if made:
        return f"the function returned {_a(type(value).__name__)}"
    if callable(value) and not _no_arguments(value):
        needed = [
            p.name
            for p in inspect.signature(value).parameters.values()
            if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        ]
        return (
            f"it is a function that needs {', '.join(needed)}; a function making "
            "one takes no arguments"
        )
    return f"it is {_a(type(value).__name__)}"


def _a(noun: str) -> str:
    """`noun` with its article: ``a function``, ``an int``."""
    return f"{'an' if noun[:1].lower() in 'aeiou' else 'a'} {noun}"


def made_by(
    option: str, spec: str, make: Callable[[], Any], what: str = "an agent"
) -> Any:
    """What the factory `make` returns; a `ConfigError` naming it if it raises.

    An async factory is refused, its coroutine closed unrun: the command
    line calls factories, it awaits none.
    """
    try:
        made = make()
    except Exception as exc:  # the factory's own code failed
        raise ConfigError(
            option,
            spec,
            f"a function that makes {what} (it raised {type(exc).__name__}: {exc})",
        ) from None
    if inspect.isawaitable(made):
        if inspect.iscoroutine(made):
            made.close()
        raise ConfigError(
            option,
            spec,
            f"a function that makes {what} and returns it (it is an async def, "
            f"which the command line does not await: make {what} in a plain def)",
        )
    return made


def _no_arguments(fn: Any) -> bool:
    """Whether `fn` can be called with no arguments (a factory)."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without one: try it
        return True
    return all(
        p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        for p in signature.parameters.values()
    )


def load_agents(spec: str) -> list[Agent]:
    """Import ``MODULE:ATTR``: an `Agent`, a list of them, or a function making them.

    Raises:
        ConfigError: the spec does not name agents (the reason is given).
    """
    value = load_object("--agent", spec)
    made = callable(value) and not isinstance(value, Agent) and _no_arguments(value)
    if made:
        value = made_by("--agent", spec, value)
    if isinstance(value, Agent):
        agents = [value]
    elif isinstance(value, list | tuple):
        agents = list(value)
    else:
        agents = []
    if not agents or not all(isinstance(a, Agent) for a in agents):
        raise ConfigError(
            "--agent",
            spec,
            f"an Agent, Agents, or a function making them ({_what_it_is(value, made)})",
        )
    return agents


def load_tools(spec: str) -> list[Tool | Callable[..., Any]]:
    """Import the tools of ``MODULE:FUNC,MODULE:FUNC,...``.

    A name without a module (``MODULE:a,b``) is looked up in the module
    named before it. Each is a function, or a `Tool` (what ``@function_tool``
    makes of one).

    Raises:
        ConfigError: a name is not ``MODULE:FUNC`` (or is empty), or names
            no function.
    """
    tools: list[Tool | Callable[..., Any]] = []
    module = ""
    for item in (part.strip() for part in spec.split(",")):
        if not item:  # `a:f,` or `a:f,,g`: named as given, not as ''
            expected = "MODULE:FUNC,... with no empty name (e.g. myapp.tools:a,b)"
            raise ConfigError("--tools", spec, expected)
        if ":" not in item and module:
            item = f"{module}:{item}"
        module = item.partition(":")[0]
        value = load_object("--tools", item)
        if not (callable(value) or isinstance(value, Tool)):
            raise ConfigError(
                "--tools",
                item,
                f"a function or a Tool (it is {_a(type(value).__name__)})",
            )
        tools.append(value)
    return tools
