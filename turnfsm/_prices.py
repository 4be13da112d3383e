"""A model's prices, as a setting takes them: `ModelPrices`, or a known model's name."""

from __future__ import annotations

from turnfsm.errors import ConfigError
from turnfsm.providers import known_prices

__all__ = ["to_prices"]


def to_prices(value: object) -> object:
    """A known model's name becomes its prices; anything else is checked later."""
    if isinstance(value, str):
        prices = known_prices(value) if value.strip() else None
        if prices is None:
            raise ConfigError(
                "prices",
                value,
                "a model with known prices (claude-sonnet-4-5, gpt-4o), or ModelPrices",
            )
        return prices
    return value
