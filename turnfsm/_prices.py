"""A model's prices, as a setting takes them: `ModelPrices`, or a known model's name."""

from __future__ import annotations

from typing import Final

from turnfsm.errors import ConfigError
from turnfsm.providers import ModelPrices, known_prices

__all__ = ["KNOWN_PRICES", "priced", "to_prices"]

KNOWN_PRICES: Final = "a model with known prices (claude-sonnet-4-5, gpt-4o)"
"""What a setting that names a model for its prices expects."""


def priced(name: str, field: str = "prices", *, or_else: str = "") -> ModelPrices:
    """The prices of the model `name`, from the bundled catalogue.

    Raises:
        ConfigError: the catalogue has no prices for it (names `field`; what
            it expects ends with `or_else`, another form the setting takes).
    """
    prices = known_prices(name) if name.strip() else None
    if prices is None:
        raise ConfigError(field, name, KNOWN_PRICES + or_else)
    return prices


def to_prices(value: object) -> object:
    """A known model's name becomes its prices; anything else is checked later."""
    if isinstance(value, str):
        return priced(value, or_else=", or ModelPrices")
    return value
