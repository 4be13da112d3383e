"""The `ModelClient` port: one request in, one reply out."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final, Protocol, final, runtime_checkable

import attrs

from turnfsm import _checks
from turnfsm.errors import ConfigError, InvalidMessage
from turnfsm.messages import Joined, Message, MessageLog, Role
from turnfsm.values import Usage

__all__ = ["ModelClient", "ModelRequest", "ModelResponse", "OutputSpec", "ToolSchema"]


@final
@attrs.frozen(kw_only=True)
class ToolSchema:
    """What the model is told about one tool: name, description, JSON schema."""

    name: str = attrs.field(validator=_checks.string(non_empty=True))
    description: str = attrs.field(validator=_checks.string())
    parameters: Mapping[str, Any] = attrs.field(
        hash=False, validator=_checks.instance(Mapping, "a JSON schema (a mapping)")
    )


@final
@_checks.keyword_checked
@attrs.frozen(kw_only=True)
class OutputSpec:
    """The structured final answer a request asks for, in the provider's native mode.

    Attributes:
        name: The output's name (1-64 of ``A-Z a-z 0-9 _ -``): OpenAI's
            ``json_schema.name``, Anthropic's forced tool.
        schema: The JSON schema of the answer; always an object schema
            (a primitive or a list is wrapped in one property).
        strict: Whether the schema qualifies for OpenAI's strict mode
            (every object closed, every property required).
    """

    name: str
    schema: Mapping[str, Any] = attrs.field(hash=False)
    strict: bool = False


def _schemas(value: Iterable[ToolSchema]) -> tuple[ToolSchema, ...]:
    return _checks.as_tuple(value, "tools", "ToolSchema")


_VIEWS: Final = (MessageLog, Joined)
"""The brain's views of a conversation, taken as they are (a tuple made once)."""


def _request_messages(value: Iterable[Message]) -> Sequence[Message]:
    if isinstance(value, _VIEWS):
        return value  # the brain's own views: no copy (a request per turn)
    return _checks.as_tuple(value, "messages", "Message")


def _check_messages(_inst: object, _attr: object, value: Sequence[Message]) -> None:
    if isinstance(value, _VIEWS):
        return  # built of messages by construction
    for i, item in enumerate(value):
        if not isinstance(item, Message):
            raise ConfigError(f"messages[{i}]", item, "a Message")


@final
@attrs.frozen(kw_only=True)
class ModelRequest:
    """One model call: the conversation, the system prompt and the tools.

    `output`, when set, asks for a structured final answer: the reply's text
    is JSON fitting `output.schema` (adapters turn their provider's native
    mode back into text).

    Raises:
        ConfigError: On construction, naming the field and the value: an
            item of `messages` is not a `Message`, `system` is not a string,
            `max_tokens` is not an int >= 1, or `temperature` is not a
            finite number >= 0.
    """

    messages: Sequence[Message] = attrs.field(
        converter=_request_messages, validator=_check_messages
    )
    system: str | None = attrs.field(
        default=None, validator=_checks.string(optional=True)
    )
    tools: tuple[ToolSchema, ...] = attrs.field(
        default=(),
        converter=_schemas,
        validator=_checks.each(ToolSchema, "a ToolSchema"),
    )
    # What a provider refuses is refused here, naming it: a budget under 1
    # would also slip under the window check of a summary request.
    max_tokens: int | None = attrs.field(
        default=None,
        validator=_checks.integer(
            low=1, optional=True, expected="an int >= 1 (tokens), or None"
        ),
    )
    temperature: float | None = attrs.field(
        default=None,
        validator=_checks.number(
            low=0, optional=True, expected="a finite number >= 0, or None"
        ),
    )
    output: OutputSpec | None = None


@final
@_checks.keyword_checked
@attrs.frozen(kw_only=True)
class ModelResponse:
    """The model's reply (an assistant message) and the usage it reported.

    `model` is the model that answered, as the provider names it (it may
    differ from the name asked for), or None.

    `finish_reason` is why the reply ended, in OpenAI's words: ``"stop"``
    (a whole answer), ``"length"`` (the reply budget, ``max_tokens``, ran
    out: the reply is cut off), ``"tool_calls"`` or ``"content_filter"``
    (the provider's filter withheld the reply; a refusal the provider
    signals, OpenAI's ``refusal``, is an error of that kind).
    Anthropic's ``end_turn``, ``stop_sequence``, ``max_tokens`` and
    ``tool_use`` are read as these (its ``refusal``,
    ``model_context_window_exceeded`` and ``pause_turn`` are errors);
    another reason is kept in the provider's own word; None: not said.
    """

    message: Message = attrs.field()
    usage: Usage | None = attrs.field(
        default=None, validator=_checks.instance(Usage, "a Usage", optional=True)
    )
    model: str | None = attrs.field(
        default=None, validator=_checks.string(optional=True)
    )
    finish_reason: str | None = attrs.field(
        default=None, validator=_checks.string(optional=True)
    )

    @message.validator
    def _check_role(self, _attr: object, value: Message) -> None:
        if not isinstance(value, Message):
            raise ConfigError("message", value, "an assistant Message")
        if value.role is not Role.ASSISTANT:
            raise InvalidMessage(
                "role", value.role.value, "a model reply must be an assistant message"
            )


@runtime_checkable
class ModelClient(Protocol):
    """A model API.

    Raise `turnfsm.errors.ProviderError` for API failures: with
    ``kind=CONTEXT_OVERFLOW`` when the request is too long for the model,
    ``retryable=True`` for transient ones (rate limit, 5xx, timeouts), so the
    driver can compact, retry or fail the run. `TimeoutError` and
    `ConnectionError` count as transient; anything else is a bug and propagates.
    """

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Send `request` and return the reply."""
        ...
