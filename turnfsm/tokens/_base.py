"""`UnitsCounter`: the shared half of every shipped counter."""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Final, cast

from turnfsm import _checks
from turnfsm.errors import ConfigError
from turnfsm.messages import Message
from turnfsm.tokens._cache import UnitCache

__all__ = ["UnitsCounter", "check_units"]

_TEXT: Final = _checks.string()
_UNITS: Final = _checks.integer(low=0)
_MESSAGES: Final = _checks.each(Message, "a Message")


class UnitsCounter(abc.ABC):
    """Derives `count` and `count_text` from `units`, `text_units` and `tokens`.

    Subclasses price one message (`_measure`, cached per message by `units`
    and `count`) and one extra text (`text_units`) in additive units, and say
    how a sum of units becomes tokens (`tokens`), so rounding happens once per
    request.

    `count` and `count_text` check what they are given: a counter is handed
    a conversation by code of yours too, and a string, a lone message or a
    number counted as one is a mistake named here, not an `AttributeError`
    from inside the counter (or, worse, a count of something else).
    """

    __slots__ = ()

    _cache: UnitCache
    """Each subclass's per-message cache (an attrs field excluded from `==`)."""

    def count(self, messages: Sequence[Message]) -> int:
        """Return the estimate for `messages` sent as one request.

        Raises:
            ConfigError: `messages` is not a sequence of `Message`s (a
                string, a lone message, a mapping, None), or an item of it
                is not a `Message`; names `messages` (or the item,
                ``messages[2]``) and the value.
        """
        # Checked only when counting failed, or found nothing: the usual
        # count (a list of messages, none empty of units) pays nothing.
        try:
            units = self._cache.total(messages, self._measure)
        except (TypeError, AttributeError):  # what a wrong input raises
            _check_messages(messages)
            raise  # the messages are fine: a bug of the counter's, unchanged
        if not units:  # an empty string or mapping iterates as no messages
            _check_messages(messages)
        return self.tokens(units)

    def count_text(self, text: str) -> int:
        """Return the estimate for `text` riding a request on its own.

        Raises:
            ConfigError: `text` is not a string; names `text` and the value.
        """
        if type(text) is not str:
            _check_text(text)
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


def _check_messages(messages: object) -> None:
    """Refuse `messages` unless it is a sequence of `Message`s.

    Called after counting raised (or found nothing): the `ConfigError`
    replaces the error that counting the wrong value raised.
    """
    try:
        items = _checks.as_tuple(messages, "messages", "Message")
        _checks.check(items, "messages", _MESSAGES)
    except ConfigError as refusal:
        raise refusal from None


def _check_text(text: object) -> None:
    """Refuse `text` unless it is a string (a `str` subclass passes).

    Raises:
        ConfigError: `text` is not a string; names `text` and the value.
    """
    _checks.check(text, "text", _TEXT)


def check_units(units: object) -> int:
    """Return `units` as an int if it is a sum of units: an int >= 0.

    For `tokens`, which sums of units reach: a counter's `tokens` checks
    ``type(units) is int and units >= 0`` itself, and calls this only when
    that fails (an int subclass passes here, as a plain int).

    Raises:
        ConfigError: `units` is not an int >= 0 (a float, a bool, a
            negative number, None); names `units` and the value.
    """
    _checks.check(units, "units", _UNITS)
    return int(cast(int, units))  # checked: an int (not a bool)
