"""`Meter`: measures a whole request incrementally as the conversation grows.

Theory of operation. An `IncrementalCounter` prices a request as
`tokens(sum of units)`, and each message's units are cached by the counter, so
re-measuring only has to add up units. A `MessageLog` only ever grows, and all
views of one backing list share `log.memo`; the meter keeps there, per
counter, the cumulative sums of units over the backing list. Measuring a log
of n messages is then one list index when the sums reach n, and costs only the
new messages when the log grew: O(k) for k appended messages, not O(n) cache
lookups. A branched log (two different appends to one base) gets its own
backing list, and so its own sums. Like the logs it reads, a meter is meant
for one thread at a time.
"""

from __future__ import annotations

import weakref
from collections.abc import Hashable, Sequence
from typing import Final, final

import attrs

from turnfsm import _checks
from turnfsm.messages import Message, MessageLog
from turnfsm.tokens._protocol import IncrementalCounter, TokenCounter

__all__ = ["Meter"]

_MAX_EXTRAS: Final = 64


@final
class _CounterKey:
    """Stands for one counter value in the logs' memos (hashed by identity)."""

    __slots__ = ("__weakref__", "extras")

    def __init__(self) -> None:
        self.extras: dict[str, int] = {}


_KEYS: Final[weakref.WeakValueDictionary[object, _CounterKey]] = (
    weakref.WeakValueDictionary()
)
"""Counter value -> its key, so that equal counters share sums and extras.

Held for as long as a log's memo or a meter uses the key, whichever counter
made it: a driver, an agent or a manager made per request, with a counter
equal to the last one's, finds the sums its session's history already has.
"""


@final
@attrs.define(eq=False)
class Meter:
    """Measures requests made of message sequences plus extra texts.

    Example:
        ```python
        meter = Meter(default_counter())
        size = meter.measure(history, pending, extras=[system_prompt])
        ```

    Attributes:
        counter: The counter to price messages and extras with.
    """

    counter: TokenCounter = attrs.field(on_setattr=attrs.setters.frozen)
    _incremental: IncrementalCounter | None = attrs.field(init=False, repr=False)
    _memo_key: _CounterKey | None = attrs.field(init=False, repr=False)
    # Extras (a system prompt, tool schemas) ride every request unchanged:
    # price each distinct text once (per counter value, across meters).
    _extra_units: dict[str, int] = attrs.field(init=False, repr=False)
    # The tokens of the last tuple of extras measured: a run hands the same
    # tuple (its system prompt and tool schemas) to every measurement.
    _last_extras: tuple[tuple[str, ...], int] | None = attrs.field(
        init=False, repr=False, default=None
    )

    @_incremental.default
    def _incremental_view(self) -> IncrementalCounter | None:
        counter = self.counter
        # A driver makes a meter per run: the quick protocol check.
        if _checks.is_instance(counter, IncrementalCounter):
            return counter  # type: ignore[return-value]
        return None

    @_memo_key.default
    def _key(self) -> _CounterKey | None:
        # Keyed by the counter's value: equal counters price messages alike,
        # so they share one key (and its sums). A counter's own hash may be
        # slow (attrs hashes every field), so it is hashed once, here; the
        # memos use the key's identity. An unhashable counter gets no sums.
        counter = self.counter
        try:
            key = _KEYS.get(counter)
            if key is None:
                key = _KEYS[counter] = _CounterKey()
        except TypeError:  # unhashable
            return None
        return key

    @_extra_units.default
    def _extras_cache(self) -> dict[str, int]:
        key = self._memo_key
        return key.extras if key is not None else {}

    def measure(self, *parts: Sequence[Message], extras: Sequence[str] = ()) -> int:
        """Return the token estimate of `parts` sent as one request with `extras`.

        The parts are concatenated in order; each extra text (a system
        prompt, tool schemas) rides the same request. The result is
        `counter.count(concatenation)` plus `counter.count_text(e)` for each
        extra, for every counter: the one count that the driver, the context
        manager (messages + its reserved budget) and the records all report.
        For an `IncrementalCounter` the messages' units are summed from memos,
        so a re-measure after an append costs O(new messages).

        Every number the counter returns is checked as it is read: an int
        >= 0, never a float, a bool or None.

        Args:
            *parts: Message sequences, e.g. the history and pending logs.
            extras: Texts that ride the request besides the messages.

        Returns:
            The estimated token count of the request.

        Raises:
            ConfigError: The counter returned something other than an int
                >= 0; the error names the counter, its method and the value.
        """
        counter = self._incremental
        if counter is None:
            messages = [m for part in parts for m in part]
            plain = self.counter
            total = _checks.token_count(plain.count(messages), plain, "count")
            for text in extras:
                tokens = plain.count_text(text)
                total += _checks.token_count(tokens, plain, "count_text")
            return total
        # Extras are priced on their own (as `count_text` would): the request's
        # size is then exactly count(messages) + the extras' count, the same
        # number whoever adds it up (the manager adds its reserved budget).
        extra_tokens = 0
        if extras:
            last = self._last_extras
            if last is not None and last[0] is extras:
                extra_tokens = last[1]
            else:
                extra_tokens = self._extra_tokens(counter, extras)
        units = 0
        key = self._memo_key
        for part in parts:
            if key is not None and type(part) is MessageLog:
                sums: list[int] | None = part.memo.get(key)
                n = len(part)
                # The usual case: the sums already reach this view's length.
                if sums is not None and n < len(sums):
                    units += sums[n]
                else:
                    units += self._log_units(counter, part, key)
            else:
                for message in part:
                    units += _checks.token_count(
                        counter.units(message), counter, "units"
                    )
        tokens = _checks.token_count(counter.tokens(units), counter, "tokens")
        return tokens + extra_tokens

    def _extra_tokens(self, counter: IncrementalCounter, extras: Sequence[str]) -> int:
        known = self._extra_units
        total = 0
        for text in extras:
            extra = known.get(text)
            if extra is None:
                extra = self._units_of_extra(counter, text)
            total += _checks.token_count(counter.tokens(extra), counter, "tokens")
        if type(extras) is tuple:  # it cannot change: the next call may reuse it
            self._last_extras = (extras, total)
        return total

    def _units_of_extra(self, counter: IncrementalCounter, text: str) -> int:
        cache = self._extra_units
        units = cache.get(text)
        if units is None:
            if len(cache) >= _MAX_EXTRAS:
                cache.clear()
            units = _checks.token_count(counter.text_units(text), counter, "text_units")
            cache[text] = units
        return units

    @staticmethod
    def _log_units(counter: IncrementalCounter, log: MessageLog, key: Hashable) -> int:
        memo = log.memo
        sums: list[int] | None = memo.get(key)
        if sums is None:
            sums = memo[key] = [0]
        n = len(log)
        done = len(sums) - 1
        if done < n:
            total = sums[done]
            for i in range(done, n):
                units = counter.units(log[i])
                total += _checks.token_count(units, counter, "units")
                sums.append(total)
        return sums[n]
