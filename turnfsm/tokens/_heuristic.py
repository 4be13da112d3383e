"""`HeuristicTokenCounter`: the classic characters-over-four rule, exactly."""

from __future__ import annotations

from typing import Final, final

import attrs

from turnfsm import _checks
from turnfsm.messages import Message
from turnfsm.tokens import _render
from turnfsm.tokens._base import UnitsCounter, check_units
from turnfsm.tokens._cache import UnitCache, shared_cache

__all__ = ["HeuristicTokenCounter"]

_OVERHEAD_CHARS: Final = 20
_CHARS_PER_TOKEN: Final = 4


@final
@_checks.keyword_checked
@attrs.frozen(kw_only=True)
class HeuristicTokenCounter(UnitsCounter):
    """The classic estimate: `floor(sum(rendered_chars + 20) / 4)`.

    Rendered chars are the text of text parts, 256 per image, a tool call's
    name plus its compact JSON arguments, and a tool result's content. Every
    message adds 20 chars of overhead, and so does every extra text riding a
    request. The floor is taken once, over the whole sum.

    It is fast and predictable, but it is not conservative: against the real
    cl100k count it reads low on JSON, CJK text and emoji. Use it where the
    classic rule's exact numbers matter; `ConservativeTokenCounter` is the default.

    Example:
        `HeuristicTokenCounter().count([Message.user("Hello, world!")])` is 8:
        (13 + 20) // 4.
    """

    _cache: UnitCache = attrs.field(
        default=attrs.Factory(shared_cache, takes_self=True),
        init=False,
        eq=False,
        hash=False,
        repr=False,
    )

    def units(self, message: Message) -> int:
        """Return the rendered chars of `message` plus its 20-char overhead."""
        return self._cache.units(message, self._measure)

    def _measure(self, message: Message) -> int:
        return _message_units(message)

    def text_units(self, text: str) -> int:
        """Return `len(text)` plus the 20-char overhead of a message."""
        return len(text) + _OVERHEAD_CHARS

    def tokens(self, units: int) -> int:
        """Return `units // 4`.

        Raises:
            ConfigError: `units` is not an int >= 0; names `units` and the value.
        """
        if type(units) is not int or units < 0:
            units = check_units(units)
        return units // _CHARS_PER_TOKEN


def _message_units(message: Message) -> int:
    # Looked up through the module so tests can count the measuring calls.
    return _render.rendered_chars(message) + _OVERHEAD_CHARS
