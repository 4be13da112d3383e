"""Function tools: a JSON schema from the signature, checked arguments, safe runs.

A tool's schema is built (or, given, checked) once, when the tool is made;
each call's arguments are validated against it with `jsonschema`, so a
model that sends ``"three"`` for an integer gets an error result naming the
field, and the tool does not run (`turnfsm.driver._arguments`). The
annotation-to-schema mechanism lives in `turnfsm.driver._schema`, a
function's signature read through it in `turnfsm.driver._signature`, and
running a tool in a child process that a timeout kills in
`turnfsm.driver._subprocess`.
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
import logging
import re
import weakref
from collections.abc import Awaitable, Callable, Iterable, Mapping
from contextlib import AbstractContextManager, nullcontext
from functools import partial
from types import TracebackType
from typing import Any, Final, cast, final, overload

import anyio
import anyio.to_thread
import attrs

from turnfsm import _checks
from turnfsm._json import plain
from turnfsm.core import ToolCallsReviewed
from turnfsm.driver._arguments import (
    ArgumentsCheck,
    InvalidArguments,
    arguments_check,
    check_arguments,
    problems_of_structuring,
)
from turnfsm.driver._cancels import cancel_errors, cancel_requested
from turnfsm.driver._child import as_text
from turnfsm.driver._schema import Unsupported, parse_doc
from turnfsm.driver._signature import annotated_function, describe_function
from turnfsm.driver._subprocess import ToolRaised, call_in_subprocess, check_isolatable
from turnfsm.errors import ConfigError, SubagentWaiting, ToolError
from turnfsm.messages import Message, ToolCallPart
from turnfsm.providers import ToolSchema

__all__ = [
    "Tool",
    "current_tool_call",
    "deadline",
    "failed_result",
    "function_tool",
    "is_late",
    "missing_tools",
    "run_tool_call",
    "tool_call_outcome",
    "tools_by_name",
    "warn_if_held",
]

logger = logging.getLogger("turnfsm.tools")
_driver_logger = logging.getLogger("turnfsm.driver")  # a model call's warnings

Arguments = Mapping[str, Any]
"""A call's arguments: the JSON object the model sent."""

_TOOL_NAME: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")
_NAME_RULE: Final = "a tool name is 1-64 of A-Z a-z 0-9 _ -"

_SCHEMA: Final = _checks.json_object(
    expected="a JSON schema: a mapping with string keys of JSON values"
)

_DESCRIPTION: Final = _checks.string(
    non_empty=True,
    expected="a string, not a blank one: what the tool does, for the model",
)


