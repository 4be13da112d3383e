"""A model's prices, as a setting takes them: `ModelPrices`, or a known model's name."""

from __future__ import annotations

import difflib
from typing import Final

from turnfsm.errors import ConfigError
from turnfsm.providers import ModelPrices, known_prices

__all__ = ["KNOWN_PRICES", "priced", "to_prices"]

KNOWN_PRICES: Final = (
    "a model with known prices (for example gpt-4o, gpt-4o-mini, claude-sonnet-4-5)"
)
"""What a setting that names a model for its prices expects."""


def priced(name: str, field: str = "prices", *, or_else: str = "") -> ModelPrices:
    """The prices of the model `name`, from the bundled catalogue.

    Raises:
        ConfigError: the catalogue has no prices for it (names `field`; what
            it expects ends with `or_else`, another form the setting takes).
    """
    prices = known_prices(name) if name.strip() else None
    if prices is None:
        close = _priced_like(name)
        hint = f"; did you mean {close!r}?" if close else ""
        raise ConfigError(field, name, KNOWN_PRICES + or_else + hint)
    return prices


def _priced_like(name: str) -> str | None:
    """The catalogue's priced model whose name is closest to `name`, if any is close."""
    from genai_prices.data import providers

    names = {model.id for provider in providers for model in provider.models}
    for close in difflib.get_close_matches(name, names, n=3, cutoff=0.85):
        if known_prices(close) is not None:
            return close
    return None


def to_prices(value: object) -> object:
    """A known model's name becomes its prices; anything else is checked later."""
    if isinstance(value, str):
        return priced(value, or_else=", or ModelPrices")
    return value
