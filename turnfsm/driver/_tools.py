"""Function tools: a JSON schema from the signature and docstring, safe execution."""

from __future__ import annotations

import inspect
import json
import re
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager, nullcontext
from types import TracebackType
from typing import Any, Literal, Union, final, get_args, get_origin

import anyio
import anyio.to_thread
import attrs

from turnfsm.errors import ToolError
from turnfsm.messages import Message, ToolCallPart
from turnfsm.providers import ToolSchema

__all__ = ["Tool", "deadline", "function_tool", "run_tool_call", "tools_by_name"]

_SCALARS: dict[Any, str] = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
}
_ARG_LINE = re.compile(r"^\s{2,}(\*{0,2}\w+)(?:\s*\([^)]*\))?:\s*(.*)$")


@final
@attrs.frozen(kw_only=True)
class Tool:
    """A callable the model may ask for, with the schema it is described by.

    Build one from a function with `function_tool` (or `Tool.from_function`).
    """

    name: str = attrs.field()
    description: str
    parameters: Mapping[str, Any] = attrs.field(hash=False)
    fn: Callable[..., Any] = attrs.field(eq=False, repr=False)
    # Derived once: the call path runs per tool call.
    _is_async: bool = attrs.field(init=False, eq=False, repr=False)
    _known: frozenset[str] = attrs.field(init=False, eq=False, repr=False)
    _required: tuple[str, ...] = attrs.field(init=False, eq=False, repr=False)

    @_is_async.default
    def _detect_async(self) -> bool:
        return inspect.iscoroutinefunction(self.fn)

    @_known.default
    def _known_names(self) -> frozenset[str]:
        return frozenset(self.parameters.get("properties", {}))

    @_required.default
    def _required_names(self) -> tuple[str, ...]:
        return tuple(self.parameters.get("required", ()))

    @name.validator
    def _check_name(self, _attr: object, value: str) -> None:
        if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", value):
            raise ToolError(value, "a tool name is 1-64 of A-Z a-z 0-9 _ -")

    @classmethod
    def from_function(
        cls,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
    ) -> Tool:
        """Describe `fn` by its signature and Google-style docstring.

        Raises:
            ToolError: a parameter has no annotation or an unsupported one.
        """
        tool_name = name or fn.__name__
        doc = inspect.getdoc(fn) or ""
        summary, arg_docs = _parse_doc(doc)
        hints = typing.get_type_hints(fn)
        properties: dict[str, Any] = {}
        required: list[str] = []
        for param in inspect.signature(fn).parameters.values():
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                raise ToolError(
                    tool_name,
                    f"*args/**kwargs ({param.name}) cannot be described to a model",
                )
            if param.name not in hints:
                raise ToolError(
                    tool_name, f"parameter {param.name!r} needs a type annotation"
                )
            schema = _schema_of(hints[param.name], tool_name, param.name)
            if param.name in arg_docs:
                schema = {**schema, "description": arg_docs[param.name]}
            properties[param.name] = schema
            if param.default is inspect.Parameter.empty:
                required.append(param.name)
        parameters = {
            "type": "object",
            "properties": properties,
            "required": required,
            "additionalProperties": False,
        }
        return cls(
            name=tool_name,
            description=description or summary or tool_name,
            parameters=parameters,
            fn=fn,
        )

    @property
    def schema(self) -> ToolSchema:
        """The description sent to the model."""
        return ToolSchema(
            name=self.name, description=self.description, parameters=self.parameters
        )

    async def invoke(self, arguments: Mapping[str, Any]) -> str:
        """Run the tool with `arguments` and return its output as text.

        Raises:
            Exception: whatever the tool raises (the driver turns it into an
                error result).
        """
        unknown = sorted(set(arguments) - self._known) if arguments else []
        missing = [r for r in self._required if r not in arguments]
        if unknown or missing:
            raise ValueError(
                f"bad arguments: missing {missing or 'none'}, "
                f"unknown {unknown or 'none'}"
            )
        if self._is_async:
            result = await self.fn(**arguments)
        else:
            # A thread cannot be interrupted: on a timeout or a cancel the run
            # goes on without it (the thread finishes in the background).
            result = await anyio.to_thread.run_sync(
                lambda: self.fn(**arguments), abandon_on_cancel=True
            )
        if isinstance(result, str):
            return result
        return json.dumps(result, default=str, ensure_ascii=False)


def function_tool(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
) -> Any:
    """Turn a function into a `Tool` (usable bare or with arguments).

    Example:
        ```python
        @function_tool
        def add(a: int, b: int) -> int:
            \"\"\"Add two numbers.\"\"\"
            return a + b
        ```
    """
    if fn is None:
        return lambda f: Tool.from_function(f, name=name, description=description)
    return Tool.from_function(fn, name=name, description=description)