@final
@_checks.keyword_checked
@attrs.frozen(kw_only=True)
class Tool:
    """A callable the model may ask for, with the JSON schema it is described by.

    Build one from a function with `function_tool` (or `Tool.from_function`),
    or give the schema yourself: ``Tool(name=..., description=...,
    parameters={"type": "object", ...}, fn=...)``. Either way the schema is
    checked once, here, and every call's arguments are validated against it
    before `fn` runs; a call that does not fit gets an error result listing
    each bad field, and `fn` is not called.

    Attributes:
        name: The name the model calls the tool by (1-64 of ``A-Z a-z 0-9 _ -``).
        description: What the tool does, for the model.
        parameters: The JSON schema of the arguments (an object schema;
            Draft 2020-12 unless its ``$schema`` says otherwise).
        fn: The function, sync or async. It is called with the arguments as
            keyword arguments, after `structure` made them values.
        structure: Turns the validated arguments into `fn`'s keyword
            arguments (`Tool.from_function` makes it from the annotations:
            enums, tuples, attrs classes, pydantic models, ...). None passes
            the JSON as it is. An exception it raises is an invalid-arguments
            result.
        in_subprocess: Run `fn` in a child process that is killed when the
            call times out or is cancelled, instead of in a worker thread
            that cannot be stopped. `fn` must be a sync function defined at
            the top level of a module, its arguments picklable.
        idempotent: The tool is safe to run twice with the same arguments
            (a read, a lookup, a write keyed by the call's id). A call whose
            run stopped before it finished (the process died, or was
            interrupted) is run again when the run resumes. Its results
            are written with the model's next reply, not before the model
            is asked (one write a turn less; a crash in between runs the
            call again). Off by default: such a call is closed with an
            error result saying it was interrupted and its effects are
            unknown, and the model decides whether to call it again, and a
            batch's results are written before the model is asked.

    Raises:
        ConfigError: `parameters` is not a mapping of JSON values (None, a
            set, an object, NaN, nested over 100 deep: the error names the
            value inside, ``Tool('t').parameters.properties.a.default``), or
            not a valid JSON schema of an object, or (without `structure`)
            names a property or a required name `fn` does not take, or
            leaves out a parameter `fn` takes with no default; `name` is
            not a string, `description` not a non-blank string, `fn` (or
            `structure`) is not callable, or `in_subprocess` is not True or
            False (the error names the tool's field: ``Tool('t').fn``).
        ToolError: `name` is not 1-64 of ``A-Z a-z 0-9 _ -``, or `fn`
            cannot run in a subprocess.
    """

    name: str = attrs.field()
    description: str = attrs.field()
    parameters: Mapping[str, Any] = attrs.field(hash=False)
    fn: Callable[..., Any] = attrs.field(eq=False, repr=False)
    structure: Callable[[Arguments], Mapping[str, Any]] | None = attrs.field(
        default=None, eq=False, repr=False
    )
    in_subprocess: bool = attrs.field(default=False)
    idempotent: bool = attrs.field(default=False, validator=_checks.boolean())
    # Derived once: the call path runs per tool call.
    _is_async: bool = attrs.field(init=False, eq=False, repr=False)
    _validator: ArgumentsCheck = attrs.field(init=False, eq=False, repr=False)

    @_is_async.default
    def _detect_async(self) -> bool:
        # A partial as its function; a callable instance as its __call__.
        return inspect.iscoroutinefunction(annotated_function(self.fn))

    @_validator.default
    def _build_validator(self) -> ArgumentsCheck:
        # Derived before any validator runs: check the schema's shape first.
        field = f"Tool({self.name!r}).parameters"
        _checks.check(self.parameters, field, _SCHEMA)
        return arguments_check(self.name, self.parameters)

    @description.validator
    def _check_description(self, _attr: object, value: str) -> None:
        # A blank one would reach the model as the tool's only explanation.
        _checks.check(value, f"Tool({self.name!r}).description", _DESCRIPTION)

    @structure.validator
    def _check_structure(self, _attr: object, value: object) -> None:
        if value is not None and not callable(value):
            raise ConfigError(
                f"Tool({self.name!r}).structure", value, "a callable, or None"
            )

    @fn.validator
    def _check_fn(self, _attr: object, value: Callable[..., Any]) -> None:
        if not callable(value):
            raise ConfigError(
                f"Tool({self.name!r}).fn",
                value,
                "the function the tool runs (a callable, sync or async)",
            )
        target = inspect.unwrap(annotated_function(value))
        if inspect.isgeneratorfunction(target) or inspect.isasyncgenfunction(target):
            # It would "return" its generator, sent to the model as a repr.
            raise ToolError(
                self.name,
                "its function yields (a generator function), and a tool "
                "returns its result: return the text, or a list of the pieces",
            )

    @name.validator
    def _check_name(self, _attr: object, value: str) -> None:
        if not isinstance(value, str):
            raise ConfigError("Tool.name", value, "a string: 1-64 of A-Z a-z 0-9 _ -")
        if not _TOOL_NAME.fullmatch(value):
            raise ToolError(value, _NAME_RULE)

    @in_subprocess.validator
    def _check_isolatable(self, _attr: object, value: bool) -> None:
        if not isinstance(value, bool):
            raise ConfigError(
                f"Tool({self.name!r}).in_subprocess", value, "True or False"
            )
        if not value:
            return
        if self._is_async:
            raise ToolError(
                self.name,
                "in_subprocess is for sync functions (a timeout already "
                "cancels an async tool)",
            )
        reason = check_isolatable(self.fn)
        if reason is not None:
            raise ToolError(self.name, reason)

    def __attrs_post_init__(self) -> None:
        if self.structure is None:  # the arguments go to `fn` as they are
            _check_takes(self.name, self.fn, self.parameters)

    @classmethod
    def from_function(
        cls,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        in_subprocess: bool = False,
        idempotent: bool = False,
    ) -> Tool:
        """Describe `fn` by its signature and docstring.

        Each parameter becomes a property of the schema, described by the
        docstring's ``Args:`` section (Google style), ``Parameters``
        section (NumPy style) or ``:param name:`` fields (reST), and
        required unless it has a default.
        A function whose one parameter is annotated with a parameters class
        (an attrs class, a dataclass, a `TypedDict` or a pydantic model)
        takes that class's fields as its arguments and receives one
        instance: ``def search(args: SearchArgs)``.

        A `functools.partial` is described by the function it wraps (its
        name and docstring) with the parameters left to give (those it fixed,
        by keyword too, are not shown to the model); a callable
        instance by its class's name and its ``__call__``.

        Raises:
            ToolError: a parameter has no annotation, an unsupported one or
                one naming something that does not exist, or a default that
                is no value of it (``x: int = "all"``), or `in_subprocess`
                is set for a function a child process cannot import.
            ConfigError: `fn` is not callable, or an option is of the wrong
                type, or `description` is a blank string (`Tool` names the
                field).
        """
        if not callable(fn):
            raise ConfigError(
                "fn", fn, "a function to make a tool of (a callable, sync or async)"
            )
        tool_name = _name_of(fn) if name is None else name
        try:
            summary, parameters, structure = _described(fn)
        except Unsupported as exc:
            raise ToolError(tool_name, str(exc)) from None
        if name is None and not _TOOL_NAME.fullmatch(tool_name):
            raise ToolError(
                tool_name,
                f"{_NAME_RULE}, and this is the function's name: give the tool "
                "one, function_tool(fn, name='...') or "
                "Tool.from_function(fn, name='...')",
            )
        tool = cls(
            name=tool_name,
            # None: the docstring's summary; anything else is `Tool`'s to check.
            description=(summary or tool_name) if description is None else description,
            parameters=parameters,
            fn=fn,
            structure=structure,
            in_subprocess=in_subprocess,
            idempotent=idempotent,
        )
        return tool

    @property
    def schema(self) -> ToolSchema:
        """The description sent to the model."""
        return ToolSchema(
            name=self.name, description=self.description, parameters=self.parameters
        )

    async def invoke(self, arguments: Arguments) -> str:
        """Run the tool with `arguments` and return its output as text.

        A string result is the text as it is; anything else is sent as JSON.

        Raises:
            ValueError: the arguments do not fit the schema, or `structure`
                refused them (each problem is listed; `fn` did not run).
            Exception: whatever the tool raises (the driver turns it into an
                error result).
        """
        kwargs = self._read(arguments)
        if self._is_async:
            result = await self.fn(**kwargs)
        elif self.in_subprocess:
            return await call_in_subprocess(self.fn, kwargs)
        else:
            # A thread cannot be interrupted: on a timeout or a cancel the run
            # goes on without it and the thread finishes in the background
            # (docs/how-to/tools.md; in_subprocess is the way out).
            result = await anyio.to_thread.run_sync(
                partial(_in_thread, self.fn, kwargs), abandon_on_cancel=True
            )
            if type(result) is _Pending:
                result = await result.awaitable
        return as_text(result)

    def _read(self, arguments: Arguments) -> Mapping[str, Any]:
        # The call's arguments are the log's: the tool gets a copy to change.
        arguments = cast(Arguments, plain(arguments))
        check_arguments(self._validator, arguments)
        if self.structure is None:
            return arguments
        try:
            return self.structure(arguments)
        except InvalidArguments:
            raise
        except Exception as exc:
            raise InvalidArguments(problems_of_structuring(exc)) from exc


