"""A function's signature as a tool's parameters: the schema and the reader.

`Tool.from_function` describes a function here: the schema of its
parameters (through `turnfsm.driver._schema`, the one annotation mechanism)
and the function that turns validated arguments into its keyword arguments.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import attrs

from turnfsm.driver._arguments import InvalidArguments, Problem, problems_of_structuring
from turnfsm.driver._schema import (
    Unsupported,
    class_schema,
    is_params_class,
    schema_of,
    structure_hook,
    unresolved,
)

__all__ = ["Structure", "describe_function"]

Arguments = Mapping[str, Any]
Structure = Callable[[Arguments], dict[str, Any]]
"""Turns a call's validated arguments into the function's keyword arguments."""


def describe_function(
    fn: Callable[..., Any], arg_docs: Mapping[str, str], *, documented: bool = True
) -> tuple[dict[str, Any], Structure]:
    """Return `fn`'s parameters schema and the reader of its arguments.

    Each parameter is a property (described by `arg_docs`, required unless it
    has a default), read back by its annotation's `structure_hook`; a
    partial's fixed arguments, by position or by keyword, are none. A lone
    parameter annotated with a parameters class stands for the arguments
    object itself: the class's fields are the properties.

    `documented`: `arg_docs` come from `fn`'s own docstring, so each names
    one of its parameters (a partial's may name those it fixed).

    Raises:
        Unsupported: a parameter is ``*args``/``**kwargs`` or
            positional-only, has no annotation, or one without a JSON form;
            or, when `documented`, the docstring describes a parameter `fn`
            does not have (its description would never reach the model).
    """
    # A partial's keywords are fixed by the program (a database, an account):
    # they are neither shown to the model nor changed by it.
    fixed = fn.keywords if isinstance(fn, partial) else {}
    params = [
        p for p in inspect.signature(fn).parameters.values() if p.name not in fixed
    ]
    if documented:
        _check_documented(params, arg_docs)
    hints = _hints(fn, params)
    for param in params:
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise Unsupported(
                f"*args/**kwargs ({param.name}) cannot be described to a model"
            )
        if param.kind is param.POSITIONAL_ONLY:  # every call would raise TypeError
            raise Unsupported(
                f"parameter {param.name!r} is positional-only, and a tool is "
                "called with keyword arguments: remove the '/'"
            )
        if param.name not in hints:
            method = param.name in ("self", "cls") and param is params[0]
            raise Unsupported(
                f"parameter {param.name!r} needs a type annotation"
                + (
                    ": a method is a tool as its bound method (give "
                    "instance.method, after the instance is made), not as "
                    "the function in its class"
                    if method
                    else ""
                )
            )
    if len(params) == 1 and is_params_class(hints[params[0].name]):
        whole = _one_class(params[0].name, hints[params[0].name])
        if whole is not None:
            return whole
    defs: dict[str, Any] = {}
    properties: dict[str, Any] = {}
    required: list[str] = []
    readers: dict[str, Callable[[Any], Any]] = {}
    for param in params:
        try:
            schema = schema_of(hints[param.name], defs)
        except Unsupported as exc:
            hint = ""
            if isinstance(hints[param.name], type) and str(exc).startswith(
                "unsupported annotation"
            ):  # a context object, a connection: nothing the model can write
                hint = (
                    "; the model fills in every parameter, as JSON: what your "
                    "program gives the tool (a connection, the user) reaches "
                    "it through a closure or a context variable"
                )
            raise Unsupported(f"parameter {param.name!r}: {exc}{hint}") from None
        if param.name in arg_docs:
            schema = {**schema, "description": arg_docs[param.name]}
        properties[param.name] = schema
        readers[param.name] = structure_hook(hints[param.name])
        if param.default is inspect.Parameter.empty:
            required.append(param.name)
    parameters: dict[str, Any] = {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }
    if defs:
        parameters["$defs"] = defs
    return parameters, partial(_read_each, readers)


def _check_documented(
    params: list[inspect.Parameter], arg_docs: Mapping[str, str]
) -> None:
    """Refuse a docstring that describes a parameter the function does not have."""
    names = [p.name for p in params]
    stray = [name for name in arg_docs if name not in names]
    if not stray:
        return
    has = f"its parameters are {', '.join(names)}" if names else "it has no parameters"
    raise Unsupported(
        f"its docstring describes a parameter {stray[0]!r}, which it does not "
        f"have ({has}): rename the entry to the parameter it describes, "
        "or remove it"
    )


def annotated_function(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The function whose annotations describe `fn`: itself, a partial's, an instance's.

    A `functools.partial` is described by the function it wraps, a callable
    instance by its class's ``__call__``.
    """
    while isinstance(fn, partial):
        fn = fn.func
    if inspect.isroutine(fn) or isinstance(fn, type) or not callable(fn):
        return fn
    call: Callable[..., Any] = type(fn).__call__
    return call


def _hints(fn: Callable[..., Any], params: list[inspect.Parameter]) -> dict[str, Any]:
    """The resolved annotations of `fn`'s parameters.

    Raises:
        Unsupported: an annotation names something that does not exist.
    """
    target = annotated_function(fn)
    try:
        return typing.get_type_hints(target, include_extras=True)
    except Exception as exc:
        raw = getattr(target, "__annotations__", {})
        found = unresolved(
            {p.name: raw[p.name] for p in params if p.name in raw},
            getattr(inspect.unwrap(target), "__globals__", {}),
        )
        if found is not None:
            name, why = found
            raise Unsupported(f"parameter {name!r}: {why}") from None
        raise Unsupported(f"its annotations cannot be resolved ({exc})") from None


def _one_class(name: str, cls: type) -> tuple[dict[str, Any], Structure] | None:
    """The class's fields as the arguments object; None if its schema is no object.

    A pydantic model that contains itself is an object too (`class_schema`
    follows its reference); one of another shape (a `RootModel` of a list)
    is one parameter like any other.
    """
    defs: dict[str, Any] = {}
    parameters = class_schema(cls, defs)
    if parameters.get("type") != "object":
        return None
    if defs:
        parameters = {**parameters, "$defs": {**parameters.get("$defs", {}), **defs}}
    read = structure_hook(cls)

    def structure(arguments: Arguments) -> dict[str, Any]:
        return {name: read(arguments)}

    return parameters, structure


def _read_each(
    readers: Mapping[str, Callable[[Any], Any]], arguments: Arguments
) -> dict[str, Any]:
    kwargs: dict[str, Any] = {}
    problems: list[Problem] = []
    for key, value in arguments.items():
        try:
            kwargs[key] = readers[key](value)
        except Exception as exc:
            problems += [
                attrs.evolve(p, path=(key, *p.path))
                for p in problems_of_structuring(exc)
            ]
    if problems:
        raise InvalidArguments(problems)
    return kwargs
