"""Hypothesis strategies for the converter round trips.

`canonical()` draws conversations that both OpenAI and Anthropic can express
exactly (each converter's module docstring lists the rules), so a round trip
must give them back. `conversations()` draws anything a `Message` allows; a
round trip brings those to the normal form, which must then be stable.
"""

from __future__ import annotations

import base64
import string
from collections.abc import Sequence

from hypothesis import strategies as st

from turnfsm.messages import (
    ImagePart,
    JSONValue,
    Message,
    Part,
    Role,
    TextPart,
    ToolCallPart,
    ToolResultPart,
)

__all__ = ["canonical", "conversations", "shape"]

texts = st.text(max_size=12) | st.sampled_from(
    ["", "[error] ", "[error] boom", "\\[error] x", "\\\\[error] ", "\\", "é 中 🙂"]
)
ids = st.text(string.ascii_letters + string.digits + "_-", min_size=1, max_size=8)
json_values: st.SearchStrategy[JSONValue] = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)
arguments = st.dictionaries(st.text(max_size=6), json_values, max_size=3)


@st.composite
def images(draw: st.DrawFn) -> ImagePart:
    if draw(st.booleans()):
        media_type = draw(st.sampled_from(["image/png", "image/jpeg", "image/webp"]))
        data = base64.b64encode(draw(st.binary(max_size=12))).decode()
        return ImagePart(url=f"data:{media_type};base64,{data}", media_type=media_type)
    name = draw(st.text(string.ascii_lowercase, min_size=1, max_size=6))
    return ImagePart(url=f"https://img.test/{name}.png")


text_parts = texts.map(lambda t: TextPart(text=t))
said = texts.filter(str.strip).map(lambda t: TextPart(text=t))
"""A user's text parts: a user message says something."""
calls = st.builds(ToolCallPart, id=ids, name=ids, arguments=arguments)
results = st.builds(ToolResultPart, call_id=ids, content=texts, is_error=st.booleans())


def _message(role: Role, parts: Sequence[Part]) -> Message:
    return Message(role=role, parts=parts)


def _texts_then_calls(
    drawn: tuple[list[TextPart], list[ToolCallPart]],
) -> list[Part]:
    return [*drawn[0], *drawn[1]]


def _canonical_message() -> st.SearchStrategy[Message]:
    user = st.lists(said | images(), min_size=1, max_size=3)
    # Anthropic takes no blank text and no empty message: an assistant's
    # text says something, and it says or calls something.
    assistant = (
        st.tuples(st.lists(said, max_size=2), st.lists(calls, max_size=3))
        .map(_texts_then_calls)
        .filter(bool)
    )
    return st.one_of(
        user.map(lambda p: _message(Role.USER, p)),
        assistant.map(lambda p: _message(Role.ASSISTANT, p)),
        results.map(lambda r: _message(Role.TOOL, [r])),
    )


@st.composite
def canonical(draw: st.DrawFn) -> list[Message]:
    """Conversations that round-trip exactly through both formats."""
    out: list[Message] = []
    if draw(st.booleans()):
        system = draw(st.lists(said, min_size=1, max_size=2))
        out.append(_message(Role.SYSTEM, system))
    out.extend(draw(st.lists(_canonical_message(), max_size=8)))
    return out


def conversations() -> st.SearchStrategy[list[Message]]:
    """Any conversation: parts in any order, several results, system anywhere."""
    message = st.one_of(
        st.lists(text_parts, min_size=1, max_size=2).map(
            lambda p: _message(Role.SYSTEM, p)
        ),
        st.lists(said | images(), min_size=1, max_size=3).map(
            lambda p: _message(Role.USER, p)
        ),
        st.lists(text_parts | images() | calls, max_size=4).map(
            lambda p: _message(Role.ASSISTANT, p)
        ),
        st.lists(results, min_size=1, max_size=3).map(lambda p: _message(Role.TOOL, p)),
    )
    return st.lists(message, max_size=8)


def shape(messages: list[Message]) -> list[tuple[Role, tuple[Part, ...]]]:
    """What a round trip keeps: roles and parts (ids are not carried)."""
    return [(m.role, m.parts) for m in messages]