_BY_NAME: Final = (
    inspect.Parameter.POSITIONAL_OR_KEYWORD,
    inspect.Parameter.KEYWORD_ONLY,
)


_COMPOSED: Final = frozenset({"allOf", "anyOf", "oneOf", "$ref"})
"""Schema keys that describe properties elsewhere than in ``properties``."""


def _own_parameters(fn: Callable[..., Any]) -> list[inspect.Parameter]:
    """The parameters a call of `fn` itself must give (not a wrapped function's).

    A decorator that supplies some of its function's arguments (``wraps``
    and ``**kwargs``) asks for none of them.
    """
    try:
        return list(inspect.signature(fn, follow_wrapped=False).parameters.values())
    except (TypeError, ValueError):
        return []


def _check_takes(name: str, fn: Callable[..., Any], schema: Mapping[str, Any]) -> None:
    """Refuse a schema that does not fit `fn`: some call of it would fail.

    Each property, and each required name, must be a parameter `fn` takes
    by name, unless it takes ``**kwargs``; each parameter `fn` itself takes
    with no default must be a property (unless the schema composes its
    properties: ``allOf``, ``anyOf``, ``oneOf``, ``$ref``). A function whose
    signature cannot be read is taken on trust.
    """
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return
    named = [p.name for p in params if p.kind in _BY_NAME]
    properties = schema.get("properties")
    if not isinstance(properties, Mapping):
        properties = {}
    for p in _own_parameters(fn):
        if (
            p.kind in _BY_NAME
            and p.default is p.empty
            and p.name not in properties
            and not _COMPOSED.intersection(schema)
        ):
            # The model is never told of it, and no call works without it.
            raise ConfigError(
                f"Tool({name!r}).parameters.properties",
                properties,
                f"a property {p.name!r}: {_name_of(fn)} takes it with no default",
            )
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return
    required = schema.get("required")
    required = required if isinstance(required, list) else []
    takes = ", ".join(named) or "nothing by name"
    if properties:
        for key, sub in properties.items():
            if key not in named:
                raise ConfigError(
                    f"Tool({name!r}).parameters.properties.{key}",
                    sub,
                    f"a parameter the function takes ({_name_of(fn)} takes {takes})",
                )
    for key in required:
        if key not in named:
            # Every call fails: without it the schema refuses, with it `fn`.
            raise ConfigError(
                f"Tool({name!r}).parameters.required",
                required,
                f"names of parameters the function takes ({_name_of(fn)} takes "
                f"{takes}; it does not take {key!r})",
            )


