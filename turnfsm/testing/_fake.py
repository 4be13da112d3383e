"""Test doubles: a model whose replies come from a handler or a script."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, Final, final

import attrs

from turnfsm import _checks
from turnfsm.core import Usage
from turnfsm.errors import ConfigError
from turnfsm.messages import Message, Role, ToolCallPart
from turnfsm.persistence import new_id
from turnfsm.providers import ModelRequest, ModelResponse

__all__ = ["FakeModelClient", "ScriptedModel", "reply", "tool_call"]

Handler = Callable[[ModelRequest], "ModelResponse | Message | str | Awaitable[Any]"]


def tool_call(
    name: str, call_id: str | None = None, /, **arguments: Any
) -> ToolCallPart:
    """Return a tool call part (a fresh id unless `call_id` is given)."""
    return ToolCallPart(id=call_id or new_id("call"), name=name, arguments=arguments)


def reply(text: str = "", *calls: ToolCallPart) -> Message:
    """Return an assistant reply with `text` and tool `calls`.

    Raises:
        ConfigError: `text` is a tool call (the text comes first:
            ``reply("", tool_call(...))``).
    """
    given: object = text  # what the types allow, and what a caller gave
    if isinstance(given, ToolCallPart):  # reply(tool_call(...))
        raise ConfigError(
            "text",
            given,
            "a string, the reply's text, before its tool calls: "
            "reply('', tool_call(...)) for calls with no text",
        )
    return Message.assistant(text, tool_calls=calls)


_REPLY: Final = "a ModelResponse, an assistant Message or a string"


def _as_response(value: ModelResponse | Message | str, what: str) -> ModelResponse:
    """`value` as a response; `what` names where it came from, if it is none."""
    if isinstance(value, ModelResponse):
        return value
    if isinstance(value, str):
        value = Message.assistant(value)
    if not isinstance(value, Message):
        raise ConfigError(what, value, _REPLY)
    return ModelResponse(message=value, usage=None)


_ONE_REQUEST: Final = _checks.Shape(("request",))


def _check_handler(value: object) -> None:
    """Refuse a `FakeModelClient` handler that cannot be called with a request."""
    if callable(value):
        why = _checks.cannot_take(value, _ONE_REQUEST)
        if why is not None:
            raise ConfigError(
                "handler",
                value,
                f"a function of one request ({why}): def handler(request)",
            )
        if inspect.isgeneratorfunction(value) or inspect.isasyncgenfunction(value):
            raise ConfigError(
                "handler",
                value,
                f"a function returning {_REPLY}, not a generator (a function"
                " with yield): its replies in order go to ScriptedModel([...])",
            )
        return
    hint = (
        " (replies given in order go to ScriptedModel([...]))"
        if _checks.is_iterable(value) and not isinstance(value, str)
        else ""
    )
    raise ConfigError(
        "handler", value, f"a function of the request returning {_REPLY}{hint}"
    )


@final
@_checks.keyword_checked
@attrs.define(eq=False)
class FakeModelClient:
    """A `ModelClient` that answers with `handler(request)` (sync or async).

    The handler may return a `ModelResponse`, an assistant `Message` or a
    string, or raise (e.g. a `ProviderError`) to simulate an API failure.
    Every request is kept in `requests`.
    """

    handler: Handler = attrs.field(validator=lambda _i, _a, v: _check_handler(v))
    requests: list[ModelRequest] = attrs.field(factory=list, init=False)

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Record `request` and answer with the handler."""
        self.requests.append(request)
        value = self.handler(request)
        if isinstance(value, Awaitable):
            value = await value
        return _as_response(value, "handler(request)")


Item = ModelResponse | Message | str | BaseException


def _script(value: Iterable[Item]) -> list[Item]:
    """The script as a list, each item checked: a reply, or an exception.

    Raises:
        ConfigError: `value` is a string (its letters would be the replies:
            ``ScriptedModel.of("Hello.")`` plays one), not iterable, or holds
            an item that is neither a reply nor an exception (named by index).
    """
    if isinstance(value, str | Message | ModelResponse):
        raise ConfigError(
            "script",
            value,
            "a list of replies, not one (ScriptedModel.of(reply) plays it as one)",
        )
    try:
        items = list(value)
    except TypeError:
        raise ConfigError("script", value, "a list of replies") from None
    for index, item in enumerate(items):
        if not isinstance(item, ModelResponse | Message | str | BaseException):
            raise _no_reply(index, item)
        if isinstance(item, Message) and item.role is not Role.ASSISTANT:
            raise ConfigError(f"script[{index}]", item, "a reply: an assistant Message")
    return items


def _no_reply(index: int, item: object) -> ConfigError:
    """The refusal of script item `item`; a list in it shows both ways to script."""
    hint = ""
    if isinstance(item, list | tuple):  # ScriptedModel.of([...])
        hint = (
            " (replies go one by one into ScriptedModel.of(...), or as a list "
            "into ScriptedModel([...]))"
        )
    return ConfigError(
        f"script[{index}]", item, f"{_REPLY}, or an exception to raise{hint}"
    )


@final
@_checks.keyword_checked
@attrs.define(eq=False)
class ScriptedModel:
    """A `ModelClient` that plays `script` in order: replies, or exceptions to raise.

    Raises `AssertionError` when asked for more replies than scripted.
    `usage`, when given, is reported with every reply that reports none
    of its own.

    Raises:
        ConfigError: `script` is a string or not iterable, or holds an
            item that is neither a reply nor an exception (named by
            index); `usage` is neither a `Usage` nor None.
    """

    script: Sequence[ModelResponse | Message | str | BaseException] = attrs.field(
        converter=_script
    )
    usage: Usage | None = attrs.field(
        default=None,
        validator=_checks.instance(
            Usage, "a Usage (Usage(input_tokens=..., output_tokens=...))", optional=True
        ),
    )
    requests: list[ModelRequest] = attrs.field(factory=list, init=False)

    @classmethod
    def of(cls, *items: ModelResponse | Message | str | BaseException) -> ScriptedModel:
        """Return a model that plays `items` in order."""
        return cls(list(items))

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Record `request` and play the next scripted item."""
        self.requests.append(request)
        if len(self.requests) > len(self.script):
            raise AssertionError(
                f"ScriptedModel asked for reply #{len(self.requests)} of "
                f"{len(self.script)} scripted"
            )
        index = len(self.requests) - 1
        item = self.script[index]
        if isinstance(item, BaseException):
            raise item
        response = _as_response(item, f"script[{index}]")
        if self.usage is not None and response.usage is None:
            response = attrs.evolve(response, usage=self.usage)
        return response
