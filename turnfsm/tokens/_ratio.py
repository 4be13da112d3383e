"""`RatioTokenCounter`: a fixed characters-per-token ratio, rounded up."""

from __future__ import annotations

from fractions import Fraction
from typing import final

import attrs

from turnfsm import _checks
from turnfsm.messages import Message
from turnfsm.tokens import _render
from turnfsm.tokens._base import UnitsCounter, check_units
from turnfsm.tokens._cache import UnitCache, shared_cache

__all__ = ["RatioTokenCounter"]


_check_ratio = _checks.number(
    "chars_per_token", above=0, expected="a finite number > 0"
)


@final
@_checks.keyword_checked
@attrs.frozen(kw_only=True)
class RatioTokenCounter(UnitsCounter):
    """Estimates `ceil(chars / chars_per_token)` over a whole request.

    Characters are counted the way `HeuristicTokenCounter` renders a message
    (text, 256 per image, tool-call name + compact JSON arguments, tool-result
    content), with no per-message overhead. The division is exact and rounds
    up once, over the whole request: 43 chars at 4.3 chars per token are 10
    tokens.

    A ratio is only as good as the text it was measured on; prefer
    `ConservativeTokenCounter` when undercounting is not acceptable.

    Attributes:
        chars_per_token: Characters per token, a finite number > 0.

    Raises:
        ConfigError: `chars_per_token` is not a finite number > 0.
    """

    chars_per_token: float = attrs.field(validator=_check_ratio)
    _ratio: Fraction = attrs.field(init=False, eq=False, hash=False, repr=False)
    _cache: UnitCache = attrs.field(
        default=attrs.Factory(shared_cache, takes_self=True),
        init=False,
        eq=False,
        hash=False,
        repr=False,
    )

    @_ratio.default
    def _exact_ratio(self) -> Fraction:
        # Runs before attrs' validators: check first, so a bad value raises
        # ConfigError rather than a ValueError from Fraction. repr() gives the
        # shortest decimal that round-trips, so 4.3 is 43/10 and not the binary
        # float just below it (which would round 43 chars up to 11 tokens).
        _check_ratio(self, None, self.chars_per_token)
        return Fraction(repr(float(self.chars_per_token)))

    @classmethod
    def openai(cls) -> RatioTokenCounter:
        """Return a counter at 4.3 chars per token (OpenAI models, English)."""
        return cls(chars_per_token=4.3)

    @classmethod
    def anthropic(cls) -> RatioTokenCounter:
        """Return a counter at 3.6 chars per token (Anthropic models)."""
        return cls(chars_per_token=3.6)

    @classmethod
    def gemini(cls) -> RatioTokenCounter:
        """Return a counter at 4.05 chars per token (Gemini models)."""
        return cls(chars_per_token=4.05)

    @classmethod
    def local(cls) -> RatioTokenCounter:
        """Return a counter at 3.8 chars per token (local models, e.g. Llama)."""
        return cls(chars_per_token=3.8)

    def units(self, message: Message) -> int:
        """Return the rendered chars of `message`."""
        return self._cache.units(message, self._measure)

    def _measure(self, message: Message) -> int:
        return _message_units(message)

    def text_units(self, text: str) -> int:
        """Return `len(text)`."""
        return len(text)

    def tokens(self, units: int) -> int:
        """Return `ceil(units / chars_per_token)`, computed exactly.

        Raises:
            ConfigError: `units` is not an int >= 0; names `units` and the value.
        """
        if type(units) is not int or units < 0:
            units = check_units(units)
        ratio = self._ratio
        return -(-units * ratio.denominator // ratio.numerator)


def _message_units(message: Message) -> int:
    # Looked up through the module so tests can count the measuring calls.
    return _render.rendered_chars(message)