def _check_defaults(fn: Callable[..., Any], parameters: Mapping[str, Any]) -> None:
    """Refuse a parameter whose default is no value of its annotation.

    A call that leaves it out gets the default, unchecked: ``x: int =
    "all"`` would hand the tool a string. Defaults that are JSON values (a
    string, a number, a bool) are checked against the parameter's schema;
    None is taken as "not given" (``limit: int = None``), and any other
    default (an enum member, a tuple, an instance) on trust.

    Raises:
        Unsupported: a default is no value of its parameter.
    """
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return
    properties = parameters.get("properties", {})
    plain = [
        p
        for p in params
        if p.name in properties and type(p.default) in (str, int, float, bool)
    ]
    if not plain:
        return
    validator = arguments_check("", parameters)
    for param in plain:
        default = param.default
        try:
            check_arguments(validator, {param.name: default})
        except InvalidArguments as exc:
            wrong = [p for p in exc.problems if p.path[:1] == (param.name,)]
            if wrong:
                raise Unsupported(
                    f"the default of parameter {param.name!r} ({default!r}) is "
                    f"no value it takes ({wrong[0].expected}): a call that leaves "
                    "it out would get it unchecked; change the default or the "
                    "annotation"
                ) from None


def _in_thread(fn: Callable[..., Any], kwargs: Mapping[str, Any]) -> Any:
    """Call a plain tool in its worker thread.

    A `GeneratorExit` it raises is its failure (as it is in a child process),
    named by a `ToolRaised`: raised on, it would reach the run's coroutines
    as the signal that they are being closed, and end the run in disorder.
    So is a `KeyboardInterrupt`: a worker thread gets no Ctrl-C, so the tool
    raised it itself, and raised on it would end the program.
    An awaitable it returns comes back as a `_Pending`, awaited by the run.
    """
    try:
        result = fn(**kwargs)
    except (GeneratorExit, KeyboardInterrupt) as exc:
        raise ToolRaised(type(exc).__name__, _checks.message_of(exc)) from exc
    # A plain wrapper of an async function (a decorator's) gives its
    # coroutine, the tool's work, to await in the run (trio refuses a
    # coroutine as what a thread returns).
    return _Pending(result) if inspect.isawaitable(result) else result