def _parse_doc(doc: str) -> tuple[str, dict[str, str]]:
    summary = doc.split("\n\n", 1)[0].replace("\n", " ").strip()
    args: dict[str, str] = {}
    in_args = False
    current: str | None = None
    for line in doc.splitlines():
        stripped = line.strip()
        if stripped in {"Args:", "Arguments:", "Parameters:"}:
            in_args = True
            continue
        if in_args and stripped.endswith(":") and not line.startswith(" "):
            break
        if not in_args:
            continue
        match = _ARG_LINE.match(line)
        if match and len(line) - len(line.lstrip()) <= 4:
            current = match.group(1).lstrip("*")
            args[current] = match.group(2).strip()
        elif current and stripped:
            args[current] = f"{args[current]} {stripped}".strip()
    return summary, args


def _schema_of(tp: Any, tool: str, param: str) -> dict[str, Any]:
    if tp in _SCALARS:
        return {"type": _SCALARS[tp]}
    origin = get_origin(tp)
    args = get_args(tp)
    if origin is Literal:
        return {"enum": list(args)}
    if origin in (Union, types.UnionType):
        options = [a for a in args if a is not type(None)]
        if len(options) == 1:
            inner = _schema_of(options[0], tool, param)
            return {"anyOf": [inner, {"type": "null"}]}
        return {"anyOf": [_schema_of(a, tool, param) for a in args]}
    if origin in (list, tuple, set, frozenset) or tp in (list, tuple):
        item = args[0] if args else None
        schema: dict[str, Any] = {"type": "array"}
        if item is not None and item is not Ellipsis:
            schema["items"] = _schema_of(item, tool, param)
        return schema
    if origin in (dict, Mapping) or tp is dict:
        return {"type": "object"}
    raise ToolError(tool, f"parameter {param!r}: unsupported annotation {tp!r}")


def deadline(seconds: float | None) -> AbstractContextManager[object]:
    """Return a context that raises `TimeoutError` after `seconds` (None: no limit).

    `anyio.fail_after` without its generator: one bare `CancelScope` with a
    deadline. Only the deadline can cancel the scope (nobody else holds it),
    so a cancellation it caught is the deadline: `TimeoutError`.
    """
    return _Deadline(seconds) if seconds is not None else nullcontext()


@final
class _Deadline:
    """`deadline()`'s context: a `CancelScope` whose expiry is a `TimeoutError`."""

    __slots__ = ("_scope", "_seconds")

    def __init__(self, seconds: float) -> None:
        self._seconds = seconds

    def __enter__(self) -> anyio.CancelScope:
        scope = anyio.CancelScope(deadline=anyio.current_time() + self._seconds)
        self._scope = scope
        return scope.__enter__()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        scope = self._scope
        scope.__exit__(exc_type, exc, tb)
        if scope.cancelled_caught:
            raise TimeoutError from None


async def run_tool_call(
    call: ToolCallPart, tools: Mapping[str, Tool], *, limit: float | None
) -> Message:
    """Run one tool call and return its result message; never raises for tool errors.

    An unknown tool gets a pre-resolved error result; an exception or a
    timeout becomes an error result naming the tool. Cancellation propagates.
    """
    tool = tools.get(call.name)
    if tool is None:
        return Message.tool_result(
            call.id, f"tool {call.name!r} is not available", is_error=True
        )
    try:
        # move_on_after, not fail_after: a TimeoutError the tool raises itself
        # is the tool's failure, not our deadline.
        if limit is None:
            output = await tool.invoke(call.arguments)
        else:
            # A bare scope is move_on_after without its backend look-ups.
            with anyio.CancelScope(deadline=anyio.current_time() + limit) as scope:
                output = await tool.invoke(call.arguments)
            if scope.cancelled_caught:
                return Message.tool_result(
                    call.id,
                    f"tool {call.name!r} timed out after {limit}s",
                    is_error=True,
                )
    except Exception as exc:
        return Message.tool_result(
            call.id,
            f"tool {call.name!r} failed: {type(exc).__name__}: {exc}",
            is_error=True,
        )
    return Message.tool_result(call.id, output)


def tools_by_name(tools: Iterable[Tool | Callable[..., Any]]) -> dict[str, Tool]:
    """Index tools by name, wrapping plain functions with `Tool.from_function`.

    Raises:
        ToolError: two tools share a name.
    """
    out: dict[str, Tool] = {}
    for item in tools:
        tool = item if isinstance(item, Tool) else Tool.from_function(item)
        if tool.name in out:
            raise ToolError(tool.name, "registered twice")
        out[tool.name] = tool
    return out
