"""`UnitsCounter`: the shared half of every shipped counter."""

from __future__ import annotations

import abc
from collections.abc import Sequence

from turnfsm.messages import Message
from turnfsm.tokens._cache import UnitCache

__all__ = ["UnitsCounter"]


class UnitsCounter(abc.ABC):
    """Derives `count` and `count_text` from `units`, `text_units` and `tokens`.

    Subclasses price one message (`_measure`, cached per message by `units`
    and `count`) and one extra text (`text_units`) in additive units, and say
    how a sum of units becomes tokens (`tokens`), so rounding happens once per
    request.
    """

    __slots__ = ()

    _cache: UnitCache
    """Each subclass's per-message cache (an attrs field excluded from `==`)."""

    def count(self, messages: Sequence[Message]) -> int:
        """Return the estimate for `messages` sent as one request."""
        return self.tokens(self._cache.total(messages, self._measure))

    def count_text(self, text: str) -> int:
        """Return the estimate for `text` riding a request on its own."""
        return self.tokens(self.text_units(text))

    @abc.abstractmethod
    def _measure(self, message: Message) -> int:
        """Return the units of one message, uncached (the cache calls it)."""

    @abc.abstractmethod
    def units(self, message: Message) -> int:
        """Return the additive cost units of one message."""

    @abc.abstractmethod
    def text_units(self, text: str) -> int:
        """Return the additive cost units of `text` riding a request."""

    @abc.abstractmethod
    def tokens(self, units: int) -> int:
        """Convert a sum of units into a token estimate."""