@final
@attrs.frozen
class _Pending:
    """What a plain tool returned to await: the coroutine of the function it wraps."""

    awaitable: Awaitable[Any]


@overload
def function_tool(
    fn: Callable[..., Any],
    *,
    name: str | None = None,
    description: str | None = None,
    in_subprocess: bool = False,
    idempotent: bool = False,
) -> Tool: ...


@overload
def function_tool(
    fn: None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    in_subprocess: bool = False,
    idempotent: bool = False,
) -> Callable[[Callable[..., Any]], Tool]: ...


def function_tool(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    in_subprocess: bool = False,
    idempotent: bool = False,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Turn a function into a `Tool` (usable bare or with arguments).

    Args:
        fn: The function (omitted when the decorator takes options).
        name: The tool's name; the function's name by default.
        description: What it does (a non-blank string); by default (None)
            the docstring's summary, else the tool's name.
        in_subprocess: Run it in a child process that a timeout kills
            (see `Tool.in_subprocess`).
        idempotent: Safe to run twice: a call cut short by a crash or an
            interrupt is run again on resume (see `Tool.idempotent`).

    Example:
        ```python
        @function_tool
        def add(a: int, b: int) -> int:
            \"\"\"Add two numbers.\"\"\"
            return a + b


        @function_tool(in_subprocess=True)
        def build(target: str) -> str:
            \"\"\"Build a target; a timeout kills the build.\"\"\"
            return subprocess.run(["make", target], capture_output=True).stdout
        ```
    """
    make = partial(
        Tool.from_function,
        name=name,
        description=description,
        in_subprocess=in_subprocess,
        idempotent=idempotent,
    )
    return make if fn is None else make(fn)


def deadline(
    seconds: float | None, what: Callable[[], str]
) -> AbstractContextManager[object]:
    """Return a context that raises `TimeoutError` after `seconds` (None: no limit).

    `anyio.fail_after` without its generator: one bare `CancelScope` with a
    deadline. Only the deadline can cancel the scope (nobody else holds it),
    so a cancellation it caught is the deadline: `TimeoutError`. So is an
    answer that comes past the deadline anyway (`is_late`). The error says
    ``"{what()} timed out after {seconds}s"`` and names the setting
    (``model_timeout``, the one limit it serves): `what` names what ran,
    and is asked only when it timed out.
    """
    return _Deadline(seconds, what) if seconds is not None else nullcontext()


@final
class _Deadline:
    """`deadline()`'s context: a `CancelScope` whose expiry is a `TimeoutError`."""

    __slots__ = ("_scope", "_seconds", "_what")

    def __init__(self, seconds: float, what: Callable[[], str]) -> None:
        self._seconds = seconds
        self._what = what

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
        if scope.cancelled_caught or (exc_type is None and is_late(scope)):
            what = self._what()
            warn_if_held(what, scope, self._seconds, _driver_logger)
            raise TimeoutError(
                f"{what} timed out after {self._seconds}s - model_timeout="
                f"{self._seconds:g} s per attempt; raise it to wait longer"
            ) from None


def is_late(scope: anyio.CancelScope) -> bool:
    """Whether what ran in `scope` finished past its deadline.

    A callee that swallowed the deadline's cancellation, or blocked without a
    checkpoint, still answers too late: its answer counts as timed out.
    """
    return scope.cancel_called or anyio.current_time() >= scope.deadline


async def run_tool_call(
    call: ToolCallPart, tools: Mapping[str, Tool], *, limit: float | None
) -> Message:
    """Run one tool call and return its result message; never raises for tool errors.

    An unknown tool gets a pre-resolved error result; arguments that do not
    fit the tool's schema get one listing every bad field (the tool does not
    run); an exception or a timeout becomes an error result naming the tool.
    Cancellation propagates.
    """
    result, _raised = await tool_call_outcome(call, tools, limit=limit)
    return result


async def tool_call_outcome(
    call: ToolCallPart, tools: Mapping[str, Tool], *, limit: float | None
) -> tuple[Message, Exception | None]:
    """`run_tool_call`, and the exception the tool raised (None: it did not).

    The exception, with its traceback, is logged at DEBUG on the
    ``turnfsm.tools`` logger; the model sees only its type and message.
    A tool that calls ``sys.exit()`` fails its call like one that raised
    (the exception is a `ToolRaised` naming ``SystemExit``), and so does an
    async tool that raises its backend's cancellation error (asyncio's
    ``CancelledError``, trio's ``Cancelled``) while its run is not being
    cancelled.
    """
    tool = tools.get(call.name)
    if tool is None:
        return Message.tool_result(call.id, _unknown(call, tools), is_error=True), None
    token = _CURRENT_CALL.set(call)
    try:
        # move_on_after, not fail_after: a TimeoutError the tool raises itself
        # is the tool's failure, not our deadline.
        if limit is None:
            output = await tool.invoke(call.arguments)
        else:
            # A bare scope is move_on_after without its backend look-ups.
            ends = anyio.current_time() + limit
            with anyio.CancelScope(deadline=ends) as scope, timed_step(ends):
                output = await tool.invoke(call.arguments)
            if scope.cancelled_caught or is_late(scope):
                warn_if_held(
                    f"tool {call.name!r} (call {call.id})", scope, limit, logger
                )
                return late_result(call, limit), None
    except InvalidArguments as exc:
        return Message.tool_result(call.id, exc.report(call.name), is_error=True), None
    except SubagentWaiting:
        raise  # the call has no result yet: its run stops, to go on when answered
    except ToolRaised as exc:  # raised in the tool's child process
        failed = f"tool {call.name!r} failed: {exc}"
        _log_raised(call, failed, exc)
        return Message.tool_result(call.id, failed, is_error=True), exc
    except SystemExit as exc:
        # sys.exit() in a tool (argparse does it on bad arguments) fails the
        # call, as it does in a child process; it does not end the program.
        exited = ToolRaised("SystemExit", _checks.message_of(exc))
        exited.__cause__ = exc
        failed = f"tool {call.name!r} failed: {exited}"
        _log_raised(call, failed, exited)
        return Message.tool_result(call.id, failed, is_error=True), exited
    except cancel_errors() as exc:
        if cancel_requested():
            raise  # the run is cancelled (its timeout caught its own above)
        # An async tool that awaited something cancelled elsewhere (a future,
        # a task) raises it though nobody cancelled the run: its failure.
        unasked = ToolRaised(type(exc).__name__, _checks.message_of(exc))
        unasked.__cause__ = exc
        failed = f"tool {call.name!r} failed: {unasked}"
        _log_raised(call, failed, unasked)
        return Message.tool_result(call.id, failed, is_error=True), unasked
    except Exception as exc:
        result = failed_result(call, exc)
        _log_raised(call, result.tool_results[0].content, exc)
        return result, exc
    finally:
        _CURRENT_CALL.reset(token)
    return Message.tool_result(call.id, output), None


def _unknown(call: ToolCallPart, tools: Mapping[str, Tool]) -> str:
    """The error result of a call of a tool there is not: the names there are."""
    names = sorted(tools)
    if not names:
        return f"tool {call.name!r} is not available: there are no tools"
    shown = ", ".join(names[:_NAMES_SHOWN])
    more = len(names) - _NAMES_SHOWN
    return f"tool {call.name!r} is not available: the tools are {shown}" + (
        f" and {more} more" if more > 0 else ""
    )


_NAMES_SHOWN: Final = 30
"""How many tool names an unknown tool's error result lists."""


def failed_result(call: ToolCallPart, exc: Exception) -> Message:
    """The error result of a call whose tool raised `exc` (its type and message)."""
    text = _checks.message_of(exc)
    failed = f"tool {call.name!r} failed: {type(exc).__name__}: {text}"
    return Message.tool_result(call.id, failed, is_error=True)


def late_result(call: ToolCallPart, limit: float) -> Message:
    """The error result of a call that did not end within `limit` seconds."""
    late = f"tool {call.name!r} timed out after {limit}s"
    return Message.tool_result(call.id, late, is_error=True)


def missing_tools(
    calls: Iterable[ToolCallPart], review: object, tools: Iterable[str]
) -> list[ToolCallPart]:
    """The `calls` a paused run's `review` lets run whose tool is not among `tools`.

    A review (`ToolCallsReviewed`) answers the calls it rejects with error
    results; the others run when the run goes on, so each needs its tool.
    Any other answer runs none of them. In the order of `calls`.
    """
    if not isinstance(review, ToolCallsReviewed):
        return []
    answered = {r.call_id for m in review.results for r in m.tool_results}
    known = set(tools)
    return [c for c in calls if c.id not in answered and c.name not in known]


def warn_if_held(
    what: str, scope: anyio.CancelScope, limit: float, log: logging.Logger
) -> None:
    """Warn on `log` when `what`, run in `scope`, held its run well past `limit`.

    An async tool or effect that ignores its cancellation (it waits in a
    shielded scope, or catches the cancellation and waits on) cannot be
    stopped: the run, its cancel and any deadline around it wait until it
    returns. What the run does then is what the timeout does; this says
    what held the run, and how long.
    """
    held = anyio.current_time() - scope.deadline
    if held >= _HELD_GRACE:
        log.warning(
            "%s ignored its cancellation at its timeout of %ss: the run waited "
            "%.1fs more for it to return (a shielded wait, or a cancellation "
            "caught and not raised again, holds the run)",
            what,
            limit,
            held,
        )


_HELD_GRACE: Final = 1.0
"""Seconds past its timeout a tool may take to return (its clean-up) unremarked."""


def _log_raised(call: ToolCallPart, failed: str, exc: Exception) -> None:
    """Log what the model is told, with the exception's traceback (DEBUG)."""
    logger.debug("%s (call %s)", failed, call.id, exc_info=exc)


_CURRENT_CALL: Final[contextvars.ContextVar[ToolCallPart | None]] = (
    contextvars.ContextVar("turnfsm_tool_call", default=None)
)


_DEADLINE: Final[contextvars.ContextVar[float | None]] = contextvars.ContextVar(
    "turnfsm_step_deadline", default=None
)


@final
class timed_step:
    """Mark what runs inside as a tool call or effect whose timeout is `deadline`.

    Inside a step of a calling run (a sub-agent's tool call, under its
    caller's), the earlier deadline of the two stands: past either, no one
    carries on what the step started. A class, not a generator: it is
    entered once per timed call or effect.
    """

    __slots__ = ("_deadline", "_token")

    def __init__(self, deadline: float) -> None:
        self._deadline = deadline

    def __enter__(self) -> None:
        outer = _DEADLINE.get()
        deadline = self._deadline if outer is None else min(outer, self._deadline)
        self._token = _DEADLINE.set(deadline)

    def __exit__(self, *exc_info: object) -> None:
        _DEADLINE.reset(self._token)


def step_timed_out() -> bool:
    """Whether the tool call or effect running now (or one above it) timed out.

    Its timeout ends it with a result of its own (an error result, a
    cancel): no one will carry on what it started, nor what a sub-agent it
    called started.
    """
    deadline = _DEADLINE.get()
    return deadline is not None and anyio.current_time() >= deadline


def current_tool_call() -> ToolCallPart | None:
    """Return the tool call being run, inside a tool (else None).

    Its ``id`` is the call's idempotency key: the same on every attempt at
    the call, in a resumed run and in a Temporal activity run again after
    its worker died. A tool with a side effect that must not happen twice
    (a payment, an e-mail, an append) keys the effect by it.
    """
    return _CURRENT_CALL.get()


def _described(
    fn: Callable[..., Any],
) -> tuple[str, dict[str, Any], Callable[[Arguments], Mapping[str, Any]]]:
    """`fn`'s summary, parameters schema and argument reader, made once per function.

    An agent built per request wraps the same functions again each time:
    reading a signature and a docstring is most of what building it costs.
    """
    try:
        known = _DESCRIBED.get(fn)
    except TypeError:  # not weakly referenceable, or unhashable
        known = None
    if known is not None:
        return known
    doc, own = _doc_of(fn)
    summary, arg_docs = parse_doc(doc)
    parameters, structure = describe_function(fn, arg_docs, documented=own)
    _check_defaults(fn, parameters)
    described = (summary, parameters, structure)
    with contextlib.suppress(TypeError):
        _DESCRIBED[fn] = described
    return described


def _name_of(fn: Callable[..., Any]) -> str:
    """A tool's default name: the function's, a partial's, a callable's class's."""
    target = annotated_function(fn)
    if target is not fn and not isinstance(fn, partial):
        return type(fn).__name__  # a callable instance
    name = getattr(target, "__name__", None)
    return name if isinstance(name, str) else type(fn).__name__


def _doc_of(fn: Callable[..., Any]) -> tuple[str, bool]:
    """The docstring describing `fn`, and whether it documents `fn`'s own parameters.

    A function's docstring and a callable instance's ``__call__``'s document
    the parameters the tool takes; a partial's (the wrapped function's) may
    describe the ones it fixed, and a class's its attributes.
    """
    target = annotated_function(fn)
    if target is fn:  # a class's docstring: its attributes, not its __init__'s
        return inspect.getdoc(fn) or "", not isinstance(fn, type)
    if isinstance(fn, partial):
        return inspect.getdoc(target) or "", False
    # A callable instance: its own __call__'s docstring (not one inherited
    # from object), else its class's.
    own = target.__doc__
    if own:
        return inspect.cleandoc(own), True
    return inspect.getdoc(type(fn)) or "", False


_DESCRIBED: Final[
    weakref.WeakKeyDictionary[
        Callable[..., Any],
        tuple[str, dict[str, Any], Callable[[Arguments], Mapping[str, Any]]],
    ]
] = weakref.WeakKeyDictionary()
"""What `Tool.from_function` read of each function (the values hold no function)."""


def tools_by_name(tools: Iterable[Tool | Callable[..., Any]]) -> dict[str, Tool]:
    """Index tools by name, wrapping plain functions with `Tool.from_function`.

    Raises:
        ToolError: two tools share a name.
    """
    out: dict[str, Tool] = {}
    for item in tools:
        tool = item if isinstance(item, Tool) else Tool.from_function(item)
        if tool.name in out:
            fn = "fn" if isinstance(item, Tool) else getattr(item, "__name__", "fn")
            raise ToolError(
                tool.name,
                "registered twice (the model calls a tool by its name): list it "
                f"once, or give one of them another name with "
                f"function_tool({fn}, name=...)",
            )
        out[tool.name] = tool
    return out
